//! The models a worker trains: built-in `mlp`, `lenet5`, `resnet20`, or a user's TorchScript
//! module. All expose their trainable parameters by name in a stable order, which is the
//! layout registered with the parameter server.

mod native;

use std::path::{Path, PathBuf};

use tch::{CModule, Device, IValue, Tensor, nn};

#[derive(Clone, Debug, PartialEq)]
pub enum ModelSpec {
    Mlp,
    Lenet5,
    Resnet20,
    TorchScript(PathBuf),
}

impl ModelSpec {
    pub fn parse(name: &str, path: Option<&Path>) -> Result<Self, String> {
        match (name, path) {
            ("mlp", _) => Ok(Self::Mlp),
            ("lenet5", _) => Ok(Self::Lenet5),
            ("resnet20", _) => Ok(Self::Resnet20),
            ("torchscript", Some(p)) => Ok(Self::TorchScript(p.to_path_buf())),
            ("torchscript", None) => Err("model torchscript needs a path to the saved module".into()),
            (other, _) => {
                Err(format!("unknown model {other:?}: expected mlp, lenet5, resnet20 or torchscript"))
            }
        }
    }
}

/// A model ready to train on `device`.
pub enum Model {
    Native { vs: nn::VarStore, net: Box<dyn nn::ModuleT> },
    Script { module: CModule },
}

impl Model {
    /// Builds `spec` for images of `shape` (C, H, W) and `classes` outputs; the initial weights
    /// come from libtorch's RNG, seeded by the caller so every worker starts from the same w_0.
    pub fn build(
        spec: &ModelSpec,
        shape: [usize; 3],
        classes: usize,
        device: Device,
    ) -> anyhow::Result<Self> {
        let [c, h, w] = shape.map(|d| d as i64);
        let classes = classes as i64;
        let model = match spec {
            ModelSpec::TorchScript(path) => {
                let mut module = CModule::load_on_device(path, device)
                    .map_err(|e| anyhow::anyhow!("loading TorchScript module {}: {e}", path.display()))?;
                module.set_train();
                Self::Script { module }
            }
            native => {
                let vs = nn::VarStore::new(device);
                let net: Box<dyn nn::ModuleT> = match native {
                    ModelSpec::Mlp => Box::new(native::mlp(&vs.root(), c * h * w, classes)),
                    ModelSpec::Lenet5 => Box::new(native::lenet5(&vs.root(), c, h, w, classes)?),
                    ModelSpec::Resnet20 => Box::new(native::resnet20(&vs.root(), c, classes)),
                    ModelSpec::TorchScript(_) => unreachable!(),
                };
                Self::Native { vs, net }
            }
        };
        Ok(model)
    }

    /// Trainable parameters by name, in a stable order (sorted by name for built-in models, the
    /// module's own order for TorchScript). Buffers (BatchNorm statistics) are not included.
    pub fn parameters(&self) -> anyhow::Result<Vec<(String, Tensor)>> {
        match self {
            Self::Native { vs, .. } => {
                let mut v: Vec<(String, Tensor)> =
                    vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
                v.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(v)
            }
            Self::Script { module } => Ok(module
                .named_parameters()
                .map_err(|e| anyhow::anyhow!("reading the TorchScript module's parameters: {e}"))?
                .into_iter()
                .filter(|(_, t)| t.requires_grad())
                .collect()),
        }
    }

    /// The state the parameter server does not train, by name, sorted: BatchNorm's running
    /// statistics (float32). A TorchScript module's buffers are not visible through tch: none.
    pub fn buffers(&self) -> Vec<(String, Tensor)> {
        match self {
            Self::Native { vs, .. } => {
                let mut v: Vec<(String, Tensor)> =
                    vs.variables().into_iter().filter(|(_, t)| !t.requires_grad()).collect();
                v.sort_by(|a, b| a.0.cmp(&b.0));
                v
            }
            Self::Script { .. } => Vec::new(),
        }
    }

    /// Loads a final model's buffers (name, dtype, shape, bytes) into the model's own: every
    /// one must be a float32 buffer of the model with that shape.
    pub fn load_buffers(
        &mut self,
        saved: &[(String, safetensors::Dtype, Vec<usize>, &[u8])],
    ) -> anyhow::Result<()> {
        let _guard = tch::no_grad_guard();
        let mine: std::collections::HashMap<String, Tensor> = self.buffers().into_iter().collect();
        for (name, dtype, shape, bytes) in saved {
            let Some(t) = mine.get(name) else { anyhow::bail!("buffer {name:?} is not one of this model's") };
            let want: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
            anyhow::ensure!(
                *dtype == safetensors::Dtype::F32 && *shape == want,
                "buffer {name:?} is {dtype:?} {shape:?}, the model's is F32 {want:?}"
            );
            let values: Vec<f32> =
                bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            t.shallow_clone().copy_(&Tensor::from_slice(&values).view_as(t).to_device(t.device()));
        }
        Ok(())
    }

    /// Whether the model has state besides its trainable parameters (BatchNorm running
    /// statistics), which the parameter server does not hold. A TorchScript module's buffers are
    /// not visible through tch, so it is assumed to have some.
    pub fn has_buffers(&self) -> bool {
        match self {
            Self::Native { vs, .. } => vs.variables().values().any(|t| !t.requires_grad()),
            Self::Script { .. } => true,
        }
    }

    /// Logits for a batch; `train` selects training mode (BatchNorm statistics, dropout).
    pub fn forward(&mut self, xs: &Tensor, train: bool) -> anyhow::Result<Tensor> {
        match self {
            Self::Native { net, .. } => Ok(net.forward_t(xs, train)),
            Self::Script { module } => {
                if train {
                    module.set_train();
                } else {
                    module.set_eval();
                }
                match module.forward_is(&[IValue::Tensor(xs.shallow_clone())]) {
                    Ok(IValue::Tensor(t)) => Ok(t),
                    Ok(other) => anyhow::bail!(
                        "the TorchScript module returned {other:?}, expected a tensor of logits"
                    ),
                    Err(e) => anyhow::bail!("the TorchScript module's forward failed: {e}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
