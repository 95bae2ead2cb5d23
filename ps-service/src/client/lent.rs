//! A caller's float32 gradient lent to a push as it is: the push sends the caller's own bytes
//! after the safetensors header, instead of a model-sized copy of them (4 bytes per parameter
//! of resident memory and a pass over the model less per push, for the Python package's
//! every-step worker, whose gradients are views into the buffer it lends).

use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;

/// `len` floats lent as bytes ([`Self::bytes`]); what owns them stays alive for as long as any
/// clone of the bytes does: hyper may still hold one after a push's answer came (the stream of
/// a push refused before its body was read is reset a moment later).
pub struct LentFloats {
    bytes: Bytes,
    released: mpsc::Receiver<()>,
}

impl LentFloats {
    /// # Safety
    ///
    /// `ptr` points to `len` floats that stay valid for as long as `owner` lives, and that
    /// nobody writes while a push that uses [`Self::bytes`] is in flight.
    pub unsafe fn new<O: Send + Sync + 'static>(owner: O, ptr: *const f32, len: usize) -> Self {
        let (gone, released) = mpsc::sync_channel(0);
        let bytes = Bytes::from_owner(Owned { ptr: ptr.cast(), len: len * 4, _owner: owner, _gone: gone });
        Self { bytes, released }
    }

    /// The floats' native (little-endian) bytes, as a float32 safetensors body holds them.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Gives the bytes back and waits up to `within` for every clone of them to be dropped:
    /// whether they all were, so the caller may write the floats again with nothing reading.
    pub fn release(self, within: Duration) -> bool {
        drop(self.bytes);
        // Every clone dropped drops the owner, and with it the channel's only sender.
        matches!(self.released.recv_timeout(within), Err(mpsc::RecvTimeoutError::Disconnected))
    }
}

struct Owned<O> {
    ptr: *const u8,
    len: usize,
    _owner: O,
    _gone: mpsc::SyncSender<()>,
}

// SAFETY: the bytes are only read, and only while `_owner` keeps them alive (`LentFloats::new`).
unsafe impl<O: Send> Send for Owned<O> {}
unsafe impl<O: Sync> Sync for Owned<O> {}

impl<O> AsRef<[u8]> for Owned<O> {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `LentFloats::new`'s contract.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::LentFloats;

    #[test]
    fn the_bytes_are_the_floats_and_the_owner_lives_until_the_last_clone_goes() {
        let floats = Arc::new(vec![1.0f32, -2.5, 3.25]);
        let lent = unsafe { LentFloats::new(floats.clone(), floats.as_ptr(), floats.len()) };
        assert_eq!(&lent.bytes()[..], bytemuck::cast_slice::<f32, u8>(&floats));
        let held = lent.bytes().slice(4..8);
        assert_eq!(Arc::strong_count(&floats), 2);
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(&held[..], (-2.5f32).to_le_bytes());
        });
        assert!(lent.release(Duration::from_secs(5)), "released once the clone is dropped");
        holder.join().unwrap();
        assert_eq!(Arc::strong_count(&floats), 1, "the owner went with the last clone");
        let lent = unsafe { LentFloats::new(floats.clone(), floats.as_ptr(), floats.len()) };
        let kept = lent.bytes().clone();
        assert!(!lent.release(Duration::from_millis(20)), "a clone still held");
        drop(kept);
        assert_eq!(Arc::strong_count(&floats), 1);
    }
}
