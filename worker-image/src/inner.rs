//! The inner optimizer of local steps (`optimizer.localSteps`, DiLoCo-style training): between
//! two exchanges with the parameter server the worker trains its own copy of the model with it.
//!
//! Written on the parameter tensors rather than a `VarStore`, so that it trains TorchScript
//! models (which have none) as well as the built-in ones. The formulas are PyTorch's
//! (`torch.optim.SGD` with L2 weight decay, `torch.optim.AdamW` with decoupled weight decay and
//! bias-corrected moments); a test checks AdamW against tch's own.

use clap::ValueEnum;
use tch::Tensor;

/// Which inner optimizer (`optimizer.innerOptimizer.algorithm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InnerAlgorithm {
    Sgd,
    #[value(name = "adamw")]
    AdamW,
}

/// `optimizer.innerOptimizer`: the rule, its learning rate and weight decay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InnerConfig {
    pub algorithm: InnerAlgorithm,
    pub lr: f64,
    pub weight_decay: f64,
}

pub(crate) const BETA1: f64 = 0.9;
pub(crate) const BETA2: f64 = 0.999;
pub(crate) const EPSILON: f64 = 1e-8;

/// An inner optimizer with its state (AdamW's moments), which carries over from one exchange
/// to the next as in DiLoCo.
pub struct Inner {
    config: InnerConfig,
    steps: i32,
    /// AdamW's first and second moments, one pair per parameter, made at the first step.
    moments: Vec<(Tensor, Tensor)>,
}

impl Inner {
    pub fn new(config: InnerConfig) -> Self {
        Self { config, steps: 0, moments: Vec::new() }
    }

    /// One step on `params` with the gradients their last backward left; parameters without a
    /// gradient are left as they are.
    pub fn step(&mut self, params: &[(String, Tensor)]) {
        let _guard = tch::no_grad_guard();
        let InnerConfig { algorithm, lr, weight_decay: wd } = self.config;
        self.steps += 1;
        if algorithm == InnerAlgorithm::AdamW && self.moments.is_empty() {
            self.moments = params.iter().map(|(_, p)| (p.zeros_like(), p.zeros_like())).collect();
        }
        for (i, (_, p)) in params.iter().enumerate() {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let mut p = p.shallow_clone();
            match algorithm {
                InnerAlgorithm::Sgd => {
                    let d = if wd > 0.0 { &g + &p * wd } else { g };
                    let _ = p.g_sub_(&(d * lr));
                }
                InnerAlgorithm::AdamW => {
                    let (m, v) = &mut self.moments[i];
                    let _ = p.g_mul_scalar_(1.0 - lr * wd);
                    let _ = m.g_mul_scalar_(BETA1).g_add_(&(&g * (1.0 - BETA1)));
                    let _ = v.g_mul_scalar_(BETA2).g_add_(&(g.square() * (1.0 - BETA2)));
                    let m_hat = &*m / (1.0 - BETA1.powi(self.steps));
                    let v_hat = &*v / (1.0 - BETA2.powi(self.steps));
                    let _ = p.g_sub_(&(m_hat / (v_hat.sqrt() + EPSILON) * lr));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tch::nn::{self, Module, OptimizerConfig};
    use tch::{Device, Kind, Tensor};

    use super::{Inner, InnerAlgorithm, InnerConfig};

    /// The same linear model, data and loss, stepped 5 times by tch's AdamW (libtorch's
    /// `torch::optim::AdamW`) and by ours: the same parameters to float precision.
    #[test]
    fn adamw_matches_libtorchs() {
        let (lr, wd) = (0.01, 0.1);
        // Weights set by hand, not drawn: libtorch's generator is global, and tests on other
        // threads seed it and draw from it (`model::tests` under their lock).
        let build = || {
            let vs = nn::VarStore::new(Device::Cpu);
            let zeros = nn::LinearConfig {
                ws_init: nn::Init::Const(0.0),
                bs_init: Some(nn::Init::Const(0.0)),
                bias: true,
            };
            let mut net = nn::linear(vs.root() / "fc", 4, 3, zeros);
            let w = Tensor::arange(12, (Kind::Float, Device::Cpu)).view([3, 4]) / 12.0 - 0.4;
            tch::no_grad(|| net.ws.copy_(&w));
            (vs, net)
        };
        let xs = Tensor::arange(8, (Kind::Float, Device::Cpu)).view([2, 4]) / 8.0;
        let ys = Tensor::from_slice(&[0i64, 2]);
        let loss = |net: &nn::Linear| net.forward(&xs).cross_entropy_for_logits(&ys);

        let (vs_ref, net_ref) = build();
        let mut reference =
            nn::AdamW { beta1: 0.9, beta2: 0.999, wd, eps: 1e-8, amsgrad: false }.build(&vs_ref, lr).unwrap();
        let (vs, net) = build();
        let initial = vs_ref.variables()["fc.bias"].copy();
        let params: Vec<(String, Tensor)> = {
            let mut v: Vec<_> = vs.variables().into_iter().collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let mut ours = Inner::new(InnerConfig { algorithm: InnerAlgorithm::AdamW, lr, weight_decay: wd });
        for _ in 0..5 {
            reference.zero_grad();
            loss(&net_ref).backward();
            reference.step();
            for (_, p) in &params {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            loss(&net).backward();
            ours.step(&params);
        }
        for (name, p) in &params {
            let want = vs_ref.variables()[name].shallow_clone();
            let diff = (p - &want).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "{name} differs from libtorch's AdamW by {diff}");
        }
        let moved = (&params[0].1 - &initial).abs().max().double_value(&[]);
        assert!(moved > 1e-3, "the parameters moved ({moved})");
    }

    /// SGD with L2 weight decay, by hand: p ← p − lr·(g + wd·p).
    #[test]
    fn sgd_steps_by_the_gradient_and_the_weight_decay() {
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        (&p * &Tensor::from_slice(&[3.0f32, 0.5])).sum(Kind::Float).backward();
        let params = vec![("w".to_string(), p.shallow_clone())];
        Inner::new(InnerConfig { algorithm: InnerAlgorithm::Sgd, lr: 0.1, weight_decay: 0.5 }).step(&params);
        let got: Vec<f32> = Vec::try_from(&p.detach()).unwrap();
        assert_eq!(got, [1.0 - 0.1 * (3.0 + 0.5), -2.0 - 0.1 * (0.5 - 1.0)]);
    }
}
