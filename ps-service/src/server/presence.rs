//! Which workers the PS has heard from lately. A worker silent for the silence timeout (dead,
//! stopped, cut off) stops holding up `sync` rounds; its next request counts it again. Worker
//! pods have no other liveness signal the PS could see.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Presence {
    /// Last request at this instant (or, before its first, when the PS or the slot started).
    Heard(Instant),
    /// This many of the worker's requests are open here (a pull waiting for its `sync` round or
    /// for a newer version, a model-sized upload or download): the worker is on the other end of
    /// a live connection, however long it lasts. Heard when the last one ends.
    Waiting(usize),
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
        match table.get_mut(worker) {
            Some(Presence::Waiting(_)) | None => false,
            Some(slot) => std::mem::replace(slot, Presence::Heard(Instant::now())) == Presence::Silent,
        }
    }

    /// A request from `worker` that stays open (a long poll, a model-sized upload or
    /// download), heard already: the worker is not marked silent until [`Self::end_wait`].
    pub fn begin_wait(&self, worker: usize) {
        if let Some(slot) = self.table.lock().get_mut(worker) {
            *slot = match *slot {
                Presence::Waiting(n) => Presence::Waiting(n + 1),
                Presence::Heard(_) | Presence::Silent => Presence::Waiting(1),
            };
        }
    }

    /// One of `worker`'s open requests ended (answered, or its connection gone): heard now,
    /// once the last one has.
    pub fn end_wait(&self, worker: usize) {
        if let Some(slot) = self.table.lock().get_mut(worker) {
            *slot = match *slot {
                Presence::Waiting(n) if n > 1 => Presence::Waiting(n - 1),
                _ => Presence::Heard(Instant::now()),
            };
        }
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
        let live = |slot: &&Presence| match slot {
            Presence::Heard(at) => at.elapsed() < window,
            Presence::Waiting(_) => true,
            Presence::Silent => false,
        };
        table.iter().filter(live).count()
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

    #[test]
    fn a_worker_with_a_request_open_is_never_silent_and_is_heard_when_the_last_one_ends() {
        let p = Presences::new(2);
        p.begin_wait(0);
        p.begin_wait(0);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(p.newly_silent(2, Duration::from_millis(20)), [1], "worker 0 waits on a request");
        assert!(!p.heard(0), "a request meanwhile changes nothing");
        assert_eq!(p.heard_within(Duration::from_millis(20)), 1);
        p.end_wait(0);
        std::thread::sleep(Duration::from_millis(30));
        assert!(p.newly_silent(2, Duration::from_millis(20)).is_empty(), "one still open");
        p.end_wait(0);
        assert!(p.newly_silent(2, Duration::from_millis(20)).is_empty(), "heard as the last ended");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(p.newly_silent(2, Duration::from_millis(20)), [0], "counted from then");
        p.begin_wait(9);
        p.end_wait(9);
    }
}
