//! Datasets from a directory: MNIST idx files, CIFAR-10 binary batches, or CSV.
//!
//! Every loader yields images as f32 in [0, 1] with shape [N, C, H, W] and labels as i64.
//! Unreadable or inconsistent files fail with a message naming the file and what is wrong.

mod cifar;
mod csv;
mod mnist;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Mnist,
    Cifar10,
    Csv,
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mnist" => Ok(Self::Mnist),
            "cifar10" => Ok(Self::Cifar10),
            "csv" => Ok(Self::Csv),
            _ => Err(format!("unknown dataset format {s:?}: expected mnist, cifar10 or csv")),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Mnist => "mnist",
            Self::Cifar10 => "cifar10",
            Self::Csv => "csv",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    // Not a `source`: the message already says it, and `{:#}` would say it twice.
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: String },
    #[error("{dir}: {why}")]
    Missing { dir: PathBuf, why: String },
}

pub(crate) fn invalid(path: &Path, why: impl Into<String>) -> DataError {
    DataError::Invalid { path: path.to_path_buf(), why: why.into() }
}

/// Reads a file, transparently gunzipping names ending in `.gz`.
pub(crate) fn read_maybe_gz(path: &Path) -> Result<Vec<u8>, DataError> {
    use std::io::Read;
    let io = |error| DataError::Io { path: path.to_path_buf(), error };
    let raw = std::fs::read(path).map_err(io)?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| invalid(path, format!("not a valid gzip file: {e}")))?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// Images (C×H×W each, row-major, values in [0, 1]) and labels.
#[derive(Clone, Debug, PartialEq)]
pub struct Examples {
    pub shape: [usize; 3],
    pub pixels: Vec<f32>,
    pub labels: Vec<i64>,
}

impl Examples {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    fn image_len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn select(&self, idx: &[usize]) -> Examples {
        let n = self.image_len();
        let mut pixels = Vec::with_capacity(idx.len() * n);
        for &i in idx {
            pixels.extend_from_slice(&self.pixels[i * n..(i + 1) * n]);
        }
        Examples { shape: self.shape, pixels, labels: idx.iter().map(|&i| self.labels[i]).collect() }
    }

    fn append(&mut self, other: Examples) {
        self.pixels.extend(other.pixels);
        self.labels.extend(other.labels);
    }
}

/// A dataset split into its training and held-out parts.
#[derive(Clone, Debug)]
pub struct Dataset {
    pub train: Examples,
    pub test: Examples,
    pub classes: usize,
}

impl Dataset {
    /// Loads `dir` in `format`. Formats that ship a test split use it; otherwise (CSV) the
    /// examples are shuffled with `seed` and `holdout` of them are held out.
    pub fn load(format: Format, dir: &Path, seed: u64, holdout: f64) -> Result<Self, DataError> {
        let ds = match format {
            Format::Mnist => mnist::load(dir)?,
            Format::Cifar10 => cifar::load(dir)?,
            Format::Csv => {
                let all = csv::load(dir)?;
                if all.len() < 3 {
                    let why = format!(
                        "the CSV files hold {} examples: at least 3 are needed (2 to train on, 1 held out)",
                        all.len()
                    );
                    return Err(DataError::Missing { dir: dir.to_path_buf(), why });
                }
                let (train, test) = foresight_ps::client::shard::holdout(all.len(), holdout, seed);
                let classes = all.labels.iter().max().map_or(0, |&m| m as usize + 1);
                Dataset { test: all.select(&test), train: all.select(&train), classes }
            }
        };
        if ds.train.len() < 2 {
            return Err(DataError::Missing {
                dir: dir.to_path_buf(),
                why: "fewer than 2 training examples".into(),
            });
        }
        Ok(ds)
    }

    /// Worker `index`'s shard of the training set ([`foresight_ps::client::shard::indices`]).
    pub fn shard(&self, index: usize, count: usize, seed: u64) -> Examples {
        self.train.select(&foresight_ps::client::shard::indices(self.train.len(), index, count, seed))
    }
}

#[cfg(test)]
mod tests;
