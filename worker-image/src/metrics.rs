//! The worker's Prometheus metrics (DESIGN.md §5), served on its own `/metrics`.

use std::sync::Arc;

use prometheus::{
    CounterVec, Encoder, Gauge, Histogram, HistogramOpts, IntCounter, Opts, Registry, TextEncoder,
};

#[derive(Clone)]
pub struct WorkerMetrics {
    registry: Registry,
    pub loss: Gauge,
    pub accuracy: Gauge,
    pub step_seconds: Histogram,
    pub samples: IntCounter,
    /// Seconds spent in each phase of the training loop (`crate::clock`).
    pub phase_seconds: CounterVec,
}

impl WorkerMetrics {
    /// Every series carries `job`, `namespace` and the worker index.
    pub fn new(job: &str, namespace: &str, worker: usize) -> Self {
        let labels =
            [("job", job.to_string()), ("namespace", namespace.to_string()), ("worker", worker.to_string())];
        let registry =
            Registry::new_custom(None, Some(labels.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
                .expect("labels");
        let loss =
            Gauge::new("foresight_worker_loss", "Training loss of the last local batch.").expect("valid");
        let accuracy = Gauge::new("foresight_worker_accuracy", "Held-out accuracy at the last evaluation.")
            .expect("valid");
        let buckets = vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
        let step_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "foresight_worker_step_seconds",
                "Wall time of one training step, communication included.",
            )
            .buckets(buckets),
        )
        .expect("valid");
        let samples =
            IntCounter::new("foresight_worker_samples_total", "Training examples processed.").expect("valid");
        let phase_seconds = CounterVec::new(
            Opts::new(
                "foresight_worker_phase_seconds_total",
                "Seconds the training loop spent in each phase: batch, pull, load, compute, gather, push, \
                 report, evaluate, slowdown.",
            ),
            &["phase"],
        )
        .expect("valid");
        for c in [
            Box::new(loss.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(accuracy.clone()),
            Box::new(step_seconds.clone()),
            Box::new(samples.clone()),
            Box::new(phase_seconds.clone()),
        ] {
            registry.register(c).expect("unique");
        }
        Self { registry, loss, accuracy, step_seconds, samples, phase_seconds }
    }

    pub fn step(&self, seconds: f64, samples: u64, loss: f64) {
        self.step_seconds.observe(seconds);
        self.samples.inc_by(samples);
        self.loss.set(loss);
    }

    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf).expect("text encoding cannot fail");
        String::from_utf8(buf).expect("UTF-8")
    }

    /// Serves `/metrics` and `/healthz` on `addr` (or the socket inherited on descriptor
    /// `inherited`, bound to `addr`) in the background.
    pub async fn serve(
        self: Arc<Self>,
        addr: &str,
        inherited: Option<std::os::fd::RawFd>,
    ) -> anyhow::Result<std::net::SocketAddr> {
        use axum::routing::get;
        let listener = foresight_ps::listen::tcp_listener(addr, inherited)
            .await
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        let bound = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/metrics", get(move || async move { self.encode() }))
            .route("/healthz", get(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(bound)
    }
}
