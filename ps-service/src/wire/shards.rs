//! The shard map: which part of the model each of N parameter-server shards holds.
//!
//! Shard i of N holds the flat range [⌊i·T/N⌋, ⌊(i+1)·T/N⌋) of the model's T parameters in
//! layout order: contiguous, balanced to one element, small tensors packed together and a
//! tensor that crosses a boundary cut there. It is a pure function of (layout, N), so workers,
//! the PS and any third-party client compute the same one. Each shard is an ordinary PS for its
//! slice, whose layout names a whole tensor as it is and a cut one's piece
//! `<name>[<lo>..<hi> of <d0>x<d1>...]` (elements lo..hi of the flattened tensor, 1-D): a
//! shard's model file says what it holds, and [`merge`] puts the shards' files back together
//! without the original layout.

use std::ops::Range;

use super::{Layout, TensorSpec, WireError};

/// Most shards a job may have.
pub const MAX_SHARDS: usize = 64;

/// The slices of one model over N shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMap {
    ranges: Vec<Range<usize>>,
    layouts: Vec<Layout>,
}

impl ShardMap {
    /// The map of `layout` over `count` shards; one shard's layout is `layout` itself.
    pub fn new(layout: &Layout, count: usize) -> Result<Self, WireError> {
        let total = layout.len();
        if count == 0 || count > MAX_SHARDS || count > total {
            return Err(WireError::Malformed(format!(
                "{count} shards for a model of {total} parameters (1 to {MAX_SHARDS}, at most one per parameter)"
            )));
        }
        if count == 1 {
            return Ok(Self { ranges: std::iter::once(0..total).collect(), layouts: vec![layout.clone()] });
        }
        if let Some(t) = layout.tensors().iter().find(|t| Piece::parse(&t.name).is_some()) {
            return Err(WireError::Malformed(format!(
                "tensor name {:?} reads as a piece of a sharded tensor: rename it to shard this model",
                t.name
            )));
        }
        let bound = |i: usize| (i as u128 * total as u128 / count as u128) as usize;
        let ranges: Vec<_> = (0..count).map(|i| bound(i)..bound(i + 1)).collect();
        let layouts = ranges.iter().map(|r| slice_layout(layout, r.clone())).collect::<Result<_, _>>()?;
        Ok(Self { ranges, layouts })
    }

    /// Number of shards.
    pub fn count(&self) -> usize {
        self.ranges.len()
    }

    /// Shard `i`'s range of the flat parameter vector.
    pub fn range(&self, i: usize) -> Range<usize> {
        self.ranges[i].clone()
    }

    /// `flat` (the whole model's length) cut into the shards' slices, in shard order.
    pub fn split_mut<'a>(&self, flat: &'a mut [f32]) -> Vec<&'a mut [f32]> {
        let mut rest = flat;
        let mut slices = Vec::with_capacity(self.ranges.len());
        for r in &self.ranges {
            let (slice, after) = std::mem::take(&mut rest).split_at_mut(r.len());
            slices.push(slice);
            rest = after;
        }
        slices
    }

    /// Shard `i`'s layout: what it registers, serves and checkpoints.
    pub fn layout(&self, i: usize) -> &Layout {
        &self.layouts[i]
    }
}

/// The layout of `range` of `layout`'s flat vector.
fn slice_layout(layout: &Layout, range: Range<usize>) -> Result<Layout, WireError> {
    let mut tensors = Vec::new();
    for (spec, r) in layout.iter() {
        let (lo, hi) = (r.start.max(range.start), r.end.min(range.end));
        if lo >= hi {
            continue;
        }
        if lo == r.start && hi == r.end {
            tensors.push(spec.clone());
        } else {
            let name = piece_name(&spec.name, lo - r.start, hi - r.start, &spec.shape);
            tensors.push(TensorSpec { name, shape: vec![hi - lo] });
        }
    }
    Layout::new(tensors)
}

fn piece_name(name: &str, lo: usize, hi: usize, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("{name}[{lo}..{hi} of {}]", dims.join("x"))
}

/// The name of the tensor `name` is, or is a piece of (`<name>[<lo>..<hi> of <dims>]`).
pub fn tensor_name(name: &str) -> &str {
    Piece::parse(name).map_or(name, |p| p.name)
}

/// A piece of a cut tensor, read back from its name.
#[derive(Debug, PartialEq, Eq)]
struct Piece<'a> {
    name: &'a str,
    elements: Range<usize>,
    shape: Vec<usize>,
}

impl<'a> Piece<'a> {
    fn parse(full: &'a str) -> Option<Self> {
        let body = full.strip_suffix(']')?;
        let open = body.rfind('[')?;
        let (name, spec) = (&body[..open], &body[open + 1..]);
        let (span, dims) = spec.split_once(" of ")?;
        let (lo, hi) = span.split_once("..")?;
        let shape = dims.split('x').map(str::parse).collect::<Result<Vec<usize>, _>>().ok()?;
        Some(Self { name, elements: lo.parse().ok()?..hi.parse().ok()?, shape })
    }
}

/// The whole model from the shards' layouts and values, in shard order: consecutive pieces of
/// a cut tensor are joined back into it.
pub fn merge(shards: &[(Layout, Vec<f32>)]) -> Result<(Layout, Vec<f32>), WireError> {
    let bad = |what: String| WireError::Malformed(format!("the shards do not make one model: {what}"));
    let mut tensors = Vec::new();
    let mut values = Vec::with_capacity(shards.iter().map(|(l, _)| l.len()).sum());
    // The cut tensor being put back together: its name, shape and elements seen so far.
    let mut open: Option<(String, Vec<usize>, usize)> = None;
    for (layout, v) in shards {
        if v.len() != layout.len() {
            return Err(bad(format!("{} values for {} parameters", v.len(), layout.len())));
        }
        values.extend_from_slice(v);
        for spec in layout.tensors() {
            let piece = Piece::parse(&spec.name).filter(|p| spec.shape == [p.elements.len()]);
            match (piece, open.take()) {
                (None, None) => tensors.push(spec.clone()),
                (Some(p), None) if p.elements.start == 0 => {
                    open = Some((p.name.into(), p.shape, p.elements.end))
                }
                (Some(p), Some((name, shape, seen)))
                    if p.name == name && p.shape == shape && p.elements.start == seen =>
                {
                    open = Some((name, shape, p.elements.end))
                }
                (_, Some((name, ..))) => return Err(bad(format!("tensor {name:?} is cut short"))),
                (Some(p), None) => return Err(bad(format!("a piece of {:?} without its start", p.name))),
            }
            if let Some((name, shape, seen)) = &open
                && *seen == shape.iter().product::<usize>()
            {
                tensors.push(TensorSpec { name: name.clone(), shape: shape.clone() });
                open = None;
            }
        }
    }
    if let Some((name, ..)) = open {
        return Err(bad(format!("tensor {name:?} is cut short")));
    }
    Ok((Layout::new(tensors)?, values))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(shapes: &[(&str, &[usize])]) -> Layout {
        Layout::new(
            shapes.iter().map(|(n, s)| TensorSpec { name: n.to_string(), shape: s.to_vec() }).collect(),
        )
        .unwrap()
    }

    fn model() -> Layout {
        layout(&[("embed", &[50, 8]), ("b0", &[3]), ("b1", &[5]), ("w", &[8, 12]), ("head.bias", &[2])])
    }

    #[test]
    fn one_shard_is_the_layout_itself() {
        let l = model();
        let map = ShardMap::new(&l, 1).unwrap();
        assert_eq!((map.count(), map.range(0), map.layout(0)), (1, 0..l.len(), &l));
    }

    #[test]
    fn shards_are_contiguous_balanced_to_one_element_and_cover_the_model() {
        let l = model();
        for n in 1..=16 {
            let map = ShardMap::new(&l, n).unwrap();
            let mut next = 0;
            for i in 0..n {
                let r = map.range(i);
                assert_eq!(r.start, next, "n = {n}");
                assert!(r.len() * n >= l.len() - n && r.len() * n <= l.len() + n, "n = {n}: {r:?}");
                assert_eq!(map.layout(i).len(), r.len());
                next = r.end;
            }
            assert_eq!(next, l.len());
        }
    }

    #[test]
    fn small_tensors_are_packed_whole_and_a_cut_one_is_named_by_its_piece() {
        // 400 + 3 + 5 + 96 + 2 = 506 elements; two shards cut at 253, inside `embed`.
        let map = ShardMap::new(&model(), 2).unwrap();
        let names = |i: usize| map.layout(i).tensors().iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(0), ["embed[0..253 of 50x8]"]);
        assert_eq!(names(1), ["embed[253..400 of 50x8]", "b0", "b1", "w", "head.bias"]);
        assert_eq!(map.layout(1).tensors()[3].shape, [8, 12], "a whole tensor keeps its shape");
    }

    /// The example of docs/protocol.md §7.9: the built-in LeNet-5 (tensors in name order).
    #[test]
    fn lenet5_over_two_shards_is_cut_inside_fc1_weight() {
        let l = layout(&[
            ("conv1.bias", &[6]),
            ("conv1.weight", &[6, 1, 5, 5]),
            ("conv2.bias", &[16]),
            ("conv2.weight", &[16, 6, 5, 5]),
            ("fc1.bias", &[120]),
            ("fc1.weight", &[120, 400]),
            ("fc2.bias", &[84]),
            ("fc2.weight", &[84, 120]),
            ("fc3.bias", &[10]),
            ("fc3.weight", &[10, 84]),
        ]);
        let map = ShardMap::new(&l, 2).unwrap();
        let names = |i: usize| map.layout(i).tensors().iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        assert_eq!((l.len(), map.range(0).len(), map.range(1).len()), (61_706, 30_853, 30_853));
        assert_eq!(names(0)[5], "fc1.weight[0..28161 of 120x400]");
        assert_eq!(names(1)[0], "fc1.weight[28161..48000 of 120x400]");
        assert_eq!(names(1)[1..], ["fc2.bias", "fc2.weight", "fc3.bias", "fc3.weight"]);
    }

    #[test]
    fn the_shards_merge_back_into_the_model_for_every_count() {
        let l = model();
        let values: Vec<f32> = (0..l.len()).map(|i| i as f32).collect();
        for n in 1..=l.len().min(MAX_SHARDS) {
            let map = ShardMap::new(&l, n).unwrap();
            let parts: Vec<_> =
                (0..n).map(|i| (map.layout(i).clone(), values[map.range(i)].to_vec())).collect();
            assert_eq!(merge(&parts).unwrap(), (l.clone(), values.clone()), "n = {n}");
        }
    }

    #[test]
    fn shards_out_of_order_or_missing_do_not_merge() {
        let l = model();
        let map = ShardMap::new(&l, 3).unwrap();
        let part = |i: usize| (map.layout(i).clone(), vec![0.0; map.range(i).len()]);
        for parts in [vec![part(1), part(0), part(2)], vec![part(0), part(2)], vec![part(0), part(1)]] {
            let e = merge(&parts).unwrap_err().to_string();
            assert!(e.contains("do not make one model"), "{e}");
        }
    }

    #[test]
    fn counts_outside_one_to_the_parameter_count_are_refused() {
        let l = layout(&[("w", &[3])]);
        for n in [0, 4, MAX_SHARDS + 1] {
            assert!(ShardMap::new(&l, n).is_err(), "n = {n}");
        }
    }

    #[test]
    fn a_tensor_named_like_a_piece_is_refused_for_more_than_one_shard() {
        let l = layout(&[("x[0..3 of 3]", &[3]), ("w", &[4])]);
        assert!(ShardMap::new(&l, 1).is_ok());
        let e = ShardMap::new(&l, 2).unwrap_err().to_string();
        assert!(e.contains("reads as a piece"), "{e}");
    }

    #[test]
    fn a_name_that_only_looks_like_a_piece_is_a_tensor_of_its_own() {
        // Its shape is not 1-D with the piece's length: not a piece, merged as it is.
        let l = layout(&[("odd[0..2 of 4]", &[3, 1]), ("w", &[4])]);
        let values = vec![1.0; 7];
        assert_eq!(merge(&[(l.clone(), values.clone())]).unwrap(), (l, values));
    }
}
