//! Foresight's parameter server: delay-compensated asynchronous SGD over HTTP/2.
//!
//! - [`optimizer`]: the update rules, pure maths over slices.
//! - [`pace`]: the local steps each worker is advised to train, from the pace it reports.
//! - [`store`]: the versioned, sharded model, per-worker backups, `sync` rounds, checkpoints.
//! - [`wire`]: safetensors bodies and their validation, shared with clients.
//! - [`server`]: the axum HTTP/2 service, auth, limits and metrics.
//! - [`listen`]: a listening socket bound here or inherited from `foresight run`.
//! - [`journal`]: the update journal on disk, its replay and queries.
//! - [`dir_lock`]: one PS process owns a checkpoint directory at a time.
//! - [`client`]: the async client workers use (and shard 0 of a sharded PS, to finalize the
//!   others).

pub mod client;
pub mod cores;
pub mod dir_lock;
pub mod journal;
pub mod listen;
pub mod optimizer;
pub mod pace;
pub mod pool;
pub mod server;
pub mod store;
pub mod wire;

#[cfg(test)]
mod layers;
