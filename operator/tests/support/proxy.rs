//! A TCP proxy in front of the API server that can be frozen: while frozen it moves no bytes
//! and closes nothing, so every call through it hangs, as over a stuck connection or a
//! partitioned network. TLS passes through untouched.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub struct FreezableProxy {
    pub port: u16,
    frozen: Arc<AtomicBool>,
}

impl FreezableProxy {
    pub fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = Arc::new(AtomicBool::new(false));
        let f = frozen.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else { continue };
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (from, to, f) = (from.try_clone().unwrap(), to.try_clone().unwrap(), f.clone());
                    std::thread::spawn(move || pump(from, to, &f));
                }
            }
        });
        Self { port, frozen }
    }

    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// A copy of `kubeconfig` whose server is this proxy.
    pub fn kubeconfig(&self, kubeconfig: &Path, dir: &Path) -> PathBuf {
        let text = std::fs::read_to_string(kubeconfig).unwrap();
        let (at, end) = port_span(&text);
        let path = dir.join("via-proxy.kubeconfig");
        std::fs::write(&path, format!("{}{}{}", &text[..at], self.port, &text[end..])).unwrap();
        path
    }
}

/// The API server's port in `kubeconfig`.
pub fn server_port(kubeconfig: &Path) -> u16 {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let (at, end) = port_span(&text);
    text[at..end].parse().unwrap()
}

/// Where the server's port is in a kubeconfig's text.
fn port_span(text: &str) -> (usize, usize) {
    const SERVER: &str = "server: https://127.0.0.1:";
    let at = text.find(SERVER).expect("a loopback server") + SERVER.len();
    (at, at + text[at..].find(|c: char| !c.is_ascii_digit()).unwrap())
}

fn pump(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if frozen.load(Ordering::SeqCst) {
            // Hold both sockets open, move nothing.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}
