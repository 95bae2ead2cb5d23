//! Route handlers: parse, call the store, answer.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router, middleware};
use serde::Serialize;

use super::admission::Gated;
use super::body::{Gradient, read_gradient, read_limited};
use super::credential::Incarnation;
use super::guarded_body::{BodyGuard, guard_request_body};
use super::replicas::Answer;
use super::{ApiError, AppState, auth, streamed_pull};
use crate::pace::PaceReport;
use crate::pool::lend;
use crate::store::journal::BodyInfo;
use crate::store::{BackupAs, MAX_EPOCH, MAX_VERSION, Push, Store};
use crate::wire;
use crate::wire::final_model::FinalModel;
use crate::wire::protocol::{
    CLIENT_VERSION_HEADER, COPY_HEADER, DELTA_FROM_HEADER, HELD_HEADER, INCARNATION_HEADER, PS_VERSION,
    Report, VERSION_HEADER, reason, route, speaks_our_protocol,
};

fn check_client_version(headers: &HeaderMap) -> Result<(), ApiError> {
    // A client that names no version (curl, an older worker) is taken: the layout checks still apply.
    let Some(v) = headers.get(CLIENT_VERSION_HEADER) else { return Ok(()) };
    let client = v.to_str().unwrap_or("?");
    if speaks_our_protocol(client) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        reason::VERSION_MISMATCH,
        format!(
            "this worker's Foresight {client} cannot work with parameter server {PS_VERSION}: \
             run the worker image (or the foresight wheel) of the operator's release"
        ),
    ))
}

pub fn router(state: Arc<AppState>) -> Router {
    let guard = BodyGuard { idle: state.config.body_idle_timeout, min_rate: state.config.body_min_rate };
    let v1 = Router::new()
        .route(route::MODEL, put(register).get(pull))
        .route(route::JOIN, post(join))
        .route(route::GRADIENTS, post(push))
        .route(route::REPORT, post(report))
        .route(route::LEAVE, post(leave))
        .route(route::HEARTBEAT, post(heartbeat))
        .route(route::STATUS, get(status))
        .route(route::FINALIZE, post(finalize))
        .route(route::WORKERS, put(set_workers))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_token));
    Router::new()
        .merge(v1)
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(|| async { "ready" }))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this endpoint",
            )
        })
        // Bodies are read by the handlers under the PS's own limit.
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(guard, guard_request_body))
        .with_state(state)
}

/// `GET /healthz`: the process serves, and its store is not stuck: pushes that have waited in it
/// for `store_stuck_after` with no update finishing fail the liveness probe (503 `store_stuck`).
async fn healthz(State(state): State<Arc<AppState>>) -> Result<&'static str, ApiError> {
    match state.store_watch.stuck(state.config.store_stuck_after) {
        None => Ok("ok"),
        Some((inside, waited)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_stuck",
            format!(
                "{inside} push(es) have waited {:.0} s in the model's store with no update finishing",
                waited.as_secs_f64()
            ),
        )),
    }
}

/// Query parameters, parsed by hand so that every mistake gets a message naming the field.
struct Params(HashMap<String, String>);

impl Params {
    fn get<T: FromStr>(&self, key: &str) -> Result<Option<T>, ApiError> {
        self.0
            .get(key)
            .map(|v| {
                v.parse()
                    .map_err(|_| ApiError::bad_request(format!("query parameter {key}={v:?} is not valid")))
            })
            .transpose()
    }

    fn require<T: FromStr>(&self, key: &str) -> Result<T, ApiError> {
        self.get(key)?.ok_or_else(|| ApiError::bad_request(format!("query parameter {key} is required")))
    }
}

fn registered(state: &AppState) -> Result<Arc<Store>, ApiError> {
    state.store().cloned().ok_or_else(ApiError::not_registered)
}

fn worker_in_range(state: &AppState, worker: usize) -> Result<(), ApiError> {
    let workers = state.workers();
    if worker >= workers {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            reason::UNKNOWN_WORKER,
            format!("worker {worker} is out of range: this job has {workers} workers (0..{workers})"),
        ));
    }
    Ok(())
}

/// `PUT /v1/model[?version=V&worker=M]`: the first worker registers the initial model; after a
/// restart that lost the model, workers offer their copies of version V and the freshest wins.
async fn register(
    State(state): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let q = Params(q);
    let version: u64 = q.get("version")?.unwrap_or(0);
    if version > MAX_VERSION {
        return Err(ApiError::bad_request(format!(
            "version {version} is above {MAX_VERSION}, the largest a model can have"
        )));
    }
    let worker: Option<usize> = q.get("worker")?;
    match worker {
        Some(w) => {
            worker_in_range(&state, w)?;
            state.credentials.check(&headers, w, None)?;
        }
        // Only a worker's copy, offered to a PS that lost its model, may be of a later version
        // than the initial model: a registration names none, so it cannot replace a model
        // trained since.
        None if version > 0 => {
            return Err(ApiError::bad_request(
                "a model of a version above 0 is a worker's copy: offer it with PUT /v1/model?worker=M&version=V",
            ));
        }
        None => {}
    }
    let _one_at_a_time = state.registering.lock().await;
    if state.store().is_some_and(|s| !s.takes_copy(version)) {
        state.offered(worker);
        return Err(already_registered());
    }
    let mut buf = state.bodies.take();
    let result = read_limited(&headers, body, state.config.body_limit, &mut buf).await;
    state.metrics.received_bytes.inc_by(buf.len() as u64);
    result?;
    let config = state.config.clone();
    let (buf, built) = tokio::task::spawn_blocking(move || {
        let built = wire::decode_model(&buf).map(|(layout, values, _)| match worker {
            // A worker's copy (the PS had lost the model), or a job's first registration.
            Some(_) => Store::seeded(layout, values, version, config.hyper.clone(), config.workers),
            None => Store::registered(layout, values, version, config.hyper.clone(), config.workers),
        });
        (buf, built)
    })
    .await
    .expect("decode task panicked");
    // Freed, not pooled: the pool's bodies are the K pushes' that the memory plan counts.
    drop(buf);
    let store = built?;
    unsharded_groups_match(&state, &store)?;
    let (params, tensors) = (store.layout().len(), store.layout().tensors().len());
    if state.store().is_some_and(|s| s.layout() != store.layout()) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            reason::LAYOUT_MISMATCH,
            "the registered model has another layout: this worker trains a different model",
        ));
    }
    // Installing writes the journal's initial model; a re-seed copies the whole model.
    let offering = state.clone();
    let taken = tokio::task::spawn_blocking(move || offering.offer(store, worker))
        .await
        .expect("offer task panicked");
    if !taken {
        return Err(already_registered());
    }
    tracing::info!(params, tensors, version, "model registered");
    let body = serde_json::json!({ "version": version, "parameters": params, "tensors": tensors });
    Ok((StatusCode::CREATED, [(VERSION_HEADER, HeaderValue::from(version))], Json(body)).into_response())
}

/// An unsharded PS refuses a model that one of the job's parameter groups matches no tensor
/// of: a mistyped pattern would otherwise leave every tensor at the job's rates, silently. (A
/// shard sees only its slice: a group may match other shards' tensors; `/v1/status` says what
/// each group took.)
fn unsharded_groups_match(state: &AppState, store: &Store) -> Result<(), ApiError> {
    let groups = &store.hyper().parameter_groups;
    let sharded = !state.config.peers.is_empty() || state.config.shard > 0;
    let Some(i) = store.group_parameters().iter().position(|&n| n == 0).filter(|_| !sharded) else {
        return Ok(());
    };
    let names: Vec<&str> = store.layout().tensors().iter().take(8).map(|t| t.name.as_str()).collect();
    Err(ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        reason::LAYOUT_MISMATCH,
        format!(
            "parameter group {i} (names {:?}) matches no tensor of the model: the job's optimizer.parameterGroups and the model disagree (its tensors begin {})",
            groups[i].names,
            names.join(", ")
        ),
    ))
}

/// `POST /v1/join?worker=M[&step=S]`: a new process becomes worker M. It gets a generation for
/// its pushes (the previous process's late pushes are refused from now on) and the step to
/// resume from; `step` is the worker's own position when it is further along than the PS knows.
async fn join(
    State(state): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_client_version(&headers)?;
    let q = Params(q);
    let worker: usize = q.require("worker")?;
    let step: Option<u64> = q.get("step")?;
    if let Some(s) = step.filter(|&s| s > MAX_VERSION) {
        // A worker's position counts its steps, as versions count updates: no more than a model
        // can have (its resume step would skip all its training).
        return Err(ApiError::bad_request(format!(
            "step {s} is above {MAX_VERSION}, more steps than any job has"
        )));
    }
    worker_in_range(&state, worker)?;
    let store = registered(&state)?;
    state.saw(worker).await;
    let joined = store.join(worker, step)?;
    // A process that joins after the PS lost its model has offered its copy, or has none.
    state.offered(Some(worker));
    state.metrics.joins.inc();
    tracing::info!(worker, generation = joined.generation, resume_step = joined.resume_step, "worker joined");
    let generation = joined.generation;
    let mut answer = serde_json::to_value(joined).expect("plain data");
    if let Some(c) = state.credentials.issue(Incarnation { worker, generation }) {
        answer["credential"] = c.into();
    }
    answer["heartbeat_ms"] = (state.heartbeat_every().as_millis() as u64).into();
    // What a worker cannot do under some rules (an overlapped exchange under sync) it learns
    // here: the job's settings reach the PS, not every worker's environment.
    answer["algorithm"] = serde_json::to_value(state.config.hyper.algorithm).expect("plain data");
    Ok(Json(answer))
}

/// `POST /v1/heartbeat?worker=M`: the worker is alive and training between exchanges (local
/// steps). It counts as heard, as any request does: not marked silent, and a `sync` round that
/// waits for it is not closed short while it is heard.
async fn heartbeat(
    State(state): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let worker: usize = Params(q).require("worker")?;
    worker_in_range(&state, worker)?;
    state.credentials.check(&headers, worker, None)?;
    state.heard_beat(worker).await;
    Ok(StatusCode::NO_CONTENT)
}

fn already_registered() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "already_registered",
        "a model is already registered: pull it with GET /v1/model",
    )
}

async fn pull(
    State(state): State<Arc<AppState>>,
    method: axum::http::Method,
    Query(q): Query<HashMap<String, String>>,
    request_headers: HeaderMap,
) -> Result<Response, ApiError> {
    let q = Params(q);
    let worker: usize = q.require("worker")?;
    let min_version: Option<u64> = q.get("min_version")?;
    let wait_ms: u64 = q.get("wait_ms")?.unwrap_or(0);
    let how = pull_as(&q)?;
    // `overlap=true`: the worker computes its next gradient on the model it pulled before this
    // one (it pulls while it computes); a delay-compensated rule keeps that backup too.
    let overlaps: bool = q.get("overlap")?.unwrap_or(false);
    worker_in_range(&state, worker)?;
    // HEAD (which axum routes here too) only looks: it must not become the worker's w_bak.
    let look_only = method == axum::http::Method::HEAD;
    if !look_only {
        // A pull becomes the worker's backup and int8 copy: only the worker's own may take it.
        state.credentials.check(&request_headers, worker, None)?;
    }
    let store = registered(&state)?;
    if state.must_offer(worker) {
        return Err(ApiError::lost_model());
    }
    let open = state.saw_open(worker).await;
    if !look_only {
        store.overlaps(worker, overlaps)?;
    }
    let holding = Instant::now();
    if let Some(min) = min_version {
        let wait = Duration::from_millis(wait_ms).min(state.config.max_long_poll);
        let mut rx = state.version_tx.subscribe();
        let reached = matches!(tokio::time::timeout(wait, rx.wait_for(|v| *v >= min)).await, Ok(Ok(_)));
        if !reached {
            // The newest *completed* version, which is what the wait was watching.
            let current = *rx.borrow();
            return Ok(
                (StatusCode::NO_CONTENT, [(VERSION_HEADER, HeaderValue::from(current))]).into_response()
            );
        }
    }
    let held = holding.elapsed().as_millis() as u64;
    let started = Instant::now();
    let pulled = match how {
        PullAs::F32 => {
            let (snap, body) = streamed_pull::answer(&state, store, (!look_only).then_some(worker)).await?;
            let (version, len) = (snap.version(), snap.len_bytes());
            Pulled { version, body, len, copy: None, delta_from: None }
        }
        how => {
            let gate = state.pull_gates.enter(worker).await?;
            let answering = state.clone();
            let answer = move || answer_pull(&answering, &store, worker, how, look_only, gate);
            let pulled = tokio::task::spawn_blocking(answer).await.expect("pull task panicked")?;
            state.metrics.pull_seconds.observe(started.elapsed().as_secs_f64());
            pulled
        }
    };
    state.metrics.sent_bytes.inc_by(pulled.len as u64);
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    // Set here: a streamed body has no length of its own, and clients size their buffers by it.
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(pulled.len));
    headers.insert(VERSION_HEADER, HeaderValue::from(pulled.version));
    let incarnation = HeaderValue::from_str(&state.process.incarnation).expect("hex digits");
    headers.insert(INCARNATION_HEADER, incarnation);
    headers.insert(HELD_HEADER, HeaderValue::from(held));
    if let Some(tag) = pulled.copy {
        headers.insert(COPY_HEADER, tag_value(tag));
    }
    if let Some(from) = pulled.delta_from {
        headers.insert(DELTA_FROM_HEADER, tag_value(from));
    }
    Ok((headers, open.until_sent(pulled.body)).into_response())
}

/// A pull's answer.
struct Pulled {
    version: u64,
    body: Body,
    /// The body's length in bytes.
    len: usize,
    /// int8 pulls: the tag of the copy the worker holds once it took this answer.
    copy: Option<u64>,
    /// int8 pulls answered with a difference: the tag of the copy it is the difference from.
    delta_from: Option<u64>,
}

/// The model for `worker` as `how` asks (an f32 pull streams instead: [`streamed_pull`]): its
/// snapshot (which becomes the worker's w_bak unless the pull only looks), rounded to bf16, as
/// the difference from the worker's copy, or whole.
fn answer_pull(
    state: &AppState,
    store: &Store,
    worker: usize,
    how: PullAs,
    look_only: bool,
    gate: tokio::sync::OwnedSemaphorePermit,
) -> Result<Pulled, ApiError> {
    let backup_as = if matches!(how, PullAs::Bf16) { BackupAs::Bf16 } else { BackupAs::F32 };
    let snap = if look_only { store.snapshot_now() } else { store.pull_as(worker, backup_as)? };
    let version = snap.version();
    let whole = |snap| bytes::Bytes::from_owner(SnapshotBody(snap));
    let pulled = |body: bytes::Bytes, copy, delta_from| {
        let len = body.len();
        let body = Body::from(bytes::Bytes::from_owner(Gated { body, _gate: gate }));
        Pulled { version, body, len, copy, delta_from }
    };
    let pool = &state.pull_bodies;
    Ok(match how {
        PullAs::Bf16 => {
            let body = wire::encode_bf16_into(store.layout(), snap.params(), pool.take_as_is());
            pulled(lend(pool, body), None, None)
        }
        PullAs::Int8 { base } if !look_only => {
            match state.replicas.answer(worker, base, (store.layout(), snap.params()), pool.take_as_is()) {
                Answer::Whole { tag, unused } => {
                    pool.give(unused);
                    pulled(whole(snap), Some(tag), None)
                }
                Answer::Delta { tag, from, body } => pulled(lend(pool, body), Some(tag), Some(from)),
            }
        }
        _ => pulled(whole(snap), None, None),
    })
}

fn tag_value(tag: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("{tag:016x}")).expect("hex digits")
}

/// How a pull asks for the model: `dtype=f32` (the default), `bf16` (the PS's float32 model
/// rounded, half the bytes), or `int8` with `base=<copy>`: the difference from the copy the
/// worker holds, as the PS tracks it ([`super::replicas`]), a quarter of the bytes.
#[derive(Clone, Copy)]
enum PullAs {
    F32,
    Bf16,
    Int8 { base: Option<u64> },
}

fn pull_as(q: &Params) -> Result<PullAs, ApiError> {
    let base = q.get::<String>("base")?.map(|b| parse_tag(&b)).transpose()?;
    let how = match q.get::<String>("dtype")?.as_deref() {
        None | Some("f32") => PullAs::F32,
        Some("bf16") => PullAs::Bf16,
        Some("int8") => return Ok(PullAs::Int8 { base }),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "dtype {other:?}: a model is pulled as f32, bf16 or int8"
            )));
        }
    };
    match base {
        Some(_) => Err(ApiError::bad_request(
            "base names the copy an int8 pull is the difference from: only with dtype=int8",
        )),
        None => Ok(how),
    }
}

/// A copy's tag: the 16 hex digits of `x-foresight-copy`.
fn parse_tag(s: &str) -> Result<u64, ApiError> {
    let ok = s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| u64::from_str_radix(s, 16).ok()).flatten().ok_or_else(|| {
        ApiError::bad_request(format!("base {s:?}: expected the 16 hex digits of a copy's tag"))
    })
}

/// Lets the response body borrow the shared snapshot instead of copying it.
struct SnapshotBody(Arc<crate::store::Snapshot>);

impl AsRef<[u8]> for SnapshotBody {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

#[derive(Serialize)]
struct PushResponse {
    version: u64,
    staleness: u64,
    applied: bool,
    replayed: bool,
    learning_rate: f32,
    /// `optimizer.adaptiveLocalSteps`: the local steps to train before the next exchange.
    #[serde(skip_serializing_if = "Option::is_none")]
    local_steps: Option<u64>,
}

async fn push(
    State(state): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    match push_inner(&state, Params(q), &headers, body).await {
        Ok(r) => {
            state.metrics.push_seconds.observe(started.elapsed().as_secs_f64());
            r
        }
        Err(e) => {
            state.metrics.reject(e.reason);
            tracing::debug!(reason = e.reason, error = %e.message, "push refused");
            e.into_response()
        }
    }
}

async fn push_inner(
    state: &Arc<AppState>,
    q: Params,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let worker: usize = q.require("worker")?;
    let version: u64 = q.require("version")?;
    let seq: u64 = q.require("seq")?;
    let generation: Option<u64> = q.get("generation")?;
    let epoch: Option<f64> = q.get("epoch")?;
    if epoch.is_some_and(|e| !(e.is_finite() && (0.0..=MAX_EPOCH).contains(&e))) {
        return Err(ApiError::bad_request(format!("epoch must be a number in [0, {MAX_EPOCH:e}]")));
    }
    let pace = pace_report(&q)?;
    worker_in_range(state, worker)?;
    let store = registered(state)?;
    let mut p = Push { worker, generation, version, seq, epoch, body: None };
    let refused = |p: &Push, e: ApiError| {
        state.journal_refusal(&store, p, e.reason);
        e
    };
    // The credential's generation is the push's: one of its own incarnations at most.
    p.generation = state.credentials.check(headers, worker, generation).map_err(|e| refused(&p, e))?;
    let refused = |e: ApiError| refused(&p, e);
    if let Some(pulled_from) = q.get::<String>("incarnation")? {
        state.check_lineage(&pulled_from, version).map_err(refused)?;
    }
    if state.must_offer(worker) {
        return Err(refused(ApiError::lost_model()));
    }
    // Open through the wait for a push slot and the upload.
    let _open = state.saw_open(worker).await;
    if state.seeding() {
        return Err(refused(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "seeding",
            "the parameter server is collecting the workers' copies of the model it lost; retry shortly",
        )));
    }
    // A replay (a sync worker's periodic re-push, a retry whose answer was lost) or a refusal
    // needs no gradient: answered now, the body is never buffered (the guard drains it). Under
    // `sync` it takes the round's lock, which a round being applied holds: waited for off the
    // runtime. The other rules' checks take only the sequencer's, held briefly: answered here.
    let early = if state.config.hyper.algorithm == crate::optimizer::Algorithm::Sync {
        let asking = store.clone();
        tokio::task::spawn_blocking(move || asking.answer_before_body(p)).await.expect("answer task panicked")
    } else {
        store.answer_before_body(p)
    };
    if let Some(answer) = early {
        return Ok(push_response(state, &store, answer?, Duration::ZERO, (worker, pace)));
    }
    // Held until the buffers are back in their pools: K bodies at most in memory at once.
    let _slot = state.admit_push().await?;
    let mut buf = state.bodies.take();
    let mut grad = state.grads.take_len(store.layout().len());
    let limit = state.config.body_limit;
    let read = read_gradient(headers, body, limit, &store.gradient_encodings(), &mut grad, &mut buf).await;
    let (received, p) = match read {
        Ok((how, n)) => {
            state.metrics.received_bytes.inc_by(n as u64);
            let bytes_per_param = n as f32 / store.layout().len().max(1) as f32;
            (how, Push { body: Some(BodyInfo { bytes: n as u64, bytes_per_param }), ..p })
        }
        Err(e) => {
            state.bodies.give(buf);
            state.grads.give(grad);
            return Err(e);
        }
    };
    let (s2, watching) = (store.clone(), state.clone());
    let (buf, grad, result) = tokio::task::spawn_blocking(move || {
        let decoded = match received {
            Gradient::Direct { first_unusable: None } => Ok(()),
            Gradient::Direct { first_unusable: Some(i) } => Err(wire::unusable_at(s2.layout(), &grad, i)),
            Gradient::Collected => wire::decode_gradient(&buf, s2.layout(), &mut grad),
        };
        let result = decoded.map_err(ApiError::from).and_then(|()| {
            let applying = Instant::now();
            let _inside = watching.store_watch.enter();
            let outcome = s2.push(p, &grad).map_err(ApiError::from)?;
            Ok((outcome, applying.elapsed()))
        });
        (buf, grad, result)
    })
    .await
    .expect("push task panicked");
    state.bodies.give(buf);
    state.grads.give(grad);
    let (o, apply_time) = result?;
    Ok(push_response(state, &store, o, apply_time, (worker, pace)))
}

/// The pace a push reports (`steps`, `step_ms`, `exchange_ms`): how many steps it covers, how
/// long one took, and how long the worker's previous exchange took.
fn pace_report(q: &Params) -> Result<Option<PaceReport>, ApiError> {
    const MAX_MS: f64 = 1e9;
    let ms = |key: &str| -> Result<Option<f64>, ApiError> {
        match q.get::<f64>(key)? {
            Some(v) if !(v.is_finite() && (0.0..=MAX_MS).contains(&v)) => Err(ApiError::bad_request(
                format!("{key} must be a number of milliseconds in [0, {MAX_MS:e}]"),
            )),
            v => Ok(v),
        }
    };
    let (step_ms, exchange_ms) = (ms("step_ms")?, ms("exchange_ms")?);
    let Some(steps) = q.get::<u64>("steps")? else {
        if step_ms.is_some() || exchange_ms.is_some() {
            return Err(ApiError::bad_request("step_ms and exchange_ms go with steps"));
        }
        return Ok(None);
    };
    if !(1..=MAX_VERSION).contains(&steps) {
        return Err(ApiError::bad_request(format!("steps must be in [1, {MAX_VERSION}]")));
    }
    let step_ms = step_ms.ok_or_else(|| ApiError::bad_request("steps goes with step_ms"))?;
    Ok(Some(PaceReport {
        steps,
        step_seconds: step_ms / 1e3,
        exchange_seconds: exchange_ms.map(|c| c / 1e3),
    }))
}

/// Records a push's outcome in the metrics and answers it.
fn push_response(
    state: &AppState,
    store: &Store,
    o: crate::store::PushOutcome,
    apply_time: Duration,
    (worker, pace): (usize, Option<PaceReport>),
) -> Response {
    let m = &state.metrics;
    // A replay's steps were counted the first time.
    let pace = pace.filter(|_| !o.replayed);
    if let Some(p) = pace {
        m.trained_steps.inc_by(p.steps);
    }
    let local_steps = state.pace_push(worker, pace);
    if !o.replayed {
        m.staleness.observe(o.staleness as f64);
        if store.hyper().max_staleness == Some(o.staleness) {
            m.at_bound.inc();
        }
        if o.applied {
            m.apply_seconds.observe(apply_time.as_secs_f64());
            m.updates.inc();
            m.model_version.set(store.version() as i64);
            if store.hyper().algorithm.is_delay_compensated() {
                m.observe_compensation(o.stats.compensation_ratio(), o.stats.mean_lambda());
                m.compensation_clamped.inc_by(o.stats.clamped);
            }
        }
    }
    let body = PushResponse {
        version: o.version,
        staleness: o.staleness,
        applied: o.applied,
        replayed: o.replayed,
        learning_rate: o.lr,
        local_steps,
    };
    ([(VERSION_HEADER, HeaderValue::from(o.version))], Json(body)).into_response()
}

/// `POST /v1/leave?worker=&generation=`: the worker has trained all its steps. Under `sync`, a
/// round that holds every still-training worker's gradient closes at once. A body, when there
/// is one, holds the worker's buffers (`wire::buffers`): the last leave's go into the final
/// model. A body that is refused leaves the worker training.
async fn leave(
    State(state): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let q = Params(q);
    let worker: usize = q.require("worker")?;
    let generation: u64 = q.require("generation")?;
    worker_in_range(&state, worker)?;
    state.credentials.check(&headers, worker, Some(generation))?;
    let store = registered(&state)?;
    let mut buf = Vec::new();
    read_limited(&headers, body, state.config.body_limit, &mut buf).await?;
    let buffers = match buf.is_empty() {
        true => None,
        false => {
            let layout = store.clone();
            let read =
                tokio::task::spawn_blocking(move || wire::buffers::Buffers::decode(&buf, layout.layout()));
            Some(read.await.expect("buffers task panicked")?)
        }
    };
    state.saw(worker).await;
    let one_at_a_time = state.leaving().await;
    let leaving = store.clone();
    let closed = tokio::task::spawn_blocking(move || leaving.leave(worker, generation))
        .await
        .expect("leave task panicked")?;
    tracing::info!(worker, generation, "worker finished its steps");
    if let Some(buffers) = buffers {
        let keeping = state.clone();
        tokio::task::spawn_blocking(move || keeping.keep_buffers(worker, buffers))
            .await
            .expect("buffers task panicked");
    }
    // Its copy stays: a worker pulls the final model after it left.
    state.forget_pace(worker);
    if let Some(o) = closed {
        tracing::info!(
            version = o.version,
            "sync round closed: it holds every still-training worker's gradient"
        );
        state.count_round_closed(o.version);
    }
    let final_model = if store.all_finished() { finalize_after_the_last(&state).await } else { None };
    drop(one_at_a_time);
    Ok(Json(serde_json::json!({
        "finished": true,
        "closed_round": closed.map(|o| o.version),
        "final_model": final_model,
    })))
}

/// Every worker of the job has trained all its steps: the PS writes the final model itself,
/// so that the job has one even when the operator cannot reach the PS to ask for it. A failure
/// is only logged: the operator's `POST /v1/finalize` tries again.
async fn finalize_after_the_last(state: &Arc<AppState>) -> Option<FinalModel> {
    match state.finalize().await {
        Ok(m) => {
            tracing::info!(version = m.version, "every worker finished: the job is finalized");
            Some(m)
        }
        Err(e) => {
            tracing::warn!(error = %e.message, "every worker finished, but the final model could not be written");
            None
        }
    }
}

async fn report(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let mut buf = Vec::new();
    read_limited(&headers, body, 64 * 1024, &mut buf).await?;
    let r: Report = serde_json::from_slice(&buf)
        .map_err(|e| ApiError::bad_request(format!("invalid report JSON: {e}")))?;
    worker_in_range(&state, r.worker)?;
    state.credentials.check(&headers, r.worker, None)?;
    r.validate().map_err(ApiError::bad_request)?;
    state.saw(r.worker).await;
    let w = r.worker;
    let mut reports = state.reports.lock();
    // Progress reports carry no accuracy and evaluations no throughput: keep the last known.
    let mut r = r;
    if let Some(prev) = &reports[w] {
        r.accuracy = r.accuracy.or(prev.accuracy);
        r.samples_per_second = r.samples_per_second.or(prev.samples_per_second);
    }
    reports[w] = Some(r);
    Ok(StatusCode::NO_CONTENT)
}

async fn status(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let reports = state.reports.lock().clone();
    let reported: Vec<&Report> = reports.iter().flatten().collect();
    let mean = |f: &dyn Fn(&Report) -> Option<f64>| {
        let v: Vec<f64> = reported.iter().filter_map(|r| f(r)).collect();
        if v.is_empty() { None } else { Some(v.iter().sum::<f64>() / v.len() as f64) }
    };
    let step = reported.iter().map(|r| r.step).max().unwrap_or(0);
    let epoch = reported.iter().map(|r| r.epoch).fold(0.0, f64::max);
    let mut body = serde_json::json!({
        "job": state.config.job,
        "namespace": state.config.namespace,
        "registered": state.store().is_some(),
        "algorithm": state.config.hyper.algorithm,
        "workers_expected": state.workers(),
        "step": step,
        "epoch": epoch,
        "loss": mean(&|r| Some(r.loss)),
        "accuracy": mean(&|r| r.accuracy),
        "samples_per_second": reported.iter().filter_map(|r| r.samples_per_second).fold(0.0, |a, b| a + b),
        "reports": reports,
        "process": state.process,
        "reseeds": state.metrics.reseeds.get(),
    });
    if let Some(store) = state.store() {
        let st = store.status();
        body["version"] = st.version.into();
        body["finalized"] = st.finalized.into();
        body["parameters"] = st.parameters.into();
        // Through the shortest decimal form, so 0.1f32 reads 0.1 rather than 0.10000000149.
        body["learning_rate"] = st.learning_rate.to_string().parse::<f64>().unwrap_or(0.0).into();
        body["optimizer_epoch"] = st.epoch.into();
        body["staleness"] = serde_json::to_value(&st.staleness).expect("plain data");
        body["workers"] = serde_json::to_value(&st.workers).expect("plain data");
        body["memory"] = state.memory_status();
        let groups = &store.hyper().parameter_groups;
        if !groups.is_empty() {
            // Each group and the parameters of this PS's model it took (0: a pattern that
            // names none of them, or, sharded, only other shards' tensors).
            let taken = groups.iter().zip(store.group_parameters()).map(|(g, n)| {
                let mut v = serde_json::to_value(g).expect("plain data");
                v["parameters"] = (*n).into();
                v
            });
            body["parameter_groups"] = taken.collect::<Vec<_>>().into();
        }
    }
    Json(body)
}

/// `PUT /v1/workers?count=N`: the job was scaled to N workers (the operator calls it when
/// `workers.replicas` changes); the PS follows without a restart.
async fn set_workers(
    State(state): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let count: usize = Params(q).require("count")?;
    state.scale(count).await?;
    Ok(Json(serde_json::json!({ "workers": count })))
}

async fn finalize(State(state): State<Arc<AppState>>) -> Result<Json<FinalModel>, ApiError> {
    Ok(Json(state.finalize().await?))
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let age = state.last_checkpoint.lock().elapsed().as_secs_f64();
    state.metrics.checkpoint_age.set(age);
    // The store counts short rounds (they close inside a push or on the round timeout).
    if let Some(store) = state.store() {
        let short = &state.metrics.rounds_closed_short;
        short.inc_by(store.rounds_closed_short().saturating_sub(short.get()));
    }
    let content_type = HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8");
    ([(header::CONTENT_TYPE, content_type)], state.metrics.encode())
}
