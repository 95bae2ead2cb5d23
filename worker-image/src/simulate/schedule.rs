//! Delay models: which model version each gradient is computed on, and which virtual worker
//! computes it. Pure and seeded, so a plan is the same on every run.
//!
//! Update `s` (the s-th gradient the parameter server applies, from 0) applies a gradient
//! computed on version `s − τ_s`; τ_s comes from the delay model (capped at `s`: nothing older
//! than version 0 exists). A virtual worker ("slot") is busy from its pull to its push, so the
//! number of slots is the number of gradients in flight at once, and each slot's w_bak is the
//! version it pulled — exactly what the store records for a real worker.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How stale each gradient is when the parameter server applies it.
#[derive(Clone, Debug, PartialEq)]
pub enum Delay {
    /// M workers with equal compute times take turns (the paper's setting): τ = M − 1 for every
    /// gradient after the first M, which were all computed on the initial model.
    RoundRobin { workers: usize },
    /// τ drawn uniformly from 0..=max for each gradient.
    Uniform { max: u64 },
    /// τ drawn from a geometric distribution on 0, 1, 2, ... with the given mean (a long tail:
    /// most gradients fresh, a few very stale).
    Geometric { mean: f64 },
    /// τ drawn from the (τ, count) pairs a parameter server recorded in a real run.
    Trace { counts: Vec<(u64, u64)> },
    /// M workers, the last `factor` times slower than the others: each pushes when its step
    /// ends and pulls the then-current model at once, so τ follows from the timing (the fast
    /// workers' gradients are about M − 1 versions stale, the straggler's about factor × that).
    Straggler { workers: usize, factor: f64 },
}

impl Delay {
    /// A name for tables: `round-robin:8`, `uniform:15`, `geometric:3.5`, `trace`.
    pub fn label(&self) -> String {
        match self {
            Self::RoundRobin { workers } => format!("round-robin:{workers}"),
            Self::Uniform { max } => format!("uniform:{max}"),
            Self::Geometric { mean } => format!("geometric:{mean}"),
            Self::Trace { .. } => "trace".to_string(),
            Self::Straggler { workers, factor } => format!("straggler:{workers}:{factor}"),
        }
    }

    /// Checks the parameters; the message names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Self::RoundRobin { workers } if *workers == 0 || *workers > 4096 => {
                Err(format!("round-robin needs 1..=4096 workers, got {workers}"))
            }
            Self::Uniform { max } if *max > 4096 => {
                Err(format!("uniform delay max must be ≤ 4096, got {max}"))
            }
            Self::Geometric { mean } if !(mean.is_finite() && (0.0..=1024.0).contains(mean)) => {
                Err(format!("geometric delay mean must be in [0, 1024], got {mean}"))
            }
            Self::Trace { counts } if counts.iter().all(|&(_, c)| c == 0) => {
                Err("the staleness trace records no gradients".to_string())
            }
            Self::Trace { counts } if counts.iter().any(|&(t, _)| t > 4096) => {
                Err("the staleness trace holds a τ above 4096".to_string())
            }
            Self::Straggler { workers, factor }
                if *workers < 2 || *workers > 4096 || !(1.0..=1000.0).contains(factor) =>
            {
                Err(format!(
                    "straggler needs 2..=4096 workers and a factor in [1, 1000], got {workers} and {factor}"
                ))
            }
            _ => Ok(()),
        }
    }

    fn draw(&self, rng: &mut StdRng) -> u64 {
        match self {
            // Timings (`Plan::timed`): nothing is drawn.
            Self::RoundRobin { workers } | Self::Straggler { workers, .. } => *workers as u64 - 1,
            Self::Uniform { max } => rng.random_range(0..=*max),
            Self::Geometric { mean } => {
                // P(τ = k) = (1 − p)^k·p with p = 1/(1 + mean): inverse-CDF sampling.
                let p = 1.0 / (1.0 + mean);
                if p >= 1.0 {
                    return 0;
                }
                let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
                (u.ln() / (1.0 - p).ln()).floor() as u64
            }
            Self::Trace { counts } => {
                let total: u64 = counts.iter().map(|&(_, c)| c).sum();
                let mut pick = rng.random_range(0..total);
                for &(tau, c) in counts {
                    if pick < c {
                        return tau;
                    }
                    pick -= c;
                }
                unreachable!("pick < total")
            }
        }
    }
}

/// One update of the plan: the version its gradient is computed on, and by which slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    pub pull_at: u64,
    pub slot: usize,
}

/// Time in a timed plan: a thousandth of a step of a worker at full speed (integers, so that
/// the order of events is exact).
pub const TICKS_PER_STEP: u64 = 1000;

/// `updates` planned updates and the number of slots they need.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub steps: Vec<Planned>,
    pub slots: usize,
    /// When each update is applied, in ticks, for the delay models that are timings (workers
    /// taking turns, a straggler); drawn delays have no clock.
    pub ends: Option<Vec<u64>>,
}

impl Plan {
    pub fn new(delay: &Delay, updates: u64, seed: u64) -> Plan {
        match delay {
            Delay::Straggler { workers, factor } => return Plan::timed(*workers, *factor, updates),
            // Equal workers taking turns are the timing without a straggler: the same steps as
            // drawing τ = M − 1 (a test says so), with a clock.
            Delay::RoundRobin { workers } => return Plan::timed(*workers, 1.0, updates),
            _ => {}
        }
        let mut rng = StdRng::seed_from_u64(seed ^ 0xde1a_75ce);
        let pull_at: Vec<u64> = (0..updates).map(|s| s - delay.draw(&mut rng).min(s)).collect();
        // Steps in the order they pull (by version, then by step); a slot freed by update v can
        // pull again from version v + 1 on.
        let mut by_pull: Vec<u64> = (0..updates).collect();
        by_pull.sort_by_key(|&s| (pull_at[s as usize], s));
        let mut slot_of = vec![usize::MAX; updates as usize];
        let mut free: BinaryHeap<Reverse<usize>> = BinaryHeap::new();
        let mut slots = 0;
        let mut next = by_pull.iter().peekable();
        for v in 0..updates {
            while let Some(&&s) = next.peek().filter(|&&&s| pull_at[s as usize] == v) {
                next.next();
                slot_of[s as usize] = free.pop().map(|Reverse(k)| k).unwrap_or_else(|| {
                    slots += 1;
                    slots - 1
                });
            }
            free.push(Reverse(slot_of[v as usize]));
        }
        let steps =
            pull_at.into_iter().zip(slot_of).map(|(pull_at, slot)| Planned { pull_at, slot }).collect();
        Plan { steps, slots, ends: None }
    }

    /// M workers whose steps take 1 time unit, the last `factor`: the pushes in the order their
    /// steps end (a tie by worker index), each computed on the version its worker pulled when
    /// its previous step ended.
    fn timed(workers: usize, factor: f64, updates: u64) -> Plan {
        let tick = |w: usize| if w + 1 == workers { step_ticks(factor) } else { TICKS_PER_STEP };
        let mut next: BinaryHeap<Reverse<(u64, usize)>> =
            (0..workers).map(|w| Reverse((tick(w), w))).collect();
        let mut pulled = vec![0; workers];
        let mut steps = Vec::with_capacity(updates as usize);
        let mut ends = Vec::with_capacity(updates as usize);
        for v in 0..updates {
            let Reverse((at, w)) = next.pop().expect("every worker is always in the heap");
            steps.push(Planned { pull_at: pulled[w], slot: w });
            ends.push(at);
            pulled[w] = v + 1;
            next.push(Reverse((at + tick(w), w)));
        }
        Plan { steps, slots: workers, ends: Some(ends) }
    }
}

/// How long a step takes a worker `factor` times slower than full speed, in ticks.
pub fn step_ticks(factor: f64) -> u64 {
    (factor * TICKS_PER_STEP as f64).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slot is busy from its pull to its push and never holds two gradients at once.
    fn assert_consistent(plan: &Plan) {
        let mut busy_until: Vec<Option<u64>> = vec![None; plan.slots];
        let mut order: Vec<(u64, u64)> =
            plan.steps.iter().enumerate().map(|(s, p)| (p.pull_at, s as u64)).collect();
        order.sort();
        for (pull_at, s) in order {
            let slot = plan.steps[s as usize].slot;
            assert!(pull_at <= s);
            if let Some(until) = busy_until[slot] {
                assert!(until < pull_at, "slot {slot} pulls at {pull_at} while busy until {until}");
            }
            busy_until[slot] = Some(s);
        }
    }

    #[test]
    fn round_robin_is_tau_m_minus_1_on_m_slots() {
        let plan = Plan::new(&Delay::RoundRobin { workers: 4 }, 40, 1);
        assert_eq!(plan.slots, 4);
        assert_consistent(&plan);
        for (s, p) in plan.steps.iter().enumerate() {
            assert_eq!(s as u64 - p.pull_at, (s as u64).min(3));
            assert_eq!(p.slot, s % 4, "the workers take turns");
        }
    }

    #[test]
    fn random_delays_are_seeded_and_stay_consistent() {
        for delay in [
            Delay::Uniform { max: 7 },
            Delay::Geometric { mean: 3.0 },
            Delay::Trace { counts: vec![(0, 5), (2, 10), (9, 1)] },
        ] {
            let a = Plan::new(&delay, 500, 7);
            assert_eq!(a, Plan::new(&delay, 500, 7));
            assert_ne!(a, Plan::new(&delay, 500, 8));
            assert_consistent(&a);
            let taus: Vec<u64> = a.steps.iter().enumerate().map(|(s, p)| s as u64 - p.pull_at).collect();
            let mean = taus[20..].iter().sum::<u64>() as f64 / 480.0;
            match &delay {
                Delay::Uniform { .. } => assert!((mean - 3.5).abs() < 0.5, "{mean}"),
                Delay::Geometric { .. } => assert!((mean - 3.0).abs() < 0.6, "{mean}"),
                _ => assert!(taus[20..].iter().all(|t| [0, 2, 9].contains(t))),
            }
        }
    }

    /// Round-robin is timed; its steps are the ones drawing τ = M − 1 gave (so the simulator's
    /// earlier tables stand), and M updates end each step.
    #[test]
    fn round_robins_timing_is_drawing_m_minus_1() {
        let timed = Plan::new(&Delay::RoundRobin { workers: 4 }, 40, 1);
        let drawn: Vec<Planned> =
            (0..40u64).map(|s| Planned { pull_at: s.saturating_sub(3), slot: s as usize % 4 }).collect();
        assert_eq!((timed.steps, timed.slots), (drawn, 4));
        let ends = timed.ends.unwrap();
        assert_eq!((ends[0], ends[3], ends[4], ends[39]), (1000, 1000, 2000, 10_000));
    }

    #[test]
    fn a_straggler_pushes_factor_times_less_often_and_staler() {
        let plan = Plan::new(&Delay::Straggler { workers: 4, factor: 3.0 }, 1000, 1);
        assert_eq!(plan.slots, 4);
        assert_consistent(&plan);
        let of = |slot: usize| plan.steps.iter().enumerate().filter(move |(_, p)| p.slot == slot);
        let count = |slot: usize| of(slot).count();
        // In 3 time units the fast workers push 3 times each, the straggler once: 10 pushes.
        assert_eq!((count(0), count(3)), (300, 100));
        let tau = |slot: usize| of(slot).skip(2).map(|(s, p)| s as u64 - p.pull_at).max().unwrap();
        assert_eq!(
            (tau(0), tau(3)),
            (3, 9),
            "fast: τ = M − 1 plus the straggler's pushes; straggler: 3 rounds"
        );
        assert_eq!(
            plan,
            Plan::new(&Delay::Straggler { workers: 4, factor: 3.0 }, 1000, 2),
            "timing, not seed"
        );
    }

    #[test]
    fn bad_parameters_are_named() {
        assert!(Delay::Straggler { workers: 1, factor: 3.0 }.validate().unwrap_err().contains("straggler"));
        assert!(Delay::Straggler { workers: 4, factor: 0.5 }.validate().is_err());
        assert!(Delay::RoundRobin { workers: 0 }.validate().unwrap_err().contains("workers"));
        assert!(Delay::Geometric { mean: f64::NAN }.validate().is_err());
        assert!(Delay::Trace { counts: vec![(1, 0)] }.validate().unwrap_err().contains("no gradients"));
    }
}
