//! The `simulate` subcommand's flags, the sweep over their combinations, and the delay models'
//! textual form.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use foresight_ps::client::{GradDtype, PullDtype};
use foresight_ps::optimizer::{Algorithm, Hyper, LrSchedule};

use super::local::LocalSteps;
use super::schedule::Delay;
use super::{Outcome, SimConfig, SimData, simulate};
use crate::data;
use crate::inner::InnerAlgorithm;

/// Deterministic asynchrony: M virtual workers in one process against the parameter server's
/// store and update rules, with the staleness set by a delay model. Prints one JSON line per run
/// (every combination of --algorithms, --delays and --seeds); the same flags give bit-identical
/// models (the `digest` field).
#[derive(Parser, Debug)]
#[command(name = "foresight-worker simulate", version)]
pub struct SimulateArgs {
    /// Dataset format: mnist, cifar10 or csv.
    #[arg(long, default_value = "csv", value_parser = |s: &str| s.parse::<data::Format>())]
    dataset_format: data::Format,
    /// Directory holding the dataset.
    #[arg(long, default_value = "data/mnist5k")]
    dataset_path: PathBuf,
    /// Fraction held out, for formats without a test split (csv).
    #[arg(long, default_value_t = 0.2)]
    holdout: f64,
    /// Update rules, comma-separated: sync, asgd, dc-asgd-c, dc-asgd-a.
    #[arg(long, value_delimiter = ',', default_value = "asgd,dc-asgd-c,dc-asgd-a")]
    algorithms: Vec<Algorithm>,
    /// Delay models, comma-separated: round-robin:M (M workers taking turns, τ = M−1; the only
    /// one sync takes), uniform:MAX, geometric:MEAN, trace:FILE (the `staleness.counts` of a
    /// `foresight run` summary.json or of the PS's /v1/status), straggler:M:F (M workers, the
    /// last F times slower; τ from the timing).
    #[arg(long, value_delimiter = ',', default_value = "round-robin:8")]
    delays: Vec<String>,
    /// Seeds, comma-separated: each draws the initial model, the batches and the delays.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    seeds: Vec<u64>,
    #[arg(long, default_value_t = 10.0)]
    epochs: f64,
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Hidden units of the network (0: softmax regression).
    #[arg(long, default_value_t = 64)]
    hidden: usize,
    #[arg(long, default_value_t = 0.1)]
    learning_rate: f32,
    /// Epochs at which the learning rate is multiplied by --lr-factor, comma-separated.
    #[arg(long, value_delimiter = ',')]
    lr_milestones: Vec<f64>,
    #[arg(long, default_value_t = 0.1)]
    lr_factor: f32,
    /// Epochs of linear learning-rate warm-up, from a tenth of the rate (0: none).
    #[arg(long, default_value_t = 0.0)]
    lr_warmup_epochs: f64,
    /// λ0 of the delay-compensated rules (default: the paper's, 0.04 for dc-asgd-c, 2 for dc-asgd-a).
    #[arg(long)]
    lambda0: Option<f32>,
    /// μ of dc-asgd-a's MeanSquare.
    #[arg(long, default_value_t = 0.95)]
    mean_square_decay: f32,
    /// Turn off the clamp of the compensation gain λ·g² at 1/η (to measure it).
    #[arg(long)]
    no_gain_clamp: bool,
    /// Turn off dc-asgd-a's MeanSquare bias correction (to measure it).
    #[arg(long)]
    no_bias_correction: bool,
    /// Heavy-ball momentum of the parameter server's rule (the outer optimizer's, with local
    /// steps), 0: none.
    #[arg(long, default_value_t = 0.0)]
    momentum: f32,
    /// Nesterov's momentum instead of heavy ball (DiLoCo's outer step: --momentum 0.9 --nesterov).
    #[arg(long)]
    nesterov: bool,
    /// Delayed Nesterov for the asynchronous rules (sync's rounds ignore it): the momentum steps
    /// once per this many updates, on their mean (needs --momentum > 0).
    #[arg(long, default_value_t = 1)]
    momentum_delay: u32,
    /// Inner steps per push (DiLoCo-style local steps): each virtual worker trains its copy H
    /// steps with --inner-optimizer and pushes θ_pulled − θ_local; 1: every step, one gradient.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    local_steps: u64,
    /// The inner optimizer of local steps.
    #[arg(long, value_enum, default_value_t = InnerAlgorithm::AdamW)]
    inner_optimizer: InnerAlgorithm,
    /// The inner optimizer's learning rate.
    #[arg(long, default_value_t = 1e-3)]
    inner_lr: f32,
    /// The type the virtual workers pull the model in (int8: the difference from each one's
    /// copy, tracked as the parameter server tracks it).
    #[arg(long, value_enum, default_value_t = WireType::F32)]
    pull_dtype: WireType,
    /// The type the virtual workers push their gradients (pseudo-gradients) in, encoded and
    /// decoded as a worker and the parameter server do (int8: with error feedback).
    #[arg(long, value_enum, default_value_t = WireType::F32)]
    push_dtype: WireType,
    /// int8 pushes without error feedback: what each push's rounding leaves out is lost (to
    /// measure what the feedback is worth; workers always carry it).
    #[arg(long)]
    no_error_feedback: bool,
    /// Points on each run's accuracy curve.
    #[arg(long, default_value_t = 10)]
    evals: usize,
    /// Runs at once (each run is single-threaded and deterministic whatever this is).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
}

/// A wire type of pulls or pushes.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum WireType {
    F32,
    Bf16,
    Int8,
}

/// `round-robin:8`, `uniform:15`, `geometric:3`, `trace:out/demo/summary.json`.
pub fn parse_delay(s: &str) -> anyhow::Result<Delay> {
    let (kind, arg) = s.split_once(':').with_context(|| format!("delay {s:?}: expected KIND:VALUE"))?;
    let number = |what: &str| format!("delay {s:?}: {what} must be a number");
    let delay = match kind {
        "round-robin" => Delay::RoundRobin { workers: arg.parse().with_context(|| number("M"))? },
        "uniform" => Delay::Uniform { max: arg.parse().with_context(|| number("MAX"))? },
        "geometric" => Delay::Geometric { mean: arg.parse().with_context(|| number("MEAN"))? },
        "trace" => Delay::Trace { counts: read_trace(Path::new(arg))? },
        "straggler" => {
            let (m, f) =
                arg.split_once(':').with_context(|| format!("delay {s:?}: expected straggler:M:F"))?;
            Delay::Straggler {
                workers: m.parse().with_context(|| number("M"))?,
                factor: f.parse().with_context(|| number("F"))?,
            }
        }
        _ => anyhow::bail!(
            "delay {s:?}: expected round-robin:M, uniform:MAX, geometric:MEAN, trace:FILE or straggler:M:F"
        ),
    };
    delay.validate().map_err(|e| anyhow::anyhow!("delay {s:?}: {e}"))?;
    Ok(delay)
}

/// The (τ, count) pairs under `staleness.counts` of a JSON file.
fn read_trace(path: &Path) -> anyhow::Result<Vec<(u64, u64)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let counts = v["staleness"]["counts"].clone();
    serde_json::from_value(counts)
        .with_context(|| format!("{}: no staleness.counts list of [tau, count] pairs", path.display()))
}

fn hyper(args: &SimulateArgs, algorithm: Algorithm) -> Hyper {
    let mut h = Hyper::new(algorithm, args.learning_rate);
    h.lr = LrSchedule {
        base: args.learning_rate,
        factor: args.lr_factor,
        milestones: args.lr_milestones.clone(),
        warmup: args.lr_warmup_epochs,
    };
    if let (Some(l), true) = (args.lambda0, algorithm.is_delay_compensated()) {
        h.lambda0 = l;
    }
    h.mean_square_decay = args.mean_square_decay;
    (h.momentum, h.nesterov) = (args.momentum, args.nesterov);
    if algorithm != Algorithm::Sync {
        h.momentum_delay = args.momentum_delay;
    }
    h.safeguards.gain_clamp = !args.no_gain_clamp;
    h.safeguards.bias_correction = !args.no_bias_correction;
    h
}

/// Flat rows for the simulator's network.
fn load(args: &SimulateArgs) -> anyhow::Result<SimData> {
    anyhow::ensure!(args.holdout > 0.0 && args.holdout < 1.0, "holdout must be in (0, 1)");
    let ds = data::Dataset::load(args.dataset_format, &args.dataset_path, 1, args.holdout)?;
    Ok(SimData {
        inputs: ds.train.shape.iter().product(),
        classes: ds.classes,
        train_x: ds.train.pixels,
        train_y: ds.train.labels,
        test_x: ds.test.pixels,
        test_y: ds.test.labels,
    })
}

/// Every configuration the flags name, in the order they are printed.
fn configs(args: &SimulateArgs) -> anyhow::Result<Vec<SimConfig>> {
    anyhow::ensure!(
        args.inner_lr.is_finite() && args.inner_lr > 0.0,
        "--inner-lr must be > 0, got {}",
        args.inner_lr
    );
    let delays = args.delays.iter().map(|d| parse_delay(d)).collect::<anyhow::Result<Vec<_>>>()?;
    let mut out = Vec::new();
    for &algorithm in &args.algorithms {
        for delay in &delays {
            for &seed in &args.seeds {
                let hyper = hyper(args, algorithm);
                hyper.validate().map_err(|e| anyhow::anyhow!("{algorithm}: {e}"))?;
                out.push(SimConfig {
                    hyper,
                    delay: delay.clone(),
                    epochs: args.epochs,
                    batch: args.batch_size,
                    hidden: args.hidden,
                    seed,
                    evals: args.evals,
                    local: (args.local_steps > 1).then_some(LocalSteps {
                        steps: args.local_steps,
                        rule: args.inner_optimizer,
                        lr: args.inner_lr,
                    }),
                    pulls: match args.pull_dtype {
                        WireType::F32 => PullDtype::F32,
                        WireType::Bf16 => PullDtype::Bf16,
                        WireType::Int8 => PullDtype::Int8,
                    },
                    pushes: match args.push_dtype {
                        WireType::F32 => GradDtype::F32,
                        WireType::Bf16 => GradDtype::Bf16,
                        WireType::Int8 => GradDtype::Int8,
                    },
                    error_feedback: !args.no_error_feedback,
                });
            }
        }
    }
    Ok(out)
}

pub fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    let data = load(args)?;
    let configs = configs(args)?;
    let jobs = args.jobs.clamp(1, configs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<Option<anyhow::Result<Outcome>>> = (0..configs.len()).map(|_| None).collect();
    let slots = std::sync::Mutex::new(&mut results);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(cfg) = configs.get(i) else { break };
                    let r = simulate(cfg, &data).map_err(anyhow::Error::from);
                    if let Ok(o) = &r {
                        tracing::info!(algorithm = %o.algorithm, delay = %o.delay, seed = o.seed,
                            accuracy = o.accuracy, "run done");
                    }
                    slots.lock().expect("no panics while held")[i] = Some(r);
                }
            });
        }
    });
    for r in results {
        let o = r.expect("every configuration ran")?;
        println!("{}", serde_json::to_string(&o).expect("plain data"));
    }
    Ok(())
}
