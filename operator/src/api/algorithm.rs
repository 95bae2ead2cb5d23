//! The parameter server's update rule, and which one a job gets when its spec names none.
//!
//! The default depends on `optimizer.localSteps`: every-step gradients get dc-asgd-a (the
//! delay compensation pays at many workers, docs/convergence.md), pseudo-gradients of local
//! steps get asgd (the compensation costs a model-sized backup per worker and bought nothing
//! measurable on them there; `sync` is the user's choice when the workers are alike). A CRD
//! default cannot depend on a sibling field, so the field stays absent and both the operator
//! (`OptimizerSpec::algorithm`) and the CRD's rules (`cel_in`) resolve it the same way.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The parameter server's update rule: sync (synchronous SGD), asgd, dc-asgd-c (DC-ASGD with a
/// constant λ) or dc-asgd-a (DC-ASGD with the adaptive λ_t).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Algorithm {
    #[serde(rename = "sync")]
    Sync,
    #[serde(rename = "asgd")]
    Asgd,
    #[serde(rename = "dc-asgd-c")]
    DcAsgdC,
    #[serde(rename = "dc-asgd-a")]
    DcAsgdA,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Asgd => "asgd",
            Self::DcAsgdC => "dc-asgd-c",
            Self::DcAsgdA => "dc-asgd-a",
        }
    }

    pub fn is_delay_compensated(self) -> bool {
        matches!(self, Self::DcAsgdC | Self::DcAsgdA)
    }

    /// The rule of a job whose spec names none, by its `optimizer.localSteps`.
    pub fn default_for(local_steps: Option<u32>) -> Self {
        if local_steps.is_some_and(|h| h > 1) { Self::Asgd } else { Self::DcAsgdA }
    }
}

/// A CEL expression for the rule an optimizer object `var` resolves to: the same choice as
/// `Algorithm::default_for` when `algorithm` is absent.
pub fn cel_effective(var: &str) -> String {
    format!(
        "(has({var}.algorithm) ? {var}.algorithm : \
         (has({var}.localSteps) && {var}.localSteps > 1 ? 'asgd' : 'dc-asgd-a'))"
    )
}

/// A CEL condition, on the optimizer object, that its resolved rule is one of `names`.
pub fn cel_in(names: &[&str]) -> String {
    let list = names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ");
    format!("{} in [{list}]", cel_effective("self"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_steps_default_to_asgd_and_every_step_to_dc_asgd_a() {
        assert_eq!(Algorithm::default_for(None), Algorithm::DcAsgdA);
        assert_eq!(Algorithm::default_for(Some(1)), Algorithm::DcAsgdA);
        assert_eq!(Algorithm::default_for(Some(2)), Algorithm::Asgd);
        assert_eq!(Algorithm::default_for(Some(128)), Algorithm::Asgd);
    }
}
