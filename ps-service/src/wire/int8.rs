//! Gradients (and pseudo-gradients) on the wire as int8 with a scale per chunk: a quarter of
//! F32's bytes, half of BF16's, for slow links (DiLoCo-style local steps push rarely, but each
//! push is model-sized).
//!
//! Each tensor `name` of the layout travels as an `I8` tensor of its own shape, with an `F32`
//! tensor `int8.scale.<name>` of shape `[ceil(numel / CHUNK)]` beside it: element `i` is
//! `q[i] × scale[i / CHUNK]`, counted within the tensor in row-major order. A chunk's scale is its
//! largest magnitude / 127, so the rounding error is at most half a scale step. The PS widens to
//! f32 on arrival and keeps all its state in f32; a body may mix int8 tensors with F32/BF16/F16
//! ones. The client's error feedback (`client::link`) carries each push's rounding error into
//! the next.

use std::collections::BTreeMap;

use super::{Layout, WireError};

/// Elements per scale. 4 bytes of scale per 1,024 bytes of values: 0.4 % more than plain int8.
pub const CHUNK: usize = 1024;

/// Prefix of a scales tensor's name; a model's own tensor names may not start with it.
pub const SCALE_PREFIX: &str = "int8.scale.";

/// Scales a tensor of `numel` elements has.
pub fn chunks(numel: usize) -> usize {
    numel.div_ceil(CHUNK)
}

/// Quantizes `values` (the layout's flat vector) into an int8 gradient body and leaves in them
/// what the rounding left out (`values − decoded`), for the sender's error feedback.
pub fn encode(layout: &Layout, values: &mut [f32]) -> Vec<u8> {
    encode_into(layout, values, Vec::new())
}

/// [`encode`] into `out`, a recycled body (a worker pushes one per step).
pub fn encode_into(layout: &Layout, values: &mut [f32], mut out: Vec<u8>) -> Vec<u8> {
    assert_eq!(values.len(), layout.len());
    let head = body(layout, &mut out);
    let pieces = pieces(layout, &mut out[head..]);
    in_runs_of(pieces, values, |run, values| {
        for (p, v) in run.into_iter().zip(values) {
            let scale = quantize(v, p.q);
            p.scale.copy_from_slice(&scale.to_le_bytes());
        }
        true
    });
    out
}

/// A model pulled as int8 against the copy the worker holds (`replica`, which the PS keeps for
/// it): the body is `current − replica` in [`encode`]'s format, and `replica` becomes what the
/// worker will hold after adding the decoded body, bit for bit (each element `q × scale` added
/// in f32, as [`widen`] and [`apply_delta`] do on the worker). So each pull's rounding stays in
/// `current − replica` for the next one: error feedback without the worker's help, and the
/// worker's copy is never further from the model than one pull's rounding. Chunk by chunk, the
/// chunks shared among the cores: no model-sized buffer but the body (`out`, a recycled buffer),
/// each chunk checked while it is in cache. False when a difference is beyond
/// what a gradient body may carry (±[`super::MAX_GRADIENT`]: the worker would refuse it);
/// `replica` is then partly updated, and the caller sends the whole model and makes that the
/// copy instead.
pub fn encode_delta(layout: &Layout, current: &[f32], replica: &mut [f32], out: &mut Vec<u8>) -> bool {
    assert_eq!((current.len(), replica.len()), (layout.len(), layout.len()));
    let head = body(layout, out);
    let pieces = pieces(layout, &mut out[head..]);
    in_runs_of(pieces, replica, |run, replicas| {
        let mut diff = [0f32; CHUNK];
        for (p, rep) in run.into_iter().zip(replicas) {
            let d = &mut diff[..rep.len()];
            for ((d, c), r) in d.iter_mut().zip(&current[p.at..]).zip(rep.iter()) {
                *d = c - r;
            }
            if super::first_unusable(d).is_some() {
                return false;
            }
            let scale = quantize(d, p.q);
            for (r, &q) in rep.iter_mut().zip(p.q.iter()) {
                *r += f32::from(q as i8) * scale;
            }
            p.scale.copy_from_slice(&scale.to_le_bytes());
        }
        true
    })
}

/// `out` made an int8 body of `layout` with its header written; returns where the data starts.
/// Its caller writes every data byte, so a recycled body of the same length is not zeroed first
/// (the others are).
fn body(layout: &Layout, out: &mut Vec<u8>) -> usize {
    let mut entries = Vec::with_capacity(layout.tensors().len() * 2);
    let mut at = 0;
    for (t, r) in layout.iter() {
        let n = chunks(r.len());
        entries.push((t.name.clone(), "I8", t.shape.clone(), at..at + r.len()));
        at += r.len();
        entries.push((format!("{SCALE_PREFIX}{}", t.name), "F32", vec![n], at..at + 4 * n));
        at += 4 * n;
    }
    let header = super::header_of(&entries, &BTreeMap::new());
    super::body_of(out, &header, at);
    header.len()
}

/// One chunk of a tensor in an int8 body: where its values start in the flat vector, and the
/// body bytes of its int8 values and of its scale.
struct Piece<'a> {
    at: usize,
    q: &'a mut [u8],
    scale: &'a mut [u8],
}

/// `data` (an int8 body of `layout` after its header) cut into its chunks, in layout order.
fn pieces<'a>(layout: &Layout, mut data: &'a mut [u8]) -> Vec<Piece<'a>> {
    let mut pieces = Vec::with_capacity(layout.len().div_ceil(CHUNK) + layout.tensors().len());
    for (_, r) in layout.iter() {
        let (values, rest) = std::mem::take(&mut data).split_at_mut(r.len());
        let (scales, rest) = rest.split_at_mut(4 * chunks(r.len()));
        data = rest;
        let starts = r.clone().step_by(CHUNK);
        for ((at, q), scale) in starts.zip(values.chunks_mut(CHUNK)).zip(scales.chunks_exact_mut(4)) {
            pieces.push(Piece { at, q, scale });
        }
    }
    pieces
}

/// Runs `f` over `pieces` in contiguous runs, one per core a model of this size may use, each
/// with the pieces' own chunks of `values` (the layout's flat vector, in layout order). True
/// when every run's `f` was.
fn in_runs_of(
    pieces: Vec<Piece<'_>>,
    values: &mut [f32],
    f: impl Fn(Vec<Piece<'_>>, Vec<&mut [f32]>) -> bool + Sync,
) -> bool {
    let threads = crate::cores::threads_for(values.len());
    let mut rest = values;
    let paired: Vec<_> = pieces
        .into_iter()
        .map(|p| {
            let (mine, after) = std::mem::take(&mut rest).split_at_mut(p.q.len());
            rest = after;
            (p, mine)
        })
        .collect();
    let answers = crate::cores::in_runs(
        paired,
        threads,
        |(p, _)| p.q.len(),
        |run| {
            let (pieces, values): (Vec<_>, Vec<_>) = run.into_iter().unzip();
            f(pieces, values)
        },
    );
    answers.into_iter().all(|ok| ok)
}

/// `copy += delta`: what the worker does with a decoded pull against its copy.
pub fn apply_delta(copy: &mut [f32], delta: &[f32]) {
    for (c, d) in copy.iter_mut().zip(delta) {
        *c += d;
    }
}

/// Reads a pull's difference body (a gradient body, int8 as [`encode_delta`] writes it) onto
/// `base`, the copy it is the difference from: `out = base + decoded`, the model the worker
/// holds next. Bit for bit what decoding the body and [`apply_delta`] give, and what the PS
/// added to its record of the copy (`q × scale`, then the addition, in f32), but each int8
/// value is read, widened and added in one pass, the chunks shared among the cores: the body
/// is a quarter of the model's bytes, and the model-sized decoded difference is never written.
/// Refused like a gradient body; then `out` holds anything, `base` is untouched.
pub fn add_delta(body: &[u8], layout: &Layout, base: &[f32], out: &mut [f32]) -> Result<(), WireError> {
    assert_eq!((base.len(), out.len()), (layout.len(), layout.len()));
    let parsed = super::parse(body)?;
    let mut int8 = vec![None; layout.tensors().len()];
    super::fill(layout, &parsed, super::Fill::Delta(&mut int8), out)?;
    let threads = crate::cores::threads_for(out.len());
    let (mut base, mut out_rest) = (base, &mut out[..]);
    let mut pieces = Vec::with_capacity(layout.len().div_ceil(CHUNK) + layout.tensors().len());
    for ((_, r), sent) in layout.iter().zip(int8) {
        let (b, rest) = base.split_at(r.len());
        let (o, rest_out) = std::mem::take(&mut out_rest).split_at_mut(r.len());
        (base, out_rest) = (rest, rest_out);
        match sent {
            Some((q, scales)) => {
                let chunks = q.chunks(CHUNK).zip(scales.chunks_exact(4));
                for (((q, s), b), o) in chunks.zip(b.chunks(CHUNK)).zip(o.chunks_mut(CHUNK)) {
                    pieces.push(DeltaPiece {
                        q: Some((q, f32::from_le_bytes([s[0], s[1], s[2], s[3]]))),
                        base: b,
                        out: o,
                    });
                }
            }
            // Widened into `out` already (F32/BF16/F16): only the base to add.
            None => pieces.push(DeltaPiece { q: None, base: b, out: o }),
        }
    }
    let finite = crate::cores::in_runs(
        pieces,
        threads,
        |p| p.out.len(),
        |run| run.into_iter().fold(true, |all, piece| piece.add() & all),
    );
    if finite.into_iter().all(|f| f) {
        return Ok(());
    }
    // Only a refused body pays for finding where.
    let i = super::first_non_finite(out).expect("a piece found a non-finite value");
    Err(super::unusable_at(layout, out, i))
}

/// One chunk of a difference: its int8 values and scale (or `None` when `out` holds the widened
/// difference already), the base it is added to, and where the sum goes.
struct DeltaPiece<'a> {
    q: Option<(&'a [u8], f32)>,
    base: &'a [f32],
    out: &'a mut [f32],
}

impl DeltaPiece<'_> {
    /// Writes the sum; whether it is all finite, checked while the chunk is in cache.
    fn add(self) -> bool {
        match self.q {
            Some((q, scale)) => {
                for ((o, &q), b) in self.out.iter_mut().zip(q).zip(self.base) {
                    *o = b + f32::from(q as i8) * scale;
                }
            }
            None => apply_delta(self.out, self.base),
        }
        super::first_non_finite(self.out).is_none()
    }
}

/// One chunk's int8 values, written to `q`, and its scale; `chunk` is left with
/// `chunk − decoded`.
fn quantize(chunk: &mut [f32], q: &mut [u8]) -> f32 {
    let max = chunk.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = max / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (x, q) in chunk.iter_mut().zip(q) {
        let v = round_half_away((*x * inv).clamp(-127.0, 127.0));
        *q = v as u8;
        *x -= v as f32 * scale;
    }
    scale
}

/// `y.round() as i32` (half away from zero; NaN gives 0) for |y| ≤ 127, in integer steps that
/// vectorise: truncate, then step away from zero when the dropped fraction (exact, |y| < 2²³)
/// is at least a half. `f32::round` and a saturating cast to i8 in this loop took twice the
/// time (a chunk-by-chunk encode of 25M values: 51 against 26 ms on one core here).
#[inline]
fn round_half_away(y: f32) -> i32 {
    let t = y as i32;
    let frac = y - t as f32;
    t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)
}

/// Widens one int8 tensor into `out` with its scales (little-endian F32 bytes, one per chunk).
/// The caller checked the byte counts; the values are checked afterwards like any gradient's.
pub fn widen(q: &[u8], scales: &[u8], out: &mut [f32]) {
    debug_assert_eq!(q.len(), out.len());
    debug_assert_eq!(scales.len(), 4 * chunks(out.len()));
    for ((o, q), s) in out.chunks_mut(CHUNK).zip(q.chunks(CHUNK)).zip(scales.chunks_exact(4)) {
        let scale = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        for (o, &b) in o.iter_mut().zip(q) {
            *o = f32::from(b as i8) * scale;
        }
    }
}

/// The layout tensor a scales tensor belongs to, when `name` is one.
pub fn scaled_tensor(name: &str) -> Option<&str> {
    name.strip_prefix(SCALE_PREFIX)
}

/// The bytes of each layout tensor's scales in a body (by layout index), checked: F32, one per
/// chunk, finite, for a tensor of the layout.
pub fn scales_of<'a>(
    layout: &Layout,
    tensors: &[super::ParsedTensor<'a>],
) -> Result<Vec<Option<&'a [u8]>>, WireError> {
    let mut found = vec![None; layout.tensors().len()];
    for (name, dtype, shape, bytes) in tensors {
        let Some(of) = scaled_tensor(name) else { continue };
        let idx = layout.position(of).ok_or_else(|| WireError::UnknownTensor(name.clone()))?;
        let want = vec![chunks(layout.tensors()[idx].numel())];
        if *shape != want {
            return Err(WireError::Shape { name: name.clone(), got: shape.clone(), want });
        }
        if *dtype != safetensors::Dtype::F32 {
            return Err(WireError::Dtype { name: name.clone(), got: format!("{dtype:?}"), allowed: "F32" });
        }
        let bad =
            bytes.chunks_exact(4).position(|s| !f32::from_le_bytes([s[0], s[1], s[2], s[3]]).is_finite());
        if let Some(index) = bad {
            let s = &bytes[4 * index..4 * index + 4];
            let value = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            return Err(WireError::NonFinite { name: name.clone(), index, value });
        }
        found[idx] = Some(*bytes);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit for bit what `f32::round`, a clamp and a cast to i8 give, on the values where
    /// rounding can go wrong: exact halves of both signs, the floats either side of them, the
    /// clamp's ends, zeros, NaN.
    #[test]
    fn quantizing_rounds_exactly_as_f32_round_does() {
        let mut values = vec![0.0, -0.0, f32::NAN, 127.0, -127.0, 126.5, -126.5];
        for k in -127..=127 {
            let half = k as f32 + 0.5;
            values.extend([half, half.next_down(), half.next_up(), -half, (-half).next_up(), k as f32]);
        }
        for start in (0..values.len()).step_by(CHUNK) {
            let chunk = &values[start..(start + CHUNK).min(values.len())];
            let (mut ours, mut q) = (chunk.to_vec(), vec![0u8; chunk.len()]);
            let scale = quantize(&mut ours, &mut q);
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            for (i, x) in chunk.iter().enumerate() {
                let want = (x * inv).round().clamp(-127.0, 127.0) as i8;
                assert_eq!(q[i] as i8, want, "{x} (scaled {})", x * inv);
                assert_eq!(ours[i].to_bits(), (x - f32::from(want) * scale).to_bits(), "{x}");
            }
        }
        // The scaled values themselves, with a scale of exactly 1 (a chunk whose largest is 127).
        for y in [0.5f32, 0.49999997, -0.5, -0.49999997, 1.5, 2.5, -2.5, 126.49999, f32::NAN] {
            assert_eq!(round_half_away(y), y.round().clamp(-127.0, 127.0) as i8 as i32, "{y}");
        }
    }

    /// A recycled body, of the same length (its old bytes kept) or not, ends up as a fresh one.
    #[test]
    fn bodies_encoded_into_recycled_buffers_are_the_fresh_ones() {
        let spec = |n: &str, len: usize| super::super::TensorSpec { name: n.into(), shape: vec![len] };
        let l = Layout::new(vec![spec("w", 3 * CHUNK + 17), spec("b", 5)]).unwrap();
        let values: Vec<f32> = (0..l.len()).map(|i| ((i * 37) % 201) as f32 * 0.01 - 1.0).collect();
        let fresh = encode(&l, &mut values.clone());
        let base: Vec<f32> = values.iter().map(|v| v * 0.5).collect();
        let mut fresh_delta = Vec::new();
        assert!(encode_delta(&l, &values, &mut base.clone(), &mut fresh_delta));
        for old in [vec![0xAA; fresh.len()], vec![0x55; fresh.len() + 3], Vec::new()] {
            assert_eq!(encode_into(&l, &mut values.clone(), old.clone()), fresh);
            let (mut body, mut replica) = (old, base.clone());
            assert!(encode_delta(&l, &values, &mut replica, &mut body));
            assert_eq!(body, fresh_delta);
        }
    }
}
