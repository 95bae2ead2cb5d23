//! The TrainingJob controller (`foresight operator`). For each job a reconcile observes what
//! runs, decides the job's state, and writes the children, the status and the Events; it
//! finalizes the model when the workers are done and removes the parameter server once the job
//! has ended.
//!
//! The rooms, in the order a reconcile runs, and the one way their imports point (each may use
//! only the rooms listed before it; `layers` checks it):
//!
//! | room | what it holds |
//! |---|---|
//! | `names`, `error`, `watch`, `telemetry` | leaves: the job's names and labels, errors, which namespaces, the operator's metrics |
//! | `leadership/` | which operator reconciles which namespace: the Lease, the survey of other releases, claims (uses only the leaves) |
//! | `kueue/` (`mod.rs`) | Kueue's Workload as far as the operator reads it, and the pure admission plan |
//! | `decide/` | pure: the job's state machine (`status`) and pod trouble |
//! | `desired/` | pure: the objects a job should own, its token and TLS Secrets, the mark on them |
//! | `context` | what every reconcile shares: the settings and the handles on the cluster |
//! | `observe/` | reads: the watches' caches, the pods, the worker Job, the PS's `/v1/status` |
//! | `write/` | every write: the children, the job's status, Events and TTL, the PS's control calls |
//! | `kueue/admission.rs`, `kueue/flavors.rs` | Kueue's API calls (the Workload made, replaced, finished), beside `write` |
//! | `reconcile/` | one job, once: the spine that runs observe, decide and write |
//! | `run` | the process: metrics, leadership, one controller per scope, shutdown |

pub mod context;
pub mod decide;
pub mod desired;
pub mod error;
pub mod kueue;
pub mod leadership;
pub mod names;
pub mod observe;
pub mod reconcile;
pub mod run;
pub mod telemetry;
pub mod watch;
pub mod write;

#[cfg(test)]
mod layers;

pub use context::Settings;
pub use desired::children::ChildDefaults;
pub use desired::token;
pub use leadership::{LeaseConfig, claims};
pub use run::run;
pub use watch::Watch;
