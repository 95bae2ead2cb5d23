//! `foresight`: the Foresight CLI.

use std::path::PathBuf;
use std::time::Duration;

mod journal;

use clap::{Parser, Subcommand, ValueEnum};
use foresight_operator::controller::{
    self, ChildDefaults, LeaseConfig,
    token::{self, TokenKey},
};
use foresight_operator::local::{self, RunOptions};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;

#[derive(Parser, Debug)]
#[command(version, about = "Foresight: asynchronous distributed training with delay-compensated SGD")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a TrainingJob YAML on this machine: one parameter server and its workers as local
    /// processes, with the environment the operator would give their pods.
    Run {
        /// The TrainingJob YAML (the same file `kubectl apply -f` takes).
        job: PathBuf,
        /// Output directory: model-final.safetensors, summary.json, plot.png, logs/, checkpoints/.
        #[arg(long, default_value = "out/run")]
        out: PathBuf,
        /// foresight-ps binary (default: next to this executable).
        #[arg(long, env = "FORESIGHT_PS_BIN")]
        ps_bin: Option<PathBuf>,
        /// foresight-worker binary (default: next to this executable).
        #[arg(long, env = "FORESIGHT_WORKER_BIN")]
        worker_bin: Option<PathBuf>,
        /// libtorch threads per worker (default: cores / workers).
        #[arg(long)]
        torch_threads: Option<usize>,
        /// Slow worker N's computation down by factor F (straggler experiments), as N=F: each
        /// step's own work takes F times as long, its pulls and pushes do not.
        #[arg(long, value_parser = parse_slowdown)]
        slow_worker: Vec<(usize, f64)>,
        /// No progress bar.
        #[arg(long)]
        no_progress: bool,
        /// Continue from the checkpoints an interrupted run left in --out.
        #[arg(long)]
        resume: bool,
        /// Bearer token the run's parameter server requires (default: a new random one). Set it
        /// to talk to that PS yourself: its address is in --out's prometheus-targets.json.
        #[arg(long, env = "FORESIGHT_TOKEN", hide_env_values = true, value_parser = parse_token)]
        token: Option<String>,
        /// The run's control token (default: a new random one): the only one its parameter
        /// server accepts to finalize the job or change its worker count. The workers never get it.
        #[arg(long, env = "FORESIGHT_CONTROL_TOKEN", hide_env_values = true, value_parser = parse_token)]
        control_token: Option<String>,
        /// Have the parameter server write its model every N updates into --out/snapshots and
        /// evaluate each afterwards: summary.json's `curve` (the PS model's held-out loss and
        /// accuracy against updates, epochs and seconds).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        snapshot_every: Option<u64>,
        /// The parameter servers' update journal, in --out/checkpoints: on (their default), off,
        /// or capture (every gradient too, so that `foresight replay` can rebuild the model).
        #[arg(long, value_enum)]
        journal: Option<foresight_ps::journal::Mode>,
    },
    /// Show a parameter server's update journal (the checkpoint directory of one PS shard):
    /// every update applied and every push refused, filtered, or summed up per worker.
    Journal {
        /// The shard's checkpoint directory (`foresight run`: --out/checkpoints, or its shard-<i>/).
        dir: PathBuf,
        #[command(flatten)]
        filter: foresight_ps::journal::Filter,
        /// Per-worker counts (applied, refused by reason, staleness) instead of the entries.
        #[arg(long)]
        summary: bool,
        /// JSON (one entry per line, or the summary as one object) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Apply a captured journal (--journal capture) again from its initial model and compare
    /// the result bit for bit with the shard's newest checkpoint. Exit status 1 when it differs.
    Replay {
        /// The shard's checkpoint directory.
        dir: PathBuf,
    },
    /// Print the TrainingJob CustomResourceDefinition as YAML.
    Crd,
    /// Run the Kubernetes operator: reconcile TrainingJobs into a parameter server Deployment
    /// and Service, a token Secret and an Indexed worker Job, and keep their status.
    Operator(Box<OperatorArgs>),
}

#[derive(clap::Args, Debug)]
struct OperatorArgs {
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the pod's service account).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Watch TrainingJobs in these namespaces only, comma-separated (default: all namespaces).
    #[arg(long, visible_alias = "namespaces", env = "FORESIGHT_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "FORESIGHT_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: String,
    /// Secret key (≥ 32 bytes) the job tokens are derived from; the same for every replica.
    #[arg(long, env = "FORESIGHT_TOKEN_KEY", hide_env_values = true)]
    token_key: Option<String>,
    /// File holding the token key (instead of --token-key).
    #[arg(long, env = "FORESIGHT_TOKEN_KEY_FILE", conflicts_with = "token_key")]
    token_key_file: Option<PathBuf>,
    /// Secret in the operator's namespace (POD_NAMESPACE) holding the token key under `key`,
    /// created with a random key if it does not exist (instead of --token-key): the chart's
    /// default, so that no render carries key material and GitOps tools see a stable manifest.
    #[arg(long, env = "FORESIGHT_TOKEN_KEY_SECRET", conflicts_with_all = ["token_key", "token_key_file"])]
    token_key_secret: Option<String>,
    /// File holding the token key this one replaced: jobs created before a key rotation keep the
    /// tokens their pods hold, and the operator calls their parameter servers with the previous
    /// key's token when the current one is refused. (With --token-key-secret: the Secret's
    /// `previous` entry.)
    #[arg(long, env = "FORESIGHT_PREVIOUS_TOKEN_KEY_FILE", conflicts_with = "token_key_secret")]
    previous_token_key_file: Option<PathBuf>,
    /// The previous token key itself (instead of --previous-token-key-file).
    #[arg(long, env = "FORESIGHT_PREVIOUS_TOKEN_KEY", hide_env_values = true, conflicts_with_all = ["token_key_secret", "previous_token_key_file"])]
    previous_token_key: Option<String>,
    /// Parameter server image for jobs that name none.
    #[arg(long, env = "FORESIGHT_PS_IMAGE", default_value = "ghcr.io/foresight-dev/foresight-ps:0.1.0")]
    ps_image: String,
    /// Worker image for jobs that name none.
    #[arg(
        long,
        env = "FORESIGHT_WORKER_IMAGE",
        default_value = "ghcr.io/foresight-dev/foresight-worker:0.1.0"
    )]
    worker_image: String,
    /// How the operator reaches a job's parameter server ({name}, {namespace} are replaced);
    /// change it only when the operator runs outside the cluster.
    #[arg(long, env = "FORESIGHT_PS_URL_TEMPLATE", default_value = "http://{name}-ps.{namespace}.svc:8080")]
    ps_url: String,
    /// Jobs started from now on talk to their parameter server over TLS: the operator issues
    /// each job a CA and a certificate for its PS's Services (a Secret `<job>-ps-tls-<uid>`,
    /// derived from the token key), the workers trust that CA, and so does the operator for its
    /// own calls (the `http://` of --ps-url becomes `https://`). A job keeps the transport it
    /// started with.
    #[arg(long, env = "FORESIGHT_PS_TLS")]
    ps_tls: bool,
    /// Seconds between reads of a running job's progress from its parameter server. Each read
    /// that finds the model moved writes the job's status: at 1,000 jobs, 60 s is about 17
    /// status writes a second. The PS's own metrics are live whatever this is.
    #[arg(long, env = "FORESIGHT_PROGRESS_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    progress_seconds: u64,
    /// Seconds to retry writing the final model after the workers finished (when the last
    /// worker did not record that the PS wrote it); then the job fails (FinalModelNotWritten).
    #[arg(long, env = "FORESIGHT_FINALIZE_GRACE_SECONDS", default_value_t = 300)]
    finalize_grace_seconds: u64,
    /// Seconds a job's pods may fail to start or keep failing (an image that cannot be pulled, a
    /// missing ConfigMap, a quota that refuses them, an OOM-killed parameter server) before the
    /// job fails with that reason; until then it says so in its phase and a Warning event.
    #[arg(long, env = "FORESIGHT_STUCK_PODS_TIMEOUT_SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    stuck_pods_timeout_seconds: u64,
    /// Jobs reconciled at once (per watched scope), ≥ 1. An operator that starts (or takes
    /// over the Lease) reconciles every job; unbounded, 1,000 jobs meant 1,000 reconciles and
    /// their API calls at once.
    #[arg(long, env = "FORESIGHT_MAX_CONCURRENT_RECONCILES", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_reconciles: u16,
    /// Let Kueue admit the jobs labelled kueue.x-k8s.io/queue-name (one Workload per job; Kueue's
    /// kueue.x-k8s.io/v1beta2 API must be served). Without it such jobs wait, saying why.
    #[arg(long, env = "FORESIGHT_KUEUE")]
    kueue: bool,
    /// With --kueue, run only jobs queued in Kueue: a job without kueue.x-k8s.io/queue-name (in
    /// a namespace without a LocalQueue `default`, which is given to it) waits, saying why,
    /// instead of running outside the quota (Kueue's manageJobsWithoutQueueName). Jobs already
    /// running when it is turned on keep running.
    #[arg(long, env = "FORESIGHT_KUEUE_REQUIRED", requires = "kueue")]
    kueue_required: bool,
    /// Give each job a NetworkPolicy `<job>-ps`: its parameter servers accept connections only
    /// from the job's own workers and from these peers, a JSON list of NetworkPolicyPeers (the
    /// chart's networkPolicy.perJob passes the operator's pods and metricsFrom). `[]`: the
    /// workers alone (the operator then cannot read progress; the PS still finalizes the job).
    #[arg(long, env = "FORESIGHT_PS_NETWORK_POLICY", value_parser = parse_peers)]
    ps_network_policy: Option<Peers>,
    /// Elect a leader among the replicas with a Lease (turn off only with one replica).
    #[arg(long, env = "FORESIGHT_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Name of the Lease.
    #[arg(long, env = "FORESIGHT_LEASE_NAME", default_value = "foresight-operator")]
    lease_name: String,
    /// Namespace of the Lease (in a cluster: the operator's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Namespaces, besides the Lease's own, whose marked Leases may speak for every namespace:
    /// another release watching every namespace is believed only from these (comma-separated).
    /// A Lease anywhere else speaks only for the namespace it lives in, so a tenant who may
    /// create Leases cannot stop this operator or make it leave other namespaces.
    #[arg(long, env = "FORESIGHT_TRUSTED_LEASE_NAMESPACES", value_delimiter = ',')]
    trusted_lease_namespaces: Vec<String>,
    /// This replica's name in the Lease (default: the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Seconds a leader's lease lasts without renewal before another replica may take it.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..))]
    lease_duration_seconds: u64,
    /// Log format.
    #[arg(long, env = "FORESIGHT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter (tracing's EnvFilter syntax: info, debug, foresight_operator=debug, ...).
    #[arg(long, env = "FORESIGHT_LOG_LEVEL", default_value = "info")]
    log_level: String,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Text,
    Json,
}

/// `--ps-network-policy`'s peers (a type of their own: clap would take a `Vec` for a list of
/// arguments).
#[derive(Clone, Debug)]
struct Peers(Vec<NetworkPolicyPeer>);

fn parse_peers(s: &str) -> Result<Peers, String> {
    serde_json::from_str(s).map(Peers).map_err(|e| format!("expected a JSON list of NetworkPolicyPeers: {e}"))
}

fn parse_slowdown(s: &str) -> Result<(usize, f64), String> {
    let (w, f) = s.split_once('=').ok_or("expected WORKER=FACTOR, e.g. 2=3")?;
    let w = w.parse().map_err(|_| format!("bad worker index {w:?}"))?;
    let f: f64 = f.parse().map_err(|_| format!("bad factor {f:?}"))?;
    if !(f.is_finite() && f >= 1.0) {
        return Err(format!("the factor must be ≥ 1, got {f}"));
    }
    Ok((w, f))
}

/// A bearer token travels in an HTTP header: visible ASCII, nothing else.
fn parse_token(s: &str) -> Result<String, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a token must be non-empty visible ASCII (no spaces or control characters)".into());
    }
    Ok(s.to_string())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    // reqwest is built without a crypto provider of its own; `foresight run` asks its servers
    // with plain clients.
    foresight_ps::client::install_crypto_provider();
    let (filter, json) = match &cli.command {
        Cmd::Operator(a) => (a.log_level.clone(), matches!(a.log_format, LogFormat::Json)),
        _ => (std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()), false),
    };
    let filter = match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("foresight: bad log filter {filter:?}: {e}");
            std::process::exit(2);
        }
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        logs.json().init()
    } else {
        logs.init()
    }
    match cli.command {
        Cmd::Operator(args) => {
            if let Err(e) = operator(*args).await {
                eprintln!("foresight operator: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Crd => {
            print!("{}", foresight_operator::api::crd_yaml());
        }
        Cmd::Journal { dir, filter, summary, json } => journal::show(&dir, &filter, summary, json),
        Cmd::Replay { dir } => journal::replay(&dir),
        Cmd::Run {
            job,
            out,
            ps_bin,
            worker_bin,
            torch_threads,
            slow_worker,
            no_progress,
            resume,
            token,
            control_token,
            snapshot_every,
            journal,
        } => {
            let mut opts = RunOptions::beside_current_exe(out);
            opts.ps_bin = ps_bin.unwrap_or(opts.ps_bin);
            opts.worker_bin = worker_bin.unwrap_or(opts.worker_bin);
            opts.torch_threads = torch_threads;
            opts.progress = !no_progress;
            opts.resume = resume;
            opts.token = token;
            opts.control_token = control_token;
            opts.snapshot_every = snapshot_every;
            opts.journal = journal;
            opts.worker_overrides = slow_worker
                .into_iter()
                .map(|(w, f)| (w, "FORESIGHT_SLOWDOWN".into(), f.to_string()))
                .collect();
            let result = match local::load_job(&job) {
                Ok(j) => local::run(&j, &opts).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(s) => {
                    let acc = s.accuracy.map_or("-".into(), |a| format!("{:.2}%", a * 100.0));
                    println!(
                        "{}: {} on {} workers, {:.1}s, {} updates, held-out accuracy {acc}, staleness p50 {} p99 {}",
                        s.job,
                        s.algorithm,
                        s.workers,
                        s.seconds,
                        s.updates,
                        s.staleness["p50"],
                        s.staleness["p99"]
                    );
                    println!(
                        "outputs in {}: summary.json, plot.png, model-final.safetensors",
                        opts.out.display()
                    );
                }
                Err(e) => {
                    eprintln!("foresight run: {e}");
                    std::process::exit(e.exit_code());
                }
            }
        }
    }
}

/// Where the token key comes from.
enum KeySource {
    /// --token-key or --token-key-file, checked before connecting.
    Given(TokenKey),
    /// --token-key-secret: read (or created) once connected.
    Secret(String),
}

/// A token key given inline or in a file (`flag` names the file's flag in errors).
fn given_key(
    inline: Option<&String>,
    file: Option<&PathBuf>,
    flag: &str,
) -> Result<Option<TokenKey>, String> {
    let bytes = match (inline, file) {
        (Some(k), _) => k.as_bytes().to_vec(),
        (None, Some(f)) => std::fs::read(f).map_err(|e| format!("{flag} {}: {e}", f.display()))?,
        (None, None) => return Ok(None),
    };
    TokenKey::new(bytes.trim_ascii()).map(Some).map_err(|e| e.to_string())
}

async fn operator(a: OperatorArgs) -> Result<(), String> {
    let key = match given_key(a.token_key.as_ref(), a.token_key_file.as_ref(), "--token-key-file")? {
        Some(key) => KeySource::Given(key),
        None => match &a.token_key_secret {
            Some(name) => KeySource::Secret(name.clone()),
            None => return Err("set FORESIGHT_TOKEN_KEY (or --token-key-file, or --token-key-secret): the key the job tokens are derived from, e.g. `openssl rand -hex 32`".into()),
        },
    };
    let previous = given_key(
        a.previous_token_key.as_ref(),
        a.previous_token_key_file.as_ref(),
        "--previous-token-key-file",
    )
    .map_err(|e| format!("the previous token key: {e}"))?;
    // An empty FORESIGHT_WATCH_NAMESPACE means every namespace, as when it is unset.
    let watch = controller::Watch::parse(a.namespace.as_deref().unwrap_or_default())?;
    let example_url = a.ps_url.replace("{name}", "job").replace("{namespace}", "default");
    match reqwest::Url::parse(&example_url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
        Ok(_) => return Err(format!("--ps-url {:?} does not make an http(s) URL with a host", a.ps_url)),
        Err(e) => return Err(format!("--ps-url {:?} does not make a URL ({example_url:?}: {e})", a.ps_url)),
    }
    let config = match &a.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| format!("no Kubernetes configuration: {e}"))?,
    };
    let client = kube::Client::try_from(config.clone()).map_err(|e| format!("Kubernetes client: {e}"))?;
    let (token_key, previous_token_key) = match key {
        KeySource::Given(key) => (key, previous),
        KeySource::Secret(name) => {
            let (key, previous) = token::key_from_secret(&client, &a.lease_namespace, &name).await?;
            let bad = |e: token::ShortKey| format!("Secret {}/{name}: {e}", a.lease_namespace);
            (TokenKey::new(&key).map_err(bad)?, previous.map(|p| TokenKey::new(&p).map_err(bad)).transpose()?)
        }
    };
    let lease_duration = Duration::from_secs(a.lease_duration_seconds);
    let lease = a.leader_elect.then(|| LeaseConfig {
        name: a.lease_name.clone(),
        namespace: a.lease_namespace.clone(),
        identity: a.identity.clone().unwrap_or_else(hostname),
        lease_duration,
        renew_deadline: lease_duration * 2 / 3,
        retry_period: lease_duration / 5,
        watch: watch.clone(),
        trusted: std::iter::once(a.lease_namespace.clone())
            .chain(a.trusted_lease_namespaces.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()))
            .collect(),
    });
    if let Some(l) = &lease
        && !controller::claims::claimed_namespaces(l).is_empty()
        && controller::claims::claim_name(l).len() > 253
    {
        return Err(format!(
            "--lease-name {:?}: with --lease-namespace it names this operator's claims in the watched namespaces ({}), longer than a Lease's name may be (253)",
            a.lease_name,
            controller::claims::claim_name(l)
        ));
    }
    let settings = controller::Settings {
        watch,
        defaults: ChildDefaults {
            ps_image: a.ps_image.clone(),
            worker_image: a.worker_image.clone(),
            ps_tls: a.ps_tls,
            secret_suffix: None,
        },
        token_key,
        previous_token_key,
        ps_url: a.ps_url.clone(),
        progress_every: Duration::from_secs(a.progress_seconds),
        finalize_grace: Duration::from_secs(a.finalize_grace_seconds),
        stuck_pods_timeout: Duration::from_secs(a.stuck_pods_timeout_seconds),
        max_concurrent_reconciles: a.max_concurrent_reconciles,
        kueue: a.kueue,
        kueue_required: a.kueue_required,
        ps_ingress_from: a.ps_network_policy.clone().map(|p| p.0),
        lease,
    };
    controller::run(config, settings, &a.metrics_addr).await
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("foresight-operator-{}", std::process::id()))
}
