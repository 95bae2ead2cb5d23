//! The TrainingJob controller: for each job it applies the children (`children`), reads back
//! the worker Job, the parameter server and the pods, moves the state machine (`status`),
//! writes the status and the Events, finalizes the model when the workers are done and removes
//! the parameter server once the job has ended.

mod admission;
mod api_calls;
mod applied;
mod backoff;
mod caches;
pub mod children;
pub mod claims;
pub mod kueue;
pub mod leader;
pub mod metrics;
mod ownership;
mod pod_index;
mod pods;
pub mod ps_tls;
pub mod scope;
pub mod status;
pub mod token;
pub mod trouble;
mod watch;
mod writes;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};

use crate::api::{Phase, Progress, TrainingJob, TrainingJobStatus};
use caches::Caches;
use children::{ChildDefaults, Owner, WorkerJobUpdate};
use kueue::Admission;
use leader::{LeaderElector, LeaseConfig, is_status};
use metrics::{Metrics, PHASES, phase_name};
use ownership::Mark;
use status::{Finalize, Observed, Placement, PsProcess, ShardsReady, State, WorkerJob};
use token::TokenKey;
pub use watch::Watch;

/// The field manager of everything the operator applies.
pub const MANAGER: &str = "foresight-operator";
/// Selects the objects this operator created.
const MANAGED: &str = "app.kubernetes.io/managed-by=foresight-operator";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the TrainingJob has no name, namespace or UID")]
    Incomplete,
    /// An object has the name of one of the job's children and is not the job's: the operator
    /// leaves it alone and the job waits (a job deleted and made again under the same name
    /// waits here until the garbage collector has removed the old job's children).
    #[error(
        "{kind} {name} exists and is not this job's ({holder}); the operator leaves it alone: delete or rename it, or give the TrainingJob another name"
    )]
    NotOurs { kind: String, name: String, holder: String },
    #[error("the job's TLS certificates: {0}")]
    Certificates(#[from] ps_tls::IssueError),
}

impl Error {
    /// The `ReconcileFailed` condition's reason: the API server's (Forbidden, Invalid, ...).
    fn condition_reason(&self) -> String {
        match self {
            Error::Kube(kube::Error::Api(s)) if !s.reason.is_empty() => s.reason.clone(),
            Error::Kube(_) => "KubernetesAPIError".into(),
            Error::Incomplete => "IncompleteObject".into(),
            Error::NotOurs { .. } => "NameConflict".into(),
            Error::Certificates(_) => "CertificateError".into(),
        }
    }

    fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(e) if is_status(e, 409))
    }

    /// The `reason` label of `foresight_operator_reconcile_errors_total` (one of
    /// `metrics::ERROR_REASONS`).
    fn metric_reason(&self) -> &'static str {
        match self {
            e if e.is_conflict() => "conflict",
            Error::Kube(_) => "kube_api",
            Error::Incomplete => "incomplete_object",
            Error::NotOurs { .. } => "name_conflict",
            Error::Certificates(_) => "certificates",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The operator's settings (`foresight operator --help`).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Which namespaces' TrainingJobs to handle.
    pub watch: Watch,
    pub defaults: ChildDefaults,
    pub token_key: TokenKey,
    /// The key `token_key` replaced: jobs created before the rotation hold its tokens.
    pub previous_token_key: Option<TokenKey>,
    /// URL of a job's parameter server as the operator reaches it; `{name}` and `{namespace}`
    /// are replaced.
    pub ps_url: String,
    /// How often a running job's progress is read from its parameter server.
    pub progress_every: Duration,
    /// How long to retry `/v1/finalize` after the workers finished before giving up.
    pub finalize_grace: Duration,
    /// How long a job's pods may fail to start or keep failing (`trouble`) before the job fails.
    pub stuck_pods_timeout: Duration,
    /// Whether Kueue admits the jobs labelled for one of its queues (`kueue`).
    pub kueue: bool,
    /// `Some`: each job gets a NetworkPolicy letting only its workers and these peers reach its
    /// parameter servers (`children/guards.rs`).
    pub ps_ingress_from: Option<Vec<NetworkPolicyPeer>>,
    /// `None`: no leader election (one replica).
    pub lease: Option<LeaseConfig>,
}

/// What `reconcile` shares.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    /// When each job's progress was last read (by UID). Writing fresh progress changes the
    /// status, which wakes the controller again; reading it at most every `progress_every`
    /// keeps that from becoming a loop.
    progress_read: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// Per job (by UID), whether its PS holds the previous token key's control token (a job
    /// created before a key rotation): learnt once, since a job's Secret is written once.
    previous_key: std::sync::Mutex<std::collections::HashMap<String, bool>>,
    /// Per job, when to retry after failed reconciles.
    backoffs: backoff::Backoffs,
    /// The children as the watches last saw them.
    caches: Caches,
    /// What the operator last wrote to each child (writes that would change nothing are skipped).
    applied: applied::Applied,
    /// Kueue's ResourceFlavors as last read.
    flavors: admission::Flavors,
    /// The namespaces whose jobs another operator handles (`scope`).
    yields: Arc<scope::Yields>,
}

impl Context {
    /// Whether the job's progress is due to be read now (and if so, marks it read).
    fn progress_due(&self, uid: &str) -> bool {
        let mut read = self.progress_read.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        // A requeue comes back a little early or late; 0.9 keeps one read per period.
        let period = self.settings.progress_every.mul_f64(0.9);
        match read.get(uid) {
            Some(t) if now.duration_since(*t) < period => false,
            _ => {
                // Jobs deleted while running never come back to be forgotten: drop stale entries.
                read.retain(|_, t| now.duration_since(*t) < self.settings.progress_every * 10);
                read.insert(uid.to_string(), now);
                true
            }
        }
    }

    fn forget_progress(&self, uid: &str) {
        self.progress_read.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }

    /// How the operator reaches job `owner`'s PS (shard 0, which passes calls on): its URL, and
    /// when the PS serves TLS, `https://` trusting the job's CA (of the current token key and of
    /// the previous one: the key a job's certificates came from is not recorded).
    fn ps_addr(&self, owner: &Owner<'_>, tls: bool) -> PsAddr {
        let url =
            self.settings.ps_url.replace("{name}", &owner.name).replace("{namespace}", &owner.namespace);
        if !tls {
            return PsAddr { url, tls: None };
        }
        let url = url.strip_prefix("http://").map_or(url.clone(), |rest| format!("https://{rest}"));
        let keys = std::iter::once(&self.settings.token_key).chain(self.settings.previous_token_key.as_ref());
        let trust = ps_tls::trust(keys, owner.uid(), created_s(owner.job));
        if let Err(e) = &trust {
            tracing::warn!(job = %owner.name, error = %e, "no CA to trust for the job's parameter server");
        }
        PsAddr { url, tls: trust.ok() }
    }
}

/// Where the operator calls a job's parameter server.
struct PsAddr {
    url: String,
    /// The roots an `https://` URL is checked against.
    tls: Option<foresight_ps::client::ClientTls>,
}

impl PsAddr {
    fn client(
        &self,
        token: String,
    ) -> Result<foresight_ps::client::PsClient, foresight_ps::client::ClientError> {
        foresight_ps::client::PsClient::with_tls(&self.url, Some(token), self.tls.as_ref())
    }
}

/// The job's creation time in Unix seconds (its certificates' validity starts there); 0 when
/// it has none yet, as an object read from the API server always has.
fn created_s(job: &TrainingJob) -> i64 {
    job.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second())
}

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
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        settings,
        metrics: metrics.clone(),
        recorder,
        progress_read: Default::default(),
        previous_key: Default::default(),
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
    let reconciling = futures_util::stream::select_all(runs).for_each(|result| {
        count_phases(&stores, &metrics, &yields);
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
async fn step_down(client: &Client, cfg: &LeaseConfig, elector: &LeaderElector) {
    claims::withdraw(client, cfg, cfg.retry_period).await;
    elector.release().await;
}

/// How a new leader's first surveys ended.
enum Start {
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
async fn first_surveys(
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
async fn or_stopped<T>(
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
async fn survey(
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
async fn keep_surveying(
    client: &Client,
    lease: Option<&LeaseConfig>,
    yields: &scope::Yields,
    metrics: &Metrics,
) -> String {
    let Some(cfg) = lease else { return std::future::pending().await };
    loop {
        tokio::time::sleep(scope::survey_every(cfg.lease_duration)).await;
        if let Err(why) = survey(client, cfg, yields, metrics).await {
            return why;
        }
    }
}

fn refused(why: String) -> String {
    format!("refusing to run beside another operator: {why}")
}

/// With `--kueue`, Kueue's Workload API must be served: a watch of a missing kind would keep the
/// caches from ever being ready.
async fn kueue_served(client: &Client) -> Result<(), String> {
    use kube::core::GroupVersionKind;
    let gvk = GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload");
    match kube::discovery::pinned_kind(client, &gvk).await {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("--kueue: Kueue's Workload API (kueue.x-k8s.io/v1beta2) is not served: {e}")),
    }
}

fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

async fn shutdown_signal() {
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
fn count_phases(stores: &[Store<TrainingJob>], metrics: &Metrics, yields: &scope::Yields) {
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

fn error_policy(job: Arc<TrainingJob>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoffs.next(job.metadata.uid.as_deref().unwrap_or_default());
    tracing::warn!(job = %job.name_any(), namespace = ?job.namespace(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[tracing::instrument(skip_all, fields(job = %job.name_any(), namespace = job.namespace().unwrap_or_default()))]
async fn reconcile(job: Arc<TrainingJob>, ctx: Arc<Context>) -> Result<Action> {
    if let Some(lease) = job.metadata.namespace.as_deref().and_then(|ns| ctx.yields.holder(ns)) {
        // Another operator handles this namespace's jobs; look again after the next survey.
        tracing::debug!(job = %job.name_any(), %lease, "left to another operator");
        let every = ctx
            .settings
            .lease
            .as_ref()
            .map_or(Duration::from_secs(60), |l| scope::survey_every(l.lease_duration));
        return Ok(Action::requeue(every));
    }
    let timer = ctx.metrics.reconcile_seconds.with_label_values(&[] as &[&str]).start_timer();
    let result = reconcile_job(&job, &ctx).await;
    timer.observe_duration();
    let outcome = if result.is_ok() { "success" } else { "error" };
    ctx.metrics.reconciles.with_label_values(&[outcome]).inc();
    match &result {
        Ok(_) => ctx.backoffs.reset(job.metadata.uid.as_deref().unwrap_or_default()),
        Err(e) => {
            ctx.metrics.reconcile_errors.with_label_values(&[e.metric_reason()]).inc();
            // A conflict is optimistic concurrency doing its job: the retry reads anew.
            if !e.is_conflict() {
                report_failure(&job, &ctx, e).await;
            }
        }
    }
    result
}

/// Tells the user why the job is stuck: a Warning event and the `ReconcileFailed` condition
/// (the phase stays what was last reached). Best effort: the failure may be one that stops
/// these writes too.
async fn report_failure(job: &TrainingJob, ctx: &Context, error: &Error) {
    let (Some(name), Some(namespace)) = (job.metadata.name.as_deref(), job.metadata.namespace.as_deref())
    else {
        return;
    };
    let old = job.status.clone().unwrap_or_default();
    let reason = error.condition_reason();
    let message = error.to_string();
    let new = status::with_reconcile_failure(
        &old,
        &reason,
        &message,
        job.metadata.generation,
        &Time(Timestamp::now()),
    );
    if new == old {
        return; // reported already: the same failure again
    }
    publish(ctx, job, EventType::Warning, status::RECONCILE_FAILED, "Reconcile", &message).await;
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = status_patch(job, &new);
    if let Err(e) = api.patch_status(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(patch)).await {
        tracing::warn!(error = %e, "could not record the failure in the status");
    }
}

async fn reconcile_job(job: &TrainingJob, ctx: &Context) -> Result<Action> {
    if job.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the children (owner references).
        return Ok(Action::await_change());
    }
    let owner = Owner::new(job).ok_or(Error::Incomplete)?;
    ctx.caches.ready().await;
    let old = job.status.clone().unwrap_or_default();
    if matches!(old.phase, Some(Phase::Succeeded | Phase::Failed)) {
        remove_ps(ctx, &owner).await?;
        let reason = old.reason.clone().unwrap_or_default();
        admission::finish(ctx, &owner, old.phase == Some(Phase::Succeeded), &reason).await?;
        return expire(ctx, job, &owner, &old).await;
    }
    let now = Time(Timestamp::now());
    let mut invalid: Vec<String> =
        crate::api::validate(&job.spec).err().unwrap_or_default().iter().map(ToString::to_string).collect();
    invalid.extend(crate::api::validate_name(&owner.name).err().map(String::from));
    if !invalid.is_empty() {
        // The CRD's rules refuse such a job; this catches a CRD older than the operator.
        let state = State { phase: Phase::Failed, reason: "InvalidSpec".into(), message: invalid.join("; ") };
        let observed = observed_nothing(job);
        write_status(ctx, job, &owner, &old, &observed, &state, &now).await?;
        return Ok(Action::await_change());
    }

    if admission::default_queue(ctx, job, &owner).await? {
        return Ok(Action::await_change());
    }
    let defaults = job_defaults(ctx, &owner, &old);
    let token = apply_stable_children(ctx, &owner, &defaults).await?;
    let admission = admission::admit(ctx, job, &owner, &defaults).await?;
    let owner = owner.with_admission(admission);
    let PodChildren { ps: ps_deployments, ready_shards, workers, failed_earlier, deferred } =
        apply_pod_children(ctx, job, &owner, &defaults).await?;
    let shards = job.spec.parameter_server.shards() as u32;
    let ps_ready = ready_shards == shards;

    let worker_job = WorkerJob { failed_earlier, ..worker_state(&workers) };
    let placement = pods::placement(ctx, &owner).await?;
    let trouble = pods::trouble(ctx, &owner, &ps_deployments, &workers).await?;
    let trouble_expired =
        trouble.is_some() && pods::trouble_older_than(&old, ctx.settings.stuck_pods_timeout);
    // Seconds left before runPolicy.activeDeadlineSeconds (negative: past it).
    let deadline = job.spec.run_policy.active_deadline_seconds;
    let deadline_left = deadline.and_then(|d| {
        let since = status::active_since(&old)?;
        Some(d as f64 - now.0.duration_since(since.0).as_secs_f64())
    });
    let ps = ctx.ps_addr(&owner, defaults.ps_tls);
    // Only when a call to the PS is due: a PS not ready (scaled to 0 by Kueue, starting) would
    // cost a request, up to its timeout, on every reconcile.
    let token = if ps_ready || worker_job.complete {
        accepted_control_token(ctx, &ps, owner.uid(), token).await
    } else {
        token
    };
    let (progress, ps_process) =
        if ps_ready { observe_ps(ctx, job, &old, &ps, &token).await } else { (None, None) };
    let finalize = if worker_job.complete {
        match pods::final_model_reported(ctx, &owner, &workers) {
            Some(m) => Finalize::Done { version: m.version, path: m.path, earlier: m.earlier },
            None => finalize(&ps, &token, &workers, ctx.settings.finalize_grace).await,
        }
    } else {
        Finalize::NotYet
    };
    let observed = Observed {
        generation: job.metadata.generation,
        replicas: job.spec.workers.replicas,
        worker_selector: children::worker_selector(&owner.name),
        min_replicas: job.spec.workers.min_replicas,
        backoff_limit: job.spec.run_policy.backoff_limit,
        suspend: job.spec.run_policy.suspend == Some(true),
        admission: owner.admission().clone(),
        workers: Some(worker_job),
        ps_ready,
        ps_shards: (shards > 1).then_some(ShardsReady { count: shards, ready: ready_shards }),
        placement,
        trouble,
        trouble_expired,
        deferred,
        deadline_exceeded: deadline.filter(|_| deadline_left.is_some_and(|l| l <= 0.0)),
        finalize,
        model_place: owner.model_place(),
        default_images: Some((&defaults).into()),
        progress,
        ps_process,
        has_run: matches!(old.phase, Some(Phase::Running | Phase::Restarting)),
    };
    let state = status::decide(&observed);
    let new = write_status(ctx, job, &owner, &old, &observed, &state, &now).await?;
    if state.is_finished() {
        ctx.forget_progress(owner.uid());
        admission::finish(ctx, &owner, state.phase == Phase::Succeeded, &state.message).await?;
        remove_ps(ctx, &owner).await?;
        if let (Some(start), Some(end)) = (&new.start_time, &new.completion_time) {
            let seconds = end.0.duration_since(start.0).as_secs_f64().max(0.0);
            ctx.metrics.job_duration.with_label_values(&[phase_name(state.phase)]).observe(seconds);
        }
        return expire(ctx, job, &owner, &new).await;
    }
    let next = match (state.phase, &observed.finalize) {
        (_, Finalize::Failed(_)) => Duration::from_secs(5),
        // Failing pods fail the job once the bound has passed: look again by then.
        _ if observed.trouble.is_some() => ctx.settings.stuck_pods_timeout.min(Duration::from_secs(60)),
        (Phase::Running, _) => ctx.settings.progress_every,
        // Watches bring every change of the children; this only bounds a missed one.
        _ => Duration::from_secs(60),
    };
    // And at the deadline.
    let next =
        deadline_left.filter(|l| *l > 0.0).map_or(next, |l| next.min(Duration::from_secs_f64(l + 0.5)));
    Ok(Action::requeue(next))
}

/// The children that do not wait for admission: the token Secret, the claims, the PS's
/// Services and what guards the PS (its NetworkPolicy and PodDisruptionBudget, when asked
/// for). Returns the control token, the operator's credential for its own calls to the PS
/// (status, rescale, finalize).
async fn apply_stable_children(ctx: &Context, owner: &Owner<'_>, defaults: &ChildDefaults) -> Result<String> {
    let (workers_token, token) =
        (ctx.settings.token_key.job_token(owner.uid()), ctx.settings.token_key.control_token(owner.uid()));
    let ns = &owner.namespace;
    writes::create_once(ctx, ns, &owner.secret_name(), || Ok(owner.secret(&workers_token, &token))).await?;
    if defaults.ps_tls {
        writes::create_once(ctx, ns, &owner.tls_secret_name(), || {
            let names = ps_tls::server_names(owner.ps_service_names(), ns);
            let certs = ps_tls::issue(&ctx.settings.token_key, owner.uid(), created_s(owner.job), names)?;
            Ok(owner.tls_secret(&certs))
        })
        .await?;
    }
    let own = owner.mark();
    for pvc in owner.pvcs() {
        let seen = ctx.caches.claim(&owner.namespace, &pvc.name_any());
        writes::apply(ctx, pvc, seen, own).await?;
    }
    if let Some(pvc) = owner.output_pvc() {
        let seen = ctx.caches.claim(&owner.namespace, &pvc.name_any());
        writes::apply(ctx, pvc, seen, Mark::Labels { job: &owner.name }).await?;
    }
    for shard in owner.ps_shards() {
        let service = owner.ps_service(shard, defaults.ps_tls);
        let seen = ctx.caches.service(&owner.namespace, &service.name_any());
        writes::apply(ctx, service, seen, own).await?;
    }
    if let Some(peers) = &ctx.settings.ps_ingress_from {
        let policy = owner.ps_network_policy(peers);
        let seen = ctx.caches.network_policy(&owner.namespace, &policy.name_any());
        writes::apply(ctx, policy, seen, own).await?;
    }
    let budget = owner.ps_disruption_budget();
    let seen = ctx.caches.disruption_budget(&owner.namespace, &budget.name_any());
    match (owner.job.spec.parameter_server.disruption_budget == Some(true), seen) {
        (true, seen) => {
            writes::apply(ctx, budget, seen, own).await?;
        }
        // Turned off while the job runs: the drains it held back may go on.
        (false, Some(seen)) => writes::delete(ctx, &seen, own).await?,
        (false, None) => {}
    }
    Ok(token)
}

/// The children that run pods, as the API server has them after this reconcile's writes.
struct PodChildren {
    /// Each shard's Deployment.
    ps: Vec<Deployment>,
    /// Shards with a ready pod.
    ready_shards: u32,
    workers: Job,
    /// Worker pods that failed in earlier worker Jobs (the status's count, plus the Job this
    /// reconcile replaced).
    failed_earlier: u32,
    /// Spec changes the children do not have yet, and why.
    deferred: Vec<String>,
}

/// The PS Deployments and the worker Job, shaped by Kueue's admission (`owner`).
async fn apply_pod_children(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    defaults: &ChildDefaults,
) -> Result<PodChildren> {
    let mut deferred = Vec::new();
    let mut ps = Vec::new();
    for shard in owner.ps_shards() {
        ps.push(apply_ps_deployment(ctx, job, owner, defaults, shard, &mut deferred).await?);
    }
    let ready = |d: &Deployment| d.status.as_ref().and_then(|s| s.ready_replicas).is_some_and(|r| r >= 1);
    let ready_shards = ps.iter().filter(|d| ready(d)).count() as u32;
    let (workers, replaced_failures) = apply_worker_job(ctx, job, owner, defaults, &mut deferred).await?;
    let failed_earlier = owner.failed_earlier() + replaced_failures;
    Ok(PodChildren { ps, ready_shards, workers, failed_earlier, deferred })
}

fn observed_nothing(job: &TrainingJob) -> Observed {
    Observed {
        generation: job.metadata.generation,
        replicas: job.spec.workers.replicas,
        worker_selector: children::worker_selector(&job.name_any()),
        min_replicas: job.spec.workers.min_replicas,
        backoff_limit: job.spec.run_policy.backoff_limit,
        suspend: false,
        admission: Admission::NotQueued,
        workers: None,
        ps_ready: false,
        ps_shards: None,
        placement: Placement::Scheduled,
        trouble: None,
        trouble_expired: false,
        deferred: Vec::new(),
        deadline_exceeded: None,
        finalize: Finalize::NotYet,
        model_place: children::ModelPlace::EmptyDir,
        default_images: None,
        progress: None,
        ps_process: None,
        has_run: false,
    }
}

/// Applies the Deployment of PS shard `shard`, except when that would restart a PS whose memory holds the only
/// copy of the model: a changed pod template (a new learning rate, image or resources) rolls the
/// Deployment, and without `checkpoint.storage` the new pod would start from scratch. Then the
/// running PS keeps its settings, a Warning event says why, and so does `deferred` (for the
/// `SpecApplied` condition). Returns the Deployment as the API server has it (status included).
async fn apply_ps_deployment(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    defaults: &ChildDefaults,
    shard: usize,
    deferred: &mut Vec<String>,
) -> Result<Deployment> {
    let running = ctx.caches.deployment(&owner.namespace, &children::ps_shard_name(&owner.name, shard));
    if let Some(d) = &running {
        writes::ours(d, owner.mark())?;
    }
    // The worker count the PS started with stays in its template (scaling tells the PS over
    // HTTP, see `tell_ps_workers`), so that a change of workers.replicas never rolls it.
    let workers = running.as_ref().and_then(children::ps_workers_of).unwrap_or(job.spec.workers.replicas);
    let desired = owner.ps_deployment(defaults, workers, shard);
    if owner.checkpoint_storage().is_none() {
        let hash = |d: &Deployment| d.annotations().get(children::PS_TEMPLATE_HASH).cloned();
        // A Deployment scaled to 0 (a job Kueue has not admitted yet) has no model to lose.
        let scaled_to_zero = |d: &Deployment| d.spec.replicas == Some(0);
        if let Some(running) = &running
            && hash(running) != hash(&desired)
            && !scaled_to_zero(running)
        {
            let message = "the parameter server's settings changed, but it keeps them: without \
                           parameterServer.checkpoint.storage its memory holds the only copy of the model, \
                           and a restart would lose it";
            publish(ctx, job, EventType::Warning, "SpecChangeNotApplied", "UpdateParameterServer", message)
                .await;
            deferred.push(message.into());
            return Ok(running.clone());
        }
    }
    writes::apply(ctx, desired, running, owner.mark()).await
}

/// Applies the worker Job as `children::worker_job_update` decides: a changed pod template
/// reaches the workers only through a suspension, and says so while it waits (an event, and
/// `deferred`). Returns the Job as the API server has it, and the failed pods of a Job it
/// replaced (they still count against `backoffLimit`).
async fn apply_worker_job(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    defaults: &ChildDefaults,
    deferred: &mut Vec<String>,
) -> Result<(Job, u32)> {
    let running = ctx.caches.job(&owner.namespace, &children::workers_name(&owner.name));
    if let Some(j) = &running {
        writes::ours(j, owner.mark())?;
    }
    match children::worker_job_update(owner.worker_job(defaults), running.as_ref()) {
        WorkerJobUpdate::Apply(desired) => Ok((writes::apply(ctx, desired, running, owner.mark()).await?, 0)),
        WorkerJobUpdate::Recreate(desired) => {
            let replaced = running.as_ref().map_or(0, |j| worker_state(j).failed);
            // No pod is left, so nothing goes with the Job; each worker of the new one resumes
            // at the step the parameter server recorded for it.
            if let Some(j) = &running {
                writes::delete(ctx, j, owner.mark()).await?;
            }
            let message = if owner.suspended() {
                "the workers' pod template changed while the job was suspended: the worker Job was \
                 recreated with it; on resume each worker continues where it stopped"
            } else {
                "the workers' pod template changed while they were stopped (the placement of the \
                 flavors Kueue admitted the job to): the worker Job was recreated with it; each worker \
                 continues where it stopped"
            };
            publish(ctx, job, EventType::Normal, "WorkersRecreated", "UpdateWorkers", message).await;
            Ok((writes::apply(ctx, desired, None, owner.mark()).await?, replaced))
        }
        WorkerJobUpdate::Deferred(desired) => {
            if !owner.stopped() {
                let message = "the running worker Job keeps its pod template: set runPolicy.suspend: true \
                               to apply the change (the workers are recreated with it, and resume where they stopped)";
                publish(ctx, job, EventType::Warning, "SpecChangeNotApplied", "UpdateWorkers", message).await;
                deferred.push(message.into());
            }
            Ok((writes::apply(ctx, desired, running, owner.mark()).await?, 0))
        }
    }
}

/// The images for the roles whose spec names none: those recorded in the job's status when the
/// operator first handled it, so that new operator defaults (a chart upgrade) never roll a
/// running job's pods. A job an operator before that record started keeps the images its
/// children run (read from the caches, and only from children that are the job's); a new job
/// takes the operator's defaults. The same for TLS between workers and PS: a running PS keeps
/// the transport it has.
fn job_defaults(ctx: &Context, owner: &Owner<'_>, old: &TrainingJobStatus) -> ChildDefaults {
    if let Some(d) = &old.default_images {
        return d.into();
    }
    let mut defaults = ctx.settings.defaults.clone();
    let image = |spec: Option<PodSpec>| spec?.containers.into_iter().next()?.image;
    let spec = &owner.job.spec;

    let running_ps = ctx
        .caches
        .deployment(&owner.namespace, &children::ps_name(&owner.name))
        .filter(|d| writes::ours(d, owner.mark()).is_ok())
        .and_then(|d| d.spec.template.spec);
    if let Some(pod) = &running_ps {
        let env = pod.containers.first().and_then(|c| c.env.as_ref());
        defaults.ps_tls = env.is_some_and(|env| env.iter().any(|e| e.name == "FORESIGHT_TLS_CERT"));
    }
    if spec.parameter_server.image.is_none()
        && let Some(i) = image(running_ps)
    {
        defaults.ps_image = i;
    }
    if spec.workers.image.is_none() {
        let running = ctx.caches.job(&owner.namespace, &children::workers_name(&owner.name));
        if let Some(i) = image(
            running.filter(|j| writes::ours(j, owner.mark()).is_ok()).and_then(|j| j.spec?.template.spec),
        ) {
            defaults.worker_image = i;
        }
    }
    defaults
}

fn worker_state(job: &Job) -> WorkerJob {
    let s = job.status.clone().unwrap_or_default();
    let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    let conditions = s.conditions.unwrap_or_default();
    let is_true = |c: &&k8s_openapi::api::batch::v1::JobCondition| c.status == "True";
    WorkerJob {
        active: count(s.active),
        ready: count(s.ready),
        succeeded: count(s.succeeded),
        failed: count(s.failed),
        failed_earlier: 0,
        stopped: children::is_idle_suspended(job),
        // SuccessCriteriaMet and FailureTarget come first; Complete and Failed follow once every
        // pod has terminated, which can take a node's grace period. The outcome is decided at
        // the first.
        complete: conditions
            .iter()
            .filter(is_true)
            .any(|c| c.type_ == "Complete" || c.type_ == "SuccessCriteriaMet"),
        failed_condition: conditions
            .iter()
            .filter(is_true)
            .find(|c| c.type_ == "Failed" || c.type_ == "FailureTarget")
            .map(|c| {
                (c.reason.clone().unwrap_or_else(|| "Failed".into()), c.message.clone().unwrap_or_default())
            }),
    }
}

/// Reads the ready PS's `/v1/status` when it is due, and tells it the worker count if it has
/// another: the progress and the PS process, or `None`s (not due, or no answer: the last
/// progress stays in the status).
async fn observe_ps(
    ctx: &Context,
    job: &TrainingJob,
    old: &TrainingJobStatus,
    ps: &PsAddr,
    token: &str,
) -> (Option<Progress>, Option<PsProcess>) {
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    // A spec change (a new workers.replicas among others) reaches the PS at once; otherwise the
    // count it reports is checked with each periodic read (a restarted PS starts with the count
    // its Deployment was made with). A PS that has just become ready may be a new process: it is
    // read at once, so that its restart is seen even when the job ends before the next read.
    let spec_changed = job.metadata.generation != old.observed_generation;
    let came_up = !old.parameter_server.as_ref().is_some_and(|p| p.ready);
    if !(ctx.progress_due(uid) || spec_changed || came_up) {
        return (None, None);
    }
    let Some(status) = read_ps_status(ps, token).await else { return (None, None) };
    tell_ps_workers(ctx, job, ps, token, &status).await;
    (Some(progress_of(&status)), ps_process_of(&status))
}

/// The control token the job's PS accepts: the current key's, or, after a key rotation, the
/// previous key's for a job created before it (its pods hold the tokens of its Secret, written
/// once). Without a previous key, no request is made; with one, the PS is asked until it has
/// answered once for this job, and the answer is kept.
async fn accepted_control_token(ctx: &Context, ps: &PsAddr, uid: &str, current: String) -> String {
    let Some(previous) = &ctx.settings.previous_token_key else { return current };
    let known = ctx.previous_key.lock().unwrap_or_else(|e| e.into_inner()).get(uid).copied();
    let uses_previous = match known {
        Some(p) => p,
        None => match token_accepted(ps, current.clone()).await {
            Some(true) => false,
            Some(false) if token_accepted(ps, previous.control_token(uid)).await == Some(true) => true,
            // No answer, or neither token taken: ask again on a later reconcile.
            _ => return current,
        },
    };
    ctx.previous_key.lock().unwrap_or_else(|e| e.into_inner()).insert(uid.to_string(), uses_previous);
    if uses_previous { previous.control_token(uid) } else { current }
}

/// Whether the PS at `url` accepts `token` (`None`: it did not answer within 3 s).
async fn token_accepted(ps: &PsAddr, token: String) -> Option<bool> {
    let client = ps.client(token).ok()?;
    match tokio::time::timeout(Duration::from_secs(3), client.status()).await {
        Ok(Ok(_)) => Some(true),
        Ok(Err(e)) if e.reason() == Some("unauthorized") => Some(false),
        _ => None,
    }
}

/// The parameter server's `/v1/status`; `None` when it does not answer.
async fn read_ps_status(ps: &PsAddr, token: &str) -> Option<serde_json::Value> {
    let client = ps.client(token.to_string()).ok()?;
    match tokio::time::timeout(Duration::from_secs(3), client.status()).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            tracing::debug!(url = %ps.url, error = %e, "parameter server status");
            None
        }
        Err(_) => None,
    }
}

/// Tells the PS the job's worker count when the count it reports (`status`) differs: after a
/// change of workers.replicas, or a PS restarted with its Deployment's original count.
async fn tell_ps_workers(
    ctx: &Context,
    job: &TrainingJob,
    ps: &PsAddr,
    token: &str,
    status: &serde_json::Value,
) {
    let desired = job.spec.workers.replicas;
    let Some(current) = status.get("workers_expected").and_then(serde_json::Value::as_u64) else { return };
    if current == u64::from(desired) {
        return;
    }
    let result = match ps.client(token.to_string()) {
        Ok(c) => match tokio::time::timeout(Duration::from_secs(3), c.set_workers(desired as usize)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("no answer within 3s".into()),
        },
        Err(e) => Err(e.to_string()),
    };
    match result {
        Ok(()) => {
            let message = format!("the parameter server now expects {desired} workers (was {current})");
            tracing::info!(%message, "workers scaled");
            publish(ctx, job, EventType::Normal, "WorkersScaled", "ScaleWorkers", &message).await;
        }
        // The next reconcile tries again; the new workers retry their join meanwhile.
        Err(e) => tracing::warn!(error = %e, desired, "telling the parameter server the worker count"),
    }
}

fn ps_process_of(v: &serde_json::Value) -> Option<PsProcess> {
    let p = v.get("process")?;
    let started_ms = p.get("started_at_ms")?.as_i64()?;
    Some(PsProcess {
        incarnation: p.get("incarnation")?.as_str()?.to_string(),
        started_at: Time(Timestamp::from_millisecond(started_ms).ok()?),
        restored_version: p.get("restored_version").and_then(serde_json::Value::as_u64),
    })
}

fn progress_of(v: &serde_json::Value) -> Progress {
    let num = |path: &[&str]| path.iter().try_fold(v, |v, k| v.get(k)).and_then(serde_json::Value::as_f64);
    Progress {
        step: num(&["version"]).unwrap_or(0.0) as u64,
        epoch: num(&["epoch"]).unwrap_or(0.0).floor() as u32,
        loss: num(&["loss"]),
        accuracy: num(&["accuracy"]),
        staleness_p50: num(&["staleness", "p50"]),
        staleness_p99: num(&["staleness", "p99"]),
    }
}

/// Asks the parameter server to write the final model (when no worker has recorded that the
/// PS wrote it already); gives up `grace` after the workers finished (the job then fails for
/// want of its model rather than keeping the PS forever).
async fn finalize(ps: &PsAddr, token: &str, workers: &Job, grace: Duration) -> Finalize {
    let result = match ps.client(token.to_string()) {
        Ok(client) => match tokio::time::timeout(Duration::from_secs(30), client.finalize()).await {
            Ok(Ok(m)) => return Finalize::Done { version: m.version, path: m.path, earlier: m.earlier },
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 30s".to_string(),
        },
        Err(e) => e.to_string(),
    };
    let finished = workers.status.as_ref().and_then(|s| s.completion_time.as_ref()).map(|t| t.0);
    let waited = finished.map(|t| Timestamp::now().duration_since(t).as_secs_f64()).unwrap_or(0.0);
    if waited > grace.as_secs_f64() {
        Finalize::GaveUp(format!("{result} (gave up after {:.0}s)", waited))
    } else {
        Finalize::Failed(result)
    }
}

#[allow(clippy::too_many_arguments)]
async fn write_status(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    old: &TrainingJobStatus,
    observed: &Observed,
    state: &State,
    now: &Time,
) -> Result<TrainingJobStatus> {
    let new = status::next_status(old, observed, state, now);
    if &new != old {
        let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &owner.namespace);
        let patch = status_patch(job, &new);
        api.patch_status(&owner.name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(patch)).await?;
    }
    if let Some(t) = status::transition(old, state) {
        tracing::info!(phase = phase_name(t.phase), reason = %t.reason, message = %t.message, "transition");
        let type_ = if t.is_warning() { EventType::Warning } else { EventType::Normal };
        publish(ctx, job, type_, &t.reason, phase_name(t.phase), &t.message).await;
    }
    if let Some(message) = status::ps_restart_event(old, &new) {
        tracing::warn!(%message, "parameter server restarted");
        publish(ctx, job, EventType::Warning, status::PS_RESTARTED, "WatchParameterServer", &message).await;
    }
    Ok(new)
}

/// The server-side apply of `status`, conditional on the job's resourceVersion: a reconcile
/// that started from an older copy of the job (the watch had not yet brought this operator's
/// own last write) gets a conflict and runs again, instead of writing older progress over
/// newer (seen on the real node: step 1536, then 1320 again, then 1536).
fn status_patch(job: &TrainingJob, status: &TrainingJobStatus) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "metadata": {"resourceVersion": job.metadata.resource_version},
        "status": status,
    })
}

/// Records an Event about the job (a failure to record is logged, not fatal).
async fn publish(
    ctx: &Context,
    job: &TrainingJob,
    type_: EventType,
    reason: &str,
    action: &str,
    message: &str,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(message.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &job.object_ref(&())).await {
        tracing::warn!(error = %e, "could not record the event");
    }
}

/// Removes the parameter server (each shard's Deployment and Service) once the job has ended:
/// deleting a Deployment stops the pod with SIGTERM, on which the PS writes its last checkpoint.
async fn remove_ps(ctx: &Context, owner: &Owner<'_>) -> Result<()> {
    for shard in owner.ps_shards() {
        let name = children::ps_shard_name(&owner.name, shard);
        if let Some(d) = ctx.caches.deployment(&owner.namespace, &name) {
            writes::delete(ctx, &d, owner.mark()).await?;
            tracing::info!(%name, "removed the parameter server");
        }
        if let Some(s) = ctx.caches.service(&owner.namespace, &name) {
            writes::delete(ctx, &s, owner.mark()).await?;
        }
    }
    Ok(())
}

/// `ttlSecondsAfterFinished`: deletes the job (and, through the garbage collector, everything
/// it owns) that long after it finished.
async fn expire(
    ctx: &Context,
    job: &TrainingJob,
    owner: &Owner<'_>,
    status: &TrainingJobStatus,
) -> Result<Action> {
    let (Some(ttl), Some(done)) = (job.spec.run_policy.ttl_seconds_after_finished, &status.completion_time)
    else {
        return Ok(Action::await_change());
    };
    let left = ttl as f64 - Timestamp::now().duration_since(done.0).as_secs_f64();
    if left > 0.0 {
        return Ok(Action::requeue(Duration::from_secs_f64(left)));
    }
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    match api.delete(&owner.name, &DeleteParams::background()).await {
        Ok(_) => tracing::info!(ttl, "deleted the finished job (ttlSecondsAfterFinished)"),
        Err(e) if is_status(&e, 404) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}
