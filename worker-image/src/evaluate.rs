//! `foresight-worker evaluate`: the held-out loss and accuracy of a saved model (the PS's
//! `model-final.safetensors` or any `ckpt-*.safetensors`). This is the one evaluator of a final
//! model: `foresight run` calls it, and in a cluster it runs from the worker image with the job's
//! environment, so the figure never depends on which worker happened to report last.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use foresight_ps::store::checkpoint;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::Serialize;
use tch::Device;

use crate::data::{self, Dataset};
use crate::exit::permanent;
use crate::model::{Model, ModelSpec};
use crate::train::{evaluate, layout_of, load_params, to_tensors};

/// Evaluate a saved model on the held-out split of a dataset; prints one JSON line (one per
/// snapshot, in version order, with --snapshot-dir).
#[derive(Parser, Debug)]
#[command(name = "foresight-worker evaluate", version)]
pub struct EvaluateArgs {
    /// The model file: model-final.safetensors or a ckpt-*.safetensors the PS wrote.
    #[arg(long, env = "FORESIGHT_EVAL_MODEL_FILE", required_unless_present = "snapshot_dir")]
    model_file: Option<PathBuf>,
    /// Every snapshot-*.safetensors the PS wrote with --snapshot-every, instead of one file
    /// (the dataset is loaded once).
    #[arg(long, conflicts_with = "model_file")]
    snapshot_dir: Option<PathBuf>,
    /// Model: mlp, lenet5, resnet20 or torchscript (as the job trained).
    #[arg(long, env = "FORESIGHT_MODEL", default_value = "mlp")]
    model: String,
    /// TorchScript module file, for --model torchscript.
    #[arg(long, env = "FORESIGHT_MODEL_PATH")]
    model_path: Option<PathBuf>,
    /// Dataset format: mnist, cifar10 or csv.
    #[arg(long, env = "FORESIGHT_DATASET_FORMAT", value_parser = |s: &str| s.parse::<data::Format>())]
    dataset_format: data::Format,
    /// Directory holding the dataset.
    #[arg(long, env = "FORESIGHT_DATASET_PATH")]
    dataset_path: PathBuf,
    /// Fraction held out, for formats without a test split (csv): the job's value.
    #[arg(long, env = "FORESIGHT_HOLDOUT", default_value_t = 0.2)]
    holdout: f64,
    /// The job's seed (it draws the csv holdout).
    #[arg(long, env = "FORESIGHT_SEED", default_value_t = 1)]
    seed: u64,
    /// Training batches run in training mode before evaluating, to recompute BatchNorm running
    /// statistics: the parameter server holds trainable parameters only (0: skip).
    #[arg(long, default_value_t = 50)]
    recalibrate_batches: usize,
}

/// What `evaluate` prints.
#[derive(Debug, Serialize)]
pub struct Evaluation {
    pub model_file: PathBuf,
    /// The model version (updates applied) the file holds.
    pub version: u64,
    pub finalized: bool,
    pub examples: usize,
    pub loss: f64,
    pub accuracy: f64,
}

pub fn run(args: &EvaluateArgs) -> anyhow::Result<Vec<Evaluation>> {
    anyhow::ensure!(args.holdout > 0.0 && args.holdout < 1.0, "holdout must be in (0, 1)");
    let files = match &args.snapshot_dir {
        Some(dir) => snapshot_files(dir).map_err(permanent)?,
        None => vec![args.model_file.clone().context("--model-file or --snapshot-dir is needed")?],
    };
    let spec = ModelSpec::parse(&args.model, args.model_path.as_deref()).map_err(anyhow::Error::msg)?;
    let ds =
        Dataset::load(args.dataset_format, &args.dataset_path, args.seed, args.holdout).map_err(permanent)?;
    let device = Device::cuda_if_available();
    let mut model = Model::build(&spec, ds.train.shape, ds.classes, device).map_err(permanent)?;
    files.iter().map(|file| evaluate_file(args, file, &mut model, &ds, device)).collect()
}

/// The snapshot files in `dir`, in version order (the names carry it zero-padded).
fn snapshot_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading --snapshot-dir {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("snapshot-") && n.ends_with(".safetensors"))
        })
        .collect();
    files.sort();
    anyhow::ensure!(!files.is_empty(), "{} holds no snapshot-*.safetensors", dir.display());
    Ok(files)
}

fn evaluate_file(
    args: &EvaluateArgs,
    file: &Path,
    model: &mut Model,
    ds: &Dataset,
    device: Device,
) -> anyhow::Result<Evaluation> {
    let bytes =
        std::fs::read(file).with_context(|| format!("reading {}", file.display())).map_err(permanent)?;
    let (layout, saved, _) =
        checkpoint::decode(&bytes).map_err(|why| permanent(anyhow::anyhow!("{}: {why}", file.display())))?;
    let params = model.parameters()?;
    if layout_of(&params)? != layout {
        return Err(permanent(anyhow::anyhow!(
            "{} holds a model whose tensors differ from --model {}'s",
            file.display(),
            args.model
        )));
    }
    load_params(&params, &saved.params);
    // A final model holds the last worker's buffers, which that worker evaluated: the file is
    // scored as it is. A file without them (a snapshot, an older final model) is recalibrated.
    let buffers = checkpoint::buffer_tensors(&bytes)
        .map_err(|why| permanent(anyhow::anyhow!("{}: {why}", file.display())))?;
    if buffers.is_empty() {
        recalibrate(model, ds, args.seed, args.recalibrate_batches, device)?;
    } else {
        model.load_buffers(&buffers).with_context(|| format!("{}", file.display())).map_err(permanent)?;
    }
    let (loss, accuracy) = evaluate(model, &ds.test, device)?;
    Ok(Evaluation {
        model_file: file.to_path_buf(),
        version: saved.version,
        finalized: saved.finalized,
        examples: ds.test.len(),
        loss,
        accuracy,
    })
}

/// Forward passes in training mode (no gradients) over `batches` seeded training batches, so
/// that BatchNorm layers hold statistics of the trained weights instead of their initial (0, 1).
/// Models without BatchNorm are left as they were.
fn recalibrate(
    model: &mut Model,
    ds: &Dataset,
    seed: u64,
    batches: usize,
    device: Device,
) -> anyhow::Result<()> {
    if batches == 0 || !model.has_buffers() {
        return Ok(());
    }
    let _guard = tch::no_grad_guard();
    let mut order: Vec<usize> = (0..ds.train.len()).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    for idx in order.chunks(64).take(batches) {
        let (xs, _) = to_tensors(&ds.train.select(idx));
        let _logits = model.forward(&xs.to_device(device), true)?;
    }
    Ok(())
}
