//! The bounded pool of host scratch buffers that packed copies of strided tensors use
//! (a side's packed copy): a buffer is taken for one message and handed back when the
//! message is done, so a loop of strided messages allocates once instead of once per message.
//!
//! **Cap.** The pool keeps idle buffers of at most [`pool_cap_bytes`] bytes in all (default
//! [`DEFAULT_POOL_CAP_BYTES`], 256 MiB; set by [`set_pool_cap_bytes`] or the
//! `DLPACK_MPI_PACK_POOL_BYTES` environment variable, a byte count). Buffers in use are not
//! counted: a message larger than the cap still gets its buffer, which is freed rather than
//! kept. A cap of 0 turns the pool off (every buffer is freed after its message). At most
//! [`POOL_MAX_BUFFERS`] idle buffers are kept; the smallest goes first.
//!
//! **Lifetime.** The pool is process-wide (one mutex; a buffer is taken and returned once per
//! message). It is emptied by `MPI_Finalize`, as a registry of the crate's `lifecycle`
//! module (the one `MPI_COMM_SELF` attribute delete callback, MPI-4.1 §9.5.1, that also
//! frees the derived-datatype cache), so no pooled memory outlives MPI (memory an MPI library
//! registered for RDMA is released while it can still deregister it); after finalize,
//! returned buffers are freed at once.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::lifecycle::Registry;
// The setting (`DLPACK_MPI_PACK_POOL_BYTES`) is in `crate::settings`; its setter,
// `set_pool_cap_bytes`, is here because it trims the pool.
use crate::settings;

// The setting's earlier paths here, deprecated; a glob, so that under `cfg(doc)` the
// hidden re-exports below win and the docs' links to these paths (here and in `comm`) reach
// the settings themselves.
mod deprecated {
    use crate::error::Result;
    use crate::settings;

    old_paths! {
        "use dlpack_mpi::settings::parse_pool_cap" => fn parse_pool_cap(value: Option<&str>) -> Result<Option<usize>> = settings::parse_pool_cap;
        "use dlpack_mpi::settings::pool_cap_bytes" => fn pool_cap_bytes() -> Result<usize> = settings::pool_cap_bytes;
        "use dlpack_mpi::settings::DEFAULT_POOL_CAP_BYTES" => const DEFAULT_POOL_CAP_BYTES: usize = settings::DEFAULT_POOL_CAP_BYTES;
        "use dlpack_mpi::settings::POOL_CAP_ENV" => const POOL_CAP_ENV: &str = settings::POOL_CAP_ENV;
    }
}
#[cfg(doc)]
#[doc(hidden)]
pub use crate::settings::{pool_cap_bytes, DEFAULT_POOL_CAP_BYTES};
pub use deprecated::*;

/// The most idle buffers the pool keeps.
pub const POOL_MAX_BUFFERS: usize = 16;

/// Idle buffers and their total capacity in bytes.
struct Pool {
    free: Vec<Vec<u8>>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    free: Vec::new(),
    bytes: 0,
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Sets the cap of idle pooled bytes (see [`pool_cap_bytes`], and the table of
/// [`crate::settings`]) and trims the pool to it.
pub fn set_pool_cap_bytes(cap: usize) {
    crate::settings::store_pool_cap_bytes(cap);
    let mut p = pool();
    while p.bytes > cap {
        match p.free.pop() {
            Some(b) => p.bytes -= b.capacity(),
            None => break,
        }
    }
}

/// Bytes the pool holds in idle buffers now (for tests and diagnostics).
pub fn pooled_bytes() -> usize {
    pool().bytes
}

/// The pool as a registry of [`crate::lifecycle`]: emptied by `MPI_Finalize`.
static POOL_REGISTRY: Registry = Registry::new(release_all);

/// Frees every idle buffer; run by `MPI_Finalize` (see the module docs).
fn release_all() {
    let free = {
        let mut p = pool();
        p.bytes = 0;
        std::mem::take(&mut p.free)
    };
    drop(free);
}

/// A host buffer of `len` bytes from the pool, handed back when dropped. Its bytes are
/// initialized but unspecified (a previous message's): callers overwrite all of them.
#[derive(Debug)]
pub(crate) struct Scratch(Vec<u8>);

impl Scratch {
    /// A buffer of exactly `len` bytes: the smallest idle one that fits, else a new one.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] from [`pool_cap_bytes`]; [`Error::Allocation`] when the
    /// system refuses the buffer.
    pub(crate) fn take(len: usize) -> Result<Scratch> {
        settings::pool_cap_bytes()?;
        POOL_REGISTRY.enlist();
        let reused = {
            let mut p = pool();
            let best = p
                .free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= len)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            best.map(|i| {
                let b = p.free.swap_remove(i);
                p.bytes -= b.capacity();
                b
            })
        };
        let refused = || Error::Allocation {
            bytes: u64::try_from(len).unwrap_or(u64::MAX),
            purpose: "the packed copy of a strided tensor",
        };
        let Some(mut buf) = reused else {
            return zeroed(len).map(Scratch).ok_or_else(refused);
        };
        // A failed reservation (a broadcast view of 2^31 elements asks for its full packed
        // size) is an error, not the allocator's abort.
        if let Some(more) = len.checked_sub(buf.len()).filter(|&m| m > 0) {
            buf.try_reserve_exact(more).map_err(|_| refused())?;
        }
        buf.resize(len, 0);
        Ok(Scratch(buf))
    }
}

/// A new zeroed buffer of `len` bytes, or `None` when the system refuses it. Zeroed by the
/// allocator (`calloc`: fresh pages from the system are zero already, so a large buffer is
/// not written twice before its first use).
fn zeroed(len: usize) -> Option<Vec<u8>> {
    if len == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `[u8; len]`
    // (size `len`, alignment 1, as `Vec<u8>` allocates), and its `len` bytes are
    // initialized (zero); length and capacity are `len`.
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        // Read (or failed) in `take`, which made this buffer.
        let cap = settings::pool_cap_bytes().unwrap_or(0);
        let size = buf.capacity();
        if size == 0 || size > cap || mpi::environment::is_finalized() {
            return;
        }
        let mut p = pool();
        // Make room: the smallest idle buffers go first.
        while p.bytes + size > cap || p.free.len() >= POOL_MAX_BUFFERS {
            let Some(i) = (0..p.free.len()).min_by_key(|&i| p.free[i].capacity()) else {
                break;
            };
            if p.free[i].capacity() > size {
                return; // keep the larger idle buffers; this one is freed
            }
            let b = p.free.swap_remove(i);
            p.bytes -= b.capacity();
        }
        p.bytes += size;
        p.free.push(buf);
    }
}

impl Deref for Scratch {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Scratch::take asks MPI whether it is initialized (a C call)"
    )]
    fn impossible_buffers_are_typed_errors() {
        // More than isize::MAX bytes: no allocator can give it; nothing is reserved.
        let len = usize::MAX - 1;
        match Scratch::take(len) {
            Err(Error::Allocation { bytes, .. }) => assert_eq!(bytes, u64::MAX - 1),
            other => panic!("expected Error::Allocation, got {other:?}"),
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Scratch::take asks MPI whether it is initialized (a C call)"
    )]
    fn buffers_are_reused_and_bounded() {
        set_pool_cap_bytes(1 << 20);
        let first = Scratch::take(4096).unwrap();
        let ptr = first.as_ptr();
        drop(first);
        assert!(pooled_bytes() >= 4096);
        let again = Scratch::take(1000).unwrap();
        assert_eq!((again.len(), again.as_ptr()), (1000, ptr));
        drop(again);
        drop(Scratch::take(2 << 20).unwrap()); // over the cap: freed, not kept
        assert!(pooled_bytes() <= 1 << 20);
        set_pool_cap_bytes(0);
        assert_eq!(pooled_bytes(), 0);
        set_pool_cap_bytes(settings::DEFAULT_POOL_CAP_BYTES);
    }
}
