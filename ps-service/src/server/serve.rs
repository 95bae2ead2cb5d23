//! Serving: h2c with prior knowledge and HTTP/1.1 on one port (TLS optional), with flow-control
//! windows sized for gradients of hundreds of MB, time bounds on every phase of a connection (a
//! peer that stops talking is let go), a cap on open connections, and graceful shutdown.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

/// HTTP/2's default 64 KiB stream window makes a 100 MB upload crawl (REFERENCE.md).
pub(super) const STREAM_WINDOW: u32 = 64 << 20;
const CONNECTION_WINDOW: u32 = 128 << 20;
/// h2's maximum; 1 << 24 panics inside h2.
const MAX_FRAME: u32 = 16_777_215;

#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Time bounds and caps on connections (request bodies are bounded by the handlers' guard).
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// HTTP/1.1: the request head must arrive within this (slowloris).
    pub header_read_timeout: Duration,
    /// HTTP/2: a PING every this long on an idle connection...
    pub keep_alive_interval: Duration,
    /// ...that must be answered within this, or the connection is closed (a dead or paused peer).
    pub keep_alive_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    /// Connections open at once; the next ones wait in the listen backlog.
    pub max_connections: usize,
    /// Concurrent HTTP/2 streams per connection (a worker uses a few).
    pub max_concurrent_streams: u32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(30),
            keep_alive_interval: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(20),
            tls_handshake_timeout: Duration::from_secs(10),
            max_connections: 4096,
            max_concurrent_streams: 256,
        }
    }
}

pub struct Listener {
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: ConnectionLimits,
}

impl Listener {
    /// Listens on `addr`: binds it, or takes the socket inherited on descriptor `inherited`.
    pub async fn bind(
        addr: &str,
        inherited: Option<std::os::fd::RawFd>,
        tls: Option<&TlsFiles>,
    ) -> anyhow::Result<Self> {
        let tcp = crate::listen::tcp_listener(addr, inherited).await?;
        let tls = tls.map(acceptor).transpose()?;
        Ok(Self { tcp, tls, limits: ConnectionLimits::default() })
    }

    pub fn with_limits(self, limits: ConnectionLimits) -> Self {
        Self { limits, ..self }
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
    let limits = listener.limits;
    let builder = Arc::new(builder(&limits));
    // For a TLS connection whose handshake chose h2: whatever is not the HTTP/2 preface is then
    // a protocol error, not an HTTP/1.1 request to answer (h2spec's http2/3.5/2).
    let h2_builder = Arc::new(builder.as_ref().clone().http2_only());
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer, permit) = tokio::select! {
            accepted = accept(&listener.tcp, &open) => match accepted {
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
        let (builder, h2_builder) = (builder.clone(), h2_builder.clone());
        let tls = listener.tls.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let ended = match tls {
                None => {
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                    watcher.watch(conn.into_owned()).await
                }
                Some(tls) => {
                    let stream =
                        match tokio::time::timeout(limits.tls_handshake_timeout, tls.accept(stream)).await {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                            Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                        };
                    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                        let conn = h2_builder.serve_connection(TokioIo::new(stream), service);
                        watcher.watch(conn.into_owned()).await
                    } else {
                        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                        watcher.watch(conn.into_owned()).await
                    }
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown()).await.is_err() {
        tracing::warn!("open connections did not finish within 30 s");
    }
}

/// The next connection, once fewer than the cap are open: until then new peers wait in the
/// kernel's backlog instead of costing the PS a task and buffers each.
async fn accept(
    tcp: &TcpListener,
    open: &Arc<Semaphore>,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr, OwnedSemaphorePermit)> {
    let permit = open.clone().acquire_owned().await.expect("the semaphore is never closed");
    let (stream, peer) = tcp.accept().await?;
    Ok((stream, peer, permit))
}

fn builder(limits: &ConnectionLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.keep_alive_interval)
        .keep_alive_timeout(limits.keep_alive_timeout)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .max_concurrent_streams(limits.max_concurrent_streams);
    builder
}
