//! A model version as a ready-to-send safetensors body, readable while it is still being copied.
//!
//! Copying a 100M-parameter model takes tens of milliseconds. A pull that waited for the whole
//! copy before its first byte would pay it on top of the transfer; instead the copy publishes each
//! shard as it lands ([`Snapshot::ready_len`]) and the server sends the published prefix while the
//! rest is copied. Everything else that reads a snapshot ([`Snapshot::params`]: a backup in an
//! update, an encoder, a checkpoint) waits until it is complete.

use std::mem::ManuallyDrop;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Weak;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};

/// Spare snapshot buffers beyond this many are freed: enough for the next versions' snapshots
/// while the older ones are still being sent, without holding memory after a burst of pulls.
pub const SPARE_SNAPSHOTS: usize = 2;

/// Buffers of snapshots that no one holds any more, for the next versions' snapshots.
#[derive(Default)]
pub(super) struct SnapshotBuffers {
    pub(super) spare: Mutex<Vec<Vec<f32>>>,
}

impl SnapshotBuffers {
    /// A buffer of `len` elements whose contents the caller overwrites entirely.
    pub(super) fn take(&self, len: usize) -> Vec<f32> {
        match self.spare.lock().pop() {
            Some(buf) if buf.len() == len => buf,
            _ => vec![0.0; len],
        }
    }

    fn put(&self, buf: Vec<f32>) {
        let mut spare = self.spare.lock();
        if spare.len() < SPARE_SNAPSHOTS {
            spare.push(buf);
        }
    }
}

/// A model version as a safetensors body: the header, then the parameters.
pub struct Snapshot {
    version: u64,
    words: Words,
    header_words: usize,
    /// The parameter ranges that are copied side by side, in order, each with how far its copy
    /// has got.
    parts: Box<[Part]>,
    complete: Mutex<bool>,
    completed: Condvar,
    /// Where the buffer goes when the last holder lets go (nowhere once the store is gone).
    recycle: Weak<SnapshotBuffers>,
}

struct Part {
    range: Range<usize>,
    /// Parameters below this index (within `range`) are copied and are never written again.
    copied: AtomicUsize,
}

impl Snapshot {
    /// A snapshot whose header is written and whose parameters the copy of `parts` (which cover
    /// the parameters in order) will fill, through [`Snapshot::write`] then [`Snapshot::publish`].
    pub(super) fn filling(
        version: u64,
        mut buf: Vec<f32>,
        header: &[u8],
        parts: impl Iterator<Item = Range<usize>>,
        recycle: Weak<SnapshotBuffers>,
    ) -> Self {
        let header_words = header.len() / 4;
        bytemuck::cast_slice_mut::<f32, u8>(&mut buf[..header_words]).copy_from_slice(header);
        let parts: Box<[Part]> =
            parts.map(|range| Part { copied: AtomicUsize::new(range.start), range }).collect();
        let covered = parts.last().map_or(0, |p| p.range.end);
        assert_eq!(header_words + covered, buf.len(), "the parts cover the parameters");
        let nothing_to_copy = parts.iter().all(|p| p.range.is_empty());
        Self {
            version,
            words: Words::new(buf),
            header_words,
            parts,
            complete: Mutex::new(nothing_to_copy),
            completed: Condvar::new(),
            recycle,
        }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// The parameters, once the copy is complete (this waits for it).
    pub fn params(&self) -> &[f32] {
        self.wait_complete();
        // SAFETY: complete: nothing writes the buffer any more.
        unsafe { self.words.slice(self.header_words..self.words.len) }
    }

    /// The whole safetensors body, once the copy is complete (this waits for it).
    pub fn bytes(&self) -> &[u8] {
        self.wait_complete();
        // SAFETY: complete: nothing writes the buffer any more.
        bytemuck::cast_slice(unsafe { self.words.slice(0..self.words.len) })
    }

    /// The body's length in bytes.
    pub fn len_bytes(&self) -> usize {
        self.words.len * 4
    }

    /// How many of the body's bytes, from the start, are final now.
    pub fn ready_len(&self) -> usize {
        for part in &self.parts {
            let copied = part.copied.load(Ordering::Acquire);
            if copied < part.range.end {
                return (self.header_words + copied) * 4;
            }
        }
        self.len_bytes()
    }

    /// `range` of the body, if all of it is final ([`Snapshot::ready_len`]).
    pub fn ready_bytes(&self, range: Range<usize>) -> Option<&[u8]> {
        if range.start > range.end || range.end > self.ready_len() {
            return None;
        }
        let (start, end) = (range.start / 4, range.end.div_ceil(4));
        // SAFETY: every word below `ready_len` was published by the copy, which never writes it
        // again (the Acquire in `ready_len` pairs with the Release in `publish`).
        let words = bytemuck::cast_slice::<f32, u8>(unsafe { self.words.slice(start..end) });
        Some(&words[range.start - start * 4..range.end - start * 4])
    }

    pub fn is_complete(&self) -> bool {
        *self.complete.lock()
    }

    fn wait_complete(&self) {
        let mut complete = self.complete.lock();
        while !*complete {
            self.completed.wait(&mut complete);
        }
    }

    /// Where the copy writes the parameters `range` (inside part `part`).
    ///
    /// # Safety
    /// Only the one copy of this snapshot calls it, each range once, before publishing it: no
    /// reader sees a range until [`Snapshot::publish`] says it is copied.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn write(&self, part: usize, range: Range<usize>) -> &mut [f32] {
        let p = &self.parts[part];
        assert!(
            p.copied.load(Ordering::Relaxed) <= range.start && range.end <= p.range.end,
            "each range is written once, inside its part"
        );
        let words = self.header_words + range.start..self.header_words + range.end;
        // SAFETY: the range is not yet published (checked above), so no reader holds it, and the
        // caller writes each range once.
        unsafe { self.words.slice_mut(words) }
    }

    /// Part `part` is copied up to parameter `end`.
    pub(super) fn publish(&self, part: usize, end: usize) {
        self.parts[part].copied.store(end, Ordering::Release);
    }

    /// Every part is copied: readers of [`Snapshot::params`] go on.
    pub(super) fn finish(&self) {
        debug_assert!(self.parts.iter().all(|p| p.copied.load(Ordering::Relaxed) == p.range.end));
        *self.complete.lock() = true;
        self.completed.notify_all();
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let buf = self.words.take();
        if let Some(buffers) = self.recycle.upgrade() {
            buffers.put(buf);
        }
    }
}

impl AsRef<[u8]> for Snapshot {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

/// A `Vec<f32>` taken apart, so that one thread writes some of its elements while others read
/// other (already written) ones: no reference to the whole vector exists while that happens.
struct Words {
    ptr: NonNull<f32>,
    len: usize,
    cap: usize,
}

// SAFETY: `Words` owns its allocation like the `Vec` it came from; who may touch which elements
// when is the business of `Snapshot` (each element written once, by one thread, before it is
// published; read only after).
unsafe impl Send for Words {}
unsafe impl Sync for Words {}

impl Words {
    fn new(buf: Vec<f32>) -> Self {
        let mut buf = ManuallyDrop::new(buf);
        let ptr = NonNull::new(buf.as_mut_ptr()).expect("a Vec's pointer is never null");
        Self { ptr, len: buf.len(), cap: buf.capacity() }
    }

    /// # Safety
    /// No one writes `range` while the slice lives.
    unsafe fn slice(&self, range: Range<usize>) -> &[f32] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: inside the allocation (checked); no writer (the caller's promise).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(range.start), range.len()) }
    }

    /// # Safety
    /// No one else reads or writes `range` while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut(&self, range: Range<usize>) -> &mut [f32] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: inside the allocation (checked); exclusive (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(range.start), range.len()) }
    }

    /// The vector back, leaving an empty one (what `Drop` frees).
    fn take(&mut self) -> Vec<f32> {
        let old = ManuallyDrop::new(std::mem::replace(self, Words::new(Vec::new())));
        // SAFETY: the parts of a Vec<f32> this struct took apart, given back once.
        unsafe { Vec::from_raw_parts(old.ptr.as_ptr(), old.len, old.cap) }
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        drop(self.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filling(parts: &[Range<usize>]) -> Snapshot {
        let params = parts.last().map_or(0, |p| p.end);
        Snapshot::filling(7, vec![0.0; 2 + params], b"HEADER..", parts.iter().cloned(), Weak::new())
    }

    #[test]
    fn only_the_published_prefix_is_ready() {
        let s = filling(&[0..4, 4..6]);
        assert_eq!(s.ready_len(), 8, "the header only");
        assert_eq!(s.ready_bytes(0..8), Some(&b"HEADER.."[..]));
        assert_eq!(s.ready_bytes(0..9), None);
        // The second part finishes first: nothing beyond the first part's progress is ready.
        unsafe { s.write(1, 4..6) }.copy_from_slice(&[5.0, 6.0]);
        s.publish(1, 6);
        assert_eq!(s.ready_len(), 8);
        unsafe { s.write(0, 0..2) }.copy_from_slice(&[1.0, 2.0]);
        s.publish(0, 2);
        assert_eq!(s.ready_len(), 16);
        assert_eq!(s.ready_bytes(12..16), Some(&2f32.to_le_bytes()[..]));
        assert!(!s.is_complete());
        unsafe { s.write(0, 2..4) }.copy_from_slice(&[3.0, 4.0]);
        s.publish(0, 4);
        assert_eq!(s.ready_len(), s.len_bytes());
        s.finish();
        assert_eq!(s.params(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(&s.bytes()[..8], b"HEADER..");
    }

    #[test]
    #[should_panic(expected = "written once")]
    fn a_published_range_is_never_written_again() {
        let s = filling(std::slice::from_ref(&(0..4)));
        s.publish(0, 2);
        let _ = unsafe { s.write(0, 1..3) };
    }

    #[test]
    fn readers_of_the_parameters_wait_for_the_copy() {
        let s = std::sync::Arc::new(filling(std::slice::from_ref(&(0..3))));
        let reader = {
            let s = s.clone();
            std::thread::spawn(move || s.params().to_vec())
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!reader.is_finished(), "the reader waits while the copy runs");
        unsafe { s.write(0, 0..3) }.copy_from_slice(&[1.0, 2.0, 3.0]);
        s.publish(0, 3);
        s.finish();
        assert_eq!(reader.join().unwrap(), vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn a_dropped_snapshot_gives_its_buffer_back() {
        let buffers = std::sync::Arc::new(SnapshotBuffers::default());
        let s = Snapshot::filling(
            1,
            vec![0.0; 3],
            b"HEAD",
            std::iter::once(0..2),
            std::sync::Arc::downgrade(&buffers),
        );
        drop(s);
        assert_eq!(buffers.spare.lock().iter().map(Vec::len).collect::<Vec<_>>(), vec![3]);
    }
}
