//! Checkpoints: the model and optimizer state as one safetensors file, written atomically.
//!
//! File `ckpt-<version, 12 digits>.safetensors` holds the model's tensors under their own names
//! and the optimizer state as `optimizer.mean_square.<name>` and `optimizer.momentum.<name>`,
//! and Delayed Nesterov's pending sum as one flat tensor `optimizer.pending` (a PS from before
//! it was kept refuses such a checkpoint: "unexpected tensor").
//! The metadata records the format, version, epoch, algorithm and hyperparameters (JSON).
//! Writes go to a temporary file that is fsynced, renamed into place, and the directory
//! fsynced, so a crash leaves either the old set of files or the new one.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{MAX_EPOCH, MAX_VERSION, MAX_WORKERS};
use crate::optimizer::{Hyper, OptimizerState};
use crate::wire::buffers::Buffers;
use crate::wire::{self, Layout, TensorSpec, WireError};

pub const FORMAT: &str = "foresight-checkpoint/1";
const MS_PREFIX: &str = crate::wire::STATE_PREFIXES[0];
const MOM_PREFIX: &str = crate::wire::STATE_PREFIXES[1];

/// A consistent copy of the model and optimizer state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointData {
    pub version: u64,
    pub epoch: f64,
    pub params: Vec<f32>,
    pub state: OptimizerState,
    /// The job was finalized: a restored PS stays read-only.
    pub finalized: bool,
    /// Per worker, the seq of its newest update contained in `params`: a retry of it after a
    /// restart is answered as a replay instead of being applied twice.
    pub worker_seqs: Vec<Option<u64>>,
    /// Per worker, its current generation ([`crate::store::Store::join`]), so that an old
    /// incarnation stays refused after a restart.
    pub worker_generations: Vec<u64>,
    /// The job's worker count M (`PUT /v1/workers` changes it): a restarted PS keeps the scaled
    /// membership instead of its command line's. 0: unknown (written before it was kept).
    pub workers: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a valid checkpoint: {why}")]
    Invalid { path: PathBuf, why: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { path: path.to_path_buf(), source }
}

/// Writes a checkpoint (or, with empty optimizer state, a plain model file) to `out` straight
/// from `data`: the header, then the model's and the optimizer state's bytes as they lie in
/// memory. No copy of the model is made, so a checkpoint of a model of S bytes costs the PS the
/// header and `out`'s buffer, not 2–3 × S more.
pub fn encode_to(
    out: &mut impl Write,
    layout: &Layout,
    hyper: &Hyper,
    data: &CheckpointData,
) -> std::io::Result<()> {
    encode_with_buffers(out, layout, hyper, data, &Buffers::default())
}

/// [`encode_to`] with the model's untrained `state_dict` entries after everything else (the
/// final model: `buffers` is the last worker's, [`Buffers`]); the metadata's
/// [`BUFFER_TENSORS_KEY`] counts them, so that [`decode`] can tell them from the PS's tensors.
pub fn encode_with_buffers(
    out: &mut impl Write,
    layout: &Layout,
    hyper: &Hyper,
    data: &CheckpointData,
    buffers: &Buffers,
) -> std::io::Result<()> {
    let mut specs: Vec<TensorSpec> = layout.tensors().to_vec();
    let mut slices: Vec<&[f32]> = vec![&data.params];
    for (prefix, state) in [(MS_PREFIX, &data.state.mean_square), (MOM_PREFIX, &data.state.momentum)] {
        if !state.is_empty() {
            specs.extend(
                layout
                    .tensors()
                    .iter()
                    .map(|t| TensorSpec { name: format!("{prefix}{}", t.name), ..t.clone() }),
            );
            slices.push(state);
        }
    }
    if !data.state.pending.is_empty() {
        specs.push(TensorSpec { name: wire::PENDING_TENSOR.into(), shape: vec![data.state.pending.len()] });
        slices.push(&data.state.pending);
    }
    let composite = Layout::new(specs).expect("prefixed names of a valid layout are valid");
    let meta = BTreeMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("version".to_string(), data.version.to_string()),
        ("epoch".to_string(), data.epoch.to_string()),
        ("algorithm".to_string(), hyper.algorithm.to_string()),
        ("hyperparameters".to_string(), serde_json::to_string(hyper).expect("plain data")),
        ("model_tensors".to_string(), layout.tensors().len().to_string()),
        ("finalized".to_string(), data.finalized.to_string()),
        ("workers".to_string(), data.workers.to_string()),
        ("worker_seqs".to_string(), serde_json::to_string(&data.worker_seqs).expect("plain data")),
        (
            "worker_generations".to_string(),
            serde_json::to_string(&data.worker_generations).expect("plain data"),
        ),
    ]);
    let (extra, extra_data) = buffers.final_entries(layout, &data.params, composite.len() * 4);
    let mut meta = meta;
    if !extra.is_empty() {
        meta.insert(BUFFER_TENSORS_KEY.into(), extra.len().to_string());
    }
    out.write_all(&wire::header_with(&composite, wire::WireDtype::F32, &extra, &meta))?;
    for slice in slices {
        out.write_all(bytemuck::cast_slice(slice))?;
    }
    for bytes in extra_data {
        out.write_all(bytes)?;
    }
    Ok(())
}

/// The metadata key counting the final model's buffers, the last tensors of the file.
pub const BUFFER_TENSORS_KEY: &str = "buffer_tensors";

/// Decodes a checkpoint into the model layout, its data and the hyperparameters it was written
/// with. Each part (model, MeanSquare, momentum) is read from `bytes` straight into its own
/// vector: a restore holds the file and one copy of the model and state, no more.
pub fn decode(bytes: &[u8]) -> Result<(Layout, CheckpointData, Hyper), String> {
    let parsed = wire::parse(bytes).map_err(|e: WireError| e.to_string())?;
    let meta = &parsed.metadata;
    if meta.get("format").map(String::as_str) != Some(FORMAT) {
        return Err(format!("metadata format is {:?}, expected {FORMAT:?}", meta.get("format")));
    }
    let field = |k: &str| meta.get(k).ok_or_else(|| format!("metadata lacks {k:?}"));
    let version: u64 = field("version")?.parse().map_err(|e| format!("bad version: {e}"))?;
    if version > MAX_VERSION {
        return Err(format!("version {version} is above the largest a model can have ({MAX_VERSION})"));
    }
    let epoch: f64 = field("epoch")?.parse().map_err(|e| format!("bad epoch: {e}"))?;
    // NaN or infinity would reach every update's learning rate after a restore.
    if !(epoch.is_finite() && (0.0..=MAX_EPOCH).contains(&epoch)) {
        return Err(format!("bad epoch {epoch}: a number in [0, {MAX_EPOCH:e}], as a push's"));
    }
    let hyper: Hyper =
        serde_json::from_str(field("hyperparameters")?).map_err(|e| format!("bad hyperparameters: {e}"))?;
    // These were added after the first checkpoints were written: absent means "not finalized,
    // no seqs or generations known".
    let finalized = meta.get("finalized").is_some_and(|v| v == "true");
    let worker_seqs: Vec<Option<u64>> = match meta.get("worker_seqs") {
        Some(s) => serde_json::from_str(s).map_err(|e| format!("bad worker_seqs: {e}"))?,
        None => Vec::new(),
    };
    let worker_generations: Vec<u64> = match meta.get("worker_generations") {
        Some(s) => serde_json::from_str(s).map_err(|e| format!("bad worker_generations: {e}"))?,
        None => Vec::new(),
    };
    if worker_seqs.len() > MAX_WORKERS || worker_generations.len() > MAX_WORKERS {
        return Err(format!("worker_seqs or worker_generations longer than {MAX_WORKERS} workers"));
    }
    let workers: usize = match meta.get("workers") {
        Some(w) => {
            w.parse().ok().filter(|w| *w <= MAX_WORKERS).ok_or_else(|| format!("bad workers {w:?}"))?
        }
        None => 0,
    };
    let n_model: usize = field("model_tensors")?.parse().map_err(|e| format!("bad model_tensors: {e}"))?;
    let n_buffers: usize = match meta.get(BUFFER_TENSORS_KEY) {
        Some(n) => n.parse().map_err(|e| format!("bad {BUFFER_TENSORS_KEY}: {e}"))?,
        None => 0,
    };
    // A final model's buffers are the user's, not the PS's: read by the user's own code.
    let Some(kept) = parsed.tensors.len().checked_sub(n_buffers) else {
        return Err(format!("{BUFFER_TENSORS_KEY} {n_buffers} is more than the file's tensors"));
    };
    let tensors = &parsed.tensors[..kept];
    if n_model == 0 || n_model > tensors.len() {
        return Err(format!("model_tensors {n_model} does not fit {} tensors", tensors.len()));
    }
    let specs = tensors[..n_model]
        .iter()
        .map(|(name, _, shape, _)| TensorSpec { name: name.clone(), shape: shape.clone() });
    let layout = Layout::model(specs.collect()).map_err(|e| e.to_string())?;
    let params = read_part(&layout, &tensors[..n_model], "")?;
    let mut state = OptimizerState::default();
    let mut rest = &tensors[n_model..];
    for (prefix, slot) in [(MS_PREFIX, &mut state.mean_square), (MOM_PREFIX, &mut state.momentum)] {
        if rest.first().is_some_and(|(name, ..)| name.starts_with(prefix)) {
            if rest.len() < n_model {
                return Err(format!("optimizer state {prefix}* does not match the model's tensors"));
            }
            *slot = read_part(&layout, &rest[..n_model], prefix)?;
            rest = &rest[n_model..];
        }
    }
    if let Some((name, ..)) = rest.first()
        && name == wire::PENDING_TENSOR
    {
        let flat = Layout::new(vec![TensorSpec { name: name.clone(), shape: vec![layout.len()] }])
            .map_err(|e| e.to_string())?;
        state.pending =
            read_part(&flat, &rest[..1], "").map_err(|e| format!("{}: {e}", wire::PENDING_TENSOR))?;
        rest = &rest[1..];
    }
    if let Some((name, ..)) = rest.first() {
        return Err(format!("unexpected tensor {name:?}"));
    }
    let data =
        CheckpointData { version, epoch, params, state, finalized, worker_seqs, worker_generations, workers };
    Ok((layout, data, hyper))
}

/// A final model's buffers (the last worker's, written after the PS's own tensors; empty for
/// a checkpoint or a file written before buffers were kept).
pub fn buffer_tensors(bytes: &[u8]) -> Result<Vec<wire::ParsedTensor<'_>>, String> {
    let mut parsed = wire::parse(bytes).map_err(|e| e.to_string())?;
    let n: usize = match parsed.metadata.get(BUFFER_TENSORS_KEY) {
        Some(n) => n.parse().map_err(|e| format!("bad {BUFFER_TENSORS_KEY}: {e}"))?,
        None => 0,
    };
    let Some(first) = parsed.tensors.len().checked_sub(n) else {
        return Err(format!("{BUFFER_TENSORS_KEY} {n} is more than the file's tensors"));
    };
    Ok(parsed.tensors.split_off(first))
}

/// The tensors of one part of a checkpoint, named `prefix` + the model's names with the model's
/// shapes, F32 and finite, as one vector in `layout`'s order.
fn read_part(layout: &Layout, part: &[wire::ParsedTensor<'_>], prefix: &str) -> Result<Vec<f32>, String> {
    let mismatch = || format!("optimizer state {prefix}* does not match the model's tensors");
    let renamed = part
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            let name = name.strip_prefix(prefix).ok_or_else(mismatch)?;
            Ok((name.to_string(), *dtype, shape.clone(), *bytes))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut out = vec![0f32; layout.len()];
    let part = wire::Parsed { tensors: renamed, metadata: Default::default() };
    wire::fill_model(layout, &part, &mut out)
        .map_err(|e| if prefix.is_empty() { e.to_string() } else { format!("{}: {e}", mismatch()) })?;
    Ok(out)
}

/// A directory of checkpoints, newest kept.
pub struct CheckpointDir {
    dir: PathBuf,
    keep: usize,
}

impl CheckpointDir {
    /// The directory, created if needed. A checkpoint's temporary file that a killed process left
    /// (as large as the model) is removed: one PS process owns the directory at a time.
    pub fn new(dir: impl Into<PathBuf>, keep: usize) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        for entry in fs::read_dir(&dir).map_err(io(&dir))? {
            let path = entry.map_err(io(&dir))?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with(".ckpt-") && name.ends_with(".tmp") {
                let bytes = fs::metadata(&path).map_or(0, |m| m.len());
                fs::remove_file(&path).map_err(io(&path))?;
                tracing::warn!(path = %path.display(), bytes, "removed a checkpoint's leftover temporary file");
            }
        }
        Ok(Self { dir, keep: keep.max(1) })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn file_for(&self, version: u64) -> PathBuf {
        self.dir.join(format!("ckpt-{version:012}.safetensors"))
    }

    /// Checkpoint files, newest version first.
    pub fn list(&self) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let entry = entry.map_err(io(&self.dir))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(v) = name.strip_prefix("ckpt-").and_then(|s| s.strip_suffix(".safetensors"))
                && let Ok(v) = v.parse::<u64>()
            {
                out.push((v, entry.path()));
            }
        }
        out.sort_by_key(|(v, _)| std::cmp::Reverse(*v));
        Ok(out)
    }

    /// Writes a checkpoint atomically, then keeps it and the `keep − 1` newest older ones. A file
    /// of a higher version than this one is not this model's future but an earlier run's past
    /// (this PS was seeded below it): it goes too, or the next restart would restore it.
    pub fn write(
        &self,
        layout: &Layout,
        hyper: &Hyper,
        data: &CheckpointData,
    ) -> Result<PathBuf, CheckpointError> {
        let path = self.file_for(data.version);
        write_atomic(&path, |f| encode_to(f, layout, hyper, data))?;
        let (newer, older): (Vec<_>, Vec<_>) = self
            .list()?
            .into_iter()
            .filter(|(v, _)| *v != data.version)
            .partition(|(v, _)| *v > data.version);
        for (v, old) in newer.into_iter().chain(older.into_iter().skip(self.keep - 1)) {
            if v > data.version {
                tracing::warn!(path = %old.display(), version = data.version, "removing a checkpoint of a higher version from an earlier run");
            }
            fs::remove_file(&old).map_err(io(&old))?;
        }
        Ok(path)
    }

    /// The newest checkpoint that decodes. One that does not is renamed `<name>.corrupt` (kept
    /// for a post-mortem, out of every later listing and pruning) and the previous one tried.
    pub fn load_newest(&self) -> Result<Option<(PathBuf, Layout, CheckpointData, Hyper)>, CheckpointError> {
        for (_, path) in self.list()? {
            let bytes = fs::read(&path).map_err(io(&path))?;
            match decode(&bytes) {
                Ok((layout, data, hyper)) => return Ok(Some((path, layout, data, hyper))),
                Err(why) => {
                    let aside = path.with_extension("safetensors.corrupt");
                    fs::rename(&path, &aside).map_err(io(&path))?;
                    tracing::error!(path = %aside.display(), %why, "set a corrupt checkpoint aside, trying the previous one")
                }
            }
        }
        Ok(None)
    }
}

/// Writes what `write` streams (through a 1 MiB buffer) to `path` via a temporary file, fsync
/// and rename, then fsyncs the directory.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<fs::File>) -> std::io::Result<()>,
) -> Result<(), CheckpointError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        std::process::id()
    ));
    let written = (|| {
        let mut f = std::io::BufWriter::with_capacity(1 << 20, fs::File::create(&tmp)?);
        write(&mut f)?;
        f.into_inner().map_err(|e| e.into_error())?.sync_all()
    })();
    if let Err(e) = written {
        // A full volume must not also lose the space the partial file took.
        let _ = fs::remove_file(&tmp);
        return Err(io(&tmp)(e));
    }
    fs::rename(&tmp, path).map_err(io(path))?;
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    Ok(())
}

/// The final model's file name in the output directory.
pub const FINAL_MODEL_FILE: &str = "model-final.safetensors";

/// Keeps an earlier run's final model: `dir/model-final.safetensors`, if there is one, is
/// renamed `model-final.before-<its modification time, Unix seconds>[-n].safetensors` (a name no
/// file has yet), so that the final model written next does not replace it. Returns where it
/// went. An output claim outlives its job, and a job made again under the same name writes to
/// the same directory: its model must not silently take the place of the one before.
pub fn keep_earlier_final_model(dir: &Path) -> Result<Option<PathBuf>, CheckpointError> {
    let path = dir.join(FINAL_MODEL_FILE);
    let modified = match fs::metadata(&path) {
        Ok(m) => m.modified().ok(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    let seconds =
        modified.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
    let kept = (0..)
        .map(|n| match n {
            0 => dir.join(format!("model-final.before-{seconds}.safetensors")),
            n => dir.join(format!("model-final.before-{seconds}-{n}.safetensors")),
        })
        .find(|p| !p.exists())
        .expect("some suffix is free");
    fs::rename(&path, &kept).map_err(io(&path))?;
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    Ok(Some(kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_final_model_is_kept_under_a_name_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(keep_earlier_final_model(dir.path()).unwrap(), None, "nothing to keep");
        for (run, expect_suffix) in [("first", ""), ("second", "-1")] {
            std::fs::write(dir.path().join(FINAL_MODEL_FILE), run).unwrap();
            let kept = keep_earlier_final_model(dir.path()).unwrap().expect("kept");
            let name = kept.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.starts_with("model-final.before-")
                    && name.ends_with(&format!("{expect_suffix}.safetensors")),
                "{name}"
            );
            assert_eq!(std::fs::read_to_string(&kept).unwrap(), run, "{name} holds that run's model");
            assert!(!dir.path().join(FINAL_MODEL_FILE).exists());
        }
    }

    fn encode(layout: &Layout, hyper: &Hyper, data: &CheckpointData) -> Vec<u8> {
        let mut out = Vec::new();
        encode_to(&mut out, layout, hyper, data).expect("writing to a Vec cannot fail");
        out
    }
    use crate::optimizer::Algorithm;

    fn sample(momentum: bool) -> (Layout, Hyper, CheckpointData) {
        let layout = Layout::new(vec![
            TensorSpec { name: "a".into(), shape: vec![3] },
            TensorSpec { name: "b".into(), shape: vec![2, 2] },
        ])
        .unwrap();
        let mut hyper = Hyper::new(Algorithm::DcAsgdA, 0.1);
        hyper.momentum = if momentum { 0.9 } else { 0.0 };
        // With momentum, Delayed Nesterov's pending sum too.
        hyper.momentum_delay = if momentum { 4 } else { 1 };
        let mut state = OptimizerState::new(&hyper, 7);
        state.mean_square.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        state.momentum.iter_mut().for_each(|x| *x = -1.0);
        state.pending.iter_mut().enumerate().for_each(|(i, x)| *x = 0.5 - i as f32);
        assert_eq!(state.pending.len(), if momentum { 7 } else { 0 });
        let data = CheckpointData {
            version: 42,
            epoch: 1.5,
            params: (0..7).map(|i| i as f32 * 0.1).collect(),
            state,
            finalized: momentum,
            worker_seqs: vec![Some(3), None],
            worker_generations: vec![2, 0],
            workers: 2,
        };
        (layout, hyper, data)
    }

    #[test]
    fn round_trips_model_state_and_hyperparameters() {
        for momentum in [false, true] {
            let (layout, hyper, data) = sample(momentum);
            let (l2, d2, h2) = decode(&encode(&layout, &hyper, &data)).unwrap();
            assert_eq!((l2, d2, h2), (layout.clone(), data.clone(), hyper.clone()));
        }
    }

    /// Metadata that would poison the restored PS is refused, not restored.
    #[test]
    fn refuses_a_non_finite_epoch_and_per_worker_lists_beyond_the_worker_limit() {
        let (layout, hyper, data) = sample(true);
        for epoch in [f64::NAN, f64::INFINITY, -1.0, 2e9] {
            let bad = CheckpointData { epoch, ..data.clone() };
            let err = decode(&encode(&layout, &hyper, &bad)).unwrap_err();
            assert!(err.contains("bad epoch"), "{err}");
        }
        let bad = CheckpointData { worker_generations: vec![0; MAX_WORKERS + 1], ..data.clone() };
        let err = decode(&encode(&layout, &hyper, &bad)).unwrap_err();
        assert!(err.contains("longer than"), "{err}");
        let bad = CheckpointData { worker_seqs: vec![None; MAX_WORKERS + 1], ..data };
        assert!(decode(&encode(&layout, &hyper, &bad)).is_err());
    }

    #[test]
    fn keeps_the_newest_and_falls_back_past_corrupt_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path(), 2).unwrap();
        let (layout, hyper, mut data) = sample(false);
        for v in [1, 2, 3] {
            data.version = v;
            dir.write(&layout, &hyper, &data).unwrap();
        }
        let versions: Vec<u64> = dir.list().unwrap().into_iter().map(|(v, _)| v).collect();
        assert_eq!(versions, [3, 2]);
        // Truncate the newest: the previous one is restored.
        let newest = dir.list().unwrap()[0].1.clone();
        let bytes = fs::read(&newest).unwrap();
        fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
        let (_, _, restored, _) = dir.load_newest().unwrap().unwrap();
        assert_eq!(restored.version, 2);
        // No temporary files are left behind.
        assert!(
            fs::read_dir(tmp.path()).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp"))
        );
    }

    fn versions(dir: &CheckpointDir) -> Vec<u64> {
        dir.list().unwrap().into_iter().map(|(v, _)| v).collect()
    }

    /// A restore that fell back past a corrupt v9 and a PS seeded below an earlier run's v50:
    /// neither file may shadow or outlive the checkpoints written after, with any `keep`.
    #[test]
    fn files_of_higher_versions_and_corrupt_ones_never_crowd_out_new_checkpoints() {
        for keep in [1, 2] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = CheckpointDir::new(tmp.path(), keep).unwrap();
            let (layout, hyper, mut data) = sample(false);
            data.version = 4;
            dir.write(&layout, &hyper, &data).unwrap();
            fs::write(dir.file_for(9), b"torn").unwrap();
            fs::copy(dir.file_for(4), tmp.path().join("kept")).unwrap();
            let (_, _, restored, _) = dir.load_newest().unwrap().unwrap();
            assert_eq!(restored.version, 4, "keep {keep}");
            assert!(tmp.path().join("ckpt-000000000009.safetensors.corrupt").exists());
            fs::rename(tmp.path().join("kept"), dir.file_for(50)).unwrap();
            for v in [5, 6] {
                data.version = v;
                dir.write(&layout, &hyper, &data).unwrap();
                assert_eq!(versions(&dir)[0], v, "keep {keep}: the new checkpoint is the newest");
            }
            let expected: Vec<u64> = [6, 5, 4].into_iter().take(keep).collect();
            assert_eq!(versions(&dir), expected, "keep {keep}");
            assert_eq!(dir.load_newest().unwrap().unwrap().2.version, 6);
        }
    }

    #[test]
    fn a_failed_write_leaves_no_partial_file_and_the_last_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path(), 1).unwrap();
        let (layout, hyper, data) = sample(false);
        dir.write(&layout, &hyper, &data).unwrap();
        let full = std::io::Error::from_raw_os_error(28); // ENOSPC
        let failed = write_atomic(&dir.file_for(43), |f| {
            f.write_all(&[0u8; 4 << 20])?;
            Err(full)
        });
        assert!(failed.unwrap_err().to_string().contains("No space left on device"));
        let names: Vec<_> = fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [dir.file_for(42).file_name().unwrap()]);
        assert_eq!(dir.load_newest().unwrap().unwrap().2, data);
    }

    #[test]
    fn a_version_no_model_can_reach_is_refused() {
        let (layout, hyper, mut data) = sample(false);
        data.version = u64::MAX;
        assert!(decode(&encode(&layout, &hyper, &data)).unwrap_err().contains("above the largest"));
    }

    #[test]
    fn a_temporary_file_a_killed_process_left_is_removed_at_start_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path(), 2).unwrap();
        let (layout, hyper, data) = sample(false);
        dir.write(&layout, &hyper, &data).unwrap();
        // What write_atomic leaves when its process dies mid-write, and files that are not its.
        let left = tmp.path().join(".ckpt-000000000009.safetensors.4242.tmp");
        fs::write(&left, vec![0u8; 4096]).unwrap();
        for other in ["notes.tmp", ".model-final.safetensors.7.tmp", "model-final.safetensors"] {
            fs::write(tmp.path().join(other), b"x").unwrap();
        }
        let before = fs::read_dir(tmp.path()).unwrap().count();
        let dir = CheckpointDir::new(tmp.path(), 2).unwrap();
        assert!(!left.exists());
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), before - 1);
        assert_eq!(dir.load_newest().unwrap().unwrap().2.version, data.version);
    }

    #[test]
    fn refuses_files_that_are_not_checkpoints() {
        let (layout, _, data) = sample(false);
        let plain = wire::encode_f32(&layout, &data.params, &BTreeMap::new());
        assert!(decode(&plain).unwrap_err().contains("format"));
    }
}
