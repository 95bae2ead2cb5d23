//! Control calls to a job's parameter server: its worker count told, the model finalized.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use crate::api::TrainingJob;
use crate::controller::context::Context;
use crate::controller::decide::status::Finalize;
use crate::controller::observe::ps::PsAddr;
use crate::controller::write::job::publish;

/// Tells the PS the job's worker count when the count it reports (`status`) differs: after a
/// change of workers.replicas, or a PS restarted with its Deployment's original count.
pub(crate) async fn tell_ps_workers(
    ctx: &Context,
    job: &TrainingJob,
    ps: &PsAddr,
    token: &str,
    status: &serde_json::Value,
) {
    let desired = job.spec.workers.replicas;
    let Some(current) = status.get("workers_expected").and_then(serde_json::Value::as_u64) else { return };
    if current == u64::from(desired) {
        return;
    }
    let result = match ps.client(token.to_string()) {
        Ok(c) => match tokio::time::timeout(Duration::from_secs(3), c.set_workers(desired as usize)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("no answer within 3s".into()),
        },
        Err(e) => Err(e.to_string()),
    };
    match result {
        Ok(()) => {
            let message = format!("the parameter server now expects {desired} workers (was {current})");
            tracing::info!(%message, "workers scaled");
            publish(ctx, job, EventType::Normal, "WorkersScaled", "ScaleWorkers", &message).await;
        }
        // The next reconcile tries again; the new workers retry their join meanwhile.
        Err(e) => tracing::warn!(error = %e, desired, "telling the parameter server the worker count"),
    }
}

/// Asks the parameter server to write the final model (when no worker has recorded that the
/// PS wrote it already); gives up `grace` after the workers finished (the job then fails for
/// want of its model rather than keeping the PS forever).
pub(crate) async fn finalize(ps: &PsAddr, token: &str, workers: &Job, grace: Duration) -> Finalize {
    let result = match ps.client(token.to_string()) {
        Ok(client) => match tokio::time::timeout(Duration::from_secs(30), client.finalize()).await {
            Ok(Ok(m)) => return Finalize::Done { version: m.version, path: m.path, earlier: m.earlier },
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 30s".to_string(),
        },
        Err(e) => e.to_string(),
    };
    let finished = workers.status.as_ref().and_then(|s| s.completion_time.as_ref()).map(|t| t.0);
    let waited = finished.map(|t| Timestamp::now().duration_since(t).as_secs_f64()).unwrap_or(0.0);
    if waited > grace.as_secs_f64() {
        Finalize::GaveUp(format!("{result} (gave up after {:.0}s)", waited))
    } else {
        Finalize::Failed(result)
    }
}
