//! What a local run measured: the time series behind the plot and `summary.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use foresight_ps::server::SnapshotRecord;
pub use foresight_ps::wire::progress::WorkerEvent;
use serde::{Deserialize, Serialize};

use crate::api::TrainingJobSpec;

/// Per-worker progress over time.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// (seconds since start, worker, loss of its last batch)
    pub loss: Vec<(f64, usize, f64)>,
    /// (seconds since start, worker, held-out accuracy after an epoch)
    pub accuracy: Vec<(f64, usize, f64)>,
    epochs: BTreeMap<usize, f64>,
    steps: BTreeMap<usize, u64>,
    last_accuracy: Option<f64>,
}

impl History {
    pub fn record(&mut self, t: f64, ev: &WorkerEvent) {
        match *ev {
            WorkerEvent::Progress { worker, epoch, step, loss, .. } => {
                self.loss.push((t, worker, loss));
                self.epochs.insert(worker, epoch);
                self.steps.insert(worker, step);
            }
            WorkerEvent::Eval { worker, epoch, accuracy, .. } => {
                self.accuracy.push((t, worker, accuracy));
                self.epochs.insert(worker, epoch as f64);
                self.last_accuracy = Some(accuracy);
            }
            WorkerEvent::Done { .. } => {}
        }
    }

    pub fn mean_epoch(&self, workers: usize) -> f64 {
        self.epochs.values().sum::<f64>() / workers.max(1) as f64
    }

    /// The progress bar's message: epoch, step, loss, accuracy, staleness p50/p99.
    pub fn line(&self, status: Option<&serde_json::Value>) -> String {
        let loss = self.loss.last().map_or("-".into(), |l| format!("{:.3}", l.2));
        let acc = self.last_accuracy.map_or("-".into(), |a| format!("{:.1}%", a * 100.0));
        let steps: u64 = self.steps.values().sum();
        let (p50, p99) = status
            .map(|s| {
                (s["staleness"]["p50"].as_u64().unwrap_or(0), s["staleness"]["p99"].as_u64().unwrap_or(0))
            })
            .unwrap_or_default();
        let epoch = self.epochs.values().cloned().fold(0.0, f64::max);
        format!("{epoch:.2} step {steps} loss {loss} acc {acc} τ p50/p99 {p50}/{p99}")
    }
}

/// `foresight-worker evaluate`'s verdict on the final model (the fields `foresight run` reads).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct FinalEvaluation {
    /// The model version (updates applied) the evaluated file holds.
    pub version: u64,
    /// Held-out examples evaluated.
    pub examples: usize,
    pub loss: f64,
    pub accuracy: f64,
}

/// The PS's own model at one snapshot (`foresight run --snapshot-every`): when it was taken and
/// its held-out figures, by the same evaluator as the final model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CurvePoint {
    /// Updates the model held.
    pub version: u64,
    /// The PS's epoch when it was taken.
    pub epoch: f64,
    /// Seconds since the run started.
    pub seconds: f64,
    pub loss: f64,
    pub accuracy: f64,
}

/// Joins the PS's snapshot records with their evaluations (by version; a snapshot without an
/// evaluation, or the reverse, is left out), in version order.
pub fn curve(
    records: &[SnapshotRecord],
    evaluations: &[FinalEvaluation],
    started_unix_ms: u64,
) -> Vec<CurvePoint> {
    let taken: BTreeMap<u64, &SnapshotRecord> = records.iter().map(|r| (r.version, r)).collect();
    let mut points: Vec<CurvePoint> = evaluations
        .iter()
        .filter_map(|e| {
            let r = taken.get(&e.version)?;
            Some(CurvePoint {
                version: e.version,
                epoch: r.epoch,
                seconds: r.unix_ms.saturating_sub(started_unix_ms) as f64 / 1000.0,
                loss: e.loss,
                accuracy: e.accuracy,
            })
        })
        .collect();
    points.sort_by_key(|p| p.version);
    points.dedup_by_key(|p| p.version);
    points
}

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub job: String,
    pub algorithm: String,
    pub workers: u32,
    pub epochs: u32,
    /// Held-out accuracy of the PS's final model, written after every worker finished and
    /// evaluated by `foresight-worker evaluate`; for a job whose workers run their own program
    /// (`workers.command`), the last worker to finish's evaluation of the PS's model after every
    /// push (`foresight.finish(evaluate=...)`). Each worker's own is in `per_worker`.
    pub accuracy: Option<f64>,
    /// Held-out loss of the same model.
    pub loss: Option<f64>,
    /// The evaluation of the final model: its version and the examples it was evaluated on.
    pub final_model: Option<FinalEvaluation>,
    pub seconds: f64,
    /// Model updates the parameter server applied.
    pub updates: u64,
    pub staleness: serde_json::Value,
    /// Applied gradients by τ bucket (upper bound, cumulative count), from the PS's histogram.
    pub staleness_histogram: Vec<(String, u64)>,
    pub rejected_gradients: BTreeMap<String, u64>,
    /// CPU seconds the PS processes used, every shard's summed, read from /proc just before they
    /// were stopped (a shard started again counts from its restart); absent without /proc.
    pub ps_cpu_seconds: Option<f64>,
    /// Request body bytes the (first shard's) PS received: every push, the model's registration,
    /// reports; measured by the PS (`foresight_ps_received_bytes_total`).
    pub ps_received_bytes: Option<u64>,
    /// Model bytes the (first shard's) PS sent to workers (`foresight_ps_sent_bytes_total`).
    pub ps_sent_bytes: Option<u64>,
    /// Workers' training steps the (first shard's) PS took pushes of
    /// (`foresight_ps_trained_steps_total`).
    pub trained_steps: Option<u64>,
    /// Each worker's steps per exchange at the end (`foresight_ps_local_steps`): with
    /// `adaptiveLocalSteps`, what the PS last told it.
    pub local_steps: BTreeMap<usize, u64>,
    pub model: Option<PathBuf>,
    pub per_worker: Vec<WorkerEvent>,
    /// Held-out accuracy after each epoch: (seconds since start, worker, accuracy).
    pub evaluations: Vec<(f64, usize, f64)>,
    /// Processes that failed and were started again.
    pub restarts: Vec<super::Restart>,
    /// The PS model's held-out figures at its snapshots (empty without `--snapshot-every`).
    pub curve: Vec<CurvePoint>,
}

impl Summary {
    #[allow(clippy::too_many_arguments)]
    pub fn build(
        job: &str,
        spec: &TrainingJobSpec,
        seconds: f64,
        done: Vec<WorkerEvent>,
        status: &serde_json::Value,
        metrics: &str,
        model: Option<PathBuf>,
        final_model: Option<FinalEvaluation>,
        history: &History,
    ) -> Self {
        let mut histogram = Vec::new();
        let mut rejected = BTreeMap::new();
        let mut local_steps = BTreeMap::new();
        // Staleness and refusals: the first shard's (each shard applies every push).
        for (key, value) in samples(metrics) {
            if key.starts_with("foresight_ps_gradient_staleness_bucket") {
                if let Some(le) = label(key, "le") {
                    histogram.push((le, value as u64));
                }
            } else if key.starts_with("foresight_ps_gradients_rejected_total")
                && let Some(reason) = label(key, "reason")
            {
                rejected.insert(reason, value as u64);
            } else if key.starts_with("foresight_ps_local_steps{")
                && let Some(worker) = label(key, "worker").and_then(|w| w.parse().ok())
            {
                local_steps.insert(worker, value as u64);
            }
        }
        Self {
            job: job.to_string(),
            algorithm: spec.optimizer.algorithm().as_str().to_string(),
            workers: spec.workers.replicas,
            epochs: spec.training.epochs,
            accuracy: final_model.as_ref().map(|e| e.accuracy),
            loss: final_model.as_ref().map(|e| e.loss),
            final_model,
            seconds,
            updates: status["version"].as_u64().unwrap_or(0),
            staleness: status["staleness"].clone(),
            staleness_histogram: histogram,
            rejected_gradients: rejected,
            ps_cpu_seconds: None,
            ps_received_bytes: counter(metrics, "foresight_ps_received_bytes_total"),
            ps_sent_bytes: counter(metrics, "foresight_ps_sent_bytes_total"),
            trained_steps: counter(metrics, "foresight_ps_trained_steps_total"),
            local_steps,
            model,
            per_worker: done,
            evaluations: history.accuracy.clone(),
            restarts: Vec::new(),
            curve: Vec::new(),
        }
    }

    pub fn write(&self, out: &Path) -> std::io::Result<()> {
        std::fs::write(out.join("summary.json"), serde_json::to_vec_pretty(self).expect("plain data"))
    }
}

/// The (series key, value) pairs of a Prometheus text exposition, comments left out.
fn samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(|line| {
        let (key, value) = line.rsplit_once(' ')?;
        Some((key, value.parse().ok()?))
    })
}

/// The value of counter `name` (one series, whatever its labels).
fn counter(metrics: &str, name: &str) -> Option<u64> {
    samples(metrics)
        .find(|(key, _)| key.strip_prefix(name).is_some_and(|rest| rest.is_empty() || rest.starts_with('{')))
        .map(|(_, v)| v as u64)
}

/// The value of `name` in a Prometheus series key like `m{a="x",le="2"}`.
fn label(key: &str, name: &str) -> Option<String> {
    let start = key.find(&format!("{name}=\""))? + name.len() + 2;
    let end = key[start..].find('"')? + start;
    Some(key[start..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_by_their_exact_name_with_or_without_labels() {
        let text = "# HELP foresight_ps_received_bytes_total x\nforesight_ps_received_bytes_total_other 5\n\
                    foresight_ps_received_bytes_total{shard=\"0\"} 1234\nforesight_ps_sent_bytes_total 99\n";
        assert_eq!(counter(text, "foresight_ps_received_bytes_total"), Some(1234));
        assert_eq!(counter(text, "foresight_ps_sent_bytes_total"), Some(99));
        assert_eq!(counter(text, "foresight_ps_missing_total"), None);
    }

    #[test]
    fn each_worker_s_local_steps_are_read_from_the_gauge() {
        let metrics = "# HELP foresight_ps_local_steps x\n\
                       foresight_ps_local_steps{job=\"j\",worker=\"1\"} 17\n\
                       foresight_ps_local_steps{job=\"j\",worker=\"0\"} 50\n\
                       foresight_ps_trained_steps_total 670\n";
        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mnist-diloco.yaml");
        let job: crate::api::TrainingJob =
            serde_yaml::from_str(&std::fs::read_to_string(example).unwrap()).unwrap();
        let s = Summary::build(
            "j",
            &job.spec,
            1.0,
            Vec::new(),
            &serde_json::json!({}),
            metrics,
            None,
            None,
            &Default::default(),
        );
        assert_eq!(s.local_steps, BTreeMap::from([(0, 50), (1, 17)]));
        assert_eq!(s.trained_steps, Some(670));
    }

    #[test]
    fn the_curve_joins_snapshots_and_evaluations_by_version() {
        let rec = |version, unix_ms| SnapshotRecord {
            version,
            epoch: version as f64 / 100.0,
            unix_ms,
            file: format!("snapshot-{version:012}.safetensors"),
        };
        let eval =
            |version, accuracy| FinalEvaluation { version, examples: 1000, loss: 1.0 - accuracy, accuracy };
        // A restarted PS wrote version 200 twice; 300 was never evaluated; 400 has no record.
        let records =
            [rec(0, 10_000), rec(100, 12_500), rec(200, 15_000), rec(200, 15_100), rec(300, 17_000)];
        let evals = [eval(200, 0.9), eval(0, 0.1), eval(100, 0.5), eval(400, 0.95)];
        let points = curve(&records, &evals, 10_000);
        let got: Vec<(u64, f64, f64)> = points.iter().map(|p| (p.version, p.seconds, p.accuracy)).collect();
        assert_eq!(got, vec![(0, 0.0, 0.1), (100, 2.5, 0.5), (200, 5.1, 0.9)]);
        assert_eq!(points[2].epoch, 2.0);
    }
}
