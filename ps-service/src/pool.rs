//! Model-sized buffers kept for reuse: a fresh one is page-faulted in (and often zero-filled)
//! on every use. The PS's push and pull bodies and a worker's push bodies come from pools.

use std::sync::Arc;

use parking_lot::Mutex;

/// A bounded stack of reusable vectors.
pub struct Pool<T> {
    items: Mutex<Vec<Vec<T>>>,
    cap: usize,
}

/// Two: the vector in use and the one its last user may still hold.
impl<T> Default for Pool<T> {
    fn default() -> Self {
        Self::new(2)
    }
}

impl<T> Pool<T> {
    pub fn new(cap: usize) -> Self {
        Self { items: Mutex::new(Vec::new()), cap }
    }

    /// An empty vector, with the capacity of an earlier one where the pool has one.
    pub fn take(&self) -> Vec<T> {
        let mut v = self.items.lock().pop().unwrap_or_default();
        v.clear();
        v
    }

    /// A vector as it was given back, for a caller that sizes it and overwrites every element
    /// itself (a bf16 pull body of the length of the one before it is not cleared first).
    pub fn take_as_is(&self) -> Vec<T> {
        self.items.lock().pop().unwrap_or_default()
    }

    /// A vector of exactly `n` elements for a caller that writes every element before it reads
    /// any (a gradient body is refused unless it covers every tensor): a recycled one of that
    /// length keeps its old contents, so a model-sized buffer is not zero-filled on every push.
    pub fn take_len(&self, n: usize) -> Vec<T>
    where
        T: Clone + Default,
    {
        let mut v = self.items.lock().pop().unwrap_or_default();
        if v.len() != n {
            v.clear();
            v.resize(n, T::default());
        }
        v
    }

    pub fn give(&self, v: Vec<T>) {
        let mut items = self.items.lock();
        if items.len() < self.cap {
            items.push(v);
        }
    }
}

/// A pooled buffer lent out as a request or response body ([`bytes::Bytes::from_owner`]): back
/// in its pool once hyper has sent (or dropped) it and every clone is gone. A pull encoded per
/// request (bf16, int8), or a worker's next push, then writes into pages that are already mapped
/// instead of faulting in a fresh body-sized buffer.
pub fn lend(pool: &Arc<Pool<u8>>, buf: Vec<u8>) -> bytes::Bytes {
    bytes::Bytes::from_owner(Lent { buf, pool: pool.clone() })
}

struct Lent {
    buf: Vec<u8>,
    pool: Arc<Pool<u8>>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::Pool;

    #[test]
    fn a_lent_body_comes_back_to_its_pool_when_its_last_holder_drops_it() {
        let pool = std::sync::Arc::new(Pool::<u8>::new(2));
        let mut buf = pool.take();
        buf.extend_from_slice(&[1, 2, 3]);
        let at = buf.as_ptr();
        let body = super::lend(&pool, buf);
        let part = body.slice(1..);
        drop(body);
        assert_eq!(&part[..], [2, 3]);
        assert_eq!(pool.items.lock().len(), 0, "still held by a slice of the body");
        drop(part);
        let back = pool.take();
        assert_eq!((back.as_ptr(), back.len(), back.capacity() >= 3), (at, 0, true));
    }

    #[test]
    fn buffers_come_back_without_a_fill_only_at_the_length_asked() {
        let pool = Pool::new(1);
        let mut v = pool.take_len(4);
        assert_eq!(v, [0.0f32; 4]);
        v.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let at = v.as_ptr();
        pool.give(v);
        // The same allocation, as it was: its user overwrites every element.
        let v = pool.take_len(4);
        assert_eq!((v.as_ptr(), &v[..]), (at, &[1.0, 2.0, 3.0, 4.0][..]));
        pool.give(v);
        // Another length: nothing of the old contents.
        assert_eq!(pool.take_len(6), [0.0f32; 6]);
        pool.give(vec![9.0f32; 3]);
        assert!(pool.take().is_empty(), "take hands out an empty vector");
    }
}
