//! A real PS on loopback for the integration tests: in-process, or as the real binary.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use foresight_ps::client::{Cadence, Exchange, PsClient, Retry, Session, StepEnd};
use foresight_ps::optimizer::{Algorithm, Hyper};
use foresight_ps::server::{AppState, ConnectionLimits, Listener, PsConfig, TlsFiles, router, serve};
use foresight_ps::wire::{Layout, TensorSpec};

pub const TOKEN: &str = "test-token";

pub struct Ps {
    pub url: String,
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Ps {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub fn config(algorithm: Algorithm, workers: usize) -> PsConfig {
    let mut c = PsConfig::new(Hyper::new(algorithm, 0.1), workers);
    c.token = Some(TOKEN.into());
    c.job = "it".into();
    c.namespace = "tests".into();
    c
}

/// Starts a PS in this process on a free loopback port.
pub async fn start(config: PsConfig) -> Ps {
    start_with(config, ConnectionLimits::default(), None).await
}

/// The same with these connection limits, over TLS when given a certificate.
pub async fn start_with(config: PsConfig, limits: ConnectionLimits, tls: Option<&TlsFiles>) -> Ps {
    // For the tests' plain reqwest clients.
    foresight_ps::client::install_crypto_provider();
    let state = AppState::new(config).expect("valid config");
    let listener = Listener::bind("127.0.0.1:0", None, tls).await.unwrap().with_limits(limits);
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let app = router(state.clone());
    tokio::spawn(serve(listener, app, async move {
        let _ = rx.await;
    }));
    let scheme = if tls.is_some() { "https" } else { "http" };
    Ps { url: format!("{scheme}://{addr}"), addr, state, stop: Some(tx) }
}

pub fn layout() -> Layout {
    Layout::new(vec![
        TensorSpec { name: "conv.weight".into(), shape: vec![4, 3, 3, 3] },
        TensorSpec { name: "fc.weight".into(), shape: vec![10, 100] },
        TensorSpec { name: "fc.bias".into(), shape: vec![10] },
    ])
    .unwrap()
}

pub fn init(layout: &Layout) -> Vec<f32> {
    (0..layout.len()).map(|i| (i as f32 * 0.013).sin()).collect()
}

pub fn grad(layout: &Layout, k: usize) -> Vec<f32> {
    (0..layout.len()).map(|i| ((i + 7 * k) as f32 * 0.021).cos() * 0.1).collect()
}

/// Prometheus text exposition → {"name{labels}": value}.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap_or_else(|| panic!("bad metrics line {l:?}"));
            (k.to_string(), v.parse::<f64>().unwrap_or_else(|_| panic!("bad value in {l:?}")))
        })
        .collect()
}

/// Sum of every series of `name` whose labels contain all of `labels`.
pub fn metric(m: &HashMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    m.iter()
        .filter(|(k, _)| {
            let base = k.split('{').next().unwrap();
            base == name && labels.iter().all(|l| k.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

pub async fn scrape(url: &str) -> HashMap<String, f64> {
    foresight_ps::client::install_crypto_provider();
    let text = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
    parse_metrics(&text)
}

/// The real `foresight-ps` binary as a child process.
pub struct PsProcess {
    pub child: Child,
    pub url: String,
}

impl PsProcess {
    pub fn spawn(port: u16, args: &[&str]) -> Self {
        foresight_ps::client::install_crypto_provider();
        let child = Command::new(env!("CARGO_BIN_EXE_foresight-ps"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--token", TOKEN])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn foresight-ps");
        Self { child, url: format!("http://127.0.0.1:{port}") }
    }

    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(r) = reqwest::get(format!("{}/readyz", self.url)).await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("foresight-ps did not become ready at {}", self.url);
    }

    pub fn signal(&self, sig: &str) {
        let ok =
            Command::new("kill").args([&format!("-{sig}"), &self.child.id().to_string()]).status().unwrap();
        assert!(ok.success());
    }

    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "foresight-ps did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PsProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn checkpoints(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ckpt-"))
        .collect();
    v.sort();
    v
}

/// A self-signed certificate for localhost and 127.0.0.1, made with openssl in `dir`.
pub fn self_signed_cert(dir: &Path) -> TlsFiles {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let ok = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
        .args([
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (make setup installs it)");
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    TlsFiles { cert, key }
}

/// A certificate for localhost and 127.0.0.1 signed by a CA of its own, as cert-manager or the
/// operator issues them, made with openssl in `dir`: the leaf's files and the CA's certificate.
pub fn ca_signed_cert(dir: &Path) -> (TlsFiles, std::path::PathBuf) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .output()
            .expect("openssl (make setup installs it)");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        &[
            &["req", "-x509"],
            &ec[..],
            &["-days", "1", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem"],
        ]
        .concat(),
    );
    openssl(
        &[&["req", "-new"], &ec[..], &["-subj", "/CN=localhost", "-keyout", "key.pem", "-out", "leaf.csr"]]
            .concat(),
    );
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-set_serial",
        "2",
        "-days",
        "1",
        "-extfile",
        "leaf.ext",
        "-out",
        "cert.pem",
    ]);
    (TlsFiles { cert: dir.join("cert.pem"), key: dir.join("key.pem") }, dir.join("ca.pem"))
}

/// A runtime for tests that drive the workers' blocking client ([`Session`]).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Worker `m` of a job whose shards are at `urls`, joined, with the real client.
pub fn worker(
    rt: &tokio::runtime::Runtime,
    urls: &[String],
    cadence: Cadence,
    m: usize,
    deadline: Duration,
) -> Exchange {
    let l = layout();
    let clients = PsClient::for_shards(&urls.join(","), Some(TOKEN.into()), None).unwrap();
    let retry = Retry::new(deadline, m as u64);
    let (session, joined) =
        Session::start(clients, rt.handle().clone(), m, l.clone(), &init(&l), retry).unwrap();
    Exchange::new(session, &joined, cadence)
}

/// One step of worker `m`: pull (when due), a gradient that depends on the step and on the
/// model it was computed on, push.
pub fn step(w: &mut Exchange, m: usize) -> StepEnd {
    let model = w.pull_if_due().unwrap();
    let k = w.step() as usize * 2 + m;
    let g = grad(w.layout(), k);
    let first = model.map_or(0.0, |m| m.values[0]);
    for (acc, x) in w.grad_mut().iter_mut().zip(g) {
        *acc += x + 0.01 * first;
    }
    w.end_step(Some(w.step() as f64 / 100.0)).unwrap()
}
