//! What the fuzz targets share: the layouts a gradient is decoded against, and the seed corpus,
//! which each target writes with the product's own encoders (so the seeds never go stale):
//! `FORESIGHT_FUZZ_SEEDS=<dir> <target binary>` writes them into `<dir>` and exits
//! (`fuzz/run.sh` does this before every run).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use foresight_ps::wire::{self, Layout, TensorSpec, WireDtype};

fn layout(tensors: &[(&str, &[usize])]) -> Layout {
    let specs = tensors.iter().map(|(n, s)| TensorSpec { name: n.to_string(), shape: s.to_vec() });
    Layout::new(specs.collect()).expect("a valid layout")
}

/// The registered models a gradient body is decoded against; the input's first byte picks one.
pub static LAYOUTS: LazyLock<Vec<Layout>> = LazyLock::new(|| {
    vec![
        layout(&[("w", &[2, 3]), ("b", &[3])]),
        layout(&[("x", &[1])]),
        layout(&[("conv.weight", &[2, 1, 2, 2]), ("conv.bias", &[2]), ("fc", &[4])]),
        layout(&[("big", &[64])]),
    ]
});

/// (layout picked by the first byte, the rest).
pub fn pick_layout(data: &[u8]) -> Option<(usize, &'static Layout, &[u8])> {
    let (&sel, rest) = data.split_first()?;
    let i = sel as usize % LAYOUTS.len();
    Some((i, &LAYOUTS[i], rest))
}

/// f32s as bits, so that comparisons see -0.0, subnormals and NaN payloads.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Values with the edges the decoder checks: zeros, ±MAX_GRADIENT, subnormals, negatives.
pub fn values(n: usize, k: usize) -> Vec<f32> {
    let edges = [0.0, -0.0, 1.0, -1.5, 1e-40, wire::MAX_GRADIENT, -wire::MAX_GRADIENT, 3.25e-3];
    (0..n).map(|i| edges[(i + k) % edges.len()]).collect()
}

/// A body in `dtype` with the layout's header: F32 bytes from `v`, or 16-bit patterns.
pub fn body(layout: &Layout, dtype: WireDtype, v: &[f32], meta: &BTreeMap<String, String>) -> Vec<u8> {
    match dtype {
        WireDtype::F32 => wire::encode_f32(layout, v, meta),
        WireDtype::Bf16 => wire::encode_bf16(layout, v),
        WireDtype::F16 => {
            let mut out = wire::header(layout, WireDtype::F16, meta);
            // 1.0, -2.0, 0, 65504 (the largest f16), a subnormal.
            let pats: [u16; 5] = [0x3c00, 0xc000, 0x0000, 0x7bff, 0x0001];
            for i in 0..layout.len() {
                out.extend_from_slice(&pats[i % pats.len()].to_le_bytes());
            }
            out
        }
    }
}

/// The same tensors in reverse order in the header and the data (a valid body the PS's own
/// client never sends).
pub fn reversed(l: &Layout) -> Layout {
    Layout::new(l.tensors().iter().rev().cloned().collect()).expect("a valid layout")
}

/// Gradient bodies, valid and not, each prefixed with the byte that picks its layout.
pub fn gradient_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let meta = BTreeMap::from([("step".to_string(), "7".to_string())]);
    let none = BTreeMap::new();
    for (i, l) in LAYOUTS.iter().enumerate() {
        let sel = i as u8;
        let mut push = |b: Vec<u8>| out.push([vec![sel], b].concat());
        for (k, dt) in [WireDtype::F32, WireDtype::Bf16, WireDtype::F16].into_iter().enumerate() {
            push(body(l, dt, &values(l.len(), k), &none));
        }
        push(body(l, WireDtype::F32, &values(l.len(), 1), &meta));
        push(wire::int8::encode(l, &mut values(l.len(), 2)));
        let r = reversed(l);
        push(body(&r, WireDtype::F32, &values(r.len(), 2), &none));
        // Refused: NaN, beyond MAX_GRADIENT, truncated, one tensor missing (or another model).
        let mut v = values(l.len(), 0);
        v[l.len() - 1] = f32::NAN;
        push(body(l, WireDtype::F32, &v, &none));
        v[l.len() - 1] = 2e12;
        push(body(l, WireDtype::F32, &v, &none));
        let full = body(l, WireDtype::F32, &values(l.len(), 3), &none);
        push(full[..full.len() - 3].to_vec());
        let other = &LAYOUTS[(i + 1) % LAYOUTS.len()];
        push(body(other, WireDtype::F32, &values(other.len(), 0), &none));
    }
    out.push(vec![0]);
    out.push([&[0u8][..], &8u64.to_le_bytes(), b"{}      "].concat());
    // Tensors sharing offsets, which safetensors hands over in a random order: two empty ones
    // (an unknown name and a wrong shape) and two over the same bytes (one of them the wrong size).
    for (header, data) in [
        (
            r#"{"zz":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#,
            0,
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            4,
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[0],"data_offsets":[0,4]}}"#,
            4,
        ),
    ] {
        out.push(
            [&[0u8][..], &(header.len() as u64).to_le_bytes(), header.as_bytes(), &vec![0u8; data]].concat(),
        );
    }
    out
}

/// Model bodies (`PUT /v1/model`, a pull's answer): any layout, F32.
pub fn model_seeds() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> =
        gradient_seeds().into_iter().map(|s| s[1..].to_vec()).filter(|s| !s.is_empty()).collect();
    let unicode = layout(&[("layer.0/ä", &[1, 2]), ("__meta", &[3])]);
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    out.push(wire::encode_f32(&unicode, &values(5, 0), &meta));
    out
}

/// Writes the seeds `make` returns into `$FORESIGHT_FUZZ_SEEDS` and exits, when that is set.
pub fn write_seeds_if_asked(make: impl FnOnce() -> Vec<Vec<u8>>) {
    let Some(dir) = std::env::var_os("FORESIGHT_FUZZ_SEEDS") else { return };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    let seeds = make();
    for s in &seeds {
        // FNV-1a: the same seed keeps its name across runs.
        let h = s.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        std::fs::write(dir.join(format!("seed-{h:016x}")), s).expect("write a seed");
    }
    eprintln!("wrote {} seeds to {}", seeds.len(), dir.display());
    std::process::exit(0);
}
