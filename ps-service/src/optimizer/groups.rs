//! Parameter groups: a weight decay and a learning-rate scale per tensor, as a PyTorch
//! optimizer's param groups give them (no weight decay on biases and norms, a smaller rate for
//! embeddings). Pure: which tensor gets which rates, and the element ranges they cover.

use std::ops::Range;

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::HyperError;

/// Most groups a job may have.
pub const MAX_GROUPS: usize = 16;
/// Most name patterns per group, and the longest one.
pub const MAX_PATTERNS: usize = 16;
pub const MAX_PATTERN_LEN: usize = 256;

/// Tensors whose name one of `names` matches, and the rates they are updated with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParameterGroup {
    /// Regular expressions (the `regex` crate's syntax), each searched anywhere in a tensor's
    /// name (as Python's `re.search`): `bias` matches `fc.bias`, `^embed\.` only names that start so. The piece of
    /// a tensor that a sharded PS holds goes by the tensor's own name.
    pub names: Vec<String>,
    /// The group's weight decay, in place of the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f32>,
    /// The group's learning rate is the job's (with its schedule) times this, > 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning_rate_scale: Option<f32>,
}

/// What the update kernel is given for a range of elements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub lr_scale: f32,
    pub weight_decay: f32,
}

impl Rates {
    /// The job's own: no group.
    pub fn plain(weight_decay: f32) -> Self {
        Self { lr_scale: 1.0, weight_decay }
    }
}

/// Every problem with `groups`, as the PS's validation reports it.
pub fn validate(groups: &[ParameterGroup]) -> Result<(), HyperError> {
    let fail = |m: String| Err(HyperError(m));
    if groups.len() > MAX_GROUPS {
        return fail(format!("at most {MAX_GROUPS} parameter groups, got {}", groups.len()));
    }
    for (i, g) in groups.iter().enumerate() {
        if g.names.is_empty() || g.names.len() > MAX_PATTERNS {
            return fail(format!("parameter group {i} needs 1 to {MAX_PATTERNS} name patterns"));
        }
        for p in &g.names {
            if p.is_empty() || p.len() > MAX_PATTERN_LEN {
                return fail(format!(
                    "parameter group {i}: a name pattern is 1 to {MAX_PATTERN_LEN} characters"
                ));
            }
            if let Err(e) = Regex::new(p) {
                return fail(format!("parameter group {i}: {p:?} is not a regular expression: {e}"));
            }
        }
        if g.weight_decay.is_some_and(|wd| !(wd.is_finite() && wd >= 0.0)) {
            return fail(format!("parameter group {i}: weight decay must be ≥ 0"));
        }
        if g.learning_rate_scale.is_some_and(|s| !(s.is_finite() && s > 0.0)) {
            return fail(format!("parameter group {i}: learning-rate scale must be > 0"));
        }
    }
    Ok(())
}

/// The rates of a model's elements: ranges in layout order, each with its rates.
#[derive(Clone, Debug, PartialEq)]
pub struct Segments {
    ranges: Vec<(Range<usize>, Rates)>,
    /// Parameters each group took, in group order.
    matched: Vec<usize>,
}

impl Segments {
    /// The rates of `tensors` (each tensor's name and element range, in layout order): the
    /// first group that matches a tensor's name gives its rates, the job's `weight_decay` and
    /// scale 1 the rest. `groups` must have passed [`validate`].
    pub fn resolve<'a>(
        groups: &[ParameterGroup],
        weight_decay: f32,
        tensors: impl Iterator<Item = (&'a str, Range<usize>)>,
    ) -> Self {
        let patterns: Vec<Vec<Regex>> = groups
            .iter()
            .map(|g| g.names.iter().map(|p| Regex::new(p).expect("validated")).collect())
            .collect();
        let mut matched = vec![0; groups.len()];
        let mut ranges: Vec<(Range<usize>, Rates)> = Vec::new();
        for (name, r) in tensors {
            let group = patterns.iter().position(|ps| ps.iter().any(|p| p.is_match(name)));
            let rates = group.map_or(Rates::plain(weight_decay), |i| {
                matched[i] += r.len();
                let g = &groups[i];
                Rates {
                    lr_scale: g.learning_rate_scale.unwrap_or(1.0),
                    weight_decay: g.weight_decay.unwrap_or(weight_decay),
                }
            });
            match ranges.last_mut() {
                Some((last, same)) if *same == rates && last.end == r.start => last.end = r.end,
                _ => ranges.push((r, rates)),
            }
        }
        Self { ranges, matched }
    }

    /// The parts of `range` and their rates, as ranges relative to `range.start`.
    pub fn within(&self, range: Range<usize>) -> impl Iterator<Item = (Range<usize>, Rates)> + '_ {
        let first = self.ranges.partition_point(|(r, _)| r.end <= range.start);
        self.ranges[first..].iter().take_while(move |(r, _)| r.start < range.end).map(move |(r, rates)| {
            let (lo, hi) = (r.start.max(range.start), r.end.min(range.end));
            (lo - range.start..hi - range.start, *rates)
        })
    }

    /// Parameters each group took, in group order.
    pub fn matched(&self) -> &[usize] {
        &self.matched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(names: &[&str], wd: Option<f32>, scale: Option<f32>) -> ParameterGroup {
        ParameterGroup {
            names: names.iter().map(|s| s.to_string()).collect(),
            weight_decay: wd,
            learning_rate_scale: scale,
        }
    }

    #[test]
    fn the_first_matching_group_gives_a_tensor_its_rates_and_neighbours_merge() {
        let groups = [group(&["bias$", "norm"], Some(0.0), None), group(&["^embed"], None, Some(0.1))];
        let tensors = [
            ("embed.weight", 0..10),
            ("fc.weight", 10..30),
            ("fc.bias", 30..32),
            ("norm.weight", 32..34),
            ("out.weight", 34..40),
        ];
        let s = Segments::resolve(&groups, 0.01, tensors.iter().map(|(n, r)| (*n, r.clone())));
        let (plain, no_decay) = (Rates::plain(0.01), Rates { lr_scale: 1.0, weight_decay: 0.0 });
        let embed = Rates { lr_scale: 0.1, weight_decay: 0.01 };
        assert_eq!(
            s.ranges,
            [(0..10, embed), (10..30, plain), (30..34, no_decay), (34..40, plain)],
            "fc.bias and norm.weight are one range"
        );
        assert_eq!(s.matched(), [4, 10]);
        // A range cut by an update's chunk: positions relative to the chunk.
        let parts: Vec<_> = s.within(25..36).collect();
        assert_eq!(parts, [(0..5, plain), (5..9, no_decay), (9..11, plain)]);
        assert_eq!(s.within(0..5).collect::<Vec<_>>(), [(0..5, embed)]);
    }

    #[test]
    fn without_groups_one_range_has_the_jobs_rates() {
        let s = Segments::resolve(&[], 0.5, [("a", 0..3), ("b", 3..8)].into_iter());
        assert_eq!(s.within(2..8).collect::<Vec<_>>(), [(0..6, Rates::plain(0.5))]);
    }

    #[test]
    fn validation_names_the_group_and_the_problem() {
        validate(&[group(&["bias"], Some(0.0), Some(2.0))]).unwrap();
        let bad = |g: ParameterGroup| validate(&[group(&["x"], None, None), g]).unwrap_err().0;
        assert!(
            bad(group(&["(unclosed"], None, None))
                .contains("parameter group 1: \"(unclosed\" is not a regular expression")
        );
        assert!(bad(group(&[], None, None)).contains("parameter group 1 needs 1 to 16 name patterns"));
        assert!(bad(group(&["x"], Some(-1.0), None)).contains("weight decay must be ≥ 0"));
        assert!(bad(group(&["x"], None, Some(0.0))).contains("learning-rate scale must be > 0"));
        assert!(bad(group(&["x"], None, Some(f32::NAN))).contains("learning-rate scale"));
        let many = vec![group(&["x"], None, None); MAX_GROUPS + 1];
        assert!(validate(&many).unwrap_err().0.contains("at most 16"));
    }
}
