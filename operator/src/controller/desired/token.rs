//! Each job's bearer token, derived from the operator's key and the job's UID.
//!
//! Deriving it (HMAC-SHA256) instead of drawing it at random and reading it back from the
//! job's Secret means the operator never needs permission to read Secrets: it writes the Secret
//! once per reconcile (the same value every time) and recomputes the token when it calls the
//! parameter server. Without the key the token of a job cannot be guessed from its UID. The one
//! Secret the operator may read is the key's own ([`key_from_secret`], `--token-key-secret`).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use ring::hmac;

/// The operator's token key: at least 32 bytes of secret material (`FORESIGHT_TOKEN_KEY`).
#[derive(Clone)]
pub struct TokenKey(hmac::Key);

/// The key is too short to derive tokens from.
#[derive(Debug, thiserror::Error)]
#[error("the token key must be at least 32 bytes (it has {0}); generate one with `openssl rand -hex 32`")]
pub struct ShortKey(pub usize);

impl TokenKey {
    pub fn new(material: &[u8]) -> Result<Self, ShortKey> {
        if material.len() < 32 {
            return Err(ShortKey(material.len()));
        }
        Ok(Self(hmac::Key::new(hmac::HMAC_SHA256, material)))
    }

    /// The workers' token of the job with this UID: 64 hex digits.
    pub fn job_token(&self, uid: &str) -> String {
        self.derive(&format!("foresight.dev/job-token/v1/{uid}"))
    }

    /// The job's control token: the operator's calls that end or rescale the job (a worker
    /// pod never holds it).
    pub fn control_token(&self, uid: &str) -> String {
        self.derive(&format!("foresight.dev/control-token/v1/{uid}"))
    }

    /// The end of the names of the job's Secrets: 16 hex digits nobody without the key can
    /// predict, so that nobody can plant a Secret of that name before the operator makes it
    /// (it may create Secrets but not read them, so a 409 cannot tell it whose one is there).
    pub fn secret_suffix(&self, uid: &str) -> String {
        self.derive(&format!("foresight.dev/secret-name/v1/{uid}"))[..16].to_string()
    }

    fn derive(&self, label: &str) -> String {
        self.seed(label).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// 32 secret bytes for `label`: the seed of a job's TLS keys ([`super::ps_tls`]).
    pub fn seed(&self, label: &str) -> [u8; 32] {
        let tag = hmac::sign(&self.0, label.as_bytes());
        tag.as_ref().try_into().expect("HMAC-SHA256 tags are 32 bytes")
    }
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(<redacted>)")
    }
}

/// The token key kept in the Secret `name` of the operator's namespace, under `key`, and the
/// key it replaced under `previous` when there is one (a rotation: jobs created before it keep
/// their tokens). A missing Secret is created with 32 random bytes (hex): replicas starting
/// together race to create it, and the loser reads the winner's, so every replica derives the
/// same tokens.
pub async fn key_from_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let read = |s: Secret| -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
        let mut data = s.data.unwrap_or_default();
        let mut take = |k: &str| data.remove(k).map(|b| b.0.trim_ascii().to_vec());
        let key = take("key").ok_or_else(|| format!("Secret {namespace}/{name} has no `key`"))?;
        Ok((key, take("previous")))
    };
    let failed = |e: kube::Error| format!("token key Secret {namespace}/{name}: {e}");
    if let Some(s) = secrets.get_opt(name).await.map_err(failed)? {
        return read(s);
    }
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| "no randomness for a new token key".to_string())?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [("app.kubernetes.io/managed-by".to_string(), "foresight-operator".to_string())].into(),
            ),
            ..Default::default()
        },
        data: Some([("key".to_string(), ByteString(hex.into_bytes()))].into()),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(created) => {
            tracing::info!(namespace, name, "created the token key Secret");
            read(created)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => read(secrets.get(name).await.map_err(failed)?),
        Err(e) => Err(failed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_stable_per_uid_and_differ_between_uids_and_keys() {
        let k = TokenKey::new(&[7u8; 32]).unwrap();
        let t = k.job_token("uid-1");
        assert_eq!(t.len(), 64);
        assert!(t.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(t, k.job_token("uid-1"));
        assert_ne!(t, k.job_token("uid-2"));
        assert_ne!(t, TokenKey::new(&[8u8; 32]).unwrap().job_token("uid-1"));
        assert_ne!(t, k.control_token("uid-1"));
        assert_eq!(k.control_token("uid-1"), k.control_token("uid-1"));
        // The Secrets' suffix: stable, 16 hex digits, and not the start of either token.
        let s = k.secret_suffix("uid-1");
        assert_eq!((s.len(), s == k.secret_suffix("uid-1")), (16, true));
        assert!(s.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(s, k.secret_suffix("uid-2"));
        assert!(!t.starts_with(&s) && !k.control_token("uid-1").starts_with(&s));
    }

    #[test]
    fn short_keys_are_refused() {
        let e = TokenKey::new(b"too short").unwrap_err();
        assert!(e.to_string().contains("at least 32 bytes"), "{e}");
        assert!(!format!("{:?}", TokenKey::new(&[1; 40]).unwrap()).contains('1'));
    }
}
