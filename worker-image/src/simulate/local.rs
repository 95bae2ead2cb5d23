//! Local steps in the simulator (`--local-steps H`, DiLoCo-style): a virtual worker trains its
//! own copy of the model H steps with an inner optimizer, then pushes the pseudo-gradient
//! θ_pulled − θ_local, which the parameter server's rule applies as the outer step — what the
//! real workers do (`inner.rs`, the Python package), here on the simulator's MLP in f32.

use crate::inner::{BETA1, BETA2, EPSILON, InnerAlgorithm};

/// `--local-steps` and the inner optimizer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalSteps {
    pub steps: u64,
    pub rule: InnerAlgorithm,
    pub lr: f32,
}

/// One virtual worker's inner optimizer state (AdamW's moments), kept from one exchange to the
/// next as in DiLoCo.
#[derive(Clone, Debug, Default)]
pub struct Inner {
    steps: i32,
    m: Vec<f32>,
    v: Vec<f32>,
}

impl Inner {
    /// One step of `rule` at `lr` on `w` with gradient `g`.
    pub fn step(&mut self, rule: InnerAlgorithm, lr: f32, w: &mut [f32], g: &[f32]) {
        match rule {
            InnerAlgorithm::Sgd => w.iter_mut().zip(g).for_each(|(w, g)| *w -= lr * g),
            InnerAlgorithm::AdamW => {
                if self.m.is_empty() {
                    (self.m, self.v) = (vec![0.0; w.len()], vec![0.0; w.len()]);
                }
                self.steps += 1;
                let (b1, b2, eps) = (BETA1 as f32, BETA2 as f32, EPSILON as f32);
                let (c1, c2) = (1.0 - b1.powi(self.steps), 1.0 - b2.powi(self.steps));
                for (((w, g), m), v) in w.iter_mut().zip(g).zip(&mut self.m).zip(&mut self.v) {
                    *m = b1 * *m + (1.0 - b1) * g;
                    *v = b2 * *v + (1.0 - b2) * g * g;
                    *w -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AdamW's first step moves every weight by lr against its gradient's sign (m̂/√v̂ = ±1).
    #[test]
    fn adamws_first_step_is_lr_times_the_sign() {
        let mut w = vec![1.0, 1.0, 1.0];
        Inner::default().step(InnerAlgorithm::AdamW, 0.01, &mut w, &[0.5, -2.0, 1e-3]);
        for (got, want) in w.iter().zip([0.99, 1.01, 0.99]) {
            assert!((got - want).abs() < 1e-5, "{w:?}");
        }
        let mut w = vec![1.0];
        Inner::default().step(InnerAlgorithm::Sgd, 0.1, &mut w, &[2.0]);
        assert!((w[0] - 0.8).abs() < 1e-6);
    }
}
