//! The built-in models on MNIST and CIFAR shapes, their parameter layout (what the PS registers),
//! and the TorchScript path on a module exported at test time by `examples/torchscript`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Tensor};

use super::*;
use crate::data::Examples;

const MNIST: [usize; 3] = [1, 28, 28];
const CIFAR: [usize; 3] = [3, 32, 32];

/// libtorch's RNG is global to the process: tests that seed it and build models take turns, so
/// that "same seed, same weights" is not disturbed by another test drawing from it meanwhile.
static TORCH_RNG: Mutex<()> = Mutex::new(());

fn torch_rng() -> MutexGuard<'static, ()> {
    tch::set_num_threads(1);
    TORCH_RNG.lock().unwrap_or_else(|e| e.into_inner())
}

fn build(spec: &ModelSpec, shape: [usize; 3], classes: usize) -> Model {
    Model::build(spec, shape, classes, Device::Cpu)
        .unwrap_or_else(|e| panic!("building {spec:?} for {shape:?}: {e:#}"))
}

fn build_err(spec: &ModelSpec, shape: [usize; 3]) -> String {
    match Model::build(spec, shape, 10, Device::Cpu) {
        Ok(_) => panic!("{spec:?} built for {shape:?}, expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

/// Name, shape and values of every parameter, in `parameters()` order.
fn snapshot(m: &Model) -> Vec<(String, Vec<i64>, Vec<f32>)> {
    m.parameters()
        .unwrap()
        .into_iter()
        .map(|(n, t)| {
            let v = Vec::<f32>::try_from(t.detach().flatten(0, -1)).unwrap();
            (n, t.size(), v)
        })
        .collect()
}

fn names(m: &Model) -> Vec<String> {
    m.parameters().unwrap().into_iter().map(|(n, _)| n).collect()
}

fn numel(m: &Model) -> usize {
    m.parameters().unwrap().iter().map(|(_, t)| t.numel()).sum()
}

fn images(n: i64, [c, h, w]: [usize; 3]) -> Tensor {
    Tensor::rand([n, c as i64, h as i64, w as i64], (Kind::Float, Device::Cpu))
}

const BUILTIN: [(ModelSpec, [usize; 3]); 6] = [
    (ModelSpec::Mlp, MNIST),
    (ModelSpec::Mlp, CIFAR),
    (ModelSpec::Lenet5, MNIST),
    (ModelSpec::Lenet5, CIFAR),
    (ModelSpec::Resnet20, MNIST),
    (ModelSpec::Resnet20, CIFAR),
];

#[test]
fn builtin_models_give_one_row_of_logits_per_image() {
    let _rng = torch_rng();
    for (spec, shape) in BUILTIN {
        for classes in [10, 7] {
            tch::manual_seed(1);
            let mut m = build(&spec, shape, classes);
            let xs = images(3, shape);
            for train in [true, false] {
                let logits = m.forward(&xs, train).unwrap();
                assert_eq!(logits.size(), [3, classes as i64], "{spec:?} on {shape:?}, train={train}");
                assert_eq!(logits.kind(), Kind::Float);
                assert!(logits.isfinite().all().int64_value(&[]) == 1, "{spec:?}: non-finite logits");
            }
        }
    }
    // The MLP takes any flat width (CSV with neither 784 nor 3072 pixels); LeNet-5 single-channel 32×32.
    let mut m = build(&ModelSpec::Mlp, [1, 1, 5], 3);
    assert_eq!(m.forward(&images(4, [1, 1, 5]), true).unwrap().size(), [4, 3]);
    let mut m = build(&ModelSpec::Lenet5, [1, 32, 32], 10);
    assert_eq!(m.forward(&images(2, [1, 32, 32]), false).unwrap().size(), [2, 10]);
}

#[test]
fn builtin_models_have_the_expected_parameters() {
    let _rng = torch_rng();
    let mlp = build(&ModelSpec::Mlp, MNIST, 10);
    assert_eq!(names(&mlp), ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "fc3.bias", "fc3.weight"]);
    assert_eq!(numel(&mlp), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
    // LeCun's LeNet-5: 61,706 parameters on 32×32 (MNIST padded to it) with 10 classes.
    for shape in [MNIST, [1, 32, 32]] {
        assert_eq!(numel(&build(&ModelSpec::Lenet5, shape, 10)), 61_706, "{shape:?}");
    }
    let resnet = build(&ModelSpec::Resnet20, CIFAR, 10);
    let n = names(&resnet);
    for expected in
        ["stem.weight", "stem_bn.weight", "layer1.0.conv1.weight", "layer2.0.down.conv.weight", "fc.bias"]
    {
        assert!(n.iter().any(|x| x == expected), "no {expected} in {n:?}");
    }
    // 19 convolutions + 2 projections, each followed by a BatchNorm (weight, bias), and fc.
    assert_eq!(n.len(), 21 + 21 * 2 + 2);
    let total = numel(&resnet);
    assert!((270_000..280_000).contains(&total), "ResNet-20 has ~0.27M parameters, got {total}");
}

#[test]
fn same_seed_gives_the_same_layout_and_initial_weights() {
    // Every worker builds the model with the job's seed; whichever registers first, w_0 is the same.
    let _rng = torch_rng();
    for (spec, shape) in BUILTIN {
        tch::manual_seed(42);
        let a = snapshot(&build(&spec, shape, 10));
        tch::manual_seed(42);
        let b = snapshot(&build(&spec, shape, 10));
        assert_eq!(a, b, "{spec:?} on {shape:?}: same seed, different parameters");
        let mut sorted: Vec<&String> = a.iter().map(|p| &p.0).collect();
        sorted.sort();
        assert_eq!(sorted, a.iter().map(|p| &p.0).collect::<Vec<_>>(), "{spec:?}: parameters sorted by name");
        tch::manual_seed(43);
        let c = snapshot(&build(&spec, shape, 10));
        assert_eq!(
            a.iter().map(|p| (&p.0, &p.1)).collect::<Vec<_>>(),
            c.iter().map(|p| (&p.0, &p.1)).collect::<Vec<_>>(),
            "{spec:?}: the layout does not depend on the seed"
        );
        assert_ne!(a, c, "{spec:?}: another seed, other initial weights");
    }
}

#[test]
fn resnet20_batchnorm_statistics_are_buffers_not_parameters() {
    let _rng = torch_rng();
    tch::manual_seed(3);
    let mut m = build(&ModelSpec::Resnet20, CIFAR, 10);
    let params = names(&m);
    assert!(
        params.iter().all(|n| !n.contains("running_")),
        "BatchNorm statistics among the parameters: {params:?}"
    );
    assert!(m.parameters().unwrap().iter().all(|(_, t)| t.requires_grad()));
    let Model::Native { vs, .. } = &m else { panic!("resnet20 is a built-in model") };
    let stats = |vs: &nn::VarStore| -> Vec<(String, Vec<f32>)> {
        let mut v: Vec<(String, Vec<f32>)> = vs
            .variables()
            .into_iter()
            .filter(|(n, _)| n.contains("running_"))
            .map(|(n, t)| (n, Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let before = stats(vs);
    assert_eq!(before.len(), 21 * 2, "running mean and variance of each of the 21 BatchNorm layers");
    let w0 = snapshot(&m);
    // A training forward pass moves the statistics (even without gradients) but no parameter;
    // an eval pass moves neither.
    {
        let _g = tch::no_grad_guard();
        let _ = m.forward(&images(4, CIFAR), false).unwrap();
    }
    let Model::Native { vs, .. } = &m else { unreachable!() };
    assert_eq!(stats(vs), before, "eval mode must not touch the running statistics");
    {
        let _g = tch::no_grad_guard();
        let _ = m.forward(&images(4, CIFAR), true).unwrap();
    }
    let Model::Native { vs, .. } = &m else { unreachable!() };
    assert_ne!(stats(vs), before, "train mode updates the running statistics");
    assert_eq!(snapshot(&m), w0, "a forward pass changes no parameter");
}

#[test]
fn lenet5_refuses_other_image_sizes() {
    for shape in [[1, 16, 16], [3, 64, 64], [1, 28, 32], [1, 1, 784]] {
        let msg = build_err(&ModelSpec::Lenet5, shape);
        let dims = format!("{}×{}", shape[1], shape[2]);
        assert!(
            msg.contains("lenet5 needs 28×28 or 32×32 images") && msg.contains(&dims),
            "{shape:?}: {msg}"
        );
    }
}

#[test]
fn model_names_parse() {
    assert_eq!(ModelSpec::parse("mlp", None), Ok(ModelSpec::Mlp));
    assert_eq!(ModelSpec::parse("lenet5", None), Ok(ModelSpec::Lenet5));
    assert_eq!(ModelSpec::parse("resnet20", Some(Path::new("ignored.pt"))), Ok(ModelSpec::Resnet20));
    assert_eq!(
        ModelSpec::parse("torchscript", Some(Path::new("m.pt"))),
        Ok(ModelSpec::TorchScript("m.pt".into()))
    );
    let err = ModelSpec::parse("torchscript", None).unwrap_err();
    assert!(err.contains("needs a path"), "{err}");
    let err = ModelSpec::parse("vgg16", None).unwrap_err();
    assert!(err.contains("vgg16") && err.contains("mlp, lenet5, resnet20 or torchscript"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// TorchScript

/// The venv's python (the torch that matches the linked libtorch), else the first on PATH.
fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if venv.exists() {
        return venv;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .flat_map(|d| [d.join("python3"), d.join("python")])
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("no python found (looked for {} and on PATH): run `make setup`", venv.display())
        })
}

/// Runs `examples/torchscript/export_model.py out`: the script users run is the one tested.
fn export_example(out: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/torchscript/export_model.py");
    let py = python();
    let res = Command::new(&py)
        .arg(&script)
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("running {} {}: {e}", py.display(), script.display()));
    assert!(
        res.status.success() && out.is_file(),
        "{} {} failed ({}); is torch installed? run `make setup`\n{}",
        py.display(),
        script.display(),
        res.status,
        String::from_utf8_lossy(&res.stderr)
    );
}

/// A random batch of MNIST-shaped examples with random labels (which a few steps can memorise).
fn random_examples(n: usize, seed: u64) -> Examples {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    Examples {
        shape: MNIST,
        pixels: (0..n * 784).map(|_| rng.random_range(0.0..1.0)).collect(),
        labels: (0..n).map(|_| rng.random_range(0..10)).collect(),
    }
}

fn flat(params: &[(String, Tensor)], f: impl Fn(&Tensor) -> Tensor) -> Vec<f32> {
    params
        .iter()
        .flat_map(|(_, p)| Vec::<f32>::try_from(f(p).to_kind(Kind::Float).flatten(0, -1)).unwrap())
        .collect()
}

#[test]
fn torchscript_module_from_the_example_exports_loads_and_trains() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cnn.pt");
    export_example(&path);
    let mut m = Model::build(&ModelSpec::TorchScript(path.clone()), MNIST, 10, Device::Cpu)
        .unwrap_or_else(|e| panic!("loading {}: {e:#}", path.display()));

    // The module's own dotted names, in its own order; BatchNorm statistics are not parameters.
    let params = m.parameters().unwrap();
    let layout: Vec<(&str, Vec<i64>)> = params.iter().map(|(n, t)| (n.as_str(), t.size())).collect();
    assert_eq!(
        layout,
        [
            ("features.0.weight", vec![8, 1, 3, 3]),
            ("features.0.bias", vec![8]),
            ("features.3.weight", vec![16, 8, 3, 3]),
            ("features.3.bias", vec![16]),
            ("features.4.weight", vec![16]),
            ("features.4.bias", vec![16]),
            ("fc.weight", vec![10, 784]),
            ("fc.bias", vec![10]),
        ]
    );
    for train in [true, false] {
        assert_eq!(m.forward(&images(5, MNIST), train).unwrap().size(), [5, 10], "train={train}");
    }

    // SGD the way the worker does it: the parameter handles are taken once, gradients zeroed
    // before each backward and read flat in layout order, new values written back flat under
    // no_grad (as a pull does), then the module must compute with them.
    let batch = random_examples(16, 5);
    let xs = Tensor::from_slice(&batch.pixels).view([16, 1, 28, 28]);
    let ys = Tensor::from_slice(&batch.labels);
    let lr = 0.01f32;
    let mut losses = Vec::new();
    for _ in 0..8 {
        for (_, p) in &params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let loss = m.forward(&xs, true).unwrap().cross_entropy_for_logits(&ys);
        loss.backward();
        losses.push(loss.double_value(&[]));
        let w = flat(&params, |p| p.detach());
        let g = flat(&params, |p| p.grad());
        assert!(g.iter().any(|&v| v != 0.0), "no gradient reached the module's parameters");
        let new: Vec<f32> = w.iter().zip(&g).map(|(w, g)| w - lr * g).collect();
        let _guard = tch::no_grad_guard();
        let mut off = 0;
        for (_, p) in &params {
            let n = p.numel();
            p.shallow_clone().copy_(&Tensor::from_slice(&new[off..off + n]).view_as(p));
            off += n;
        }
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(last < 0.75 * first, "SGD did not reduce the loss: {losses:?}");
    // The writes went into the module itself, not into copies.
    let reread = m.parameters().unwrap();
    assert_eq!(flat(&reread, |p| p.detach()), flat(&params, |p| p.detach()));
    // And the worker's evaluation runs it in eval mode without complaint.
    let (loss, acc) = crate::train::evaluate(&mut m, &batch, Device::Cpu).unwrap();
    assert!(loss.is_finite() && (0.0..=1.0).contains(&acc), "loss {loss}, accuracy {acc}");
}

#[test]
fn torchscript_files_that_cannot_load_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.pt");
    let msg = build_err(&ModelSpec::TorchScript(missing.clone()), MNIST);
    assert!(
        msg.contains(&missing.display().to_string()) && msg.contains("loading TorchScript module"),
        "{msg}"
    );
    let garbage = dir.path().join("garbage.pt");
    std::fs::write(&garbage, b"not a torchscript archive").unwrap();
    let msg = build_err(&ModelSpec::TorchScript(garbage.clone()), MNIST);
    assert!(msg.contains(&garbage.display().to_string()), "{msg}");
}

#[test]
fn resnet20_buffers_go_out_and_load_back_into_another_model() {
    let _rng = torch_rng();
    tch::manual_seed(3);
    let mut trained = build(&ModelSpec::Resnet20, CIFAR, 10);
    {
        let _g = tch::no_grad_guard();
        let _ = trained.forward(&images(4, CIFAR), true).unwrap();
    }
    let values = |m: &Model| -> Vec<(String, Vec<f32>)> {
        m.buffers().into_iter().map(|(n, t)| (n, Vec::<f32>::try_from(t.flatten(0, -1)).unwrap())).collect()
    };
    let sent = values(&trained);
    assert_eq!(sent.len(), 21 * 2, "each BatchNorm layer's running mean and variance, sorted by name");
    assert!(sent.windows(2).all(|w| w[0].0 < w[1].0));
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = trained
        .buffers()
        .into_iter()
        .zip(&sent)
        .map(|((n, t), (_, v))| {
            (
                n,
                t.size().iter().map(|&d| d as usize).collect(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        })
        .collect();
    let saved: Vec<_> =
        bytes.iter().map(|(n, s, b)| (n.clone(), safetensors::Dtype::F32, s.clone(), b.as_slice())).collect();
    let mut fresh = build(&ModelSpec::Resnet20, CIFAR, 10);
    assert_ne!(values(&fresh), sent, "a fresh model's statistics are its initial ones");
    fresh.load_buffers(&saved).unwrap();
    assert_eq!(values(&fresh), sent);
    let wrong = [("nope.running_mean".to_string(), safetensors::Dtype::F32, vec![1], &[0u8; 4][..])];
    let e = fresh.load_buffers(&wrong).unwrap_err().to_string();
    assert!(e.contains("not one of this model's"), "{e}");
}
