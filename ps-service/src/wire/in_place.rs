//! A body decoded as it arrives. When it begins with the layout's own header in the expected
//! element type — what Foresight's client and PS always send — the tensor values are widened
//! into the f32 buffer frame by frame (F32 is one copy), so decoding overlaps the transfer and
//! no body-sized byte buffer is filled and then copied again. Anything else (another dtype,
//! another tensor order, a truncated or overlong body) is collected whole for the general
//! decoder, which says what is wrong with it.

use super::WireDtype;

/// Bytes [`InPlace::feed_checked`] takes at a time: a quarter of a typical L2.
const PIECE: usize = 1 << 18;

/// Where the body is going.
enum Mode {
    /// The first bytes are compared with the expected header.
    Header,
    /// The header matched: the rest lands in the f32 buffer.
    Direct,
    /// Not the expected encoding: everything is collected.
    Collect,
}

/// Reads one body into `out` (the layout's length), or into `spill` when it is not the
/// layout's encoding in the expected dtype. Pure: it does no I/O, its caller feeds it the
/// frames.
pub struct InPlace<'a> {
    header: &'a [u8],
    dtype: WireDtype,
    out: &'a mut [f32],
    spill: &'a mut Vec<u8>,
    mode: Mode,
    /// Body bytes after the header taken in place.
    filled: usize,
    /// A 2-byte element's first byte, when a frame ended inside it.
    half_read: Option<u8>,
}

impl<'a> InPlace<'a> {
    /// `header` is the layout's header in `dtype` ([`super::header`]).
    pub fn new(header: &'a [u8], dtype: WireDtype, out: &'a mut [f32], spill: &'a mut Vec<u8>) -> Self {
        spill.clear();
        Self { header, dtype, out, spill, mode: Mode::Header, filled: 0, half_read: None }
    }

    /// Takes the next piece of the body. Returns the elements of `out` it completed and the
    /// index of the first, so the caller can check them while they are still in cache.
    pub fn feed(&mut self, mut data: &[u8]) -> (usize, &[f32]) {
        if let Mode::Header = self.mode {
            let take = (self.header.len() - self.spill.len()).min(data.len());
            self.spill.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.spill.len() == self.header.len() {
                self.mode = if self.spill[..] == *self.header { Mode::Direct } else { Mode::Collect };
                if let Mode::Direct = self.mode {
                    self.spill.clear();
                }
            } else if !self.header.starts_with(self.spill) {
                self.mode = Mode::Collect;
            }
        }
        match self.mode {
            Mode::Header => (0, &[]),
            Mode::Collect => {
                self.spill.extend_from_slice(data);
                (0, &[])
            }
            Mode::Direct => {
                let size = self.dtype.size();
                if self.filled + data.len() > self.out.len() * size {
                    // Longer than the tensors: the general decoder says what is wrong.
                    self.collect_what_came();
                    self.spill.extend_from_slice(data);
                    return (0, &[]);
                }
                let from = self.filled / size;
                self.take(data);
                self.filled += data.len();
                (from, &self.out[from..self.filled / size])
            }
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
    fn take(&mut self, data: &[u8]) {
        match self.dtype {
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
        if let Mode::Direct = self.mode {
            if self.filled == self.out.len() * self.dtype.size() {
                return true;
            }
            self.collect_what_came();
        }
        false
    }

    /// Direct mode given up: the header and the bytes taken so far go to `spill`. Narrowing a
    /// widened 2-byte value gives its bytes back (a NaN's payload aside, refused either way).
    fn collect_what_came(&mut self) {
        self.spill.extend_from_slice(self.header);
        let whole = &self.out[..self.filled / self.dtype.size()];
        match self.dtype {
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

    use super::InPlace;
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
        let l = layout();
        let head = header(&l, dtype, &BTreeMap::new());
        let (mut out, mut spill) = (vec![0f32; l.len()], vec![1u8; 3]);
        let mut seen = 0;
        let mut reader = InPlace::new(&head, dtype, &mut out, &mut spill);
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
}
