//! What the update journal costs per update (`cargo bench -p foresight-ps --bench journal`).
//!
//! For a LeNet-5-sized model (61,706 parameters) and a 1M one, the same stream of asgd pushes
//! (the cheapest rule, so the journal's share is the largest) goes into three stores: no journal,
//! the journal on (one JSON line per update, the default), and capture (every gradient written
//! too). The three are timed round-robin, rotating the order each round, and the medians of the
//! per-round times are printed with the difference to no journal, in µs per update: the ratios
//! are immune to the machine's drift. Without `--bench` (`cargo test --benches`) one short round.

use std::time::Instant;

use foresight_ps::journal::{Mode, Writer};
use foresight_ps::optimizer::{Algorithm, Hyper};
use foresight_ps::store::{Push, Store};
use foresight_ps::wire::{Layout, TensorSpec};

const MODES: [Mode; 3] = [Mode::Off, Mode::On, Mode::Capture];

struct Journaled {
    store: Store,
    seq: u64,
    /// Kept for the store's sink; the directory goes with it.
    _writer: Option<Writer>,
    _dir: tempfile::TempDir,
}

impl Journaled {
    fn new(n: usize, mode: Mode) -> Self {
        let layout = Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![n] }]).unwrap();
        let mut store = Store::new(layout, vec![0.5; n], Hyper::new(Algorithm::Asgd, 1e-4), 1);
        let dir = tempfile::tempdir().unwrap();
        let writer = Writer::open(dir.path(), 0, mode, u64::MAX).unwrap();
        if let Some(w) = &writer {
            w.begin(&store, foresight_ps::store::journal::Start::Registered).unwrap();
            store.set_journal(w.sink());
        }
        Self { store, seq: 0, _writer: writer, _dir: dir }
    }

    /// Seconds per push over `k` pushes, the journal synced at the end (so its writes count).
    fn time(&mut self, grad: &[f32], k: u64) -> f64 {
        let t = Instant::now();
        for _ in 0..k {
            self.seq += 1;
            let p = Push {
                worker: 0,
                generation: None,
                version: self.store.version(),
                seq: self.seq,
                epoch: None,
                body: None,
            };
            self.store.push(p, grad).unwrap();
        }
        if let Some(w) = &self._writer {
            w.sync().unwrap();
        }
        t.elapsed().as_secs_f64() / k as f64
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (rounds, k) = if bench { (21, 200) } else { (1, 5) };
    for n in [61_706usize, 1_000_000] {
        let grad: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) * 1e-3).collect();
        let mut stores: Vec<Journaled> = MODES.iter().map(|&m| Journaled::new(n, m)).collect();
        let mut times = vec![Vec::new(); MODES.len()];
        for r in 0..rounds {
            for j in 0..MODES.len() {
                let i = (r + j) % MODES.len();
                times[i].push(stores[i].time(&grad, k));
            }
        }
        let med: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
        println!("journal/{n} parameters, {rounds} rounds of {k} asgd pushes (median s/push):");
        for (i, mode) in MODES.iter().enumerate() {
            let extra = (med[i] - med[0]) * 1e6;
            println!(
                "  {mode:?}: {:.1} µs/update, {extra:+.1} µs against no journal ({:.3}×)",
                med[i] * 1e6,
                med[i] / med[0]
            );
        }
    }
}
