//! The PS's Prometheus metrics (names are a contract: DESIGN.md §5).

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Staleness buckets: exact at small τ, then roughly ×1.5 up to the hundreds.
pub const STALENESS_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0, 384.0,
    512.0, 1024.0,
];
const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

pub struct Metrics {
    pub registry: Registry,
    pub staleness: Histogram,
    pub updates: IntCounter,
    pub model_version: IntGauge,
    pub rejected: IntCounterVec,
    pub push_seconds: Histogram,
    pub pull_seconds: Histogram,
    pub apply_seconds: Histogram,
    pub received_bytes: IntCounter,
    pub sent_bytes: IntCounter,
    pub compensation_ratio: Gauge,
    pub lambda: Gauge,
    /// Elements whose compensation gain hit the clamp, over every update.
    pub compensation_clamped: IntCounter,
    pub workers: IntGauge,
    pub workers_expected: IntGauge,
    /// Push bodies buffered at once at most (0: unbounded).
    pub push_slots: IntGauge,
    pub checkpoint_age: Gauge,
    /// The configured staleness bound (0: none) and the accepted gradients exactly at it.
    pub max_staleness: IntGauge,
    pub at_bound: IntCounter,
    /// Recovery: worker incarnations that joined, models seeded from a worker's copy, `sync`
    /// rounds closed without every worker's gradient.
    pub joins: IntCounter,
    pub reseeds: IntCounter,
    pub rounds_closed_short: IntCounter,
    /// Workers' steps the accepted pushes covered, and each worker's steps per exchange.
    pub trained_steps: IntCounter,
    pub local_steps: IntGaugeVec,
    /// Running means behind the compensation-ratio and λ gauges.
    compensation: parking_lot::Mutex<Option<(f64, f64)>>,
}

/// Weight of the newest update in the compensation gauges: about the last 20 updates count.
const COMPENSATION_EWMA: f64 = 0.05;

impl Metrics {
    /// Every series carries the job's `job` and `namespace` labels.
    /// Every series carries the job, its namespace and the shard: a sharded PS's processes
    /// export the same names, and a dashboard tells them apart (or sums over them) by `shard`.
    pub fn new(job: &str, namespace: &str, shard: usize) -> Self {
        let labels = [
            ("job".to_string(), job.to_string()),
            ("namespace".to_string(), namespace.to_string()),
            ("shard".to_string(), shard.to_string()),
        ];
        let registry = Registry::new_custom(None, Some(labels.into_iter().collect())).expect("valid labels");
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .expect("valid");
            registry.register(Box::new(h.clone())).expect("unique");
            h
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid");
            registry.register(Box::new(c.clone())).expect("unique");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = Gauge::new(name, help).expect("valid");
            registry.register(Box::new(g.clone())).expect("unique");
            g
        };
        let int_gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid");
            registry.register(Box::new(g.clone())).expect("unique");
            g
        };
        let rejected = IntCounterVec::new(
            Opts::new("foresight_ps_gradients_rejected_total", "Gradient pushes refused, by reason."),
            &["reason"],
        )
        .expect("valid");
        registry.register(Box::new(rejected.clone())).expect("unique");
        let local_steps = IntGaugeVec::new(
            Opts::new(
                "foresight_ps_local_steps",
                "Steps each worker trains per exchange: what the parameter server last told it (optimizer.adaptiveLocalSteps), else the steps its last push covered.",
            ),
            &["worker"],
        )
        .expect("valid");
        registry.register(Box::new(local_steps.clone())).expect("unique");
        // process_resident_memory_bytes, process_cpu_seconds_total, open fds... (Linux only).
        registry
            .register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
            .expect("unique");
        Self {
            staleness: hist(
                "foresight_ps_gradient_staleness",
                "Staleness τ of accepted gradients: model version at apply minus the version they were computed on (sync contributions: 0).",
                STALENESS_BUCKETS,
            ),
            updates: counter("foresight_ps_updates_total", "Model updates applied (version increments)."),
            model_version: int_gauge("foresight_ps_model_version", "Current model version."),
            rejected,
            push_seconds: hist(
                "foresight_ps_push_seconds",
                "Time to receive, decode and apply a push.",
                LATENCY_BUCKETS,
            ),
            pull_seconds: hist(
                "foresight_ps_pull_seconds",
                "Time to produce a pull's model (its copy, which an f32 pull sends as it lands, or its bf16 or int8 encoding), long-poll wait excluded.",
                LATENCY_BUCKETS,
            ),
            apply_seconds: hist(
                "foresight_ps_apply_seconds",
                "Time the update rule took on the whole model.",
                LATENCY_BUCKETS,
            ),
            received_bytes: counter("foresight_ps_received_bytes_total", "Request body bytes received."),
            sent_bytes: counter("foresight_ps_sent_bytes_total", "Model bytes sent to workers."),
            compensation_ratio: gauge(
                "foresight_ps_compensation_ratio",
                "|λ·g⊙g⊙(w − w_bak)| / |g|, exponentially weighted mean over the last ~20 delay-compensated updates.",
            ),
            lambda: gauge(
                "foresight_ps_lambda",
                "Mean λ_t over the parameters, exponentially weighted over the last ~20 delay-compensated updates.",
            ),
            compensation_clamped: counter(
                "foresight_ps_compensation_clamped_total",
                "Parameter elements whose delay-compensation gain λ·g² was clamped at (1 − momentum)/η, summed over the updates.",
            ),
            workers: int_gauge(
                "foresight_ps_workers",
                "Workers seen (pull, push or report) in the last 60 seconds.",
            ),
            workers_expected: int_gauge(
                "foresight_ps_workers_expected",
                "The job's worker count M (changes when the job is scaled).",
            ),
            push_slots: int_gauge(
                "foresight_ps_push_slots",
                "Push bodies the parameter server buffers at once at most (from its memory limit and the model's size; 0: unbounded); others wait, then get 503 busy.",
            ),
            checkpoint_age: gauge(
                "foresight_ps_checkpoint_age_seconds",
                "Seconds since the last checkpoint was written (since start when none has been).",
            ),
            max_staleness: int_gauge(
                "foresight_ps_max_staleness",
                "The staleness bound (--max-staleness): gradients staler than this are refused; 0 when there is none.",
            ),
            at_bound: counter(
                "foresight_ps_gradients_at_bound_total",
                "Accepted gradients whose staleness equals the bound exactly (the stalest allowed); 0 when there is no bound.",
            ),
            joins: counter(
                "foresight_ps_worker_joins_total",
                "Worker processes that joined (POST /v1/join); above the worker count, replacements of workers that died.",
            ),
            reseeds: counter(
                "foresight_ps_reseeds_total",
                "Workers' copies of the model taken after the parameter server had lost it (a restart without checkpoint): the first, and each fresher one before training resumed.",
            ),
            rounds_closed_short: counter(
                "foresight_ps_sync_rounds_closed_short_total",
                "sync rounds closed without the gradient of every worker still training (backup workers, a silent worker, or the round timeout).",
            ),
            trained_steps: counter(
                "foresight_ps_trained_steps_total",
                "Workers' training steps the accepted pushes covered (a push of H local steps counts H): bytes per step is the received and sent bytes over this.",
            ),
            local_steps,
            registry,
            compensation: parking_lot::Mutex::new(None),
        }
    }

    /// Folds one delay-compensated update into the compensation-ratio and λ gauges. A single
    /// update's values swing with its staleness (τ = 0 gives 0), so the gauges hold an
    /// exponentially weighted mean over recent updates rather than the last value.
    pub fn observe_compensation(&self, ratio: f64, lambda: f64) {
        let mut ewma = self.compensation.lock();
        let (r, l) = match *ewma {
            None => (ratio, lambda),
            Some((r, l)) => (r + COMPENSATION_EWMA * (ratio - r), l + COMPENSATION_EWMA * (lambda - l)),
        };
        *ewma = Some((r, l));
        self.compensation_ratio.set(r);
        self.lambda.set(l);
    }

    pub fn reject(&self, reason: &str) {
        self.rejected.with_label_values(&[reason]).inc();
    }

    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf).expect("text encoding cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}
