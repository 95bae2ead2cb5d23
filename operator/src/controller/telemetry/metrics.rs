//! The operator's Prometheus metrics (DESIGN.md §5) and its HTTP endpoint: `/metrics`,
//! `/healthz` (the process serves) and `/readyz` (it has reached the API server). A standby
//! replica waiting for the lease is ready too: otherwise a rolling update of a two-replica
//! Deployment would wait forever for a new pod that cannot lead while the old one does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::api::Phase;

/// Every phase, for `foresight_operator_jobs{phase}` (all are exported, zeros included).
pub const PHASES: [Phase; 7] = [
    Phase::Created,
    Phase::Queued,
    Phase::Running,
    Phase::Restarting,
    Phase::Succeeded,
    Phase::Failed,
    Phase::Suspended,
];

/// The `verb` values of `foresight_operator_api_requests_total`.
pub const API_VERBS: [&str; 6] = ["watch", "get", "post", "patch", "put", "delete"];

/// The `reason` values of `foresight_operator_reconcile_errors_total`.
pub const ERROR_REASONS: [&str; 5] =
    ["kube_api", "conflict", "incomplete_object", "name_conflict", "certificates"];

pub fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Created => "Created",
        Phase::Queued => "Queued",
        Phase::Running => "Running",
        Phase::Restarting => "Restarting",
        Phase::Succeeded => "Succeeded",
        Phase::Failed => "Failed",
        Phase::Suspended => "Suspended",
    }
}

pub struct Metrics {
    pub registry: Registry,
    pub reconciles: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_seconds: HistogramVec,
    pub jobs: IntGaugeVec,
    pub job_duration: HistogramVec,
    pub api_requests: IntCounterVec,
    pub yielded_namespaces: IntGauge,
    /// Set once the API server answered (the lease was read or written).
    pub ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new(
                "foresight_operator_reconciles_total",
                "Reconciliations of TrainingJobs, by result (success or error).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "foresight_operator_reconcile_errors_total",
                "Reconciliations that failed, by reason (kube_api, conflict, incomplete_object, name_conflict).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let reconcile_seconds = HistogramVec::new(
            HistogramOpts::new("foresight_operator_reconcile_seconds", "Time one reconciliation took.")
                .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &[],
        )
        .expect("valid metric");
        let jobs = IntGaugeVec::new(
            Opts::new("foresight_operator_jobs", "TrainingJobs this operator manages, by phase."),
            &["phase"],
        )
        .expect("valid metric");
        let job_duration = HistogramVec::new(
            HistogramOpts::new(
                "foresight_trainingjob_duration_seconds",
                "From a TrainingJob's start to its completion, by final phase (Succeeded or Failed).",
            )
            .buckets(vec![10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0]),
            &["phase"],
        )
        .expect("valid metric");
        let api_requests = IntCounterVec::new(
            Opts::new(
                "foresight_operator_api_requests_total",
                "Requests the operator sent to the Kubernetes API server, by verb (watch, get: a get or a list, post, patch, put, delete).",
            ),
            &["verb"],
        )
        .expect("valid metric");
        let yielded_namespaces = IntGauge::new(
            "foresight_operator_yielded_namespaces",
            "Namespaces whose TrainingJobs this cluster-wide operator leaves to a namespaced operator that watches them.",
        )
        .expect("valid metric");
        for c in [
            Box::new(reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(yielded_namespaces.clone()),
            Box::new(api_requests.clone()),
            Box::new(reconcile_errors.clone()),
            Box::new(reconcile_seconds.clone()),
            Box::new(jobs.clone()),
            Box::new(job_duration.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        // process_resident_memory_bytes, process_cpu_seconds_total...: what the operator costs
        // as jobs grow (`make scale` reads them).
        registry
            .register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
            .expect("metric names are unique");
        // Every known label value exists from the start, so that rates and sums are 0, not absent.
        for p in PHASES {
            jobs.with_label_values(&[phase_name(p)]).set(0);
        }
        for r in ["success", "error"] {
            reconciles.with_label_values(&[r]);
        }
        for r in ERROR_REASONS {
            reconcile_errors.with_label_values(&[r]);
        }
        for p in [Phase::Succeeded, Phase::Failed] {
            job_duration.with_label_values(&[phase_name(p)]);
        }
        for v in API_VERBS {
            api_requests.with_label_values(&[v]);
        }
        Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_seconds,
            jobs,
            job_duration,
            api_requests,
            yielded_namespaces,
            ready: AtomicBool::new(false),
        }
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `addr`; returns the bound address.
    pub async fn serve(self: Arc<Self>, addr: &str) -> std::io::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .with_state(self);
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "metrics server stopped");
            }
        });
        Ok(bound)
    }
}

async fn metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    let mut buf = Vec::new();
    let encoder = prometheus::TextEncoder::new();
    match encoder.encode(&m.registry.gather(), &mut buf) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, encoder.format_type().to_string())], buf),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain".into())],
            e.to_string().into(),
        ),
    }
}

async fn readyz(State(m): State<Arc<Metrics>>) -> (StatusCode, &'static str) {
    if m.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: the API server has not answered yet")
    }
}
