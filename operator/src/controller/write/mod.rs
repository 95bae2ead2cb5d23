//! Write: every API write and parameter-server control call, each on an object the job owns:
//! the children applied (skipping writes that would change nothing), the job's status, Events
//! and TTL, the PS told its worker count or finalized.

pub mod applied;
pub mod children;
pub mod job;
pub mod ps;
pub mod writes;
