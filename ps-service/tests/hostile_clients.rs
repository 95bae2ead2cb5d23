//! Clients that misbehave, over real sockets: a refusal sent before the body is read, uploads
//! and request heads that stall, peers that never answer a PING or finish a TLS handshake, more
//! connections than the cap. Each case asserts what the PS did, on the wire, and that the model
//! did not change.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use foresight_ps::client::{ClientError, GradDtype, PsClient, PushId};
use foresight_ps::optimizer::Algorithm;
use foresight_ps::server::ConnectionLimits;
use foresight_ps::wire::{Layout, TensorSpec};
use support::*;

/// A model whose F32 gradient body is about `bytes` long.
fn layout_of(bytes: usize) -> Layout {
    Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![bytes.div_ceil(4)] }]).unwrap()
}

/// Pushes `len` bytes without a token with curl; its exit code and the HTTP status it printed.
fn curl_push(url: &str, body: &std::path::Path) -> (i32, String) {
    let out = Command::new("curl")
        .args(["-s", "--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .arg("--data-binary")
        .arg(format!("@{}", body.display()))
        .arg(format!("{url}/v1/gradients?worker=0&version=0&seq=1"))
        .output()
        .expect("curl (make setup installs it)");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// RFC 9113 §8.1 lets a server answer before the body is read and then reset the stream with
/// NO_ERROR; curl 7.88 reports that as "HTTP/2 stream error" (exit 92) instead of the answer,
/// 10 times out of 10 for a 5 MB body before the PS drained refused bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_sent_before_the_body_is_read_reaches_curl_and_our_client() {
    let ps = start(config(Algorithm::DcAsgdA, 1)).await;
    let dir = tempfile::tempdir().unwrap();
    for size in [1_000, 300_000, 5_000_000] {
        let body = dir.path().join(format!("body-{size}"));
        std::fs::write(&body, vec![0u8; size]).unwrap();
        for attempt in 0..10 {
            let (code, status) = curl_push(&ps.url, &body);
            assert_eq!((code, status.as_str()), (0, "401"), "curl, {size} bytes, attempt {attempt}");
        }
        let l = layout_of(size);
        let anonymous = PsClient::new(&ps.url, None).unwrap();
        for attempt in 0..10 {
            let got = anonymous
                .push(PushId::unjoined(0, 0, 1), None, &l, &vec![0.0; l.len()], GradDtype::F32)
                .await;
            assert!(
                matches!(&got, Err(ClientError::Refused { reason, .. }) if reason == "unauthorized"),
                "our client, {size} bytes, attempt {attempt}: {got:?}"
            );
        }
    }
    assert!(ps.state.store().is_none(), "nothing was registered");
}

/// An HTTP/1.1 request on a raw socket: the head, then `sent` of the body's `declared` bytes.
fn partial_push(ps: &Ps, declared: usize, sent: usize) -> TcpStream {
    let mut s = TcpStream::connect(ps.addr).unwrap();
    let head = format!(
        "POST /v1/gradients?worker=0&version=0&seq=1 HTTP/1.1\r\nHost: ps\r\n\
         Authorization: Bearer {TOKEN}\r\nContent-Length: {declared}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&vec![0u8; sent]).unwrap();
    s
}

/// Everything the server sends until it closes the connection, and how long that took.
fn read_until_closed(mut s: TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, started.elapsed()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, started.elapsed()),
            Err(e) => panic!("the server kept the connection open for {limit:?}: {e}; got {got:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_refused_and_changes_nothing() {
    let mut cfg = config(Algorithm::DcAsgdA, 1);
    cfg.body_idle_timeout = Duration::from_secs(1);
    let ps = start(cfg).await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout_of(4_000_000);
    c.register(&l, &vec![0.5; l.len()]).await.unwrap();
    c.pull(0, None, Duration::ZERO).await.unwrap();
    let before = ps.state.store().unwrap().checkpoint();

    // Half a 4 MB gradient, then silence (a worker paused mid-push).
    let s = partial_push(&ps, 4_000_100, 2_000_000);
    let (answer, took) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut s = s;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).expect("an answer before the read timeout");
        (String::from_utf8_lossy(&buf[..n]).into_owned(), started.elapsed())
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_stalled"), "{answer}");
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    assert_eq!(ps.state.store().unwrap().checkpoint(), before, "a stalled push changed the model");

    // The same worker's next push goes through.
    let reply =
        c.push(PushId::unjoined(0, 0, 1), None, &l, &vec![0.1; l.len()], GradDtype::F32).await.unwrap();
    assert_eq!(reply.version, 1);
}

/// A body that never pauses for the idle limit but trickles (a piece every 0.8 s under a 1 s
/// limit: 20 bytes a second) is cut off at the end of the first period below the minimum rate,
/// changes nothing, and frees the push slot it held: the same worker's next push is applied at
/// once though the PS has one slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_upload_is_refused_below_the_minimum_rate_and_frees_its_slot() {
    let mut cfg = config(Algorithm::Asgd, 1);
    cfg.body_idle_timeout = Duration::from_secs(1);
    cfg.push_slots = Some(1);
    let ps = start(cfg).await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout_of(400_000);
    c.register(&l, &vec![0.5; l.len()]).await.unwrap();
    let before = ps.state.store().unwrap().checkpoint();
    let body = foresight_ps::wire::encode_f32(&l, &vec![0.1; l.len()], &Default::default());

    let mut s = partial_push(&ps, body.len(), 0);
    let (answer, took) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        s.set_read_timeout(Some(Duration::from_millis(800))).unwrap();
        let mut buf = vec![0u8; 4096];
        for piece in body.chunks(16) {
            if s.write_all(piece).is_err() {
                break;
            }
            // The answer, once the PS has cut the body off.
            match s.read(&mut buf) {
                Ok(n) if n > 0 => {
                    return (String::from_utf8_lossy(&buf[..n]).into_owned(), started.elapsed());
                }
                _ => assert!(started.elapsed() < Duration::from_secs(10), "no answer in 10 s"),
            }
        }
        (String::new(), started.elapsed())
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_too_slow"), "{answer}");
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    assert_eq!(ps.state.store().unwrap().checkpoint(), before, "a trickled push changed the model");
    let reply =
        c.push(PushId::unjoined(0, 0, 1), None, &l, &vec![0.1; l.len()], GradDtype::F32).await.unwrap();
    assert_eq!(reply.version, 1);
}

/// A store that stops making progress (here: a model copy that holds its ticket and never
/// runs, so every later update waits for it) fails `/healthz` once a push has waited the limit,
/// naming why; when the copy runs, the push is applied and `/healthz` answers ok again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_store_fails_healthz_and_a_free_one_passes_again() {
    let mut cfg = config(Algorithm::Asgd, 1);
    cfg.store_stuck_after = Duration::from_secs(1);
    let ps = start(cfg).await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout_of(4_000);
    c.register(&l, &vec![0.5; l.len()]).await.unwrap();
    c.push(PushId::unjoined(0, 0, 1), None, &l, &vec![0.1; l.len()], GradDtype::F32).await.unwrap();
    let healthz = |url: String| async move {
        let r = reqwest::Client::new().get(format!("{url}/healthz")).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    assert_eq!(healthz(ps.url.clone()).await, (200, "ok".into()));

    let store = ps.state.store().unwrap().clone();
    let (_snap, copy) = store.pull_copying(None).unwrap();
    let copy = copy.expect("the first snapshot of version 1 is this call's to copy");
    let (c2, l2) = (c.clone(), l.clone());
    let pushed = tokio::spawn(async move {
        c2.push(PushId::unjoined(0, 1, 2), None, &l2, &vec![0.1; l2.len()], GradDtype::F32).await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, body) = healthz(ps.url.clone()).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("store_stuck") && body.contains("1 push(es)"), "{body}");
    assert!(!pushed.is_finished(), "the push waits behind the copy");

    copy.run(&|| ());
    assert_eq!(pushed.await.unwrap().unwrap().version, 2);
    assert_eq!(healthz(ps.url.clone()).await, (200, "ok".into()));
}

/// The idle limit is between frames, not for the whole body: a slow link that keeps sending is
/// never cut off, however long the upload takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_slower_than_the_idle_limit_in_total_but_never_silent_is_applied() {
    let mut cfg = config(Algorithm::Asgd, 1);
    cfg.body_idle_timeout = Duration::from_secs(1);
    let ps = start(cfg).await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout_of(400_000);
    c.register(&l, &vec![0.5; l.len()]).await.unwrap();
    let body = foresight_ps::wire::encode_f32(&l, &vec![0.1; l.len()], &Default::default());

    let mut s = partial_push(&ps, body.len(), 0);
    let (answer, took) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        // 8 pieces 400 ms apart: 2.8 s in all, no pause of 1 s.
        for piece in body.chunks(body.len().div_ceil(8)) {
            std::thread::sleep(Duration::from_millis(400));
            s.write_all(piece).unwrap();
        }
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).expect("an answer");
        (String::from_utf8_lossy(&buf[..n]).into_owned(), started.elapsed())
    })
    .await
    .unwrap();
    assert!(took > Duration::from_secs(2), "the upload took only {took:?}");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(ps.state.store().unwrap().checkpoint().version, 1, "the slow push was applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_that_never_ends_is_cut_off() {
    let limits = ConnectionLimits { header_read_timeout: Duration::from_secs(1), ..Default::default() };
    let ps = start_with(config(Algorithm::DcAsgdA, 1), limits, None).await;
    let mut s = TcpStream::connect(ps.addr).unwrap();
    s.write_all(b"POST /v1/gradients HTTP/1.1\r\nHost: ps\r\nX-Slow: ").unwrap();
    let (_, took) =
        tokio::task::spawn_blocking(move || read_until_closed(s, Duration::from_secs(10))).await.unwrap();
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
}

/// HTTP/2 frames in `bytes`, as (type, flags, stream).
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32)> {
    let mut out = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
        out.push((bytes[3], bytes[4], stream));
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    out
}

/// A peer that speaks HTTP/2 and then falls silent (a paused process, a dead node behind a
/// half-open connection) is PINGed, and dropped when it does not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_peer_that_never_answers_a_ping_is_dropped() {
    let limits = ConnectionLimits {
        keep_alive_interval: Duration::from_secs(1),
        keep_alive_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let ps = start_with(config(Algorithm::DcAsgdA, 1), limits, None).await;
    let mut s = TcpStream::connect(ps.addr).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap(); // an empty SETTINGS frame
    let (got, took) =
        tokio::task::spawn_blocking(move || read_until_closed(s, Duration::from_secs(15))).await.unwrap();
    const PING: u8 = 6;
    assert!(frames(&got).iter().any(|&(t, flags, _)| t == PING && flags == 0), "no PING: {:?}", frames(&got));
    assert!(took < Duration::from_secs(8), "closed after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_handshake_that_never_starts_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let tls = self_signed_cert(dir.path());
    let limits = ConnectionLimits { tls_handshake_timeout: Duration::from_secs(1), ..Default::default() };
    let ps = start_with(config(Algorithm::DcAsgdA, 1), limits, Some(&tls)).await;
    let s = TcpStream::connect(ps.addr).unwrap();
    let (got, took) =
        tokio::task::spawn_blocking(move || read_until_closed(s, Duration::from_secs(10))).await.unwrap();
    assert!(got.is_empty(), "{got:?}");
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
}

/// Beyond the cap, new connections wait in the backlog; one closing lets the next in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_for_one_to_close() {
    let limits = ConnectionLimits { max_connections: 2, ..Default::default() };
    let ps = start_with(config(Algorithm::DcAsgdA, 1), limits, None).await;
    let healthz = || async {
        let c = reqwest::Client::builder().timeout(Duration::from_secs(1)).build().unwrap();
        c.get(format!("{}/healthz", ps.url)).send().await.map(|r| r.status().as_u16())
    };
    assert_eq!(healthz().await.unwrap(), 200);
    let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(ps.addr).unwrap()).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(healthz().await.is_err(), "a third connection was served while two were open");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    while healthz().await.is_err() {
        assert!(Instant::now() < deadline, "no connection was served after the two closed");
    }
}

/// A worker moving a model-sized body slower than the silence timeout (a 1B-parameter model over
/// a slow link takes minutes) is on a live connection: it is not marked silent while its
/// download or its upload lasts, and is once it has been quiet for the timeout after it. Before,
/// only the start of a request counted: the worker was marked silent mid-transfer, which frees
/// its int8 copy and pace and takes it out of `sync` rounds. Then a body handed to HTTP/2 whole
/// (an int8 pull's, or an f32 snapshot copied before the answer began) ended the request as soon
/// as it was buffered, and the worker was marked silent while it downloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_moving_a_model_slower_than_the_silence_timeout_is_not_marked_silent() {
    let mut cfg = config(Algorithm::Asgd, 1);
    cfg.worker_silence_timeout = Duration::from_millis(300);
    let ps = start(cfg).await;
    let c = PsClient::new(&ps.url, Some(TOKEN.into())).unwrap();
    let l = layout_of(16 << 20);
    c.register(&l, &vec![0.5; l.len()]).await.unwrap();
    // Heard now, however long the registration took: the watch starts with the worker live.
    c.join(0, None).await.unwrap();
    ps.state.spawn_presence_watch();
    let store = ps.state.store().unwrap().clone();
    let silent = move || store.status().workers[0].silent;
    let slowly = Duration::from_millis(1200);

    // Downloads read in small pieces for 1.2 s (flow control holds the PS back meanwhile).
    let http = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    for (pull, size) in [("", 16 << 20), ("&dtype=int8", 4 << 20)] {
        let url = format!("{}/v1/model?worker=0{pull}", ps.url);
        let mut r = http.get(url).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(r.status(), 200, "{pull}");
        let (began, mut marked, mut bytes) = (Instant::now(), false, 0);
        while let Some(piece) = r.chunk().await.unwrap() {
            bytes += piece.len();
            marked |= silent();
            if began.elapsed() < slowly {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert!(began.elapsed() >= slowly && bytes > size, "{pull}: {bytes} bytes in {:?}", began.elapsed());
        assert!(!marked, "{pull}: marked silent while its model was on the way");
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(silent(), "{pull}: quiet for the timeout after the download: silent");
    }

    // Half an upload, a pause as long, then the rest.
    let check = silent.clone();
    let marked = tokio::task::spawn_blocking(move || {
        let mut s = partial_push(&ps, 4_000_100, 2_000_000);
        let (began, mut marked) = (Instant::now(), false);
        while began.elapsed() < slowly {
            std::thread::sleep(Duration::from_millis(20));
            marked |= check();
        }
        s.write_all(&vec![0u8; 2_000_100]).unwrap();
        // Its answer (a refusal: zeros are no gradient) ends the request.
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let n = s.read(&mut [0u8; 4096]).expect("an answer");
        assert!(n > 0, "the PS closed the connection without an answer");
        drop(ps);
        marked
    })
    .await
    .unwrap();
    assert!(!marked, "marked silent while its gradient was on the way");
}
