//! The loaders on small files written here, in every format, plus the corrupt files a user may
//! point a job at: each must fail with a message that names the file and says what is wrong.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;

use super::*;

const SEED: u64 = 7;
const HOLDOUT: f64 = 0.2;

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).expect("in memory");
    enc.finish().expect("in memory")
}

/// An idx file: magic, big-endian dimensions, then the body.
fn idx(magic: u32, dims: &[u32], body: &[u8]) -> Vec<u8> {
    let mut v = magic.to_be_bytes().to_vec();
    for d in dims {
        v.extend(d.to_be_bytes());
    }
    v.extend_from_slice(body);
    v
}

/// Pixel `j` of image `i`: distinct enough to tell images apart, and covers 0 and 255.
fn pixel(i: usize, j: usize) -> u8 {
    ((i * 31 + j * 7) % 256) as u8
}

fn mnist_images(n: usize, rows: usize, cols: usize) -> Vec<u8> {
    let body: Vec<u8> = (0..n).flat_map(|i| (0..rows * cols).map(move |j| pixel(i, j))).collect();
    idx(0x0803, &[n as u32, rows as u32, cols as u32], &body)
}

fn mnist_labels(n: usize) -> Vec<u8> {
    let body: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    idx(0x0801, &[n as u32], &body)
}

/// A complete MNIST directory: `train` and `test` examples of 28×28, gzipped or raw.
fn mnist_dir(dir: &Path, train: usize, test: usize, gz: bool) {
    let suffix = if gz { ".gz" } else { "" };
    let enc = |b: Vec<u8>| if gz { gzip(&b) } else { b };
    write(&dir.join(format!("train-images-idx3-ubyte{suffix}")), &enc(mnist_images(train, 28, 28)));
    write(&dir.join(format!("train-labels-idx1-ubyte{suffix}")), &enc(mnist_labels(train)));
    write(&dir.join(format!("t10k-images-idx3-ubyte{suffix}")), &enc(mnist_images(test, 28, 28)));
    write(&dir.join(format!("t10k-labels-idx1-ubyte{suffix}")), &enc(mnist_labels(test)));
}

/// `n` CIFAR-10 records starting at example `first`: label byte, then 3×32×32 pixels.
fn cifar_records(first: usize, n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for i in first..first + n {
        v.push((i % 10) as u8);
        v.extend((0..3072).map(|j| pixel(i, j)));
    }
    v
}

/// One CSV line per example: pixels that identify the example (pixel 0 is its id), then the label.
fn csv_text(ids: std::ops::Range<usize>, width: usize, label: impl Fn(usize) -> usize) -> String {
    let mut s = String::new();
    for i in ids {
        let mut fields: Vec<String> = vec![i.to_string()];
        fields.extend((1..width).map(|j| pixel(i, j).to_string()));
        fields.push(label(i).to_string());
        s.push_str(&fields.join(","));
        s.push('\n');
    }
    s
}

fn load(format: Format, dir: &Path) -> Dataset {
    Dataset::load(format, dir, SEED, HOLDOUT).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

/// The error `Dataset::load` fails with, as the user reads it.
fn load_err(format: Format, dir: &Path) -> String {
    match Dataset::load(format, dir, SEED, HOLDOUT) {
        Ok(ds) => panic!(
            "{} loaded ({} train, {} test), expected an error",
            dir.display(),
            ds.train.len(),
            ds.test.len()
        ),
        Err(e) => e.to_string(),
    }
}

/// The message names `path` and contains every one of `what`.
fn assert_says(msg: &str, path: &Path, what: &[&str]) {
    let p = path.display().to_string();
    assert!(msg.contains(&p), "the error does not name {p}: {msg}");
    for w in what {
        assert!(msg.contains(w), "the error does not say {w:?}: {msg}");
    }
}

/// Pixel 0 of each example, ×255: the example's id in the CSV fixtures.
fn ids(ex: &Examples) -> Vec<usize> {
    let n: usize = ex.shape.iter().product();
    (0..ex.len()).map(|i| (ex.pixels[i * n] * 255.0).round() as usize).collect()
}

// ---------------------------------------------------------------------------------------------
// MNIST idx files

#[test]
fn mnist_idx_files_load_with_shapes_scaling_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    mnist_dir(dir.path(), 12, 5, false);
    let ds = load(Format::Mnist, dir.path());
    assert_eq!(ds.classes, 10);
    assert_eq!((ds.train.len(), ds.test.len()), (12, 5));
    assert_eq!(ds.train.shape, [1, 28, 28]);
    assert_eq!(ds.test.shape, [1, 28, 28]);
    assert_eq!(ds.train.pixels.len(), 12 * 784);
    assert_eq!(ds.train.labels, (0..12).map(|i| i % 10).collect::<Vec<i64>>());
    assert_eq!(ds.test.labels, vec![0, 1, 2, 3, 4]);
    // Bytes scaled to [0, 1], in file order.
    for (i, img) in ds.train.pixels.chunks(784).enumerate() {
        for (j, &p) in img.iter().enumerate() {
            assert_eq!(p, f32::from(pixel(i, j)) / 255.0, "train image {i} pixel {j}");
        }
    }
    let (min, max) = ds.train.pixels.iter().fold((f32::MAX, f32::MIN), |(a, b), &p| (a.min(p), b.max(p)));
    assert_eq!((min, max), (0.0, 1.0));
}

#[test]
fn mnist_gzipped_files_load_the_same_as_raw_ones() {
    let (raw, gz) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    mnist_dir(raw.path(), 6, 3, false);
    mnist_dir(gz.path(), 6, 3, true);
    let (a, b) = (load(Format::Mnist, raw.path()), load(Format::Mnist, gz.path()));
    assert_eq!(a.train, b.train);
    assert_eq!(a.test, b.test);
}

#[test]
fn mnist_accepts_the_dotted_file_names_of_some_mirrors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("train-images.idx3-ubyte"), &mnist_images(4, 28, 28));
    write(&d.join("train-labels.idx1-ubyte"), &mnist_labels(4));
    write(&d.join("t10k-images.idx3-ubyte.gz"), &gzip(&mnist_images(2, 28, 28)));
    write(&d.join("t10k-labels.idx1-ubyte.gz"), &gzip(&mnist_labels(2)));
    let ds = load(Format::Mnist, d);
    assert_eq!((ds.train.len(), ds.test.len()), (4, 2));
}

#[test]
fn mnist_truncated_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    mnist_dir(dir.path(), 4, 2, false);
    // Cut inside the header.
    let images = dir.path().join("train-images-idx3-ubyte");
    write(&images, &mnist_images(4, 28, 28)[..10]);
    assert_says(&load_err(Format::Mnist, dir.path()), &images, &["truncated idx header"]);
    // Cut inside the pixels.
    let full = mnist_images(4, 28, 28);
    write(&images, &full[..full.len() - 100]);
    let msg = load_err(Format::Mnist, dir.path());
    assert_says(&msg, &images, &["expected 3136 data bytes", "found 3036"]);
}

#[test]
fn mnist_wrong_magic_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    mnist_dir(dir.path(), 4, 2, false);
    // A labels file where the images should be.
    let images = dir.path().join("train-images-idx3-ubyte");
    write(&images, &idx(0x0801, &[4, 28, 28], &[0; 4 * 784]));
    assert_says(
        &load_err(Format::Mnist, dir.path()),
        &images,
        &["bad idx magic number 0x00000801", "expected 0x00000803"],
    );
}

#[test]
fn mnist_label_and_image_counts_must_match() {
    let dir = tempfile::tempdir().unwrap();
    mnist_dir(dir.path(), 4, 2, false);
    let labels = dir.path().join("t10k-labels-idx1-ubyte");
    write(&labels, &mnist_labels(3));
    let msg = load_err(Format::Mnist, dir.path());
    assert_says(&msg, &labels, &["3 labels for 2 images", "t10k-images-idx3-ubyte"]);
}

#[test]
fn mnist_labels_above_9_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    mnist_dir(dir.path(), 4, 2, false);
    let labels = dir.path().join("train-labels-idx1-ubyte");
    write(&labels, &idx(0x0801, &[4], &[1, 2, 12, 3]));
    assert_says(&load_err(Format::Mnist, dir.path()), &labels, &["label 12 is not a digit"]);
}

#[test]
fn mnist_header_with_absurd_dimensions_fails_cleanly() {
    // 2^32−1 images of 2^32−1 × 2^32−1 pixels: the size overflows; it must be an error, not a panic.
    let dir = tempfile::tempdir().unwrap();
    mnist_dir(dir.path(), 4, 2, false);
    let images = dir.path().join("train-images-idx3-ubyte");
    write(&images, &idx(0x0803, &[u32::MAX, u32::MAX, u32::MAX], &[0; 16]));
    assert_says(&load_err(Format::Mnist, dir.path()), &images, &["too large"]);
}

#[test]
fn mnist_bad_gzip_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    mnist_dir(dir.path(), 4, 2, true);
    let images = dir.path().join("train-images-idx3-ubyte.gz");
    write(&images, b"this is not gzip at all");
    assert_says(&load_err(Format::Mnist, dir.path()), &images, &["not a valid gzip file"]);
    // A gzip stream cut short.
    let full = gzip(&mnist_images(4, 28, 28));
    write(&images, &full[..full.len() / 2]);
    assert_says(&load_err(Format::Mnist, dir.path()), &images, &["not a valid gzip file"]);
}

#[test]
fn mnist_missing_files_and_directories_are_named() {
    let dir = tempfile::tempdir().unwrap();
    mnist_dir(dir.path(), 4, 2, false);
    std::fs::remove_file(dir.path().join("t10k-labels-idx1-ubyte")).unwrap();
    assert_says(&load_err(Format::Mnist, dir.path()), dir.path(), &["no t10k-labels-idx1-ubyte", ".gz"]);
    let nowhere = dir.path().join("no-such-dir");
    assert_says(&load_err(Format::Mnist, &nowhere), &nowhere, &["no train-images-idx3-ubyte"]);
}

#[test]
fn mnist_unreadable_file_is_named_with_the_os_error() {
    let dir = tempfile::tempdir().unwrap();
    mnist_dir(dir.path(), 4, 2, false);
    // A directory where a file should be: exists, but cannot be read as a file.
    let images = dir.path().join("train-images-idx3-ubyte");
    std::fs::remove_file(&images).unwrap();
    std::fs::create_dir(&images).unwrap();
    let msg = load_err(Format::Mnist, dir.path());
    assert_says(&msg, &images, &["directory"]);
}

// ---------------------------------------------------------------------------------------------
// CIFAR-10 binary batches

#[test]
fn cifar_batches_load_in_order_with_channel_first_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("data_batch_1.bin"), &cifar_records(0, 3));
    write(&d.join("data_batch_2.bin"), &cifar_records(3, 4));
    write(&d.join("test_batch.bin"), &cifar_records(100, 2));
    let ds = load(Format::Cifar10, d);
    assert_eq!(ds.classes, 10);
    assert_eq!(ds.train.shape, [3, 32, 32]);
    assert_eq!(ds.test.shape, [3, 32, 32]);
    assert_eq!((ds.train.len(), ds.test.len()), (7, 2));
    assert_eq!(ds.train.labels, vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(ds.test.labels, vec![0, 1]);
    // The file's plane order (all red, all green, all blue) is kept: C×H×W.
    for (i, img) in ds.train.pixels.chunks(3072).enumerate() {
        for (j, &p) in img.iter().enumerate() {
            assert_eq!(p, f32::from(pixel(i, j)) / 255.0, "train image {i} pixel {j}");
        }
    }
    assert!(ds.train.pixels.iter().all(|p| (0.0..=1.0).contains(p)));
}

#[test]
fn cifar_size_not_a_multiple_of_the_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut bytes = cifar_records(0, 2);
    bytes.pop();
    write(&d.join("data_batch_1.bin"), &bytes);
    write(&d.join("test_batch.bin"), &cifar_records(0, 1));
    let msg = load_err(Format::Cifar10, d);
    assert_says(&msg, &d.join("data_batch_1.bin"), &["size 6145", "not a multiple of the 3073-byte"]);
    // An empty batch too.
    write(&d.join("data_batch_1.bin"), &[]);
    assert_says(&load_err(Format::Cifar10, d), &d.join("data_batch_1.bin"), &["size 0"]);
}

#[test]
fn cifar_labels_above_9_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("data_batch_1.bin"), &cifar_records(0, 2));
    let mut test = cifar_records(0, 3);
    test[2 * 3073] = 10;
    write(&d.join("test_batch.bin"), &test);
    assert_says(&load_err(Format::Cifar10, d), &d.join("test_batch.bin"), &["record 2 has label 10"]);
}

#[test]
fn cifar_missing_batches_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert_says(&load_err(Format::Cifar10, d), d, &["no data_batch_N.bin file"]);
    write(&d.join("data_batch_3.bin"), &cifar_records(0, 2));
    assert_says(&load_err(Format::Cifar10, d), d, &["no test_batch.bin file"]);
    let nowhere = d.join("missing");
    assert_says(&load_err(Format::Cifar10, &nowhere), &nowhere, &["no data_batch_N.bin"]);
}

// ---------------------------------------------------------------------------------------------
// CSV

#[test]
fn csv_widths_give_mnist_cifar_or_flat_shapes() {
    for (width, shape) in [(784, [1, 28, 28]), (3072, [3, 32, 32]), (5, [1, 1, 5])] {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("data.csv"), csv_text(0..10, width, |i| i % 3).as_bytes());
        let ds = load(Format::Csv, dir.path());
        assert_eq!(ds.train.shape, shape, "width {width}");
        assert_eq!(ds.test.shape, shape, "width {width}");
        assert_eq!(ds.classes, 3, "classes are the largest label + 1");
        assert_eq!(ds.train.pixels.len(), ds.train.len() * width);
        assert!(ds.train.pixels.iter().chain(&ds.test.pixels).all(|p| (0.0..=1.0).contains(p)));
    }
}

#[test]
fn csv_pixels_are_scaled_and_labels_kept_with_their_example() {
    let dir = tempfile::tempdir().unwrap();
    // Whitespace around fields, a blank line and CRLF endings are tolerated.
    let text = "0, 255, 51, 3\r\n\r\n1,0,102,7\r\n2,128,0,0\n";
    write(&dir.path().join("d.csv"), text.as_bytes());
    let ds = Dataset::load(Format::Csv, dir.path(), SEED, 0.34).unwrap();
    assert_eq!(ds.classes, 8);
    let mut all: Vec<(usize, Vec<f32>, i64)> = Vec::new();
    for ex in [&ds.train, &ds.test] {
        for (k, id) in ids(ex).into_iter().enumerate() {
            all.push((id, ex.pixels[k * 3..k * 3 + 3].to_vec(), ex.labels[k]));
        }
    }
    all.sort_by_key(|e| e.0);
    assert_eq!(
        all,
        vec![
            (0, vec![0.0, 1.0, 0.2], 3),
            (1, vec![1.0 / 255.0, 0.0, 0.4], 7),
            (2, vec![2.0 / 255.0, 128.0 / 255.0, 0.0], 0),
        ]
    );
}

#[test]
fn csv_reads_plain_and_gzipped_files_together_and_a_single_file_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("a.csv"), csv_text(0..6, 4, |i| i % 2).as_bytes());
    write(&d.join("b.csv.gz"), &gzip(csv_text(6..10, 4, |i| i % 2).as_bytes()));
    write(&d.join("README.txt"), b"not data, ignored");
    let ds = load(Format::Csv, d);
    let mut seen: Vec<usize> = ids(&ds.train).into_iter().chain(ids(&ds.test)).collect();
    seen.sort();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    // A path to one file reads just that file.
    let one = load(Format::Csv, &d.join("b.csv.gz"));
    assert_eq!(one.train.len() + one.test.len(), 4);
}

#[test]
fn csv_holdout_is_seeded_deterministic_disjoint_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    // Sorted by class, like MNIST-5k: the split must shuffle first.
    write(&dir.path().join("d.csv"), csv_text(0..50, 4, |i| i / 5).as_bytes());
    let split = |seed| Dataset::load(Format::Csv, dir.path(), seed, HOLDOUT).unwrap();
    let (a, b, c) = (split(1), split(1), split(2));
    assert_eq!(a.train, b.train, "same seed, same split");
    assert_eq!(a.test, b.test, "same seed, same split");
    assert_ne!(ids(&a.test), ids(&c.test), "another seed, another split");
    assert_eq!((a.train.len(), a.test.len()), (40, 10));
    let train: BTreeSet<usize> = ids(&a.train).into_iter().collect();
    let test: BTreeSet<usize> = ids(&a.test).into_iter().collect();
    assert_eq!(train.len() + test.len(), 50, "no example twice");
    assert!(train.is_disjoint(&test));
    assert_eq!(train.union(&test).copied().collect::<Vec<_>>(), (0..50).collect::<Vec<_>>());
    // Labels travel with their pixels.
    for ex in [&a.train, &a.test] {
        for (k, id) in ids(ex).into_iter().enumerate() {
            assert_eq!(ex.labels[k], (id / 5) as i64);
        }
    }
    let test_classes: BTreeSet<i64> = a.test.labels.iter().copied().collect();
    assert!(test_classes.len() >= 4, "a shuffled 10-example holdout spans several classes: {test_classes:?}");
}

#[test]
fn csv_with_too_few_examples_to_split_fails_cleanly() {
    for n in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("d.csv"), csv_text(0..n, 4, |_| 0).as_bytes());
        let msg = load_err(Format::Csv, dir.path());
        assert!(
            msg.contains(&dir.path().display().to_string()) && msg.contains("examples"),
            "{n} examples: {msg}"
        );
    }
}

#[test]
fn csv_non_numeric_pixel_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.csv");
    write(&f, b"1,2,3,0\n4,x5,6,1\n");
    assert_says(&load_err(Format::Csv, dir.path()), &f, &["line 2", "pixel \"x5\" is not a number"]);
}

#[test]
fn csv_ragged_rows_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.csv");
    write(&f, b"1,2,3,0\n4,5,6,1\n\n7,8,1\n");
    assert_says(&load_err(Format::Csv, dir.path()), &f, &["line 4", "3 fields, earlier lines have 4"]);
    // Across files too: the width is the dataset's, not the file's.
    std::fs::remove_file(&f).unwrap();
    write(&dir.path().join("a.csv"), b"1,2,3,0\n4,5,6,1\n");
    let g = dir.path().join("b.csv");
    write(&g, b"1,2,3,4,0\n");
    assert_says(&load_err(Format::Csv, dir.path()), &g, &["line 1", "5 fields, earlier lines have 4"]);
    // A line with a label only.
    write(&g, b"7\n");
    assert_says(&load_err(Format::Csv, dir.path()), &g, &["expected pixels then a label"]);
}

#[test]
fn csv_pixels_outside_0_255_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.csv");
    write(&f, b"1,2,3,0\n4,256,6,1\n");
    assert_says(&load_err(Format::Csv, dir.path()), &f, &["line 2", "pixel 256 is outside 0..255"]);
    write(&f, b"1,-1,3,0\n");
    assert_says(&load_err(Format::Csv, dir.path()), &f, &["line 1", "pixel -1 is outside 0..255"]);
    write(&f, b"1,NaN,3,0\n");
    assert_says(&load_err(Format::Csv, dir.path()), &f, &["line 1", "outside 0..255"]);
}

#[test]
fn csv_bad_labels_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.csv");
    write(&f, b"1,2,3,0\n4,5,6,1.5\n");
    assert_says(&load_err(Format::Csv, dir.path()), &f, &["line 2", "label \"1.5\" is not an integer"]);
    write(&f, b"1,2,3,-1\n");
    assert_says(&load_err(Format::Csv, dir.path()), &f, &["line 1", "label -1 is out of range"]);
    // A header row is reported, not silently skipped.
    write(&f, b"p0,p1,p2,label\n1,2,3,0\n");
    assert_says(&load_err(Format::Csv, dir.path()), &f, &["line 1", "label \"label\" is not an integer"]);
}

#[test]
fn csv_bad_gzip_and_non_utf8_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.csv.gz");
    write(&f, b"1,2,3,0\n");
    assert_says(&load_err(Format::Csv, dir.path()), &f, &["not a valid gzip file"]);
    std::fs::remove_file(&f).unwrap();
    let g = dir.path().join("d.csv");
    write(&g, b"1,2,\xff,0\n");
    assert_says(&load_err(Format::Csv, dir.path()), &g, &["not UTF-8"]);
}

#[test]
fn csv_missing_or_empty_inputs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("absent");
    assert_says(&load_err(Format::Csv, &nowhere), &nowhere, &["No such file or directory"]);
    assert_says(&load_err(Format::Csv, dir.path()), dir.path(), &["no .csv or .csv.gz file"]);
    write(&dir.path().join("d.csv"), b"\n  \n");
    assert_says(&load_err(Format::Csv, dir.path()), dir.path(), &["hold no examples"]);
}

// ---------------------------------------------------------------------------------------------
// Sharding across workers

#[test]
fn shards_partition_the_training_set() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("d.csv"), csv_text(0..64, 3, |i| i % 10).as_bytes());
    let ds = Dataset::load(Format::Csv, dir.path(), SEED, 0.25).unwrap();
    let all: BTreeSet<usize> = ids(&ds.train).into_iter().collect();
    assert_eq!(all.len(), 48);
    for workers in [1, 2, 3, 5, 48] {
        let mut union = BTreeSet::new();
        let mut sizes = Vec::new();
        for w in 0..workers {
            let shard = ds.shard(w, workers, SEED);
            assert_eq!(shard, ds.shard(w, workers, SEED), "sharding is deterministic");
            assert_eq!(shard.shape, ds.train.shape);
            for (k, id) in ids(&shard).into_iter().enumerate() {
                assert!(union.insert(id), "{workers} workers: example {id} is in two shards");
                assert_eq!(shard.labels[k], (id % 10) as i64, "labels travel with their pixels");
            }
            sizes.push(shard.len());
        }
        assert_eq!(union, all, "{workers} workers: the shards cover the training set");
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(max - min <= 1, "{workers} workers: balanced shards {sizes:?}");
    }
    // One worker gets everything, shuffled; no test example leaks into a shard.
    let test: BTreeSet<usize> = ids(&ds.test).into_iter().collect();
    let one: BTreeSet<usize> = ids(&ds.shard(0, 1, SEED)).into_iter().collect();
    assert!(one.is_disjoint(&test));
    assert_ne!(ids(&ds.shard(0, 2, SEED)), ids(&ds.shard(0, 2, SEED + 1)), "the seed picks the shards");
}

#[test]
fn format_names_round_trip() {
    for f in [Format::Mnist, Format::Cifar10, Format::Csv] {
        assert_eq!(f.to_string().parse::<Format>(), Ok(f));
    }
    let err = "parquet".parse::<Format>().unwrap_err();
    assert!(err.contains("parquet") && err.contains("mnist, cifar10 or csv"), "{err}");
}
