//! The async HTTP/2 client workers use to talk to the PS: h2c with prior knowledge for
//! `http://` URLs, TLS with HTTP/2 for `https://` ones (trusting the roots of a [`ClientTls`]).

use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;

use crate::pace::PaceReport;
use crate::wire::final_model::FinalModel;
use crate::wire::in_place::{Expected, InPlace};
pub use crate::wire::protocol::PullDtype;
use crate::wire::protocol::{
    CLIENT_VERSION_HEADER, COPY_HEADER, CREDENTIAL_HEADER, DELTA_FROM_HEADER, HELD_HEADER,
    INCARNATION_HEADER, PS_VERSION, Report, VERSION_HEADER, reason, route,
};
use crate::wire::{self, Layout, WireError};

mod exchange;
mod lent;
mod link;
mod session;
pub mod shard;
mod tls;

pub use exchange::{Cadence, Exchange, PushStats, StepEnd, cadence_problem};
pub use lent::LentFloats;
pub use link::ErrorFeedback;
pub use session::{Pulled, Pushed, Retry, Session};
pub use tls::{ClientTls, install_crypto_provider};

/// Element type a gradient is sent in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradDtype {
    F32,
    /// Half the bytes; the PS widens it back to f32.
    Bf16,
    /// A quarter of the bytes (int8 with a scale per 1,024 values, `wire::int8`); the PS widens
    /// it back to f32. A worker's session carries each push's rounding error into its next
    /// (error feedback).
    Int8,
}

/// A gradient's body in `dtype`. Int8 without error feedback: what rounding leaves out is lost.
pub fn encode_gradient(layout: &Layout, grad: &[f32], dtype: GradDtype) -> Vec<u8> {
    encode_gradient_into(layout, grad, dtype, Vec::new())
}

/// [`encode_gradient`] into `out`, a recycled body (F32 and BF16; int8 bodies are made fresh).
pub fn encode_gradient_into(layout: &Layout, grad: &[f32], dtype: GradDtype, out: Vec<u8>) -> Vec<u8> {
    match dtype {
        GradDtype::F32 => wire::encode_f32_into(layout, grad, out),
        GradDtype::Bf16 => wire::encode_bf16_into(layout, grad, out),
        GradDtype::Int8 => wire::int8::encode(layout, &mut grad.to_vec()),
    }
}

/// A model-sized request body (a push, a registration): encoded whole, or a float32
/// safetensors header followed by the caller's own bytes ([`LentFloats`]), sent as they are,
/// without a copy.
#[derive(Clone, Debug)]
pub enum Upload {
    Whole(bytes::Bytes),
    Lent { head: bytes::Bytes, data: bytes::Bytes },
}

impl Upload {
    pub fn len(&self) -> usize {
        match self {
            Self::Whole(b) => b.len(),
            Self::Lent { head, data } => head.len() + data.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn into_request_body(self) -> reqwest::Body {
        match self {
            Self::Whole(b) => b.into(),
            Self::Lent { head, data } => reqwest::Body::wrap(Chunks([head, data].into())),
        }
    }
}

impl From<bytes::Bytes> for Upload {
    fn from(b: bytes::Bytes) -> Self {
        Self::Whole(b)
    }
}

impl From<Vec<u8>> for Upload {
    fn from(b: Vec<u8>) -> Self {
        Self::Whole(b.into())
    }
}

/// Bytes sent one after the other, their total length known (hyper sends it as the
/// Content-Length, which the PS's admission reads before the body).
struct Chunks(std::collections::VecDeque<bytes::Bytes>);

impl http_body::Body for Chunks {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(http_body::Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.iter().map(|b| b.len() as u64).sum())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("request to the parameter server failed: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("the parameter server refused the request ({status}, {reason}): {message}")]
    Refused {
        status: StatusCode,
        reason: String,
        message: String,
        /// The PS's `Retry-After` (an overloaded PS says when to come back).
        retry_after: Option<Duration>,
    },
    #[error("the parameter server sent an invalid model: {0}")]
    Wire(#[from] WireError),
    #[error("the parameter server answered without a valid {VERSION_HEADER} header")]
    MissingVersion,
    #[error(
        "the parameter server holds a model whose layout differs from this worker's model: {0} (the \
         job's workers run different model code or settings, or the PS restored another job's checkpoint)"
    )]
    OtherModel(String),
    #[error("a gradient was pushed before the model was pulled")]
    NotPulled,
    #[error("{0}")]
    Config(String),
    #[error("the parameter server sent the difference from a copy of the model this worker does not hold")]
    UnknownCopy,
    #[error("{what} got no answer from the parameter server within {seconds} s")]
    TimedOut { what: &'static str, seconds: f64 },
    #[error(
        "the parameter server's answer is {bytes} bytes or more, above the {limit} a JSON answer may have"
    )]
    AnswerTooLarge { bytes: u64, limit: usize },
    #[error("the parameter server's answer is not the JSON expected: {0}")]
    BadAnswer(String),
}

/// Refusals of the parameter server that the same request will meet again, whoever sends it.
/// (`unknown_worker` is not one: a job being scaled may know the index a moment later.)
const PERMANENT_REFUSALS: [&str; 5] = [
    reason::UNAUTHORIZED,
    reason::LAYOUT_MISMATCH,
    reason::SHAPE_MISMATCH,
    reason::DTYPE_MISMATCH,
    reason::VERSION_MISMATCH,
];

impl ClientError {
    /// Worth retrying: the PS was unreachable, restarting or overloaded.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport(_) => true,
            Self::Refused { status, reason, .. } => {
                status.is_server_error()
                    || [reason::IN_FLIGHT, reason::BODY_STALLED, reason::BODY_TOO_SLOW]
                        .contains(&reason.as_str())
            }
            _ => false,
        }
    }

    /// No retry, by this process or a new one, can succeed: the job's configuration or the
    /// model is wrong.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::OtherModel(_) | Self::Config(_) => true,
            Self::Refused { reason, .. } => PERMANENT_REFUSALS.contains(&reason.as_str()),
            _ => false,
        }
    }

    /// How long the PS asked to wait before a retry, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Refused { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The PS's reason label, for refusals.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Refused { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// A pulled model.
#[derive(Clone, Debug)]
pub struct Model {
    pub version: u64,
    /// The PS process that served it (`x-foresight-incarnation`): a version names a model only
    /// within its process's history. `None`: not known (a model combined from several shards).
    pub incarnation: Option<u64>,
    pub layout: Layout,
    pub values: Vec<f32>,
    /// How long the PS held the pull waiting for the version asked for (a `sync` round): not
    /// time spent moving the model.
    pub held: Duration,
    /// Pulled as int8: the PS's tag for this copy (`x-foresight-copy`), which the next int8
    /// pull names to be sent only the difference from it.
    pub copy: Option<u64>,
}

/// The copy of the model a worker holds, for an int8 pull to be the difference from.
#[derive(Clone, Copy)]
pub struct Base<'a> {
    pub tag: u64,
    pub values: &'a [f32],
}

/// A model a worker expects to pull: its layout, the type it is pulled in, and that layout's
/// header in that type, computed once.
#[derive(Clone, Debug)]
pub struct ExpectedModel {
    pub layout: Layout,
    dtype: PullDtype,
    header: Vec<u8>,
    /// The worker overlaps its exchange with its next step: its pulls say so (`overlap=true`),
    /// so that the PS keeps the backup its next gradient is computed on.
    overlaps: bool,
}

impl ExpectedModel {
    /// A model pulled as F32.
    pub fn new(layout: Layout) -> Self {
        Self::pulled_as(layout, PullDtype::F32)
    }

    /// A model pulled in `dtype`.
    pub fn pulled_as(layout: Layout, dtype: PullDtype) -> Self {
        let header = wire::header(&layout, dtype.wire(), &Default::default());
        Self { layout, dtype, header, overlaps: false }
    }

    /// The same, pulled by a worker that overlaps its exchange with its next step.
    pub fn overlapping(self) -> Self {
        Self { overlaps: true, ..self }
    }
}

impl std::str::FromStr for PullDtype {
    type Err = ClientError;

    fn from_str(s: &str) -> Result<Self, ClientError> {
        match s {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            "int8" => Ok(Self::Int8),
            other => Err(ClientError::Config(format!("pull dtype {other:?}: expected f32, bf16 or int8"))),
        }
    }
}

/// What a pull's answer said besides the model: its headers.
#[derive(Clone, Copy, Debug)]
pub struct PullHead {
    pub version: u64,
    /// The PS process that served it (`x-foresight-incarnation`).
    pub incarnation: Option<u64>,
    /// Pulled as int8: the PS's tag for this copy, which the next int8 pull names.
    pub copy: Option<u64>,
    /// The body is the difference from the copy with this tag.
    delta_from: Option<u64>,
    /// How long the PS held the pull waiting for the version asked for.
    pub held: Duration,
}

/// Where a model body went.
enum Read {
    /// Into the caller's buffer.
    InPlace,
    /// Not the expected encoding: decoded whole, as any (F32) model body.
    Other(Layout, Vec<f32>),
}

/// Reads a pull's body into `out` (the expected layout's length): the difference from `base`
/// when the answer says it is one, otherwise the model itself.
async fn read_into(
    resp: reqwest::Response,
    expected: &ExpectedModel,
    delta_from: Option<u64>,
    base: Option<Base<'_>>,
    out: &mut [f32],
) -> Result<Read, ClientError> {
    match delta_from {
        Some(from) => {
            let base = base.filter(|b| b.tag == from).ok_or(ClientError::UnknownCopy)?;
            read_delta(resp, expected, base.values, out).await?;
            Ok(Read::InPlace)
        }
        None => read_model(resp, expected, out).await,
    }
}

/// Reads a model body into `out`, in place when it is `expected`'s encoding in its dtype;
/// anything else is collected and decoded as any (F32) model body, which is what a PS that
/// predates bf16 pulls answers.
async fn read_model(
    mut resp: reqwest::Response,
    expected: &ExpectedModel,
    out: &mut [f32],
) -> Result<Read, ClientError> {
    // Old contents need no clearing: the direct path writes every value before it succeeds.
    let mut spill = Vec::new();
    let encoding = [Expected { header: &expected.header, dtype: expected.dtype.wire() }];
    let mut reader = InPlace::new(&encoding, out, &mut spill);
    let mut non_finite = None;
    while let Some(chunk) = resp.chunk().await? {
        let found = reader.feed_checked(&chunk, wire::first_non_finite);
        non_finite = non_finite.or(found);
    }
    if !reader.finish() {
        let (layout, values, _) = wire::decode_model(&spill)?;
        return Ok(Read::Other(layout, values));
    }
    match non_finite {
        Some(i) => Err(wire::unusable_at(&expected.layout, out, i).into()),
        None => Ok(Read::InPlace),
    }
}

/// Reads an int8 pull's difference from `base` into `out`: the model is `base` plus the
/// decoded body, the same additions the PS made to its record of this worker's copy, made as
/// the body is widened (`wire::int8::add_delta`).
async fn read_delta(
    mut resp: reqwest::Response,
    expected: &ExpectedModel,
    base: &[f32],
    out: &mut [f32],
) -> Result<(), ClientError> {
    // Sized once from Content-Length, instead of grown and moved as chunks arrive; at most about
    // the model's int8 body (a byte per value, a scale per chunk and per tensor, a header with
    // the scales' entries), so a wrong Content-Length cannot make it reserve more.
    let (layout, header) = (&expected.layout, expected.header.len());
    let most = 2 * header + layout.len() + 4 * (wire::int8::chunks(layout.len()) + layout.tensors().len());
    let announced = resp.content_length().map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let mut body = Vec::with_capacity(announced.min(most));
    while let Some(chunk) = resp.chunk().await? {
        body.extend_from_slice(&chunk);
    }
    wire::int8::add_delta(&body, &expected.layout, base, out)?;
    Ok(())
}

/// What the PS hands a worker process that joins (`POST /v1/join`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
pub struct Joined {
    /// Goes with every push of this process.
    pub generation: u64,
    /// Steps of this worker already in the model: continue after them.
    pub resume_step: u64,
    pub version: u64,
    /// The job's worker count M now (absent from a PS older than elastic jobs: 0).
    #[serde(default)]
    pub workers: usize,
    /// How often a worker between exchanges (local steps) tells the PS it is alive, in ms
    /// (absent from a PS older than heartbeats: none are sent).
    #[serde(default)]
    pub heartbeat_ms: Option<u64>,
    /// The PS's update rule (absent from a PS older than this field).
    #[serde(default)]
    pub algorithm: Option<crate::optimizer::Algorithm>,
}

/// The join's answer as it comes: [`Joined`] and the credential of the process's calls (absent
/// when the PS checks none).
#[derive(Deserialize)]
struct JoinAnswer {
    #[serde(flatten)]
    joined: Joined,
    #[serde(default)]
    credential: Option<String>,
}

/// The PS's answer to a push.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct PushReply {
    pub version: u64,
    pub staleness: u64,
    pub applied: bool,
    pub replayed: bool,
    pub learning_rate: f32,
    /// `optimizer.adaptiveLocalSteps`: the local steps to train before the next exchange.
    #[serde(default)]
    pub local_steps: Option<u64>,
}

/// Who pushes, computed on which version, and the seq that makes retries idempotent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PushId {
    pub worker: usize,
    /// From [`PsClient::join`]; `None` for a client that never joins.
    pub generation: Option<u64>,
    /// The model version the gradient was computed on.
    pub version: u64,
    /// The PS process that served that version ([`Model::incarnation`]); `None`: not checked.
    pub incarnation: Option<u64>,
    pub seq: u64,
}

impl PushId {
    /// A push of a client that never joins.
    pub fn unjoined(worker: usize, version: u64, seq: u64) -> Self {
        Self { worker, generation: None, version, incarnation: None, seq }
    }
}

/// How often an HTTP/2 connection to the PS is pinged, and how long an unanswered ping is waited
/// for before the connection is given up.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// The deadline of a call whose answer is small and immediate (join, report, heartbeat, status,
/// scale): a PS that is alive but stuck answers pings and nothing else.
pub const SHORT_CALL_DEADLINE: Duration = Duration::from_secs(10);
/// The deadline of a call that carries a model-sized body (push, pull, registration, leave) is
/// this floor plus the body at [`TRANSFER_MIN_RATE`] (and a pull's long-poll wait): a PS that is
/// alive but stuck (its pings answered, its requests not) fails the call, which is retried
/// until the worker's own deadline, instead of hanging the worker for ever.
pub const TRANSFER_DEADLINE_FLOOR: Duration = Duration::from_secs(60);
/// Bytes a second below which a body's transfer counts as stuck: 1 MiB/s, a hundredth of a
/// 1 Gbit/s link (a 100M-parameter float32 model: 60 s + 381 s).
pub const TRANSFER_MIN_RATE: u64 = 1 << 20;
/// The deadline of `POST /v1/finalize`, which writes the final model (and, on shard 0, waits for
/// every other shard's finalize): a PS that never answers fails the call instead of holding the
/// operator's reconcile or shard 0 for ever.
pub const FINALIZE_DEADLINE: Duration = Duration::from_secs(600);
/// The largest JSON answer read from a PS (`/v1/status` of 1,024 workers, all joined and
/// reporting, measured 263 KB): a process on the PS's port that streams more (a job's own
/// sidecar, a custom image) fails the call instead of filling the caller's memory; the operator
/// reads every job's PS.
pub const MAX_JSON_ANSWER: usize = 4 << 20;

/// HTTP/2 flow-control windows, in bytes: how much a peer may send before the caller reads.
#[derive(Clone, Copy)]
struct Windows {
    stream: u32,
    connection: u32,
}

/// A worker's: a model moves in few round trips.
const MODEL_WINDOWS: Windows = Windows { stream: 64 << 20, connection: 128 << 20 };
/// A controller's ([`PsClient::for_control`]): a 263 KB `/v1/status` still takes one round trip.
const CONTROL_WINDOWS: Windows = Windows { stream: 1 << 20, connection: 1 << 20 };

#[derive(Clone)]
pub struct PsClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// [`TRANSFER_DEADLINE_FLOOR`], or what [`Self::with_transfer_deadline_floor`] set.
    transfer_floor: Duration,
    /// The credential of this client's last join ([`CREDENTIAL_HEADER`]), shared by its clones:
    /// every later call carries it, so that the PS knows the call is this worker process's.
    credential: std::sync::Arc<parking_lot::Mutex<Option<reqwest::header::HeaderValue>>>,
}

impl PsClient {
    /// One client per shard, in shard order, from `urls` separated by commas (one URL for an
    /// unsharded PS): `http://job-ps-0:8080,http://job-ps-1:8080`. `https://` URLs need `tls`.
    pub fn for_shards(
        urls: &str,
        token: Option<String>,
        tls: Option<&ClientTls>,
    ) -> Result<Vec<Self>, ClientError> {
        let urls: Vec<&str> = urls.split(',').map(str::trim).collect();
        if let Some(bad) = urls.iter().find(|u| !(u.starts_with("http://") || u.starts_with("https://"))) {
            return Err(ClientError::Config(format!(
                "parameter server URL {bad:?} is not an http:// or https:// URL (shards are separated by commas)"
            )));
        }
        urls.into_iter().map(|u| Self::with_tls(u, token.clone(), tls)).collect()
    }

    /// `base` is like `http://ps:8080`.
    pub fn new(base: &str, token: Option<String>) -> Result<Self, ClientError> {
        Self::with_tls(base, token, None)
    }

    /// `base` is like `https://ps:8080`, whose certificate `tls` trusts (or `http://`, where
    /// `tls` is not used).
    pub fn with_tls(base: &str, token: Option<String>, tls: Option<&ClientTls>) -> Result<Self, ClientError> {
        Self::build(base, token, tls, MODEL_WINDOWS)
    }

    /// A client for a controller's calls (status, worker count, finalize), whose answers are
    /// JSON of at most [`MAX_JSON_ANSWER`]: HTTP/2 windows of [`CONTROL_WINDOWS`], so that
    /// whatever answers on a PS's port can make the caller hold at most that much unread,
    /// instead of a model transfer's 64 MiB per call.
    pub fn for_control(
        base: &str,
        token: Option<String>,
        tls: Option<&ClientTls>,
    ) -> Result<Self, ClientError> {
        Self::build(base, token, tls, CONTROL_WINDOWS)
    }

    fn build(
        base: &str,
        token: Option<String>,
        tls: Option<&ClientTls>,
        windows: Windows,
    ) -> Result<Self, ClientError> {
        let https = base.starts_with("https://");
        if https && tls.is_none() {
            return Err(ClientError::Config(format!(
                "parameter server URL {base:?} is https:// but no CA file says which certificate to trust \
                 (FORESIGHT_PS_CA_FILE)"
            )));
        }
        if !https && !base.starts_with("http://") {
            return Err(ClientError::Config(format!(
                "parameter server URL {base:?} is not an http:// or https:// URL"
            )));
        }
        // Every client carries a rustls configuration, also for h2c: reqwest builds its TLS
        // connector either way, and without one it would need a process-wide crypto provider.
        let config = tls.map_or_else(tls::no_roots, ClientTls::rustls_config);
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(config)
            .http2_prior_knowledge()
            .http2_initial_stream_window_size(windows.stream)
            .http2_initial_connection_window_size(windows.connection)
            .http2_max_frame_size(16_777_215)
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            // The protocol never redirects: a PS (or whatever answers on its port) must not send
            // the operator's or a worker's calls, and their bearer token, elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            // A PS that vanished without a reset (a lost node, dropped packets) answers no ping:
            // the connection fails within the ping's interval and timeout and the call is
            // retried, instead of waiting on the kernel's retransmissions for many minutes.
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .default_headers(reqwest::header::HeaderMap::from_iter([(
                reqwest::header::HeaderName::from_static(CLIENT_VERSION_HEADER),
                reqwest::header::HeaderValue::from_static(PS_VERSION),
            )]))
            .build()?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            token,
            transfer_floor: TRANSFER_DEADLINE_FLOOR,
            credential: Default::default(),
        })
    }

    /// The floor of a model-sized call's deadline ([`TRANSFER_DEADLINE_FLOOR`] by default).
    pub fn with_transfer_deadline_floor(mut self, floor: Duration) -> Self {
        self.transfer_floor = floor;
        self
    }

    /// A call that moves `bytes` of body (either way) after the PS held it up to `wait` (a
    /// long-poll), cut off at its transfer deadline.
    fn transfer(
        &self,
        method: reqwest::Method,
        path: &str,
        bytes: usize,
        wait: Duration,
    ) -> reqwest::RequestBuilder {
        let at_min_rate = Duration::from_secs_f64(bytes as f64 / TRANSFER_MIN_RATE as f64);
        self.req(method, path).timeout(self.transfer_floor + wait + at_min_rate)
    }

    /// A call whose answer is small and immediate, cut off at [`SHORT_CALL_DEADLINE`] (then
    /// retried as a transport error): not pushes, pulls (long-polls, model-sized bodies),
    /// registration, leave (a body of buffers) or finalize (writes the model).
    fn short(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.req(method, path).timeout(SHORT_CALL_DEADLINE)
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(c) = &*self.credential.lock() {
            r = r.header(CREDENTIAL_HEADER, c.clone());
        }
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn check(resp: reqwest::Response) -> Result<reqwest::Response, ClientError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        // Delta-seconds only: the PS never sends an HTTP date; an hour at most, whoever sent it.
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .map(|s| Duration::from_secs(s.min(3600)));
        let body: serde_json::Value = Self::json(resp).await.unwrap_or_default();
        let text = |k: &str| body.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
        Err(ClientError::Refused { status, reason: text("reason"), message: text("error"), retry_after })
    }

    /// The answer's JSON body, read up to [`MAX_JSON_ANSWER`] bytes.
    async fn json<T: serde::de::DeserializeOwned>(mut resp: reqwest::Response) -> Result<T, ClientError> {
        let too_big = |n: u64| ClientError::AnswerTooLarge { bytes: n, limit: MAX_JSON_ANSWER };
        if let Some(n) = resp.content_length().filter(|&n| n > MAX_JSON_ANSWER as u64) {
            return Err(too_big(n));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await? {
            if body.len() + chunk.len() > MAX_JSON_ANSWER {
                return Err(too_big((body.len() + chunk.len()) as u64));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::BadAnswer(e.to_string()))
    }

    fn version_of(resp: &reqwest::Response) -> Result<u64, ClientError> {
        resp.headers()
            .get(VERSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or(ClientError::MissingVersion)
    }

    /// Registers the model; `Ok(false)` when another worker registered it first.
    pub async fn register(&self, layout: &Layout, values: &[f32]) -> Result<bool, ClientError> {
        self.put_model(route::MODEL, wire::encode_f32(layout, values, &Default::default()).into()).await
    }

    /// [`Self::register`] with the values' bytes lent by the caller ([`LentFloats`]).
    pub async fn register_lent(&self, layout: &Layout, lent: bytes::Bytes) -> Result<bool, ClientError> {
        let head = wire::header(layout, wire::WireDtype::F32, &Default::default());
        self.put_model(route::MODEL, Upload::Lent { head: head.into(), data: lent }).await
    }

    /// Offers this worker's copy of the model, of `version`, to a PS that lost its model:
    /// `Ok(true)` when it became (or replaced) the PS's model, `Ok(false)` when a copy at least
    /// as fresh is there or training has moved on from it.
    pub async fn offer(
        &self,
        worker: usize,
        version: u64,
        layout: &Layout,
        values: &[f32],
    ) -> Result<bool, ClientError> {
        let body = wire::encode_f32(layout, values, &Default::default());
        self.put_model(&format!("{}?worker={worker}&version={version}", route::MODEL), body.into()).await
    }

    async fn put_model(&self, path: &str, body: Upload) -> Result<bool, ClientError> {
        let resp = self
            .transfer(reqwest::Method::PUT, path, body.len(), Duration::ZERO)
            .body(body.into_request_body())
            .send()
            .await?;
        if resp.status() == StatusCode::CONFLICT {
            return Ok(false);
        }
        Self::check(resp).await?;
        Ok(true)
    }

    /// Joins as a new process of `worker`; `step` is its own position, when it has one.
    pub async fn join(&self, worker: usize, step: Option<u64>) -> Result<Joined, ClientError> {
        let mut path = format!("{}?worker={worker}", route::JOIN);
        if let Some(s) = step {
            path += &format!("&step={s}");
        }
        let answer = Self::check(self.short(reqwest::Method::POST, &path).send().await?).await?;
        let joined: JoinAnswer = Self::json(answer).await?;
        let credential = joined.credential.map(|c| reqwest::header::HeaderValue::from_str(&c)).transpose();
        *self.credential.lock() = credential
            .map_err(|_| ClientError::Config("the join's credential is not a header value".into()))?;
        Ok(joined.joined)
    }

    /// Pulls the model as `worker` (recording it as that worker's backup). With `min_version`,
    /// waits up to `wait` for that version; `Ok(None)` if it did not arrive in time.
    pub async fn pull(
        &self,
        worker: usize,
        min_version: Option<u64>,
        wait: Duration,
    ) -> Result<Option<Model>, ClientError> {
        self.pull_expecting(worker, min_version, wait, None, Vec::new()).await
    }

    /// [`PsClient::pull`] of a model whose layout the caller knows, in its dtype: when the PS
    /// sends that layout's encoding (it always does), the values are widened into place as the body
    /// arrives instead of after it (see [`wire::in_place`]), into `reuse` when it has the
    /// layout's length. A buffer from an earlier pull is overwritten as it is: at 100M
    /// parameters a fresh one is 400 MB of pages zeroed and faulted in by the kernel per pull.
    pub async fn pull_expecting(
        &self,
        worker: usize,
        min_version: Option<u64>,
        wait: Duration,
        expected: Option<&ExpectedModel>,
        reuse: Vec<f32>,
    ) -> Result<Option<Model>, ClientError> {
        self.pull_against(worker, min_version, wait, expected, reuse, None).await
    }

    /// [`Self::pull_expecting`] holding `base`: a model expected as int8 then comes as the
    /// difference from it when the PS still tracks that copy, and is `base` plus the difference.
    pub async fn pull_against(
        &self,
        worker: usize,
        min_version: Option<u64>,
        wait: Duration,
        expected: Option<&ExpectedModel>,
        mut reuse: Vec<f32>,
        base: Option<Base<'_>>,
    ) -> Result<Option<Model>, ClientError> {
        let Some((resp, head)) = self.model_response(worker, min_version, wait, expected, base).await? else {
            return Ok(None);
        };
        let (layout, values) = match expected {
            Some(e) => {
                reuse.resize(e.layout.len(), 0.0);
                match read_into(resp, e, head.delta_from, base, &mut reuse).await? {
                    Read::InPlace => (e.layout.clone(), reuse),
                    Read::Other(layout, values) => (layout, values),
                }
            }
            None if head.delta_from.is_some() => return Err(ClientError::UnknownCopy),
            None => {
                let (layout, values, _) = wire::decode_model(&resp.bytes().await?)?;
                (layout, values)
            }
        };
        let PullHead { version, incarnation, held, copy, .. } = head;
        Ok(Some(Model { version, incarnation, layout, values, held, copy }))
    }

    /// [`Self::pull_against`] straight into the caller's `out` (the expected layout's length):
    /// no buffer of the client's own is filled and then copied. A model of another layout is
    /// refused ([`ClientError::OtherModel`]); `out` holds the model only once this succeeded
    /// (a failed read may have written part of it).
    pub async fn pull_into(
        &self,
        worker: usize,
        min_version: Option<u64>,
        wait: Duration,
        expected: &ExpectedModel,
        base: Option<Base<'_>>,
        out: &mut [f32],
    ) -> Result<Option<PullHead>, ClientError> {
        assert_eq!(out.len(), expected.layout.len(), "a buffer of the model's length");
        let Some((resp, head)) = self.model_response(worker, min_version, wait, Some(expected), base).await?
        else {
            return Ok(None);
        };
        match read_into(resp, expected, head.delta_from, base, out).await? {
            Read::InPlace => Ok(Some(head)),
            // An older PS's F32 answer to another dtype: the same model, decoded whole.
            Read::Other(layout, values) if layout == expected.layout => {
                out.copy_from_slice(&values);
                Ok(Some(head))
            }
            Read::Other(layout, _) => Err(ClientError::OtherModel(expected.layout.difference(&layout))),
        }
    }

    /// Asks for the model and reads the answer's headers; `None` for a `204` (the version asked
    /// for did not arrive within `wait`).
    async fn model_response(
        &self,
        worker: usize,
        min_version: Option<u64>,
        wait: Duration,
        expected: Option<&ExpectedModel>,
        base: Option<Base<'_>>,
    ) -> Result<Option<(reqwest::Response, PullHead)>, ClientError> {
        let mut path = format!("{}?worker={worker}", route::MODEL);
        let dtype = expected.map_or(PullDtype::F32, |e| e.dtype);
        if dtype != PullDtype::F32 {
            path += &format!("&dtype={}", dtype.as_str());
        }
        if let Some(b) = base.filter(|_| dtype == PullDtype::Int8) {
            path += &format!("&base={:016x}", b.tag);
        }
        if let Some(v) = min_version {
            path += &format!("&min_version={v}&wait_ms={}", wait.as_millis());
        }
        if expected.is_some_and(|e| e.overlaps) {
            path += "&overlap=true";
        }
        // The model's float32 size bounds every encoding's (an unknown layout: a gigabyte).
        let bytes = expected.map_or(1 << 30, |e| e.layout.len() * 4);
        let held = if min_version.is_some() { wait } else { Duration::ZERO };
        let resp = Self::check(self.transfer(reqwest::Method::GET, &path, bytes, held).send().await?).await?;
        if resp.status() == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        let version = Self::version_of(&resp)?;
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok());
        let hex = |name: &str| header(name).and_then(|v| u64::from_str_radix(v, 16).ok());
        let head = PullHead {
            version,
            incarnation: hex(INCARNATION_HEADER),
            copy: hex(COPY_HEADER),
            delta_from: hex(DELTA_FROM_HEADER),
            held: Duration::from_millis(header(HELD_HEADER).and_then(|v| v.parse().ok()).unwrap_or(0)),
        };
        Ok(Some((resp, head)))
    }

    /// Pushes a gradient. Reusing `id` for a retry is safe: the PS applies a (worker,
    /// generation, seq) once.
    pub async fn push(
        &self,
        id: PushId,
        epoch: Option<f64>,
        layout: &Layout,
        grad: &[f32],
        dtype: GradDtype,
    ) -> Result<PushReply, ClientError> {
        self.push_encoded(id, epoch, encode_gradient(layout, grad, dtype)).await
    }

    /// Pushes an already encoded safetensors gradient.
    pub async fn push_encoded(
        &self,
        id: PushId,
        epoch: Option<f64>,
        body: impl Into<Upload>,
    ) -> Result<PushReply, ClientError> {
        self.push_paced(id, epoch, None, body).await
    }

    /// [`Self::push_encoded`], reporting the worker's pace with it.
    pub async fn push_paced(
        &self,
        id: PushId,
        epoch: Option<f64>,
        pace: Option<PaceReport>,
        body: impl Into<Upload>,
    ) -> Result<PushReply, ClientError> {
        let body = body.into();
        let PushId { worker, generation, version, incarnation, seq } = id;
        let mut path = format!("{}?worker={worker}&version={version}&seq={seq}", route::GRADIENTS);
        if let Some(g) = generation {
            path += &format!("&generation={g}");
        }
        if let Some(i) = incarnation {
            path += &format!("&incarnation={i:016x}");
        }
        if let Some(e) = epoch {
            path += &format!("&epoch={e}");
        }
        if let Some(p) = pace {
            path += &format!("&steps={}&step_ms={}", p.steps, p.step_seconds * 1e3);
            if let Some(c) = p.exchange_seconds {
                path += &format!("&exchange_ms={}", c * 1e3);
            }
        }
        let resp = self
            .transfer(reqwest::Method::POST, &path, body.len(), Duration::ZERO)
            .body(body.into_request_body())
            .send()
            .await?;
        Self::json(Self::check(resp).await?).await
    }

    pub async fn report(&self, report: &Report) -> Result<(), ClientError> {
        Self::check(self.short(reqwest::Method::POST, route::REPORT).json(report).send().await?).await?;
        Ok(())
    }

    /// `POST /v1/leave`: this incarnation of `worker` has trained all its steps, with `buffers`
    /// (a `wire::buffers` body) the model's untrained `state_dict` entries for the final model.
    /// The answer to the job's last worker says where the PS wrote the final model.
    pub async fn leave(
        &self,
        worker: usize,
        generation: u64,
        buffers: Option<bytes::Bytes>,
    ) -> Result<Option<FinalModel>, ClientError> {
        #[derive(serde::Deserialize)]
        struct Left {
            #[serde(default)]
            final_model: Option<FinalModel>,
        }
        let path = format!("{}?worker={worker}&generation={generation}", route::LEAVE);
        let bytes = buffers.as_ref().map_or(0, |b| b.len());
        let mut req = self.transfer(reqwest::Method::POST, &path, bytes, Duration::ZERO);
        if let Some(body) = buffers {
            req = req.header(reqwest::header::CONTENT_TYPE, "application/octet-stream").body(body);
        }
        let left: Left = Self::json(Self::check(req.send().await?).await?).await?;
        Ok(left.final_model)
    }

    /// `POST /v1/heartbeat`: `worker` is alive and training (between exchanges).
    pub async fn heartbeat(&self, worker: usize) -> Result<(), ClientError> {
        let path = format!("{}?worker={worker}", route::HEARTBEAT);
        Self::check(self.short(reqwest::Method::POST, &path).send().await?).await?;
        Ok(())
    }

    pub async fn status(&self) -> Result<serde_json::Value, ClientError> {
        Self::json(Self::check(self.short(reqwest::Method::GET, route::STATUS).send().await?).await?).await
    }

    /// `PUT /v1/workers?count=N`: tells the PS the job now has `count` workers.
    pub async fn set_workers(&self, count: usize) -> Result<(), ClientError> {
        let req = self.short(reqwest::Method::PUT, &format!("{}?count={count}", route::WORKERS));
        Self::check(req.send().await?).await?;
        Ok(())
    }

    /// `POST /v1/finalize`: the model becomes read-only and the final model is written.
    pub async fn finalize(&self) -> Result<FinalModel, ClientError> {
        let finalize = self.req(reqwest::Method::POST, route::FINALIZE).timeout(FINALIZE_DEADLINE);
        Self::json(Self::check(finalize.send().await?).await?).await
    }
}
