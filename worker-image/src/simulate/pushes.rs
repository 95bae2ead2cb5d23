//! What the parameter server receives when a virtual worker pushes in each wire type
//! (`--push-dtype`): each gradient (or pseudo-gradient) encoded with the client's encoders,
//! decoded with the PS's decoder, and the bytes each push sends. int8 carries what each push's
//! rounding left out into the same worker's next push with a worker's own error feedback
//! (`client::ErrorFeedback`), unless the run turns it off to measure what it is worth.

use foresight_ps::client::{ErrorFeedback, GradDtype, encode_gradient};
use foresight_ps::wire::{self, Layout};

pub struct Pusher {
    dtype: GradDtype,
    /// int8 with error feedback: each worker's, as its session keeps it.
    feedback: Option<Vec<ErrorFeedback>>,
    /// Body bytes of every push so far.
    pub bytes: u64,
}

impl Pusher {
    pub fn new(dtype: GradDtype, feedback: bool, workers: usize) -> Self {
        let feedback = (feedback && dtype == GradDtype::Int8)
            .then(|| std::iter::repeat_with(ErrorFeedback::default).take(workers).collect());
        Self { dtype, feedback, bytes: 0 }
    }

    /// `slot`'s push of `grad` as its step `step`, as the PS receives it.
    pub fn send(&mut self, slot: usize, step: u64, layout: &Layout, grad: &[f32]) -> Vec<f32> {
        let body = match &mut self.feedback {
            Some(feedback) => feedback[slot].encode(layout, step, grad).to_vec(),
            None => encode_gradient(layout, grad, self.dtype),
        };
        self.bytes += body.len() as u64;
        let mut received = vec![0.0; grad.len()];
        wire::decode_gradient(&body, layout, &mut received).expect("the PS decodes what a client encodes");
        received
    }

    /// The PS took `slot`'s push of step `step` (applied it or counted it in a round).
    pub fn taken(&mut self, slot: usize, step: u64) {
        if let Some(feedback) = &mut self.feedback {
            feedback[slot].taken(step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foresight_ps::wire::TensorSpec;

    fn layout(n: usize) -> Layout {
        Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![n] }]).unwrap()
    }

    #[test]
    fn each_type_delivers_what_the_ps_decodes_and_counts_its_bodies() {
        let l = layout(3000);
        let grad: Vec<f32> = (0..3000).map(|i| (i as f32 * 0.37).sin() * 1e-2).collect();
        let mut f32s = Pusher::new(GradDtype::F32, true, 1);
        let mut bf16s = Pusher::new(GradDtype::Bf16, true, 1);
        assert_eq!(f32s.send(0, 1, &l, &grad), grad);
        let rounded = bf16s.send(0, 1, &l, &grad);
        assert_ne!(rounded, grad);
        assert!(rounded.iter().zip(&grad).all(|(r, g)| (r - g).abs() <= g.abs() / 128.0));
        assert_eq!(f32s.bytes, wire::encode_f32(&l, &grad, &Default::default()).len() as u64);
        assert_eq!(bf16s.bytes, wire::encode_bf16(&l, &grad).len() as u64);
    }

    /// Over many pushes of the same small gradient, error feedback delivers their sum to within
    /// one push's rounding; without it, each push loses the same rounding again.
    #[test]
    fn int8_error_feedback_delivers_the_sum_of_the_gradients() {
        let l = layout(2048);
        // One large value per chunk sets its scale, so the small ones round to 0 without feedback.
        let grad: Vec<f32> = (0..2048).map(|i| if i % 1024 == 0 { 1.0 } else { 1e-3 }).collect();
        let pushes = 50;
        let total = |feedback: bool| {
            let mut p = Pusher::new(GradDtype::Int8, feedback, 1);
            let mut sum = vec![0.0f32; 2048];
            for step in 1..=pushes {
                let received = p.send(0, step, &l, &grad);
                sum.iter_mut().zip(&received).for_each(|(s, r)| *s += r);
                p.taken(0, step);
            }
            (sum, p.bytes)
        };
        let (with, bytes) = total(true);
        let (without, _) = total(false);
        let want = pushes as f32 * 1e-3;
        assert!((with[1] - want).abs() <= 1.0 / 127.0, "with feedback: {} for {want}", with[1]);
        assert_eq!(without[1], 0.0, "without it, every push rounds 1e-3 to 0");
        assert_eq!(bytes, pushes * wire::int8::encode(&l, &mut grad.clone()).len() as u64);
    }

    #[test]
    fn a_push_the_ps_did_not_take_carries_nothing() {
        let l = layout(1024);
        let grad: Vec<f32> = (0..1024).map(|i| if i == 0 { 1.0 } else { 1e-3 }).collect();
        let mut p = Pusher::new(GradDtype::Int8, true, 1);
        let dropped = p.send(0, 1, &l, &grad);
        assert_eq!(dropped[1], 0.0);
        // Not taken: the next push starts from no residual, and rounds the same way.
        assert_eq!(p.send(0, 2, &l, &grad)[1], 0.0);
    }
}
