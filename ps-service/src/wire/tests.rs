use std::collections::BTreeMap;

use super::*;

fn layout() -> Layout {
    Layout::new(vec![
        TensorSpec { name: "fc.weight".into(), shape: vec![2, 3] },
        TensorSpec { name: "fc.bias".into(), shape: vec![2] },
    ])
    .unwrap()
}

#[test]
fn model_round_trips_and_data_region_is_aligned() {
    let l = layout();
    let values: Vec<f32> = (0..8).map(|i| i as f32 * 0.5).collect();
    let meta = BTreeMap::from([("version".to_string(), "7".to_string())]);
    let body = encode_f32(&l, &values, &meta);
    let header_len = u64::from_le_bytes(body[..8].try_into().unwrap()) as usize;
    assert_eq!((8 + header_len) % 8, 0);
    let (l2, v2, m2) = decode_model(&body).unwrap();
    assert_eq!(l2, l);
    assert_eq!(v2, values);
    assert_eq!(m2, meta);
    // The official parser reads it too.
    let st = safetensors::SafeTensors::deserialize(&body).unwrap();
    assert_eq!(st.tensor("fc.bias").unwrap().shape(), &[2]);
}

#[test]
fn bf16_gradient_is_widened() {
    let l = layout();
    let g = [1.0, -2.0, 0.5, 3.0, 0.25, -1.0, 8.0, 1.5];
    let body = encode_bf16(&l, &g);
    let mut out = vec![0.0; 8];
    decode_gradient(&body, &l, &mut out).unwrap();
    assert_eq!(out, g); // all exactly representable in bf16
}

#[test]
fn a_model_large_enough_for_several_threads_is_rounded_to_bf16_value_by_value() {
    let l = Layout::model(vec![
        TensorSpec { name: "a".into(), shape: vec![1 << 20] },
        TensorSpec { name: "b".into(), shape: vec![70_001] },
    ])
    .unwrap();
    assert!(l.len() >= crate::cores::PARALLEL_MIN_LEN);
    let values: Vec<f32> = (0..l.len()).map(|i| (i as f32 * 0.731).sin() * (1 + i % 97) as f32).collect();
    let mut out = vec![f32::NAN; l.len()];
    decode_gradient(&encode_bf16(&l, &values), &l, &mut out).unwrap();
    for (i, (o, v)) in out.iter().zip(&values).enumerate() {
        assert_eq!(o.to_bits(), bf16_round_trip(*v).to_bits(), "element {i}");
    }
}

#[test]
fn f16_gradient_is_accepted() {
    let l = layout();
    let mut tensors = Vec::new();
    let w: Vec<u8> = (0..6).flat_map(|i| half::f16::from_f32(i as f32).to_le_bytes()).collect();
    let b: Vec<u8> = [1.5f32, 2.5].iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
    tensors.push(("fc.weight", safetensors::tensor::TensorView::new(Dtype::F16, vec![2, 3], &w).unwrap()));
    tensors.push(("fc.bias", safetensors::tensor::TensorView::new(Dtype::F16, vec![2], &b).unwrap()));
    let body = safetensors::serialize(tensors, None).unwrap();
    let mut out = vec![0.0; 8];
    decode_gradient(&body, &l, &mut out).unwrap();
    assert_eq!(out, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 1.5, 2.5]);
}

#[test]
fn every_mismatch_is_named() {
    let l = layout();
    let mut out = vec![0.0; 8];
    let other = Layout::new(vec![
        TensorSpec { name: "fc.weight".into(), shape: vec![3, 2] },
        TensorSpec { name: "fc.bias".into(), shape: vec![2] },
    ])
    .unwrap();
    let e = decode_gradient(&encode_f32(&other, &[0.0; 8], &BTreeMap::new()), &l, &mut out).unwrap_err();
    assert_eq!(e.reason(), "shape_mismatch");
    assert!(e.to_string().contains("fc.weight"));

    let renamed = Layout::new(vec![
        TensorSpec { name: "fc.w".into(), shape: vec![2, 3] },
        TensorSpec { name: "fc.bias".into(), shape: vec![2] },
    ])
    .unwrap();
    let e = decode_gradient(&encode_f32(&renamed, &[0.0; 8], &BTreeMap::new()), &l, &mut out).unwrap_err();
    assert_eq!(e, WireError::UnknownTensor("fc.w".into()));

    let partial = Layout::new(vec![TensorSpec { name: "fc.bias".into(), shape: vec![2] }]).unwrap();
    let e = decode_gradient(&encode_f32(&partial, &[0.0; 2], &BTreeMap::new()), &l, &mut out).unwrap_err();
    assert_eq!(e, WireError::MissingTensor("fc.weight".into()));

    let w = vec![0u8; 6 * 8];
    let b = vec![0u8; 2 * 8];
    let body = safetensors::serialize(
        vec![
            ("fc.weight", safetensors::tensor::TensorView::new(Dtype::F64, vec![2, 3], &w).unwrap()),
            ("fc.bias", safetensors::tensor::TensorView::new(Dtype::F64, vec![2], &b).unwrap()),
        ],
        None,
    )
    .unwrap();
    assert_eq!(decode_gradient(&body, &l, &mut out).unwrap_err().reason(), "dtype_mismatch");
    // A model body must be F32: half precision is only for gradients.
    assert_eq!(decode_model(&encode_bf16(&l, &[0.0; 8])).unwrap_err().reason(), "dtype_mismatch");
}

#[test]
fn non_finite_values_are_refused_with_their_place() {
    let l = layout();
    let mut out = vec![0.0; 8];
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut g = [0.0f32; 8];
        g[7] = bad;
        let e = decode_gradient(&encode_f32(&l, &g, &BTreeMap::new()), &l, &mut out).unwrap_err();
        assert!(matches!(e, WireError::NonFinite { ref name, index: 1, .. } if name == "fc.bias"), "{e}");
    }
    // bf16 overflow to infinity is caught after widening too.
    let g = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, f32::MAX, 0.0];
    let e = decode_gradient(&encode_bf16(&l, &g), &l, &mut out).unwrap_err();
    assert_eq!(e.reason(), "non_finite");
}

#[test]
fn finite_gradients_too_large_to_square_are_refused_with_their_place() {
    let l = layout();
    let mut out = vec![0.0; 8];
    let mut g = [0.0f32; 8];
    g[2] = MAX_GRADIENT;
    g[3] = -MAX_GRADIENT;
    decode_gradient(&encode_f32(&l, &g, &BTreeMap::new()), &l, &mut out).expect("the bound itself is usable");
    (g[2], g[3]) = (0.5e12, -0.5e12); // usable in bf16 too (which rounds 1e12 up past the bound)
    for big in [2e12f32, -1e19, 1e30] {
        g[6] = big;
        for body in [encode_f32(&l, &g, &BTreeMap::new()), encode_bf16(&l, &g)] {
            let e = decode_gradient(&body, &l, &mut out).unwrap_err();
            assert!(matches!(e, WireError::TooLarge { ref name, index: 0, .. } if name == "fc.bias"), "{e}");
            assert_eq!(e.reason(), "too_large");
        }
    }
    assert!(!usable_gradient(f32::NAN) && usable_gradient(-1e12) && !usable_gradient(1.1e12));
    assert!(!usable_gradient(f32::INFINITY) && !usable_gradient(f32::NEG_INFINITY));
}

#[test]
fn the_first_unusable_element_is_found_in_any_block() {
    let mut g = vec![0.25f32; 3 * 4096 + 7];
    let last = g.len() - 1;
    assert_eq!(first_unusable(&g), None);
    for (at, bad) in [(0, f32::NAN), (4095, f32::INFINITY), (4096, -2e12), (3 * 4096 + 6, f32::NAN)] {
        g[at] = bad;
        g[last] = f32::NEG_INFINITY; // a later bad element does not hide the first
        assert_eq!(first_unusable(&g), Some(at), "{bad} at {at}");
        g[at] = 0.25;
    }
}

#[test]
fn truncated_and_garbled_bodies_are_malformed() {
    let l = layout();
    let body = encode_f32(&l, &[1.0; 8], &BTreeMap::new());
    let mut out = vec![0.0; 8];
    for cut in [0, 4, 8, 20, body.len() - 1] {
        let e = decode_gradient(&body[..cut], &l, &mut out).unwrap_err();
        assert_eq!(e.reason(), "malformed_body", "cut at {cut}");
    }
    let mut garbled = body.clone();
    garbled[8] = b'#'; // the JSON header's opening brace
    assert_eq!(decode_gradient(&garbled, &l, &mut out).unwrap_err().reason(), "malformed_body");
    let mut extra = body.clone();
    extra.extend_from_slice(&[0; 4]);
    assert_eq!(decode_gradient(&extra, &l, &mut out).unwrap_err().reason(), "malformed_body");
    assert_eq!(
        decode_gradient(b"not safetensors at all", &l, &mut out).unwrap_err().reason(),
        "malformed_body"
    );
}

#[test]
fn layouts_refuse_bad_names_and_shapes() {
    let t = |n: &str, s: Vec<usize>| TensorSpec { name: n.into(), shape: s };
    assert!(Layout::new(vec![]).is_err());
    assert!(Layout::new(vec![t("a", vec![2]), t("a", vec![2])]).is_err());
    assert!(Layout::new(vec![t("a", vec![0])]).is_err());
    assert!(Layout::new(vec![t("a\n", vec![1])]).is_err());
    assert!(Layout::new(vec![t("a", vec![usize::MAX, 2])]).is_err());
    let l = Layout::new(vec![t("a", vec![]), t("b", vec![2, 2])]).unwrap(); // scalars are fine
    assert_eq!(l.len(), 5);
}

#[test]
fn a_body_with_the_most_tensors_in_another_order_lands_every_tensor_at_its_offset() {
    // Names are looked up in the layout's index: each of MAX_TENSORS tensors (of 1 or 2 values)
    // must land in its own range whatever order the body lists them in.
    let specs: Vec<TensorSpec> = (0..MAX_TENSORS)
        .map(|i| TensorSpec { name: format!("layer{i}.weight"), shape: vec![1 + i % 2] })
        .collect();
    let layout = Layout::new(specs.clone()).unwrap();
    let reversed = Layout::new(specs.into_iter().rev().collect()).unwrap();
    // In the reversed layout's order, tensor `name` holds the number in its name.
    let values: Vec<f32> = reversed
        .iter()
        .flat_map(|(spec, range)| {
            let n: f32 = spec.name["layer".len()..spec.name.len() - ".weight".len()].parse().unwrap();
            range.map(move |_| n)
        })
        .collect();
    let body = encode_f32(&reversed, &values, &BTreeMap::new());
    let mut out = vec![0.0; layout.len()];
    decode_gradient(&body, &layout, &mut out).unwrap();
    for (i, (_, range)) in layout.iter().enumerate() {
        assert!(out[range].iter().all(|&v| v == i as f32), "tensor {i} landed elsewhere");
    }
}

#[test]
fn a_model_refuses_names_its_checkpoint_could_not_store_state_under() {
    let spec = |name: &str| TensorSpec { name: name.into(), shape: vec![2] };
    let reserved = Layout::model(vec![spec("w"), spec("optimizer.momentum.w")]).unwrap_err();
    assert!(reserved.to_string().contains("reserved for the optimizer state"), "{reserved}");
    let long = "n".repeat(MAX_MODEL_NAME_LEN + 1);
    assert!(Layout::model(vec![spec(&long)]).is_err());
    assert!(Layout::model(vec![spec(&"n".repeat(MAX_MODEL_NAME_LEN))]).is_ok());
    let pending = Layout::model(vec![spec("w"), spec("optimizer.pending")]).unwrap_err();
    assert!(pending.to_string().contains("reserved for the optimizer state"), "{pending}");
    // A module of the user's model may be called `optimizer`.
    assert!(Layout::model(vec![spec("optimizer.weight")]).is_ok());
    assert!(Layout::model(vec![spec("optimizer.pending.w")]).is_ok());
    // Through a registration body, as the PS decodes it.
    let layout = Layout::new(vec![spec("w"), spec("optimizer.mean_square.w")]).unwrap();
    assert!(decode_model(&encode_f32(&layout, &[1.0; 4], &Default::default())).is_err());
}

/// A body from a raw JSON header and data region, as a client could send it.
fn raw_body(header: serde_json::Value, data: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(&header).unwrap();
    let mut body = (json.len() as u64).to_le_bytes().to_vec();
    body.extend_from_slice(&json);
    body.extend_from_slice(data);
    body
}

/// The verdicts of `tries` decodes of `body`, as text.
fn verdicts(body: &[u8], tries: usize) -> std::collections::BTreeSet<String> {
    let l = layout();
    (0..tries)
        .map(|_| {
            let mut out = vec![0.0; 8];
            match decode_gradient(body, &l, &mut out) {
                Ok(()) => "accepted".to_string(),
                Err(e) => e.to_string(),
            }
        })
        .collect()
}

#[test]
fn the_verdict_on_tensors_sharing_offsets_is_the_same_on_every_request() {
    // Two empty tensors both at [0, 0]: one registered with the wrong shape, one unknown.
    // safetensors hands them over in a random order; the PS must name the same error each time.
    let empty = raw_body(
        serde_json::json!({
            "zz": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
            "fc.bias": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
        }),
        &[],
    );
    let seen = verdicts(&empty, 64);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen.first().unwrap().contains("fc.bias"), "ordered by name after offsets: {seen:?}");
    // Two tensors over the same bytes: safetensors names either one in its error.
    let overlapping = raw_body(
        serde_json::json!({
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
        }),
        &[0; 4],
    );
    let seen = verdicts(&overlapping, 64);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen.first().unwrap().contains("offsets do not cover"), "{seen:?}");
    // The same bytes, one tensor of the wrong size: checked first, its size fails; second,
    // its offset does (found by fuzzing).
    let sized = raw_body(
        serde_json::json!({
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [0], "data_offsets": [0, 4]},
        }),
        &[0; 4],
    );
    assert_eq!(verdicts(&sized, 64), seen);
}

/// A layout with a tensor of several int8 chunks, one of a partial chunk and one of a single value.
fn int8_layout() -> Layout {
    Layout::model(vec![
        TensorSpec { name: "w".into(), shape: vec![3, int8::CHUNK] },
        TensorSpec { name: "b".into(), shape: vec![int8::CHUNK / 2 + 7] },
        TensorSpec { name: "s".into(), shape: vec![1] },
    ])
    .unwrap()
}

fn int8_values(n: usize) -> Vec<f32> {
    // Chunks of very different magnitudes, signs, exact zeros and a chunk of zeros only.
    (0..n)
        .map(|i| match i / int8::CHUNK {
            1 => 0.0,
            c => ((i * 7919) % 2001) as f32 / 1000.0 - 1.0 * 10f32.powi((c % 5) as i32 - 2),
        })
        .collect()
}

/// The chunks of [`int8_layout`], and a model large enough to be encoded by several threads
/// ([`crate::cores::PARALLEL_MIN_LEN`]) with tensors that do not end on a chunk.
fn int8_layouts() -> [Layout; 2] {
    let large = Layout::model(vec![
        TensorSpec { name: "w".into(), shape: vec![1031, int8::CHUNK + 3] },
        TensorSpec { name: "b".into(), shape: vec![int8::CHUNK / 2 + 7] },
        TensorSpec { name: "s".into(), shape: vec![1] },
    ])
    .unwrap();
    assert!(large.len() >= crate::cores::PARALLEL_MIN_LEN);
    [int8_layout(), large]
}

#[test]
fn an_int8_gradient_decodes_to_within_half_a_step_and_its_residual_is_exactly_what_was_left_out() {
    for l in int8_layouts() {
        int8_round_trip(&l);
    }
}

fn int8_round_trip(l: &Layout) {
    let x = int8_values(l.len());
    let mut residual = x.clone();
    let body = int8::encode(l, &mut residual);
    // A quarter of F32's bytes, plus a scale per chunk and the header.
    let scales: usize = l.tensors().iter().map(|t| int8::chunks(t.numel())).sum();
    assert_eq!(body.len() - header_len(&body), l.len() + 4 * scales);
    let mut out = vec![f32::NAN; l.len()];
    decode_gradient(&body, l, &mut out).unwrap();
    for (t, r) in l.iter() {
        for (c, range) in r.clone().step_by(int8::CHUNK).map(|s| (s, s..(s + int8::CHUNK).min(r.end))) {
            let step = x[range.clone()].iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for i in range {
                assert!(
                    (x[i] - out[i]).abs() <= step * 0.5 * (1.0 + 1e-5),
                    "{} chunk at {c}: {} vs {}",
                    t.name,
                    x[i],
                    out[i]
                );
                assert_eq!(residual[i].to_bits(), (x[i] - out[i]).to_bits(), "{} element {i}", t.name);
            }
        }
    }
    // The chunk of zeros stays exactly zero.
    assert!(out[int8::CHUNK..2 * int8::CHUNK].iter().all(|v| *v == 0.0));
}

#[test]
fn an_int8_difference_leaves_the_ps_record_of_the_copy_where_the_worker_lands_bit_for_bit() {
    for l in int8_layouts() {
        let current = int8_values(l.len());
        let held: Vec<f32> = current.iter().enumerate().map(|(i, v)| v * 0.5 + (i % 3) as f32).collect();
        let mut record = held.clone();
        let mut body = vec![7; 3];
        assert!(int8::encode_delta(&l, &current, &mut record, &mut body), "usable differences");
        let mut delta = vec![f32::NAN; l.len()];
        decode_gradient(&body, &l, &mut delta).unwrap();
        let mut worker = held.clone();
        int8::apply_delta(&mut worker, &delta);
        // The worker's own read (`client::read_delta`): widened and added in one pass, on
        // several threads for the large layout; the same bits.
        let mut one_pass = vec![f32::NAN; l.len()];
        int8::add_delta(&body, &l, &held, &mut one_pass).unwrap();
        assert!(one_pass.iter().zip(&worker).all(|(a, b)| a.to_bits() == b.to_bits()));
        // Within half a step of the largest difference in the model (a chunk's step is no larger).
        let step = current.iter().zip(&held).fold(0f32, |m, (c, h)| m.max((c - h).abs())) / 127.0;
        for (i, ((w, r), (c, h))) in worker.iter().zip(&record).zip(current.iter().zip(&held)).enumerate() {
            assert_eq!(w.to_bits(), r.to_bits(), "element {i} of {}", l.len());
            assert!((w - c).abs() <= step * 0.51, "element {i}: {w} for {c} from {h}");
        }
    }
    // A difference a gradient body could not carry: refused, the caller sends the whole model.
    let l = int8_layout();
    let mut record = vec![0.0; l.len()];
    let mut far = vec![0.0; l.len()];
    far[l.len() - 1] = 1e13;
    assert!(!int8::encode_delta(&l, &far, &mut record, &mut Vec::new()));
}

fn header_len(body: &[u8]) -> usize {
    8 + u64::from_le_bytes(body[..8].try_into().unwrap()) as usize
}

#[test]
fn int8_tensors_mix_with_f32_ones_and_every_inconsistent_scale_is_refused() {
    let l = int8_layout();
    let x = int8_values(l.len());
    let mut out = vec![0.0; l.len()];
    let body = int8::encode(&l, &mut x.clone());
    let parsed = parse(&body).unwrap();
    let tensor = |name: &str| parsed.tensors.iter().find(|t| t.0 == name).unwrap().clone();
    let rebuild = |tensors: Vec<ParsedTensor<'_>>| {
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize(views, None).unwrap()
    };
    let f32_b: Vec<u8> = x[3 * int8::CHUNK..3 * int8::CHUNK + l.tensors()[1].numel()]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let b_f32 = ("b".to_string(), Dtype::F32, l.tensors()[1].shape.clone(), &f32_b[..]);
    // w and s as int8, b as F32: accepted, b exactly.
    let mixed = rebuild(vec![
        tensor("w"),
        tensor("int8.scale.w"),
        b_f32.clone(),
        tensor("s"),
        tensor("int8.scale.s"),
    ]);
    decode_gradient(&mixed, &l, &mut out).unwrap();
    assert_eq!(&out[3 * int8::CHUNK..3 * int8::CHUNK + 519], &x[3 * int8::CHUNK..3 * int8::CHUNK + 519]);
    // Read onto a base as a pull's difference: the base plus exactly that, F32 tensor included.
    let base: Vec<f32> = (0..l.len()).map(|i| i as f32 * 0.25 - 7.0).collect();
    let mut onto = vec![f32::NAN; l.len()];
    int8::add_delta(&mixed, &l, &base, &mut onto).unwrap();
    assert!(onto.iter().zip(base.iter().zip(&out)).all(|(o, (b, d))| o.to_bits() == (b + d).to_bits()));
    // A model that is not finite is refused, naming where.
    let mut bad = base.clone();
    bad[3 * int8::CHUNK + 5] = f32::NAN;
    let e = int8::add_delta(&mixed, &l, &bad, &mut onto).unwrap_err();
    assert_eq!(
        (e.reason(), e.to_string()),
        ("non_finite", "tensor \"b\" holds a non-finite value (NaN) at element 5".into())
    );
    let refused = |tensors: Vec<ParsedTensor<'_>>| {
        let mut out = vec![0.0; l.len()];
        decode_gradient(&rebuild(tensors), &l, &mut out).unwrap_err()
    };
    // An int8 tensor without its scales.
    let e = refused(vec![tensor("w"), tensor("int8.scale.w"), tensor("b"), tensor("s")]);
    assert_eq!((e.reason(), e.to_string().contains("int8.scale.b")), ("layout_mismatch", true), "{e}");
    // Scales for a tensor sent as F32.
    let e = refused(vec![
        tensor("w"),
        tensor("int8.scale.w"),
        b_f32.clone(),
        tensor("int8.scale.b"),
        tensor("s"),
        tensor("int8.scale.s"),
    ]);
    assert_eq!(e.reason(), "malformed_body", "{e}");
    // Scales of a tensor the model does not have.
    let (n, d, s, b) = tensor("int8.scale.s");
    let e = refused(vec![
        tensor("w"),
        tensor("int8.scale.w"),
        tensor("b"),
        tensor("int8.scale.b"),
        tensor("s"),
        (n.clone(), d, s.clone(), b),
        ("int8.scale.zz".into(), d, s, b),
    ]);
    assert_eq!(e.reason(), "layout_mismatch", "{e}");
    // One scale too few, scales in another dtype, a scale that is not finite.
    let (n, _, _, b) = tensor("int8.scale.w");
    let e = refused(vec![
        (n.clone(), Dtype::F32, vec![2], &b[..8]),
        tensor("w"),
        tensor("b"),
        tensor("int8.scale.b"),
        tensor("s"),
        tensor("int8.scale.s"),
    ]);
    assert_eq!(e.reason(), "shape_mismatch", "{e}");
    let e = refused(vec![
        (n.clone(), Dtype::I32, vec![3], b),
        tensor("w"),
        tensor("b"),
        tensor("int8.scale.b"),
        tensor("s"),
        tensor("int8.scale.s"),
    ]);
    assert_eq!(e.reason(), "dtype_mismatch", "{e}");
    let mut nan = b.to_vec();
    nan[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
    let e = refused(vec![
        (n.clone(), Dtype::F32, vec![3], &nan[..]),
        tensor("w"),
        tensor("b"),
        tensor("int8.scale.b"),
        tensor("s"),
        tensor("int8.scale.s"),
    ]);
    assert_eq!(e.reason(), "non_finite", "{e}");
    // A scale so large that q × scale is beyond what the PS applies.
    let mut big = b.to_vec();
    big[..4].copy_from_slice(&1e20f32.to_le_bytes());
    let e = refused(vec![
        (n, Dtype::F32, vec![3], &big[..]),
        tensor("w"),
        tensor("b"),
        tensor("int8.scale.b"),
        tensor("s"),
        tensor("int8.scale.s"),
    ]);
    assert_eq!(e.reason(), "too_large", "{e}");
    // A model is F32 only, and may not name a tensor like a scale.
    let e = decode_model(&body).unwrap_err();
    assert!(e.to_string().contains("reserved for int8"), "{e}");
    let e = decode_model(&rebuild(vec![tensor("w"), b_f32, tensor("s")])).unwrap_err();
    assert_eq!(e.reason(), "dtype_mismatch", "{e}");
    let reserved =
        Layout::model(vec![TensorSpec { name: "int8.scale.w".into(), shape: vec![1] }]).unwrap_err();
    assert!(reserved.to_string().contains("reserved for int8"), "{reserved}");
}

#[test]
fn bf16_rounding_is_halfs_bit_for_bit() {
    // Every exponent and sign, and each rounding case of the dropped half (below, exactly at
    // and above a half, with an even and an odd last kept bit), NaNs and infinities included.
    let highs = (0..=u16::MAX).step_by(7).chain([0x7f80, 0xff80, 0x7f7f, 0xff7f, 0x7fc0, 0x0000, 0x8000]);
    for high in highs {
        for low in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
            let v = f32::from_bits((u32::from(high) << 16) | low);
            assert_eq!(bf16_bits(v), half::bf16::from_f32(v).to_bits(), "{:#010x}", v.to_bits());
        }
    }
}

#[test]
fn a_body_encoded_into_a_recycled_buffer_is_the_fresh_encoding() {
    let l = Layout::new(vec![
        TensorSpec { name: "w".into(), shape: vec![3000] },
        TensorSpec { name: "b".into(), shape: vec![5] },
    ])
    .unwrap();
    let values: Vec<f32> = (0..l.len()).map(|i| (i as f32 - 1500.0) * 0.37).collect();
    let fresh = encode_bf16(&l, &values);
    assert_eq!(fresh.len(), header(&l, WireDtype::Bf16, &BTreeMap::new()).len() + 2 * l.len());
    let mut widened = vec![0f32; l.len()];
    decode_gradient(&fresh, &l, &mut widened).unwrap();
    let rounded: Vec<f32> = values.iter().map(|v| half::bf16::from_f32(*v).to_f32()).collect();
    assert_eq!(widened, rounded, "the body carries each value rounded to nearest, ties to even");
    // Recycled: of the same length (overwritten, not cleared), longer, shorter. F32 the same.
    let fresh_f32 = encode_f32(&l, &values, &BTreeMap::new());
    for old in
        [vec![0xAB; fresh.len()], vec![0xCD; fresh.len() + 77], vec![1; 9], vec![0xEF; fresh_f32.len()]]
    {
        assert_eq!(encode_bf16_into(&l, &values, old.clone()), fresh);
        assert_eq!(encode_f32_into(&l, &values, old), fresh_f32);
    }
    // Large enough to be encoded on several threads, in pieces.
    let big = Layout::new(vec![TensorSpec {
        name: "w".into(),
        shape: vec![crate::cores::PARALLEL_MIN_LEN + 12_345],
    }])
    .unwrap();
    let values: Vec<f32> = (0..big.len()).map(|i| (i % 4099) as f32 * 0.013 - 20.0).collect();
    let bf16 = encode_bf16_into(&big, &values, vec![7; 3]);
    let head = header(&big, WireDtype::Bf16, &BTreeMap::new()).len();
    let expected: Vec<u8> = values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
    assert!(bf16[head..] == expected[..], "every piece rounded in place");
    assert_eq!(encode_f32_into(&big, &values, bf16), encode_f32(&big, &values, &BTreeMap::new()));
}

#[test]
fn a_layout_names_its_first_difference_from_another() {
    let spec = |n: &str, s: Vec<usize>| TensorSpec { name: n.into(), shape: s };
    let ours = Layout::new(vec![spec("a", vec![2]), spec("b", vec![3, 4])]).unwrap();
    let shape = Layout::new(vec![spec("a", vec![2]), spec("b", vec![3, 5])]).unwrap();
    assert_eq!(
        ours.difference(&shape),
        "tensor 1 is b [3, 4] here and b [3, 5] on the parameter server (2 tensors here, 2 there)"
    );
    let fewer = Layout::new(vec![spec("a", vec![2])]).unwrap();
    assert!(ours.difference(&fewer).starts_with("tensor 1 is b [3, 4] here and nothing on"));
    assert_eq!(ours.difference(&ours), "none found");
}
