//! Where a server listens: an address it binds itself (in a pod), or a listening socket it
//! inherits from the process that started it. `foresight run` binds every server's port once
//! and hands the socket to the server and to each restart of it: a port chosen, released and
//! then bound by the server could be taken by another process in between (CI saw a PS shard
//! fail with "Address already in use"), and while a server is down its port stays its own —
//! clients' connections wait in the backlog for the restart instead of being refused.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, RawFd};

use socket2::{Socket, Type};

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("the inherited listening socket (descriptor {fd}) for {addr}: {why}")]
    Inherited { fd: RawFd, addr: String, why: String },
}

/// A TCP listener for `addr`: bound here, or with `inherited` the socket on that descriptor,
/// which must be a listening TCP socket bound to `addr` (an IP and a port).
pub async fn tcp_listener(
    addr: &str,
    inherited: Option<RawFd>,
) -> Result<tokio::net::TcpListener, ListenError> {
    let Some(fd) = inherited else {
        return tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ListenError::Bind { addr: addr.to_string(), source });
    };
    let fail = |why: String| ListenError::Inherited { fd, addr: addr.to_string(), why };
    let std = adopt(fd, addr).map_err(fail)?;
    std.set_nonblocking(true).map_err(|e| fail(e.to_string()))?;
    tokio::net::TcpListener::from_std(std).map_err(|e| fail(e.to_string()))
}

/// Takes descriptor `fd` as this process's listener once it is checked to be one for `addr`.
fn adopt(fd: RawFd, addr: &str) -> Result<std::net::TcpListener, String> {
    // 0–2 are stdin, stdout and stderr: taking one would close it with the listener.
    if fd < 3 {
        return Err("descriptors 0, 1 and 2 are the standard streams, not a listener".into());
    }
    let want: SocketAddr = addr
        .parse()
        .map_err(|_| "an inherited socket needs the address as IP:port, which it is checked against")?;
    // SAFETY: the descriptor was handed to this process to own, and nothing else here uses it;
    // if it is not a socket the checks below fail and dropping it closes only that descriptor.
    let socket = unsafe { Socket::from_raw_fd(fd) };
    let io = |e: std::io::Error| e.to_string();
    if socket.r#type().map_err(io)? != Type::STREAM {
        return Err("not a stream (TCP) socket".into());
    }
    if !socket.is_listener().map_err(io)? {
        return Err("the socket does not listen".into());
    }
    let bound = socket.local_addr().map_err(io)?.as_socket().ok_or("not an IP socket")?;
    if bound != want {
        return Err(format!("it is bound to {bound}"));
    }
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use std::os::fd::IntoRawFd;

    use super::*;

    fn listening() -> (RawFd, String) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        (l.into_raw_fd(), addr)
    }

    #[tokio::test]
    async fn an_inherited_listener_accepts_on_its_address() {
        let (fd, addr) = listening();
        let listener = tcp_listener(&addr, Some(fd)).await.unwrap();
        assert_eq!(listener.local_addr().unwrap().to_string(), addr);
        let client = tokio::net::TcpStream::connect(&addr);
        let (accepted, connected) = tokio::join!(listener.accept(), client);
        assert_eq!(accepted.unwrap().1, connected.unwrap().local_addr().unwrap());
    }

    #[tokio::test]
    async fn what_is_not_a_listener_for_the_address_is_refused() {
        let (fd, addr) = listening();
        let other = "127.0.0.1:1";
        let err = tcp_listener(other, Some(fd)).await.unwrap_err().to_string();
        assert!(err.contains(&format!("bound to {addr}")), "{err}");

        let (fd, _) = listening();
        let err = tcp_listener("localhost:80", Some(fd)).await.unwrap_err().to_string();
        assert!(err.contains("IP:port"), "{err}");
        // SAFETY: refused before it was taken, the descriptor is still the test's own.
        drop(unsafe { std::net::TcpListener::from_raw_fd(fd) });

        // A bound socket that does not listen, a UDP socket, a file, a closed descriptor.
        let s = Socket::new(socket2::Domain::IPV4, Type::STREAM, None).unwrap();
        s.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
        let addr = s.local_addr().unwrap().as_socket().unwrap().to_string();
        let err = tcp_listener(&addr, Some(s.into_raw_fd())).await.unwrap_err().to_string();
        assert!(err.contains("does not listen"), "{err}");
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = udp.local_addr().unwrap().to_string();
        let err = tcp_listener(&addr, Some(udp.into_raw_fd())).await.unwrap_err().to_string();
        assert!(err.contains("not a stream"), "{err}");
        let file = tempfile::tempfile().unwrap().into_raw_fd();
        let err = tcp_listener("127.0.0.1:8080", Some(file)).await.unwrap_err().to_string();
        assert!(err.contains("Socket operation on non-socket"), "{err}");
        let err = tcp_listener("127.0.0.1:8080", Some(1)).await.unwrap_err().to_string();
        assert!(err.contains("standard streams"), "{err}");
    }
}
