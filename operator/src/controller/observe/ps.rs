//! Reads from a job's parameter server: its `/v1/status` (progress, process, worker count) and
//! which control token it accepts.

use std::sync::Arc;
use std::time::Duration;

use foresight_ps::client::{ClientError, ClientTls, PsClient};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::Progress;
use crate::controller::context::Context;
use crate::controller::decide::status::PsProcess;
use crate::controller::desired::children::Owner;
use crate::controller::desired::ps_tls::{self, created_s};
use crate::controller::error::Result;
use crate::controller::observe::ps_clients::PsClients;

impl Context {
    /// How the operator reaches job `owner`'s PS (shard 0, which passes calls on): its URL, and
    /// when the PS serves TLS, `https://` trusting the job's CA (of the current token key and of
    /// the previous one: the key a job's certificates came from is not recorded).
    pub(crate) fn ps_addr(&self, owner: &Owner<'_>, tls: bool) -> PsAddr {
        let url =
            self.settings.ps_url.replace("{name}", &owner.name).replace("{namespace}", &owner.namespace);
        let (uid, clients) = (owner.uid().to_string(), self.ps_clients.clone());
        if !tls {
            return PsAddr { url, tls: None, uid, clients };
        }
        let url = url.strip_prefix("http://").map_or(url.clone(), |rest| format!("https://{rest}"));
        let keys = std::iter::once(&self.settings.token_key).chain(self.settings.previous_token_key.as_ref());
        let trust = ps_tls::trust(keys, owner.uid(), created_s(owner.job));
        if let Err(e) = &trust {
            tracing::warn!(job = %owner.name, error = %e, "no CA to trust for the job's parameter server");
        }
        PsAddr { url, tls: trust.ok(), uid, clients }
    }
}

/// Where the operator calls a job's parameter server.
pub(crate) struct PsAddr {
    pub(crate) url: String,
    /// The roots an `https://` URL is checked against.
    pub(crate) tls: Option<ClientTls>,
    /// The job's.
    uid: String,
    clients: Arc<PsClients>,
}

impl PsAddr {
    /// The job's client for calls with `token` (`PsClients`).
    pub(crate) fn client(&self, token: String) -> Result<PsClient, ClientError> {
        self.clients.get(&self.uid, &self.url, self.tls.as_ref(), token)
    }
}

/// The control token the job's PS accepts: the current key's, or, after a key rotation, the
/// previous key's for a job created before it (its pods hold the tokens of its Secret, written
/// once). Without a previous key, no request is made; with one, the PS is asked until it has
/// answered once for this job, and the answer is kept.
pub(crate) async fn accepted_control_token(ctx: &Context, ps: &PsAddr, uid: &str, current: String) -> String {
    let Some(previous) = &ctx.settings.previous_token_key else { return current };
    let known = ctx.previous_key.lock().unwrap_or_else(|e| e.into_inner()).get(uid).copied();
    let uses_previous = match known {
        Some(p) => p,
        None => match token_accepted(ps, current.clone()).await {
            Some(true) => false,
            Some(false) if token_accepted(ps, previous.control_token(uid)).await == Some(true) => true,
            // No answer, or neither token taken: ask again on a later reconcile.
            _ => return current,
        },
    };
    ctx.previous_key.lock().unwrap_or_else(|e| e.into_inner()).insert(uid.to_string(), uses_previous);
    if uses_previous { previous.control_token(uid) } else { current }
}

/// Whether the PS at `url` accepts `token` (`None`: it did not answer within 3 s).
pub(crate) async fn token_accepted(ps: &PsAddr, token: String) -> Option<bool> {
    let client = ps.client(token).ok()?;
    match tokio::time::timeout(Duration::from_secs(3), client.status()).await {
        Ok(Ok(_)) => Some(true),
        Ok(Err(e)) if e.reason() == Some("unauthorized") => Some(false),
        _ => None,
    }
}

/// The parameter server's `/v1/status`; `None` when it does not answer.
pub(crate) async fn read_ps_status(ps: &PsAddr, token: &str) -> Option<serde_json::Value> {
    let client = ps.client(token.to_string()).ok()?;
    match tokio::time::timeout(Duration::from_secs(3), client.status()).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            tracing::debug!(url = %ps.url, error = %e, "parameter server status");
            None
        }
        Err(_) => None,
    }
}

pub(crate) fn ps_process_of(v: &serde_json::Value) -> Option<PsProcess> {
    let p = v.get("process")?;
    let started_ms = p.get("started_at_ms")?.as_i64()?;
    Some(PsProcess {
        incarnation: p.get("incarnation")?.as_str()?.to_string(),
        started_at: Time(Timestamp::from_millisecond(started_ms).ok()?),
        restored_version: p.get("restored_version").and_then(serde_json::Value::as_u64),
        algorithm: v.get("algorithm").and_then(serde_json::Value::as_str).map(str::to_string),
    })
}

pub(crate) fn progress_of(v: &serde_json::Value) -> Progress {
    let num = |path: &[&str]| path.iter().try_fold(v, |v, k| v.get(k)).and_then(serde_json::Value::as_f64);
    Progress {
        step: num(&["version"]).unwrap_or(0.0) as u64,
        epoch: num(&["epoch"]).unwrap_or(0.0).floor() as u32,
        loss: num(&["loss"]),
        accuracy: num(&["accuracy"]),
        staleness_p50: num(&["staleness", "p50"]),
        staleness_p99: num(&["staleness", "p99"]),
    }
}
