//! `foresight operator`'s life: the counted client, `/metrics`, the `--kueue` check, leadership
//! (the Lease, the first surveys of other operators' scopes), one controller per scope, the
//! jobs-by-phase gauge, and shutdown.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::StreamExt;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;

use crate::api::{Phase, TrainingJob};
use crate::controller::context::{Context, Settings};
use crate::controller::error::Result;
use crate::controller::leadership::leader::LeaderElector;
use crate::controller::leadership::{LeaseConfig, claims, scope};
use crate::controller::names::MANAGER;
use crate::controller::observe::caches::Caches;
use crate::controller::reconcile::{error_policy, reconcile};
use crate::controller::telemetry::api_calls;
use crate::controller::telemetry::metrics::{Metrics, PHASES, phase_name};

/// Runs the operator until SIGTERM/SIGINT (Ok) or until it loses its lease (Err): serves the
/// metrics, waits for the lease, then reconciles. Its client counts every request it sends.
pub async fn run(config: kube::Config, settings: Settings, metrics_addr: &str) -> Result<(), String> {
    let metrics = Arc::new(Metrics::new());
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| format!("Kubernetes client: {e}"))?
        .with_layer(&api_calls::CountRequests(metrics.api_requests.clone()))
        .build();
    let addr = metrics
        .clone()
        .serve(metrics_addr)
        .await
        .map_err(|e| format!("metrics address {metrics_addr}: {e}"))?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");

    if settings.kueue {
        kueue_served(&client).await?;
    }
    let elector = settings.lease.clone().map(|cfg| LeaderElector::new(client.clone(), cfg));
    let stop = shutdown_signal();
    tokio::pin!(stop);
    match &elector {
        Some(e) => {
            let m = metrics.clone();
            tokio::select! {
                () = e.acquire(move || m.ready.store(true, std::sync::atomic::Ordering::Relaxed)) => {}
                () = &mut stop => return Ok(()),
            }
        }
        None => {
            client.apiserver_version().await.map_err(|e| format!("cannot reach the API server: {e}"))?;
            metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    // Renews the Lease from here on, through the first surveys' wait too.
    let lost = async {
        match &elector {
            Some(e) => e.hold().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    let yields = Arc::new(scope::Yields::default());
    if let (Some(cfg), Some(e)) = (&settings.lease, &elector) {
        let start = first_surveys(&client, cfg, &yields, &metrics, stop.as_mut(), lost.as_mut()).await;
        match start {
            Start::Reconcile => {}
            Start::Stopped => {
                step_down(&client, cfg, e).await;
                return Ok(());
            }
            Start::Refused(why) => {
                step_down(&client, cfg, e).await;
                return Err(refused(why));
            }
            Start::Lost(why) => return Err(format!("lost leadership: {why}")),
        }
    }

    let identity =
        settings.lease.as_ref().map_or_else(|| "foresight-operator".to_string(), |l| l.identity.clone());
    let recorder =
        Recorder::new(client.clone(), Reporter { controller: MANAGER.into(), instance: Some(identity) });
    // One controller per watched namespace (a namespaced operator may not list cluster-wide),
    // sharing the context; their results merge into one stream.
    let (caches, controllers) = Caches::with_controllers(
        &client,
        &settings.watch.scopes(),
        settings.kueue,
        settings.ps_ingress_from.is_some(),
        settings.max_concurrent_reconciles,
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        settings,
        metrics: metrics.clone(),
        recorder,
        progress_read: Default::default(),
        previous_key: Default::default(),
        ps_clients: Default::default(),
        backoffs: Default::default(),
        caches,
        applied: Default::default(),
        flavors: Default::default(),
        yields: yields.clone(),
    });
    let mut stores = Vec::new();
    let mut runs = Vec::new();
    for controller in controllers {
        stores.push(controller.store());
        runs.push(controller.run(reconcile, error_policy, ctx.clone()).boxed());
    }
    let mut pruned = std::time::Instant::now();
    let reconciling = futures_util::stream::select_all(runs).for_each(|result| {
        count_phases(&stores, &metrics, &yields);
        if pruned.elapsed() >= PRUNE_EVERY {
            pruned = std::time::Instant::now();
            let jobs: Vec<_> = stores.iter().flat_map(Store::state).collect();
            ctx.forget_gone(&jobs.iter().filter_map(|j| j.metadata.uid.as_deref()).collect());
        }
        if let Err(e) = result {
            tracing::debug!(error = %e, "reconcile loop");
        }
        futures_util::future::ready(())
    });
    let overlap = keep_surveying(&client, ctx.settings.lease.as_ref(), &yields, &metrics);
    tokio::select! {
        () = reconciling => Ok(()),
        () = &mut stop => {
            if let (Some(cfg), Some(e)) = (&ctx.settings.lease, &elector) {
                step_down(&client, cfg, e).await;
            }
            Ok(())
        }
        why = &mut lost => Err(format!("lost leadership: {why}")),
        why = overlap => {
            if let (Some(cfg), Some(e)) = (&ctx.settings.lease, &elector) {
                step_down(&client, cfg, e).await;
            }
            Err(refused(why))
        }
    }
}

/// Stops leading on purpose: the claims in the watched namespaces are withdrawn, then the
/// Lease is released, so that whoever watches next need not wait for either to lapse.
pub(crate) async fn step_down(client: &Client, cfg: &LeaseConfig, elector: &LeaderElector) {
    claims::withdraw(client, cfg, cfg.retry_period).await;
    elector.release().await;
}

/// How a new leader's first surveys ended.
pub(crate) enum Start {
    /// Alone over its namespaces (or yielding some): reconcile.
    Reconcile,
    /// SIGTERM or SIGINT while it waited.
    Stopped,
    /// Another operator already watches part of its scope.
    Refused(String),
    /// Its Lease could not be renewed while it waited.
    Lost(String),
}

/// A new leader surveys, waits for what that survey could not see yet (`scope::settle`: claims
/// on their way, a cluster-wide operator's next survey) and surveys again before it reconciles
/// anything, renewing its Lease (`lost`) all the while: a survey whose calls hang (a stuck
/// connection) ends with the Lease's renew deadline, as reconciling does.
pub(crate) async fn first_surveys(
    client: &Client,
    cfg: &LeaseConfig,
    yields: &scope::Yields,
    metrics: &Metrics,
    mut stop: Pin<&mut impl Future<Output = ()>>,
    mut lost: Pin<&mut impl Future<Output = String>>,
) -> Start {
    let first = survey(client, cfg, yields, metrics);
    let peers =
        match or_stopped(first, stop.as_mut(), lost.as_mut()).await.and_then(|r| r.map_err(Start::Refused)) {
            Ok(peers) => peers,
            Err(start) => return start,
        };
    let wait = scope::settle(cfg, &peers);
    if wait.is_zero() {
        return Start::Reconcile;
    }
    tracing::info!(
        ?wait,
        "waiting before reconciling for other operators' claims and surveys, then surveying again"
    );
    let again = async {
        tokio::time::sleep(wait).await;
        survey(client, cfg, yields, metrics).await
    };
    match or_stopped(again, stop, lost).await.and_then(|r| r.map_err(Start::Refused)) {
        Ok(_) => Start::Reconcile,
        Err(start) => start,
    }
}

/// `work`, unless SIGTERM comes or the Lease is lost first.
pub(crate) async fn or_stopped<T>(
    work: impl Future<Output = T>,
    stop: Pin<&mut impl Future<Output = ()>>,
    lost: Pin<&mut impl Future<Output = String>>,
) -> Result<T, Start> {
    tokio::select! {
        done = work => Ok(done),
        () = stop => Err(Start::Stopped),
        why = lost => Err(Start::Lost(why)),
    }
}

/// One survey of the other operators' Leases (`scope`): the operators found, whose namespaces
/// to leave alone, or why this operator must stop.
pub(crate) async fn survey(
    client: &Client,
    cfg: &LeaseConfig,
    yields: &scope::Yields,
    metrics: &Metrics,
) -> Result<Vec<scope::Peer>, String> {
    let peers = scope::check(client, cfg, yields).await?;
    metrics.yielded_namespaces.set(yields.count() as i64);
    Ok(peers)
}

/// Surveys again every four lease durations; returns why this operator must stop (never,
/// without leader election).
pub(crate) async fn keep_surveying(
    client: &Client,
    lease: Option<&LeaseConfig>,
    yields: &scope::Yields,
    metrics: &Metrics,
) -> String {
    let Some(cfg) = lease else { return std::future::pending().await };
    loop {
        tokio::time::sleep(crate::controller::leadership::survey_every(cfg.lease_duration)).await;
        if let Err(why) = survey(client, cfg, yields, metrics).await {
            return why;
        }
    }
}

pub(crate) fn refused(why: String) -> String {
    format!("refusing to run beside another operator: {why}")
}

/// With `--kueue`, Kueue's Workload API must be served: a watch of a missing kind would keep the
/// caches from ever being ready.
pub(crate) async fn kueue_served(client: &Client) -> Result<(), String> {
    use kube::core::GroupVersionKind;
    let gvk = GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload");
    match kube::discovery::pinned_kind(client, &gvk).await {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("--kueue: Kueue's Workload API (kueue.x-k8s.io/v1beta2) is not served: {e}")),
    }
}

pub(crate) async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping");
}

/// The jobs this operator manages by phase: those of the namespaces it has not yielded.
/// How often what the context keeps per job is pruned of the jobs deleted since
/// (`Context::forget_gone`): an O(jobs) pass, so not on every reconcile as the phase counts are.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

pub(crate) fn count_phases(stores: &[Store<TrainingJob>], metrics: &Metrics, yields: &scope::Yields) {
    // One read of the yielded set for the whole pass, not a lock and a clone per job.
    let yielded = yields.namespaces();
    let ours = |j: &Arc<TrainingJob>| j.metadata.namespace.as_ref().is_none_or(|ns| !yielded.contains(ns));
    let jobs: Vec<_> = stores.iter().flat_map(Store::state).filter(ours).collect();
    for p in PHASES {
        let n = jobs
            .iter()
            .filter(|j| j.status.as_ref().and_then(|s| s.phase).unwrap_or(Phase::Created) == p)
            .count();
        metrics.jobs.with_label_values(&[phase_name(p)]).set(n as i64);
    }
}
