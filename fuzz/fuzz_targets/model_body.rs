//! A model body: what `PUT /v1/model` registers and what a worker decodes from a pull
//! (`wire::decode_model`). An accepted model re-encodes (`wire::encode_f32`) to a body that
//! decodes to the same layout, bits and metadata, and the same body is accepted as a gradient
//! against that layout exactly when every value is a usable gradient.
#![no_main]

use foresight_fuzz::{bits, model_seeds, write_seeds_if_asked};
use foresight_ps::wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: write_seeds_if_asked(model_seeds), |data: &[u8]| {
    match wire::decode_model(data) {
        Ok((layout, values, meta)) => {
            assert_eq!(values.len(), layout.len());
            assert!(values.iter().all(|v| v.is_finite()));
            let again = wire::encode_f32(&layout, &values, &meta);
            let (l2, v2, m2) = wire::decode_model(&again).expect("the PS's encoding of an accepted model");
            assert_eq!(l2, layout);
            assert_eq!(bits(&v2), bits(&values));
            assert_eq!(m2, meta);
            let mut g = vec![0.0f32; layout.len()];
            let as_gradient = wire::decode_gradient(data, &layout, &mut g);
            let usable = values.iter().all(|v| wire::usable_gradient(*v));
            assert_eq!(as_gradient.is_ok(), usable, "{as_gradient:?}");
            if as_gradient.is_ok() {
                assert_eq!(bits(&g), bits(&values));
            }
        }
        Err(e) => {
            assert!(!e.reason().is_empty() && !e.to_string().is_empty());
        }
    }
});
