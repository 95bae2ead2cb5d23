//! The HTTP protocol's names, shared by the PS (`server`) and its clients (`client`): the
//! routes, the `x-foresight-*` headers, the error reasons a client acts on, the progress report's
//! body and the dtypes a model is pulled in. Both sides name them from here, so neither imports
//! the other for its vocabulary (docs/protocol.md is their prose).

use serde::{Deserialize, Serialize};

/// The API's routes.
pub mod route {
    pub const MODEL: &str = "/v1/model";
    pub const JOIN: &str = "/v1/join";
    pub const GRADIENTS: &str = "/v1/gradients";
    pub const REPORT: &str = "/v1/report";
    pub const LEAVE: &str = "/v1/leave";
    pub const HEARTBEAT: &str = "/v1/heartbeat";
    pub const STATUS: &str = "/v1/status";
    pub const FINALIZE: &str = "/v1/finalize";
    pub const WORKERS: &str = "/v1/workers";
}

/// The `reason` of a refusal (`{"reason": …, "error": …}`) that a client tells apart.
pub mod reason {
    pub const PULL_REQUIRED: &str = "pull_required";
    pub const TOO_STALE: &str = "too_stale";
    pub const ROUND_CLOSED: &str = "round_closed";
    pub const FUTURE_VERSION: &str = "future_version";
    pub const UNKNOWN_WORKER: &str = "unknown_worker";
    pub const NOT_REGISTERED: &str = "not_registered";
    pub const CREDENTIAL_REFUSED: &str = "credential_refused";
    pub const ALREADY_CONTRIBUTED: &str = "already_contributed";
    pub const FINALIZED: &str = "finalized";
    pub const REJOIN_REQUIRED: &str = "rejoin_required";
    pub const STALE_SEQ: &str = "stale_seq";
    pub const UNAUTHORIZED: &str = "unauthorized";
    pub const LAYOUT_MISMATCH: &str = "layout_mismatch";
    pub const SHAPE_MISMATCH: &str = "shape_mismatch";
    pub const DTYPE_MISMATCH: &str = "dtype_mismatch";
    pub const VERSION_MISMATCH: &str = "version_mismatch";
    pub const IN_FLIGHT: &str = "in_flight";
    pub const BODY_STALLED: &str = "body_stalled";
    pub const BODY_TOO_SLOW: &str = "body_too_slow";
}

/// The model version a pull answers with, or a push was applied at.
pub const VERSION_HEADER: &str = "x-foresight-version";
/// The Foresight version of the client that joins (the Rust worker's, the Python wheel's): the
/// PS refuses a join from a version it cannot speak to, naming both.
pub const CLIENT_VERSION_HEADER: &str = "x-foresight-client-version";
/// This PS's Foresight version.
pub const PS_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Whether a client of version `client` speaks this PS's protocol: the same release line (the
/// same major version, and from 1.0 on any minor; before 1.0, the same minor, as semver has it).
pub fn speaks_our_protocol(client: &str) -> bool {
    let line = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(if major == 0 { (0, minor) } else { (major, 0) })
    };
    line(client).is_some() && line(client) == line(PS_VERSION)
}

/// This PS process (`/v1/status` `process.incarnation`), on every model a pull sends.
pub const INCARNATION_HEADER: &str = "x-foresight-incarnation";
/// How long a pull was held waiting for the version it asked for (a `sync` round), in
/// milliseconds: the client leaves it out of the exchange's time it reports.
pub const HELD_HEADER: &str = "x-foresight-held-ms";
/// On an int8 pull's answer: the tag of the copy the worker holds once it took this answer;
/// the next int8 pull names it as `base`.
pub const COPY_HEADER: &str = "x-foresight-copy";
/// On an int8 pull's answer that is a difference: the tag of the copy it is the difference
/// from. Absent: the body is the whole model in F32.
pub const DELTA_FROM_HEADER: &str = "x-foresight-delta-from";

/// The header a worker's calls carry the credential in: `WORKER.GENERATION.MAC` (MAC in hex).
pub const CREDENTIAL_HEADER: &str = "x-foresight-credential";

/// What a worker reports about its training (`POST /v1/report`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub worker: usize,
    pub step: u64,
    pub epoch: f64,
    pub loss: f64,
    #[serde(default)]
    pub accuracy: Option<f64>,
    #[serde(default)]
    pub samples_per_second: Option<f64>,
}

impl Report {
    /// The values the PS takes (finite; loss and epoch not negative; accuracy a fraction).
    pub fn validate(&self) -> Result<(), String> {
        let finite_nonneg = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!("{name} must be a finite number ≥ 0, got {v}"))
            }
        };
        finite_nonneg("epoch", self.epoch)?;
        finite_nonneg("loss", self.loss)?;
        if let Some(a) = self.accuracy
            && !(0.0..=1.0).contains(&a)
        {
            return Err(format!("accuracy must be in [0, 1], got {a}"));
        }
        if let Some(s) = self.samples_per_second {
            finite_nonneg("samples_per_second", s)?;
        }
        Ok(())
    }
}

/// Element type a model is pulled in; the PS keeps float32 either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PullDtype {
    #[default]
    F32,
    /// Half the bytes: the worker computes on the model rounded to bf16, as mixed-precision
    /// training computes on a bf16 copy of float32 master weights.
    Bf16,
    /// A quarter of the bytes: the int8 difference between the model and the copy the worker
    /// holds, which the PS tracks (the first pull, and any after the PS lost track, is F32).
    /// What a pull's rounding leaves out is in the next pull's difference, so the worker's copy
    /// stays within one pull's rounding of the model.
    Int8,
}

impl PullDtype {
    /// The encoding a whole model arrives in (an int8 pull's whole answer is F32).
    pub(crate) fn wire(self) -> crate::wire::WireDtype {
        match self {
            Self::F32 | Self::Int8 => crate::wire::WireDtype::F32,
            Self::Bf16 => crate::wire::WireDtype::Bf16,
        }
    }

    /// The name the PS's `dtype` query parameter and the job's settings use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_speaks_our_protocol_on_the_same_release_line_only() {
        let ours: Vec<u64> = PS_VERSION.split('.').map(|p| p.parse().unwrap()).collect();
        let (major, minor) = (ours[0], ours[1]);
        assert!(speaks_our_protocol(PS_VERSION));
        assert!(speaks_our_protocol(&format!("{major}.{minor}.99")), "a patch release");
        assert!(!speaks_our_protocol(&format!("{}.0.0", major + 1)), "the next major");
        if major == 0 {
            assert!(!speaks_our_protocol(&format!("0.{}.0", minor + 1)), "before 1.0 a minor breaks");
        }
        for junk in ["", "x", "1", "1.x.0", "-1.0.0"] {
            assert!(!speaks_our_protocol(junk), "{junk:?}");
        }
    }
}
