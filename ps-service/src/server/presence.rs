//! Which workers the PS has heard from lately. A worker silent for the silence timeout (dead,
//! stopped, cut off) stops holding up `sync` rounds; its next request counts it again. Worker
//! pods have no other liveness signal the PS could see.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Presence {
    /// Last request at this instant (or, before its first, when the PS or the slot started).
    Heard(Instant),
    /// Marked silent: nothing heard for the timeout.
    Silent,
}

pub(crate) struct Presences {
    table: Mutex<Vec<Presence>>,
    /// Each worker's last heartbeat (`POST /v1/heartbeat`): sent only from a training loop
    /// between exchanges, so unlike any other request it says the worker's next contribution
    /// is on its way.
    beats: Mutex<std::collections::HashMap<usize, Instant>>,
}

impl Presences {
    /// `workers` slots, each counted as heard now: a worker that never shows up falls silent
    /// one timeout after the PS started.
    pub fn new(workers: usize) -> Self {
        Self { table: Mutex::new(vec![Presence::Heard(Instant::now()); workers]), beats: Mutex::default() }
    }

    /// At least `n` slots (the job was scaled up); new ones are counted as heard now.
    pub fn grow(&self, n: usize) {
        let mut table = self.table.lock();
        if table.len() < n {
            table.resize(n, Presence::Heard(Instant::now()));
        }
    }

    /// A request from `worker`; true when it had been marked silent.
    pub fn heard(&self, worker: usize) -> bool {
        let mut table = self.table.lock();
        table
            .get_mut(worker)
            .is_some_and(|slot| std::mem::replace(slot, Presence::Heard(Instant::now())) == Presence::Silent)
    }

    /// Workers below `m` not heard for `timeout` and not marked yet: marked silent now.
    pub fn newly_silent(&self, m: usize, timeout: Duration) -> Vec<usize> {
        let mut table = self.table.lock();
        let mut silent = Vec::new();
        for (worker, slot) in table.iter_mut().enumerate().take(m) {
            if matches!(slot, Presence::Heard(at) if at.elapsed() >= timeout) {
                *slot = Presence::Silent;
                silent.push(worker);
            }
        }
        silent
    }

    /// A heartbeat from `worker` (the caller counts it as heard too).
    pub fn beat(&self, worker: usize) {
        self.beats.lock().insert(worker, Instant::now());
    }

    /// Whether `worker`'s last heartbeat came within `within`.
    pub fn beat_within(&self, worker: usize, within: Duration) -> bool {
        self.beats.lock().get(&worker).is_some_and(|at| at.elapsed() < within)
    }

    /// Whether `worker` is marked silent now.
    pub fn is_silent(&self, worker: usize) -> bool {
        self.table.lock().get(worker) == Some(&Presence::Silent)
    }

    /// Workers heard within `window`.
    pub fn heard_within(&self, window: Duration) -> usize {
        let table = self.table.lock();
        table.iter().filter(|slot| matches!(slot, Presence::Heard(at) if at.elapsed() < window)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_falls_silent_once_and_is_back_with_its_next_request() {
        let p = Presences::new(3);
        assert!(p.newly_silent(3, Duration::from_secs(60)).is_empty());
        p.heard(1);
        std::thread::sleep(Duration::from_millis(30));
        p.heard(0);
        assert_eq!(p.newly_silent(3, Duration::from_millis(20)), [1, 2]);
        assert!(p.newly_silent(3, Duration::from_millis(20)).is_empty(), "marked once");
        assert!(p.is_silent(2) && p.heard(2), "was silent");
        assert!(!p.is_silent(2));
        assert!(!p.heard(2), "heard already");
        assert_eq!(p.heard_within(Duration::from_secs(1)), 2);
        p.grow(5);
        assert!(p.newly_silent(2, Duration::ZERO).contains(&0), "only slots below m");
        assert!(!p.heard(9), "out of range");
    }
}
