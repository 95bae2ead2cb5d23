//! Which training examples a worker trains on and how many steps an epoch has: one rule for the
//! Rust worker and the Python package, so that a job mixing both splits its data the same way.

use rand::SeedableRng;
use rand::seq::SliceRandom;

/// (training, held-out) indices of `n` examples with `holdout` of them held out (rounded, at
/// least one each way): a shuffle seeded by `seed`, since exported datasets are often sorted by
/// class. For datasets without a test split of their own (CSV).
pub fn holdout(n: usize, holdout: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut idx: Vec<usize> = (0..n).collect();
    idx.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let n_test = ((n as f64 * holdout).round() as usize).clamp(1, n.saturating_sub(1).max(1));
    let train = idx.split_off(n_test.min(n));
    (train, idx)
}

/// Worker `index`'s shard of `n` examples: every `count`-th example after a shuffle seeded by
/// the job's `seed`, the same on every worker, so the shards are disjoint and cover all `n`.
pub fn indices(n: usize, index: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    idx.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed));
    idx.into_iter().skip(index).step_by(count.max(1)).collect()
}

/// Examples each worker trains on per epoch: the smallest shard's size, so that every worker
/// takes the same number of steps and `sync` rounds always find all of them (the few extra
/// examples of larger shards are visited in other epochs).
pub fn per_worker(n: usize, count: usize) -> usize {
    n / count.max(1)
}

/// Steps per epoch of every worker, with batches of `batch` (the last one may be short).
pub fn steps_per_epoch(n: usize, count: usize, batch: usize) -> u64 {
    per_worker(n, count).div_ceil(batch.max(1)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_cover_everything_and_depend_only_on_the_seed() {
        let all: Vec<Vec<usize>> = (0..3).map(|i| indices(10, i, 3, 7)).collect();
        assert_eq!(all.iter().map(Vec::len).collect::<Vec<_>>(), [4, 3, 3]);
        let mut seen: Vec<usize> = all.concat();
        seen.sort_unstable();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        assert_eq!(indices(10, 1, 3, 7), all[1]);
        assert_ne!(indices(10, 1, 3, 8), all[1]);
        assert_eq!(steps_per_epoch(10, 3, 2), 2);
        assert_eq!(steps_per_epoch(5000 * 4 / 5, 4, 64), 16);
        let (train, test) = holdout(10, 0.2, 1);
        assert_eq!((train.len(), test.len()), (8, 2));
        assert_eq!(holdout(10, 0.2, 1), (train, test));
    }
}
