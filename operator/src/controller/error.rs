//! The reconciler's errors and what each tells the user (a condition's reason, a metric's label).

use crate::controller::desired::ps_tls::{self};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the TrainingJob has no name, namespace or UID")]
    Incomplete,
    /// An object has the name of one of the job's children and is not the job's: the operator
    /// leaves it alone and the job waits (a job deleted and made again under the same name
    /// waits here until the garbage collector has removed the old job's children).
    #[error(
        "{kind} {name} exists and is not this job's ({holder}); the operator leaves it alone: delete or rename it, or give the TrainingJob another name"
    )]
    NotOurs { kind: String, name: String, holder: String },
    #[error("the job's TLS certificates: {0}")]
    Certificates(#[from] ps_tls::IssueError),
}

impl Error {
    /// The `ReconcileFailed` condition's reason: the API server's (Forbidden, Invalid, ...).
    pub(crate) fn condition_reason(&self) -> String {
        match self {
            Error::Kube(kube::Error::Api(s)) if !s.reason.is_empty() => s.reason.clone(),
            Error::Kube(_) => "KubernetesAPIError".into(),
            Error::Incomplete => "IncompleteObject".into(),
            Error::NotOurs { .. } => "NameConflict".into(),
            Error::Certificates(_) => "CertificateError".into(),
        }
    }

    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(e) if is_status(e, 409))
    }

    /// The `reason` label of `foresight_operator_reconcile_errors_total` (one of
    /// `metrics::ERROR_REASONS`).
    pub(crate) fn metric_reason(&self) -> &'static str {
        match self {
            e if e.is_conflict() => "conflict",
            Error::Kube(_) => "kube_api",
            Error::Incomplete => "incomplete_object",
            Error::NotOurs { .. } => "name_conflict",
            Error::Certificates(_) => "certificates",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether `e` is the API server's answer with HTTP status `code` (409: a conflict).
pub fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}
