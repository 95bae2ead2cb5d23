//! The simulator's model: a one-hidden-layer ReLU network (or softmax regression with no hidden
//! layer) in plain Rust over one flat parameter vector, the way the parameter server holds it.
//!
//! Plain Rust rather than libtorch so that a run is bit-identical on every machine: every sum
//! here is taken in a fixed order and Rust never contracts to FMA or reassociates, whatever
//! SIMD the CPU has (libtorch's kernels pick their summation order by CPU).

use rand::Rng;

/// Shapes of the network; the parameters are laid out as W1 [hidden×inputs], b1, W2
/// [classes×hidden], b2 (with `hidden == 0`: W [classes×inputs], b).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mlp {
    pub inputs: usize,
    pub hidden: usize,
    pub classes: usize,
}

/// Held-out loss and accuracy of one parameter vector.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score {
    pub loss: f64,
    pub accuracy: f64,
}

/// Buffers reused across examples.
#[derive(Default)]
struct Scratch {
    hidden: Vec<f32>,
    logits: Vec<f32>,
    d_hidden: Vec<f32>,
}

impl Mlp {
    /// The width of the layer that feeds the output layer.
    fn feature_len(&self) -> usize {
        if self.hidden == 0 { self.inputs } else { self.hidden }
    }

    fn output_offset(&self) -> usize {
        if self.hidden == 0 { 0 } else { self.hidden * self.inputs + self.hidden }
    }

    pub fn len(&self) -> usize {
        self.output_offset() + self.classes * self.feature_len() + self.classes
    }

    /// The tensors the parameter server registers, in layout order.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let mut t = Vec::new();
        if self.hidden > 0 {
            t.push(("fc1.weight".to_string(), vec![self.hidden, self.inputs]));
            t.push(("fc1.bias".to_string(), vec![self.hidden]));
        }
        t.push(("fc2.weight".to_string(), vec![self.classes, self.feature_len()]));
        t.push(("fc2.bias".to_string(), vec![self.classes]));
        t
    }

    /// PyTorch's default initialisation of `nn.Linear`: U(−1/√fan_in, 1/√fan_in) for weights and
    /// biases alike.
    pub fn init(&self, rng: &mut impl Rng) -> Vec<f32> {
        let mut w = Vec::with_capacity(self.len());
        let mut layer = |fan_in: usize, count: usize| {
            let bound = 1.0 / (fan_in as f32).sqrt();
            w.extend((0..count).map(|_| rng.random_range(-bound..bound)));
        };
        if self.hidden > 0 {
            layer(self.inputs, self.hidden * self.inputs + self.hidden);
        }
        layer(self.feature_len(), self.classes * self.feature_len() + self.classes);
        w
    }

    /// Mean cross-entropy gradient over the examples `idx` of `x` (rows of `inputs` values) into
    /// `grad` (overwritten); returns the mean loss.
    pub fn gradient(&self, w: &[f32], x: &[f32], y: &[i64], idx: &[usize], grad: &mut [f32]) -> f32 {
        assert_eq!(w.len(), self.len());
        assert_eq!(grad.len(), self.len());
        grad.fill(0.0);
        let mut s = Scratch::default();
        let scale = 1.0 / idx.len() as f32;
        let mut loss = 0.0f32;
        for &i in idx {
            let xi = &x[i * self.inputs..(i + 1) * self.inputs];
            let label = y[i] as usize;
            loss += self.forward(w, xi, &mut s, label);
            // logits now hold softmax − one-hot: the gradient of the loss at the logits.
            s.logits.iter_mut().for_each(|d| *d *= scale);
            self.backward(w, xi, &mut s, grad);
        }
        loss * scale
    }

    /// Loss and accuracy of `w` on every example of `x`.
    pub fn evaluate(&self, w: &[f32], x: &[f32], y: &[i64]) -> Score {
        let mut s = Scratch::default();
        let (mut loss, mut correct) = (0.0f64, 0usize);
        for (i, &label) in y.iter().enumerate() {
            let xi = &x[i * self.inputs..(i + 1) * self.inputs];
            self.logits(w, xi, &mut s);
            let best = argmax(&s.logits);
            correct += usize::from(best == label as usize);
            loss += f64::from(softmax_loss(&mut s.logits, label as usize));
        }
        let n = y.len().max(1) as f64;
        Score { loss: loss / n, accuracy: correct as f64 / n }
    }

    /// The logits of one example (and the hidden activations, kept in `s`).
    fn logits(&self, w: &[f32], x: &[f32], s: &mut Scratch) {
        let features: &[f32] = if self.hidden > 0 {
            let (w1, rest) = w.split_at(self.hidden * self.inputs);
            let b1 = &rest[..self.hidden];
            s.hidden.clear();
            s.hidden.extend(
                (0..self.hidden)
                    .map(|j| (b1[j] + dot(&w1[j * self.inputs..(j + 1) * self.inputs], x)).max(0.0)),
            );
            &s.hidden
        } else {
            x
        };
        let f = self.feature_len();
        let (w2, b2) = w[self.output_offset()..].split_at(self.classes * f);
        s.logits.clear();
        s.logits.extend((0..self.classes).map(|k| b2[k] + dot(&w2[k * f..(k + 1) * f], features)));
    }

    /// The example's loss; leaves softmax − one-hot in `s.logits`.
    fn forward(&self, w: &[f32], x: &[f32], s: &mut Scratch, label: usize) -> f32 {
        self.logits(w, x, s);
        softmax_loss(&mut s.logits, label)
    }

    /// Adds the example's gradient, given d(loss)/d(logits) in `s.logits`, into `grad`.
    fn backward(&self, w: &[f32], x: &[f32], s: &mut Scratch, grad: &mut [f32]) {
        let f = self.feature_len();
        let out = self.output_offset();
        let features: &[f32] = if self.hidden > 0 { &s.hidden } else { x };
        {
            let (gw2, gb2) = grad[out..].split_at_mut(self.classes * f);
            for (k, &d) in s.logits.iter().enumerate() {
                axpy(d, features, &mut gw2[k * f..(k + 1) * f]);
                gb2[k] += d;
            }
        }
        if self.hidden == 0 {
            return;
        }
        let w2 = &w[out..out + self.classes * f];
        s.d_hidden.clear();
        s.d_hidden.extend((0..self.hidden).map(|j| {
            if s.hidden[j] <= 0.0 {
                return 0.0;
            }
            s.logits.iter().enumerate().map(|(k, &d)| d * w2[k * f + j]).sum::<f32>()
        }));
        let (gw1, rest) = grad.split_at_mut(self.hidden * self.inputs);
        for (j, &d) in s.d_hidden.iter().enumerate() {
            if d != 0.0 {
                axpy(d, x, &mut gw1[j * self.inputs..(j + 1) * self.inputs]);
            }
            rest[j] += d;
        }
    }
}

/// Cross-entropy of `logits` at `label`; replaces the logits with softmax − one-hot.
fn softmax_loss(logits: &mut [f32], label: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let shifted = logits[label] - max;
    let mut sum = 0.0f32;
    for z in logits.iter_mut() {
        *z = (*z - max).exp();
        sum += *z;
    }
    let loss = sum.ln() - shifted;
    for z in logits.iter_mut() {
        *z /= sum;
    }
    logits[label] -= 1.0;
    loss
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// A dot product with eight running sums, so that it vectorises; the order is fixed, so the
/// result is the same on every machine.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// y ← y + a·x
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The analytic gradient against central differences of the loss, in f64 terms of f32 maths.
    #[test]
    fn gradient_matches_finite_differences() {
        for hidden in [0, 5] {
            let net = Mlp { inputs: 7, hidden, classes: 3 };
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            let w = net.init(&mut rng);
            let x: Vec<f32> = (0..4 * 7).map(|_| rng.random_range(-1.0..1.0)).collect();
            let y = vec![0, 2, 1, 2];
            let idx = [0, 1, 2, 3];
            let mut g = vec![0.0; net.len()];
            net.gradient(&w, &x, &y, &idx, &mut g);
            let mut scratch = vec![0.0; net.len()];
            for i in (0..net.len()).step_by(3) {
                let h = 1e-2f32;
                let (mut up, mut down) = (w.clone(), w.clone());
                up[i] += h;
                down[i] -= h;
                let numeric = (net.gradient(&up, &x, &y, &idx, &mut scratch)
                    - net.gradient(&down, &x, &y, &idx, &mut scratch))
                    / (2.0 * h);
                assert!((numeric - g[i]).abs() < 2e-3, "hidden {hidden}, param {i}: {numeric} vs {}", g[i]);
            }
        }
    }

    #[test]
    fn evaluation_counts_the_argmax() {
        let net = Mlp { inputs: 2, hidden: 0, classes: 2 };
        // Class 1 iff x0 > x1.
        let w = vec![-1.0, 1.0, 1.0, -1.0, 0.0, 0.0];
        let x = vec![1.0, 0.0, 0.0, 1.0, 2.0, 3.0];
        let s = net.evaluate(&w, &x, &[1, 0, 1]);
        assert!((s.accuracy - 2.0 / 3.0).abs() < 1e-12);
        assert!(s.loss > 0.0);
    }
}
