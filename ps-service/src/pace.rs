//! How many local steps each worker trains between exchanges, when the job lets the parameter
//! server choose (`optimizer.adaptiveLocalSteps`). Pure: the push handler records what each
//! worker reports with its pushes and answers the advice.
//!
//! Two measured quantities drive it, per worker: the wall time of one of its local steps `s`,
//! and the wall time of one of its exchanges `c` (a push and the pull after it, not counting
//! the time a `sync` round held the pull). The rule:
//!
//! - **A round lasts long enough for every link**: R = max over workers of c / f, where f is
//!   the job's communication fraction. A worker that trains R seconds between exchanges
//!   spends at most f of its time exchanging, whatever its link.
//! - **Each worker fills the round at its own speed** (dynamic local updates, Liu et al. 2024):
//!   H = R / s, clamped to the job's bounds. A worker 3× slower trains a third of the steps, so
//!   a `sync` round does not wait for it and an asynchronous one receives its pseudo-gradient
//!   no staler than the others'.
//!
//! Measurements are smoothed (an exponential moving average) so that one slow exchange does
//! not swing H, and a worker not yet measured is advised the job's starting H. A worker that
//! finished or fell silent is forgotten, so a dead worker's slow link does not keep setting the
//! others' rounds. Nothing here is checkpointed: a restarted PS advises the starting H until each
//! worker's second report arrives (the first is not bounded, below), carrying its last exchange
//! that needed no retry (the worker does not time an exchange stretched by the PS's restart,
//! `client::exchange`).
//!
//! A report is the worker's word, and the slowest link sets every worker's round: one report of
//! an exchange of an hour would advise everyone the job's largest H. So a report never claims more
//! exchange than the time that passed at the PS since the same worker's previous push
//! ([`Pace::record_at`]): the exchange happened in between.

use std::collections::BTreeMap;
use std::time::Instant;

/// The bounds and target the job set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalStepsPolicy {
    /// Advised to a worker before it was measured.
    pub start: u64,
    pub min: u64,
    pub max: u64,
    /// The share of a worker's time it may spend exchanging, in (0, 1].
    pub communication_fraction: f64,
}

impl LocalStepsPolicy {
    /// The policy, or what is wrong with it.
    pub fn new(start: u64, min: u64, max: u64, communication_fraction: f64) -> Result<Self, String> {
        if min < 2 {
            return Err(format!("the fewest local steps must be at least 2, not {min}"));
        }
        if !(min <= start && start <= max) {
            return Err(format!("local steps: need min ≤ start ≤ max, got {min} ≤ {start} ≤ {max}"));
        }
        if !(communication_fraction > 0.0 && communication_fraction <= 1.0) {
            return Err(format!(
                "the communication fraction must be in (0, 1], not {communication_fraction}"
            ));
        }
        Ok(Self { start, min, max, communication_fraction })
    }
}

/// What one push reports of its worker's pace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PaceReport {
    /// Local steps the push covers.
    pub steps: u64,
    /// Mean wall time of one of those steps, seconds.
    pub step_seconds: f64,
    /// Wall time of this worker's previous exchange, seconds; `None` before its first.
    pub exchange_seconds: Option<f64>,
}

/// Weight of a new measurement in the moving averages: about the last five exchanges count.
const SMOOTHING: f64 = 0.3;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct WorkerPace {
    step_seconds: Option<f64>,
    exchange_seconds: Option<f64>,
    /// When its last report arrived.
    reported_at: Option<Instant>,
}

fn smooth(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |o| o + SMOOTHING * (new - o))
}

/// Every worker's measured pace.
#[derive(Debug, Default)]
pub struct Pace {
    workers: BTreeMap<usize, WorkerPace>,
}

impl Pace {
    /// Records a report that arrived at `now`, its exchange bounded by the time since the
    /// worker's previous report: that exchange took place in between. A first report has
    /// nothing to bound it by and its exchange is not taken (the client times exchanges from
    /// its first push on; after a PS restart, the worker's second push brings it). Its step
    /// time needs no bound: it sets only the worker's own steps.
    pub fn record_at(&mut self, worker: usize, r: PaceReport, now: Instant) {
        let previous = self.workers.get(&worker).and_then(|p| p.reported_at);
        let exchange_seconds = match previous {
            Some(at) => r.exchange_seconds.map(|c| c.min(now.saturating_duration_since(at).as_secs_f64())),
            None => None,
        };
        let r = PaceReport { exchange_seconds, ..r };
        self.record(worker, r);
        self.workers.entry(worker).or_default().reported_at = Some(now);
    }

    pub fn record(&mut self, worker: usize, r: PaceReport) {
        let p = self.workers.entry(worker).or_default();
        if r.steps > 0 {
            p.step_seconds = Some(smooth(p.step_seconds, r.step_seconds));
        }
        if let Some(c) = r.exchange_seconds {
            p.exchange_seconds = Some(smooth(p.exchange_seconds, c));
        }
    }

    /// Forgets `worker` (it finished, or fell silent): its link no longer sets the others'
    /// rounds. Its next report, if any, starts afresh.
    pub fn forget(&mut self, worker: usize) {
        self.workers.remove(&worker);
    }

    /// Forgets the workers at `count` and above (the job was scaled down).
    pub fn retain_below(&mut self, count: usize) {
        self.workers.retain(|&w, _| w < count);
    }

    /// The round's duration R in seconds: the slowest link's exchange over the fraction.
    /// `None` until some worker's exchange was measured.
    pub fn round_seconds(&self, policy: &LocalStepsPolicy) -> Option<f64> {
        let slowest = self.workers.values().filter_map(|p| p.exchange_seconds).reduce(f64::max)?;
        Some(slowest / policy.communication_fraction)
    }

    /// The local steps `worker` should train before its next exchange.
    pub fn advise(&self, worker: usize, policy: &LocalStepsPolicy) -> u64 {
        let step = self.workers.get(&worker).and_then(|p| p.step_seconds).filter(|&s| s > 0.0);
        match (self.round_seconds(policy), step) {
            (Some(round), Some(step)) => {
                let h = (round / step).round();
                // f64 → u64 saturates; NaN (a zero round) becomes 0 and is clamped up.
                (h as u64).clamp(policy.min, policy.max)
            }
            // Not measured yet (or a step that takes no time): the job's starting H.
            _ => policy.start,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> LocalStepsPolicy {
        LocalStepsPolicy::new(20, 2, 500, 0.1).unwrap()
    }

    fn report(step_seconds: f64, exchange_seconds: f64) -> PaceReport {
        PaceReport { steps: 10, step_seconds, exchange_seconds: Some(exchange_seconds) }
    }

    #[test]
    fn an_unmeasured_worker_trains_the_starting_steps() {
        let mut pace = Pace::default();
        assert_eq!(pace.advise(0, &policy()), 20);
        // Its steps measured, but no exchange yet anywhere: no round to fill.
        pace.record(0, PaceReport { steps: 20, step_seconds: 0.01, exchange_seconds: None });
        assert_eq!(pace.advise(0, &policy()), 20);
    }

    #[test]
    fn the_round_keeps_exchanges_to_the_fraction() {
        let mut pace = Pace::default();
        // 10 ms steps, 50 ms exchanges, 10 %: a round of 0.5 s is 50 steps.
        pace.record(0, report(0.010, 0.050));
        assert_eq!(pace.advise(0, &policy()), 50);
        // A slower link (the same worker's next exchanges take longer) lengthens the round.
        for _ in 0..30 {
            pace.record(0, report(0.010, 0.200));
        }
        assert_eq!(pace.advise(0, &policy()), 200);
    }

    #[test]
    fn a_slower_worker_trains_fewer_steps_in_the_same_round() {
        let mut pace = Pace::default();
        pace.record(0, report(0.010, 0.050));
        pace.record(1, report(0.030, 0.050));
        let (fast, slow) = (pace.advise(0, &policy()), pace.advise(1, &policy()));
        assert_eq!((fast, slow), (50, 17));
        // The two rounds last the same.
        assert!((fast as f64 * 0.010 - slow as f64 * 0.030).abs() < 0.03);
    }

    #[test]
    fn the_slowest_link_sets_everyone_s_round() {
        let mut pace = Pace::default();
        pace.record(0, report(0.010, 0.050));
        pace.record(1, report(0.010, 0.100));
        assert_eq!(pace.advise(0, &policy()), 100);
        // Once it is scaled away, the others' rounds shrink back.
        pace.retain_below(1);
        assert_eq!(pace.advise(0, &policy()), 50);
        // So do those that finished or fell silent.
        pace.record(2, report(0.010, 0.300));
        assert_eq!(pace.advise(0, &policy()), 300);
        pace.forget(2);
        assert_eq!(pace.advise(0, &policy()), 50);
    }

    #[test]
    fn a_report_claims_no_more_time_than_passed_between_pushes() {
        use std::time::Duration;
        let (mut pace, t0) = (Pace::default(), Instant::now());
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        pace.record_at(0, report(0.010, 0.050), at(0));
        pace.record_at(0, report(0.010, 0.050), at(200));
        // An honest worker: 10 steps of 10 ms and a 50 ms exchange in 200 ms.
        assert_eq!(pace.advise(0, &policy()), 50);
        // Another claims exchanges of an hour: bounded by the 200 ms between its pushes, not
        // the job's largest H for everyone. Its first report (unbounded) carries no exchange.
        pace.record_at(1, report(0.010, 3600.0), at(0));
        assert_eq!(pace.advise(0, &policy()), 50, "a first report sets no round");
        pace.record_at(1, report(0.010, 3600.0), at(200));
        assert_eq!(pace.advise(0, &policy()), 200, "0.2 s over the 10 % fraction: 2 s, 200 steps of 10 ms");
    }

    #[test]
    fn advice_stays_in_the_bounds() {
        let mut pace = Pace::default();
        pace.record(0, report(1e-6, 10.0));
        pace.record(1, report(100.0, 10.0));
        assert_eq!(pace.advise(0, &policy()), 500);
        assert_eq!(pace.advise(1, &policy()), 2);
        // A step reported as taking no time is not divided by.
        pace.record(2, PaceReport { steps: 3, step_seconds: 0.0, exchange_seconds: Some(0.0) });
        assert_eq!(pace.advise(2, &policy()), 20);
    }

    #[test]
    fn one_slow_exchange_moves_the_advice_a_little() {
        let mut pace = Pace::default();
        for _ in 0..20 {
            pace.record(0, report(0.010, 0.050));
        }
        pace.record(0, report(0.010, 0.500));
        let h = pace.advise(0, &policy());
        assert!((50..=200).contains(&h), "{h}");
    }

    #[test]
    fn bad_policies_are_named() {
        assert!(LocalStepsPolicy::new(20, 1, 500, 0.1).unwrap_err().contains("at least 2"));
        assert!(LocalStepsPolicy::new(600, 2, 500, 0.1).unwrap_err().contains("min ≤ start ≤ max"));
        assert!(LocalStepsPolicy::new(20, 2, 500, 0.0).unwrap_err().contains("(0, 1]"));
        assert!(LocalStepsPolicy::new(20, 2, 500, f64::NAN).unwrap_err().contains("(0, 1]"));
    }
}
