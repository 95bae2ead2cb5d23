//! `foresight-worker`: trains a model on its shard of the data and exchanges gradients with the
//! Foresight parameter server over HTTP/2. Configured by the environment the operator (or
//! `foresight run`) injects, or by flags.

mod clock;
mod data;
mod evaluate;
mod exit;
mod inner;
mod metrics;
mod model;
mod simulate;
mod slowdown;
mod train;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use foresight_ps::client::{Cadence, GradDtype, PullDtype};

/// Train on a shard of the data against a Foresight parameter server.
#[derive(Parser, Debug)]
#[command(
    version,
    about,
    after_help = "To evaluate a saved model on the held-out split: foresight-worker evaluate --help\n\
                  To simulate asynchrony deterministically in one process: foresight-worker simulate --help"
)]
struct Args {
    /// Parameter server base URL (http:// for h2c, https:// for TLS); for a PS sharded over N
    /// processes, the N shards' URLs in shard order, separated by commas.
    #[arg(long, env = "FORESIGHT_PS_URL")]
    ps_url: String,
    /// PEM certificates trusted for an https:// --ps-url (in a cluster, the job's certificate,
    /// which the operator mounts).
    #[arg(long, env = "FORESIGHT_PS_CA_FILE")]
    ps_ca_file: Option<PathBuf>,
    /// Bearer token for the PS.
    #[arg(long, env = "FORESIGHT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the token (a mounted Secret).
    #[arg(long, env = "FORESIGHT_TOKEN_FILE", conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// This worker's index (in a cluster: the Indexed Job's completion index). The job's worker
    /// count, which can change while it runs, comes from the parameter server when it joins.
    #[arg(long, env = "FORESIGHT_WORKER_INDEX")]
    worker: usize,

    /// Model: mlp, lenet5, resnet20 or torchscript.
    #[arg(long, env = "FORESIGHT_MODEL", default_value = "mlp")]
    model: String,
    /// TorchScript module file (torch.jit.script(model).save(path)), for --model torchscript.
    #[arg(long, env = "FORESIGHT_MODEL_PATH")]
    model_path: Option<PathBuf>,
    /// Dataset format: mnist (idx files), cifar10 (binary batches) or csv.
    #[arg(long, env = "FORESIGHT_DATASET_FORMAT", value_parser = parse_format)]
    dataset_format: data::Format,
    /// Directory holding the dataset (a mounted volume in a cluster).
    #[arg(long, env = "FORESIGHT_DATASET_PATH")]
    dataset_path: PathBuf,
    /// Fraction held out for evaluation, for formats without a test split (csv).
    #[arg(long, env = "FORESIGHT_HOLDOUT", default_value_t = 0.2)]
    holdout: f64,

    #[arg(long, env = "FORESIGHT_EPOCHS", default_value_t = 1)]
    epochs: usize,
    #[arg(long, env = "FORESIGHT_BATCH_SIZE", default_value_t = 64)]
    batch_size: usize,
    /// Seed for initial weights, shuffling and sharding (the same on every worker).
    #[arg(long, env = "FORESIGHT_SEED", default_value_t = 1)]
    seed: u64,
    /// Pull the model every N steps.
    #[arg(long, env = "FORESIGHT_PULL_EVERY", default_value_t = 1)]
    pull_every: u64,
    /// Push the accumulated gradient every N steps.
    #[arg(long, env = "FORESIGHT_PUSH_EVERY", default_value_t = 1)]
    push_every: u64,
    /// Local steps (DiLoCo-style): train N steps with the inner optimizer between exchanges,
    /// then push the pseudo-gradient θ_pulled − θ_local; 1 pushes every step's gradient.
    #[arg(long, env = "FORESIGHT_LOCAL_STEPS", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    local_steps: u64,
    /// The inner optimizer of local steps.
    #[arg(long, env = "FORESIGHT_INNER_OPTIMIZER", value_enum, default_value_t = inner::InnerAlgorithm::AdamW)]
    inner_optimizer: inner::InnerAlgorithm,
    /// The inner optimizer's learning rate.
    #[arg(long, env = "FORESIGHT_INNER_LEARNING_RATE", default_value_t = 0.001)]
    inner_learning_rate: f64,
    /// The inner optimizer's weight decay (AdamW: decoupled; SGD: L2).
    #[arg(long, env = "FORESIGHT_INNER_WEIGHT_DECAY", default_value_t = 0.0)]
    inner_weight_decay: f64,
    /// Gradient wire type (with local steps: the pseudo-gradient's).
    #[arg(long, env = "FORESIGHT_GRAD_DTYPE", value_enum, default_value_t = WireType::F32)]
    grad_dtype: WireType,
    /// The type the model is pulled in: bf16 halves every pull (the model computed on rounded
    /// to bf16), int8 sends the difference from this worker's copy (a quarter of the bytes;
    /// the PS keeps float32 either way).
    #[arg(long, env = "FORESIGHT_PULL_DTYPE", value_enum, default_value_t = PullType::F32)]
    pull_dtype: PullType,

    /// Give up after the PS has been unreachable this many seconds.
    #[arg(long, env = "FORESIGHT_PS_DEADLINE_SECONDS", default_value_t = 300)]
    ps_deadline_seconds: u64,
    /// Report progress every N steps.
    #[arg(long, env = "FORESIGHT_REPORT_EVERY", default_value_t = 20)]
    report_every: u64,
    /// Slow this worker's computation down by this factor (straggler experiments): each step's
    /// own work (load, compute, gather) is stretched by the factor (a stall of the host only up to
    /// twice the pace: the lower quartile of the last 15 steps' work, the fastest step before
    /// 15), its pulls and pushes are not.
    #[arg(long, env = "FORESIGHT_SLOWDOWN", default_value_t = 1.0)]
    slowdown: f64,
    /// libtorch intra-op threads (0: libtorch's default).
    #[arg(long, env = "FORESIGHT_TORCH_THREADS", default_value_t = 0)]
    torch_threads: i32,

    /// Address for /metrics and /healthz (empty: no metrics server).
    #[arg(long, env = "FORESIGHT_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    metrics_addr: String,
    /// Serve metrics on the socket inherited on this descriptor, bound to --metrics-addr (how
    /// `foresight run` starts its workers) instead of binding --metrics-addr.
    #[arg(long, env = "FORESIGHT_METRICS_LISTEN_FD")]
    metrics_listen_fd: Option<i32>,
    #[arg(long, env = "FORESIGHT_JOB_NAME", default_value = "local")]
    job_name: String,
    #[arg(long, env = "FORESIGHT_NAMESPACE", default_value = "default")]
    namespace: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum WireType {
    F32,
    Bf16,
    /// int8 with a scale per 1,024 values and error feedback: a quarter of F32's bytes.
    Int8,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PullType {
    F32,
    Bf16,
    /// The int8 difference from this worker's copy, which the PS tracks.
    Int8,
}

fn parse_format(s: &str) -> Result<data::Format, String> {
    s.parse()
}

fn main() {
    // `evaluate` is a subcommand of the same binary so that the worker image (whose entrypoint
    // this is) can evaluate a saved model; training keeps its flat flags and environment.
    let sub = std::env::args_os().nth(1);
    let result = if sub.as_ref().is_some_and(|a| a == "evaluate") {
        let args = evaluate::EvaluateArgs::parse_from(std::env::args_os().skip(1));
        init_logs();
        evaluate::run(&args).map(|all| {
            for e in all {
                println!("{}", serde_json::to_string(&e).expect("plain data"));
            }
        })
    } else if sub.as_ref().is_some_and(|a| a == "simulate") {
        let args = simulate::cli::SimulateArgs::parse_from(std::env::args_os().skip(1));
        init_logs();
        simulate::cli::run(&args)
    } else {
        run(Args::parse())
    };
    // Errors end the process with one readable line (no backtrace, whatever RUST_BACKTRACE says).
    if let Err(e) = result {
        eprintln!("foresight-worker: {e:#}");
        std::process::exit(exit::code(&e));
    }
}

fn init_logs() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn run(args: Args) -> anyhow::Result<()> {
    init_logs();
    let cfg = configure(&args).map_err(exit::permanent)?;
    if args.torch_threads > 0 {
        tch::set_num_threads(args.torch_threads);
    }
    // Network I/O and the metrics server run on one runtime thread; training runs on this one.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    exit_on_sigterm(&rt)?;
    let metrics = Arc::new(metrics::WorkerMetrics::new(&args.job_name, &args.namespace, args.worker));
    if !args.metrics_addr.is_empty() {
        let addr = rt.block_on(metrics.clone().serve(&args.metrics_addr, args.metrics_listen_fd))?;
        tracing::info!(%addr, "serving worker metrics");
    }
    train::run(&cfg, &rt, &metrics)
}

/// Ends the process on SIGTERM (status 143), as the default action would. The worker is PID 1 of
/// its container (the image's entrypoint), where a signal without a handler is ignored: the
/// kubelet's SIGTERM was, and a deleted or preempted worker trained on for its whole grace
/// period. Nothing is lost: the PS holds every gradient it applied, and a replacement resumes.
fn exit_on_sigterm(rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    // Registered before training starts, not when the task first runs.
    let mut term = rt.block_on(async { signal(SignalKind::terminate()) })?;
    rt.spawn(async move {
        term.recv().await;
        tracing::warn!("SIGTERM: stopping; a replacement resumes from the parameter server's model");
        let _ = std::io::Write::flush(&mut std::io::stdout());
        // `_exit`, not `process::exit`: the latter runs libtorch's C++ static destructors while
        // the training thread is still inside libtorch, which crashed the worker (SIGSEGV)
        // instead of ending it with 143. Nothing is left to flush or close that matters here.
        // SAFETY: `_exit` ends the process at once; no Rust state is observed after it.
        unsafe { libc::_exit(exit::TERMINATED) }
    });
    Ok(())
}

/// The training configuration from the flags and environment; any error here is the
/// configuration's, which no retry fixes.
fn configure(args: &Args) -> anyhow::Result<train::TrainConfig> {
    anyhow::ensure!(args.batch_size > 0 && args.epochs > 0, "batch size and epochs must be at least 1");
    anyhow::ensure!(args.holdout > 0.0 && args.holdout < 1.0, "holdout must be in (0, 1)");
    anyhow::ensure!(args.slowdown.is_finite() && args.slowdown >= 1.0, "slowdown must be ≥ 1");
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| anyhow::anyhow!("reading token file {}: {e}", f.display()))?
                .trim()
                .to_string(),
        ),
        (None, None) => None,
    };
    let model =
        model::ModelSpec::parse(&args.model, args.model_path.as_deref()).map_err(anyhow::Error::msg)?;
    let dtype = match args.grad_dtype {
        WireType::F32 => GradDtype::F32,
        WireType::Bf16 => GradDtype::Bf16,
        WireType::Int8 => GradDtype::Int8,
    };
    let pulls = match args.pull_dtype {
        PullType::F32 => PullDtype::F32,
        PullType::Bf16 => PullDtype::Bf16,
        PullType::Int8 => PullDtype::Int8,
    };
    let cadence = Cadence::for_job(args.pull_every, args.push_every, args.local_steps, dtype)?.pulling(pulls);
    // Local steps train with the worker's own optimizer between exchanges.
    let inner = match cadence.local() {
        Some(_) => {
            let (lr, wd) = (args.inner_learning_rate, args.inner_weight_decay);
            anyhow::ensure!(lr.is_finite() && lr > 0.0, "the inner learning rate must be > 0, got {lr}");
            anyhow::ensure!(wd.is_finite() && wd >= 0.0, "the inner weight decay must be ≥ 0, got {wd}");
            Some(inner::InnerConfig { algorithm: args.inner_optimizer, lr, weight_decay: wd })
        }
        None => None,
    };
    let ps_tls = match &args.ps_ca_file {
        Some(path) => Some(foresight_ps::client::ClientTls::from_pem_file(path)?),
        None => None,
    };
    Ok(train::TrainConfig {
        ps_url: args.ps_url.clone(),
        ps_tls,
        token,
        worker: args.worker,
        model,
        format: args.dataset_format,
        data_dir: args.dataset_path.clone(),
        holdout: args.holdout,
        epochs: args.epochs,
        batch_size: args.batch_size,
        seed: args.seed,
        cadence,
        inner,
        ps_deadline: Duration::from_secs(args.ps_deadline_seconds),
        report_every: args.report_every.max(1),
        slowdown: args.slowdown,
    })
}
