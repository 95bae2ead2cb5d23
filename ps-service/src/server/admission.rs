//! Admission control for push bodies: each push holds a model-sized gradient buffer from the
//! moment its body is read until it is applied, so concurrent pushes are what makes a PS's
//! memory grow past what the model and its state need. At most K are admitted at once; the
//! others wait for a slot (HTTP/2 flow control holds their bodies back meanwhile) and, after
//! [`QUEUE_WAIT`], are refused with 503 `busy` and `Retry-After`, which the client honours.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use parking_lot::Mutex;
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

/// What the PS plans its memory by: every model-sized buffer it can hold, counted once, so that
/// with K push bodies buffered it stays within [`MemoryPlan::peak_bytes`]. Recomputed when the
/// job's worker count changes (each worker adds a backup, a snapshot being sent, a window).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryPlan {
    pub model_bytes: u64,
    pub workers: usize,
    /// Optimizer state and the pull encodings' copies, as [`resident_copies`] takes them.
    pub state_copies: usize,
    /// What a checkpoint holds while it is written: a copy of the model and of its state.
    pub checkpoint_copies: usize,
}

impl MemoryPlan {
    /// Bytes held apart from the push bodies: the resident copies, a checkpoint being written,
    /// and for each worker the start of its next push, which HTTP/2 flow control lets into the
    /// server's buffers (up to a stream window) while it waits for a slot. A restore at start
    /// (the checkpoint file read whole, then the store built from it: about three copies of the
    /// model and its state, before any backup exists) stays below it.
    pub fn resident_bytes(&self) -> u64 {
        let copies = (resident_copies(self.workers, self.state_copies) + self.checkpoint_copies) as u64;
        let windows = self.workers as u64 * self.model_bytes.min(u64::from(super::serve::STREAM_WINDOW));
        copies * self.model_bytes + windows
    }

    /// K, the push bodies buffered at once: what fits in `memory_limit` beside
    /// [`Self::resident_bytes`], at least 1 (training goes on, slowly) and at most one per
    /// worker (a worker has at most one push in flight). `None` without a limit: no bound.
    pub fn push_slots(&self, memory_limit: Option<u64>) -> Option<usize> {
        let model_bytes = self.model_bytes.max(1) as f64;
        let planned = memory_limit? as f64 * PLANNED_SHARE;
        let free = planned - self.resident_bytes() as f64;
        Some(((free / model_bytes).floor().max(1.0) as usize).min(self.workers.max(1)))
    }

    /// The most the plan lets the PS hold with `slots` push bodies buffered.
    pub fn peak_bytes(&self, slots: usize) -> u64 {
        self.resident_bytes() + slots as u64 * self.model_bytes
    }
}

/// The slots, made once the model's size is known and resized when the worker count changes.
pub struct PushSlots {
    slots: Arc<Semaphore>,
    /// K; `None`: unbounded.
    count: Mutex<Option<usize>>,
}

impl PushSlots {
    pub fn new(count: Option<usize>) -> Self {
        let permits = count.map_or(Semaphore::MAX_PERMITS, |k| k.max(1));
        Self { slots: Arc::new(Semaphore::new(permits)), count: Mutex::new(count) }
    }

    pub fn count(&self) -> Option<usize> {
        *self.count.lock()
    }

    /// Makes K `new`: slots are added at once; taken away as pushes give them back (a task
    /// holds the surplus and forgets it). Unbounded stays unbounded: the limit is set at start.
    pub fn resize(&self, new: Option<usize>) {
        let mut count = self.count.lock();
        let (Some(old), Some(new)) = (*count, new.map(|k| k.max(1))) else { return };
        if new > old {
            self.slots.add_permits(new - old);
        } else if new < old {
            let (slots, surplus) = (self.slots.clone(), (old - new) as u32);
            tokio::spawn(async move {
                if let Ok(taken) = slots.acquire_many_owned(surplus).await {
                    taken.forget();
                }
            });
        }
        *count = Some(new);
    }

    /// A slot, held until the push's buffers are back in their pools; `busy` after [`QUEUE_WAIT`].
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        match tokio::time::timeout(QUEUE_WAIT, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::busy(self.count().unwrap_or(0))),
        }
    }
}

/// One encoded pull body per worker at a time. A bf16 or int8 pull is encoded into a body of
/// its own (half or a quarter of the model), which the memory plan counts once per worker; a
/// worker pulling many times at once (its credential lets only it pull as itself) held one body
/// per pull. A second pull of the same worker waits while the first body is being sent (it is
/// released when the body is sent or dropped), and after [`QUEUE_WAIT`] is refused `busy`.
#[derive(Default)]
pub struct PullGates(Mutex<HashMap<usize, Arc<Semaphore>>>);

impl PullGates {
    /// Worker `worker`'s gate, held by its encoded pull's body until that body is gone.
    pub async fn enter(&self, worker: usize) -> Result<OwnedSemaphorePermit, ApiError> {
        let gate = self.0.lock().entry(worker).or_insert_with(|| Arc::new(Semaphore::new(1))).clone();
        match tokio::time::timeout(QUEUE_WAIT, gate.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::pull_in_progress(worker)),
        }
    }
}

/// A body that holds a [`PullGates`] permit while it exists.
pub struct Gated {
    pub body: bytes::Bytes,
    pub _gate: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Gated {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

impl ApiError {
    fn pull_in_progress(worker: usize) -> Self {
        Self::retry_later(format!(
            "worker {worker}'s previous bf16 or int8 pull is still being sent (one encoded pull body per worker at a time)"
        ))
    }

    pub fn busy(slots: usize) -> Self {
        Self::retry_later(format!("all {slots} push slots are taken (the parameter server's memory limit)"))
    }

    /// 503 `busy` with `Retry-After`, which the client honours before it retries.
    fn retry_later(why: String) -> Self {
        let message = format!("{why}: retry after {RETRY_AFTER_SECONDS}s");
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message);
        e.retry_after = Some(RETRY_AFTER_SECONDS);
        e
    }
}

/// The least container memory a parameter server starts in. Idle, before any model, it holds
/// about 14 MB (7 MB of heap and stacks, 7 MB of its code's pages). In less it is either
/// OOM-killed or, its heap still fitting, may run on while the kernel reclaims the code pages it
/// runs: at 6 MiB the e2e case's PS was killed at every start on earlier runs, and on one ran for
/// 6 minutes unkilled, its probes timing out.
pub const LEAST_MEMORY_LIMIT: u64 = 16 << 20;

/// Refuses a container memory limit (`limit`, bytes) below [`LEAST_MEMORY_LIMIT`], naming both.
pub fn check_memory_limit(limit: Option<u64>) -> Result<(), String> {
    match limit {
        Some(bytes) if bytes < LEAST_MEMORY_LIMIT => Err(format!(
            "the container's memory limit ({:.1} MiB) is below the {} MiB a parameter server needs to \
             start, before any model: raise parameterServer.resources.limits.memory",
            bytes as f64 / (1 << 20) as f64,
            LEAST_MEMORY_LIMIT >> 20
        )),
        _ => Ok(()),
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

    fn plan(workers: usize, state_copies: usize) -> MemoryPlan {
        // 100M parameters (400 MB), a checkpoint holding the model and one state copy.
        MemoryPlan { model_bytes: 400_000_000, workers, state_copies, checkpoint_copies: 2 }
    }

    #[test]
    fn a_limit_below_what_the_ps_starts_in_is_refused_naming_it() {
        let refused = check_memory_limit(Some(6 << 20)).unwrap_err();
        assert!(refused.contains("(6.0 MiB)") && refused.contains("16 MiB"), "{refused}");
        assert!(refused.contains("parameterServer.resources.limits.memory"), "{refused}");
        assert!(check_memory_limit(Some(LEAST_MEMORY_LIMIT)).is_ok());
        assert!(check_memory_limit(None).is_ok(), "no limit");
    }

    #[test]
    fn without_a_limit_pushes_are_not_bounded() {
        assert_eq!(plan(8, 1).push_slots(None), None);
    }

    #[test]
    fn a_limit_leaves_room_for_every_resident_buffer_first() {
        // 4 workers, dc-asgd-a (MeanSquare): 11 resident copies, 2 for a checkpoint, and 4
        // stream windows of 64 MiB: 5.47 GB. A 7 GiB limit plans 6.76 GB: 3 bodies fit.
        assert_eq!(resident_copies(4, 1), 11);
        assert_eq!(plan(4, 1).resident_bytes(), 13 * 400_000_000 + 4 * (64 << 20));
        assert_eq!(plan(4, 1).push_slots(Some(7 * GB)), Some(3));
        assert!(plan(4, 1).peak_bytes(3) <= (7.0 * GB as f64 * PLANNED_SHARE) as u64);
        // Plenty of memory: no more than one per worker.
        assert_eq!(plan(4, 1).push_slots(Some(64 * GB)), Some(4));
        // Too little for even the resident copies: still one, so that training goes on.
        assert_eq!(plan(4, 1).push_slots(Some(GB)), Some(1));
        // A small model's window is the model, not 64 MiB.
        let small = MemoryPlan { model_bytes: 1000, workers: 2, state_copies: 0, checkpoint_copies: 1 };
        assert_eq!(small.resident_bytes(), (resident_copies(2, 0) as u64 + 1) * 1000 + 2 * 1000);
    }

    #[test]
    fn a_scale_up_leaves_fewer_slots_under_the_same_limit() {
        // Each worker adds a backup, a snapshot being sent and a window.
        let (four, eight) = (plan(4, 1).push_slots(Some(10 * GB)), plan(8, 1).push_slots(Some(10 * GB)));
        assert_eq!((four, eight), (Some(4), Some(1)));
    }

    #[tokio::test]
    async fn resized_slots_admit_as_many_pushes_as_the_new_count() {
        let slots = PushSlots::new(Some(3));
        let held: Vec<_> = [slots.admit().await.unwrap(), slots.admit().await.unwrap()].into();
        slots.resize(Some(1));
        assert_eq!(slots.count(), Some(1));
        tokio::task::yield_now().await; // the surplus's task takes the free slot and waits
        drop(held);
        // The two given back: one is taken away, one is left.
        let one = slots.admit().await.unwrap();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(100), slots.slots.clone().acquire_owned())
                .await
                .is_err()
        );
        drop(one);
        slots.resize(Some(4));
        let four: Vec<_> = futures_util::future::join_all((0..4).map(|_| slots.admit())).await;
        assert!(four.iter().all(Result::is_ok));
    }
}
