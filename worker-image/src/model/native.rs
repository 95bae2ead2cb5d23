//! The built-in networks.

use tch::Tensor;
use tch::nn::{self, ModuleT};

/// 784 → 256 → 128 → classes, ReLU.
pub fn mlp(p: &nn::Path, inputs: i64, classes: i64) -> impl ModuleT + use<> {
    nn::seq_t()
        .add_fn(move |xs| xs.flat_view())
        .add(nn::linear(p / "fc1", inputs, 256, Default::default()))
        .add_fn(|xs| xs.relu())
        .add(nn::linear(p / "fc2", 256, 128, Default::default()))
        .add_fn(|xs| xs.relu())
        .add(nn::linear(p / "fc3", 128, classes, Default::default()))
}

/// LeNet-5: two 5×5 convolutions with max-pooling, then 120 → 84 → classes. A 28×28 input
/// (MNIST) is padded by 2 so it reaches the first convolution as 32×32, like LeCun's original.
pub fn lenet5(p: &nn::Path, c: i64, h: i64, w: i64, classes: i64) -> anyhow::Result<impl ModuleT + use<>> {
    let pad = match (h, w) {
        (28, 28) => 2,
        (32, 32) => 0,
        _ => anyhow::bail!("lenet5 needs 28×28 or 32×32 images, the dataset has {h}×{w}"),
    };
    let conv1 = nn::ConvConfig { padding: pad, ..Default::default() };
    Ok(nn::seq_t()
        .add(nn::conv2d(p / "conv1", c, 6, 5, conv1))
        .add_fn(|xs| xs.relu().max_pool2d_default(2))
        .add(nn::conv2d(p / "conv2", 6, 16, 5, Default::default()))
        .add_fn(|xs| xs.relu().max_pool2d_default(2).flat_view())
        .add(nn::linear(p / "fc1", 16 * 5 * 5, 120, Default::default()))
        .add_fn(|xs| xs.relu())
        .add(nn::linear(p / "fc2", 120, 84, Default::default()))
        .add_fn(|xs| xs.relu())
        .add(nn::linear(p / "fc3", 84, classes, Default::default())))
}

fn conv3x3(p: nn::Path, cin: i64, cout: i64, stride: i64) -> nn::Conv2D {
    let cfg = nn::ConvConfig { stride, padding: 1, bias: false, ..Default::default() };
    nn::conv2d(p, cin, cout, 3, cfg)
}

/// A residual basic block; a 1×1 projection on the shortcut when the shape changes.
fn block(p: &nn::Path, cin: i64, cout: i64, stride: i64) -> impl ModuleT + use<> {
    let conv1 = conv3x3(p / "conv1", cin, cout, stride);
    let bn1 = nn::batch_norm2d(p / "bn1", cout, Default::default());
    let conv2 = conv3x3(p / "conv2", cout, cout, 1);
    let bn2 = nn::batch_norm2d(p / "bn2", cout, Default::default());
    let shortcut = (stride != 1 || cin != cout).then(|| {
        let cfg = nn::ConvConfig { stride, bias: false, ..Default::default() };
        (
            nn::conv2d(p / "down" / "conv", cin, cout, 1, cfg),
            nn::batch_norm2d(p / "down" / "bn", cout, Default::default()),
        )
    });
    nn::func_t(move |xs, train| {
        let ys = xs.apply(&conv1).apply_t(&bn1, train).relu().apply(&conv2).apply_t(&bn2, train);
        let skip = match &shortcut {
            Some((conv, bn)) => xs.apply(conv).apply_t(bn, train),
            None => xs.shallow_clone(),
        };
        (ys + skip).relu()
    })
}

/// ResNet-20 for 32×32 images (He et al. 2016, the paper's CIFAR-10 model): a 3×3 stem,
/// three stages of three basic blocks with 16, 32, 64 channels, global average pooling.
pub fn resnet20(p: &nn::Path, c: i64, classes: i64) -> impl ModuleT + use<> {
    let stem = conv3x3(p / "stem", c, 16, 1);
    let bn = nn::batch_norm2d(p / "stem_bn", 16, Default::default());
    let mut net = nn::seq_t().add(stem).add_fn_t(move |xs, train| xs.apply_t(&bn, train).relu());
    let mut cin = 16;
    for (stage, cout) in [16, 32, 64].into_iter().enumerate() {
        for i in 0..3 {
            let stride = if stage > 0 && i == 0 { 2 } else { 1 };
            net = net.add(block(&(p / format!("layer{}", stage + 1) / i), cin, cout, stride));
            cin = cout;
        }
    }
    net.add_fn(|xs: &Tensor| xs.adaptive_avg_pool2d([1, 1]).flat_view()).add(nn::linear(
        p / "fc",
        64,
        classes,
        Default::default(),
    ))
}
