//! An f32 pull answered while its snapshot is still being copied: the body sends the copied
//! prefix as it grows, so that the copy (tens of milliseconds at 10⁸ parameters) overlaps the
//! transfer instead of preceding it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use bytes::Bytes;
use tokio::sync::{Notify, oneshot};

use super::{ApiError, AppState};
use crate::store::{Snapshot, Store};

/// The snapshot `worker` pulls (or, for none, the current one without a backup), and a body
/// that streams it. The copy runs on a blocking thread that outlives this call; when another
/// pull is already copying the same version, this one waits for it and sends it whole.
pub async fn answer(
    state: &Arc<AppState>,
    store: Arc<Store>,
    worker: Option<usize>,
) -> Result<(Arc<Snapshot>, Body), ApiError> {
    let copied = Arc::new(Notify::new());
    let (tx, rx) = oneshot::channel();
    let (metrics, notify) = (state.clone(), copied.clone());
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        match store.pull_copying(worker) {
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
            Ok((snap, Some(copy))) => {
                let _ = tx.send(Ok(snap));
                copy.run(&|| notify.notify_waiters());
            }
            Ok((snap, None)) => {
                snap.params();
                let _ = tx.send(Ok(snap));
            }
        }
        metrics.metrics.pull_seconds.observe(started.elapsed().as_secs_f64());
    });
    let snap = rx.await.expect("the pull task answers")?;
    Ok((snap.clone(), body(snap, copied)))
}

/// The snapshot's bytes, each piece as soon as it is copied (`copied` is notified after each).
fn body(snap: Arc<Snapshot>, copied: Arc<Notify>) -> Body {
    let pieces = futures_util::stream::unfold(0, move |sent| {
        let (snap, copied) = (snap.clone(), copied.clone());
        async move {
            if sent == snap.len_bytes() {
                return None;
            }
            loop {
                // Registered before the check, so that a piece published in between wakes it.
                let notified = copied.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let ready = snap.ready_len();
                if ready > sent {
                    let piece = Bytes::from_owner(Piece { snap, range: sent..ready });
                    return Some((Ok::<_, Infallible>(piece), ready));
                }
                notified.await;
            }
        }
    });
    Body::from_stream(pieces)
}

/// Lets a piece of the body borrow the shared snapshot instead of copying it.
struct Piece {
    snap: Arc<Snapshot>,
    range: std::ops::Range<usize>,
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        self.snap.ready_bytes(self.range.clone()).expect("a piece is cut from what is copied")
    }
}
