//! Where a worker's time goes. The training loop marks the end of each phase; the time since the
//! previous mark goes to the phase that just ended, both into totals (the `done` line's
//! `phases`, which `foresight run` keeps in `summary.json`) and into
//! `foresight_worker_phase_seconds_total{phase}`. Every interval of the loop belongs to one
//! phase, so the totals add up to the training's wall time.

use std::time::{Duration, Instant};

use foresight_ps::wire::progress::PhaseSeconds;
use prometheus::Counter;

use crate::metrics::WorkerMetrics;

/// One part of a training step (see [`PhaseSeconds`] for what each holds). Declared in
/// [`Phase::ALL`]'s order, so that `phase as usize` is its counter's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Batch,
    Pull,
    Load,
    Compute,
    Gather,
    Push,
    Report,
    Evaluate,
    Slowdown,
}

impl Phase {
    pub const ALL: [Phase; 9] = [
        Phase::Batch,
        Phase::Pull,
        Phase::Load,
        Phase::Compute,
        Phase::Gather,
        Phase::Push,
        Phase::Report,
        Phase::Evaluate,
        Phase::Slowdown,
    ];

    /// The `phase` label's value.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Batch => "batch",
            Phase::Pull => "pull",
            Phase::Load => "load",
            Phase::Compute => "compute",
            Phase::Gather => "gather",
            Phase::Push => "push",
            Phase::Report => "report",
            Phase::Evaluate => "evaluate",
            Phase::Slowdown => "slowdown",
        }
    }

    fn total(self, t: &mut PhaseSeconds) -> &mut f64 {
        match self {
            Phase::Batch => &mut t.batch,
            Phase::Pull => &mut t.pull,
            Phase::Load => &mut t.load,
            Phase::Compute => &mut t.compute,
            Phase::Gather => &mut t.gather,
            Phase::Push => &mut t.push,
            Phase::Report => &mut t.report,
            Phase::Evaluate => &mut t.evaluate,
            Phase::Slowdown => &mut t.slowdown,
        }
    }
}

pub struct PhaseClock {
    totals: PhaseSeconds,
    mark: Instant,
    /// The counter of each phase, indexed by `phase as usize` (looked up once, not per step).
    counters: Vec<Counter>,
}

impl PhaseClock {
    /// Starts the clock now; the first interval goes to whichever phase ends first.
    pub fn start(metrics: &WorkerMetrics) -> Self {
        let counters =
            Phase::ALL.iter().map(|p| metrics.phase_seconds.with_label_values(&[p.name()])).collect();
        Self { totals: PhaseSeconds::default(), mark: Instant::now(), counters }
    }

    /// Ends `phase` now; returns the time it took since the last mark.
    pub fn end(&mut self, phase: Phase) -> Duration {
        let now = Instant::now();
        let took = now - self.mark;
        self.mark = now;
        *phase.total(&mut self.totals) += took.as_secs_f64();
        self.counters[phase as usize].inc_by(took.as_secs_f64());
        took
    }

    pub fn totals(&self) -> PhaseSeconds {
        self.totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_interval_goes_to_the_phase_that_ended_and_the_totals_add_up() {
        let metrics = WorkerMetrics::new("job", "ns", 0);
        let began = Instant::now();
        let mut clock = PhaseClock::start(&metrics);
        std::thread::sleep(Duration::from_millis(20));
        let pull = clock.end(Phase::Pull);
        std::thread::sleep(Duration::from_millis(5));
        clock.end(Phase::Compute);
        std::thread::sleep(Duration::from_millis(5));
        clock.end(Phase::Compute);
        let wall = began.elapsed().as_secs_f64();
        let t = clock.totals();
        assert!(pull >= Duration::from_millis(20) && t.pull == pull.as_secs_f64());
        assert!(t.compute >= 0.010, "both compute intervals count: {t:?}");
        assert_eq!((t.push, t.batch, t.evaluate), (0.0, 0.0, 0.0));
        let sum =
            t.batch + t.pull + t.load + t.compute + t.gather + t.push + t.report + t.evaluate + t.slowdown;
        assert!(sum <= wall && wall - sum < 0.005, "the phases cover the wall time: {sum} of {wall}");
        let text = metrics.encode();
        let line = text.lines().find(|l| {
            l.starts_with("foresight_worker_phase_seconds_total") && l.contains("phase=\"compute\"")
        });
        let value: f64 = line.expect("a compute series").rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(value, t.compute);
        assert!(text.contains("phase=\"slowdown\""), "every phase's series exists from the start");
        assert!(Phase::ALL.iter().enumerate().all(|(i, &p)| p as usize == i), "ALL is in declaration order");
    }
}
