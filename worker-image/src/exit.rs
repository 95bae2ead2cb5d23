//! How a worker process ends: 0 when its work is done; 1 after a failure a new attempt may not
//! meet (the Job starts another pod, within `backoffLimit`, which resumes where this one
//! stopped); [`PERMANENT`] after a failure no attempt can fix, which the operator's
//! podFailurePolicy turns into a failed job at once instead of spending the retry budget.

use foresight_ps::client::ClientError;

/// Must match the operator's `WORKER_EXIT_PERMANENT`.
pub const PERMANENT: i32 = 3;
pub const RETRYABLE: i32 = 1;
/// After SIGTERM: what the signal's default action reports (128 + 15).
pub const TERMINATED: i32 = 143;

/// A failure that retrying cannot fix: bad configuration or data, or a model that does not fit.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct Permanent(pub anyhow::Error);

/// Marks `e` as [`Permanent`].
pub fn permanent(e: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(Permanent(e.into()))
}

/// The exit status for an error that ended the worker.
pub fn code(e: &anyhow::Error) -> i32 {
    let refused_for_good =
        e.chain().any(|c| c.downcast_ref::<ClientError>().is_some_and(ClientError::is_permanent));
    if e.downcast_ref::<Permanent>().is_some() || refused_for_good { PERMANENT } else { RETRYABLE }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_data_and_refusals_for_good_are_permanent() {
        assert_eq!(code(&permanent(anyhow::anyhow!("no such dataset"))), PERMANENT);
        let refused = |reason: &str| ClientError::Refused {
            status: reqwest::StatusCode::CONFLICT,
            reason: reason.into(),
            message: String::new(),
            retry_after: None,
        };
        let wrapped =
            |reason: &str| anyhow::Error::new(refused(reason)).context("pushing the gradient of step 3");
        assert_eq!(code(&wrapped("unauthorized")), PERMANENT);
        assert_eq!(code(&wrapped("superseded")), RETRYABLE);
        assert_eq!(code(&wrapped("non_finite")), RETRYABLE);
        assert_eq!(code(&anyhow::anyhow!("the PS was unreachable for 300 s")), RETRYABLE);
    }
}
