//! `/healthz` that sees a stuck store: pushes waiting inside the store while no update has
//! finished for the limit (a ticket that never leaves its shard, a lock never released) fail the
//! liveness probe, so that the kubelet restarts a PS that serves HTTP but trains nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Pushes inside the store, and when one last came out.
pub struct StoreWatch {
    inside: AtomicUsize,
    progress: Mutex<Instant>,
}

impl Default for StoreWatch {
    fn default() -> Self {
        Self { inside: AtomicUsize::new(0), progress: Mutex::new(Instant::now()) }
    }
}

/// A push inside the store: counted until dropped.
pub struct Inside<'a>(&'a StoreWatch);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        *self.0.progress.lock() = Instant::now();
        self.0.inside.fetch_sub(1, Ordering::AcqRel);
    }
}

impl StoreWatch {
    /// A push goes into the store.
    pub fn enter(&self) -> Inside<'_> {
        // The wait counts from the first push that finds the store idle.
        if self.inside.fetch_add(1, Ordering::AcqRel) == 0 {
            *self.progress.lock() = Instant::now();
        }
        Inside(self)
    }

    /// How many pushes are inside and how long none has come out, when that is `limit` or more.
    pub fn stuck(&self, limit: Duration) -> Option<(usize, Duration)> {
        let inside = self.inside.load(Ordering::Acquire);
        let waited = self.progress.lock().elapsed();
        (inside > 0 && waited >= limit).then_some((inside, waited))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pushes_waiting_past_the_limit_with_none_coming_out_are_stuck() {
        let w = StoreWatch::default();
        assert_eq!(w.stuck(Duration::ZERO), None, "nothing inside");
        let a = w.enter();
        std::thread::sleep(Duration::from_millis(30));
        assert!(w.stuck(Duration::from_millis(20)).is_some_and(|(n, _)| n == 1));
        assert_eq!(w.stuck(Duration::from_secs(5)), None, "not yet past the limit");
        let b = w.enter();
        drop(a); // one came out: progress
        assert_eq!(w.stuck(Duration::from_millis(20)), None);
        drop(b);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(w.stuck(Duration::ZERO), None, "idle is not stuck");
    }
}
