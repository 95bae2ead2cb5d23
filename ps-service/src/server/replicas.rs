//! The copies of the model that workers pulling int8 hold (`GET /v1/model?dtype=int8`), kept by
//! the PS so that each pull can send only the difference from the worker's copy, in int8
//! ([`wire::int8::encode_delta`]). A copy is named by a tag the PS hands out with it: a worker
//! that asks for a difference names the copy it holds, and any copy the PS no longer tracks (it
//! restarted, the worker's earlier answer was lost, a retry overtook its original) gets the whole
//! model in F32 instead. One model-sized copy per such worker: the memory a `dc-asgd-*` backup
//! costs, paid only by jobs that ask for it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::wire::{self, Layout};

/// What a worker is sent.
pub enum Answer {
    /// The whole model (the caller sends its F32 snapshot), now this worker's tracked copy;
    /// the body buffer the caller lent comes back unused.
    Whole { tag: u64, unused: Vec<u8> },
    /// The int8 difference from the copy tagged `from`.
    Delta { tag: u64, from: u64, body: Vec<u8> },
}

struct Copy {
    tag: u64,
    values: Vec<f32>,
}

pub struct Replicas {
    next_tag: AtomicU64,
    by_worker: Mutex<HashMap<usize, Arc<Mutex<Copy>>>>,
}

impl Replicas {
    /// Tags start at `seed` (random per process): a tag from another process names nothing here.
    pub fn new(seed: u64) -> Self {
        Self { next_tag: AtomicU64::new(seed), by_worker: Mutex::new(HashMap::new()) }
    }

    /// Worker `worker`, holding the copy tagged `base` (if any), pulls `current`; a difference
    /// is encoded into `body`, a recycled buffer.
    pub fn answer(
        &self,
        worker: usize,
        base: Option<u64>,
        (layout, current): (&Layout, &[f32]),
        mut body: Vec<u8>,
    ) -> Answer {
        let slot = self.by_worker.lock().entry(worker).or_insert_with(Self::empty).clone();
        // Held while the difference is encoded: one pull per worker at a time.
        let mut copy = slot.lock();
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        if let Some(from) = base.filter(|b| *b == copy.tag && copy.values.len() == current.len())
            && wire::int8::encode_delta(layout, current, &mut copy.values, &mut body)
        {
            copy.tag = tag;
            return Answer::Delta { tag, from, body };
        }
        copy.values.clear();
        copy.values.extend_from_slice(current);
        copy.tag = tag;
        Answer::Whole { tag, unused: body }
    }

    /// A worker gone silent: its copy is freed (its next pull is the whole model).
    pub fn forget(&self, worker: usize) {
        self.by_worker.lock().remove(&worker);
    }

    /// The job now has `n` workers: the copies of those scaled away are freed.
    pub fn retain_below(&self, n: usize) {
        self.by_worker.lock().retain(|w, _| *w < n);
    }

    fn empty() -> Arc<Mutex<Copy>> {
        // Tag 0 is never handed out in practice (the seed is random); an empty copy matches no
        // length anyway.
        Arc::new(Mutex::new(Copy { tag: 0, values: Vec::new() }))
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.by_worker.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::TensorSpec;

    fn layout(n: usize) -> Layout {
        Layout::new(vec![TensorSpec { name: "w".into(), shape: vec![n] }]).unwrap()
    }

    /// What a worker does with an answer: the whole model, or its copy plus the decoded body.
    fn receive(copy: &mut Vec<f32>, answer: &Answer, l: &Layout, current: &[f32]) -> u64 {
        match answer {
            Answer::Whole { tag, .. } => {
                *copy = current.to_vec();
                *tag
            }
            Answer::Delta { tag, body, .. } => {
                let mut next = vec![0.0; l.len()];
                wire::int8::add_delta(body, l, copy, &mut next).unwrap();
                *copy = next;
                *tag
            }
        }
    }

    #[test]
    fn the_workers_copy_is_the_tracked_copy_bit_for_bit_and_never_drifts() {
        let n = 3000;
        let l = layout(n);
        let r = Replicas::new(77);
        let mut model: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut copy, mut tag) = (Vec::new(), None);
        for step in 0..200 {
            let answer = r.answer(0, tag, (&l, &model), Vec::new());
            assert_eq!(matches!(answer, Answer::Delta { .. }), step > 0, "step {step}");
            tag = Some(receive(&mut copy, &answer, &l, &model));
            let tracked = r.by_worker.lock()[&0].lock().values.clone();
            assert_eq!(copy, tracked, "step {step}");
            // Within one pull's rounding of the model (half a scale step of a chunk of the
            // difference), however many pulls came before.
            let err = copy.iter().zip(&model).map(|(c, m)| (c - m).abs()).fold(0f32, f32::max);
            assert!(err <= 1e-4, "step {step}: {err}");
            for (i, w) in model.iter_mut().enumerate() {
                *w -= 0.01 * ((i + step) as f32 * 0.11).cos();
            }
        }
    }

    #[test]
    fn a_copy_the_ps_does_not_track_gets_the_whole_model() {
        let l = layout(10);
        let r = Replicas::new(5);
        let model = vec![0.5f32; 10];
        let Answer::Whole { tag: first, .. } = r.answer(1, None, (&l, &model), vec![1]) else {
            panic!("no copy yet")
        };
        assert!(
            matches!(r.answer(1, Some(first), (&l, &model), Vec::new()), Answer::Delta { from, .. } if from == first)
        );
        // The copy tagged `first` was replaced by the answer just given: a retry naming it (its
        // answer lost, or overtaken) cannot be answered with a difference.
        let Answer::Whole { tag, .. } = r.answer(1, Some(first), (&l, &model), Vec::new()) else {
            panic!("stale base")
        };
        assert!(matches!(r.answer(1, Some(tag ^ 1), (&l, &model), Vec::new()), Answer::Whole { .. }));
        assert!(
            matches!(r.answer(2, Some(tag), (&l, &model), Vec::new()), Answer::Whole { .. }),
            "another worker's tag"
        );
        assert_eq!(r.tracked(), 2);
        r.retain_below(2);
        r.forget(0);
        assert_eq!(r.tracked(), 1);
        r.forget(1);
        assert_eq!(r.tracked(), 0);
    }
}
