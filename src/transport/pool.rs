//! The buffers staging copies go through, reused across operations: pinned host buffers
//! (the staged route) and device scratch buffers (the direct route's packed strided tensors).

use std::ptr::NonNull;
use std::sync::Mutex;

use super::route::no_runtime_error;
use crate::device::Device;
use crate::error::Result;
use crate::runtime::DeviceRuntime;

/// Smallest pinned buffer allocated (sizes are rounded up to a power of two, at least this).
const MIN_PINNED_BYTES: usize = 64 << 10;
/// Pinned bytes a `DeviceComm` keeps for reuse; buffers beyond are freed when released.
pub const MAX_POOLED_BYTES: usize = 1 << 30;
/// Device scratch bytes a `DeviceComm` keeps for reuse (all devices together); buffers
/// beyond are freed when released. Scratch buffers hold packed strided tensors of the direct
/// route only, sized like pinned buffers (a power of two, at least 64 KiB).
pub const MAX_POOLED_DEVICE_BYTES: usize = 256 << 20;

/// Which memory a pooled buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Memory {
    /// Page-locked host memory (`alloc_pinned`).
    Pinned,
    /// Memory of this device (`alloc_device`).
    Device(Device),
}

impl Memory {
    fn cap(self) -> usize {
        match self {
            Memory::Pinned => MAX_POOLED_BYTES,
            Memory::Device(_) => MAX_POOLED_DEVICE_BYTES,
        }
    }

    fn is_device(self) -> bool {
        matches!(self, Memory::Device(_))
    }

    /// Frees a buffer of this memory.
    ///
    /// # Safety
    /// `p`/`cap` come from this memory's allocation call of `runtime`, freed once.
    unsafe fn free(self, runtime: &dyn DeviceRuntime, p: NonNull<u8>, cap: usize) {
        // SAFETY: caller's contract.
        unsafe {
            match self {
                Memory::Pinned => runtime.free_pinned(p, cap),
                Memory::Device(d) => runtime.free_device(d, p, cap),
            }
        }
    }
}

/// Reused pinned host and device scratch buffers (addresses kept as integers: the pool hands
/// each out to one user at a time).
pub(super) struct PinnedPool<'r> {
    runtime: Option<&'r dyn DeviceRuntime>,
    free: Mutex<Vec<(Memory, usize, usize)>>,
}

impl<'r> PinnedPool<'r> {
    /// An empty pool allocating from `runtime` (`None`: every `take` is refused).
    pub(super) fn new(runtime: Option<&'r dyn DeviceRuntime>) -> Self {
        PinnedPool {
            runtime,
            free: Mutex::new(Vec::new()),
        }
    }

    /// A pinned buffer of at least `bytes` bytes: the smallest free one that fits, or a new
    /// one.
    pub(super) fn take(&self, bytes: usize) -> Result<PinnedBuf<'_, 'r>> {
        self.take_of(Memory::Pinned, bytes)
    }

    /// A scratch buffer of at least `bytes` bytes in `device`'s memory, as [`Self::take`].
    pub(super) fn take_device(&self, device: Device, bytes: usize) -> Result<PinnedBuf<'_, 'r>> {
        self.take_of(Memory::Device(device), bytes)
    }

    fn take_of(&self, memory: Memory, bytes: usize) -> Result<PinnedBuf<'_, 'r>> {
        let runtime = self.runtime.ok_or_else(no_runtime_error)?;
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, (m, _, cap))| *m == memory && *cap >= bytes)
            .min_by_key(|(_, (_, _, cap))| *cap)
            .map(|(i, _)| i);
        let (addr, cap) = match best {
            Some(i) => {
                let (_, addr, cap) = free.swap_remove(i);
                (addr, cap)
            }
            None => {
                drop(free);
                let cap = bytes
                    .checked_next_power_of_two()
                    .unwrap_or(bytes)
                    .max(MIN_PINNED_BYTES);
                let p = match memory {
                    Memory::Pinned => runtime.alloc_pinned(cap)?,
                    Memory::Device(d) => runtime.alloc_device(d, cap)?,
                };
                (p.as_ptr() as usize, cap)
            }
        };
        Ok(PinnedBuf {
            pool: self,
            memory,
            addr,
            cap,
        })
    }

    /// Bytes of device scratch kept for reuse (all devices).
    #[cfg(test)]
    fn pooled_device_bytes(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.iter()
            .filter(|(m, _, _)| m.is_device())
            .map(|(_, _, cap)| cap)
            .sum()
    }
}

impl Drop for PinnedPool<'_> {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime else { return };
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (memory, addr, cap) in free {
            if let Some(p) = NonNull::new(addr as *mut u8) {
                // SAFETY: every pooled buffer came from this runtime's allocation call of its
                // memory with `cap` bytes and is in the free list exactly once (no PinnedBuf
                // can outlive the pool).
                unsafe { memory.free(runtime, p, cap) };
            }
        }
    }
}

/// One pinned (or device scratch) buffer lent by a [`PinnedPool`]; returned to it (or
/// freed) on drop.
pub(super) struct PinnedBuf<'p, 'r> {
    pool: &'p PinnedPool<'r>,
    memory: Memory,
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
        let device = self.memory.is_device();
        let pooled: usize = free
            .iter()
            .filter(|(m, _, _)| m.is_device() == device)
            .map(|(_, _, cap)| cap)
            .sum();
        if pooled + self.cap <= self.memory.cap() {
            free.push((self.memory, self.addr, self.cap));
            return;
        }
        drop(free);
        if let (Some(rt), Some(p)) = (self.pool.runtime, NonNull::new(self.ptr())) {
            // SAFETY: allocated by this runtime's allocation call of its memory with `cap`
            // bytes; no longer in use (the buffer is being dropped) and not in the free list.
            unsafe { self.memory.free(rt, p, self.cap) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::device_type;
    use crate::runtime::SimulatedRuntime;

    #[test]
    fn device_scratch_is_reused_bounded_and_freed() {
        let sim = SimulatedRuntime::new();
        let cuda = Device::new(device_type::CUDA, 0);
        {
            let pool = PinnedPool::new(Some(&sim));
            let a = pool.take_device(cuda, 1000).unwrap();
            let addr = a.ptr() as usize;
            drop(a);
            assert_eq!(pool.pooled_device_bytes(), MIN_PINNED_BYTES);
            // Reused, not reallocated; a pinned request does not take it.
            assert_eq!(pool.take_device(cuda, 2000).unwrap().ptr() as usize, addr);
            drop(pool.take(10).unwrap());
            // A buffer above the cap is freed on release, not kept.
            drop(pool.take_device(cuda, MAX_POOLED_DEVICE_BYTES).unwrap());
            assert_eq!(pool.pooled_device_bytes(), MIN_PINNED_BYTES);
            assert_eq!(sim.device_live_bytes(), MIN_PINNED_BYTES);
        }
        assert_eq!(sim.device_live_bytes(), 0);
        assert_eq!(sim.pinned_live_bytes(), 0);
    }
}
