//! Desired: the objects a job should own, built from its spec, its admission and the operator's
//! key alone (no I/O): the children (PS Deployments and Services, claims, the worker Job, the
//! guards), the token and TLS Secrets, and the mark that says a child is this job's.

pub mod children;
pub mod ownership;
pub mod ps_tls;
pub mod token;
