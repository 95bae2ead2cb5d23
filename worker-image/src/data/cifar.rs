//! CIFAR-10 binary batches: data_batch_1..5.bin and test_batch.bin, 1 label byte + 3072 pixels.

use std::path::Path;

use super::{DataError, Dataset, Examples, invalid, read_maybe_gz};

const RECORD: usize = 1 + 3 * 32 * 32;

fn batch(path: &Path) -> Result<Examples, DataError> {
    let bytes = read_maybe_gz(path)?;
    if bytes.is_empty() || bytes.len() % RECORD != 0 {
        return Err(invalid(
            path,
            format!("size {} is not a multiple of the {RECORD}-byte CIFAR-10 record", bytes.len()),
        ));
    }
    let mut ex = Examples { shape: [3, 32, 32], pixels: Vec::with_capacity(bytes.len()), labels: Vec::new() };
    for (i, rec) in bytes.chunks_exact(RECORD).enumerate() {
        if rec[0] > 9 {
            return Err(invalid(path, format!("record {i} has label {}, expected 0..9", rec[0])));
        }
        ex.labels.push(i64::from(rec[0]));
        ex.pixels.extend(rec[1..].iter().map(|&p| f32::from(p) / 255.0));
    }
    Ok(ex)
}

pub fn load(dir: &Path) -> Result<Dataset, DataError> {
    let mut train: Option<Examples> = None;
    for i in 1..=5 {
        let p = dir.join(format!("data_batch_{i}.bin"));
        if !p.exists() {
            continue;
        }
        let b = batch(&p)?;
        match &mut train {
            Some(t) => t.append(b),
            None => train = Some(b),
        }
    }
    let train = train.ok_or_else(|| DataError::Missing {
        dir: dir.to_path_buf(),
        why: "no data_batch_N.bin file".into(),
    })?;
    let test_path = dir.join("test_batch.bin");
    if !test_path.exists() {
        return Err(DataError::Missing { dir: dir.to_path_buf(), why: "no test_batch.bin file".into() });
    }
    Ok(Dataset { train, test: batch(&test_path)?, classes: 10 })
}
