//! The workers' client over TLS: a PS serving a certificate (its own, or one the operator or
//! cert-manager issued), a client that trusts exactly the certificates of its CA file.

mod support;

use std::time::Duration;

use foresight_ps::client::{ClientError, ClientTls, GradDtype, PsClient, PushId};
use foresight_ps::optimizer::Algorithm;
use foresight_ps::server::ConnectionLimits;
use support::{TOKEN, ca_signed_cert, config, grad, init, layout, start_with};

/// Register, pull and push over https://, HTTP/2 negotiated by ALPN: the model moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_the_certificate_trains_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (files, ca) = ca_signed_cert(dir.path());
    let ps = start_with(config(Algorithm::DcAsgdA, 1), ConnectionLimits::default(), Some(&files)).await;
    assert!(ps.url.starts_with("https://"), "{}", ps.url);
    let tls = ClientTls::from_pem_file(&ca).unwrap();
    let c = PsClient::for_shards(&ps.url, Some(TOKEN.into()), Some(&tls)).unwrap().remove(0);
    let l = layout();
    assert!(c.register(&l, &init(&l)).await.unwrap());
    let before = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    let reply =
        c.push(PushId::unjoined(0, before.version, 1), None, &l, &grad(&l, 1), GradDtype::F32).await.unwrap();
    assert!(reply.applied);
    let after = c.pull(0, None, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(after.version, before.version + 1);
    assert_ne!(after.values, before.values);
}

/// A client that trusts another certificate does not talk to the PS: the handshake fails and
/// nothing reaches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_certificate_is_refused_by_its_own_check() {
    let (served, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (files, _) = ca_signed_cert(served.path());
    let (_, stranger) = ca_signed_cert(other.path());
    let ps = start_with(config(Algorithm::DcAsgdA, 1), ConnectionLimits::default(), Some(&files)).await;
    let tls = ClientTls::from_pem_file(&stranger).unwrap();
    let c = PsClient::with_tls(&ps.url, Some(TOKEN.into()), Some(&tls)).unwrap();
    let l = layout();
    let Err(e) = c.register(&l, &init(&l)).await else {
        panic!("registered through an untrusted certificate")
    };
    let chain = format!("{:?}", anyhow::Error::from(e));
    assert!(chain.contains("certificate") || chain.contains("UnknownIssuer"), "{chain}");
    assert!(ps.state.store().is_none(), "the model was registered");
}

/// An https:// URL with nothing to trust, a CA file that is missing or holds no certificate:
/// clear errors before any request.
#[test]
fn tls_misconfigurations_are_named() {
    let Err(e) = PsClient::for_shards("https://ps:8080", None, None) else { panic!("accepted") };
    assert!(e.to_string().contains("FORESIGHT_PS_CA_FILE"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let Err(e) = ClientTls::from_pem_file(&dir.path().join("absent.pem")) else { panic!("accepted") };
    assert!(e.to_string().contains("absent.pem"), "{e}");
    let key_only = dir.path().join("key.pem");
    std::fs::write(
        &key_only,
        "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let Err(e) = ClientTls::from_pem_file(&key_only) else { panic!("accepted") };
    assert!(e.to_string().contains("no certificate"), "{e}");
    assert!(matches!(e, ClientError::Config(_)));
    // An http:// URL needs none.
    PsClient::for_shards("http://ps:8080", None, None).unwrap();
}
