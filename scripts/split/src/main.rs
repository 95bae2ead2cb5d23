//! `foresight-split N HOLDOUT SEED WORKERS`: prints one JSON object with the held-out indices
//! and each worker's shard (indices into the CSV's lines), drawn exactly as
//! `Dataset::load` and `Dataset::shard` in worker-image/src/data/mod.rs draw them.

use rand::SeedableRng;
use rand::seq::SliceRandom;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() != 4 {
        eprintln!("usage: foresight-split N HOLDOUT SEED WORKERS");
        std::process::exit(2);
    }
    let n: usize = a[0].parse().expect("N");
    let holdout: f64 = a[1].parse().expect("HOLDOUT");
    let seed: u64 = a[2].parse().expect("SEED");
    let workers: usize = a[3].parse().expect("WORKERS");
    // Dataset::load (CSV)
    let mut idx: Vec<usize> = (0..n).collect();
    idx.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let n_test = ((n as f64 * holdout).round() as usize).clamp(1, n - 1);
    let (test, train) = idx.split_at(n_test);
    // Dataset::shard: positions in the training set, mapped back to CSV lines
    let mut pos: Vec<usize> = (0..train.len()).collect();
    pos.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed));
    let shards: Vec<Vec<usize>> = (0..workers)
        .map(|w| pos.iter().skip(w).step_by(workers.max(1)).map(|&p| train[p]).collect())
        .collect();
    let list = |v: &[usize]| v.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let shards: Vec<String> = shards.iter().map(|s| format!("[{}]", list(s))).collect();
    println!("{{\"test\":[{}],\"train\":[{}],\"shards\":[{}]}}", list(test), list(train), shards.join(","));
}
