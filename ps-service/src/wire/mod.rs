//! The wire format: safetensors bodies, the model layout they must match, and their validation.
//!
//! Every tensor body on the wire is a safetensors file. Models travel as F32; gradients may be
//! F32, BF16 or F16 and are widened to f32 on arrival. The PS writes its own bodies with the
//! tensors in layout order and contiguous, so the data region of a model body *is* the flat
//! parameter vector, and the header is padded to 8 bytes so that region is aligned.

use std::collections::{BTreeMap, HashMap};

use safetensors::{Dtype, SafeTensorError, SafeTensors};
use serde::{Deserialize, Serialize};

pub mod buffers;
pub mod final_model;
pub mod in_place;
pub mod int8;
pub mod progress;
pub mod protocol;
pub mod shards;

use protocol::reason;

#[cfg(not(target_endian = "little"))]
compile_error!("safetensors is little-endian; the PS maps it onto f32 slices directly");

/// A safetensors file's `__metadata__` map.
pub type Metadata = BTreeMap<String, String>;

/// Longest tensor name accepted.
pub const MAX_NAME_LEN: usize = 512;
/// Most tensors a layout may hold.
pub const MAX_TENSORS: usize = 100_000;
/// Reserved at the start of a model's tensor names: a checkpoint stores the optimizer state
/// next to the model as `optimizer.mean_square.<name>` and `optimizer.momentum.<name>`.
pub const STATE_PREFIXES: [&str; 2] = ["optimizer.mean_square.", "optimizer.momentum."];
/// Longest model tensor name: prefixed for its optimizer state, it still fits [`MAX_NAME_LEN`].
pub const MAX_MODEL_NAME_LEN: usize = MAX_NAME_LEN - "optimizer.mean_square.".len();
/// Reserved as a model tensor's name: a checkpoint stores Delayed Nesterov's pending sum under
/// it, as one flat tensor of the whole model's length.
pub const PENDING_TENSOR: &str = "optimizer.pending";
/// Most tensors a model may hold: its checkpoint stores each one with its two optimizer-state
/// tensors, and [`PENDING_TENSOR`], and still fits [`MAX_TENSORS`].
pub const MAX_MODEL_TENSORS: usize = (MAX_TENSORS - 1) / (1 + STATE_PREFIXES.len());

/// One named tensor of the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The registered model: named tensors, in order, laid end to end in one flat f32 vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    tensors: Vec<TensorSpec>,
    offsets: Vec<usize>,
    total: usize,
    /// Tensor index by name: a body names every tensor, so a scan per name would make decoding
    /// quadratic in the tensor count (up to MAX_TENSORS).
    index: HashMap<String, usize>,
}

impl Layout {
    pub fn new(tensors: Vec<TensorSpec>) -> Result<Self, WireError> {
        if tensors.is_empty() {
            return Err(WireError::Malformed("the model has no tensors".into()));
        }
        if tensors.len() > MAX_TENSORS {
            return Err(WireError::Malformed(format!("more than {MAX_TENSORS} tensors")));
        }
        let mut index = HashMap::with_capacity(tensors.len());
        let mut offsets = Vec::with_capacity(tensors.len());
        let mut total = 0usize;
        for (i, t) in tensors.iter().enumerate() {
            if t.name.is_empty() || t.name.len() > MAX_NAME_LEN || t.name.chars().any(char::is_control) {
                return Err(WireError::Malformed(format!("invalid tensor name {:?}", t.name)));
            }
            if t.name == "__metadata__" || index.insert(t.name.clone(), i).is_some() {
                return Err(WireError::Malformed(format!("duplicate or reserved tensor name {:?}", t.name)));
            }
            let n = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let n = n.filter(|&n| n > 0).ok_or_else(|| {
                WireError::Malformed(format!(
                    "tensor {:?} has an empty or overflowing shape {:?}",
                    t.name, t.shape
                ))
            })?;
            offsets.push(total);
            total = total.checked_add(n).ok_or_else(|| WireError::Malformed("model too large".into()))?;
        }
        Ok(Self { tensors, offsets, total, index })
    }

    /// A model's layout: [`Layout::new`]'s checks, and names its checkpoint can store its
    /// optimizer state under (found by fuzzing the checkpoint reader: a model with a tensor
    /// `optimizer.momentum.w` next to `w`, or a 512-byte name, was accepted and every
    /// checkpoint of it then panicked), and few enough tensors for that checkpoint (more than
    /// [`MAX_MODEL_TENSORS`] were accepted and the checkpoint then panicked).
    pub fn model(tensors: Vec<TensorSpec>) -> Result<Self, WireError> {
        if tensors.len() > MAX_MODEL_TENSORS {
            return Err(WireError::Malformed(format!(
                "{} tensors: a model may hold at most {MAX_MODEL_TENSORS} (its checkpoint stores three per tensor)",
                tensors.len()
            )));
        }
        for t in &tensors {
            if let Some(prefix) = STATE_PREFIXES.iter().find(|p| t.name.starts_with(**p)) {
                return Err(WireError::Malformed(format!(
                    "tensor name {:?}: names starting with {prefix:?} are reserved for the optimizer state",
                    t.name
                )));
            }
            if t.name == PENDING_TENSOR {
                return Err(WireError::Malformed(format!(
                    "tensor name {PENDING_TENSOR:?} is reserved for the optimizer state"
                )));
            }
            if t.name.starts_with(int8::SCALE_PREFIX) {
                return Err(WireError::Malformed(format!(
                    "tensor name {:?}: names starting with {:?} are reserved for int8 gradients' scales",
                    t.name,
                    int8::SCALE_PREFIX
                )));
            }
            if t.name.len() > MAX_MODEL_NAME_LEN {
                return Err(WireError::Malformed(format!(
                    "tensor name of {} bytes: at most {MAX_MODEL_NAME_LEN}",
                    t.name.len()
                )));
            }
        }
        Self::new(tensors)
    }

    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Number of f32 parameters.
    pub fn len(&self) -> usize {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// (spec, range in the flat vector) for each tensor, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&TensorSpec, std::ops::Range<usize>)> {
        self.tensors.iter().zip(&self.offsets).map(|(t, &o)| (t, o..o + t.numel()))
    }

    /// The first difference between this layout (a worker's) and `theirs` (the PS's), for a
    /// person: which tensor, and its name and shape on either side.
    pub fn difference(&self, theirs: &Layout) -> String {
        let shown =
            |t: Option<&TensorSpec>| t.map_or("nothing".to_string(), |t| format!("{} {:?}", t.name, t.shape));
        let first = (0..self.tensors.len().max(theirs.tensors.len()))
            .find(|&i| self.tensors.get(i) != theirs.tensors.get(i));
        match first {
            None => "none found".into(),
            Some(i) => format!(
                "tensor {i} is {} here and {} on the parameter server ({} tensors here, {} there)",
                shown(self.tensors.get(i)),
                shown(theirs.tensors.get(i)),
                self.tensors.len(),
                theirs.tensors.len()
            ),
        }
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }
}

/// Element types accepted on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireDtype {
    F32,
    Bf16,
    F16,
}

impl WireDtype {
    fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::Bf16 => "BF16",
            Self::F16 => "F16",
        }
    }

    fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }

    fn from_safetensors(d: Dtype) -> Option<Self> {
        match d {
            Dtype::F32 => Some(Self::F32),
            Dtype::BF16 => Some(Self::Bf16),
            Dtype::F16 => Some(Self::F16),
            _ => None,
        }
    }
}

/// What was wrong with a body. [`WireError::reason`] is the bounded label used in metrics and
/// in the JSON error's `reason`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("malformed safetensors body: {0}")]
    Malformed(String),
    #[error("tensor {0:?} is not in the registered model")]
    UnknownTensor(String),
    #[error("tensor {0:?} of the registered model is missing")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {got:?}, the registered model has {want:?}")]
    Shape { name: String, got: Vec<usize>, want: Vec<usize> },
    #[error("tensor {name:?} has dtype {got}, expected {allowed}")]
    Dtype { name: String, got: String, allowed: &'static str },
    #[error("tensor {name:?} holds a non-finite value ({value}) at element {index}")]
    NonFinite { name: String, index: usize, value: f32 },
    #[error(
        "gradient tensor {name:?} holds {value} at element {index}, beyond ±{MAX_GRADIENT:e}: its square \
         would overflow the update (training has diverged; lower the learning rate)"
    )]
    TooLarge { name: String, index: usize, value: f32 },
}

impl WireError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed_body",
            Self::UnknownTensor(_) | Self::MissingTensor(_) => reason::LAYOUT_MISMATCH,
            Self::Shape { .. } => reason::SHAPE_MISMATCH,
            Self::Dtype { .. } => reason::DTYPE_MISMATCH,
            Self::NonFinite { .. } => "non_finite",
            Self::TooLarge { .. } => "too_large",
        }
    }
}

/// A parsed safetensors body: tensor views in file order and the metadata.
/// A tensor of a parsed body: name, dtype, shape and its bytes in the body.
pub type ParsedTensor<'a> = (String, Dtype, Vec<usize>, &'a [u8]);

pub struct Parsed<'a> {
    pub tensors: Vec<ParsedTensor<'a>>,
    pub metadata: BTreeMap<String, String>,
}

/// Parses and structurally validates a safetensors body (header, offsets, sizes).
///
/// The verdict on a body never depends on anything but its bytes: the tensors are ordered by
/// (offsets, name). safetensors orders them by offsets alone, from a `HashMap` with a random
/// seed, so two empty tensors (both at offsets `[0, 0]`) came in either order, and the PS
/// named a different error for the same body from one request to the next (found by fuzzing).
pub fn parse(body: &[u8]) -> Result<Parsed<'_>, WireError> {
    let (n, meta) = SafeTensors::read_metadata(body).map_err(malformed)?;
    let data = &body[8 + n..];
    let mut infos: Vec<_> = meta.tensors().into_iter().collect();
    infos.sort_unstable_by(|(a, x), (b, y)| x.data_offsets.cmp(&y.data_offsets).then_with(|| a.cmp(b)));
    let tensors = infos
        .into_iter()
        .map(|(name, info)| {
            let (s, e) = info.data_offsets;
            (name, info.dtype, info.shape.clone(), &data[s..e])
        })
        .collect();
    let metadata = meta.metadata().clone().unwrap_or_default().into_iter().collect();
    Ok(Parsed { tensors, metadata })
}

/// The refusal of a body safetensors cannot read.
fn malformed(e: SafeTensorError) -> WireError {
    use SafeTensorError::*;
    match e {
        // safetensors checks the tensors one by one in an order that is random when two share
        // offsets, and reports the first failure: which check fails first (and which tensor it
        // names) changes from one request to the next. Whether one fails does not.
        InvalidOffset(_) | TensorInvalidInfo | MisalignedSlice | ValidationOverflow => WireError::Malformed(
            "tensor data offsets do not cover each tensor's bytes (shape × dtype size) once, in order".into(),
        ),
        e => WireError::Malformed(e.to_string()),
    }
}

/// Reads a model body (`PUT /v1/model`, checkpoints): F32 tensors, layout in file order.
pub fn decode_model(body: &[u8]) -> Result<(Layout, Vec<f32>, Metadata), WireError> {
    let parsed = parse(body)?;
    let specs = parsed.tensors.iter().map(|(n, _, s, _)| TensorSpec { name: n.clone(), shape: s.clone() });
    let layout = Layout::model(specs.collect())?;
    let mut values = vec![0f32; layout.len()];
    fill(&layout, &parsed, Fill::Model, &mut values)?;
    Ok((layout, values, parsed.metadata))
}

/// Decodes a gradient body against `layout` into `out` (whose length is the layout's):
/// every registered tensor exactly once, right shape, F32/BF16/F16, all values finite.
pub fn decode_gradient(body: &[u8], layout: &Layout, out: &mut [f32]) -> Result<(), WireError> {
    let parsed = parse(body)?;
    fill(layout, &parsed, Fill::Gradient, out)?;
    match first_unusable(out) {
        Some(i) => Err(unusable_at(layout, out, i)),
        None => Ok(()),
    }
}

/// The largest gradient element, in magnitude, the PS applies. A finite f32 above about 1.8e19
/// squares to infinity, and the delay-compensated rules multiply g² by λ and by w − w_bak: one
/// such element turned the whole model into NaN (dc-asgd-a: λ = λ0/√∞ = 0, and 0·∞ is NaN).
/// 1e12 keeps λ·g²·(w − w_bak) finite for λ up to 1e3 and |w − w_bak| up to 1e11; no training
/// that has not diverged comes near it.
pub const MAX_GRADIENT: f32 = 1e12;

/// Whether a gradient element can be applied: finite and within ±[`MAX_GRADIENT`].
pub fn usable_gradient(g: f32) -> bool {
    // NaN fails every comparison and ±Inf is above the bound: one comparison says it all.
    g.abs() <= MAX_GRADIENT
}

/// The index of the first element of `v` that is not finite, if any.
pub fn first_non_finite(v: &[f32]) -> Option<usize> {
    first_failing(v, f32::is_finite)
}

/// The index of the first element of `g` that is not [`usable_gradient`], if any.
pub fn first_unusable(g: &[f32]) -> Option<usize> {
    first_failing(g, usable_gradient)
}

/// The index of the first element of `v` for which `ok` is false, if any.
///
/// Checked in blocks without an early exit inside a block, so the compiler vectorises it: an
/// early-exit `position` runs one element per cycle, which at 25M parameters was several
/// milliseconds of the PS's receive loop. The exact index is searched only in a bad block.
fn first_failing(v: &[f32], ok: impl Fn(f32) -> bool) -> Option<usize> {
    const BLOCK: usize = 4096;
    v.chunks(BLOCK).enumerate().find_map(|(b, block)| {
        if block.iter().fold(true, |all, x| all & ok(*x)) {
            None
        } else {
            block.iter().position(|x| !ok(*x)).map(|i| b * BLOCK + i)
        }
    })
}

/// Reads a model's F32 tensors from `parsed` into `out` (`layout`'s length): every tensor of
/// `layout` exactly once, with its shape, all values finite.
pub fn fill_model(layout: &Layout, parsed: &Parsed<'_>, out: &mut [f32]) -> Result<(), WireError> {
    fill(layout, parsed, Fill::Model, out)
}

/// What [`fill`] reads.
enum Fill<'p, 'a> {
    /// F32 tensors only.
    Model,
    /// F32, BF16, F16 or int8 tensors, int8 widened with its scales.
    Gradient,
    /// As `Gradient`, but each int8 tensor's values and scales are handed back by layout index
    /// instead of widened (`int8::add_delta` widens them onto a base in the same pass).
    Delta(&'p mut [Option<(&'a [u8], &'a [u8])>]),
}

/// Checks `parsed` against `layout` and widens its tensors into `out` (see [`Fill`]).
fn fill<'a>(
    layout: &Layout,
    parsed: &Parsed<'a>,
    mut what: Fill<'_, 'a>,
    out: &mut [f32],
) -> Result<(), WireError> {
    assert_eq!(out.len(), layout.len());
    let gradient = !matches!(what, Fill::Model);
    let scales = if gradient { int8::scales_of(layout, &parsed.tensors)? } else { Vec::new() };
    let mut present = vec![false; layout.tensors.len()];
    let mut int8_sent = vec![false; scales.len()];
    for (name, dtype, shape, bytes) in &parsed.tensors {
        if gradient && int8::scaled_tensor(name).is_some() {
            continue; // checked by `scales_of`, used with its tensor
        }
        let idx = layout.position(name).ok_or_else(|| WireError::UnknownTensor(name.clone()))?;
        let spec = &layout.tensors[idx];
        if *shape != spec.shape {
            return Err(WireError::Shape {
                name: name.clone(),
                got: shape.clone(),
                want: spec.shape.clone(),
            });
        }
        let o = layout.offsets[idx];
        let out = &mut out[o..o + spec.numel()];
        if gradient && *dtype == Dtype::I8 {
            let scale_name = || format!("{}{name}", int8::SCALE_PREFIX);
            let s = scales[idx].ok_or_else(|| WireError::MissingTensor(scale_name()))?;
            match &mut what {
                Fill::Delta(int8) => int8[idx] = Some((*bytes, s)),
                _ => int8::widen(bytes, s, out),
            }
            int8_sent[idx] = true;
        } else {
            let allowed = if gradient { "F32, BF16, F16 or I8 (with its scales)" } else { "F32" };
            let dt = WireDtype::from_safetensors(*dtype)
                .filter(|d| gradient || *d == WireDtype::F32)
                .ok_or_else(|| WireError::Dtype { name: name.clone(), got: format!("{dtype:?}"), allowed })?;
            widen(dt, bytes, out).map_err(|(index, value)| WireError::NonFinite {
                name: name.clone(),
                index,
                value,
            })?;
        }
        present[idx] = true;
    }
    if let Some(i) = present.iter().position(|p| !p) {
        return Err(WireError::MissingTensor(layout.tensors[i].name.clone()));
    }
    // Scales are only for int8 tensors: any other's would be ignored, so the body is refused.
    if let Some(i) = scales.iter().zip(&int8_sent).position(|(s, sent)| s.is_some() && !sent) {
        let scales = format!("{}{}", int8::SCALE_PREFIX, layout.tensors[i].name);
        return Err(WireError::Malformed(format!("{scales:?} scales a tensor not sent as int8")));
    }
    Ok(())
}

/// The error for a non-finite value at flat index `i` of a gradient in `layout`.
/// The refusal of gradient element `i` of `values`, which is not [`usable_gradient`].
pub fn unusable_at(layout: &Layout, values: &[f32], i: usize) -> WireError {
    let (spec, range) = layout.iter().find(|(_, r)| r.contains(&i)).expect("index inside the layout");
    let (name, index, value) = (spec.name.clone(), i - range.start, values[i]);
    if value.is_finite() {
        WireError::TooLarge { name, index, value }
    } else {
        WireError::NonFinite { name, index, value }
    }
}

/// Converts little-endian `bytes` of `dtype` into `out`, failing on the first non-finite value.
fn widen(dtype: WireDtype, bytes: &[u8], out: &mut [f32]) -> Result<(), (usize, f32)> {
    debug_assert_eq!(bytes.len(), out.len() * dtype.size());
    match dtype {
        // Little-endian f32 is the in-memory layout (checked at compile time above): one copy.
        WireDtype::F32 => bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(bytes),
        WireDtype::Bf16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        WireDtype::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
    }
    // A separate pass: the conversion loops above stay branch-free.
    match first_non_finite(out) {
        None => Ok(()),
        Some(i) => Err((i, out[i])),
    }
}

/// The safetensors header (length prefix + JSON, padded to 8 bytes) for `layout` in `dtype`.
pub fn header(layout: &Layout, dtype: WireDtype, metadata: &BTreeMap<String, String>) -> Vec<u8> {
    header_with(layout, dtype, &[], metadata)
}

/// [`header`] with `extra` entries after the layout's (whose ranges start at the layout's end).
pub fn header_with(
    layout: &Layout,
    dtype: WireDtype,
    extra: &[HeaderEntry],
    metadata: &BTreeMap<String, String>,
) -> Vec<u8> {
    let size = dtype.size();
    let mut entries: Vec<_> = layout
        .iter()
        .map(|(t, r)| (t.name.clone(), dtype.name(), t.shape.clone(), r.start * size..r.end * size))
        .collect();
    entries.extend_from_slice(extra);
    header_of(&entries, metadata)
}

/// A header entry: name, safetensors dtype name, shape, byte range in the data region.
pub type HeaderEntry = (String, &'static str, Vec<usize>, std::ops::Range<usize>);

/// The safetensors header (length prefix + JSON, padded to 8 bytes) for `entries`.
fn header_of<D: AsRef<str>>(
    entries: &[(String, D, Vec<usize>, std::ops::Range<usize>)],
    metadata: &BTreeMap<String, String>,
) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    if !metadata.is_empty() {
        map.insert("__metadata__".into(), serde_json::to_value(metadata).expect("string map"));
    }
    for (name, dtype, shape, r) in entries {
        let entry =
            serde_json::json!({ "dtype": dtype.as_ref(), "shape": shape, "data_offsets": [r.start, r.end] });
        map.insert(name.clone(), entry);
    }
    let mut json = serde_json::to_vec(&map).expect("JSON of strings and numbers");
    while !(8 + json.len()).is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

/// Encodes a flat f32 vector in `layout` as a safetensors body.
pub fn encode_f32(layout: &Layout, values: &[f32], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    assert_eq!(values.len(), layout.len());
    let mut out = header(layout, WireDtype::F32, metadata);
    out.extend_from_slice(bytemuck::cast_slice(values));
    out
}

/// [`encode_f32`] with no metadata into `out`, a recycled buffer: a worker encodes a push per
/// step, and a fresh model-sized body had every page faulted in again (25M values in the
/// transport bench: 17–19 ms into a fresh buffer, 7.4 ms into the last body).
pub fn encode_f32_into(layout: &Layout, values: &[f32], out: Vec<u8>) -> Vec<u8> {
    encode_into(layout, WireDtype::F32, values, out, |values, out| {
        out.copy_from_slice(bytemuck::cast_slice(values))
    })
}

/// Encodes a flat f32 vector as BF16 (round to nearest even), halving a gradient's or a pulled
/// model's bytes.
pub fn encode_bf16(layout: &Layout, values: &[f32]) -> Vec<u8> {
    encode_bf16_into(layout, values, Vec::new())
}

/// [`encode_bf16`] into `out`, a recycled buffer: a PS rounds every bf16 pull, and a fresh
/// body-sized buffer each time had all its pages faulted in again.
pub fn encode_bf16_into(layout: &Layout, values: &[f32], out: Vec<u8>) -> Vec<u8> {
    encode_into(layout, WireDtype::Bf16, values, out, round_to_bf16)
}

/// `values` encoded as `dtype` after the layout's header into `out`, a recycled buffer: one of
/// the body's length is overwritten without being cleared first (`encode` writes every byte of
/// its piece). The values are encoded on every core a model of this size may use, in pieces.
fn encode_into(
    layout: &Layout,
    dtype: WireDtype,
    values: &[f32],
    mut out: Vec<u8>,
    encode: impl Fn(&[f32], &mut [u8]) + Sync,
) -> Vec<u8> {
    assert_eq!(values.len(), layout.len());
    let head = header(layout, dtype, &BTreeMap::new());
    let size = dtype.size();
    body_of(&mut out, &head, values.len() * size);
    let data = &mut out[head.len()..];
    const PIECE: usize = 1 << 16;
    let pieces: Vec<_> = data.chunks_mut(size * PIECE).zip(values.chunks(PIECE)).collect();
    let threads = crate::cores::threads_for(values.len());
    crate::cores::in_runs(
        pieces,
        threads,
        |(_, v)| v.len(),
        |run| {
            for (out, values) in run {
                encode(values, out);
            }
        },
    );
    out
}

/// `out` made `head` followed by `data_len` bytes for the caller to write every one of: a
/// recycled body of that length keeps its old data bytes (they are all overwritten), any other
/// is cleared and zero-filled first.
pub(super) fn body_of(out: &mut Vec<u8>, head: &[u8], data_len: usize) {
    if out.len() != head.len() + data_len {
        out.clear();
        out.resize(head.len() + data_len, 0);
    }
    out[..head.len()].copy_from_slice(head);
}

/// Writes `values` rounded to bf16 into `out` (two little-endian bytes each). Each block is
/// rounded into an array of u16 first and copied out whole: written pair by pair into the bytes,
/// the loop did not vectorise (docs/benchmarks.md, "bf16 pushes read in place").
fn round_to_bf16(values: &[f32], out: &mut [u8]) {
    const BLOCK: usize = 1024;
    for (out, values) in out.chunks_mut(2 * BLOCK).zip(values.chunks(BLOCK)) {
        let mut bits = [0u16; BLOCK];
        crate::cores::with_avx2(|| round_block(values, &mut bits));
        out.copy_from_slice(bytemuck::cast_slice(&bits[..values.len()]));
    }
}

/// Rounds `values` into `bits`.
#[inline(always)]
fn round_block(values: &[f32], bits: &mut [u16]) {
    for (b, v) in bits.iter_mut().zip(values) {
        *b = bf16_bits(*v).to_le();
    }
}

/// `v` rounded to bf16 (to nearest, ties to even) and widened back: what a bf16 body carries.
pub fn bf16_round_trip(v: f32) -> f32 {
    f32::from_bits(u32::from(bf16_bits(v)) << 16)
}

/// `half::bf16::from_f32(v).to_bits()` without its branches, so that the loop over a model
/// vectorises: a pull of 100M parameters in bf16 is rounded per pull.
#[inline]
fn bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let nan = x & 0x7fff_ffff > 0x7f80_0000;
    // Round to nearest, ties to even: up when the dropped half is above a half, or exactly a
    // half with an odd last kept bit.
    let up = (x & 0x8000 != 0) & (x & 0x1_7fff != 0);
    let rounded = (x >> 16) + u32::from(up);
    (if nan { (x >> 16) | 0x40 } else { rounded }) as u16
}

#[cfg(test)]
mod tests;
