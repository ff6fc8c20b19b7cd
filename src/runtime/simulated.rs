//! [`SimulatedRuntime`]: a [`DeviceRuntime`] over host memory, and the [`RuntimeCall`]s it
//! records.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Mutex;

use super::strided::{Copy2d, CopyKind};
use super::{check_placement, DeviceRuntime};
use crate::device::{Device, NO_SYNC_STREAM};
use crate::error::{Error, Result};

/// One call a [`SimulatedRuntime`] received, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeCall {
    /// `device_count()` answered `count`.
    DeviceCount {
        /// The number of simulated devices.
        count: usize,
    },
    /// `select_device(ordinal)` made `ordinal` the process's device.
    SelectDevice {
        /// The ordinal selected.
        ordinal: i32,
    },
    /// `consumer_stream(device)` answered `stream`.
    ConsumerStream {
        /// The device asked about.
        device: Device,
        /// The handle handed out.
        stream: isize,
    },
    /// `synchronize(device, stream)`, with the work it completed.
    Synchronize {
        /// The device.
        device: Device,
        /// The stream value.
        stream: isize,
        /// How many enqueued work items ran.
        completed: usize,
    },
    /// `check_pointer(device, ptr)`.
    PointerCheck {
        /// The label checked.
        device: Device,
        /// The address checked.
        ptr: usize,
    },
    /// A device → host copy; `current` is the device current during the copy.
    CopyToHost {
        /// The tensor's device.
        device: Device,
        /// The device that was current while copying.
        current: i32,
        /// Bytes copied.
        bytes: usize,
    },
    /// A host → device copy.
    CopyToDevice {
        /// The tensor's device.
        device: Device,
        /// The device that was current while copying.
        current: i32,
        /// Bytes copied.
        bytes: usize,
    },
    /// A pinned buffer was allocated.
    AllocPinned {
        /// Its size.
        bytes: usize,
    },
    /// A pinned buffer was freed.
    FreePinned {
        /// Its size.
        bytes: usize,
    },
    /// A batch of pitched 2-D copies (`copy_2d`): what a packed copy of a strided tensor
    /// costs.
    Copy2d {
        /// The device named with the call.
        device: Device,
        /// The device that was current while copying.
        current: i32,
        /// Which memories.
        kind: CopyKind,
        /// Number of 2-D copies in the batch.
        copies: usize,
        /// Bytes copied, all copies together (`width × height` each).
        bytes: usize,
    },
    /// A device buffer was allocated (`alloc_device`).
    AllocDevice {
        /// The device.
        device: Device,
        /// Its size.
        bytes: usize,
    },
    /// A device buffer was freed (`free_device`).
    FreeDevice {
        /// The device.
        device: Device,
        /// Its size.
        bytes: usize,
    },
}

type Work = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct SimState {
    calls: Vec<RuntimeCall>,
    pending: HashMap<isize, Vec<Work>>,
    placements: Vec<(usize, usize, Device)>,
    current: i32,
    pinned_live: usize,
    device_live: usize,
    devices: usize,
    selected: Option<i32>,
    /// Device → host copies left to succeed before each one fails (`None`: never fail).
    copies_to_host_before_failure: Option<usize>,
    /// Host → device copies left to succeed before each one fails (`None`: never fail).
    copies_to_device_before_failure: Option<usize>,
}

/// A [`DeviceRuntime`] over host memory, for tests and for `dlpack-mpi check
/// --simulate-device` on machines without a GPU.
///
/// - Streams: the consumer stream of device `(t, id)` is the handle `0x5100 + 16·id` (never
///   `0`, `1`, `2` or `-1`). Producers may [`SimulatedRuntime::enqueue`] work on a stream —
///   the stand-in for an asynchronous kernel — which runs only when that stream is
///   synchronized: a consumer that forgets to synchronize reads stale data, as on a GPU.
/// - Pointers: [`SimulatedRuntime::place`] says which device a byte range "really" is on;
///   `check_pointer` compares the label with it. Unplaced memory passes as its label.
/// - The current device ([`SimulatedRuntime::current_device`]) is switched to the tensor's
///   device for each copy and restored after, as the CUDA runtime does.
/// - Pinned buffers are page-aligned host allocations; copies are `memcpy`.
/// - Devices: [`SimulatedRuntime::with_devices`] models a node with several GPUs, for the
///   device selection of [`crate::transport::select_device`]; `device_count` and
///   `select_device` are recorded like every other call. Copies and checks accept any
///   ordinal (the number only bounds `select_device`).
pub struct SimulatedRuntime {
    state: Mutex<SimState>,
}

impl std::fmt::Debug for SimulatedRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedRuntime").finish_non_exhaustive()
    }
}

const PINNED_ALIGN: usize = 4096;

impl Default for SimulatedRuntime {
    fn default() -> Self {
        Self::with_devices(1)
    }
}

impl SimulatedRuntime {
    /// A simulated runtime with one device, device 0 current and nothing recorded.
    pub fn new() -> Self {
        Self::default()
    }

    /// A simulated runtime that reports `count` devices (ordinals `0..count`), device 0
    /// current, none selected, nothing recorded.
    pub fn with_devices(count: usize) -> Self {
        SimulatedRuntime {
            state: Mutex::new(SimState {
                devices: count,
                ..SimState::default()
            }),
        }
    }

    /// The ordinal of the last successful `select_device`, if any.
    pub fn selected_device(&self) -> Option<i32> {
        self.state().selected
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SimState> {
        // A panic in a test while holding the lock leaves plain data: keep using it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `work` on `stream`: it runs when `stream` is next synchronized.
    pub fn enqueue(&self, stream: isize, work: impl FnOnce() + Send + 'static) {
        self.state()
            .pending
            .entry(stream)
            .or_default()
            .push(Box::new(work));
    }

    /// Declares that `len` bytes at `ptr` are really memory of `device`.
    pub fn place(&self, ptr: *const c_void, len: usize, device: Device) {
        let start = ptr as usize;
        self.state().placements.push((start, start + len, device));
    }

    /// Makes `ordinal` the current device (what `cuCtxSetCurrent` would).
    pub fn set_current_device(&self, ordinal: i32) {
        self.state().current = ordinal;
    }

    /// The current device's ordinal.
    pub fn current_device(&self) -> i32 {
        self.state().current
    }

    /// Every call so far, oldest first.
    pub fn calls(&self) -> Vec<RuntimeCall> {
        self.state().calls.clone()
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// Bytes of pinned memory allocated and not yet freed.
    pub fn pinned_live_bytes(&self) -> usize {
        self.state().pinned_live
    }

    /// Bytes of device memory (`alloc_device`) allocated and not yet freed.
    pub fn device_live_bytes(&self) -> usize {
        self.state().device_live
    }

    /// Bytes moved by every copy so far (1-D and 2-D, either direction), from the recorded
    /// calls: what the staging of a tensor cost.
    pub fn bytes_copied(&self) -> usize {
        self.state()
            .calls
            .iter()
            .map(|c| match c {
                RuntimeCall::CopyToHost { bytes, .. }
                | RuntimeCall::CopyToDevice { bytes, .. }
                | RuntimeCall::Copy2d { bytes, .. } => *bytes,
                _ => 0,
            })
            .sum()
    }

    /// Fault injection: the next `n` device → host copies succeed, and every one after them
    /// fails with [`Error::Cuda`] (`CUDA_ERROR_ILLEGAL_ADDRESS`, code 700) without copying
    /// (the failed copies are recorded). `None` turns it off.
    pub fn fail_copies_to_host_after(&self, n: Option<usize>) {
        self.state().copies_to_host_before_failure = n;
    }

    /// Fault injection as [`Self::fail_copies_to_host_after`], for host → device copies.
    pub fn fail_copies_to_device_after(&self, n: Option<usize>) {
        self.state().copies_to_device_before_failure = n;
    }

    /// Counts down the injected-failure counter of the copy direction; `Err` when this copy
    /// is to fail (recorded like a copy that ran).
    fn injected(&self, device: Device, bytes: usize, to_host: bool) -> Result<()> {
        let fail = {
            let mut s = self.state();
            let left = if to_host {
                &mut s.copies_to_host_before_failure
            } else {
                &mut s.copies_to_device_before_failure
            };
            match left.as_mut() {
                Some(0) => true,
                Some(n) => {
                    *n -= 1;
                    false
                }
                None => false,
            }
        };
        if !fail {
            return Ok(());
        }
        self.record_copy(device, bytes, to_host, || {});
        Err(Error::Cuda {
            call: if to_host {
                "simulated copy_to_host (injected failure)"
            } else {
                "simulated copy_to_device (injected failure)"
            },
            code: 700,
            name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        })
    }

    /// Work items still queued on `stream`.
    pub fn pending(&self, stream: isize) -> usize {
        self.state().pending.get(&stream).map_or(0, Vec::len)
    }

    /// One 1-D copy of `bytes`, device → host when `to_host`: refused when an injected
    /// failure is due ([`Self::fail_copies_to_host_after`]), else `f` copies, with `device`
    /// current, and the copy is recorded.
    fn copy(&self, device: Device, bytes: usize, to_host: bool, f: impl FnOnce()) -> Result<()> {
        self.injected(device, bytes, to_host)?;
        self.record_copy(device, bytes, to_host, f);
        Ok(())
    }

    /// Runs `f` with `device` current and records it as a 1-D copy of `bytes`.
    fn record_copy(&self, device: Device, bytes: usize, to_host: bool, f: impl FnOnce()) {
        let mut s = self.state();
        let saved = s.current;
        s.current = device.device_id;
        let current = s.current;
        s.calls.push(if to_host {
            RuntimeCall::CopyToHost {
                device,
                current,
                bytes,
            }
        } else {
            RuntimeCall::CopyToDevice {
                device,
                current,
                bytes,
            }
        });
        f();
        s.current = saved;
    }

    fn buffer(&self, bytes: usize, call: &'static str) -> Result<NonNull<u8>> {
        let layout = Self::pinned_layout(bytes.max(1))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        NonNull::new(ptr).ok_or(Error::Cuda {
            call,
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        })
    }

    fn pinned_layout(bytes: usize) -> Result<std::alloc::Layout> {
        std::alloc::Layout::from_size_align(bytes, PINNED_ALIGN).map_err(|_| Error::Overflow {
            quantity: "pinned buffer size",
            lhs: bytes as i128,
            operator: "aligned to",
            rhs: PINNED_ALIGN as i128,
        })
    }
}

// SAFETY: its "device" memory is host memory it allocates with the size asked and frees
// once; its copies are `copy_nonoverlapping` of the spans given, complete on return; it
// checks pointers against its own allocations and producers' labels; its streams do no
// asynchronous work, so synchronizing has nothing left to wait for.
unsafe impl DeviceRuntime for SimulatedRuntime {
    fn describe(&self) -> String {
        let n = self.state().devices;
        format!("simulated device (host memory labelled as GPU memory), {n} device(s)")
    }

    fn device_count(&self) -> usize {
        let mut s = self.state();
        let count = s.devices;
        s.calls.push(RuntimeCall::DeviceCount { count });
        count
    }

    fn select_device(&self, ordinal: i32) -> Result<()> {
        let mut s = self.state();
        super::check_ordinal(ordinal, s.devices)?;
        s.calls.push(RuntimeCall::SelectDevice { ordinal });
        s.current = ordinal;
        s.selected = Some(ordinal);
        Ok(())
    }

    fn consumer_stream(&self, device: Device) -> Result<isize> {
        let stream = 0x5100 + 16 * device.device_id as isize;
        self.state()
            .calls
            .push(RuntimeCall::ConsumerStream { device, stream });
        Ok(stream)
    }

    fn synchronize(&self, device: Device, stream: isize) -> Result<()> {
        if stream == NO_SYNC_STREAM {
            return Ok(());
        }
        let work = self.state().pending.remove(&stream).unwrap_or_default();
        let completed = work.len();
        // Run outside the lock: the work may call back into the runtime.
        for w in work {
            w();
        }
        self.state().calls.push(RuntimeCall::Synchronize {
            device,
            stream,
            completed,
        });
        Ok(())
    }

    fn check_pointer(&self, device: Device, ptr: *const c_void) -> Result<()> {
        let mut s = self.state();
        let addr = ptr as usize;
        s.calls
            .push(RuntimeCall::PointerCheck { device, ptr: addr });
        let placed = s
            .placements
            .iter()
            .rev()
            .find(|(lo, hi, _)| (*lo..*hi).contains(&addr))
            .map(|p| p.2);
        match placed {
            Some(actual) => check_placement(device, actual),
            None => Ok(()),
        }
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<NonNull<u8>> {
        let ptr = self.buffer(bytes, "simulated alloc_pinned")?;
        let mut s = self.state();
        s.pinned_live += bytes;
        s.calls.push(RuntimeCall::AllocPinned { bytes });
        Ok(ptr)
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, bytes: usize) {
        if let Ok(layout) = Self::pinned_layout(bytes.max(1)) {
            // SAFETY: allocated by alloc_pinned with this layout (caller's contract).
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        }
        let mut s = self.state();
        s.pinned_live = s.pinned_live.saturating_sub(bytes);
        s.calls.push(RuntimeCall::FreePinned { bytes });
    }

    unsafe fn copy_to_host(
        &self,
        device: Device,
        dst: *mut u8,
        src: *const c_void,
        bytes: usize,
    ) -> Result<()> {
        self.copy(device, bytes, true, || {
            // SAFETY: caller's contract; the simulated "device" memory is host memory.
            unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst, bytes) }
        })
    }

    unsafe fn copy_to_device(
        &self,
        device: Device,
        dst: *mut c_void,
        src: *const u8,
        bytes: usize,
    ) -> Result<()> {
        self.copy(device, bytes, false, || {
            // SAFETY: caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.cast::<u8>(), bytes) }
        })
    }

    /// Copies row by row with `memcpy` and records one [`RuntimeCall::Copy2d`] for the batch.
    /// Checks what `cuMemcpy2D` checks: each pitch at least the width (else the call is
    /// refused as CUDA refuses it, `CUDA_ERROR_INVALID_VALUE`, and nothing is copied).
    unsafe fn copy_2d(&self, device: Device, kind: CopyKind, copies: &[Copy2d]) -> Result<()> {
        if copies
            .iter()
            .any(|c| c.height > 1 && (c.src_pitch < c.width_bytes || c.dst_pitch < c.width_bytes))
        {
            return Err(Error::Cuda {
                call: "simulated cuMemcpy2DAsync",
                code: 1,
                name: "CUDA_ERROR_INVALID_VALUE".into(),
            });
        }
        let mut s = self.state();
        let saved = s.current;
        s.current = device.device_id;
        let bytes = copies.iter().map(Copy2d::bytes).sum();
        s.calls.push(RuntimeCall::Copy2d {
            device,
            current: device.device_id,
            kind,
            copies: copies.len(),
            bytes,
        });
        for c in copies {
            // SAFETY: caller's contract (rows valid, disjoint); simulated device memory is
            // host memory.
            unsafe { c.copy_on_host() };
        }
        s.current = saved;
        Ok(())
    }

    /// Host memory, placed as memory of `device` ([`SimulatedRuntime::place`]).
    fn alloc_device(&self, device: Device, bytes: usize) -> Result<NonNull<u8>> {
        let ptr = self.buffer(bytes, "simulated alloc_device")?;
        self.place(ptr.as_ptr().cast(), bytes.max(1), device);
        let mut s = self.state();
        s.device_live += bytes;
        s.calls.push(RuntimeCall::AllocDevice { device, bytes });
        Ok(ptr)
    }

    unsafe fn free_device(&self, device: Device, ptr: NonNull<u8>, bytes: usize) {
        if let Ok(layout) = Self::pinned_layout(bytes.max(1)) {
            // SAFETY: allocated by alloc_device with this layout (caller's contract).
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        }
        let mut s = self.state();
        let start = ptr.as_ptr() as usize;
        s.placements.retain(|p| p.0 != start);
        s.device_live = s.device_live.saturating_sub(bytes);
        s.calls.push(RuntimeCall::FreeDevice { device, bytes });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::device_type;

    #[test]
    fn enqueued_work_runs_only_on_synchronize() {
        let sim = SimulatedRuntime::new();
        let cuda = Device::new(device_type::CUDA, 0);
        let s = sim.consumer_stream(cuda).unwrap();
        assert!(![0, 1, 2, -1].contains(&s));
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f2 = flag.clone();
        sim.enqueue(s, move || {
            f2.store(true, std::sync::atomic::Ordering::SeqCst)
        });
        assert_eq!(sim.pending(s), 1);
        sim.synchronize(cuda, -1).unwrap();
        assert!(!flag.load(std::sync::atomic::Ordering::SeqCst));
        sim.synchronize(cuda, s).unwrap();
        assert!(flag.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(sim.pending(s), 0);
    }

    #[test]
    fn placement_mismatch_names_both_devices() {
        let sim = SimulatedRuntime::new();
        let buf = [0u8; 16];
        let on1 = Device::new(device_type::CUDA, 1);
        sim.place(buf.as_ptr().cast(), buf.len(), on1);
        let on0 = Device::new(device_type::CUDA, 0);
        match sim.check_pointer(on0, buf.as_ptr().cast()) {
            Err(Error::DeviceMismatch {
                reported_type,
                reported_id,
                actual_type,
                actual_id,
            }) => assert_eq!(
                (reported_type, reported_id, actual_type, actual_id),
                (2, 0, 2, 1)
            ),
            other => panic!("expected DeviceMismatch, got {other:?}"),
        }
        assert!(sim.check_pointer(on1, buf[4..].as_ptr().cast()).is_ok());
    }

    #[test]
    fn copies_switch_and_restore_the_current_device() {
        let sim = SimulatedRuntime::new();
        let src = [7u8; 8];
        let mut dst = [0u8; 8];
        let d1 = Device::new(device_type::CUDA, 1);
        // SAFETY: both are valid 8-byte buffers.
        unsafe { sim.copy_to_host(d1, dst.as_mut_ptr(), src.as_ptr().cast(), 8) }.unwrap();
        assert_eq!(dst, src);
        assert_eq!(sim.current_device(), 0);
        assert_eq!(
            sim.calls(),
            vec![RuntimeCall::CopyToHost {
                device: d1,
                current: 1,
                bytes: 8
            }]
        );
        let p = sim.alloc_pinned(100).unwrap();
        assert_eq!(p.as_ptr() as usize % PINNED_ALIGN, 0);
        assert_eq!(sim.pinned_live_bytes(), 100);
        // SAFETY: from alloc_pinned(100) just above.
        unsafe { sim.free_pinned(p, 100) };
        assert_eq!(sim.pinned_live_bytes(), 0);
    }
}
