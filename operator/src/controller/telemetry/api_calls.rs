//! Counts the operator's requests to the API server (`foresight_operator_api_requests_total`),
//! as a layer of the kube client's HTTP stack: every request is counted once, whichever part of
//! the operator sent it.

use std::task::{Context, Poll};

use axum::http::{Method, Request};
use prometheus::IntCounterVec;

/// The layer, holding the counter.
#[derive(Clone)]
pub struct CountRequests(pub IntCounterVec);

impl<S> tower::Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted { inner, counter: self.0.clone() }
    }
}

#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    counter: IntCounterVec,
}

impl<S, B> tower::Service<Request<B>> for Counted<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.counter.with_label_values(&[verb(&req)]).inc();
        self.inner.call(req)
    }
}

/// The metric's `verb`: a GET with `watch=true` is a watch; any other GET a get or a list.
fn verb<B>(req: &Request<B>) -> &'static str {
    match *req.method() {
        Method::GET if req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true")) => {
            "watch"
        }
        Method::GET => "get",
        Method::POST => "post",
        Method::PATCH => "patch",
        Method::PUT => "put",
        Method::DELETE => "delete",
        _ => "get",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_is_named_by_its_verb() {
        let req = |m: Method, uri: &str| Request::builder().method(m).uri(uri).body(()).unwrap();
        assert_eq!(
            verb(&req(Method::GET, "/apis/batch/v1/jobs?labelSelector=a&watch=true&timeoutSeconds=290")),
            "watch"
        );
        assert_eq!(verb(&req(Method::GET, "/apis/batch/v1/namespaces/n/jobs/j")), "get");
        assert_eq!(verb(&req(Method::GET, "/api/v1/pods?watch=false")), "get");
        assert_eq!(verb(&req(Method::PATCH, "/apis/apps/v1/namespaces/n/deployments/d")), "patch");
        assert_eq!(verb(&req(Method::DELETE, "/apis/batch/v1/namespaces/n/jobs/j")), "delete");
    }
}
