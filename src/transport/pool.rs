//! The pinned host buffers staging copies go through, reused across operations.

use std::ptr::NonNull;
use std::sync::Mutex;

use super::route::no_runtime_error;
use crate::error::Result;
use crate::runtime::DeviceRuntime;

/// Smallest pinned buffer allocated (sizes are rounded up to a power of two, at least this).
const MIN_PINNED_BYTES: usize = 64 << 10;
/// Pinned bytes a `DeviceComm` keeps for reuse; buffers beyond are freed when released.
pub const MAX_POOLED_BYTES: usize = 1 << 30;

/// Reused pinned host buffers (addresses kept as integers: the pool hands each out to one
/// user at a time).
pub(super) struct PinnedPool<'r> {
    runtime: Option<&'r dyn DeviceRuntime>,
    free: Mutex<Vec<(usize, usize)>>,
}

impl<'r> PinnedPool<'r> {
    /// An empty pool allocating from `runtime` (`None`: every `take` is refused).
    pub(super) fn new(runtime: Option<&'r dyn DeviceRuntime>) -> Self {
        PinnedPool {
            runtime,
            free: Mutex::new(Vec::new()),
        }
    }

    /// A buffer of at least `bytes` bytes: the smallest free one that fits, or a new one.
    pub(super) fn take(&self, bytes: usize) -> Result<PinnedBuf<'_, 'r>> {
        let runtime = self.runtime.ok_or_else(no_runtime_error)?;
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, (_, cap))| *cap >= bytes)
            .min_by_key(|(_, (_, cap))| *cap)
            .map(|(i, _)| i);
        let (addr, cap) = match best {
            Some(i) => free.swap_remove(i),
            None => {
                drop(free);
                let cap = bytes
                    .checked_next_power_of_two()
                    .unwrap_or(bytes)
                    .max(MIN_PINNED_BYTES);
                (runtime.alloc_pinned(cap)?.as_ptr() as usize, cap)
            }
        };
        Ok(PinnedBuf {
            pool: self,
            addr,
            cap,
        })
    }
}

impl Drop for PinnedPool<'_> {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime else { return };
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (addr, cap) in free {
            if let Some(p) = NonNull::new(addr as *mut u8) {
                // SAFETY: every pooled buffer came from this runtime's alloc_pinned(cap)
                // and is in the free list exactly once (no PinnedBuf can outlive the pool).
                unsafe { runtime.free_pinned(p, cap) };
            }
        }
    }
}

/// One pinned buffer lent by a [`PinnedPool`]; returned to it (or freed) on drop.
pub(super) struct PinnedBuf<'p, 'r> {
    pool: &'p PinnedPool<'r>,
    addr: usize,
    cap: usize,
}

impl PinnedBuf<'_, '_> {
    /// The buffer's first byte (at least the requested size is writable from it).
    pub(super) fn ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

impl Drop for PinnedBuf<'_, '_> {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
        let pooled: usize = free.iter().map(|(_, cap)| cap).sum();
        if pooled + self.cap <= MAX_POOLED_BYTES {
            free.push((self.addr, self.cap));
            return;
        }
        drop(free);
        if let (Some(rt), Some(p)) = (self.pool.runtime, NonNull::new(self.ptr())) {
            // SAFETY: allocated by this runtime's alloc_pinned(cap); no longer in use (the
            // buffer is being dropped) and not in the free list.
            unsafe { rt.free_pinned(p, self.cap) };
        }
    }
}
