//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it:
//! a replica takes the Lease when it is free or its holder stopped renewing it for
//! `lease_duration`, renews it every `retry_period`, and gives up leading when it could not
//! renew within `renew_deadline` (shorter than the lease, so the old leader stops before anyone
//! else may start). Every write carries the resourceVersion it read, so two replicas racing for
//! a free Lease cannot both win: the API server refuses the second with a conflict.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// This replica's name in `holderIdentity` (the pod name in a cluster).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaseConfig,
}

/// What one attempt found.
#[derive(Debug, PartialEq)]
enum Attempt {
    Leading,
    /// Someone else holds a live lease.
    Held(String),
}

impl LeaderElector {
    pub fn new(client: kube::Client, cfg: LeaseConfig) -> Self {
        Self { api: Api::namespaced(client, &cfg.namespace), cfg }
    }

    /// Returns once this replica holds the lease; `on_contact` runs after the first answer of
    /// the API server (the replica is then ready, leading or not).
    pub async fn acquire(&self, mut on_contact: impl FnMut()) {
        let mut last_holder = None;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => {
                    on_contact();
                    tracing::info!(lease = %self.cfg.name, identity = %self.cfg.identity, "became the leader");
                    return;
                }
                Ok(Attempt::Held(holder)) => {
                    on_contact();
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(lease = %self.cfg.name, %holder, "standing by: another replica leads");
                        last_holder = Some(holder);
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %self.cfg.name, error = %e, "could not read or take the lease")
                }
            }
            tokio::time::sleep(self.cfg.retry_period).await;
        }
    }

    /// Renews the lease until that fails for `renew_deadline`; returns when leadership is lost.
    pub async fn hold(&self) -> String {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.cfg.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => last_renewed = Instant::now(),
                Ok(Attempt::Held(holder)) => return format!("the lease is held by {holder}"),
                Err(e) => tracing::warn!(lease = %self.cfg.name, error = %e, "could not renew the lease"),
            }
            if last_renewed.elapsed() > self.cfg.renew_deadline {
                return format!("the lease was not renewed for {:?}", self.cfg.renew_deadline);
            }
        }
    }

    /// Stops leading now (on shutdown), so a standby takes over without waiting for expiry.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await {
            let spec = lease.spec.get_or_insert_default();
            if spec.holder_identity.as_deref() == Some(&self.cfg.identity) {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                if let Err(e) = self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
                    tracing::warn!(error = %e, "could not release the lease");
                }
            }
        }
    }

    async fn try_acquire_or_renew(&self) -> Result<Attempt, kube::Error> {
        let now = Timestamp::now();
        let duration_s = i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(i32::MAX).max(1);
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.cfg.name.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(duration_s),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leading),
                Err(e) if is_status(&e, 409) => {
                    Ok(Attempt::Held("another replica (it created the lease first)".into()))
                }
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.cfg.identity.as_str());
        if !mine && let Some(holder) = holder {
            let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()).map(|t| t.0);
            let ttl = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(duration_s).into());
            let expired = renewed.is_none_or(|r| r.checked_add(ttl).is_ok_and(|end| end < now));
            if !expired {
                return Ok(Attempt::Held(holder));
            }
        }
        if !mine {
            spec.holder_identity = Some(self.cfg.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.lease_duration_seconds = Some(duration_s);
        spec.renew_time = Some(MicroTime(now));
        // `replace` sends the resourceVersion we read: a concurrent writer makes this a 409.
        match self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(Attempt::Leading),
            Err(e) if is_status(&e, 409) => {
                Ok(Attempt::Held("another replica (it wrote the lease first)".into()))
            }
            Err(e) => Err(e),
        }
    }
}

pub fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}
