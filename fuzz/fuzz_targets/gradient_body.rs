//! A push's gradient body, decoded by the function the PS calls on every body it does not take
//! the direct path for (`wire::decode_gradient`), against a registered layout (the first byte
//! picks it). Beyond "no panic": the result must not depend on what the reused buffer held
//! before (the PS's gradient pool hands out buffers with old contents), an accepted gradient
//! holds only usable values, and the PS's own F32 encoding of it decodes to the same bits.
#![no_main]

use foresight_fuzz::{bits, gradient_seeds, pick_layout, write_seeds_if_asked};
use foresight_ps::wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: write_seeds_if_asked(gradient_seeds), |data: &[u8]| {
    let Some((_, layout, body)) = pick_layout(data) else { return };
    let mut a = vec![0.0f32; layout.len()];
    let mut b = vec![7.5f32; layout.len()];
    let ra = wire::decode_gradient(body, layout, &mut a);
    let rb = wire::decode_gradient(body, layout, &mut b);
    // Compared as text: an error's value may be NaN, which is not equal to itself.
    let text = |r: &Result<(), wire::WireError>| r.as_ref().map_err(ToString::to_string).cloned();
    assert_eq!(text(&ra), text(&rb), "the verdict depends on the buffer's old contents");
    match ra {
        Ok(()) => {
            assert_eq!(bits(&a), bits(&b), "an accepted gradient depends on the buffer's old contents");
            assert!(a.iter().all(|g| wire::usable_gradient(*g)));
            let again = wire::encode_f32(layout, &a, &Default::default());
            let mut c = vec![0.0f32; layout.len()];
            wire::decode_gradient(&again, layout, &mut c).expect("the PS's encoding of an accepted gradient");
            assert_eq!(bits(&a), bits(&c));
        }
        Err(e) => {
            assert!(!e.reason().is_empty() && !e.to_string().is_empty());
        }
    }
});
