//! A straggler for experiments (`--slowdown F`): a device F times slower than this one. After
//! each step the worker sleeps (F − 1) times the step's own work, capped at twice the median of
//! the last steps' work: a moment's stall of the host (a context switch, a page fault) is not
//! the device's pace, and multiplied by F it made one step as long as F stalls. At F = 100 (the
//! conformance matrix's long-block case) a 30 ms stall would make a step of about 3 s, the PS's
//! silence timeout there. Otherwise each step is stretched as before (and as the DDP
//! comparison's hook stretches its own); the first step, whose work is the median, included.

use std::collections::VecDeque;
use std::time::Duration;

/// Steps whose median sets the device's pace.
const WINDOW: usize = 15;

pub struct Slowdown {
    factor: f64,
    recent: VecDeque<Duration>,
}

impl Slowdown {
    /// `None` at full speed (a factor of 1).
    pub fn new(factor: f64) -> Option<Self> {
        (factor > 1.0).then(|| Self { factor, recent: VecDeque::with_capacity(WINDOW) })
    }

    /// How much longer than `work` (the step's own work) the slower device takes for the step.
    pub fn extra(&mut self, work: Duration) -> Duration {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(work);
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        work.min(2 * sorted[sorted.len() / 2]).mul_f64(self.factor - 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_is_stretched_but_a_stall_only_up_to_twice_the_pace() {
        assert!(Slowdown::new(1.0).is_none());
        let mut s = Slowdown::new(100.0).unwrap();
        let ms = Duration::from_millis;
        assert_eq!(s.extra(ms(50)), ms(4950), "the first step, as it is");
        for _ in 0..WINDOW {
            s.extra(ms(7));
        }
        assert_eq!(s.extra(ms(9)), ms(891), "a step as it is");
        assert_eq!(s.extra(ms(40)), ms(1386), "a stall: twice the median");
        for _ in 0..WINDOW {
            s.extra(ms(20));
        }
        assert_eq!(s.extra(ms(20)), ms(1980), "the pace itself changed");
    }
}
