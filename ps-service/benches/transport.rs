//! The parameter server over loopback HTTP/2, against raw TCP measured in the same run.
//!
//! `cargo bench -p foresight-ps --bench transport`
//!
//! 1. Memory against worker count: a 1M-parameter `dc-asgd-a` model with M = 1, 4, 16, 64
//!    workers, each holding a backup of a different version (pull/push interleaved), against
//!    all M pulling the same version (one shared snapshot).
//! 2. 1 / 8 / 64 concurrent pushers on a 1M-parameter `dc-asgd-a` model, each pulling then
//!    pushing like `foresight-loadgen`: updates/s, p50/p99 push latency, PS memory.
//! 3. Push + apply round trips of 1M / 10M / 25M f32 parameters (`asgd`) against the same bytes
//!    over a raw loopback `TcpStream`, with an HTTP/2 sink on the PS's `serve` that only receives
//!    (drains, or collects like the PS), a prototype of a receive path that decodes frames as they
//!    arrive (a proposal, not the PS), and the decode and apply stages timed in-process, all
//!    interleaved round-robin; ratios are medians of per-round ratios. Pulls of each new
//!    version too: F32, bf16, and int8 differences from the puller's copy.
//!
//! Sections 1 and 2 run each PS in a child process (this binary re-executed), which reads its
//! own `/proc/self/status` and reports VmRSS and VmHWM against a baseline taken before the
//! server starts: the clients (each holding pulled models and gradient bodies) run in this
//! process, so their memory is not counted as the PS's. Section 3 runs the server in-process.
//!
//! Without `--bench` (e.g. `cargo test --benches`) a small smoke version runs instead. Names
//! after `--` (`memory`, `pushers`, `throughput`) run those sections alone.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use bytes::Bytes;
use foresight_ps::client::{
    Base, ExpectedModel, GradDtype, PsClient, PullDtype, PushId, encode_gradient, encode_gradient_into,
};
use foresight_ps::optimizer::{Algorithm, Hyper};
use foresight_ps::server::{AppState, Listener, PsConfig, router, serve};
use foresight_ps::store::{Push, Store};
use foresight_ps::wire::{self, Layout, TensorSpec};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Barrier, oneshot};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROLE_ENV: &str = "FORESIGHT_BENCH_ROLE";
const LR: f32 = 1e-3;
/// Gradient values: small enough that thousands of updates keep the model finite.
const GRAD: f32 = 1e-3;

fn main() -> anyhow::Result<()> {
    if std::env::var(ROLE_ENV).as_deref() == Ok("ps") {
        return ps_child();
    }
    let full = std::env::args().any(|a| a == "--bench");
    // `cargo bench --bench transport -- throughput` runs that section alone.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(full, &only))
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// A field of /proc/self/status in kB (VmRSS, VmHWM).
fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds of this process (clock ticks at 100 Hz).
fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

fn layout(n: usize) -> Layout {
    Layout::new(vec![TensorSpec { name: "model.weight".into(), shape: vec![n] }]).expect("valid layout")
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn label(n: usize) -> String {
    format!("{}M", n / 1_000_000)
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn url(addr: std::net::SocketAddr) -> String {
    format!("http://{addr}")
}

// ---------------------------------------------------------------------------------------------
// The PS in a child process, for memory figures that hold the PS alone.

/// Child side: a PS on 127.0.0.1:0; answers `sample` on stdin with its memory, exits on `quit`.
fn ps_child() -> anyhow::Result<()> {
    let algorithm: Algorithm = std::env::var("FORESIGHT_BENCH_ALGO")?.parse()?;
    let workers: usize = std::env::var("FORESIGHT_BENCH_WORKERS")?.parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let baseline = status_kb("VmRSS");
        let state = AppState::new(PsConfig::new(Hyper::new(algorithm, LR), workers))?;
        let listener = Listener::bind("127.0.0.1:0", None, None).await?;
        let addr = listener.local_addr()?;
        tokio::spawn(serve(listener, router(state.clone()), std::future::pending()));
        println!("ready {addr} {baseline}");
        std::io::stdout().flush()?;
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line.as_deref() {
                    Ok("sample") => {
                        let snaps = state.store().map_or(0, |s| s.snapshots_held());
                        let version = state.store().map_or(0, |s| s.version());
                        println!(
                            "sample {} {} {} {} {}",
                            status_kb("VmRSS"),
                            status_kb("VmHWM"),
                            snaps,
                            version,
                            cpu_seconds()
                        );
                        let _ = std::io::stdout().flush();
                    }
                    _ => break,
                }
            }
            std::process::exit(0);
        });
        std::future::pending::<anyhow::Result<()>>().await
    })
}

/// What the child PS reports.
#[derive(Clone, Copy, Debug)]
struct PsSample {
    rss_kb: u64,
    hwm_kb: u64,
    snapshots: usize,
    version: u64,
    cpu_s: f64,
}

/// Parent side of a child PS.
struct PsChild {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    url: String,
    baseline_kb: u64,
}

impl PsChild {
    fn spawn(algorithm: Algorithm, workers: usize) -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(ROLE_ENV, "ps")
            .env("FORESIGHT_BENCH_ALGO", algorithm.as_str())
            .env("FORESIGHT_BENCH_WORKERS", workers.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the PS child process")?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let f: Vec<&str> = line.split_whitespace().collect();
        ensure!(f.len() == 3 && f[0] == "ready", "unexpected PS child output {line:?}");
        Ok(Self { child, stdin, stdout, url: format!("http://{}", f[1]), baseline_kb: f[2].parse()? })
    }

    fn sample(&mut self) -> anyhow::Result<PsSample> {
        tokio::task::block_in_place(|| {
            writeln!(self.stdin, "sample")?;
            self.stdin.flush()?;
            let mut line = String::new();
            self.stdout.read_line(&mut line)?;
            let f: Vec<&str> = line.split_whitespace().collect();
            ensure!(f.len() == 6 && f[0] == "sample", "unexpected PS child output {line:?}");
            Ok(PsSample {
                rss_kb: f[1].parse()?,
                hwm_kb: f[2].parse()?,
                snapshots: f[3].parse()?,
                version: f[4].parse()?,
                cpu_s: f[5].parse()?,
            })
        })
    }
}

impl Drop for PsChild {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------

async fn run(full: bool, only: &[String]) -> anyhow::Result<()> {
    let wanted = |section: &str| only.is_empty() || only.iter().any(|o| o == section);
    println!("transport bench ({} run)", if full { "full" } else { "smoke" });
    println!(
        "machine: {} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim().to_string()))
            .unwrap_or_default()
    );
    if wanted("memory") {
        let ms: &[usize] = if full { &[1, 4, 16, 64] } else { &[1, 4] };
        memory_vs_workers(ms).await?;
    }
    if wanted("pushers") {
        let (pushers, secs): (&[usize], f64) = if full { (&[1, 8, 64], 6.0) } else { (&[1, 8], 0.5) };
        concurrent_pushers(pushers, secs).await?;
    }
    if wanted("throughput") {
        let sizes: &[(usize, usize)] =
            if full { &[(1_000_000, 40), (10_000_000, 12), (25_000_000, 10)] } else { &[(1_000_000, 3)] };
        throughput(sizes).await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 1. Memory against worker count

async fn memory_vs_workers(ms: &[usize]) -> anyhow::Result<()> {
    const N: usize = 1_000_000;
    let model_mib = (N * 4) as f64 / (1 << 20) as f64;
    println!();
    println!("== PS memory vs workers: {} dc-asgd-a model ({model_mib:.2} MiB a copy) ==", label(N));
    println!("   (delta = VmRSS of the PS process minus its VmRSS before the server started)");
    let lay = layout(N);
    let body = wire::encode_f32(&lay, &vec![GRAD; N], &Default::default());
    for &m in ms {
        for distinct in [true, false] {
            let mut ps = PsChild::spawn(Algorithm::DcAsgdA, m)?;
            let client = PsClient::new(&ps.url, None)?;
            client.register(&lay, &vec![0.5; N]).await?;
            let registered = ps.sample()?;
            for w in 0..m {
                let model = client.pull(w, None, Duration::ZERO).await?.context("pull returned nothing")?;
                if distinct {
                    // The next worker pulls the version this push makes: every backup differs.
                    client.push_encoded(PushId::unjoined(w, model.version, 1), None, body.clone()).await?;
                }
            }
            let s = ps.sample()?;
            let base = ps.baseline_kb;
            println!(
                "  M={m:<3} {:<22} snapshots held {:>3}  PS RSS delta {:>7.1} MiB (after register {:>6.1} MiB)  peak {:>7.1} MiB  version {}",
                if distinct { "backups at M versions" } else { "all at one version" },
                s.snapshots,
                mib(s.rss_kb.saturating_sub(base)),
                mib(registered.rss_kb.saturating_sub(base)),
                mib(s.hwm_kb.saturating_sub(base)),
                s.version,
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. Concurrent pushers

async fn concurrent_pushers(ks: &[usize], secs: f64) -> anyhow::Result<()> {
    const N: usize = 1_000_000;
    println!();
    println!(
        "== concurrent pushers: {} dc-asgd-a, each pulls then pushes (one h2 connection), {secs} s ==",
        label(N)
    );
    let lay = layout(N);
    let body = wire::encode_f32(&lay, &vec![GRAD; N], &Default::default());
    for &k in ks {
        let mut ps = PsChild::spawn(Algorithm::DcAsgdA, k)?;
        let client = PsClient::new(&ps.url, None)?;
        client.register(&lay, &vec![0.5; N]).await?;
        let barrier = Arc::new(Barrier::new(k + 1));
        let tasks: Vec<_> = (0..k)
            .map(|w| {
                let (client, body, barrier) = (client.clone(), body.clone(), barrier.clone());
                tokio::spawn(async move { pusher(w, client, body, barrier, secs).await })
            })
            .collect();
        barrier.wait().await;
        let before = ps.sample()?;
        let (started, cpu0) = (Instant::now(), cpu_seconds());
        let mut push_lat = Vec::new();
        let mut pull_lat = Vec::new();
        let mut ended = started;
        for t in tasks {
            let (pushes, pulls, end) = t.await??;
            push_lat.extend(pushes);
            pull_lat.extend(pulls);
            ended = ended.max(end);
        }
        let elapsed = ended.duration_since(started).as_secs_f64();
        let client_cpu = cpu_seconds() - cpu0;
        let s = ps.sample()?;
        let n = push_lat.len();
        ensure!(n > 0, "no pushes completed");
        let updates = s.version - before.version;
        println!(
            "  {k:>2} pushers: {n:>5} pushes in {elapsed:.2} s = {:>6.1} updates/s; push p50 {:>7.2} ms p99 {:>7.2} ms; pull p50 {:>7.2} ms p99 {:>7.2} ms",
            n as f64 / elapsed,
            median(&push_lat) * 1e3,
            quantile(&push_lat, 0.99) * 1e3,
            median(&pull_lat) * 1e3,
            quantile(&pull_lat, 0.99) * 1e3,
        );
        println!(
            "              PS RSS delta {:>6.1} MiB at end, peak {:>6.1} MiB; snapshots held {}; CPU: PS {:.2} cores, clients {:.2} cores; model versions +{updates}",
            mib(s.rss_kb.saturating_sub(ps.baseline_kb)),
            mib(s.hwm_kb.saturating_sub(ps.baseline_kb)),
            s.snapshots,
            (s.cpu_s - before.cpu_s) / elapsed,
            client_cpu / elapsed,
        );
    }
    Ok(())
}

/// One simulated worker: a warm-up pull/push, then pull/push until `secs` after the barrier.
/// Returns push and pull latencies (s) and when it finished.
async fn pusher(
    w: usize,
    client: PsClient,
    body: Vec<u8>,
    barrier: Arc<Barrier>,
    secs: f64,
) -> anyhow::Result<(Vec<f64>, Vec<f64>, Instant)> {
    let mut seq = 0;
    let step = async |seq: u64| -> anyhow::Result<(f64, f64)> {
        let t = Instant::now();
        let model = client.pull(w, None, Duration::ZERO).await?.context("pull returned nothing")?;
        let pulled = t.elapsed().as_secs_f64();
        let b = body.clone();
        let t = Instant::now();
        client.push_encoded(PushId::unjoined(w, model.version, seq), None, b).await?;
        Ok((t.elapsed().as_secs_f64(), pulled))
    };
    seq += 1;
    step(seq).await?;
    barrier.wait().await;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let (mut pushes, mut pulls) = (Vec::new(), Vec::new());
    while Instant::now() < deadline {
        seq += 1;
        let (push, pull) = step(seq).await?;
        pushes.push(push);
        pulls.push(pull);
    }
    Ok((pushes, pulls, Instant::now()))
}

// ---------------------------------------------------------------------------------------------
// 3. Throughput against raw TCP

/// Raw TCP limit: accept, read to end into a reused buffer, ack one byte.
async fn raw_tcp_server(listener: TcpListener) {
    let mut buf = Vec::new();
    while let Ok((mut s, _)) = listener.accept().await {
        let _ = s.set_nodelay(true);
        buf.clear();
        if s.read_to_end(&mut buf).await.is_ok() {
            let _ = s.write_all(&[1]).await;
        }
    }
}

async fn raw_tcp_send(addr: std::net::SocketAddr, body: &[u8]) -> anyhow::Result<()> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_all(body).await?;
    s.shutdown().await?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).await?;
    Ok(())
}

/// State of the HTTP/2 sink for one model size.
struct Sink {
    pool: Mutex<Vec<Vec<u8>>>,
    /// The header `wire::encode_f32` writes for the layout.
    header: Vec<u8>,
    store: Store,
    grad: tokio::sync::Mutex<Vec<f32>>,
    seq: AtomicU64,
}

/// An HTTP/2 sink on the PS's serve settings (same `serve`, so the same windows and frame size):
/// `/drain` only counts the bytes; `/collect` gathers the body into a reused buffer the way the
/// PS's handlers do; `/stream-apply` is the proposed receive path, a prototype and not the PS:
/// it checks the header and widens each frame into the gradient buffer as it arrives, then
/// applies it with `Store::push` once the whole body has been received and checked.
fn sink_router(n: usize) -> Router {
    async fn collect(State(sink): State<Arc<Sink>>, headers: HeaderMap, body: Body) -> String {
        let mut buf = sink.pool.lock().pop().unwrap_or_default();
        buf.clear();
        let declared = headers.get("content-length").and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        if let Some(n) = declared {
            buf.reserve(n);
        }
        let mut body = body;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(chunk) = frame.into_data() {
                buf.extend_from_slice(&chunk);
            }
        }
        let n = buf.len();
        sink.pool.lock().push(buf);
        n.to_string()
    }
    async fn drain(body: Body) -> String {
        let mut body = body;
        let mut n = 0;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(chunk) = frame.into_data() {
                n += chunk.len();
            }
        }
        n.to_string()
    }
    async fn stream_apply(State(sink): State<Arc<Sink>>, body: Body) -> Result<String, String> {
        let mut grad = sink.grad.lock().await;
        let n = grad.len();
        let header = &sink.header;
        let (mut seen, mut pos, mut carry, mut partial, mut finite) = (0, 0, [0u8; 4], 0, true);
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let Ok(chunk) = frame.map_err(|e| e.to_string())?.into_data() else { continue };
            let mut b: &[u8] = &chunk;
            if seen < header.len() {
                let k = (header.len() - seen).min(b.len());
                if b[..k] != header[seen..seen + k] {
                    return Err("not the layout's header".into());
                }
                seen += k;
                b = &b[k..];
            }
            if partial > 0 && !b.is_empty() {
                let k = (4 - partial).min(b.len());
                carry[partial..partial + k].copy_from_slice(&b[..k]);
                (partial, b) = (partial + k, &b[k..]);
                if partial == 4 {
                    let x = f32::from_le_bytes(carry);
                    *grad.get_mut(pos).ok_or("body too long")? = x;
                    finite &= x.is_finite();
                    (pos, partial) = (pos + 1, 0);
                }
            }
            let whole = b.len() / 4;
            let out = grad.get_mut(pos..pos + whole).ok_or("body too long")?;
            // Little-endian f32 on the wire is the in-memory layout: a copy, then a branch-free
            // finite check of each 256 KiB piece while it is still in L2.
            for (o, x) in out.chunks_mut(1 << 16).zip(b[..whole * 4].chunks(1 << 18)) {
                bytemuck::cast_slice_mut::<f32, u8>(o).copy_from_slice(x);
                finite &= o.iter().fold(true, |ok, v| ok & v.is_finite());
            }
            pos += whole;
            let rest = &b[whole * 4..];
            if !rest.is_empty() {
                // Only when the carry was completed above: otherwise `b` is empty by now.
                carry[..rest.len()].copy_from_slice(rest);
                partial = rest.len();
            }
        }
        if pos != n || partial != 0 || !finite {
            return Err(format!("bad body: {pos} of {n} values, finite {finite}"));
        }
        let seq = sink.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let p = Push { worker: 0, generation: None, version: 0, seq, epoch: None, body: None };
        let o = tokio::task::block_in_place(|| sink.store.push(p, &grad)).map_err(|e| e.to_string())?;
        if !o.applied {
            return Err("not applied".into());
        }
        Ok((header.len() + 4 * n).to_string())
    }
    let lay = layout(n);
    let sink = Sink {
        pool: Mutex::new(Vec::new()),
        header: wire::header(&lay, wire::WireDtype::F32, &Default::default()),
        store: Store::new(lay, vec![0.5; n], Hyper::new(Algorithm::Asgd, LR), 1),
        grad: tokio::sync::Mutex::new(vec![0.0; n]),
        seq: AtomicU64::new(0),
    };
    Router::new()
        .route("/collect", post(collect))
        .route("/drain", post(drain))
        .route("/stream-apply", post(stream_apply))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(Arc::new(sink))
}

/// A reqwest client with PsClient's HTTP/2 settings, for the sink.
fn h2_client() -> anyhow::Result<reqwest::Client> {
    foresight_ps::client::install_crypto_provider();
    Ok(reqwest::Client::builder()
        .http2_prior_knowledge()
        .http2_initial_stream_window_size(64 << 20)
        .http2_initial_connection_window_size(128 << 20)
        .http2_max_frame_size(16_777_215)
        .tcp_nodelay(true)
        .build()?)
}

async fn sink_send(http: &reqwest::Client, url: &str, body: Bytes) -> anyhow::Result<()> {
    let expect = body.len();
    let r = http.post(url).body(body).send().await?.error_for_status()?;
    let got: usize = r.text().await?.parse()?;
    ensure!(got == expect, "sink received {got} of {expect} bytes");
    Ok(())
}

/// What each round times, in order of presentation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage {
    RawTcp,
    H2Drain,
    H2Collect,
    H2StreamApply,
    PsPush,
    PsPushBf16,
    PsPull,
    Decode,
    Apply,
    EncodeF32Fresh,
    EncodeF32,
    EncodeBf16,
    PsPullBf16,
    PsPullInt8,
}

impl Stage {
    const ALL: [Stage; 14] = [
        Stage::RawTcp,
        Stage::H2Drain,
        Stage::H2Collect,
        Stage::H2StreamApply,
        Stage::PsPush,
        Stage::PsPushBf16,
        Stage::PsPull,
        Stage::PsPullBf16,
        Stage::PsPullInt8,
        Stage::Decode,
        Stage::Apply,
        Stage::EncodeF32Fresh,
        Stage::EncodeF32,
        Stage::EncodeBf16,
    ];

    fn describe(self) -> &'static str {
        match self {
            Stage::RawTcp => "raw TCP (write all, read to end, 1-byte ack)",
            Stage::H2Drain => "HTTP/2 sink, body consumed chunk by chunk",
            Stage::H2Collect => "HTTP/2 sink, body collected into a buffer",
            Stage::H2StreamApply => "prototype: decode as frames arrive + Store::push",
            Stage::PsPush => "PS push + apply (asgd) over HTTP/2",
            Stage::PsPushBf16 => "PS push + apply of a bf16 gradient (body rounded before)",
            Stage::PsPull => "PS pull of a new version, decoded to f32",
            Stage::PsPullBf16 => "PS pull of a new version as bf16, widened to f32",
            Stage::PsPullInt8 => "PS pull of a new version as int8 difference, added",
            Stage::Decode => "in-process: wire::decode_gradient",
            Stage::Apply => "in-process: Store::push (asgd apply)",
            Stage::EncodeF32Fresh => "in-process: an F32 body into a fresh buffer",
            Stage::EncodeF32 => "in-process: a worker's F32 body, into its last",
            Stage::EncodeBf16 => "in-process: a worker's bf16 body, into its last",
        }
    }
}

struct Servers {
    shutdowns: Vec<oneshot::Sender<()>>,
}

impl Servers {
    fn spawn(&mut self, listener: Listener, app: Router) {
        let (tx, rx) = oneshot::channel::<()>();
        self.shutdowns.push(tx);
        tokio::spawn(serve(listener, app, async move {
            let _ = rx.await;
        }));
    }
}

async fn throughput(sizes: &[(usize, usize)]) -> anyhow::Result<()> {
    println!();
    println!(
        "== push throughput vs raw TCP (in-process server, loopback; medians, ratios = median of per-round ratios [p25, p75]) =="
    );
    let raw = TcpListener::bind("127.0.0.1:0").await?;
    let raw_addr = raw.local_addr()?;
    tokio::spawn(raw_tcp_server(raw));
    let mut servers = Servers { shutdowns: Vec::new() };
    let http = h2_client()?;
    for &(n, rounds) in sizes {
        let sink = Listener::bind("127.0.0.1:0", None, None).await?;
        let sink_url = url(sink.local_addr()?);
        servers.spawn(sink, sink_router(n));
        let lay = layout(n);
        let grad = vec![GRAD; n];
        let body = wire::encode_f32(&lay, &grad, &Default::default());
        let bytes = Bytes::from(body.clone());
        let bf16_body = encode_gradient(&lay, &grad, GradDtype::Bf16);
        let (mut last_f32, mut last_bf16) = (Vec::new(), Vec::new());
        let state = AppState::new(PsConfig::new(Hyper::new(Algorithm::Asgd, LR), 1))?;
        let listener = Listener::bind("127.0.0.1:0", None, None).await?;
        let ps_url = url(listener.local_addr()?);
        servers.spawn(listener, router(state.clone()));
        let client = PsClient::new(&ps_url, None)?;
        client.register(&lay, &vec![0.5; n]).await?;
        let expected = ExpectedModel::new(lay.clone());
        let expected_bf16 = ExpectedModel::pulled_as(lay.clone(), PullDtype::Bf16);
        let expected_int8 = ExpectedModel::pulled_as(lay.clone(), PullDtype::Int8);
        // In-process stages: the same work the push handler does after the body has arrived.
        let store = Store::new(lay.clone(), vec![0.5; n], Hyper::new(Algorithm::Asgd, LR), 1);
        let mut decoded = vec![0f32; n];
        // The last pull's values: the next pull is read into them.
        let (mut pulled, mut pulled_bf16) = (Vec::new(), Vec::new());
        // The int8 puller's copy (its tag, its values) and the buffer its next pull is read into.
        let (mut held_int8, mut spare_int8): (Option<(u64, Vec<f32>)>, Vec<f32>) = (None, Vec::new());
        let mut seq = 0u64;
        let mut times = vec![Vec::new(); Stage::ALL.len()];
        // Round 0 warms every path (connections, buffers, page faults) and is not recorded.
        for r in 0..=rounds {
            for k in 0..Stage::ALL.len() {
                let i = (k + r) % Stage::ALL.len();
                let stage = Stage::ALL[i];
                let owned = match stage {
                    Stage::PsPush => Some(body.clone()),
                    Stage::PsPushBf16 => Some(bf16_body.clone()),
                    _ => None,
                };
                seq += 1;
                let t = Instant::now();
                match stage {
                    Stage::RawTcp => raw_tcp_send(raw_addr, &bytes).await?,
                    Stage::H2Drain => sink_send(&http, &format!("{sink_url}/drain"), bytes.clone()).await?,
                    Stage::H2Collect => {
                        sink_send(&http, &format!("{sink_url}/collect"), bytes.clone()).await?
                    }
                    Stage::H2StreamApply => {
                        sink_send(&http, &format!("{sink_url}/stream-apply"), bytes.clone()).await?
                    }
                    Stage::PsPush => {
                        let reply = client
                            .push_encoded(PushId::unjoined(0, 0, seq), None, owned.expect("body"))
                            .await?;
                        ensure!(reply.applied && !reply.replayed, "push not applied: {reply:?}");
                    }
                    Stage::PsPushBf16 => {
                        let id = PushId::unjoined(0, 0, seq);
                        let reply = client.push_encoded(id, None, owned.expect("body")).await?;
                        ensure!(reply.applied && !reply.replayed, "bf16 push not applied: {reply:?}");
                    }
                    Stage::EncodeF32Fresh => {
                        // What a worker did before its link recycled its bodies.
                        let fresh =
                            tokio::task::block_in_place(|| encode_gradient(&lay, &grad, GradDtype::F32));
                        ensure!(fresh.len() == body.len(), "F32 body of {} bytes", fresh.len());
                    }
                    Stage::EncodeF32 | Stage::EncodeBf16 => {
                        // Into the last body of its type, as a worker's link does.
                        let (dtype, len, last) = match stage {
                            Stage::EncodeF32 => (GradDtype::F32, body.len(), &mut last_f32),
                            _ => (GradDtype::Bf16, bf16_body.len(), &mut last_bf16),
                        };
                        let old = std::mem::take(last);
                        *last = tokio::task::block_in_place(|| encode_gradient_into(&lay, &grad, dtype, old));
                        ensure!(last.len() == len, "{dtype:?} body of {} bytes", last.len());
                    }
                    Stage::PsPull => {
                        // Each round's push made a new version: the PS copies it out first.
                        // Into the last round's buffer, as a worker's link does.
                        let reuse = std::mem::take(&mut pulled);
                        let model = client
                            .pull_expecting(0, None, Duration::ZERO, Some(&expected), reuse)
                            .await?
                            .context("no model")?;
                        ensure!(model.values.len() == n, "pulled {} values", model.values.len());
                        pulled = model.values;
                    }
                    Stage::PsPullBf16 => {
                        let reuse = std::mem::take(&mut pulled_bf16);
                        let model = client
                            .pull_expecting(0, None, Duration::ZERO, Some(&expected_bf16), reuse)
                            .await?
                            .context("no model")?;
                        ensure!(model.values.len() == n, "pulled {} values", model.values.len());
                        pulled_bf16 = model.values;
                    }
                    Stage::PsPullInt8 => {
                        let base = held_int8.as_ref().map(|(tag, v)| Base { tag: *tag, values: v });
                        let reuse = std::mem::take(&mut spare_int8);
                        let model = client
                            .pull_against(0, None, Duration::ZERO, Some(&expected_int8), reuse, base)
                            .await?
                            .context("no model")?;
                        ensure!(model.values.len() == n, "pulled {} values", model.values.len());
                        let tag = model.copy.context("no copy tag")?;
                        if let Some((_, old)) = held_int8.replace((tag, model.values)) {
                            spare_int8 = old;
                        }
                    }
                    Stage::Decode => {
                        tokio::task::block_in_place(|| wire::decode_gradient(&body, &lay, &mut decoded))?
                    }
                    Stage::Apply => {
                        let p =
                            Push { worker: 0, generation: None, version: 0, seq, epoch: None, body: None };
                        let o = tokio::task::block_in_place(|| store.push(p, &decoded))?;
                        ensure!(o.applied, "in-process push not applied");
                    }
                }
                if r > 0 {
                    times[i].push(t.elapsed().as_secs_f64());
                }
            }
        }
        let mb = body.len() as f64 / 1e6;
        println!("-- {} parameters: body {:.1} MB, {} rounds --", label(n), mb, rounds);
        let at = |st: Stage| Stage::ALL.iter().position(|&x| x == st).expect("a stage");
        let raw_t = &times[at(Stage::RawTcp)];
        for (i, stage) in Stage::ALL.iter().enumerate() {
            let t = median(&times[i]);
            let per_round: Vec<f64> = raw_t.iter().zip(&times[i]).map(|(r, x)| r / x).collect();
            let tput = if matches!(
                stage,
                Stage::Apply | Stage::EncodeF32Fresh | Stage::EncodeF32 | Stage::EncodeBf16
            ) {
                format!("{:>6.0} M params/s", n as f64 / t / 1e6)
            } else {
                format!("{:>6.2} GB/s       ", mb / t / 1e3)
            };
            let ratio = if *stage == Stage::RawTcp {
                String::new()
            } else {
                format!(
                    "   vs raw TCP {:.3} [{:.3}, {:.3}]",
                    median(&per_round),
                    quantile(&per_round, 0.25),
                    quantile(&per_round, 0.75)
                )
            };
            println!("  {:<50} {:>9.2} ms  {tput}{ratio}", stage.describe(), t * 1e3);
        }
        let ratio = |st: Stage| {
            let r: Vec<f64> = raw_t.iter().zip(&times[at(st)]).map(|(r, x)| r / x).collect();
            median(&r)
        };
        let (push, pull) = (ratio(Stage::PsPush), ratio(Stage::PsPull));
        let met = |r: f64| if r >= 0.8 { "met" } else { "NOT met" };
        println!(
            "  => against raw TCP: push + apply {push:.3} ({}), pull {pull:.3} ({}) (target >= 0.8); HTTP/2 collect alone {:.3}; prototype receive path {:.3}; push as bf16 {:.3}, pull as bf16 {:.3}, as int8 difference {:.3} (raw TCP of the f32 bytes over the bf16/int8 transfer's time)",
            met(push),
            met(pull),
            ratio(Stage::H2Collect),
            ratio(Stage::H2StreamApply),
            ratio(Stage::PsPushBf16),
            ratio(Stage::PsPullBf16),
            ratio(Stage::PsPullInt8)
        );
        let m = |st: Stage| median(&times[at(st)]) * 1e3;
        // The push decodes as the body arrives (no separate decode): collect, then apply.
        println!(
            "     sink collect {:.2} + apply {:.2} = {:.2} ms, against push {:.2} ms",
            m(Stage::H2Collect),
            m(Stage::Apply),
            m(Stage::H2Collect) + m(Stage::Apply),
            m(Stage::PsPush)
        );
        if state.store().is_none() {
            bail!("model not registered");
        }
    }
    for tx in servers.shutdowns {
        let _ = tx.send(());
    }
    Ok(())
}
