//! TLS between a job's workers and its parameter server, with certificates the operator issues.
//!
//! Each job gets a CA of its own and a server certificate it signs for every shard's Service
//! name. Both keys are Ed25519 keys derived from the operator's token key and the job's UID,
//! like the job's tokens ([`super::token`]), and every other field is fixed by the job (serials,
//! validity from its creation time), so the same job always gets the same bytes: the operator
//! writes them into the job's TLS Secret once and never reads it back (it may create Secrets, not
//! read them), and recomputes the CA to trust when it calls the PS itself. A CA per job means a
//! job's certificate cannot speak for another job's PS.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PKCS_ED25519, SerialNumber,
};
use rustls::pki_types::PrivatePkcs8KeyDer;

use foresight_ps::client::ClientTls;

use super::token::TokenKey;
use crate::api::TrainingJob;

/// Keys of the job's TLS Secret (`kubernetes.io/tls`, with the CA as cert-manager writes it).
pub const CA_KEY: &str = "ca.crt";
pub const CERT_KEY: &str = "tls.crt";
pub const PRIVATE_KEY_KEY: &str = "tls.key";

/// How long a job's certificates are valid: from an hour before the job was created (clocks
/// differ) for ten years, since nothing renews them during the job.
const VALID_BEFORE_CREATION_S: i64 = 3600;
const VALID_DAYS: i64 = 3650;

/// Why a job's certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("the job's creation time ({0} s) is outside what a certificate can hold")]
    CreationTime(i64),
    #[error("making the job's certificates: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("trusting the job's CA: {0}")]
    Trust(String),
}

/// A job's CA and its PS's certificate and key, PEM.
#[derive(Clone, Debug, PartialEq)]
pub struct JobCertificates {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

/// The names a job's PS certificate holds: each shard Service's name as the cluster's DNS
/// resolves it, short and qualified.
pub fn server_names(services: impl IntoIterator<Item = String>, namespace: &str) -> Vec<String> {
    services
        .into_iter()
        .flat_map(|s| {
            [
                s.clone(),
                format!("{s}.{namespace}"),
                format!("{s}.{namespace}.svc"),
                format!("{s}.{namespace}.svc.cluster.local"),
            ]
        })
        .collect()
}

/// The job's certificates: its UID, its creation time (Unix seconds) and the PS's names.
pub fn issue(
    key: &TokenKey,
    uid: &str,
    created_s: i64,
    names: Vec<String>,
) -> Result<JobCertificates, IssueError> {
    let (ca_params, ca_key) = ca(key, uid, created_s)?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let leaf_key = ed25519(key, &format!("foresight.dev/ps-tls-server/v1/{uid}"))?;
    let mut leaf = CertificateParams::new(names)?;
    leaf.distinguished_name = name("foresight parameter server", uid);
    leaf.serial_number = Some(SerialNumber::from(2u64));
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    validity(&mut leaf, created_s)?;
    let cert = leaf.signed_by(&leaf_key, &Issuer::new(ca_params, ca_key))?;
    Ok(JobCertificates { ca: ca_cert.pem(), cert: cert.pem(), key: leaf_key.serialize_pem() })
}

/// The job's CA certificate alone: what the operator trusts when it calls the job's PS.
pub fn ca_pem(key: &TokenKey, uid: &str, created_s: i64) -> Result<String, IssueError> {
    let (params, ca_key) = ca(key, uid, created_s)?;
    Ok(params.self_signed(&ca_key)?.pem())
}

/// The job's CAs under each of `keys` as the roots of a client: a job created before a key
/// rotation has its certificates from the previous key.
pub fn trust<'a>(
    keys: impl IntoIterator<Item = &'a TokenKey>,
    uid: &str,
    created_s: i64,
) -> Result<ClientTls, IssueError> {
    let pems: Vec<String> = keys.into_iter().map(|k| ca_pem(k, uid, created_s)).collect::<Result<_, _>>()?;
    ClientTls::from_pem(pems.concat().as_bytes()).map_err(IssueError::Trust)
}

fn ca(key: &TokenKey, uid: &str, created_s: i64) -> Result<(CertificateParams, KeyPair), IssueError> {
    let ca_key = ed25519(key, &format!("foresight.dev/ps-tls-ca/v1/{uid}"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name("foresight job CA", uid);
    params.serial_number = Some(SerialNumber::from(1u64));
    // It signs the job's server certificate and nothing below that.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    validity(&mut params, created_s)?;
    Ok((params, ca_key))
}

fn name(what: &str, uid: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "foresight.dev");
    dn.push(DnType::CommonName, format!("{what} {uid}"));
    dn
}

fn validity(params: &mut CertificateParams, created_s: i64) -> Result<(), IssueError> {
    let from = time::OffsetDateTime::from_unix_timestamp(created_s - VALID_BEFORE_CREATION_S)
        .map_err(|_| IssueError::CreationTime(created_s))?;
    params.not_before = from;
    params.not_after = from + time::Duration::days(VALID_DAYS);
    Ok(())
}

/// An Ed25519 key whose seed is derived from the token key: PKCS#8 v1 (RFC 8410) is a fixed
/// prefix and the 32-byte seed.
fn ed25519(key: &TokenKey, label: &str) -> Result<KeyPair, rcgen::Error> {
    const PREFIX: [u8; 16] =
        [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
    let mut der = PREFIX.to_vec();
    der.extend_from_slice(&key.seed(label));
    KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(der), &PKCS_ED25519)
}

/// The job's creation time in Unix seconds (its certificates' validity starts there); 0 when
/// it has none yet, as an object read from the API server always has.
pub(crate) fn created_s(job: &TrainingJob) -> i64 {
    job.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second())
}

#[cfg(test)]
mod tests;
