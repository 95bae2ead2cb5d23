//! A straggler for experiments (`--slowdown F`): a device F times slower than this one. After
//! each step the worker sleeps (F − 1) times the step's own work, capped at twice the device's
//! pace: a moment's stall of the host (a context switch, a page fault) is not the device's pace,
//! and multiplied by F it made one step as long as F stalls. At F = 100 (the conformance
//! matrix's long-block case) a 30 ms stall would make a step of about 3 s, the PS's silence
//! timeout there. Otherwise each step is stretched as it is (as the DDP comparison's hook
//! stretches its own); the first step, whose work is the pace, included.
//!
//! The pace is the lower quartile of the last `WINDOW` steps' work, and until that many have
//! been seen the fastest so far. Stalls only ever make a step slower, and a cold start
//! (libtorch's first calls, pages faulted in) makes several of the first steps slow at once: a
//! median of the first few could be a cold step itself, and twice that, times F, a step longer
//! than the timeout right after the worker's first push.

use std::collections::VecDeque;
use std::time::Duration;

/// Steps whose work sets the device's pace.
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
        let pace = if sorted.len() < WINDOW { sorted[0] } else { sorted[WINDOW / 4] };
        work.min(2 * pace).mul_f64(self.factor - 1.0)
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
        assert_eq!(s.extra(ms(40)), ms(3960), "up to twice the fastest so far");
        for _ in 0..7 {
            s.extra(ms(40));
        }
        assert_eq!(s.extra(ms(7)), ms(693), "a step at the pace");
        assert_eq!(s.extra(ms(30)), ms(1386), "a cold step among many: twice the fastest");
        for _ in 0..WINDOW {
            s.extra(ms(7));
        }
        assert_eq!(s.extra(ms(9)), ms(891), "a step as it is");
        assert_eq!(s.extra(ms(40)), ms(1386), "a stall: twice the pace");
        for _ in 0..WINDOW {
            s.extra(ms(20));
        }
        assert_eq!(s.extra(ms(20)), ms(1980), "the pace itself changed");
        for _ in 0..8 {
            s.extra(ms(60));
        }
        assert_eq!(s.extra(ms(60)), ms(3960), "still twice the pace while most of the window stalls");
    }
}
