//! How long to wait before reconciling a job again after a failed reconcile: per job,
//! exponential (with jitter) from 2 s up to 5 min, and back to the start after a success. A
//! fixed delay retried a quota refusal or an RBAC denial every few seconds forever, each retry
//! a burst of API calls; one job's failures never slow another's retries.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

pub const FIRST_RETRY: Duration = Duration::from_secs(2);
pub const LONGEST_RETRY: Duration = Duration::from_secs(300);

/// The retry schedules of the jobs whose last reconcile failed, by UID.
#[derive(Default)]
pub struct Backoffs(Mutex<HashMap<String, ExponentialBackoff>>);

impl Backoffs {
    /// The delay before the next retry of this job, one step longer than the last.
    pub fn next(&self, uid: &str) -> Duration {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let schedule = map.entry(uid.to_string()).or_insert_with(|| {
            ExponentialBuilder::default()
                .with_min_delay(FIRST_RETRY)
                .with_max_delay(LONGEST_RETRY)
                .with_factor(2.0)
                .with_jitter()
                .without_max_times()
                .build()
        });
        schedule.next().unwrap_or(LONGEST_RETRY)
    }

    /// The job reconciled: its next failure starts the schedule again.
    pub fn reset(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }

    /// Drops the schedules of jobs not in `live` (UIDs): a job deleted while its reconciles
    /// failed is never reconciled again to reset its own.
    pub fn retain(&self, live: &HashSet<&str>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).retain(|uid, _| live.contains(uid.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_per_job_up_to_the_cap_and_restart_after_a_success() {
        let b = Backoffs::default();
        let first: Vec<Duration> = (0..10).map(|_| b.next("a")).collect();
        // Jitter adds up to one more delay: step n lies in [2^n · 2 s, 2^(n+1) · 2 s], capped.
        for (n, d) in first.iter().enumerate().take(5) {
            let base = FIRST_RETRY * 2u32.pow(n as u32);
            assert!(*d >= base && *d <= base * 2, "step {n}: {d:?}");
        }
        assert!(first[9] >= LONGEST_RETRY && first[9] <= LONGEST_RETRY * 2, "{:?}", first[9]);
        assert!(b.next("b") <= FIRST_RETRY * 2, "another job starts at the beginning");
        b.reset("a");
        assert!(b.next("a") <= FIRST_RETRY * 2, "a success starts it again");
        b.next("b");
        b.retain(&HashSet::from(["a"]));
        assert!(b.next("b") <= FIRST_RETRY * 2, "a job gone is forgotten");
        assert!(b.next("a") >= FIRST_RETRY * 2, "a live one keeps its schedule");
    }
}
