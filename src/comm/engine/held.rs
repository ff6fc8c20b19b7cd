//! Held messages: [`Unreceived`], an incoming message that a receive matched (`MPI_Mprobe`,
//! MPI-4.1 §3.8.2) but did not receive, because it does not fit the receive tensor, and
//! `Matched`, the matched-message handle every receive of `comm` and `checked` probes with.
//! An `Unreceived` travels inside [`Error::Unfit`], so that the message is neither lost nor
//! left for another thread.
//!
//! Here, beside the receives that match (as rsmpi keeps its `Message` beside its probes),
//! is everything these types do: the probe, the receives, the discard on drop, the
//! registry of held messages and the queue of deferred discards. The types themselves are
//! declared (data only) in [`crate::error`], because [`Error::Unfit`] carries them and
//! `error` sits below every module; `comm` gives them their behaviour.
//!
//! Why a matched probe: with `MPI_Probe` then `MPI_Recv` (two calls), two threads receiving
//! from the same `(source, tag)` under `MPI_THREAD_MULTIPLE` can each probe one message and
//! receive the other's. `MPI_Mprobe` takes the message off the queue and hands back a handle
//! that only `MPI_Mrecv` on that handle receives (MPI-4.1 §3.8.2-3), so no other receive can
//! take it. The price: a message that does not fit cannot go back on the queue; instead the
//! error holds it, and [`Unreceived::recv_into`] (or `checked`'s
//! [`Unreceived::recv_new`]) receives it into a right-sized tensor.
//!
//! # Lifetime: MPI_Finalize and threads
//!
//! - A held message can outlive MPI, e.g. in `fn main() -> Result<(), Error>` whose `?`
//!   moves the error into the return slot while `universe` drops and runs `MPI_Finalize`.
//!   Every held message is registered (a weak reference), and `MPI_Finalize` discards all
//!   that are still held: the registry is one of [`crate::lifecycle`]'s, emptied by its
//!   `MPI_COMM_SELF` delete callback (MPI-4.1 §9.5.1: it runs while MPI still works), which
//!   also frees the derived-datatype cache. So the sender is never left blocked; after it,
//!   [`Unreceived::is_held`] is `false`.
//! - Discarding is an `MPI_Mrecv`. Below `MPI_THREAD_MULTIPLE` only the thread that
//!   initialized MPI may call it (`MPI_Is_thread_main`, MPI-4.1 §11.6.4, and the caller's
//!   promise for `MPI_THREAD_FUNNELED`/`SERIALIZED`): a held message dropped on another
//!   thread is queued instead, and received at the next discard on the main thread or at
//!   `MPI_Finalize`, whichever comes first ([`Unreceived::deferred_discards`] counts the
//!   queue). Until then its sender may stay blocked (above the eager limit).
//!
//! This module makes its own MPI calls (`MPI_Mprobe`, `MPI_Mrecv`, `MPI_Get_elements_x`,
//! and for a discard above `int` bytes `MPI_Type_contiguous`/`MPI_Type_free`): rsmpi's
//! `Message` panics when dropped unreceived and its `Status` does not give the byte count of
//! a message above `i32::MAX` bytes; both are needed here.

use std::ffi::{c_int, c_void};
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use mpi::datatype::{BufferMut, Equivalence};
use mpi::ffi::{MPI_Count, MPI_Message, MPI_Status};
use mpi::point_to_point::{Source, Status};
use mpi::raw::AsRaw;
use mpi::topology::Rank;
use mpi::Tag;

use crate::dtype::DType;
use crate::error::{Error, HeldMessage, Matched, Unreceived};
use crate::lifecycle::Registry;

// SAFETY: an MPI message handle is an opaque value that MPI lets any thread receive with
// under MPI_THREAD_MULTIPLE. Below it, a receive is the caller's call (it keeps MPI on the
// threads its level allows), and a drop on a thread other than MPI's main thread does not
// call MPI: it queues the handle for the main thread (`Drop`). `Matched` is received at
// most once: it is moved, never shared.
unsafe impl Send for Matched {}

impl Matched {
    /// `MPI_Mprobe` for the next message from `source` (a process of a communicator) with
    /// `tag`: blocks until one arrives and matches it to this handle alone.
    pub(crate) fn probe<S: Source>(source: &S, tag: Tag) -> Self {
        // Every message that can be held (or queued for a discard) was probed here first.
        HELD_REGISTRY.enlist();
        let mut handle = MaybeUninit::<MPI_Message>::uninit();
        let mut status = MaybeUninit::<MPI_Status>::uninit();
        // While nonblocking collectives of this thread wait for their agreements, poll
        // (`MPI_Improbe`) and resolve them in between (`comm::engine::progress`), so that a peer
        // waiting for one of their data operations is not left waiting on this probe.
        while super::progress::active() {
            let mut flag = 0;
            // SAFETY: as below; MPI writes both out parameters when it sets the flag.
            unsafe {
                mpi::ffi::MPI_Improbe(
                    source.source_rank(),
                    tag,
                    source.as_communicator().as_raw(),
                    &mut flag,
                    handle.as_mut_ptr(),
                    status.as_mut_ptr(),
                );
                if flag != 0 {
                    return Matched {
                        handle: handle.assume_init(),
                        status: status.assume_init(),
                    };
                }
            }
            super::progress::progress_all();
            std::thread::yield_now();
        }
        // SAFETY: a valid rank and communicator (the caller checked the rank); both out
        // parameters are written by MPI_Mprobe before it returns (errors are fatal).
        unsafe {
            mpi::ffi::MPI_Mprobe(
                source.source_rank(),
                tag,
                source.as_communicator().as_raw(),
                handle.as_mut_ptr(),
                status.as_mut_ptr(),
            );
            Matched {
                handle: handle.assume_init(),
                status: status.assume_init(),
            }
        }
    }

    /// The status of the matched message (source, tag, size).
    pub(crate) fn status(&self) -> Status {
        Status::from_raw(self.status)
    }

    /// The message's length in bytes (`MPI_Get_elements_x` on bytes, exact above `int`).
    pub(crate) fn len_bytes(&self) -> u64 {
        let mut n: MPI_Count = 0;
        // SAFETY: a status MPI_Mprobe wrote; the byte type is predefined.
        unsafe {
            mpi::ffi::MPI_Get_elements_x(&self.status, u8::equivalent_datatype().as_raw(), &mut n)
        };
        u64::try_from(n).unwrap_or(0)
    }

    /// `MPI_Mrecv` into `buf`: the caller has compared the message's size with `buf`
    /// (a longer message would be MPI's truncation error).
    pub(crate) fn receive_into<B: BufferMut + ?Sized>(mut self, buf: &mut B) -> Status {
        let mut status = MaybeUninit::<MPI_Status>::uninit();
        // SAFETY: `buf` is a BufferMut (writable `count` items of its datatype, by its
        // unsafe impl); the handle is a matched message not yet received (MPI_Mrecv sets it
        // to MPI_MESSAGE_NULL, so Drop does nothing after it).
        unsafe {
            mpi::ffi::MPI_Mrecv(
                buf.pointer_mut(),
                buf.count(),
                buf.as_datatype().as_raw(),
                &mut self.handle,
                status.as_mut_ptr(),
            );
            Status::from_raw(status.assume_init())
        }
    }

    /// `MPI_Mrecv` into `count` units of `datatype` at `ptr` (a window inside a buffer that
    /// is not an rsmpi [`BufferMut`]).
    ///
    /// # Safety
    /// `ptr` has room for `count` units of `datatype`, and nothing else reads or writes it
    /// until this returns; the caller has compared the message's size with that room.
    pub(crate) unsafe fn receive_raw(
        mut self,
        ptr: *mut c_void,
        count: mpi::Count,
        datatype: mpi::ffi::MPI_Datatype,
    ) -> Status {
        let mut status = MaybeUninit::<MPI_Status>::uninit();
        // SAFETY: the caller's contract covers the buffer; the handle is a matched message
        // not yet received (MPI_Mrecv sets it to MPI_MESSAGE_NULL, so Drop does nothing).
        unsafe {
            mpi::ffi::MPI_Mrecv(ptr, count, datatype, &mut self.handle, status.as_mut_ptr());
            Status::from_raw(status.assume_init())
        }
    }

    /// Whether the handle is `MPI_MESSAGE_NULL` (received, discarded or forgotten).
    fn is_null(&self) -> bool {
        // SAFETY: reading a handle value.
        self.handle == unsafe { mpi::ffi::RSMPI_MESSAGE_NULL }
    }

    /// Receives the message into scratch bytes and drops them (what an unreceived handle
    /// comes to), on this thread, now: the caller has checked that this thread may call
    /// MPI and that MPI still works (or runs inside `MPI_Finalize`'s hook). Without memory
    /// for the scratch the handle is leaked: nothing else can be done without a panic.
    /// Afterwards the handle is `MPI_MESSAGE_NULL` either way.
    fn discard_now(&mut self) {
        if !self.is_null() {
            self.receive_scratch();
        }
        // SAFETY: reading a handle value.
        self.handle = unsafe { mpi::ffi::RSMPI_MESSAGE_NULL };
    }

    fn receive_scratch(&mut self) {
        const BLOCK: u64 = 1 << 30;
        let bytes = self.len_bytes();
        // Up to int bytes: that many bytes; beyond: whole 2^30-byte blocks (a receive buffer
        // may be longer than the message, MPI-4.1 §3.2.4).
        let (count, block) = match c_int::try_from(bytes) {
            Ok(n) => (n, None),
            Err(_) => match c_int::try_from(bytes.div_ceil(BLOCK)) {
                Ok(n) => (n, Some(BLOCK)),
                Err(_) => return,
            },
        };
        let len = usize::try_from(u64::try_from(count).unwrap_or(0) * block.unwrap_or(1));
        let mut scratch = Vec::<u8>::new();
        if len.map_or(true, |len| scratch.try_reserve_exact(len).is_err()) {
            return;
        }
        let byte = u8::equivalent_datatype().as_raw();
        let mut datatype = byte;
        if block.is_some() {
            // SAFETY: a predefined old type; `datatype` receives the new handle.
            unsafe {
                mpi::ffi::MPI_Type_contiguous(1 << 30, byte, &mut datatype);
                mpi::ffi::MPI_Type_commit(&mut datatype);
            }
        }
        let mut status = MaybeUninit::<MPI_Status>::uninit();
        // SAFETY: the scratch has capacity for `count` items of `datatype` (MPI writes
        // bytes only, into reserved capacity the Vec never reads); the handle is matched
        // and not yet received. MPI_UINT8_T stands for MPI_BYTE (which rsmpi does not
        // expose) as elsewhere in this crate: the bytes are dropped unread.
        unsafe {
            mpi::ffi::MPI_Mrecv(
                if count == 0 {
                    // An empty Vec's dangling pointer (0x1) is Open MPI's MPI_IN_PLACE.
                    std::ptr::null_mut()
                } else {
                    scratch.as_mut_ptr().cast::<c_void>()
                },
                count,
                datatype,
                &mut self.handle,
                status.as_mut_ptr(),
            );
            if block.is_some() {
                mpi::ffi::MPI_Type_free(&mut datatype);
            }
        }
    }
}

impl Drop for Matched {
    /// Discards a message still held: now on a thread that may call MPI, else queued for
    /// the main thread (see the module docs); nothing after `MPI_Finalize` (whose hook
    /// discarded every registered message).
    fn drop(&mut self) {
        if self.is_null() || mpi::environment::is_finalized() {
            return;
        }
        if !may_call_mpi_here() {
            // SAFETY: reading a handle value.
            let null = unsafe { mpi::ffi::RSMPI_MESSAGE_NULL };
            let handle = std::mem::replace(&mut self.handle, null);
            deferred().push(Matched {
                handle,
                status: self.status,
            });
            return;
        }
        self.discard_now();
        drain_deferred();
    }
}

/// Whether this thread may call `MPI_Mrecv` unasked: MPI provides `MPI_THREAD_MULTIPLE`, or
/// this is the thread that initialized MPI (`MPI_Is_thread_main`, MPI-4.1 §11.6.4).
fn may_call_mpi_here() -> bool {
    if mpi::environment::threading_support() == mpi::Threading::Multiple {
        return true;
    }
    let mut main: c_int = 0;
    // SAFETY: MPI is initialized and not finalized (the caller checked); `main` is written.
    unsafe { mpi::ffi::MPI_Is_thread_main(&mut main) };
    main != 0
}

/// Messages dropped on a thread that may not call MPI, waiting for the main thread.
fn deferred() -> MutexGuard<'static, Vec<Matched>> {
    static DEFERRED: OnceLock<Mutex<Vec<Matched>>> = OnceLock::new();
    DEFERRED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Discards every queued message, on this thread (one that may call MPI).
fn drain_deferred() {
    loop {
        // The queue's lock is released before each receive (which may block).
        let next = deferred().pop();
        match next {
            Some(mut matched) => matched.discard_now(),
            None => return,
        }
    }
}

/// The held messages alive now, for [`discard_all_at_finalize`].
fn registry() -> MutexGuard<'static, Vec<Weak<HeldMessage>>> {
    static LIVE: OnceLock<Mutex<Vec<Weak<HeldMessage>>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The held and queued messages as a registry of [`crate::lifecycle`], enlisted by
/// [`Matched::probe`].
static HELD_REGISTRY: Registry = Registry::new(discard_all_at_finalize);

/// Discards every message still held and every queued one; run by `MPI_Finalize` (through
/// [`crate::lifecycle`], MPI-4.1 §9.5.1), on the thread that finalizes, while MPI still
/// works.
fn discard_all_at_finalize() {
    let live: Vec<Arc<HeldMessage>> = registry().drain(..).filter_map(|w| w.upgrade()).collect();
    for held in live {
        let taken = held
            .message
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(mut matched) = taken {
            matched.discard_now();
        }
    }
    drain_deferred();
}

impl Unreceived {
    /// Holds `matched`; `sent` is the dtype and shape the checked protocol's header gave
    /// (`None` for a plain message). Registers it for [`discard_all_at_finalize`] (whose
    /// registry [`Matched::probe`] enlisted).
    pub(crate) fn new(matched: Matched, sent: Option<(DType, Vec<i64>)>) -> Self {
        let status = matched.status();
        let held = Arc::new(HeldMessage {
            source_rank: status.source_rank(),
            tag: status.tag(),
            len_bytes: matched.len_bytes(),
            message: Mutex::new(Some(matched)),
            sent,
        });
        let mut live = registry();
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&held));
        Unreceived(held)
    }

    /// Messages dropped unreceived on a thread that may not call MPI (below
    /// `MPI_THREAD_MULTIPLE`, not MPI's main thread), waiting to be discarded by the next
    /// discard on the main thread or by `MPI_Finalize` (see the module docs).
    pub fn deferred_discards() -> usize {
        deferred().len()
    }

    fn slot(&self) -> MutexGuard<'_, Option<Matched>> {
        self.0
            .message
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the message out to receive it, or [`Error::AlreadyReceived`].
    pub(crate) fn take(&self) -> Result<Matched, Error> {
        self.slot().take().ok_or(Error::AlreadyReceived {
            source_rank: self.0.source_rank,
            tag: self.0.tag,
        })
    }

    /// Puts back a message taken with [`Unreceived::take`] that still did not fit.
    pub(crate) fn put_back(&self, matched: Matched) {
        *self.slot() = Some(matched);
    }

    /// The rank the message came from (in the communicator it was received on).
    pub fn source_rank(&self) -> Rank {
        self.0.source_rank
    }

    /// The message's tag.
    pub fn tag(&self) -> Tag {
        self.0.tag
    }

    /// The message's length in bytes (exact, also above `i32::MAX`).
    pub fn len_bytes(&self) -> u64 {
        self.0.len_bytes
    }

    /// The dtype the sender's header gave (checked protocol only; `None` for a plain
    /// message, whose dtype only the sender knows).
    pub fn sent_dtype(&self) -> Option<DType> {
        self.0.sent.as_ref().map(|(dtype, _)| *dtype)
    }

    /// The shape the sender's header gave, in elements (checked protocol only).
    pub fn sent_shape(&self) -> Option<&[i64]> {
        self.0.sent.as_ref().map(|(_, shape)| &shape[..])
    }

    /// Whether the message is still held (not yet received or discarded).
    pub fn is_held(&self) -> bool {
        self.slot().is_some()
    }

    /// Receives the message into scratch memory now and drops it (what dropping the last
    /// clone does). Does nothing when it is no longer held. On a thread that may not call
    /// MPI (below `MPI_THREAD_MULTIPLE`, not MPI's main thread) the message is queued for
    /// the main thread instead (see [`Unreceived::deferred_discards`]).
    pub fn discard(&self) {
        drop(self.slot().take());
    }
}

impl fmt::Debug for Unreceived {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unreceived")
            .field("source_rank", &self.0.source_rank)
            .field("tag", &self.0.tag)
            .field("len_bytes", &self.0.len_bytes)
            .field("sent", &self.0.sent)
            .field("held", &self.is_held())
            .finish()
    }
}

impl PartialEq for Unreceived {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Unreceived {}
