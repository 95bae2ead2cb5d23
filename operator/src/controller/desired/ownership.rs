//! Whether an object that has a child's name is the job's own. A TrainingJob's author is an
//! untrusted tenant and the children's names are derived from the job's: without this check, a
//! job named `github` had the operator overwrite and adopt a Secret `github-token`, and a job
//! named `victim` had it delete a Service `victim-ps` it never made. The operator writes or
//! deletes an object only when it is controlled by this job's UID. Pure: no I/O.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::controller::names::{LABEL_JOB, labels};

/// How a child shows that it is the job's.
#[derive(Clone, Copy, Debug)]
pub enum Mark<'a> {
    /// Its controller owner reference names this UID (every child the job's deletion removes).
    Controller { uid: &'a str },
    /// It carries the operator's labels for this job name: the output claim, which outlives its
    /// job on purpose (no owner reference) and is taken up again by a job of the same name.
    Labels { job: &'a str },
}

/// What an existing object with a child's name is.
#[derive(Clone, Debug, PartialEq)]
pub enum Holder {
    /// The job's own: the operator may write it, and delete it while its UID is this one.
    ThisJob { uid: String },
    /// Someone else's, described for the job's status.
    Other(String),
}

/// Who holds the object `meta`, as `mark` tells.
pub fn holder(meta: &ObjectMeta, mark: Mark<'_>) -> Holder {
    let ours = match mark {
        Mark::Controller { uid } => controller(meta).is_some_and(|(_, _, u)| u == uid),
        Mark::Labels { job } => {
            let want = labels(job, "");
            let has = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k)) == want.get(k);
            has("app.kubernetes.io/managed-by") && has(LABEL_JOB)
        }
    };
    if ours {
        return Holder::ThisJob { uid: meta.uid.clone().unwrap_or_default() };
    }
    Holder::Other(match controller(meta) {
        Some((kind, name, uid)) => format!("controlled by {kind} {name} (UID {uid})"),
        None => "not made by this job".into(),
    })
}

/// The controller owner reference: kind, name, UID.
fn controller(meta: &ObjectMeta) -> Option<(&str, &str, &str)> {
    let r = meta.owner_references.as_ref()?.iter().find(|r| r.controller == Some(true))?;
    Some((r.kind.as_str(), r.name.as_str(), r.uid.as_str()))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn meta(owner: Option<(&str, bool)>, labelled_for: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            uid: Some("object-uid".into()),
            labels: labelled_for.map(|job| labels(job, "parameter-server")),
            owner_references: owner.map(|(uid, controller)| {
                vec![OwnerReference {
                    api_version: "foresight.dev/v1alpha1".into(),
                    kind: "TrainingJob".into(),
                    name: "x".into(),
                    uid: uid.into(),
                    controller: Some(controller),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_controller_reference_to_this_uid_makes_a_child_the_jobs() {
        let this = Mark::Controller { uid: "job-uid" };
        let ours = Holder::ThisJob { uid: "object-uid".into() };
        assert_eq!(holder(&meta(Some(("job-uid", true)), Some("x")), this), ours);
        // The labels alone can be written by anyone who can create the object.
        assert_eq!(holder(&meta(None, Some("x")), this), Holder::Other("not made by this job".into()));
        // A plain (non-controller) reference, or a job of the same name deleted and made again.
        assert!(matches!(holder(&meta(Some(("job-uid", false)), None), this), Holder::Other(_)));
        assert_eq!(
            holder(&meta(Some(("old-uid", true)), None), this),
            Holder::Other("controlled by TrainingJob x (UID old-uid)".into())
        );
    }

    #[test]
    fn an_output_claim_is_the_jobs_when_it_carries_the_operators_labels_for_its_name() {
        let this = Mark::Labels { job: "x" };
        assert!(matches!(holder(&meta(None, Some("x")), this), Holder::ThisJob { .. }));
        assert!(matches!(holder(&meta(None, Some("y")), this), Holder::Other(_)));
        assert!(matches!(holder(&meta(None, None), this), Holder::Other(_)));
    }
}
