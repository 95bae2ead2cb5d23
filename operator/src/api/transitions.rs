//! The CRD's transition rules (CEL with `oldSelf`), written out from field paths. Plain `has()`
//! chains, not optional chaining (`oldSelf.?a.?b`): the API server's cost estimate takes an
//! optional's size to be unbounded and refuses such a rule whatever the field's bounds.

/// Fields of the workers' pod template, below the spec: they change only while the job is
/// suspended (`api::validate_update` checks the same lists). Two lists, two rules: the API
/// server caps each rule's estimated cost, and one rule comparing all of them exceeds it.
pub const WORKER_TEMPLATE_FIELDS: [&str; 13] = [
    "workers.image",
    "workers.command",
    "workers.args",
    "workers.gpus",
    "workers.gpuResource",
    "workers.resources",
    "workers.nodeSelector",
    "workers.tolerations",
    "training.epochs",
    "optimizer.pullEvery",
    "optimizer.pushEvery",
    "optimizer.localSteps",
    "optimizer.innerOptimizer",
];

/// The parts of `workers.pod` the rules compare. Its volumes, mounts, affinity, `envFrom` and
/// topology spread are too large a schema for any rule's cost cap, and its runtime class,
/// scheduler, security context and `/tmp` limit are left out to keep the cost under it: a
/// change of those while workers run is held back by the operator instead
/// (`children::worker_job_update`, a Warning event).
pub const WORKER_POD_FIELDS: [&str; 9] = [
    "workers.pod.labels",
    "workers.pod.annotations",
    "workers.pod.nodeSelector",
    "workers.pod.tolerations",
    "workers.pod.priorityClassName",
    "workers.pod.serviceAccountName",
    "workers.pod.automountServiceAccountToken",
    "workers.pod.imagePullSecrets",
    "workers.pod.env",
];

/// CEL, evaluated on the spec: every field at `paths` is as it was, counting absence.
pub fn unchanged(paths: &[&str]) -> String {
    paths.iter().map(|p| unchanged_one(p)).collect::<Vec<_>>().join(" && ")
}

fn unchanged_one(path: &str) -> String {
    let parts: Vec<&str> = path.split('.').collect();
    let present = |root: &str| {
        (1..=parts.len())
            .map(|n| format!("has({root}.{})", parts[..n].join(".")))
            .collect::<Vec<_>>()
            .join(" && ")
    };
    let (old, new) = (present("oldSelf"), present("self"));
    format!("(({old}) ? (({new}) && oldSelf.{path} == self.{path}) : !({new}))")
}

/// CEL, evaluated on the spec: the `fields` are unchanged unless the update leaves the job
/// suspended.
pub fn unless_suspended(fields: &[&str]) -> String {
    format!(
        "(has(self.runPolicy) && has(self.runPolicy.suspend) && self.runPolicy.suspend) || ({})",
        unchanged(fields)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_compared_only_where_it_is_present_on_both_sides() {
        assert_eq!(
            unchanged(&["a.b"]),
            "((has(oldSelf.a) && has(oldSelf.a.b)) ? ((has(self.a) && has(self.a.b)) && oldSelf.a.b == self.a.b) \
             : !(has(self.a) && has(self.a.b)))"
        );
        assert_eq!(unchanged(&["x", "y"]).matches(" && ((has").count(), 1);
    }
}
