//! Test support: raw DLPack tensors built field by field, with counting deleters, so that
//! tests can hand the crate exactly the struct a hostile or buggy producer would.
#![allow(dead_code, missing_docs)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dlpack_mpi::dlpack::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
    ManagedTensor,
};

/// How many times a tensor's deleter ran.
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicUsize>);

impl Counter {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// What the deleter frees: the storage and the arrays the DLTensor points to.
struct Ctx {
    counter: Counter,
    _storage: Vec<u64>,
    _shape: Vec<i64>,
    _strides: Vec<i64>,
}

/// A tensor to build: every DLPack field can be set to anything.
#[derive(Clone, Debug)]
pub struct RawTensor {
    /// Bytes of the storage (padded to 8-byte words, so 8-byte aligned).
    pub bytes: Vec<u8>,
    pub dtype: (u8, u8, u16),
    /// `None` = NULL shape pointer.
    pub shape: Option<Vec<i64>>,
    /// `None` = NULL strides pointer.
    pub strides: Option<Vec<i64>>,
    /// Overrides `ndim` (default: `shape.len()`).
    pub ndim: Option<i32>,
    pub byte_offset: u64,
    /// NULL data pointer.
    pub null_data: bool,
    pub version: (u32, u32),
    pub flags: u64,
    pub device: (u32, i32),
    /// NULL deleter (the tensor's memory is then leaked on purpose, but kept reachable in
    /// [`NULL_DELETER_TENSORS`] so that leak checkers report only real leaks).
    pub null_deleter: bool,
}

/// Structs handed out with a NULL deleter: nobody may free them (the consumer must not call
/// through NULL), so they stay here, reachable, for the life of the process.
pub static NULL_DELETER_TENSORS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

fn keep_reachable(p: usize) {
    NULL_DELETER_TENSORS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(p);
}

pub fn bytes_of<T: Copy>(values: &[T]) -> Vec<u8> {
    let n = std::mem::size_of_val(values);
    let mut out = vec![0u8; n];
    // SAFETY: test helper; T: Copy plain data, copying its bytes.
    unsafe { std::ptr::copy_nonoverlapping(values.as_ptr().cast::<u8>(), out.as_mut_ptr(), n) };
    out
}

impl RawTensor {
    /// A 1-d C-contiguous tensor of `values` with the given dtype.
    pub fn new<T: Copy>(values: &[T], dtype: (u8, u8, u16)) -> Self {
        RawTensor {
            bytes: bytes_of(values),
            dtype,
            shape: Some(vec![values.len() as i64]),
            strides: Some(vec![1]),
            ndim: None,
            byte_offset: 0,
            null_data: false,
            version: (1, 3),
            flags: 0,
            device: (1, 0),
            null_deleter: false,
        }
    }

    pub fn shape(mut self, shape: &[i64], strides: Option<&[i64]>) -> Self {
        self.shape = Some(shape.to_vec());
        self.strides = strides.map(<[i64]>::to_vec);
        self
    }

    fn parts(&self, counter: &Counter) -> (DLTensor, Box<Ctx>) {
        let words = self.bytes.len().div_ceil(8).max(1);
        let mut storage = vec![0u64; words];
        // SAFETY: storage has at least bytes.len() bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.bytes.as_ptr(),
                storage.as_mut_ptr().cast::<u8>(),
                self.bytes.len(),
            )
        };
        let mut shape = self.shape.clone().unwrap_or_default();
        let mut strides = self.strides.clone().unwrap_or_default();
        let t = DLTensor {
            data: if self.null_data {
                std::ptr::null_mut()
            } else {
                storage.as_mut_ptr().cast::<c_void>()
            },
            device: DLDevice {
                device_type: self.device.0,
                device_id: self.device.1,
            },
            ndim: self
                .ndim
                .unwrap_or(self.shape.as_ref().map_or(0, |s| s.len() as i32)),
            dtype: DLDataType {
                code: self.dtype.0,
                bits: self.dtype.1,
                lanes: self.dtype.2,
            },
            shape: if self.shape.is_some() {
                shape.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            },
            strides: if self.strides.is_some() {
                strides.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            },
            byte_offset: self.byte_offset,
        };
        let ctx = Box::new(Ctx {
            counter: counter.clone(),
            _storage: storage,
            _shape: shape,
            _strides: strides,
        });
        (t, ctx)
    }

    /// A `DLManagedTensorVersioned*` and the counter its deleter bumps.
    pub fn versioned(&self) -> (*mut DLManagedTensorVersioned, Counter) {
        let counter = Counter::default();
        let (t, ctx) = self.parts(&counter);
        let m = Box::new(DLManagedTensorVersioned {
            version: DLPackVersion {
                major: self.version.0,
                minor: self.version.1,
            },
            manager_ctx: Box::into_raw(ctx).cast(),
            deleter: if self.null_deleter {
                None
            } else {
                Some(delete_versioned)
            },
            flags: self.flags,
            dl_tensor: t,
        });
        let p = Box::into_raw(m);
        if self.null_deleter {
            keep_reachable(p as usize);
        }
        (p, counter)
    }

    /// A legacy `DLManagedTensor*` and the counter its deleter bumps.
    pub fn legacy(&self) -> (*mut DLManagedTensor, Counter) {
        let counter = Counter::default();
        let (t, ctx) = self.parts(&counter);
        let m = Box::new(DLManagedTensor {
            dl_tensor: t,
            manager_ctx: Box::into_raw(ctx).cast(),
            deleter: if self.null_deleter {
                None
            } else {
                Some(delete_legacy)
            },
        });
        let p = Box::into_raw(m);
        if self.null_deleter {
            keep_reachable(p as usize);
        }
        (p, counter)
    }

    /// Imports as versioned.
    pub fn import_v1(&self) -> (dlpack_mpi::Result<ManagedTensor<'static>>, Counter) {
        let (p, c) = self.versioned();
        // SAFETY: a struct built just now by this helper, owned by nobody else.
        (unsafe { ManagedTensor::from_raw_versioned(p) }, c)
    }

    /// Imports as legacy.
    pub fn import_v0(&self) -> (dlpack_mpi::Result<ManagedTensor<'static>>, Counter) {
        let (p, c) = self.legacy();
        // SAFETY: as above.
        (unsafe { ManagedTensor::from_raw_legacy(p) }, c)
    }
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    // SAFETY: built by `versioned` above; called once by the guard.
    let m = unsafe { Box::from_raw(p) };
    // SAFETY: manager_ctx is the Box<Ctx> leaked in `versioned`.
    let ctx = unsafe { Box::from_raw(m.manager_ctx.cast::<Ctx>()) };
    ctx.counter.0.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    // SAFETY: built by `legacy` above; called once by the guard.
    let m = unsafe { Box::from_raw(p) };
    // SAFETY: manager_ctx is the Box<Ctx> leaked in `legacy`.
    let ctx = unsafe { Box::from_raw(m.manager_ctx.cast::<Ctx>()) };
    ctx.counter.0.fetch_add(1, Ordering::SeqCst);
}

/// Resident set size of this process in bytes (Linux `/proc/self/statm`).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
