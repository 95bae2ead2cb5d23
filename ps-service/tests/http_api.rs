//! The PS over real HTTP/2 on loopback: many concurrent clients, staleness, metrics, sync
//! rounds, and every kind of bad input.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use foresight_ps::client::{Base, ClientError, ExpectedModel, GradDtype, PsClient, PullDtype, PushId};
use foresight_ps::optimizer::Algorithm;
use foresight_ps::wire::{self, Layout, TensorSpec};
use reqwest::StatusCode;
use support::*;

fn client(ps: &Ps) -> PsClient {
    PsClient::new(&ps.url, Some(TOKEN.into())).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_over_http2_see_monotonic_versions() {
    let workers = 16;
    let steps = 15u64;
    let ps = start(config(Algorithm::DcAsgdA, workers)).await;
    let l = layout();
    assert!(client(&ps).register(&l, &init(&l)).await.unwrap());
    assert!(!client(&ps).register(&l, &init(&l)).await.unwrap(), "second registration must be refused");

    let tasks: Vec<_> = (0..workers)
        .map(|m| {
            let (c, l) = (client(&ps), l.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for seq in 1..=steps {
                    let model = c.pull(m, None, Duration::ZERO).await.unwrap().unwrap();
                    assert_eq!(model.layout, l);
                    let dtype = if seq % 2 == 0 { GradDtype::Bf16 } else { GradDtype::F32 };
                    let r = c
                        .push(PushId::unjoined(m, model.version, seq), None, &l, &grad(&l, m), dtype)
                        .await
                        .unwrap();
                    assert!(r.applied && !r.replayed);
                    assert!(r.version > model.version);
                    assert_eq!(r.staleness, r.version - 1 - model.version);
                    seen.push(r.version);
                }
                seen
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        let seen = t.await.unwrap();
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "a worker saw versions go backwards: {seen:?}");
        all.extend(seen);
    }
    all.sort();
    let total = workers as u64 * steps;
    assert_eq!(all, (1..=total).collect::<Vec<_>>(), "every update got its own version");

    // The protocol really is HTTP/2 (prior knowledge), not a fallback to HTTP/1.1.
    let http2 = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let r = http2.get(format!("{}/healthz", ps.url)).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);

    // An f32 pull of a new version is streamed while its copy runs, with the length it will have;
    // its bytes are the complete snapshot's (the second pull is answered from it, whole).
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let r = http2.get(format!("{}/v1/model?worker=0", ps.url)).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let len = r.content_length();
        let body = r.bytes().await.unwrap();
        assert_eq!(len, Some(body.len() as u64), "Content-Length is the body's");
        bodies.push(body);
    }
    assert_eq!(bodies[0], bodies[1]);
    assert_eq!(wire::decode_model(&bodies[0]).unwrap().0, l);

    let m = scrape(&ps.url).await;
    let job = ["job=\"it\"", "namespace=\"tests\"", "shard=\"0\""];
    assert_eq!(metric(&m, "foresight_ps_updates_total", &job), total as f64);
    assert_eq!(metric(&m, "foresight_ps_model_version", &job), total as f64);
    assert_eq!(metric(&m, "foresight_ps_gradient_staleness_count", &job), total as f64);
    assert_eq!(metric(&m, "foresight_ps_push_seconds_count", &job), total as f64);
    assert_eq!(metric(&m, "foresight_ps_workers", &job), workers as f64);
    assert!(metric(&m, "foresight_ps_received_bytes_total", &job) > 0.0);
    assert!(metric(&m, "foresight_ps_sent_bytes_total", &job) > 0.0);
    let lambda = metric(&m, "foresight_ps_lambda", &job);
    assert!(lambda > 0.0 && lambda.is_finite(), "λ_t = {lambda}");
    // Stale gradients were compensated: the ratio is positive once any τ > 0 was applied.
    let ratio = metric(&m, "foresight_ps_compensation_ratio", &job);
    let stale = metric(&m, "foresight_ps_gradient_staleness_sum", &job) > 0.0;
    assert_eq!(ratio > 0.0, stale, "compensation ratio {ratio}, stale gradients: {stale}");
    let status = client(&ps).status().await.unwrap();
    assert_eq!(status["version"], total);
    assert_eq!(status["staleness"]["count"], total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staleness_of_a_scripted_interleaving() {
    let ps = start(config(Algorithm::DcAsgdC, 3)).await;
    let (c, l) = (client(&ps), layout());
    c.register(&l, &init(&l)).await.unwrap();
    let g = grad(&l, 0);
    let pull = |m| {
        let c = c.clone();
        async move { c.pull(m, None, Duration::ZERO).await.unwrap().unwrap().version }
    };
    assert_eq!((pull(0).await, pull(1).await, pull(2).await), (0, 0, 0));
    let r = c.push(PushId::unjoined(0, 0, 1), None, &l, &g, GradDtype::F32).await.unwrap();
    assert_eq!((r.version, r.staleness), (1, 0));
    let r = c.push(PushId::unjoined(1, 0, 1), None, &l, &g, GradDtype::F32).await.unwrap();
    assert_eq!((r.version, r.staleness), (2, 1));
    let r = c.push(PushId::unjoined(2, 0, 1), None, &l, &g, GradDtype::F32).await.unwrap();
    assert_eq!((r.version, r.staleness), (3, 2));
    assert_eq!(pull(1).await, 3);
    let r = c.push(PushId::unjoined(1, 3, 2), None, &l, &g, GradDtype::F32).await.unwrap();
    assert_eq!((r.version, r.staleness), (4, 0));
    // Retrying the same (worker, seq) answers the same and applies nothing.
    let again = c.push(PushId::unjoined(1, 3, 2), None, &l, &g, GradDtype::F32).await.unwrap();
    assert!(again.replayed);
    assert_eq!((again.version, again.staleness), (4, 0));
    let m = scrape(&ps.url).await;
    assert_eq!(metric(&m, "foresight_ps_updates_total", &[]), 4.0);
    assert_eq!(metric(&m, "foresight_ps_gradient_staleness_sum", &[]), 3.0);
    assert_eq!(metric(&m, "foresight_ps_gradient_staleness_bucket", &["le=\"0\""]), 2.0);
    assert_eq!(metric(&m, "foresight_ps_gradient_staleness_bucket", &["le=\"1\""]), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_rounds_long_poll_instead_of_spinning() {
    let ps = start(config(Algorithm::Sync, 3)).await;
    let (c, l) = (client(&ps), layout());
    c.register(&l, &init(&l)).await.unwrap();
    for m in 0..2 {
        let r = c.push(PushId::unjoined(m, 0, 1), None, &l, &grad(&l, m), GradDtype::F32).await.unwrap();
        assert!(!r.applied);
        assert_eq!(r.version, 0);
    }
    // Version 1 does not exist yet: a bounded wait answers 204 with the current version.
    let started = std::time::Instant::now();
    assert!(c.pull(0, Some(1), Duration::from_millis(300)).await.unwrap().is_none());
    assert!(started.elapsed() >= Duration::from_millis(250));
    // A waiting pull is woken by the round's last contribution.
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.pull(0, Some(1), Duration::from_secs(20)).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());
    let r = c.push(PushId::unjoined(2, 0, 1), None, &l, &grad(&l, 2), GradDtype::F32).await.unwrap();
    assert!(r.applied && r.version == 1);
    let model = waiter.await.unwrap().expect("woken with version 1");
    assert_eq!(model.version, 1);
    // The applied step is the mean of the three gradients.
    let mut expect = init(&l);
    for (i, w) in expect.iter_mut().enumerate() {
        let mean = (0..3).map(|m| grad(&l, m)[i]).sum::<f32>() / 3.0;
        *w -= 0.1 * mean;
    }
    for (a, b) in model.values.iter().zip(&expect) {
        assert!((a - b).abs() < 1e-6);
    }
    let m = scrape(&ps.url).await;
    assert_eq!(metric(&m, "foresight_ps_updates_total", &[]), 1.0);
}

/// One malformed or out-of-policy request, with what the PS must answer.
struct Case {
    what: &'static str,
    token: Option<&'static str>,
    query: String,
    body: Vec<u8>,
    status: StatusCode,
    reason: &'static str,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_is_refused_counted_and_changes_nothing() {
    let mut cfg = config(Algorithm::DcAsgdA, 2);
    cfg.hyper.max_staleness = Some(1);
    cfg.body_limit = 64 * 1024;
    let ps = start(cfg).await;
    let (c, l) = (client(&ps), layout());
    c.register(&l, &init(&l)).await.unwrap();
    // Worker 1 pulls version 0 and then falls 2 versions behind.
    c.pull(1, None, Duration::ZERO).await.unwrap();
    for seq in 1..=2 {
        let v = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap().version;
        c.push(PushId::unjoined(0, v, seq), None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap();
    }
    let store = ps.state.store().unwrap().clone();
    let before = (store.checkpoint(), store.status().workers);

    let good = wire::encode_f32(&l, &grad(&l, 1), &BTreeMap::new());
    let with = |mutate: &dyn Fn(&mut Vec<f32>)| {
        let mut g = grad(&l, 1);
        mutate(&mut g);
        wire::encode_f32(&l, &g, &BTreeMap::new())
    };
    // The layout's own bf16 and f16 bodies are read in place like an f32 one: refused the same.
    let with_bf16 = |mutate: &dyn Fn(&mut Vec<f32>)| {
        let mut g = grad(&l, 1);
        mutate(&mut g);
        wire::encode_bf16(&l, &g)
    };
    let f16_inf = {
        let mut body = wire::header(&l, wire::WireDtype::F16, &BTreeMap::new());
        let mut g = grad(&l, 1);
        g[3] = f32::INFINITY;
        body.extend(g.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()));
        body
    };
    let other_layout = |specs: Vec<TensorSpec>| {
        let o = Layout::new(specs).unwrap();
        wire::encode_f32(&o, &vec![0.0; o.len()], &BTreeMap::new())
    };
    let spec = |n: &str, s: Vec<usize>| TensorSpec { name: n.into(), shape: s };
    let f64_body = {
        let bytes: Vec<Vec<u8>> = l.tensors().iter().map(|t| vec![0u8; t.numel() * 8]).collect();
        let views: Vec<_> = l
            .tensors()
            .iter()
            .zip(&bytes)
            .map(|(t, b)| {
                (
                    t.name.clone(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F64, t.shape.clone(), b)
                        .unwrap(),
                )
            })
            .collect();
        safetensors::serialize(views, None).unwrap()
    };
    // Worker 1 is behind (its pull was v0); the body cases push as worker 0, whose query the
    // store would take (its pull was v1, τ = 1), so that only the body is wrong.
    let q = |worker: usize, version: u64, seq: u64| format!("worker={worker}&version={version}&seq={seq}");
    let cases = vec![
        Case {
            what: "no token",
            token: None,
            query: q(1, 2, 1),
            body: good.clone(),
            status: StatusCode::UNAUTHORIZED,
            reason: "unauthorized",
        },
        Case {
            what: "wrong token",
            token: Some("nope"),
            query: q(1, 2, 1),
            body: good.clone(),
            status: StatusCode::UNAUTHORIZED,
            reason: "unauthorized",
        },
        Case {
            what: "worker out of range",
            token: Some(TOKEN),
            query: q(2, 2, 1),
            body: good.clone(),
            status: StatusCode::BAD_REQUEST,
            reason: "unknown_worker",
        },
        Case {
            what: "missing seq",
            token: Some(TOKEN),
            query: "worker=1&version=2".into(),
            body: good.clone(),
            status: StatusCode::BAD_REQUEST,
            reason: "bad_request",
        },
        Case {
            what: "non-numeric version",
            token: Some(TOKEN),
            query: "worker=1&version=x&seq=1".into(),
            body: good.clone(),
            status: StatusCode::BAD_REQUEST,
            reason: "bad_request",
        },
        Case {
            what: "unknown tensor name",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: other_layout(vec![
                spec("conv.weight", vec![4, 3, 3, 3]),
                spec("fc.w", vec![10, 100]),
                spec("fc.bias", vec![10]),
            ]),
            status: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "layout_mismatch",
        },
        Case {
            what: "missing tensor",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: other_layout(vec![spec("conv.weight", vec![4, 3, 3, 3]), spec("fc.weight", vec![10, 100])]),
            status: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "layout_mismatch",
        },
        Case {
            what: "wrong shape",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: other_layout(vec![
                spec("conv.weight", vec![4, 3, 3, 3]),
                spec("fc.weight", vec![100, 10]),
                spec("fc.bias", vec![10]),
            ]),
            status: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "shape_mismatch",
        },
        Case {
            what: "f64 dtype",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: f64_body,
            status: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "dtype_mismatch",
        },
        Case {
            what: "truncated body",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: good[..good.len() - 10].to_vec(),
            status: StatusCode::BAD_REQUEST,
            reason: "malformed_body",
        },
        Case {
            what: "garbage body",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}".to_vec(),
            status: StatusCode::BAD_REQUEST,
            reason: "malformed_body",
        },
        Case {
            what: "empty body",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: Vec::new(),
            status: StatusCode::BAD_REQUEST,
            reason: "malformed_body",
        },
        Case {
            what: "NaN",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: with(&|g| g[5] = f32::NAN),
            status: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "non_finite",
        },
        Case {
            what: "+Inf",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: with(&|g| g[1000] = f32::INFINITY),
            status: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "non_finite",
        },
        Case {
            what: "NaN in a bf16 body",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: with_bf16(&|g| g[l.len() - 1] = f32::NAN),
            status: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "non_finite",
        },
        Case {
            what: "a bf16 body cut inside its last element",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: {
                let b = with_bf16(&|_| ());
                b[..b.len() - 1].to_vec()
            },
            status: StatusCode::BAD_REQUEST,
            reason: "malformed_body",
        },
        Case {
            what: "+Inf in an f16 body",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: f16_inf,
            status: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "non_finite",
        },
        Case {
            what: "finite but too large to square (1e20 squares to +Inf: NaN all over the model)",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: with(&|g| g[7] = 1e20),
            status: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "too_large",
        },
        Case {
            what: "version from the future",
            token: Some(TOKEN),
            query: q(1, 3, 1),
            body: good.clone(),
            status: StatusCode::BAD_REQUEST,
            reason: "future_version",
        },
        Case {
            what: "staler than maxStaleness",
            token: Some(TOKEN),
            query: q(1, 0, 1),
            body: good.clone(),
            status: StatusCode::CONFLICT,
            reason: "too_stale",
        },
        Case {
            what: "not the version it pulled",
            token: Some(TOKEN),
            query: q(1, 2, 1),
            body: good.clone(),
            status: StatusCode::CONFLICT,
            reason: "pull_required",
        },
        Case {
            what: "body over the limit",
            token: Some(TOKEN),
            query: q(0, 1, 3),
            body: vec![0u8; 65 * 1024],
            status: StatusCode::PAYLOAD_TOO_LARGE,
            reason: "body_too_large",
        },
        Case {
            what: "negative epoch",
            token: Some(TOKEN),
            query: q(1, 2, 1) + "&epoch=-1",
            body: good.clone(),
            status: StatusCode::BAD_REQUEST,
            reason: "bad_request",
        },
    ];
    let http = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    for case in cases {
        let before_count = metric(
            &scrape(&ps.url).await,
            "foresight_ps_gradients_rejected_total",
            &[&format!("reason=\"{}\"", case.reason)],
        );
        let mut req = http.post(format!("{}/v1/gradients?{}", ps.url, case.query)).body(case.body);
        if let Some(t) = case.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), case.status, "{}", case.what);
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["reason"], case.reason, "{}: {body}", case.what);
        assert!(
            body["error"].as_str().is_some_and(|e| e.len() > 10),
            "{}: the error says what is wrong",
            case.what
        );
        let after = metric(
            &scrape(&ps.url).await,
            "foresight_ps_gradients_rejected_total",
            &[&format!("reason=\"{}\"", case.reason)],
        );
        assert_eq!(after, before_count + 1.0, "{}: counted under its reason", case.what);
        assert!((store.checkpoint(), store.status().workers) == before, "{}: changed the model", case.what);
    }
    // The same worker's valid push still goes through afterwards.
    c.pull(1, None, Duration::ZERO).await.unwrap();
    let r = c.push(PushId::unjoined(1, 2, 1), None, &l, &grad(&l, 1), GradDtype::F32).await.unwrap();
    assert_eq!(r.version, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_endpoints_validate_their_input() {
    let ps = start(config(Algorithm::Asgd, 2)).await;
    let (c, l) = (client(&ps), layout());
    let err = c.pull(0, None, Duration::ZERO).await.unwrap_err();
    assert_eq!(err.reason(), Some("not_registered"));
    let err = c.finalize().await.unwrap_err();
    assert_eq!(err.reason(), Some("not_registered"));
    // A model must be F32 and well-formed.
    let http = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let put = |body: Vec<u8>| http.put(format!("{}/v1/model", ps.url)).bearer_auth(TOKEN).body(body).send();
    let r = put(wire::encode_bf16(&l, &init(&l))).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let r = put(b"garbage".to_vec()).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // A version no model can reach: counting up from u64::MAX would wrap.
    for version in [1u64 << 53, u64::MAX] {
        let r = http
            .put(format!("{}/v1/model?version={version}&worker=0", ps.url))
            .bearer_auth(TOKEN)
            .body(wire::encode_f32(&l, &init(&l), &BTreeMap::new()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "version {version}");
    }
    assert!(ps.state.store().is_none(), "a refused registration registers nothing");
    c.register(&l, &init(&l)).await.unwrap();
    let r = put(wire::encode_f32(&l, &init(&l), &BTreeMap::new())).await.unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["reason"], "already_registered");
    // HEAD looks at the model without becoming the worker's pull.
    let r = http.head(format!("{}/v1/model?worker=0", ps.url)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!((r.status(), r.headers()["x-foresight-version"].to_str().unwrap()), (StatusCode::OK, "0"));
    assert!(c.status().await.unwrap()["workers"][0]["pulled_version"].is_null());

    let post = |body: &str| {
        http.post(format!("{}/v1/report", ps.url))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    for bad in [
        r#"{"worker": 0, "step": 1, "epoch": 0.5, "loss": -1}"#,
        r#"{"worker": 0, "step": 1, "epoch": 0.5, "loss": 1, "accuracy": 1.5}"#,
        r#"{"worker": 9, "step": 1, "epoch": 0.5, "loss": 1}"#,
        r#"{"worker": 0, "step": 1, "epoch": 0.5, "loss": 1, "extra": true}"#,
        r#"{"worker": 0"#,
    ] {
        let r = post(bad).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    let r = post(
        r#"{"worker": 1, "step": 7, "epoch": 0.5, "loss": 0.25, "accuracy": 0.9, "samples_per_second": 100}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let status = c.status().await.unwrap();
    assert_eq!(status["step"], 7);
    assert_eq!(status["loss"], 0.25);
    assert_eq!(status["accuracy"], 0.9);
    // Pull parameters are validated too, and health endpoints need no token.
    let r = http.get(format!("{}/v1/model?worker=abc", ps.url)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert!(http.get(format!("{}{path}", ps.url)).send().await.unwrap().status().is_success(), "{path}");
    }
    let r = http.get(format!("{}/v2/nothing", ps.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["reason"], "not_found");
    let r = http.delete(format!("{}/v1/status", ps.url)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["reason"], "method_not_allowed");
    for path in ["/v1/status", "/v1/model?worker=0"] {
        assert_eq!(
            http.get(format!("{}{path}", ps.url)).send().await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
    }
}

/// A model pulled as bf16 is the PS's float32 model rounded to bf16, in half the bytes, and the
/// client widens it in place; a pull in a dtype the PS does not send is refused before it
/// becomes the worker's pull (its backup under dc-asgd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_pulled_as_bf16_is_the_float32_model_rounded_in_half_the_bytes() {
    let ps = start(config(Algorithm::DcAsgdA, 2)).await;
    let (c, l) = (client(&ps), layout());
    c.register(&l, &init(&l)).await.unwrap();
    let id = PushId { worker: 1, generation: None, version: 0, incarnation: None, seq: 1 };
    c.push(id, None, &l, &grad(&l, 3), GradDtype::F32).await.unwrap();
    let full = c.pull(1, None, Duration::ZERO).await.unwrap().unwrap();
    let bf16 = ExpectedModel::pulled_as(l.clone(), PullDtype::Bf16);
    let half = c.pull_expecting(1, None, Duration::ZERO, Some(&bf16), Vec::new()).await.unwrap().unwrap();
    assert_eq!((half.version, half.layout.clone()), (1, l.clone()));
    let rounded: Vec<f32> = full.values.iter().map(|v| half::bf16::from_f32(*v).to_f32()).collect();
    assert_eq!(half.values, rounded);
    assert_ne!(half.values, full.values, "the values are rounded, not sent whole");

    let http = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let get = |query: &str| http.get(format!("{}/v1/model?{query}", ps.url)).bearer_auth(TOKEN).send();
    let body = get("worker=1&dtype=bf16").await.unwrap().bytes().await.unwrap();
    assert_eq!(body.len(), wire::header(&l, wire::WireDtype::Bf16, &BTreeMap::new()).len() + 2 * l.len());
    let body = get("worker=1&dtype=f32").await.unwrap().bytes().await.unwrap();
    assert_eq!(wire::decode_model(&body).unwrap().1, full.values);
    for bad in ["fp8", "F32", "bf16,f32", ""] {
        let r = get(&format!("worker=0&dtype={bad}")).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "dtype={bad}");
        assert_eq!(r.json::<serde_json::Value>().await.unwrap()["reason"], "bad_request");
    }
    assert!(
        c.status().await.unwrap()["workers"][0]["pulled_version"].is_null(),
        "a refused pull is not the worker's pull"
    );
}

/// Parameter groups over HTTP: the PS started with `--parameter-groups` (here the config) keeps
/// the job's weight decay off the bias and says what each group took; a group that matches no
/// tensor of the model refuses the registration, naming the group (it would leave every tensor
/// at the job's rates, silently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameter_groups_give_their_tensors_their_rates_and_a_group_that_matches_none_is_refused() {
    use foresight_ps::optimizer::ParameterGroup;
    let group = |names: &[&str]| ParameterGroup {
        names: names.iter().map(|n| n.to_string()).collect(),
        weight_decay: Some(0.0),
        learning_rate_scale: None,
    };
    let mut cfg = config(Algorithm::Asgd, 1);
    (cfg.hyper.weight_decay, cfg.hyper.parameter_groups) = (0.5, vec![group(&["bias$"])]);
    let ps = start(cfg.clone()).await;
    let (c, l) = (client(&ps), layout());
    let w0 = init(&l);
    c.register(&l, &w0).await.unwrap();
    c.push(PushId::unjoined(0, 0, 1), None, &l, &vec![0.0; l.len()], GradDtype::F32).await.unwrap();
    let w1 = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap().values;
    let bias = l.iter().find(|(t, _)| t.name == "fc.bias").unwrap().1;
    for i in 0..l.len() {
        let expect = if bias.contains(&i) { w0[i] } else { w0[i] - 0.1 * 0.5 * w0[i] };
        assert!((w1[i] - expect).abs() < 1e-6, "element {i}: {} vs {expect}", w1[i]);
    }
    let status = c.status().await.unwrap();
    assert_eq!(status["parameter_groups"][0]["parameters"], 10, "{status:#}");
    assert_eq!(status["parameter_groups"][0]["names"], serde_json::json!(["bias$"]));

    cfg.hyper.parameter_groups = vec![group(&["bias$"]), group(&["^embed"])];
    let ps = start(cfg).await;
    let err = client(&ps).register(&l, &w0).await.unwrap_err();
    assert_eq!(err.reason(), Some("layout_mismatch"), "{err}");
    assert!(
        err.is_permanent()
            && err.to_string().contains("parameter group 1 (names [\"^embed\"]) matches no tensor"),
        "{err}"
    );
    assert!(client(&ps).status().await.unwrap()["registered"] == false, "refused: nothing registered");
}

/// One encoded pull body per worker at a time: a second bf16 pull of a worker whose first body is
/// still being sent waits, then is refused `busy`, and is answered once the first is gone; other
/// workers are not held (issue #46: encoded pull bodies were outside admission, so a worker
/// pulling many times at once held one body per pull beyond the memory plan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_has_one_encoded_pull_body_in_flight_at_a_time() {
    let ps = start(config(Algorithm::Asgd, 2)).await;
    let c = client(&ps);
    let l = Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![1 << 20] }]).unwrap();
    c.register(&l, &vec![0.5; l.len()]).await.unwrap();
    let url = |w: usize| format!("{}/v1/model?worker={w}&dtype=bf16", ps.url);
    // A reader that takes nothing: its 64 KiB windows hold the 2 MiB body back in the server.
    let stalled = reqwest::Client::builder()
        .http2_prior_knowledge()
        .http2_initial_stream_window_size(65_535)
        .http2_initial_connection_window_size(65_535)
        .build()
        .unwrap();
    let first = stalled.get(url(0)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let other = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let get = |w: usize| other.get(url(w)).bearer_auth(TOKEN).send();

    let started = std::time::Instant::now();
    let r = get(0).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "1");
    assert!(started.elapsed() >= Duration::from_millis(1900), "it waited for the first body first");
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["reason"], "busy");
    let body = get(1).await.unwrap().bytes().await.unwrap();
    assert_eq!(body.len(), wire::header(&l, wire::WireDtype::Bf16, &BTreeMap::new()).len() + 2 * l.len());

    // The first body given up (its stream reset): worker 0 pulls again.
    drop(first);
    let again = get(0).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK, "{:?}", again.text().await);
}

/// A model pulled as int8 is first the whole F32 model, then the int8 difference from the copy
/// the worker holds (a quarter of the bytes), which stays close to the PS's model pull after
/// pull; a copy the PS no longer tracks gets the whole model again, and a malformed `base` is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_pulled_as_int8_is_the_difference_from_the_workers_copy() {
    let ps = start(config(Algorithm::Asgd, 2)).await;
    let (c, l) = (client(&ps), layout());
    c.register(&l, &init(&l)).await.unwrap();
    let int8 = ExpectedModel::pulled_as(l.clone(), PullDtype::Int8);
    let pull = |base: Option<(u64, Vec<f32>)>| {
        let (c, int8) = (&c, &int8);
        async move {
            let base = base.as_ref().map(|(tag, v)| Base { tag: *tag, values: v });
            c.pull_against(1, None, Duration::ZERO, Some(int8), Vec::new(), base).await.unwrap().unwrap()
        }
    };
    let first = pull(None).await;
    assert_eq!(first.values, init(&l), "the first pull is the whole model");
    let mut held = (first.copy.expect("a copy's tag"), first.values);
    let sent = || ps.state.metrics.sent_bytes.get();
    let whole = wire::encode_f32(&l, &init(&l), &BTreeMap::new()).len() as u64;
    let int8_body = wire::int8::encode(&l, &mut init(&l)).len() as u64;
    for seq in 1..=20u64 {
        let id = PushId { worker: 0, generation: None, version: seq - 1, incarnation: None, seq };
        c.push(id, None, &l, &grad(&l, seq as usize), GradDtype::F32).await.unwrap();
        let exact = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap().values;
        let before = sent();
        let m = pull(Some(held.clone())).await;
        let bytes = sent() - before;
        assert_eq!(bytes, int8_body, "pull {seq}: the whole model is {whole} bytes");
        assert_eq!(m.version, seq);
        // Within one pull's rounding of the model (a step is 0.01 a value at most here), however
        // many pulls came before: what one leaves out, the next sends.
        let err = m.values.iter().zip(&exact).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < 1e-4, "pull {seq}: {err}");
        held = (m.copy.expect("a copy's tag"), m.values);
    }
    // A copy the PS does not track (here: a tag it replaced) gets the whole model.
    let stale = (held.0 ^ 1, held.1.clone());
    let m = pull(Some(stale)).await;
    assert_eq!(m.values, c.pull(0, None, Duration::ZERO).await.unwrap().unwrap().values);

    let http = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let get = |query: &str| http.get(format!("{}/v1/model?{query}", ps.url)).bearer_auth(TOKEN).send();
    for bad in ["dtype=int8&base=12", "dtype=int8&base=zzzzzzzzzzzzzzzz", "dtype=f32&base=0123456789abcdef"] {
        let r = get(&format!("worker=1&{bad}")).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
}

/// Workers that pull bf16 or int8 cost the PS a body encoded per pull each, and with int8 a
/// copy of the model each: under a memory limit, a PS told so (`--pull-dtype`) plans for them
/// and buffers fewer push bodies at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_plan_counts_what_workers_pulling_bf16_or_int8_cost() {
    let model_bytes = 4.0 * layout().len() as f64;
    let mut slots = Vec::new();
    for pulled_as in [PullDtype::F32, PullDtype::Bf16, PullDtype::Int8] {
        let mut c = config(Algorithm::Asgd, 4);
        // 20 copies planned: the model, 4 backups and a pull cache, 4 snapshots being sent
        // (10), a checkpoint's copy, 4 pushes waiting for a slot (each a stream window, here
        // the whole small model), and room for 5 pushes (capped at the 4 workers); with bf16
        // pulls, for their 4 bodies in flight (4 halves) and 3 pushes; with int8, for the
        // workers' 4 copies, their bodies in flight (4 quarters) and the 1 push always allowed.
        c.memory_limit = Some((20.0 * model_bytes / 0.9).ceil() as u64);
        c.pulled_as = pulled_as;
        let ps = start(c).await;
        client(&ps).register(&layout(), &init(&layout())).await.unwrap();
        slots.push(ps.state.metrics.push_slots.get());
    }
    assert_eq!(slots, [4, 3, 1]);
}

/// Foresight's own F32 bodies are decoded while they stream in; what that path refuses must
/// read exactly as the general decoder's refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_f32_bodies_are_checked_like_any_other() {
    let ps = start(config(Algorithm::Asgd, 1)).await;
    let (c, l) = (client(&ps), layout());
    c.register(&l, &init(&l)).await.unwrap();
    let http = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let send = |body: Vec<u8>| {
        http.post(format!("{}/v1/gradients?worker=0&version=0&seq=1", ps.url))
            .bearer_auth(TOKEN)
            .body(body)
            .send()
    };
    let mut g = grad(&l, 0);
    g[1000] = f32::NAN; // conv.weight has 108 elements: this is fc.weight's element 892
    let r = send(wire::encode_f32(&l, &g, &BTreeMap::new())).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let msg = r.json::<serde_json::Value>().await.unwrap()["error"].as_str().unwrap().to_string();
    assert!(msg.contains("\"fc.weight\"") && msg.contains("element 892"), "{msg}");
    let mut long = wire::encode_f32(&l, &grad(&l, 0), &BTreeMap::new());
    long.extend_from_slice(&[0; 8]);
    let r = send(long).await.unwrap();
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["reason"], "malformed_body");
    assert_eq!(ps.state.store().unwrap().version(), 0, "nothing refused was applied");
    // And the accepted push applies exactly the gradient sent.
    let r = c.push(PushId::unjoined(0, 0, 2), None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap();
    assert_eq!(r.version, 1);
    let model = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    let expect: Vec<f32> = init(&l).iter().zip(grad(&l, 0)).map(|(w, g)| w - 0.1 * g).collect();
    assert_eq!(model.values, expect);
}

/// Over HTTP/2: joins hand out generations, an old generation's push is refused without
/// changing anything, a PS that lost its model takes the freshest offered copy and holds pushes
/// until every worker has offered, and bad join/offer parameters are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_generations_and_reseeding() {
    let mut cfg = config(Algorithm::Asgd, 2);
    cfg.reseed_hold = Duration::from_secs(60);
    let ps = start(cfg).await;
    let (c, l) = (client(&ps), layout());
    assert_eq!(c.join(0, None).await.unwrap_err().reason(), Some("not_registered"));
    // A lost model: worker 1 offers its copy of version 30, then worker 0 a fresher one (45).
    let copy = |k: usize| -> Vec<f32> { grad(&l, k) };
    assert!(c.offer(1, 30, &l, &copy(1)).await.unwrap());
    let r = c.push(PushId::unjoined(1, 30, 1), None, &l, &grad(&l, 1), GradDtype::F32).await.unwrap_err();
    assert_eq!(r.reason(), Some("seeding"), "pushes wait while copies may still come");
    assert!(r.is_transient());
    // Worker 0 has not offered yet: it is told to, instead of pulling the seed over its own
    // (possibly fresher) copy or waiting out the hold behind `seeding`.
    assert_eq!(c.pull(0, None, Duration::ZERO).await.unwrap_err().reason(), Some("not_registered"));
    let r = c.push(PushId::unjoined(0, 30, 1), None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap_err();
    assert_eq!(r.reason(), Some("not_registered"));
    assert!(!c.offer(0, 20, &l, &copy(0)).await.unwrap(), "an older copy is refused");
    assert!(c.offer(0, 45, &l, &copy(0)).await.unwrap(), "a fresher copy replaces the seed");
    let model = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!((model.version, model.values), (45, copy(0)));
    // Both have offered: the hold is over. Each joins and trains on.
    let j0 = c.join(0, Some(120)).await.unwrap();
    assert_eq!((j0.generation, j0.resume_step, j0.version), (1, 120, 45));
    let id = PushId { worker: 0, generation: Some(1), version: 45, incarnation: None, seq: 121 };
    assert_eq!(c.push(id, None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap().version, 46);
    // Worker 0 is replaced: the old process's retry is refused and changes nothing.
    let j0b = c.join(0, None).await.unwrap();
    assert_eq!((j0b.generation, j0b.resume_step), (2, 121));
    let late = PushId { seq: 122, version: 46, ..id };
    let err = c.push(late, None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap_err();
    assert_eq!(err.reason(), Some("superseded"));
    let ahead = PushId { generation: Some(5), ..late };
    let err = c.push(ahead, None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap_err();
    assert_eq!(err.reason(), Some("rejoin_required"));
    assert_eq!(c.status().await.unwrap()["version"], 46);
    assert!(!c.offer(1, 500, &l, &copy(1)).await.unwrap(), "training has moved on from the seed");
    let m = scrape(&ps.url).await;
    assert_eq!(metric(&m, "foresight_ps_worker_joins_total", &[]), 2.0);
    assert_eq!(metric(&m, "foresight_ps_reseeds_total", &[]), 2.0, "two copies taken, 30 then 45");
    for reason in ["seeding", "not_registered", "superseded", "rejoin_required"] {
        let label = format!("reason=\"{reason}\"");
        assert_eq!(metric(&m, "foresight_ps_gradients_rejected_total", &[&label]), 1.0, "{reason}");
    }
    // Bad parameters.
    let http = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    for path in ["/v1/join", "/v1/join?worker=9", "/v1/join?worker=0&step=-1"] {
        let r = http.post(format!("{}{path}", ps.url)).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path}");
    }
    // A step above any job's (2^53) is refused, and the refusal changes nothing: the next join
    // is the next generation, resuming where worker 1 was.
    let before = c.join(1, None).await.unwrap();
    let huge = format!("{}/v1/join?worker=1&step={}", ps.url, 1u64 << 53);
    let r = http.post(huge).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let after = c.join(1, None).await.unwrap();
    assert_eq!((after.generation, after.resume_step), (before.generation + 1, before.resume_step));
    let other = Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![3] }]).unwrap();
    let r = http
        .put(format!("{}/v1/model?worker=0&version=900", ps.url))
        .bearer_auth(TOKEN)
        .body(wire::encode_f32(&other, &[1.0; 3], &BTreeMap::new()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT, "training has moved on: refused before the body");
    let r = http.put(format!("{}/v1/model?worker=7", ps.url)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = http.post(format!("{}/v1/join", ps.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    // A worker that had pulled nothing newer than the initial model offers version 0: that is
    // still an offer after a loss, so pushes wait for the other worker's fresher copy.
    let mut cfg = config(Algorithm::Asgd, 2);
    cfg.reseed_hold = Duration::from_secs(60);
    let ps = start(cfg).await;
    let c = client(&ps);
    assert!(c.offer(0, 0, &l, &copy(0)).await.unwrap());
    c.join(0, None).await.unwrap();
    let r = c.push(PushId::unjoined(0, 0, 1), None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap_err();
    assert_eq!(r.reason(), Some("seeding"));
    assert!(c.offer(1, 12, &l, &copy(1)).await.unwrap(), "the fresher copy wins");
    assert_eq!(c.pull(0, None, Duration::ZERO).await.unwrap().unwrap().version, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_count_changes_without_a_restart_and_bad_counts_change_nothing() {
    let ps = start(config(Algorithm::Asgd, 2)).await;
    let (c, l) = (client(&ps), layout());
    let http = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let put = |query: &str, token: Option<&str>| {
        let r = http.put(format!("{}/v1/workers{query}", ps.url));
        match token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
        .send()
    };
    // Before any model: the count is kept for the store to come.
    c.set_workers(3).await.unwrap();
    c.register(&l, &init(&l)).await.unwrap();
    let joined = c.join(2, None).await.unwrap();
    assert_eq!(joined.workers, 3);
    c.pull(2, None, Duration::ZERO).await.unwrap().unwrap();
    let id = PushId { worker: 2, generation: Some(joined.generation), version: 0, incarnation: None, seq: 1 };
    c.push(id, None, &l, &init(&l), GradDtype::F32).await.unwrap();
    let status = c.status().await.unwrap();
    assert_eq!(
        (status["workers_expected"].as_u64(), status["workers"].as_array().unwrap().len()),
        (Some(3), 3)
    );
    // Refused: no token, no count, zero, too many, not a number; nothing changes.
    assert_eq!(put("?count=4", None).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    for bad in ["", "?count=0", "?count=1025", "?count=two", "?count=-1"] {
        let r = put(bad, Some(TOKEN)).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(r.json::<serde_json::Value>().await.unwrap()["reason"], "bad_request", "{bad}");
    }
    assert_eq!(c.status().await.unwrap()["workers_expected"], 3);
    // Down to 2: the highest index is refused from now on.
    c.set_workers(2).await.unwrap();
    let err = c.pull(2, None, Duration::ZERO).await.unwrap_err();
    assert_eq!(err.reason(), Some("unknown_worker"));
    let metrics = reqwest::get(format!("{}/metrics", ps.url)).await.unwrap().text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("foresight_ps_workers_expected") && l.ends_with(" 2")),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_storm_installs_one_model_and_buffers_one_body() {
    // 8 workers upload a 1M-parameter model at once, as after a start or a PS that lost its
    // model: one registers it; the others are answered without their bodies being read (each
    // would be a 4 MB buffer and a store of its own).
    let workers = 8;
    let ps = start(config(Algorithm::DcAsgdA, workers)).await;
    let l = Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![1024, 1024] }]).unwrap();
    let values = vec![0.5f32; l.len()];
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (c, l, v) = (client(&ps), l.clone(), values.clone());
            tokio::spawn(async move { c.register(&l, &v).await.unwrap() })
        })
        .collect();
    let mut registered = 0;
    for t in tasks {
        registered += usize::from(t.await.unwrap());
    }
    assert_eq!(registered, 1, "exactly one registration installs the model");
    let m = scrape(&ps.url).await;
    let received = metric(&m, "foresight_ps_received_bytes_total", &["job=\"it\""]);
    let body = (l.len() * 4) as f64;
    assert!(
        received >= body && received < 2.0 * body,
        "{received} body bytes read for {workers} registrations of {body} bytes: one should be"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_beyond_the_push_slots_waits_then_is_refused_busy_and_changes_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // One slot (as a memory limit would give for a large model): worker 0's push holds it while
    // its body arrives slowly; worker 1's push waits, then is told to come back.
    let mut cfg = config(Algorithm::DcAsgdA, 2);
    cfg.push_slots = Some(1);
    let ps = start(cfg).await;
    let (c, l) = (client(&ps), layout());
    c.register(&l, &init(&l)).await.unwrap();
    for m in 0..2 {
        c.pull(m, None, Duration::ZERO).await.unwrap().unwrap();
    }
    // Worker 0 over HTTP/1.1 by hand: headers and half the body, the rest later.
    let body = wire::encode_f32(&l, &grad(&l, 0), &BTreeMap::new());
    let mut slow = tokio::net::TcpStream::connect(ps.addr).await.unwrap();
    let head = format!(
        "POST /v1/gradients?worker=0&version=0&seq=1 HTTP/1.1\r\nhost: ps\r\nauthorization: Bearer {TOKEN}\r\n\
         content-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(&body[..body.len() / 2]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = std::time::Instant::now();
    let err = c.push(PushId::unjoined(1, 0, 1), None, &l, &grad(&l, 1), GradDtype::F32).await.unwrap_err();
    assert_eq!(err.reason(), Some("busy"), "{err}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)), "{err}");
    assert!(err.is_transient(), "a busy PS is worth retrying: {err}");
    assert!(started.elapsed() >= Duration::from_millis(1900), "it waited for a slot first");
    assert_eq!(c.status().await.unwrap()["version"], 0, "the refused push changed nothing");

    // The slow body completes: applied. Then worker 1's retry finds the slot free.
    slow.write_all(&body[body.len() / 2..]).await.unwrap();
    let mut answer = vec![0; 1024];
    let n = slow.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let r = c.push(PushId::unjoined(1, 0, 1), None, &l, &grad(&l, 1), GradDtype::F32).await.unwrap();
    assert!(r.applied && r.version == 2, "{r:?}");
    let m = scrape(&ps.url).await;
    assert_eq!(metric(&m, "foresight_ps_push_slots", &[]), 1.0);
    assert_eq!(metric(&m, "foresight_ps_gradients_rejected_total", &["reason=\"busy\""]), 1.0);
}

/// With a control token, a worker's token (which every worker pod holds) may train but not end
/// or rescale the job; the control token may do everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_control_token_finalizes_or_rescales_the_job() {
    let mut cfg = config(Algorithm::Asgd, 2);
    cfg.control_token = Some("control-secret".into());
    let ps = start(cfg).await;
    let (worker, l) = (client(&ps), layout());
    let control = PsClient::new(&ps.url, Some("control-secret".into())).unwrap();
    let anonymous = PsClient::new(&ps.url, Some("wrong".into())).unwrap();
    worker.register(&l, &init(&l)).await.unwrap();
    worker.join(0, None).await.unwrap();
    worker.pull(0, None, Duration::ZERO).await.unwrap();
    for refused in [worker.set_workers(3).await.unwrap_err(), worker.finalize().await.unwrap_err()] {
        assert!(
            matches!(&refused, ClientError::Refused { status, reason, .. } if *status == StatusCode::FORBIDDEN && reason == "forbidden"),
            "{refused:?}"
        );
    }
    for refused in [anonymous.set_workers(3).await.unwrap_err(), anonymous.status().await.unwrap_err()] {
        assert_eq!(refused.reason(), Some("unauthorized"));
    }
    let status = control.status().await.unwrap();
    assert_eq!((status["workers_expected"].as_u64(), status["finalized"].as_bool()), (Some(2), Some(false)));
    control.pull(1, None, Duration::ZERO).await.unwrap();
    control.set_workers(3).await.unwrap();
    assert_eq!(control.finalize().await.unwrap().version, 0);
    assert_eq!(worker.status().await.unwrap()["workers_expected"], 3);
}

/// With a control token, each join answers a credential for that worker and generation, and
/// every call that acts for a worker must carry its own: a process holding the workers' token
/// (every worker pod does) cannot pull as another worker (taking its backup and int8 copy),
/// push or heartbeat for it, end another's training with `leave` (four such calls ended a
/// running job before), or replace the trained model with a "registration" of a later version.
/// Each refusal changes nothing; the worker's own process carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_acts_only_for_itself() {
    let mut cfg = config(Algorithm::Asgd, 2);
    cfg.control_token = Some("control-secret".into());
    let ps = start(cfg).await;
    let (w0, w1, l) = (client(&ps), client(&ps), layout());
    w0.register(&l, &init(&l)).await.unwrap();
    let j0 = w0.join(0, None).await.unwrap();
    let j1 = w1.join(1, None).await.unwrap();
    w0.pull(0, None, Duration::ZERO).await.unwrap();
    let id = |worker, generation, version, seq| PushId {
        worker,
        generation: Some(generation),
        version,
        incarnation: None,
        seq,
    };
    let pushed = w0.push(id(0, j0.generation, 0, 1), None, &l, &grad(&l, 0), GradDtype::F32).await;
    assert!(pushed.unwrap().applied);
    let before = ps.state.store().unwrap().version();

    // Worker 1's process, with its own credential, acting for worker 0.
    let as_w0 = id(0, j0.generation, before, 1);
    let refusals = [
        w1.pull(0, None, Duration::ZERO).await.unwrap_err(),
        w1.push(as_w0, None, &l, &grad(&l, 1), GradDtype::F32).await.unwrap_err(),
        w1.heartbeat(0).await.unwrap_err(),
        w1.leave(0, j0.generation, None).await.unwrap_err(),
        // Its own worker, another generation.
        w1.leave(1, j1.generation + 1, None).await.unwrap_err(),
    ];
    for e in &refusals {
        assert_eq!(e.reason(), Some("credential_refused"), "{e}");
        assert!(e.to_string().contains("credential of worker 1"), "{e}");
    }
    // The workers' token without any join carries no credential at all.
    let bare = client(&ps);
    let e = bare.leave(0, j0.generation, None).await.unwrap_err();
    assert!(e.to_string().contains("no credential"), "{e}");
    // A registration of a later version would replace the trained model: only an offer (with
    // its worker's credential) may be a later version.
    let later = wire::encode_f32(&l, &grad(&l, 3), &Default::default());
    let http = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let url = format!("{}/v1/model?version={}", ps.url, before + 10);
    let r = http.put(url).bearer_auth(TOKEN).body(later).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("worker's copy"));

    let store = ps.state.store().unwrap().clone();
    assert_eq!(store.version(), before, "no refused call changed the model");
    assert!(!store.all_finished());
    // Each process acting for itself is taken: worker 0 pushes again, both leave, the job ends.
    w0.pull(0, None, Duration::ZERO).await.unwrap();
    let again = id(0, j0.generation, before, 2);
    assert!(w0.push(again, None, &l, &grad(&l, 2), GradDtype::F32).await.unwrap().applied);
    w1.heartbeat(1).await.unwrap();
    assert_eq!(w1.leave(1, j1.generation, None).await.unwrap(), None);
    assert!(w0.leave(0, j0.generation, None).await.unwrap().is_some(), "the last leave finalizes");
}

/// A push whose answer needs no gradient — a sync worker's re-push of a gradient already in the
/// round, a refusal — is answered from its query: its body is never read into a buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_answered_from_its_query_costs_no_body() {
    let ps = start(config(Algorithm::Sync, 2)).await;
    let (c, l) = (client(&ps), layout());
    c.register(&l, &init(&l)).await.unwrap();
    let received = || async { metric(&scrape(&ps.url).await, "foresight_ps_received_bytes_total", &[]) };
    let first = c.push(PushId::unjoined(0, 0, 1), None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap();
    assert!(!first.applied);
    let before = received().await;
    assert!(before > 0.0);
    let again = c.push(PushId::unjoined(0, 0, 1), None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap();
    assert!(again.replayed && !again.applied, "{again:?}");
    let other = c.push(PushId::unjoined(0, 0, 2), None, &l, &grad(&l, 1), GradDtype::F32).await.unwrap_err();
    assert_eq!(other.reason(), Some("already_contributed"));
    assert_eq!(received().await, before, "neither body was read");
    let closing = c.push(PushId::unjoined(1, 0, 1), None, &l, &grad(&l, 1), GradDtype::F32).await.unwrap();
    assert!(closing.applied && closing.version == 1);
    assert!(received().await > before, "a push that needs its gradient reads it");
}

/// A leave's buffers (`wire::buffers`): a refused body leaves the worker training and keeps
/// nothing; the last leave's buffers are kept next to the checkpoints and written into the final
/// model after the PS's tensors, where `checkpoint::decode` still reads the model and
/// `checkpoint::buffer_tensors` the buffers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_leaves_buffers_go_into_the_final_model_and_a_bad_set_changes_nothing() {
    use foresight_ps::store::checkpoint;
    use foresight_ps::wire::buffers;

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(Algorithm::Asgd, 2);
    cfg.checkpoint_dir = Some(dir.path().join("ckpt"));
    cfg.output_dir = Some(dir.path().join("out"));
    let ps = start(cfg).await;
    let (c, l) = (client(&ps), layout());
    c.register(&l, &init(&l)).await.unwrap();
    let (j0, j1) = (c.join(0, None).await.unwrap(), c.join(1, None).await.unwrap());
    let set = |mean: f32, count: i64| {
        let tensors = vec![
            (
                "bn.running_mean".to_string(),
                "F32".to_string(),
                vec![2],
                [mean, -mean].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            ("bn.num_batches_tracked".to_string(), "I64".to_string(), vec![], count.to_le_bytes().to_vec()),
        ];
        let aliases = BTreeMap::from([("head.weight".to_string(), "fc.weight".to_string())]);
        bytes::Bytes::from(buffers::body(&tensors, &aliases))
    };

    let nan = set(f32::NAN, 1);
    let e = c.leave(0, j0.generation, Some(nan)).await.unwrap_err();
    assert_eq!(e.reason(), Some("malformed_body"), "{e}");
    assert!(e.to_string().contains("non-finite"), "{e}");
    let trained = buffers::body(&[("fc.weight".into(), "F32".into(), vec![1], vec![0; 4])], &BTreeMap::new());
    let e = c.leave(0, j0.generation, Some(trained.into())).await.unwrap_err();
    assert!(e.to_string().contains("also a trained tensor"), "{e}");
    let store = ps.state.store().unwrap().clone();
    assert!(
        !store.all_finished() && !dir.path().join("ckpt/buffers.safetensors").exists(),
        "nothing changed"
    );

    assert_eq!(c.leave(0, j0.generation, Some(set(1.0, 10))).await.unwrap(), None);
    assert!(dir.path().join("ckpt/buffers.safetensors").exists(), "kept where a restarted PS finds them");
    let last =
        c.leave(1, j1.generation, Some(set(2.0, 20))).await.unwrap().expect("the last leave finalizes");

    let bytes = std::fs::read(last.path.unwrap()).unwrap();
    let (layout, data, _) = checkpoint::decode(&bytes).unwrap();
    assert_eq!(layout, l, "the PS's own tensors read as before");
    let kept = checkpoint::buffer_tensors(&bytes).unwrap();
    let names: Vec<_> = kept.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(names, ["head.weight", "bn.running_mean", "bn.num_batches_tracked"]);
    let fc = l.iter().find(|(t, _)| t.name == "fc.weight").unwrap().1;
    assert_eq!(
        kept[0].3,
        bytemuck::cast_slice::<f32, u8>(&data.params[fc]),
        "the alias holds the final fc.weight"
    );
    assert_eq!(kept[1].3, bytemuck::cast_slice::<f32, u8>(&[2.0f32, -2.0]), "the last leave's set");
    assert_eq!(kept[2].3, 20i64.to_le_bytes());
}

/// A PS that is alive but stuck: it accepts connections and never answers. Its URL, and the task
/// that holds it (abort it when done).
async fn stuck_ps() -> (String, tokio::task::JoinHandle<()>) {
    let stuck = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", stuck.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = stuck.accept().await {
            open.push(socket); // read nothing, answer nothing, close nothing
        }
    });
    (url, held)
}

/// A process on the PS's port that answers JSON without end (a job's own sidecar, a custom PS
/// image): the operator reads every job's `/v1/status` and `/v1/finalize` through this client,
/// so an answer above `MAX_JSON_ANSWER` fails the call, with or without a Content-Length,
/// instead of being read into memory. A real HTTP/2 server on loopback plays that process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_larger_than_any_ps_sends_fails_the_call_instead_of_filling_memory() {
    use axum::body::Body;
    use foresight_ps::client::MAX_JSON_ANSWER;

    // 64 KiB chunks of a JSON string that never ends within the limit.
    let chunks = || {
        let mut first = true;
        futures_util::stream::iter(std::iter::from_fn(move || {
            let chunk =
                if std::mem::take(&mut first) { "{\"a\":\"".to_string() } else { "x".repeat(64 << 10) };
            Some(Ok::<_, std::io::Error>(chunk))
        }))
        .take(2 * MAX_JSON_ANSWER / (64 << 10))
    };
    use futures_util::StreamExt;
    let app = axum::Router::new()
        .route("/v1/status", axum::routing::get(move || async move { Body::from_stream(chunks()) }))
        .route(
            "/v1/finalize",
            axum::routing::post(|| async { format!("{{\"a\":\"{}\"}}", "x".repeat(2 * MAX_JSON_ANSWER)) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let c = PsClient::new(&url, Some(TOKEN.into())).unwrap();

    let streamed = c.status().await.unwrap_err();
    assert!(matches!(streamed, ClientError::AnswerTooLarge { .. }), "{streamed}");
    assert!(!streamed.is_transient(), "not retried: {streamed}");
    let sized = c.finalize().await.unwrap_err();
    assert!(
        matches!(sized, ClientError::AnswerTooLarge { bytes, .. } if bytes > MAX_JSON_ANSWER as u64),
        "refused by its Content-Length: {sized}"
    );
    server.abort();
}

/// A redirect is never followed: a tenant's image answering on the PS port cannot send the
/// operator's calls (with its control token) to another address (issue #48).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_from_a_ps_is_not_followed() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let elsewhere = axum::Router::new().fallback(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async { "{}" }
    });
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://{}/v1/status", other.local_addr().unwrap());
    let other_server = tokio::spawn(async move { axum::serve(other, elsewhere).await.unwrap() });
    let app =
        axum::Router::new().route(
            "/v1/status",
            axum::routing::get(move || {
                let target = target.clone();
                async move {
                    (axum::http::StatusCode::TEMPORARY_REDIRECT, [(axum::http::header::LOCATION, target)])
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let c = PsClient::new(&url, Some(TOKEN.into())).unwrap();
    let e = c.status().await.unwrap_err();
    assert!(e.to_string().contains("307"), "{e}");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the redirect was followed");
    server.abort();
    other_server.abort();
}

/// A short call (join, status, report, heartbeat, scale) to a stuck PS fails at its deadline as
/// a transient error, which the worker retries until its own deadline and then names; before,
/// it waited for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_call_to_a_stuck_ps_fails_at_its_deadline_instead_of_hanging() {
    use foresight_ps::client::SHORT_CALL_DEADLINE;

    let (url, held) = stuck_ps().await;
    let c = PsClient::new(&url, Some(TOKEN.into())).unwrap();
    let started = std::time::Instant::now();
    let e = c.join(0, None).await.unwrap_err();
    let took = started.elapsed();
    held.abort();
    assert!(e.is_transient(), "retried by the worker: {e}");
    assert!(e.to_string().contains(&url), "names the PS: {e}");
    assert!(took >= SHORT_CALL_DEADLINE && took < SHORT_CALL_DEADLINE * 2, "{took:?}");
}

/// The same stuck PS for the calls that carry a model: a push and a pull fail at their
/// transfer deadline (the floor, here 1 s, plus the body at the minimum rate) as transient
/// errors naming the PS, where they used to wait for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_or_pull_to_a_stuck_ps_fails_at_its_transfer_deadline() {
    let (url, held) = stuck_ps().await;
    let floor = Duration::from_secs(1);
    let c = PsClient::new(&url, Some(TOKEN.into())).unwrap().with_transfer_deadline_floor(floor);
    let l = layout();
    let expected = ExpectedModel::new(l.clone());
    let timed = |what: &str, started: std::time::Instant, e: ClientError| {
        let took = started.elapsed();
        assert!(e.is_transient(), "{what}: retried by the worker: {e}");
        assert!(e.to_string().contains(&url), "{what}: names the PS: {e}");
        assert!(took >= floor && took < floor * 3, "{what}: {took:?}");
    };
    let started = std::time::Instant::now();
    let e = c.push(PushId::unjoined(0, 0, 1), None, &l, &grad(&l, 0), GradDtype::F32).await.unwrap_err();
    timed("push", started, e);
    let started = std::time::Instant::now();
    let e = c.pull_expecting(0, None, Duration::ZERO, Some(&expected), Vec::new()).await.unwrap_err();
    timed("pull", started, e);
    held.abort();
}

/// The memory plan follows the job's worker count: push slots are recomputed when the job is
/// scaled (here the cap of one per worker moves them), and `/v1/status` says what the plan is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_plan_is_recomputed_when_the_job_is_scaled() {
    let mut cfg = config(Algorithm::DcAsgdA, 2);
    cfg.memory_limit = Some(1 << 30);
    let ps = start(cfg).await;
    let (c, l) = (client(&ps), layout());
    c.register(&l, &init(&l)).await.unwrap();
    let slots = || async { metric(&scrape(&ps.url).await, "foresight_ps_push_slots", &[]) };
    assert_eq!(slots().await, 2.0);
    c.set_workers(4).await.unwrap();
    assert_eq!(slots().await, 4.0);
    let memory = &c.status().await.unwrap()["memory"];
    assert_eq!(memory["push_slots"], 4);
    assert_eq!(memory["model_bytes"], 4 * l.len() as u64);
    let (peak, resident) =
        (memory["planned_peak_bytes"].as_u64().unwrap(), memory["resident_bytes"].as_u64().unwrap());
    assert_eq!(peak, resident + 4 * 4 * l.len() as u64);
    c.set_workers(1).await.unwrap();
    assert_eq!(slots().await, 1.0);
}
