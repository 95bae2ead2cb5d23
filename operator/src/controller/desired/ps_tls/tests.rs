use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use super::*;

const CREATED: i64 = 1_764_000_000;

fn key(byte: u8) -> TokenKey {
    TokenKey::new(&[byte; 32]).unwrap()
}

fn names() -> Vec<String> {
    server_names(["mnist-ps".to_string(), "mnist-ps-1".to_string()], "team-a")
}

/// Checks `cert` for `host` as the workers' client does: the job's CA its only root.
fn verify(ca: &str, cert: &str, host: &str, at: i64) -> Result<(), rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .unwrap();
    let leaf = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(at as u64));
    verifier
        .verify_server_cert(&leaf, &[], &ServerName::try_from(host.to_string()).unwrap(), &[], at)
        .map(|_| ())
}

#[test]
fn the_server_certificate_is_valid_for_every_shard_name_under_the_jobs_ca() {
    let c = issue(&key(1), "uid-1", CREATED, names()).unwrap();
    for host in
        ["mnist-ps", "mnist-ps.team-a.svc", "mnist-ps-1.team-a.svc.cluster.local", "mnist-ps-1.team-a"]
    {
        verify(&c.ca, &c.cert, host, CREATED + 86_400).unwrap_or_else(|e| panic!("{host}: {e}"));
    }
    // Not for another job's Service, nor after ten years, nor before the job (less an hour).
    assert!(verify(&c.ca, &c.cert, "other-ps.team-a.svc", CREATED).is_err());
    assert!(verify(&c.ca, &c.cert, "mnist-ps.team-b.svc", CREATED).is_err());
    assert!(verify(&c.ca, &c.cert, "mnist-ps", CREATED + 3651 * 86_400).is_err());
    assert!(verify(&c.ca, &c.cert, "mnist-ps", CREATED - 7200).is_err());
    assert!(c.key.starts_with("-----BEGIN PRIVATE KEY-----"), "{}", c.key);
}

#[test]
fn the_same_job_gets_the_same_bytes_and_another_job_or_key_others() {
    let a = issue(&key(1), "uid-1", CREATED, names()).unwrap();
    assert_eq!(a, issue(&key(1), "uid-1", CREATED, names()).unwrap());
    assert_eq!(a.ca, ca_pem(&key(1), "uid-1", CREATED).unwrap());
    let other_job = issue(&key(1), "uid-2", CREATED, names()).unwrap();
    let other_key = issue(&key(2), "uid-1", CREATED, names()).unwrap();
    assert!(a.ca != other_job.ca && a.key != other_job.key && a.ca != other_key.ca && a.key != other_key.key);
    // One job's CA does not vouch for another job's certificate, even for the same names.
    assert!(verify(&a.ca, &other_job.cert, "mnist-ps", CREATED).is_err());
    assert!(verify(&a.ca, &other_key.cert, "mnist-ps", CREATED).is_err());
}

/// What the PS's TLS server loads (`foresight-ps --tls-cert --tls-key`) is what was issued.
#[test]
fn the_parameter_server_accepts_the_issued_files() {
    let c = issue(&key(1), "uid-1", CREATED, names()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, &c.cert).unwrap();
    std::fs::write(&key_file, &c.key).unwrap();
    let files = foresight_ps::server::TlsFiles { cert, key: key_file };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(foresight_ps::server::Listener::bind("127.0.0.1:0", None, Some(&files))).unwrap();
}
