//! Observe: what is there, as plain values for `decide`: the watches' caches, the pods by job,
//! what the pods and the worker Job say, and the parameter server's own `/v1/status`.

pub mod caches;
pub mod children;
pub mod pod_index;
pub mod pods;
pub mod ps;
pub mod ps_clients;

use kube::{Resource, ResourceExt};

use crate::controller::desired::ownership::{Holder, Mark, holder};
use crate::controller::error::{Error, Result};

/// The UID of `obj` when it is the job's (as `mark` tells), else the conflict to report.
pub fn ours<K: Resource<DynamicType = ()>>(obj: &K, mark: Mark<'_>) -> Result<String> {
    match holder(obj.meta(), mark) {
        Holder::ThisJob { uid } => Ok(uid),
        Holder::Other(holder) => {
            Err(Error::NotOurs { kind: K::kind(&()).into_owned(), name: obj.name_any(), holder })
        }
    }
}
