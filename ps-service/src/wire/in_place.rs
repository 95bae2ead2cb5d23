//! A body decoded as it arrives. When it begins with the layout's own header in the expected
//! element type — what Foresight's client and PS always send — the tensor values are widened
//! into the f32 buffer frame by frame (F32 is one copy), so decoding overlaps the transfer and
//! no body-sized byte buffer is filled and then copied again. Anything else (another dtype,
//! another tensor order, a truncated or overlong body) is collected whole for the general
//! decoder, which says what is wrong with it.

use super::WireDtype;

/// Bytes [`InPlace::feed_checked`] takes at a time: a quarter of a typical L2.
const PIECE: usize = 1 << 18;

/// A header a body may begin with, and the type of the values that follow it.
#[derive(Clone, Copy, Debug)]
pub struct Expected<'a> {
    pub header: &'a [u8],
    pub dtype: WireDtype,
}

/// Where the body is going.
#[derive(Clone, Copy)]
enum Mode<'a> {
    /// The first bytes are compared with the expected headers.
    Header,
    /// A header matched: the rest lands in the f32 buffer as that header's type.
    Direct(Expected<'a>),
    /// Not an expected encoding: everything is collected.
    Collect,
}

/// Reads one body into `out` (the layout's length), or into `spill` when it is not the
/// layout's encoding in an expected dtype. Pure: it does no I/O, its caller feeds it the
/// frames.
pub struct InPlace<'a> {
    expected: &'a [Expected<'a>],
    out: &'a mut [f32],
    spill: &'a mut Vec<u8>,
    mode: Mode<'a>,
    /// Bit i: `expected[i]` agrees with the header bytes read so far. Kept, so that each byte
    /// is compared once however many pieces a long header (100,000 tensors) arrives in.
    alive: u64,
    /// Body bytes after the header taken in place.
    filled: usize,
    /// A 2-byte element's first byte, when a frame ended inside it.
    half_read: Option<u8>,
}

impl<'a> InPlace<'a> {
    /// `expected`: the layout's headers ([`super::header`]) in the dtypes to take in place; a
    /// body beginning with none of them is collected.
    pub fn new(expected: &'a [Expected<'a>], out: &'a mut [f32], spill: &'a mut Vec<u8>) -> Self {
        assert!(expected.len() <= 64, "at most 64 expected encodings");
        spill.clear();
        // One bit per expected encoding (none for none: a shift by 64 is `None`).
        let alive = u64::MAX.checked_shr((64 - expected.len()) as u32).unwrap_or(0);
        Self { expected, out, spill, mode: Mode::Header, alive, filled: 0, half_read: None }
    }

    /// Takes the next piece of the body. Returns the elements of `out` it completed and the
    /// index of the first, so the caller can check them while they are still in cache.
    pub fn feed(&mut self, mut data: &[u8]) -> (usize, &[f32]) {
        while let (Mode::Header, false) = (self.mode, data.is_empty()) {
            let (at, take) = (self.spill.len(), self.header_bytes_wanted().min(data.len()));
            let piece = &data[..take];
            for (i, e) in self.expected.iter().enumerate() {
                if e.header.get(at..at + take) != Some(piece) {
                    self.alive &= !(1 << i);
                }
            }
            self.spill.extend_from_slice(piece);
            data = &data[take..];
            self.mode = self.match_header();
        }
        match self.mode {
            Mode::Header => (0, &[]),
            Mode::Collect => {
                self.spill.extend_from_slice(data);
                (0, &[])
            }
            Mode::Direct(e) => {
                let size = e.dtype.size();
                if self.filled + data.len() > self.out.len() * size {
                    // Longer than the tensors: the general decoder says what is wrong.
                    self.collect_what_came(e);
                    self.spill.extend_from_slice(data);
                    return (0, &[]);
                }
                let from = self.filled / size;
                self.take(e.dtype, data);
                self.filled += data.len();
                (from, &self.out[from..self.filled / size])
            }
        }
    }

    /// Header bytes still to read before the shortest expected header that agrees with those
    /// read so far is complete. Headers of different lengths differ in their 8-byte length
    /// prefix, so no byte after the header is ever taken for it.
    fn header_bytes_wanted(&self) -> usize {
        self.alive().map(|e| e.header.len() - self.spill.len()).min().unwrap_or(0)
    }

    /// The expected encodings that agree with the header bytes read so far.
    fn alive(&self) -> impl Iterator<Item = &Expected<'a>> {
        self.expected.iter().enumerate().filter(|(i, _)| self.alive & (1 << i) != 0).map(|(_, e)| e)
    }

    /// What the header bytes read so far make of the body.
    fn match_header(&mut self) -> Mode<'a> {
        let whole = self.alive().find(|e| e.header.len() == self.spill.len()).copied();
        if let Some(e) = whole {
            self.spill.clear();
            Mode::Direct(e)
        } else if self.alive != 0 {
            Mode::Header
        } else {
            Mode::Collect
        }
    }

    /// [`Self::feed`] a cache-sized piece at a time, each piece's values handed to `first_bad`
    /// while they are still in cache: a frame can be megabytes, and checking it only after the
    /// whole frame was copied read it back from memory (at 25M parameters, about a fifth of a
    /// push's time). Returns the flat index of the first value `first_bad` refused, if any.
    pub fn feed_checked(
        &mut self,
        data: &[u8],
        first_bad: impl Fn(&[f32]) -> Option<usize>,
    ) -> Option<usize> {
        let mut bad = None;
        for piece in data.chunks(PIECE) {
            let (from, fresh) = self.feed(piece);
            if bad.is_none() {
                bad = first_bad(fresh).map(|i| from + i);
            }
        }
        bad
    }

    /// Widens `data`, the body bytes after the first `filled`, into `out`.
    fn take(&mut self, dtype: WireDtype, data: &[u8]) {
        match dtype {
            WireDtype::F32 => {
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(self.out);
                bytes[self.filled..self.filled + data.len()].copy_from_slice(data);
            }
            // A bf16 is the high half of an f32. Unlike `half`'s conversion this does not quiet
            // NaNs, which are refused either way, and it vectorises.
            WireDtype::Bf16 => {
                self.take_pairs(data, |b| f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16))
            }
            WireDtype::F16 => self.take_pairs(data, |b| half::f16::from_le_bytes(b).to_f32()),
        }
    }

    /// Widens the 2-byte values of `data` with `widen`, a generic parameter so that the loop is
    /// compiled for each type: through a function pointer, a 25M-parameter bf16 pull took 70 ms
    /// to widen here.
    fn take_pairs(&mut self, mut data: &[u8], widen: impl Fn([u8; 2]) -> f32) {
        let mut at = self.filled / 2;
        if let (Some(first), Some((&second, rest))) = (self.half_read, data.split_first()) {
            self.out[at] = widen([first, second]);
            self.half_read = None;
            (at, data) = (at + 1, rest);
        }
        let pairs = data.chunks_exact(2);
        if let [last] = pairs.remainder() {
            self.half_read = Some(*last);
        }
        for (o, b) in self.out[at..].iter_mut().zip(pairs) {
            *o = widen([b[0], b[1]]);
        }
    }

    /// True when the body was the header and exactly every value of `out`, now in place;
    /// false when the whole body is in `spill` for the general decoder.
    pub fn finish(mut self) -> bool {
        if let Mode::Direct(e) = self.mode {
            if self.filled == self.out.len() * e.dtype.size() {
                return true;
            }
            self.collect_what_came(e);
        }
        false
    }

    /// Direct mode given up: the header and the bytes taken so far go to `spill`. Narrowing a
    /// widened 2-byte value gives its bytes back (a NaN's payload aside, refused either way).
    fn collect_what_came(&mut self, e: Expected) {
        self.spill.extend_from_slice(e.header);
        let whole = &self.out[..self.filled / e.dtype.size()];
        match e.dtype {
            // Copied as bytes: a truncated body can end inside an element.
            WireDtype::F32 => {
                self.spill.extend_from_slice(&bytemuck::cast_slice::<f32, u8>(self.out)[..self.filled])
            }
            WireDtype::Bf16 => {
                self.spill.extend(whole.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()))
            }
            WireDtype::F16 => {
                self.spill.extend(whole.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()))
            }
        }
        self.spill.extend(self.half_read.take());
        self.mode = Mode::Collect;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{Expected, InPlace};
    use crate::wire::{Layout, TensorSpec, WireDtype, encode_bf16, encode_f32, header};

    fn layout() -> Layout {
        let t = |name: &str, shape: Vec<usize>| TensorSpec { name: name.into(), shape };
        Layout::new(vec![t("a", vec![3, 5]), t("b", vec![7])]).unwrap()
    }

    /// Feeds `body` in pieces of `step` bytes; what landed in place, or what was collected.
    fn read(body: &[u8], step: usize) -> Result<Vec<f32>, Vec<u8>> {
        read_as(WireDtype::F32, body, step)
    }

    /// [`read`], expecting the layout's encoding in `dtype`.
    fn read_as(dtype: WireDtype, body: &[u8], step: usize) -> Result<Vec<f32>, Vec<u8>> {
        read_any(&[dtype], body, step)
    }

    /// [`read`], expecting the layout's encoding in any of `dtypes`.
    fn read_any(dtypes: &[WireDtype], body: &[u8], step: usize) -> Result<Vec<f32>, Vec<u8>> {
        let l = layout();
        let heads: Vec<_> = dtypes.iter().map(|&d| (header(&l, d, &BTreeMap::new()), d)).collect();
        let expected: Vec<_> = heads.iter().map(|(h, d)| Expected { header: h, dtype: *d }).collect();
        let (mut out, mut spill) = (vec![0f32; l.len()], vec![1u8; 3]);
        let mut seen = 0;
        let mut reader = InPlace::new(&expected, &mut out, &mut spill);
        for piece in body.chunks(step) {
            let (from, fresh) = reader.feed(piece);
            assert!(fresh.is_empty() || from == seen, "pieces are handed back in order");
            seen += fresh.len();
        }
        if reader.finish() {
            assert_eq!(seen, out.len(), "every element handed back once");
            Ok(out)
        } else {
            Err(spill)
        }
    }

    #[test]
    fn the_layouts_f32_encoding_lands_in_place_in_pieces_of_any_size() {
        let l = layout();
        let values: Vec<f32> = (0..l.len()).map(|i| i as f32 * 0.5 - 3.0).collect();
        let body = encode_f32(&l, &values, &BTreeMap::new());
        for step in [1, 3, 4, 7, 64, body.len()] {
            assert_eq!(read(&body, step), Ok(values.clone()), "pieces of {step}");
        }
    }

    #[test]
    fn anything_else_is_collected_whole_for_the_decoder() {
        let l = layout();
        let values = vec![0.25f32; l.len()];
        let f32_body = encode_f32(&l, &values, &BTreeMap::new());
        let mut longer = f32_body.clone();
        longer.extend_from_slice(&[0; 4]);
        let with_metadata = encode_f32(&l, &values, &BTreeMap::from([("k".into(), "v".into())]));
        let cases = [
            ("bf16", encode_bf16(&l, &values)),
            ("metadata in the header", with_metadata),
            ("truncated", f32_body[..f32_body.len() - 1].to_vec()),
            ("truncated in the header", f32_body[..5].to_vec()),
            ("one element too long", longer),
        ];
        for (what, body) in cases {
            for step in [1, 5, 4096] {
                assert_eq!(read(&body, step), Err(body.clone()), "{what}, pieces of {step}");
            }
        }
    }

    #[test]
    fn the_layouts_bf16_encoding_is_widened_in_place_across_split_elements() {
        let l = layout();
        // Exactly representable in bf16, so the widened values are the originals.
        let values: Vec<f32> = (0..l.len()).map(|i| i as f32 * 0.25 - 2.0).collect();
        let body = encode_bf16(&l, &values);
        for step in [1, 3, 5, 64, body.len()] {
            assert_eq!(read_as(WireDtype::Bf16, &body, step), Ok(values.clone()), "pieces of {step}");
        }
    }

    #[test]
    fn a_bf16_body_that_is_not_the_layouts_is_collected_byte_for_byte() {
        let l = layout();
        let values = vec![0.5f32; l.len()];
        let body = encode_bf16(&l, &values);
        let mut longer = body.clone();
        longer.push(7);
        let cases = [
            ("f32", encode_f32(&l, &values, &BTreeMap::new())),
            ("truncated inside an element", body[..body.len() - 1].to_vec()),
            ("truncated at an element", body[..body.len() - 2].to_vec()),
            ("one byte too long", longer),
        ];
        for (what, body) in cases {
            for step in [1, 3, 4096] {
                assert_eq!(
                    read_as(WireDtype::Bf16, &body, step),
                    Err(body.clone()),
                    "{what}, pieces of {step}"
                );
            }
        }
    }

    #[test]
    fn a_reader_expecting_several_dtypes_takes_each_in_place_and_collects_the_rest() {
        let l = layout();
        // Exactly representable in bf16 and f16, so every widened value is the original.
        let values: Vec<f32> = (0..l.len()).map(|i| i as f32 * 0.25 - 2.0).collect();
        let f16_values: Vec<half::f16> = values.iter().map(|v| half::f16::from_f32(*v)).collect();
        let mut f16_body = header(&l, WireDtype::F16, &BTreeMap::new());
        f16_body.extend(f16_values.iter().flat_map(|v| v.to_le_bytes()));
        let all = [WireDtype::F32, WireDtype::Bf16, WireDtype::F16];
        let bodies = [
            ("f32", encode_f32(&l, &values, &BTreeMap::new())),
            ("bf16", encode_bf16(&l, &values)),
            ("f16", f16_body),
        ];
        for (what, body) in &bodies {
            for step in [1, 3, 8, 9, 64, body.len()] {
                assert_eq!(read_any(&all, body, step), Ok(values.clone()), "{what}, pieces of {step}");
            }
        }
        let with_metadata = encode_f32(&l, &values, &BTreeMap::from([("k".into(), "v".into())]));
        let bf16 = &bodies[1].1;
        let cases = [
            ("metadata in the header", with_metadata),
            ("a bf16 body truncated inside an element", bf16[..bf16.len() - 1].to_vec()),
            ("a bf16 body cut inside its header", bf16[..12].to_vec()),
            ("a bf16 body where an f32 one is the only one expected", bf16.clone()),
        ];
        for (what, body) in cases {
            let expect: &[WireDtype] = if what.contains("only") { &all[..1] } else { &all };
            for step in [1, 5, 4096] {
                assert_eq!(read_any(expect, &body, step), Err(body.clone()), "{what}, pieces of {step}");
            }
        }
        assert_eq!(read_any(&[], &bodies[0].1, 7), Err(bodies[0].1.clone()), "nothing expected");
    }
}
