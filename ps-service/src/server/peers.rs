//! Shard 0 of a sharded PS is a client of its peer shards: it tells them a new worker count
//! before it takes it itself, and finalizes them and collects their slices for the final model.
//! The one server file that uses `crate::client` (the client never uses the server: the
//! protocol's names are in `wire::protocol`).

use std::time::Duration;

use super::{ApiError, PsConfig, internal};
use crate::client::{ClientError, Model, PsClient};

pub use crate::client::ClientTls;

fn client(
    config: &PsConfig,
    url: &str,
    failed: impl Fn(ClientError) -> ApiError,
) -> Result<PsClient, ApiError> {
    PsClient::with_tls(url, config.peer_token(), config.peer_tls.as_ref()).map_err(failed)
}

/// `PUT /v1/workers` on every other shard: a count one refuses is refused here too, before this
/// shard changed anything (telling a shard again is harmless, so the caller may retry).
pub(super) async fn scale(config: &PsConfig, n: usize) -> Result<(), ApiError> {
    for url in &config.peers {
        let failed = |e: ClientError| internal(format!("scaling shard {url}: {e}"));
        client(config, url, failed)?.set_workers(n).await.map_err(failed)?;
    }
    Ok(())
}

/// The other shards, finalized, and their read-only slices (in shard order).
pub(super) async fn finalize(config: &PsConfig) -> Result<Vec<Model>, ApiError> {
    let mut slices = Vec::with_capacity(config.peers.len());
    for url in &config.peers {
        let failed = |e: ClientError| internal(format!("finalizing shard {url}: {e}"));
        let peer = client(config, url, failed)?;
        peer.finalize().await.map_err(failed)?;
        // As worker 0: once finalized, the backup that records is never used.
        let slice = peer.pull(0, None, Duration::ZERO).await.map_err(failed)?;
        slices.push(slice.ok_or_else(|| internal(format!("shard {url} sent no model")))?);
    }
    Ok(slices)
}
