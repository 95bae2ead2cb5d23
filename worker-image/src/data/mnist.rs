//! MNIST idx files: train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-… (raw or .gz).

use std::path::{Path, PathBuf};

use super::{DataError, Dataset, Examples, invalid, read_maybe_gz};

fn find(dir: &Path, stem: &str) -> Result<PathBuf, DataError> {
    for name in [
        stem.to_string(),
        format!("{stem}.gz"),
        stem.replacen("-idx", ".idx", 1),
        format!("{}.gz", stem.replacen("-idx", ".idx", 1)),
    ] {
        let p = dir.join(&name);
        if p.exists() {
            return Ok(p);
        }
    }
    Err(DataError::Missing { dir: dir.to_path_buf(), why: format!("no {stem} (or {stem}.gz) file") })
}

fn header(path: &Path, bytes: &[u8], magic: u32, dims: usize) -> Result<Vec<usize>, DataError> {
    let need = 4 + 4 * dims;
    if bytes.len() < need {
        return Err(invalid(path, format!("truncated idx header ({} bytes)", bytes.len())));
    }
    let word = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    if word(0) != magic {
        return Err(invalid(path, format!("bad idx magic number {:#010x}, expected {magic:#010x}", word(0))));
    }
    let shape: Vec<usize> = (0..dims).map(|d| word(4 + 4 * d) as usize).collect();
    // A corrupt header can claim more bytes than a usize holds: an error, not an overflow.
    let body = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| invalid(path, format!("idx shape {shape:?} is too large")))?;
    if bytes.len() - need != body {
        return Err(invalid(
            path,
            format!("expected {} data bytes for shape {shape:?}, found {}", body, bytes.len() - need),
        ));
    }
    Ok(shape)
}

fn split(dir: &Path, prefix: &str) -> Result<Examples, DataError> {
    let ipath = find(dir, &format!("{prefix}-images-idx3-ubyte"))?;
    let lpath = find(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
    let images = read_maybe_gz(&ipath)?;
    let labels = read_maybe_gz(&lpath)?;
    let ishape = header(&ipath, &images, 0x0803, 3)?;
    let lshape = header(&lpath, &labels, 0x0801, 1)?;
    if ishape[0] != lshape[0] {
        return Err(invalid(
            &lpath,
            format!("{} labels for {} images in {}", lshape[0], ishape[0], ipath.display()),
        ));
    }
    let labels: Vec<i64> = labels[8..].iter().map(|&b| i64::from(b)).collect();
    if let Some(bad) = labels.iter().find(|&&l| l > 9) {
        return Err(invalid(&lpath, format!("label {bad} is not a digit")));
    }
    let pixels = images[16..].iter().map(|&p| f32::from(p) / 255.0).collect();
    Ok(Examples { shape: [1, ishape[1], ishape[2]], pixels, labels })
}

pub fn load(dir: &Path) -> Result<Dataset, DataError> {
    Ok(Dataset { train: split(dir, "train")?, test: split(dir, "t10k")?, classes: 10 })
}
