//! `foresight-loadgen`: M simulated workers training a synthetic model against a running PS.
//!
//! The objective is a noisy quadratic f(w) = ½·Σ h_i (w_i − w*_i)², with curvatures h_i in
//! [0.5, 2]: cheap enough to run thousands of steps per second on any size of model, with a
//! loss that shows whether staleness and delay compensation help or hurt. Each worker pulls,
//! computes a gradient at the model it pulled, and pushes it, as a real worker would; against a
//! sharded PS (`--ps` with the shards' URLs) every pull and push goes to every shard at once,
//! each with its slice (`wire::shards`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use foresight_ps::client::{
    Base, ClientError, ExpectedModel, GradDtype, Model, PsClient, PullDtype, PushId, PushReply,
};
use foresight_ps::wire::protocol::Report;
use foresight_ps::wire::shards::ShardMap;
use foresight_ps::wire::{Layout, TensorSpec};
use futures_util::future::join_all;
use rand::{Rng, SeedableRng};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Drive a Foresight parameter server with simulated workers on a synthetic quadratic model.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// PS base URL (http:// for h2c, https:// for TLS); for a sharded PS, the shards' URLs in
    /// shard order, separated by commas.
    #[arg(long, env = "FORESIGHT_PS_URL", default_value = "http://127.0.0.1:8080")]
    ps: String,
    /// PEM certificates trusted for an https:// --ps.
    #[arg(long, env = "FORESIGHT_PS_CA_FILE")]
    ps_ca_file: Option<std::path::PathBuf>,
    /// Bearer token.
    #[arg(long, env = "FORESIGHT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Simulated workers (ids 0..workers), each a concurrent task.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Model size in f32 parameters.
    #[arg(long, default_value_t = 1_000_000)]
    params: usize,
    /// Pushes per worker.
    #[arg(long, default_value_t = 200)]
    steps: u64,
    /// Standard deviation of the gradient noise.
    #[arg(long, default_value_t = 0.1)]
    noise: f32,
    /// Gradient wire type.
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    dtype: Dtype,
    /// The type the model is pulled in (int8: the difference from each worker's copy, which
    /// the PS tracks).
    #[arg(long, value_enum, default_value_t = PullType::F32)]
    pull_dtype: PullType,
    /// Call /v1/finalize at the end.
    #[arg(long)]
    finalize: bool,
    /// Long-poll wait for `sync` rounds, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    wait_ms: u64,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Dtype {
    F32,
    Bf16,
    Int8,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PullType {
    F32,
    Bf16,
    Int8,
}

struct Problem {
    curvature: Vec<f32>,
    optimum: Vec<f32>,
}

impl Problem {
    fn new(n: usize) -> Self {
        Self {
            curvature: (0..n).map(|i| 0.5 + 1.5 * ((i * 7919) % 1000) as f32 / 1000.0).collect(),
            optimum: (0..n).map(|i| (i as f32 * 0.001).sin()).collect(),
        }
    }

    fn loss(&self, w: &[f32]) -> f64 {
        let s: f64 = w
            .iter()
            .zip(&self.optimum)
            .zip(&self.curvature)
            .map(|((w, o), h)| f64::from(h * (w - o) * (w - o)))
            .sum();
        0.5 * s / w.len() as f64
    }

    fn gradient(&self, w: &[f32], noise: f32, rng: &mut impl Rng, out: &mut [f32]) {
        for i in 0..w.len() {
            let n: f32 = if noise > 0.0 { rng.random_range(-noise..noise) } else { 0.0 };
            out[i] = self.curvature[i] * (w[i] - self.optimum[i]) + n;
        }
    }
}

/// The PS's shards (one for an unsharded PS): a client and a slice of the model each.
struct Shards {
    clients: Vec<PsClient>,
    map: ShardMap,
    /// Each shard's slice as pulled (its layout, in the job's pull type).
    expected: Vec<ExpectedModel>,
    pull_dtype: PullDtype,
}

/// What a worker holds of each shard's slice, for int8 pulls to be differences from.
type Copies = Vec<Option<Model>>;

/// A model pulled from every shard: each shard's version, and the whole vector.
struct Pulled {
    versions: Vec<u64>,
    values: Vec<f32>,
}

impl Shards {
    async fn register(&self, values: &[f32]) -> Result<bool, ClientError> {
        let all = join_all(
            self.clients
                .iter()
                .enumerate()
                .map(|(i, c)| c.register(self.map.layout(i), &values[self.map.range(i)])),
        );
        Ok(all.await.into_iter().collect::<Result<Vec<_>, _>>()?.into_iter().any(|r| r))
    }

    /// `None` when a `sync` long-poll ran out on some shard. `held` is what this worker holds
    /// of each shard, and becomes what it pulled.
    async fn pull(
        &self,
        m: usize,
        min: Option<&[u64]>,
        wait: Duration,
        held: &mut Copies,
    ) -> Result<Option<Pulled>, ClientError> {
        held.resize_with(self.clients.len(), || None);
        let all = join_all(self.clients.iter().zip(&self.expected).zip(held.iter()).enumerate().map(
            |(i, ((c, e), h))| {
                let base = h.as_ref().and_then(|h| h.copy.map(|tag| Base { tag, values: &h.values }));
                c.pull_against(m, min.map(|v| v[i]), wait, Some(e), Vec::new(), base)
            },
        ));
        let Some(slices) = all.await.into_iter().collect::<Result<Option<Vec<_>>, _>>()? else {
            return Ok(None);
        };
        let mut values = Vec::with_capacity(slices.iter().map(|s| s.values.len()).sum());
        for s in &slices {
            values.extend_from_slice(&s.values);
        }
        let versions = slices.iter().map(|s| s.version).collect();
        // Kept only for int8 pulls: other pulls need no copy, and the memory is the client's.
        if self.pull_dtype == PullDtype::Int8 {
            *held = slices.into_iter().map(Some).collect();
        }
        Ok(Some(Pulled { versions, values }))
    }

    /// Pushes every shard its slice of `grad`, each computed on its version; a shard at its push
    /// slots (its memory limit) says when to come back. The replies, and the busy answers met.
    async fn push(
        &self,
        m: usize,
        versions: &[u64],
        seq: u64,
        grad: &[f32],
        dtype: GradDtype,
    ) -> Result<(Vec<PushReply>, u64), ClientError> {
        let one = |i: usize| async move {
            let (layout, slice) = (self.map.layout(i), &grad[self.map.range(i)]);
            let mut busy = 0;
            loop {
                match self.clients[i]
                    .push(PushId::unjoined(m, versions[i], seq), None, layout, slice, dtype)
                    .await
                {
                    Err(e) if e.reason() == Some("busy") => {
                        busy += 1;
                        tokio::time::sleep(e.retry_after().unwrap_or(Duration::from_secs(1))).await;
                    }
                    other => return other.map(|r| (r, busy)),
                }
            }
        };
        let all =
            join_all((0..self.clients.len()).map(one)).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        let busy = all.iter().map(|(_, b)| b).sum();
        Ok((all.into_iter().map(|(r, _)| r).collect(), busy))
    }
}

#[derive(Default)]
struct WorkerStats {
    /// Pushes answered `503 busy` (and retried).
    busy: u64,
    latencies: Vec<Duration>,
    pulls: Vec<Duration>,
    staleness: Vec<u64>,
    last_loss: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.workers > 0 && args.params > 0 && args.steps > 0,
        "workers, params and steps must be > 0"
    );
    let tls = args.ps_ca_file.as_deref().map(foresight_ps::client::ClientTls::from_pem_file).transpose()?;
    let clients = PsClient::for_shards(&args.ps, args.token.clone(), tls.as_ref())?;
    let client = clients[0].clone();
    let layout = Layout::new(vec![TensorSpec { name: "quadratic.weight".into(), shape: vec![args.params] }])?;
    let map = ShardMap::new(&layout, clients.len())?;
    let pull_dtype = match args.pull_dtype {
        PullType::F32 => PullDtype::F32,
        PullType::Bf16 => PullDtype::Bf16,
        PullType::Int8 => PullDtype::Int8,
    };
    let expected =
        (0..map.count()).map(|i| ExpectedModel::pulled_as(map.layout(i).clone(), pull_dtype)).collect();
    let shards = Arc::new(Shards { clients, map, expected, pull_dtype });
    let registering = Instant::now();
    let registered = shards.register(&vec![0.0; args.params]).await.context("registering the model")?;
    println!(
        "model {} ({} parameters, {} shards) in {:.3}s",
        if registered { "registered" } else { "already registered" },
        args.params,
        shards.map.count(),
        registering.elapsed().as_secs_f64()
    );
    let problem = Arc::new(Problem::new(args.params));
    let dtype = match args.dtype {
        Dtype::F32 => GradDtype::F32,
        Dtype::Bf16 => GradDtype::Bf16,
        Dtype::Int8 => GradDtype::Int8,
    };
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.workers)
        .map(|m| {
            let (shards, problem, client) = (shards.clone(), problem.clone(), client.clone());
            let (steps, noise, wait) = (args.steps, args.noise, Duration::from_millis(args.wait_ms));
            tokio::spawn(
                async move { run_worker(m, &shards, &client, problem, steps, noise, dtype, wait).await },
            )
        })
        .collect();
    let mut all = WorkerStats::default();
    for t in tasks {
        let s = t.await??;
        all.busy += s.busy;
        all.latencies.extend(s.latencies);
        all.pulls.extend(s.pulls);
        all.staleness.extend(s.staleness);
        all.last_loss = all.last_loss.max(s.last_loss);
    }
    let elapsed = started.elapsed();
    all.latencies.sort();
    all.pulls.sort();
    all.staleness.sort();
    let pct = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    let n = all.latencies.len();
    println!(
        "pushes {n} in {:.2}s: {:.1} pushes/s, push latency p50 {:.2} ms p99 {:.2} ms",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64(),
        pct(&all.latencies, 0.5).as_secs_f64() * 1e3,
        pct(&all.latencies, 0.99).as_secs_f64() * 1e3
    );
    println!("pushes refused busy and retried: {}", all.busy);
    println!(
        "pull latency p50 {:.2} ms p99 {:.2} ms",
        pct(&all.pulls, 0.5).as_secs_f64() * 1e3,
        pct(&all.pulls, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "staleness p50 {} p99 {} max {}",
        all.staleness[(n - 1) / 2],
        all.staleness[((n - 1) as f64 * 0.99) as usize],
        all.staleness[n - 1]
    );
    let status = client.status().await?;
    println!("ps status: version {} staleness {}", status["version"], status["staleness"]);
    let model =
        shards.pull(0, None, Duration::ZERO, &mut Copies::new()).await?.context("pull returned nothing")?;
    println!(
        "final loss {:.6} (initial {:.6})",
        problem.loss(&model.values),
        problem.loss(&vec![0.0; args.params])
    );
    if args.finalize {
        println!("finalized: {}", serde_json::to_string(&client.finalize().await?)?);
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run_worker(
    m: usize,
    shards: &Shards,
    first: &PsClient,
    problem: Arc<Problem>,
    steps: u64,
    noise: f32,
    dtype: GradDtype,
    wait: Duration,
) -> anyhow::Result<WorkerStats> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(m as u64);
    let mut grad = vec![0.0; problem.optimum.len()];
    let mut stats = WorkerStats::default();
    let mut min_versions: Option<Vec<u64>> = None;
    let mut held = Copies::new();
    for seq in 1..=steps {
        let pulling = Instant::now();
        let model = loop {
            // Under `sync` the next version exists only once every worker has pushed: long-poll.
            if let Some(model) = shards.pull(m, min_versions.as_deref(), wait, &mut held).await? {
                break model;
            }
        };
        stats.pulls.push(pulling.elapsed());
        let w = model.values;
        problem.gradient(&w, noise, &mut rng, &mut grad);
        let t = Instant::now();
        let (replies, busy) = shards.push(m, &model.versions, seq, &grad, dtype).await?;
        stats.busy += busy;
        stats.latencies.push(t.elapsed());
        stats.staleness.push(replies.iter().map(|r| r.staleness).max().unwrap_or(0));
        min_versions =
            Some(replies.iter().map(|r| if r.applied { r.version } else { r.version + 1 }).collect());
        if seq % 20 == 0 || seq == steps {
            stats.last_loss = problem.loss(&w);
            let report = Report {
                worker: m,
                step: seq,
                epoch: seq as f64 / steps as f64,
                loss: stats.last_loss,
                accuracy: None,
                samples_per_second: None,
            };
            first.report(&report).await?;
        }
    }
    Ok(stats)
}
