//! What a virtual worker holds after a pull in each wire type (`--pull-dtype`), made with the
//! encoders the parameter server uses, and the bytes each pull sends: F32 is the model itself;
//! bf16 the model rounded; int8 the worker's previous copy plus the int8 difference, the copy
//! tracked as the PS tracks it (`wire::int8::encode_delta`), the first pull whole.

use foresight_ps::client::PullDtype;
use foresight_ps::wire::{self, Layout, WireDtype};

pub struct Puller {
    dtype: PullDtype,
    /// int8: each worker's copy (what its last pull left it with).
    copies: Vec<Option<Vec<f32>>>,
    /// Body bytes of every pull so far.
    pub bytes: u64,
}

impl Puller {
    pub fn new(dtype: PullDtype, workers: usize) -> Self {
        Self { dtype, copies: vec![None; workers], bytes: 0 }
    }

    /// What `slot` holds after pulling `model`.
    pub fn pull(&mut self, slot: usize, layout: &Layout, model: &[f32]) -> Vec<f32> {
        let whole = |dtype| {
            (wire::header(layout, dtype, &Default::default()).len() + dtype_size(dtype) * model.len()) as u64
        };
        match self.dtype {
            PullDtype::F32 => {
                self.bytes += whole(WireDtype::F32);
                model.to_vec()
            }
            PullDtype::Bf16 => {
                self.bytes += whole(WireDtype::Bf16);
                model.iter().map(|v| wire::bf16_round_trip(*v)).collect()
            }
            PullDtype::Int8 => {
                let copy = &mut self.copies[slot];
                let mut body = Vec::new();
                if let Some(held) = copy
                    && wire::int8::encode_delta(layout, model, held, &mut body)
                {
                    self.bytes += body.len() as u64;
                    return held.clone();
                }
                self.bytes += whole(WireDtype::F32);
                *copy = Some(model.to_vec());
                model.to_vec()
            }
        }
    }
}

fn dtype_size(d: WireDtype) -> usize {
    match d {
        WireDtype::F32 => 4,
        WireDtype::Bf16 | WireDtype::F16 => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foresight_ps::wire::TensorSpec;

    #[test]
    fn each_type_holds_what_a_worker_would_and_counts_its_bodies() {
        let l = Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![2048] }]).unwrap();
        let mut model: Vec<f32> = (0..2048).map(|i| (i as f32 * 0.1).sin()).collect();
        let mut f32s = Puller::new(PullDtype::F32, 1);
        let mut bf16s = Puller::new(PullDtype::Bf16, 1);
        let mut int8s = Puller::new(PullDtype::Int8, 1);
        assert_eq!(f32s.pull(0, &l, &model), model);
        assert_eq!(int8s.pull(0, &l, &model), model, "the first int8 pull is whole");
        let rounded = bf16s.pull(0, &l, &model);
        assert_ne!(rounded, model);
        assert!(rounded.iter().zip(&model).all(|(r, m)| (r - m).abs() <= m.abs() / 128.0));
        assert_eq!(f32s.bytes, wire::encode_f32(&l, &model, &Default::default()).len() as u64);
        assert_eq!(bf16s.bytes, wire::encode_bf16(&l, &model).len() as u64);
        let whole = int8s.bytes;
        assert_eq!(whole, f32s.bytes);
        for (i, w) in model.iter_mut().enumerate() {
            *w -= 0.01 * (i as f32).cos();
        }
        let held = int8s.pull(0, &l, &model);
        assert_ne!(held, model, "a difference in int8 is rounded");
        assert!(held.iter().zip(&model).all(|(h, m)| (h - m).abs() < 1e-4));
        assert_eq!(int8s.bytes - whole, wire::int8::encode(&l, &mut model.clone()).len() as u64);
    }
}
