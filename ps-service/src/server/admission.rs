//! Admission control for push bodies: each push holds a model-sized gradient buffer from the
//! moment its body is read until it is applied, so concurrent pushes are what makes a PS's
//! memory grow past what the model and its state need. At most K are admitted at once; the
//! others wait for a slot (HTTP/2 flow control holds their bodies back meanwhile) and, after
//! [`QUEUE_WAIT`], are refused with 503 `busy` and `Retry-After`, which the client honours.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// How long a push waits for a slot before it is told to come back.
pub const QUEUE_WAIT: Duration = Duration::from_secs(2);
/// The `Retry-After` a refused push gets, in seconds.
pub const RETRY_AFTER_SECONDS: u64 = 1;
/// Share of the memory limit the PS plans to fill (the rest: allocator slack, HTTP buffers).
const PLANNED_SHARE: f64 = 0.9;

/// Model-sized copies the PS holds whatever the pushes: the model itself, `state_copies` of
/// optimizer state (MeanSquare, momentum; with bf16 or int8 pulls also the bodies being sent,
/// with int8 each worker's copy), one snapshot per worker as its backup plus the pull cache,
/// and one older snapshot per worker still being sent to it.
pub fn resident_copies(workers: usize, state_copies: usize) -> usize {
    1 + state_copies + (workers + 1) + workers
}

/// K, the push bodies buffered at once: what fits in the memory limit beside
/// [`resident_copies`], at least 1 (training goes on, slowly) and at most one per worker (a
/// worker has at most one push in flight). `None` without a limit: no bound.
pub fn push_slots(
    memory_limit: Option<u64>,
    model_bytes: u64,
    workers: usize,
    state_copies: usize,
) -> Option<usize> {
    let workers = workers.max(1);
    let model_bytes = model_bytes.max(1) as f64;
    let planned = memory_limit? as f64 * PLANNED_SHARE;
    let free = planned - resident_copies(workers, state_copies) as f64 * model_bytes;
    Some(((free / model_bytes).floor().max(1.0) as usize).min(workers))
}

/// The slots, made once the model's size is known.
pub struct PushSlots {
    slots: Arc<Semaphore>,
    /// K; `None`: unbounded.
    pub count: Option<usize>,
}

impl PushSlots {
    pub fn new(count: Option<usize>) -> Self {
        let permits = count.map_or(Semaphore::MAX_PERMITS, |k| k.max(1));
        Self { slots: Arc::new(Semaphore::new(permits)), count }
    }

    /// A slot, held until the push's buffers are back in their pools; `busy` after [`QUEUE_WAIT`].
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        match tokio::time::timeout(QUEUE_WAIT, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::busy(self.count.unwrap_or(0))),
        }
    }
}

impl ApiError {
    pub fn busy(slots: usize) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            format!(
                "all {slots} push slots are taken (the parameter server's memory limit): retry after {RETRY_AFTER_SECONDS}s"
            ),
        );
        e.retry_after = Some(RETRY_AFTER_SECONDS);
        e
    }
}

/// The container's memory limit (cgroup v2, then v1), `None` when unlimited or unknown.
pub fn cgroup_memory_limit() -> Option<u64> {
    ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        // cgroup v1 writes "no limit" as a huge page-aligned number.
        .filter(|&b| b < 1 << 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;

    #[test]
    fn without_a_limit_pushes_are_not_bounded() {
        assert_eq!(push_slots(None, 400_000_000, 8, 1), None);
    }

    #[test]
    fn a_limit_leaves_room_for_the_resident_copies_first() {
        // 100M parameters (400 MB), 4 workers, dc-asgd-a (MeanSquare): 11 resident copies,
        // 4.4 GB. A 6 GiB limit plans 5.8 GB: 3 bodies fit.
        assert_eq!(resident_copies(4, 1), 11);
        assert_eq!(push_slots(Some(6 * GB), 400_000_000, 4, 1), Some(3));
        // Plenty of memory: no more than one per worker.
        assert_eq!(push_slots(Some(64 * GB), 400_000_000, 4, 1), Some(4));
        // Too little for even the resident copies: still one, so that training goes on.
        assert_eq!(push_slots(Some(GB), 400_000_000, 4, 1), Some(1));
    }
}
