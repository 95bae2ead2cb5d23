//! Serving: h2c with prior knowledge and HTTP/1.1 on one port (TLS optional), with flow-control
//! windows sized for gradients of hundreds of MB, and graceful shutdown.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// HTTP/2's default 64 KiB stream window makes a 100 MB upload crawl (REFERENCE.md).
const STREAM_WINDOW: u32 = 64 << 20;
const CONNECTION_WINDOW: u32 = 128 << 20;
/// h2's maximum; 1 << 24 panics inside h2.
const MAX_FRAME: u32 = 16_777_215;

#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct Listener {
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
}

impl Listener {
    pub async fn bind(addr: &str, tls: Option<&TlsFiles>) -> anyhow::Result<Self> {
        let tcp =
            TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        let tls = tls.map(acceptor).transpose()?;
        Ok(Self { tcp, tls })
    }

    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.tcp.local_addr()
    }
}

fn acceptor(files: &TlsFiles) -> anyhow::Result<TlsAcceptor> {
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("TLS certificate {}: {e}", files.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| anyhow::anyhow!("TLS key {}: {e}", files.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| anyhow::anyhow!("TLS certificate and key do not fit together: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `app` until `shutdown` resolves, then lets open requests finish (up to 30 s).
pub async fn serve(listener: Listener, app: Router, shutdown: impl Future<Output = ()>) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .max_concurrent_streams(1024);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.tcp.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        match &listener.tls {
            None => {
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            Some(tls) => {
                let tls = tls.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let stream = match tls.accept(stream).await {
                        Ok(s) => s,
                        Err(e) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    };
                    let conn =
                        builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
        }
    }
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown()).await.is_err() {
        tracing::warn!("open connections did not finish within 30 s");
    }
}
