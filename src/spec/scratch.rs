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
//! message). It is emptied by `MPI_Finalize`, through the same `MPI_COMM_SELF` attribute
//! delete callback that frees the derived-datatype cache (MPI-4.1 §9.5.1, see `datatype`), so
//! no pooled memory outlives MPI (memory an MPI library registered for RDMA is released
//! while it can still deregister it); after finalize, returned buffers are freed at once.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// The environment variable that sets the pool's cap (bytes) when [`set_pool_cap_bytes`] was
/// not called.
pub const POOL_CAP_ENV: &str = "DLPACK_MPI_PACK_POOL_BYTES";

/// The default cap of idle pooled bytes: 256 MiB.
pub const DEFAULT_POOL_CAP_BYTES: usize = 256 << 20;

/// The most idle buffers the pool keeps.
pub const POOL_MAX_BUFFERS: usize = 16;

/// `usize::MAX`: not set yet (read the environment on first use).
static CAP_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);

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

/// Reads a `DLPACK_MPI_PACK_POOL_BYTES` value: a byte count (decimal); unset or empty →
/// `None`.
///
/// # Errors
/// [`Error::InvalidSetting`] naming any other value.
pub fn parse_pool_cap(value: Option<&str>) -> Result<Option<usize>> {
    parse_byte_count(POOL_CAP_ENV, value)
}

/// Reads the value of the byte-count setting `name`: decimal digits (surrounding blanks
/// ignored); unset or empty → `None`. `usize::MAX` is refused too (it marks "not set" in the
/// settings' atomics).
///
/// # Errors
/// [`Error::InvalidSetting`] naming `name` and the value when it is anything else.
pub(crate) fn parse_byte_count(name: &'static str, value: Option<&str>) -> Result<Option<usize>> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|&n| n != usize::MAX)
            .map(Some)
            .ok_or_else(|| Error::InvalidSetting {
                name,
                value: v.to_string(),
                expected: "a byte count",
            }),
    }
}

/// The cap of idle pooled bytes: [`set_pool_cap_bytes`], else `DLPACK_MPI_PACK_POOL_BYTES`,
/// else [`DEFAULT_POOL_CAP_BYTES`].
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_PACK_POOL_BYTES` is not a byte count.
pub fn pool_cap_bytes() -> Result<usize> {
    match CAP_BYTES.load(Ordering::Relaxed) {
        usize::MAX => {
            let value = std::env::var_os(POOL_CAP_ENV).map(|v| v.to_string_lossy().into_owned());
            let cap = parse_pool_cap(value.as_deref())?.unwrap_or(DEFAULT_POOL_CAP_BYTES);
            set_pool_cap_bytes(cap);
            Ok(cap)
        }
        cap => Ok(cap),
    }
}

/// Sets the cap of idle pooled bytes (see [`pool_cap_bytes`]) and trims the pool to it.
/// `usize::MAX` is read as `usize::MAX - 1`.
pub fn set_pool_cap_bytes(cap: usize) {
    let cap = cap.min(usize::MAX - 1);
    CAP_BYTES.store(cap, Ordering::Relaxed);
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

/// Frees every idle buffer; run by `MPI_Finalize` (see the module docs).
pub(crate) fn release_all() {
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
        pool_cap_bytes()?;
        super::datatype::hook_finalize();
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
        let mut buf = reused.unwrap_or_default();
        // A failed reservation (a broadcast view of 2^31 elements asks for its full packed
        // size) is an error, not the allocator's abort.
        if let Some(more) = len.checked_sub(buf.len()).filter(|&m| m > 0) {
            buf.try_reserve_exact(more).map_err(|_| Error::Allocation {
                bytes: u64::try_from(len).unwrap_or(u64::MAX),
                purpose: "the packed copy of a strided tensor",
            })?;
        }
        buf.resize(len, 0);
        Ok(Scratch(buf))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        let cap = CAP_BYTES.load(Ordering::Relaxed);
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
    fn pool_cap_values() {
        assert_eq!(parse_pool_cap(None).unwrap(), None);
        assert_eq!(parse_pool_cap(Some(" 1024 ")).unwrap(), Some(1024));
        assert!(matches!(
            parse_pool_cap(Some("1M")),
            Err(Error::InvalidSetting { name, .. }) if name == POOL_CAP_ENV
        ));
    }

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
        set_pool_cap_bytes(DEFAULT_POOL_CAP_BYTES);
    }
}
