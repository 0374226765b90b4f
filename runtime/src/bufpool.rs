//! Reusable buffers for large messages: encoding a megabyte message and
//! reading a megabyte frame reuse a few buffers instead of asking the
//! allocator for fresh ones, whose pages the kernel must fault in and zero
//! each time (that cost more than the copy itself).
//!
//! Invariants:
//! 1. A pooled buffer is reused only once everything cut from it was
//!    dropped (`BytesMut::try_reclaim`), so a reader of an earlier message
//!    never sees its bytes change.
//! 2. A pool holds at most [`SLOTS`] buffers of at most [`MAX_POOLED`] bytes
//!    each; anything else is an ordinary allocation.

use bytes::BytesMut;

/// Buffers kept per pool (a link queues at most 4 MiB of large payloads,
/// so a sender of 1 MiB messages has about six in use at once).
pub(crate) const SLOTS: usize = 8;
/// Largest buffer kept (a pool holds at most 16 MiB).
pub(crate) const MAX_POOLED: usize = 2 << 20;

/// A few large buffers, reused once their contents are dropped.
#[derive(Default)]
pub(crate) struct BufPool {
    bufs: Vec<BytesMut>,
    /// A buffer too large to pool, or used while every slot is busy.
    spare: BytesMut,
}

impl BufPool {
    /// An empty buffer with room for `len` bytes. Cut what is written with
    /// `split()`; the buffer stays in the pool for the next call.
    pub(crate) fn get(&mut self, len: usize) -> &mut BytesMut {
        if len <= MAX_POOLED {
            if let Some(i) = self.bufs.iter_mut().position(|b| {
                b.clear();
                b.try_reclaim(len)
            }) {
                return &mut self.bufs[i];
            }
            if self.bufs.len() < SLOTS {
                self.bufs.push(BytesMut::with_capacity(len));
                let last = self.bufs.len() - 1;
                return &mut self.bufs[last];
            }
        }
        self.spare = BytesMut::with_capacity(len);
        &mut self.spare
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_reused_only_once_its_contents_are_dropped() {
        let mut pool = BufPool::default();
        let b = pool.get(1 << 20);
        b.extend_from_slice(&[1; 1 << 20]);
        let first = b.split().freeze();
        let p1 = first.as_ptr();
        // Still referenced: another buffer.
        let b = pool.get(1 << 20);
        b.extend_from_slice(&[2; 1 << 20]);
        let second = b.split().freeze();
        assert_ne!(second.as_ptr(), p1);
        assert!(first.iter().all(|x| *x == 1), "invariant 1");
        drop(first);
        // Dropped: the first buffer comes back.
        let b = pool.get(1 << 20);
        assert_eq!(b.as_ptr(), p1);
        drop(second);
    }
}
