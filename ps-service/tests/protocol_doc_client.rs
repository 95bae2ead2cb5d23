//! docs/protocol.md is complete enough to write a client from: `protocol_client.py`, written
//! from the document alone with Python's standard library (HTTP/1.1), drives the real binary
//! through registration, F32/BF16/F16 pushes, replays, every refusal, long-polls, reports,
//! status, metrics and finalize.

mod support;

use std::process::Command;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_written_from_the_protocol_doc_works() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ps = PsProcess::spawn(
        port,
        &["--workers", "2", "--algorithm", "dc-asgd-a", "--checkpoint-dir", dir.path().to_str().unwrap()],
    );
    ps.wait_ready().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/protocol_client.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args(["-B", script, &ps.url, TOKEN])
            .output()
            .expect("python3 (make setup installs it)")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "protocol_client.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert!(stdout.lines().filter(|l| l.starts_with("ok")).count() > 50, "{stdout}");
}
