//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it:
//! a replica takes the Lease when it is free or its holder stopped renewing it for
//! `lease_duration`, renews it every `retry_period`, and gives up leading when it could not
//! renew within `renew_deadline` (shorter than the lease, so the old leader stops before anyone
//! else may start). Every write carries the resourceVersion it read, so two replicas racing for
//! a free Lease cannot both win: the API server refuses the second with a conflict.
//!
//! Two things are taken from client-go because the obvious way is wrong:
//! - **Expiry is measured on this replica's clock**, from the moment it first saw the current
//!   record (holder, renew and acquire times), not by comparing the holder's `renewTime` with
//!   the local wall clock: with clocks skewed by more than the lease, the latter lets a standby
//!   take a lease its holder is still renewing (two leaders).
//! - **Every API call has a deadline.** A renewal that hangs (a stuck connection) would
//!   otherwise keep a deposed leader reconciling forever; `hold` gives up leading once the
//!   renew deadline passes, whether the calls failed or never answered.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

use super::LeaseConfig;
use crate::controller::error::is_status;

pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    /// The record as last read, and when (locally) it was first seen so.
    observed: Mutex<Option<(Record, Instant)>>,
}

/// The parts of a Lease that change when its holder renews or changes.
#[derive(Clone, Debug, PartialEq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    acquire_time: Option<MicroTime>,
    transitions: Option<i32>,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Self {
        Self {
            holder: spec.holder_identity.clone(),
            renew_time: spec.renew_time.clone(),
            acquire_time: spec.acquire_time.clone(),
            transitions: spec.lease_transitions,
        }
    }
}

/// Whether a lease whose record was first seen unchanged at `seen` and lasts `ttl` has expired
/// at `now`, all on this replica's monotonic clock.
fn expired(seen: Instant, ttl: Duration, now: Instant) -> bool {
    now.saturating_duration_since(seen) > ttl
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
        Self { api: Api::namespaced(client, &cfg.namespace), cfg, observed: Mutex::new(None) }
    }

    /// One attempt, abandoned after `limit` (a hung call counts as a failed one).
    async fn attempt(&self, limit: Duration) -> Result<Attempt, String> {
        match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer from the API server within {limit:?}")),
        }
    }

    /// Returns once this replica holds the lease; `on_contact` runs after the first answer of
    /// the API server (the replica is then ready, leading or not).
    pub async fn acquire(&self, mut on_contact: impl FnMut()) {
        let mut last_holder = None;
        loop {
            match self.attempt(self.cfg.renew_deadline).await {
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
    /// A renewal that does not answer is cut off at the deadline, so this returns within
    /// `renew_deadline` of the last successful renewal whatever the API server does.
    pub async fn hold(&self) -> String {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.cfg.retry_period).await;
            let left = self.cfg.renew_deadline.saturating_sub(last_renewed.elapsed());
            match self.attempt(left.max(Duration::from_millis(1))).await {
                Ok(Attempt::Leading) => last_renewed = Instant::now(),
                Ok(Attempt::Held(holder)) => return format!("the lease is held by {holder}"),
                Err(e) => tracing::warn!(lease = %self.cfg.name, error = %e, "could not renew the lease"),
            }
            if last_renewed.elapsed() >= self.cfg.renew_deadline {
                return format!("the lease was not renewed for {:?}", self.cfg.renew_deadline);
            }
        }
    }

    /// Stops leading now (on shutdown), so a standby takes over without waiting for expiry.
    pub async fn release(&self) {
        // Bounded: shutting down must not wait on a hung API server.
        let read = tokio::time::timeout(self.cfg.retry_period, self.api.get_opt(&self.cfg.name)).await;
        if let Ok(Ok(Some(mut lease))) = read {
            let spec = lease.spec.get_or_insert_default();
            if spec.holder_identity.as_deref() == Some(&self.cfg.identity) {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                let pp = PostParams::default();
                let write = self.api.replace(&self.cfg.name, &pp, &lease);
                match tokio::time::timeout(self.cfg.retry_period, write).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "could not release the lease"),
                    Err(_) => tracing::warn!("could not release the lease: no answer from the API server"),
                }
            }
        }
    }

    /// Labels the Lease as an operator's and names what it watches (`scope`).
    fn mark(&self, lease: &mut Lease) {
        let meta = &mut lease.metadata;
        meta.labels.get_or_insert_default().insert(super::LEASE_LABEL.into(), "true".into());
        let scope = self.cfg.watch.annotation();
        meta.annotations.get_or_insert_default().insert(super::SCOPE_ANNOTATION.into(), scope);
    }

    async fn try_acquire_or_renew(&self) -> Result<Attempt, kube::Error> {
        let now = Timestamp::now();
        let duration_s = i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(i32::MAX).max(1);
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let mut lease = Lease {
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
            self.mark(&mut lease);
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leading),
                Err(e) if is_status(&e, 409) => {
                    Ok(Attempt::Held("another replica (it created the lease first)".into()))
                }
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_default();
        let seen = {
            let mut observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
            let record = Record::of(spec);
            match &*observed {
                Some((r, at)) if *r == record => *at,
                _ => observed.insert((record, Instant::now())).1,
            }
        };
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.cfg.identity.as_str());
        if !mine && let Some(holder) = holder {
            let ttl = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(duration_s).max(0) as u64);
            if !expired(seen, ttl, Instant::now()) {
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
        self.mark(&mut lease);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed_s: i64) -> LeaseSpec {
        let t = Timestamp::from_second(renewed_s).unwrap();
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(t)),
            acquire_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            lease_transitions: Some(1),
            ..Default::default()
        }
    }

    /// A holder whose clock is an hour behind still renews: its record changes, so a standby
    /// sees a live lease however old the renewTime reads.
    #[test]
    fn a_record_that_changes_is_live_whatever_its_timestamps_say() {
        let ttl = Duration::from_secs(3);
        let t0 = Instant::now();
        assert_ne!(Record::of(&spec("a", 0)), Record::of(&spec("a", 1)), "a renewal is a change");
        assert_eq!(Record::of(&spec("a", 5)), Record::of(&spec("a", 5)));
        assert!(!expired(t0, ttl, t0 + Duration::from_secs(2)));
        assert!(expired(t0, ttl, t0 + Duration::from_secs(4)));
        assert!(!expired(t0 + Duration::from_secs(1), ttl, t0), "a later sighting never expires early");
    }
}
