//! `foresight-ps`: the parameter server binary.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use foresight_ps::client::PullDtype;
use foresight_ps::optimizer::{Algorithm, Combine, Hyper, LrSchedule, ParameterGroup};
use foresight_ps::pace::LocalStepsPolicy;
use foresight_ps::server::{
    AppState, ConnectionLimits, Listener, PsConfig, SnapshotPolicy, TlsFiles, router, serve,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Foresight parameter server: applies gradients from asynchronous workers with
/// delay-compensated SGD (DC-ASGD), plain ASGD or synchronous SGD, over HTTP/2.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address to listen on (h2c with prior knowledge and HTTP/1.1; TLS with --tls-cert).
    #[arg(long, env = "FORESIGHT_PS_LISTEN", default_value = "0.0.0.0:8080")]
    listen: String,
    /// Listen on the socket inherited on this descriptor, bound to --listen (how `foresight run`
    /// starts its servers) instead of binding --listen.
    #[arg(long, env = "FORESIGHT_PS_LISTEN_FD")]
    listen_fd: Option<i32>,

    /// Bearer token workers must send on /v1/*.
    #[arg(long, env = "FORESIGHT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the bearer token (e.g. a mounted Secret); surrounding whitespace is ignored.
    #[arg(long, env = "FORESIGHT_TOKEN_FILE", conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// Serve /v1/* without a token. Only for local experiments.
    #[arg(long)]
    allow_unauthenticated: bool,
    /// The job's control token (the operator's): only it may finalize the job or change its
    /// worker count (POST /v1/finalize, PUT /v1/workers), and it is accepted everywhere else too.
    /// Without it the workers' token may do both.
    #[arg(long, env = "FORESIGHT_CONTROL_TOKEN", hide_env_values = true)]
    control_token: Option<String>,
    /// File holding the control token; surrounding whitespace is ignored.
    #[arg(long, env = "FORESIGHT_CONTROL_TOKEN_FILE", conflicts_with = "control_token")]
    control_token_file: Option<PathBuf>,

    /// Number of workers in the job; worker ids are 0..workers.
    #[arg(long, env = "FORESIGHT_WORKERS")]
    workers: usize,

    /// Update rule.
    #[arg(long, env = "FORESIGHT_ALGORITHM", default_value = "dc-asgd-a", value_parser = parse_algorithm)]
    algorithm: Algorithm,
    /// Learning rate η.
    #[arg(long, env = "FORESIGHT_LEARNING_RATE", default_value_t = 0.1)]
    learning_rate: f32,
    /// Multiply the learning rate by this at each milestone.
    #[arg(long, env = "FORESIGHT_LR_DECAY_FACTOR", default_value_t = 0.1)]
    lr_decay_factor: f32,
    /// Comma-separated epochs at which the learning rate decays, e.g. 80,120.
    #[arg(long, env = "FORESIGHT_LR_MILESTONES", value_delimiter = ',')]
    lr_milestones: Vec<f64>,
    /// Epochs of linear learning-rate warm-up, from a tenth of the rate (0: none).
    #[arg(long, env = "FORESIGHT_LR_WARMUP_EPOCHS", default_value_t = 0.0)]
    lr_warmup_epochs: f64,
    /// λ0 (dc-asgd-c: the constant λ, default 0.04; dc-asgd-a: the scale, default 2).
    #[arg(long, env = "FORESIGHT_LAMBDA0")]
    lambda0: Option<f32>,
    /// μ of MeanSquare ← μ·MeanSquare + (1−μ)·g² (dc-asgd-a).
    #[arg(long, env = "FORESIGHT_MEAN_SQUARE_DECAY", default_value_t = 0.95)]
    mean_square_decay: f32,
    /// ε in λ_t = λ0/√(MeanSquare + ε).
    #[arg(long, env = "FORESIGHT_EPSILON", default_value_t = 1e-7)]
    epsilon: f32,
    /// L2 weight decay added to every gradient.
    #[arg(long, env = "FORESIGHT_WEIGHT_DECAY", default_value_t = 0.0)]
    weight_decay: f32,
    /// Heavy-ball momentum (0 disables).
    #[arg(long, env = "FORESIGHT_MOMENTUM", default_value_t = 0.0)]
    momentum: f32,
    /// Nesterov momentum instead of heavy ball (needs --momentum > 0): DiLoCo's outer step.
    #[arg(long, env = "FORESIGHT_NESTEROV")]
    nesterov: bool,
    /// Delayed Nesterov for asynchronous outer steps: the momentum steps once per this many
    /// updates, on their mean, each update applying its own 1/N share at once (needs
    /// --momentum > 0, not sync). The number of workers is the usual choice; 1 steps every update.
    #[arg(long, env = "FORESIGHT_MOMENTUM_DELAY", default_value_t = 1)]
    momentum_delay: u32,
    /// Parameter groups, as JSON: `[{"names": ["bias$", "norm"], "weightDecay": 0,
    /// "learningRateScale": 1}]`. A tensor whose name one of a group's regular expressions
    /// matches (searched anywhere in it) is updated with the group's weight decay (instead of
    /// --weight-decay) and the learning rate times its scale; the first matching group wins.
    #[arg(long, env = "FORESIGHT_PARAMETER_GROUPS", value_parser = parse_parameter_groups)]
    parameter_groups: Option<ParameterGroups>,
    /// Refuse gradients staler than this many versions (bounded staleness).
    #[arg(long, env = "FORESIGHT_MAX_STALENESS")]
    max_staleness: Option<u64>,
    /// How `sync` combines a round's gradients.
    #[arg(long, env = "FORESIGHT_COMBINE", default_value = "mean", value_parser = parse_combine)]
    combine: Combine,
    /// `sync`: close each round with the first workers − b gradients and drop the late ones.
    #[arg(long, env = "FORESIGHT_BACKUP_WORKERS", default_value_t = 0)]
    backup_workers: usize,
    /// `sync`: a round that has had no new gradient for this many seconds closes with the
    /// ones it has, so a dead worker never stops the job.
    #[arg(long, env = "FORESIGHT_SYNC_ROUND_TIMEOUT", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    sync_round_timeout: u64,
    /// A worker the PS has heard nothing from (no pull, push, join, leave or report) for this
    /// many seconds is marked silent: `sync` rounds stop waiting for it until it is heard again,
    /// so a dead or stopped worker holds up one round, not all. Default: the round timeout.
    #[arg(long, env = "FORESIGHT_WORKER_SILENCE_TIMEOUT", value_parser = clap::value_parser!(u64).range(1..))]
    worker_silence_timeout: Option<u64>,
    /// After a restart that lost the model (no checkpoint), how many seconds pushes wait for
    /// every worker to offer its copy, so that training continues from the freshest one.
    #[arg(long, env = "FORESIGHT_RESEED_HOLD", default_value_t = 10)]
    reseed_hold: u64,

    /// Adaptive local steps (`optimizer.adaptiveLocalSteps`): advise each worker how many local
    /// steps to train between exchanges, at most this many. Needs --local-steps (where workers
    /// start); absent: workers keep the local steps they were started with.
    #[arg(long, env = "FORESIGHT_LOCAL_STEPS_MAX")]
    local_steps_max: Option<u64>,
    /// With --local-steps-max: the local steps advised to a worker before its pace is measured
    /// (the workers' own setting, which they start with).
    #[arg(long, env = "FORESIGHT_LOCAL_STEPS")]
    local_steps: Option<u64>,
    /// With --local-steps-max: the fewest local steps advised (at least 2; default 2).
    #[arg(long, env = "FORESIGHT_LOCAL_STEPS_MIN", default_value_t = 2)]
    local_steps_min: u64,
    /// The share of a worker's time its exchanges may take, in (0, 1]: each round lasts the
    /// slowest exchange divided by this.
    #[arg(long, env = "FORESIGHT_COMMUNICATION_FRACTION", default_value_t = 0.1)]
    communication_fraction: f64,

    /// Directory for checkpoints; the newest valid one is restored at start.
    #[arg(long, env = "FORESIGHT_CHECKPOINT_DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Seconds between periodic checkpoints (0 disables; SIGTERM and finalize always write one).
    #[arg(long, env = "FORESIGHT_CHECKPOINT_INTERVAL", default_value_t = 60)]
    checkpoint_interval: u64,
    /// How many checkpoints to keep.
    #[arg(long, env = "FORESIGHT_KEEP_CHECKPOINTS", default_value_t = 3)]
    keep_checkpoints: usize,
    /// The update journal in the checkpoint directory: off, on (every update and refusal, one
    /// JSON line each) or capture (also every gradient applied, for `foresight replay`).
    #[arg(long, env = "FORESIGHT_JOURNAL", value_enum, default_value_t = foresight_ps::journal::Mode::On)]
    journal: foresight_ps::journal::Mode,
    /// The journal's size in bytes before it is rotated (4 rotated files are kept; never with capture).
    #[arg(long, env = "FORESIGHT_JOURNAL_MAX_BYTES", default_value_t = 64 << 20)]
    journal_max_bytes: u64,
    /// Where finalize writes model-final.safetensors (default: the checkpoint directory).
    #[arg(long, env = "FORESIGHT_OUTPUT_DIR")]
    output_dir: Option<PathBuf>,
    /// Shard 0 of a model sharded over several PS processes: the other shards' URLs in shard
    /// order, separated by commas. Finalizing this PS finalizes them too and writes the whole
    /// model's final file, merged from every shard's slice.
    #[arg(long, env = "FORESIGHT_PS_PEERS", value_delimiter = ',')]
    peers: Vec<String>,
    /// PEM certificates trusted for https:// --peers (in a cluster, the job's certificate,
    /// which every shard serves).
    #[arg(long, env = "FORESIGHT_PS_CA_FILE")]
    ps_ca_file: Option<PathBuf>,
    /// Which shard of a sharded PS this process is (0 when unsharded): the `shard` label of its
    /// metrics.
    #[arg(long, env = "FORESIGHT_PS_SHARD", default_value_t = 0)]
    shard: usize,

    /// Write the model every this many updates into --snapshot-dir, for learning curves of
    /// the PS's own model (0: never).
    #[arg(long, env = "FORESIGHT_SNAPSHOT_EVERY", default_value_t = 0)]
    snapshot_every: u64,
    /// Where --snapshot-every writes snapshot-<version>.safetensors and snapshots.jsonl.
    #[arg(long, env = "FORESIGHT_SNAPSHOT_DIR")]
    snapshot_dir: Option<PathBuf>,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "FORESIGHT_BODY_LIMIT", default_value_t = 1 << 30)]
    body_limit: usize,
    /// A request body that sends nothing for this many seconds is refused (408) and its buffer
    /// freed: a worker paused mid-push does not pin a model-sized buffer.
    #[arg(long, env = "FORESIGHT_BODY_IDLE_TIMEOUT", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    body_idle_timeout: u64,
    /// Bytes a second a request body must average over each idle period while it is read; a
    /// trickle below it is refused (408): K of them would hold every push slot. 0: no minimum.
    #[arg(long, env = "FORESIGHT_BODY_MIN_RATE", default_value_t = 64 << 10)]
    body_min_rate: u64,
    /// /healthz fails (503) when pushes have waited this many seconds in the model's store with
    /// no update finishing: the liveness probe then restarts a PS that serves but trains nothing.
    #[arg(long, env = "FORESIGHT_STORE_STUCK_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    store_stuck_seconds: u64,
    /// Connections open at once at most; further ones wait in the listen backlog.
    #[arg(long, env = "FORESIGHT_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: u64,
    /// Memory limit in bytes, which bounds how many push bodies are buffered at once (default:
    /// the container's cgroup limit; none: unbounded).
    #[arg(long, env = "FORESIGHT_MEMORY_LIMIT")]
    memory_limit: Option<u64>,
    /// Push bodies buffered at once at most, instead of the count the memory limit gives; the
    /// others wait, then get 503 `busy` with Retry-After.
    #[arg(long, env = "FORESIGHT_PUSH_SLOTS", value_parser = clap::value_parser!(u64).range(1..=1024))]
    push_slots: Option<u64>,
    /// The type the job's workers pull the model in (the workers' own setting): bf16 and int8
    /// bodies are encoded per pull and with int8 this PS keeps a copy of the model per worker,
    /// which the memory limit's plan counts.
    #[arg(long, env = "FORESIGHT_PULL_DTYPE", value_enum, default_value_t = PullType::F32)]
    pull_dtype: PullType,
    /// Longest a pull may wait for a version (long-poll), in seconds.
    #[arg(long, env = "FORESIGHT_MAX_LONG_POLL", default_value_t = 60)]
    max_long_poll: u64,

    /// TrainingJob name, the `job` label on every metric.
    #[arg(long, env = "FORESIGHT_JOB_NAME", default_value = "local")]
    job_name: String,
    /// Namespace, the `namespace` label on every metric.
    #[arg(long, env = "FORESIGHT_NAMESPACE", default_value = "default")]
    namespace: String,

    /// PEM certificate chain: serve HTTPS (h2 via ALPN) instead of h2c.
    #[arg(long, env = "FORESIGHT_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "FORESIGHT_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Log format.
    #[arg(long, env = "FORESIGHT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PullType {
    F32,
    Bf16,
    /// Differences from each worker's copy, which this PS keeps.
    Int8,
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    s.parse().map_err(|e: foresight_ps::optimizer::HyperError| e.0)
}

/// `--parameter-groups`: the JSON the operator and `foresight run` write from
/// `optimizer.parameterGroups` (validated with the rest of the hyperparameters).
#[derive(Clone, Debug)]
struct ParameterGroups(Vec<ParameterGroup>);

fn parse_parameter_groups(s: &str) -> Result<ParameterGroups, String> {
    serde_json::from_str(s)
        .map(ParameterGroups)
        .map_err(|e| format!("not a JSON list of parameter groups: {e}"))
}

fn parse_combine(s: &str) -> Result<Combine, String> {
    s.parse().map_err(|e: foresight_ps::optimizer::HyperError| e.0)
}

impl Args {
    fn hyper(&self) -> Hyper {
        let mut h = Hyper::new(self.algorithm, self.learning_rate);
        h.lr = LrSchedule {
            base: self.learning_rate,
            factor: self.lr_decay_factor,
            milestones: self.lr_milestones.clone(),
            warmup: self.lr_warmup_epochs,
        };
        if let Some(l) = self.lambda0 {
            h.lambda0 = l;
        }
        h.mean_square_decay = self.mean_square_decay;
        h.epsilon = self.epsilon;
        h.weight_decay = self.weight_decay;
        h.momentum = self.momentum;
        h.nesterov = self.nesterov;
        h.momentum_delay = self.momentum_delay;
        h.parameter_groups = self.parameter_groups.clone().map(|g| g.0).unwrap_or_default();
        h.max_staleness = self.max_staleness;
        h.combine = self.combine;
        h.backup_workers = self.backup_workers;
        h
    }

    /// The adaptive local steps policy, when --local-steps-max asks for one.
    fn local_steps_policy(&self) -> anyhow::Result<Option<LocalStepsPolicy>> {
        let Some(max) = self.local_steps_max else { return Ok(None) };
        let start = self.local_steps.ok_or_else(|| {
            anyhow::anyhow!("--local-steps-max needs --local-steps (the steps to start with)")
        })?;
        LocalStepsPolicy::new(start, self.local_steps_min, max, self.communication_fraction)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("adaptive local steps: {e}"))
    }

    /// The snapshot policy: both flags or neither; the directory is made now, so a bad path
    /// stops the start instead of failing every snapshot later.
    fn snapshots(&self) -> anyhow::Result<Option<SnapshotPolicy>> {
        match (self.snapshot_every, &self.snapshot_dir) {
            (0, None) => Ok(None),
            (0, Some(_)) => anyhow::bail!("--snapshot-dir needs --snapshot-every N (N ≥ 1)"),
            (_, None) => anyhow::bail!("--snapshot-every needs --snapshot-dir"),
            (every, Some(dir)) => {
                std::fs::create_dir_all(dir).with_context(|| format!("--snapshot-dir {}", dir.display()))?;
                Ok(Some(SnapshotPolicy { dir: dir.clone(), every }))
            }
        }
    }

    fn token(&self) -> anyhow::Result<Option<String>> {
        match read_token(&self.token, &self.token_file, "--token-file")? {
            Some(t) => Ok(Some(t)),
            None if self.allow_unauthenticated => Ok(None),
            None => anyhow::bail!(
                "no token: pass --token, FORESIGHT_TOKEN or --token-file (or --allow-unauthenticated for local experiments)"
            ),
        }
    }

    fn control_token(&self) -> anyhow::Result<Option<String>> {
        let control = read_token(&self.control_token, &self.control_token_file, "--control-token-file")?;
        if control.is_some() && control == self.token()? {
            anyhow::bail!("the control token must differ from the workers' token");
        }
        Ok(control)
    }
}

/// A token given inline or in a file, trimmed; an empty one is an error.
fn read_token(inline: &Option<String>, file: &Option<PathBuf>, flag: &str) -> anyhow::Result<Option<String>> {
    let token = match (inline, file) {
        (Some(t), _) => t.trim().to_string(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading {flag} {}", f.display()))?
            .trim()
            .to_string(),
        (None, None) => return Ok(None),
    };
    anyhow::ensure!(!token.is_empty(), "the token is empty");
    Ok(Some(token))
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: log files and `kubectl logs` stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() {
    // Errors end the process with one readable line (no backtrace, whatever RUST_BACKTRACE says).
    if let Err(e) = start() {
        eprintln!("foresight-ps: {e:#}");
        std::process::exit(1);
    }
}

fn start() -> anyhow::Result<()> {
    // First, before the runtime's threads and the code they page in: a container too small to
    // start in would otherwise be OOM-killed, or run on unkilled without answering its probes.
    foresight_ps::server::check_memory_limit(foresight_ps::server::cgroup_memory_limit())
        .map_err(anyhow::Error::msg)?;
    let args = Args::parse();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let mut config = PsConfig::new(args.hyper(), args.workers);
    config.token = args.token()?;
    config.control_token = args.control_token()?;
    config.body_limit = args.body_limit;
    config.body_idle_timeout = Duration::from_secs(args.body_idle_timeout);
    config.body_min_rate = args.body_min_rate;
    config.store_stuck_after = Duration::from_secs(args.store_stuck_seconds);
    config.checkpoint_dir = args.checkpoint_dir.clone();
    (config.journal, config.journal_max_bytes) = (args.journal, args.journal_max_bytes);
    config.checkpoint_interval =
        (args.checkpoint_interval > 0).then(|| Duration::from_secs(args.checkpoint_interval));
    config.keep_checkpoints = args.keep_checkpoints;
    config.output_dir = args.output_dir.clone();
    config.peer_tls = match &args.ps_ca_file {
        Some(path) => Some(foresight_ps::client::ClientTls::from_pem_file(path)?),
        None => None,
    };
    if !args.peers.is_empty() {
        // The same check as the workers' list of shards.
        foresight_ps::client::PsClient::for_shards(&args.peers.join(","), None, config.peer_tls.as_ref())
            .map_err(|e| anyhow::anyhow!("--peers: {e}"))?;
    }
    config.peers = args.peers.clone();
    config.shard = args.shard;
    config.local_steps = args.local_steps_policy()?;
    config.snapshots = args.snapshots()?;
    config.job = args.job_name.clone();
    config.namespace = args.namespace.clone();
    config.max_long_poll = Duration::from_secs(args.max_long_poll);
    config.sync_round_timeout = Duration::from_secs(args.sync_round_timeout);
    config.worker_silence_timeout =
        Duration::from_secs(args.worker_silence_timeout.unwrap_or(args.sync_round_timeout));
    config.reseed_hold = Duration::from_secs(args.reseed_hold);
    config.memory_limit = args.memory_limit.or_else(foresight_ps::server::cgroup_memory_limit);
    config.push_slots = args.push_slots.map(|k| k as usize);
    config.pulled_as = match args.pull_dtype {
        PullType::F32 => PullDtype::F32,
        PullType::Bf16 => PullDtype::Bf16,
        PullType::Int8 => PullDtype::Int8,
    };

    // Held until the process exits: a replaced PS's last checkpoint is written before this one
    // restores (see dir_lock).
    let _owned = match &args.checkpoint_dir {
        Some(dir) => Some(
            foresight_ps::dir_lock::own(dir)
                .map_err(|e| anyhow::anyhow!("checkpoint directory {}: {e}", dir.display()))?,
        ),
        None => None,
    };
    let state = AppState::new(config)?;
    let tls = args.tls_cert.clone().zip(args.tls_key.clone()).map(|(cert, key)| TlsFiles { cert, key });
    let limits = ConnectionLimits { max_connections: args.max_connections as usize, ..Default::default() };
    let listener = Listener::bind(&args.listen, args.listen_fd, tls.as_ref()).await?.with_limits(limits);
    tracing::info!(
        addr = %listener.local_addr()?,
        algorithm = %args.algorithm,
        workers = args.workers,
        tls = tls.is_some(),
        "parameter server listening"
    );
    state.spawn_checkpointer();
    state.spawn_snapshotter();
    state.spawn_round_watch();
    state.spawn_presence_watch();
    serve(listener, router(state.clone()), shutdown_signal()).await;
    match state.checkpoint().await {
        Ok(Some(path)) => tracing::info!(path = %path.display(), "final checkpoint written on shutdown"),
        Ok(None) => {}
        Err(e) => {
            tracing::error!(error = %e, "checkpoint on shutdown failed");
            std::process::exit(1);
        }
    }
    tracing::info!("parameter server stopped");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}
