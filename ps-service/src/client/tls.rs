//! Trust for `https://` parameter servers: the certificates a client accepts as roots, from a
//! PEM file (in a cluster, the job's own certificate, which the operator mounts and names in
//! `FORESIGHT_PS_CA_FILE`). rustls with the ring provider, as the PS's server side; HTTP/2 by
//! ALPN. No system roots: a PS certificate is the job's, never a public CA's.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::ClientError;

/// The roots an `https://` client trusts. Cheap to clone (one shared config).
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
}

impl ClientTls {
    /// The certificates of the PEM file at `path`: at least one, each a parseable root.
    pub fn from_pem_file(path: &Path) -> Result<Self, ClientError> {
        let pem = std::fs::read(path)
            .map_err(|e| ClientError::Config(format!("parameter server CA file {}: {e}", path.display())))?;
        Self::from_pem(&pem)
            .map_err(|e| ClientError::Config(format!("parameter server CA file {}: {e}", path.display())))
    }

    /// The certificates in `pem`.
    pub fn from_pem(pem: &[u8]) -> Result<Self, String> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("not PEM certificates: {e}"))?;
        if certs.is_empty() {
            return Err("no certificate in it".into());
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs {
            roots.add(cert).map_err(|e| format!("a certificate cannot be a root: {e}"))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS versions: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self { config: Arc::new(config) })
    }

    /// The rustls configuration, for `reqwest::ClientBuilder::tls_backend_preconfigured`.
    pub(super) fn rustls_config(&self) -> rustls::ClientConfig {
        (*self.config).clone()
    }
}

/// A configuration that trusts nothing: for `http://` clients, whose requests never use it.
pub(super) fn no_roots() -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

/// Makes ring the process's rustls crypto provider, unless one is installed already. A plain
/// `reqwest::Client` (not a [`super::PsClient`], which brings its own configuration) needs one:
/// the workspace builds reqwest without a provider of its own (ring is the one rustls here uses
/// everywhere; reqwest's default would compile a second, aws-lc).
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one first, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
