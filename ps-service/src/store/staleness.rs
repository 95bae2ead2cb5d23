//! Exact staleness counts, for the quantiles `/v1/status` and the operator report.

use serde::Serialize;

/// τ values up to this are counted exactly; larger ones share the last slot.
const EXACT: usize = 4096;

#[derive(Clone, Debug)]
pub struct StalenessCounts {
    counts: Vec<u64>,
    total: u64,
    sum: u64,
    max: u64,
}

impl Default for StalenessCounts {
    fn default() -> Self {
        Self { counts: vec![0; EXACT + 1], total: 0, sum: 0, max: 0 }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StalenessSummary {
    pub count: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
    /// Fraction of gradients applied with τ = 0.
    pub zero_fraction: f64,
    /// Fraction at exactly `maxStaleness` (0 when there is no bound).
    pub bound_fraction: f64,
    /// (τ, gradients applied with that τ) for every τ seen, ascending; τ above 4096 are counted
    /// at 4096. `foresight-worker simulate --delays trace:FILE` replays this distribution.
    pub counts: Vec<(u64, u64)>,
}

impl StalenessCounts {
    pub fn record(&mut self, tau: u64) {
        self.counts[(tau as usize).min(EXACT)] += 1;
        self.total += 1;
        self.sum += tau;
        self.max = self.max.max(tau);
    }

    /// Smallest τ such that at least `q` of the gradients had τ at most that.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (tau, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return if tau == EXACT { self.max } else { tau as u64 };
            }
        }
        self.max
    }

    pub fn summary(&self, bound: Option<u64>) -> StalenessSummary {
        let frac = |c: u64| if self.total == 0 { 0.0 } else { c as f64 / self.total as f64 };
        let at = |tau: u64| self.counts[(tau as usize).min(EXACT)];
        StalenessSummary {
            count: self.total,
            mean: if self.total == 0 { 0.0 } else { self.sum as f64 / self.total as f64 },
            p50: self.quantile(0.5),
            p90: self.quantile(0.9),
            p99: self.quantile(0.99),
            max: self.max,
            zero_fraction: frac(at(0)),
            bound_fraction: bound.map_or(0.0, |b| frac(at(b))),
            counts: (self.counts.iter().enumerate())
                .filter(|&(_, &c)| c > 0)
                .map(|(tau, &c)| (tau as u64, c))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_known_distribution() {
        let mut c = StalenessCounts::default();
        for tau in 0..100 {
            c.record(tau);
        }
        assert_eq!(c.quantile(0.5), 49);
        assert_eq!(c.quantile(0.99), 98);
        assert_eq!(c.quantile(1.0), 99);
        let s = c.summary(Some(10));
        assert_eq!((s.count, s.max), (100, 99));
        assert!((s.zero_fraction - 0.01).abs() < 1e-12);
        assert!((s.bound_fraction - 0.01).abs() < 1e-12);
        assert!((s.mean - 49.5).abs() < 1e-12);
        assert_eq!(s.counts.len(), 100);
        assert_eq!(s.counts[7], (7, 1));
        c.record(7);
        assert_eq!(c.summary(None).counts[7], (7, 2));
    }

    #[test]
    fn huge_staleness_reports_the_max() {
        let mut c = StalenessCounts::default();
        c.record(1_000_000);
        assert_eq!(c.quantile(0.5), 1_000_000);
        assert_eq!(StalenessCounts::default().quantile(0.5), 0);
    }
}
