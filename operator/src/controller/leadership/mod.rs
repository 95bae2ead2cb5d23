//! Leadership: which operator reconciles which namespace. One replica of a release leads
//! (`leader`: a Lease), and a leader surveys the other releases' Leases and claims (`scope`,
//! `claims`) so that two operators never reconcile the same job. This file holds what the three
//! share: the Lease's settings and the marks on it. The room imports only `watch` and `error`.

use std::time::Duration;

use crate::controller::watch::Watch;

pub mod claims;
pub mod leader;
pub mod scope;

/// Which Lease this operator holds, for how long, and what it watches.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// This replica's name in `holderIdentity` (the pod name in a cluster).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// What this operator watches, written on the Lease for the others' surveys (`scope`).
    pub watch: Watch,
    /// The namespaces whose marked Leases may speak for every namespace: the operators'
    /// namespaces (this Lease's own, `--trusted-lease-namespaces`). Any other marked Lease or
    /// claim speaks only for the namespace it lives in (`scope::peers`).
    pub trusted: Vec<String>,
}

/// The label that marks an operator's Lease.
pub const LEASE_LABEL: &str = "foresight.dev/operator-lease";
/// The Lease's annotation naming what its operator watches: `*`, or namespaces separated by
/// commas.
pub const SCOPE_ANNOTATION: &str = "foresight.dev/watch-namespaces";
/// How often a leader surveys the other operators' Leases: four lease durations (a minute by
/// default), so that a survey costs less than the renewals.
pub fn survey_every(lease_duration: Duration) -> Duration {
    lease_duration * 4
}

impl Watch {
    /// The value of [`SCOPE_ANNOTATION`].
    pub fn annotation(&self) -> String {
        match self {
            Watch::All => "*".into(),
            Watch::Namespaces(names) => names.join(","),
        }
    }

    pub(crate) fn from_annotation(value: &str) -> Option<Watch> {
        match value {
            "*" => Some(Watch::All),
            list => Watch::parse(list).ok().filter(|w| *w != Watch::All),
        }
    }
}

/// On a claim: `namespace/name` of the Lease of the operator that wrote it.
pub const CLAIM_OF_ANNOTATION: &str = "foresight.dev/claim-of";
