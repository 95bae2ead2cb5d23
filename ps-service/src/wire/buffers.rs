//! The rest of a model's `state_dict`: the entries the PS does not train but the final model
//! must hold so that it loads with `load_state_dict(strict=True)`. BatchNorm's running
//! statistics and `num_batches_tracked`, any other persistent buffer, frozen parameters, and the
//! second name of a tied parameter (`lm_head.weight` for `embed.weight`).
//!
//! A worker sends them with its `POST /v1/leave` as a safetensors body: each buffer in its own
//! dtype (int64 counters stay int64), and the tied names as `__metadata__["aliases"]`, a JSON
//! object from the second name to the trained tensor's name. The PS keeps the last leave's set
//! and writes it into the final model next to the trained parameters, an alias as a copy of its
//! tensor's final values. Why the last worker's: `foresight.finish(evaluate=...)` of that worker
//! is what the job's summary reports, and it evaluated the final parameters with exactly these
//! buffers (DDP likewise keeps one rank's buffers, rank 0's, rather than an average no process
//! evaluated).

use std::collections::BTreeMap;

use safetensors::Dtype;

use super::{HeaderEntry, Layout, MAX_MODEL_NAME_LEN, MAX_TENSORS, Metadata, PENDING_TENSOR, STATE_PREFIXES};
use super::{WireError, header_of, parse};

/// The metadata key of the tied names.
pub const ALIASES_KEY: &str = "aliases";

/// One buffer: its name, safetensors dtype and shape, and its bytes (little-endian).
#[derive(Clone, Debug, PartialEq)]
struct Buffer {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

/// A worker's buffers and tied names, validated.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Buffers {
    buffers: Vec<Buffer>,
    /// (second name, trained tensor's name), sorted by the second name.
    aliases: Vec<(String, String)>,
}

/// The dtypes a buffer may have: what `torch.Tensor` buffers are in practice.
fn dtype_name(d: Dtype) -> Option<&'static str> {
    Some(match d {
        Dtype::F64 => "F64",
        Dtype::F32 => "F32",
        Dtype::F16 => "F16",
        Dtype::BF16 => "BF16",
        Dtype::I64 => "I64",
        Dtype::I32 => "I32",
        Dtype::I16 => "I16",
        Dtype::I8 => "I8",
        Dtype::U8 => "U8",
        Dtype::BOOL => "BOOL",
        _ => return None,
    })
}

/// The index of the first non-finite element of a floating-point buffer.
fn first_non_finite(dtype: Dtype, bytes: &[u8]) -> Option<usize> {
    match dtype {
        Dtype::F64 => {
            bytes.chunks_exact(8).position(|c| !f64::from_le_bytes(c.try_into().unwrap()).is_finite())
        }
        Dtype::F32 => {
            bytes.chunks_exact(4).position(|c| !f32::from_le_bytes(c.try_into().unwrap()).is_finite())
        }
        // Both 16-bit formats are non-finite exactly when their exponent bits are all ones.
        Dtype::F16 => bytes.chunks_exact(2).position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00),
        Dtype::BF16 => {
            bytes.chunks_exact(2).position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80)
        }
        _ => None,
    }
}

fn malformed(why: String) -> WireError {
    WireError::Malformed(why)
}

/// A buffer's or alias's name: not empty, not too long, not one the PS reserves.
fn check_name(name: &str) -> Result<(), WireError> {
    if name.is_empty() || name.len() > MAX_MODEL_NAME_LEN {
        return Err(malformed(format!("buffer name {name:?} must be 1 to {MAX_MODEL_NAME_LEN} bytes")));
    }
    if name == PENDING_TENSOR || STATE_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Err(malformed(format!("buffer name {name:?} is reserved for the optimizer state")));
    }
    Ok(())
}

impl Buffers {
    /// Reads a leave's body. Every buffer and alias name is new to `layout` (the PS's tensors,
    /// a shard's slice on a sharded PS; [`Self::check`] repeats it against the whole model when
    /// the final file is written), floating-point buffers are finite, aliases are valid JSON.
    pub fn decode(body: &[u8], layout: &Layout) -> Result<Self, WireError> {
        let parsed = parse(body)?;
        if parsed.tensors.len() > MAX_TENSORS {
            return Err(malformed(format!("{} buffers, more than {MAX_TENSORS}", parsed.tensors.len())));
        }
        let mut buffers = Vec::with_capacity(parsed.tensors.len());
        for (name, dtype, shape, bytes) in parsed.tensors {
            check_name(&name)?;
            if dtype_name(dtype).is_none() {
                return Err(WireError::Dtype {
                    name,
                    got: format!("{dtype:?}"),
                    allowed: "F64, F32, F16, BF16, I64, I32, I16, I8, U8 or BOOL",
                });
            }
            if let Some(index) = first_non_finite(dtype, bytes) {
                return Err(malformed(format!(
                    "buffer {name:?} holds a non-finite value at element {index}"
                )));
            }
            buffers.push(Buffer { name, dtype, shape, bytes: bytes.to_vec() });
        }
        let aliases: BTreeMap<String, String> = match parsed.metadata.get(ALIASES_KEY) {
            None => BTreeMap::new(),
            Some(json) => serde_json::from_str(json).map_err(|e| {
                malformed(format!("metadata {ALIASES_KEY:?} is not a JSON object of names: {e}"))
            })?,
        };
        for (alias, target) in &aliases {
            check_name(alias)?;
            check_name(target)?;
        }
        let made = Self { buffers, aliases: aliases.into_iter().collect() };
        made.check_names_against(layout, false)?;
        Ok(made)
    }

    /// Whether the set holds nothing.
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty() && self.aliases.is_empty()
    }

    /// Bytes the buffers hold (what the PS keeps in memory for them).
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.bytes.len()).sum()
    }

    /// The buffers' names, then the aliases', in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.buffers.iter().map(|b| b.name.as_str()).chain(self.aliases.iter().map(|(a, _)| a.as_str()))
    }

    /// Checks the set against the whole model: no name is also a trained tensor's, and every
    /// alias names one.
    pub fn check(&self, layout: &Layout) -> Result<(), WireError> {
        self.check_names_against(layout, true)
    }

    fn check_names_against(&self, layout: &Layout, whole_model: bool) -> Result<(), WireError> {
        let mut seen = std::collections::HashSet::new();
        for name in self.names() {
            if layout.position(name).is_some() || !seen.insert(name) {
                return Err(malformed(format!(
                    "buffer {name:?} is named twice, or is also a trained tensor of the model"
                )));
            }
        }
        if whole_model
            && let Some((alias, target)) = self.aliases.iter().find(|(_, t)| layout.position(t).is_none())
        {
            return Err(WireError::UnknownTensor(format!("{target} (aliased as {alias})")));
        }
        Ok(())
    }

    /// The set as a safetensors body, as a worker sends it (how the PS keeps it on disk).
    pub fn encode(&self) -> Vec<u8> {
        let mut meta = Metadata::new();
        if !self.aliases.is_empty() {
            let map: BTreeMap<&str, &str> =
                self.aliases.iter().map(|(a, t)| (a.as_str(), t.as_str())).collect();
            meta.insert(ALIASES_KEY.into(), serde_json::to_string(&map).expect("strings"));
        }
        let mut entries = Vec::with_capacity(self.buffers.len());
        let mut at = 0;
        for b in &self.buffers {
            entries.push(self.entry(b, at));
            at += b.bytes.len();
        }
        let mut out = header_of(&entries, &meta);
        for b in &self.buffers {
            out.extend_from_slice(&b.bytes);
        }
        out
    }

    fn entry(&self, b: &Buffer, at: usize) -> HeaderEntry {
        let dtype = dtype_name(b.dtype).expect("checked at decode");
        (b.name.clone(), dtype, b.shape.clone(), at..at + b.bytes.len())
    }

    /// The final model's header entries after the trained tensors' `model_bytes`: each alias
    /// (F32, its tensor's shape) and each buffer, and the bytes to write after the model's in
    /// that order (an alias's are its tensor's final values).
    pub fn final_entries<'a>(
        &'a self,
        layout: &Layout,
        params: &'a [f32],
        model_bytes: usize,
    ) -> (Vec<HeaderEntry>, Vec<&'a [u8]>) {
        let mut entries = Vec::new();
        let mut data: Vec<&[u8]> = Vec::new();
        let mut at = model_bytes;
        for (alias, target) in &self.aliases {
            let i = layout.position(target).expect("checked against the whole model");
            let (spec, start) = (&layout.tensors[i], layout.offsets[i]);
            let bytes: &[u8] = bytemuck::cast_slice(&params[start..start + spec.numel()]);
            entries.push((alias.clone(), "F32", spec.shape.clone(), at..at + bytes.len()));
            data.push(bytes);
            at += bytes.len();
        }
        for b in &self.buffers {
            entries.push(self.entry(b, at));
            data.push(&b.bytes);
            at += b.bytes.len();
        }
        (entries, data)
    }
}

/// A leave's body as a worker writes it: its tensors (name, safetensors dtype name such as
/// `"F32"` or `"I64"`, shape, little-endian bytes) and its tied names (second name → the trained
/// tensor's). [`Buffers::decode`] is what checks it.
pub fn body(
    tensors: &[(String, String, Vec<usize>, Vec<u8>)],
    aliases: &BTreeMap<String, String>,
) -> Vec<u8> {
    let mut meta = Metadata::new();
    if !aliases.is_empty() {
        meta.insert(ALIASES_KEY.into(), serde_json::to_string(aliases).expect("strings"));
    }
    let mut entries: Vec<(String, &str, Vec<usize>, std::ops::Range<usize>)> =
        Vec::with_capacity(tensors.len());
    let mut at = 0;
    for (name, dtype, shape, bytes) in tensors {
        entries.push((name.clone(), dtype.as_str(), shape.clone(), at..at + bytes.len()));
        at += bytes.len();
    }
    let mut out = header_of(&entries, &meta);
    tensors.iter().for_each(|(.., bytes)| out.extend_from_slice(bytes));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::TensorSpec;

    fn layout() -> Layout {
        Layout::model(vec![
            TensorSpec { name: "bn.weight".into(), shape: vec![2] },
            TensorSpec { name: "embed.weight".into(), shape: vec![3, 2] },
        ])
        .unwrap()
    }

    /// A body with any metadata text for the aliases, valid JSON or not.
    fn body(buffers: &[(&str, &str, Vec<usize>, Vec<u8>)], aliases: Option<&str>) -> Vec<u8> {
        let mut entries = Vec::new();
        let mut at = 0;
        for (name, dtype, shape, bytes) in buffers {
            entries.push((name.to_string(), *dtype, shape.clone(), at..at + bytes.len()));
            at += bytes.len();
        }
        let meta = aliases.map(|a| Metadata::from([(ALIASES_KEY.into(), a.into())])).unwrap_or_default();
        let mut out = header_of(&entries, &meta);
        buffers.iter().for_each(|(.., b)| out.extend_from_slice(b));
        out
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn buffers_of_every_dtype_and_an_alias_round_trip_and_land_after_the_model() {
        let b = body(
            &[
                ("bn.running_mean", "F32", vec![2], f32_bytes(&[0.5, -1.0])),
                ("bn.num_batches_tracked", "I64", vec![], 7i64.to_le_bytes().to_vec()),
                ("mask", "BOOL", vec![2], vec![1, 0]),
            ],
            Some(r#"{"lm_head.weight": "embed.weight"}"#),
        );
        let l = layout();
        let got = Buffers::decode(&b, &l).unwrap();
        assert_eq!(got.bytes(), 8 + 8 + 2);
        assert_eq!(Buffers::decode(&got.encode(), &l).unwrap(), got, "the kept body reads back the same");
        got.check(&l).unwrap();
        let params: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let (entries, data) = got.final_entries(&l, &params, 32);
        let names: Vec<_> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, ["lm_head.weight", "bn.running_mean", "bn.num_batches_tracked", "mask"]);
        // The alias is a copy of embed.weight's final values (elements 2..8), at the model's end.
        assert_eq!(entries[0].3, 32..56);
        assert_eq!(data[0], bytemuck::cast_slice::<f32, u8>(&params[2..8]));
        assert_eq!(entries[2].1, "I64");
        assert_eq!(entries[3].3, 56 + 8 + 8..56 + 8 + 8 + 2);
    }

    #[test]
    fn a_workers_body_reads_back_as_written() {
        let tensors =
            vec![("bn.running_var".to_string(), "F32".to_string(), vec![2], f32_bytes(&[1.0, 2.0]))];
        let aliases = BTreeMap::from([("head.weight".to_string(), "embed.weight".to_string())]);
        let got = Buffers::decode(&super::body(&tensors, &aliases), &layout()).unwrap();
        assert_eq!(got.names().collect::<Vec<_>>(), ["bn.running_var", "head.weight"]);
        assert_eq!(got.encode(), super::body(&tensors, &aliases));
    }

    #[test]
    fn a_bad_set_is_refused_with_its_reason() {
        let l = layout();
        let refused = |b: Vec<u8>| Buffers::decode(&b, &l).unwrap_err().to_string();
        let nan = f32_bytes(&[1.0, f32::NAN]);
        assert!(
            refused(body(&[("bn.running_var", "F32", vec![2], nan)], None))
                .contains("non-finite value at element 1")
        );
        // bf16 +Inf: exponent all ones.
        let inf = 0x7f80u16.to_le_bytes().to_vec();
        assert!(refused(body(&[("x", "BF16", vec![1], inf)], None)).contains("non-finite"));
        let trained = f32_bytes(&[0.0, 0.0]);
        assert!(refused(body(&[("bn.weight", "F32", vec![2], trained)], None)).contains("trained tensor"));
        assert!(refused(body(&[], Some("[1, 2]"))).contains("not a JSON object"));
        assert!(refused(body(&[], Some(r#"{"optimizer.momentum.x": "embed.weight"}"#))).contains("reserved"));
        let e = Buffers::decode(&body(&[], Some(r#"{"head": "nowhere"}"#)), &l).unwrap();
        assert!(e.check(&l).unwrap_err().to_string().contains("nowhere (aliased as head)"));
        assert!(refused(body(&[("c", "U64", vec![1], vec![0; 8])], None)).contains("dtype"));
    }
}
