//! Claims: a namespaced operator's mark in each namespace it watches.
//!
//! A namespaced release may list Leases only where it has a Role: its own namespace and the
//! ones it watches. Its own Lease lives in its own namespace, so two namespaced releases
//! installed in *different* namespaces that both watch a third would never see each other's
//! Lease, and both would reconcile that namespace's jobs. So the leader of a namespaced release
//! also writes a claim — a Lease marked like its own ([`LEASE_LABEL`], [`SCOPE_ANNOTATION`], the
//! same acquire time) with [`CLAIM_OF_ANNOTATION`] naming its own Lease — in each namespace it
//! watches, renews it at every survey and deletes it when it stops leading. Every other
//! operator that watches that namespace lists it there, and `scope` judges it as it judges the
//! Lease it stands for. A cluster-wide release needs none: it lists every namespace's Leases.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

use super::{CLAIM_OF_ANNOTATION, LEASE_LABEL, LeaseConfig, SCOPE_ANNOTATION, survey_every};
use crate::controller::watch::Watch;

/// The name of this operator's claim in each namespace it watches (the chart grants get,
/// update and delete on that name only).
pub fn claim_name(cfg: &LeaseConfig) -> String {
    format!("foresight-claim.{}.{}", cfg.namespace, cfg.name)
}

/// `namespace/name` of the operator's own Lease.
pub fn own_lease(cfg: &LeaseConfig) -> String {
    format!("{}/{}", cfg.namespace, cfg.name)
}

/// Where claims go: every watched namespace but the operator's own, which holds its Lease.
pub fn claimed_namespaces(cfg: &LeaseConfig) -> Vec<&str> {
    match &cfg.watch {
        Watch::All => Vec::new(),
        Watch::Namespaces(names) => {
            names.iter().map(String::as_str).filter(|n| *n != cfg.namespace).collect()
        }
    }
}

/// The claim in `namespace`: live for two surveys after `now`, ordered by `since` (when the
/// operator's own Lease was taken).
pub fn claim(cfg: &LeaseConfig, namespace: &str, since: Timestamp, now: Timestamp) -> Lease {
    let annotations = [
        (SCOPE_ANNOTATION.to_string(), cfg.watch.annotation()),
        (CLAIM_OF_ANNOTATION.to_string(), own_lease(cfg)),
    ];
    Lease {
        metadata: ObjectMeta {
            name: Some(claim_name(cfg)),
            namespace: Some(namespace.into()),
            labels: Some([(LEASE_LABEL.to_string(), "true".to_string())].into()),
            annotations: Some(annotations.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(cfg.identity.clone()),
            lease_duration_seconds: Some(survey_every(cfg.lease_duration).as_secs().max(1) as i32),
            acquire_time: Some(MicroTime(since)),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// Whether `lease` is this operator's claim (a Lease of that name written by anyone else is
/// never taken over or deleted).
fn is_own_claim(lease: &Lease, cfg: &LeaseConfig) -> bool {
    let of = lease.metadata.annotations.as_ref().and_then(|a| a.get(CLAIM_OF_ANNOTATION));
    of.is_some_and(|of| *of == own_lease(cfg))
}

/// Writes or renews the claim in each claimed namespace. A failure is logged and the others go
/// on: the survey still judges what it can see.
pub async fn stake(client: &kube::Client, cfg: &LeaseConfig, since: Timestamp) {
    for ns in claimed_namespaces(cfg) {
        if let Err(e) = stake_in(client, cfg, ns, since).await {
            tracing::warn!(namespace = ns, error = %e, "could not write this operator's claim: an operator installed elsewhere that watches this namespace too would go unnoticed");
        }
    }
}

async fn stake_in(
    client: &kube::Client,
    cfg: &LeaseConfig,
    ns: &str,
    since: Timestamp,
) -> Result<(), kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    let mut want = claim(cfg, ns, since, Timestamp::now());
    let name = claim_name(cfg);
    match api.get_opt(&name).await? {
        None => api.create(&PostParams::default(), &want).await.map(drop),
        Some(found) if is_own_claim(&found, cfg) => {
            want.metadata.resource_version = found.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &want).await.map(drop)
        }
        Some(_) => {
            tracing::warn!(namespace = ns, lease = %name, "a Lease named like this operator's claim is not its claim: left alone");
            Ok(())
        }
    }
}

/// Deletes the claims (when this operator stops leading), each bounded by `deadline`: shutting
/// down must not wait on a hung API server. A claim left behind lapses after two surveys.
pub async fn withdraw(client: &kube::Client, cfg: &LeaseConfig, deadline: Duration) {
    for ns in claimed_namespaces(cfg) {
        match tokio::time::timeout(deadline, withdraw_from(client, cfg, ns)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(namespace = ns, error = %e, "could not withdraw this operator's claim")
            }
            Err(_) => tracing::warn!(namespace = ns, "could not withdraw this operator's claim: no answer"),
        }
    }
}

async fn withdraw_from(client: &kube::Client, cfg: &LeaseConfig, ns: &str) -> Result<(), kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    let name = claim_name(cfg);
    let Some(found) = api.get_opt(&name).await? else { return Ok(()) };
    if !is_own_claim(&found, cfg) {
        return Ok(());
    }
    // The claim read, not whatever now has its name.
    let preconditions = Preconditions { uid: found.metadata.uid, resource_version: None };
    let dp = DeleteParams { preconditions: Some(preconditions), ..Default::default() };
    match api.delete(&name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(watch: &str) -> LeaseConfig {
        LeaseConfig {
            name: "foresight-operator".into(),
            namespace: "team-a".into(),
            identity: "pod-1".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(3),
            watch: Watch::parse(watch).unwrap(),
            trusted: vec!["team-a".into()],
        }
    }

    #[test]
    fn a_claim_goes_to_every_watched_namespace_but_the_operators_own_and_none_for_a_cluster_wide_one() {
        assert_eq!(claimed_namespaces(&cfg("team-a,shared,data")), ["data", "shared"]);
        assert!(claimed_namespaces(&cfg("")).is_empty());
        let c = cfg("team-a,shared");
        let since = Timestamp::from_second(100).unwrap();
        let lease = claim(&c, "shared", since, Timestamp::from_second(160).unwrap());
        assert_eq!(lease.metadata.name.as_deref(), Some("foresight-claim.team-a.foresight-operator"));
        let a = lease.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            (a[SCOPE_ANNOTATION].as_str(), a[CLAIM_OF_ANNOTATION].as_str()),
            ("shared,team-a", "team-a/foresight-operator")
        );
        let spec = lease.spec.as_ref().unwrap();
        assert_eq!(spec.acquire_time.as_ref().map(|t| t.0), Some(since));
        assert_eq!(spec.lease_duration_seconds, Some(60), "live for two surveys of a minute");
        assert!(is_own_claim(&lease, &c));
        let mut forged = lease;
        forged.metadata.annotations = None;
        assert!(!is_own_claim(&forged, &c));
    }
}
