//! A straggler for experiments (`--slowdown F`): a device F times slower than this one. After
//! each step the worker sleeps (F − 1) times the *mean* of its last steps' own work, not this
//! step's alone: over a run the same time as stretching each step (as the DDP comparison's hook
//! does), but a moment's stall of the host (a context switch, a page fault) is spread over the
//! window instead of multiplied by F in one step. At F = 100 (the conformance matrix's long-block
//! case) a 30 ms stall would make one step of about 3 s, the PS's silence timeout there.

use std::collections::VecDeque;
use std::time::Duration;

/// Steps whose mean sets the device's pace.
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
        let mean = self.recent.iter().sum::<Duration>() / self.recent.len() as u32;
        mean.mul_f64(self.factor - 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_spread_over_the_window_and_a_slower_pace_is_followed() {
        assert!(Slowdown::new(1.0).is_none());
        let mut s = Slowdown::new(100.0).unwrap();
        let ms = Duration::from_millis;
        for _ in 0..WINDOW {
            assert_eq!(s.extra(ms(7)), ms(693));
        }
        // One 37 ms step among 7 ms ones: 2 ms more on average, not 30.
        assert_eq!(s.extra(ms(37)), ms(891));
        for _ in 0..WINDOW {
            s.extra(ms(10));
        }
        assert_eq!(s.extra(ms(10)), ms(990), "the pace itself changed");
    }
}
