//! A case's tensor storage, made by the run's producer (`Owned`, NumPy, or cudarc device
//! memory), and the producer's resolution.

use dlpack_mpi::device::Device;
use dlpack_mpi::dlpack::{acquire_with_runtime, AcquireOptions, Owned, Tensor};
use dlpack_mpi::dtype::{code, AnyBits, DType};

use super::args::Producer;
use super::context::{e, Res, RunContext};
use super::placement::{Frame, Offset, GUARD};

/// A case's tensor storage, made by the run's producer.
pub(super) enum Store<S: AnyBits> {
    /// dlpack-mpi's `Owned` exporter over a `Vec`.
    Rust(Owned<S>),
    /// An offset tensor (`--offset`): its storage's bytes in `frame`, a guarded byte buffer
    /// that an `Owned<u8>` exports as the case's dtype and layout, `data` and `byte_offset`
    /// as the offset's form says; `template` is the storage as made (for reading back).
    Framed {
        owned: Owned<u8>,
        frame: Frame,
        template: Vec<S>,
    },
    /// An offset tensor made by NumPy (the shifted-pointer form, `--offset`): `base` is the
    /// guarded byte buffer (`uint8`) around the storage, `view` the strided view exported.
    #[cfg(feature = "python")]
    NumpyFramed {
        base: pyo3::Py<pyo3::PyAny>,
        view: pyo3::Py<pyo3::PyAny>,
        frame: Frame,
        template: Vec<S>,
    },
    /// A NumPy array: `base` holds the storage (1-d, C order), `view` is the strided view
    /// of it (`numpy.lib.stride_tricks.as_strided`) that is exported through `__dlpack__`.
    #[cfg(feature = "python")]
    Numpy {
        base: pyo3::Py<pyo3::PyAny>,
        view: pyo3::Py<pyo3::PyAny>,
        _elem: std::marker::PhantomData<S>,
    },
    /// A JAX array or Paddle tensor: `base` holds the storage (1-d), `view` is exported;
    /// `template` is the storage as made (its length and type, for reading back).
    #[cfg(feature = "python")]
    Foreign {
        producer: Producer,
        base: pyo3::Py<pyo3::PyAny>,
        view: pyo3::Py<pyo3::PyAny>,
        template: Vec<S>,
    },
    /// CUDA device memory (cudarc) holding the storage's bytes, exported through
    /// `CudaExport` as the case's dtype and layout.
    #[cfg(feature = "cuda")]
    Cuda {
        slice: std::cell::RefCell<cudarc::driver::CudaSlice<u8>>,
        /// The storage as made on the host (its length and element type, for reading back).
        template: Vec<S>,
        dtype: DType,
        shape: Vec<i64>,
        strides: Vec<i64>,
        byte_offset: u64,
        /// Bytes from the allocation's start to the exported `data` (an offset tensor's
        /// shifted-pointer form), and the guarded frame of an offset tensor.
        framed: Option<(usize, Frame)>,
    },
}

/// The bytes of `storage` (through a `uint8` view of an `Owned`, so no `unsafe` here).
fn storage_bytes<S: AnyBits>(storage: Vec<S>) -> Res<Vec<u8>> {
    let o = Owned::new(storage)
        .with_dtype(DType::new(code::UINT, 8))
        .map_err(e)?;
    let t = acquire_with_runtime(&o, &AcquireOptions::default(), None).map_err(e)?;
    t.as_slice::<u8>().map(<[u8]>::to_vec).map_err(e)
}

/// `template` overwritten with `bytes` (at least as many as it holds).
fn from_bytes<S: AnyBits>(template: Vec<S>, bytes: &[u8]) -> Res<Vec<S>> {
    let o = Owned::new(template)
        .with_dtype(DType::new(code::UINT, 8))
        .map_err(e)?;
    {
        let mut t = acquire_with_runtime(&o, &AcquireOptions::default(), None).map_err(e)?;
        let dst = t.as_mut_slice::<u8>().map_err(e)?;
        let n = dst.len();
        if bytes.len() < n {
            return Err(format!("read back {} bytes, expected {n}", bytes.len()));
        }
        dst.copy_from_slice(&bytes[..n]);
    }
    Ok(o.into_vec())
}

/// Runs `f` on a writable `CudaExport` of `memory` (a slice or a view of one) as `dtype`
/// with `shape`, `strides` (elements) from `byte_offset`.
#[cfg(feature = "cuda")]
fn with_cuda_export<D: cudarc::driver::DevicePtrMut<u8>, R>(
    memory: &mut D,
    (dtype, shape, strides, byte_offset): (DType, &[i64], &[i64], u64),
    run: &RunContext,
    f: impl FnOnce(&mut dyn Tensor) -> Res<R>,
) -> Res<R> {
    let export = dlpack_mpi::dlpack::CudaExport::new_mut(memory)
        .with_dtype(dtype)
        .and_then(|x| x.with_layout(shape, Some(strides), byte_offset))
        .map_err(e)?;
    let mut t =
        acquire_with_runtime(&export, &AcquireOptions::default(), run.runtime).map_err(e)?;
    f(&mut t)
}

impl<S: AnyBits> Store<S> {
    /// A JAX array or Paddle tensor of `storage` (which it copies) viewed with `shape`,
    /// `strides` (elements) from storage element `first`.
    #[cfg(feature = "python")]
    pub(super) fn foreign(
        producer: Producer,
        dtype: DType,
        storage: Vec<S>,
        shape: &[i64],
        strides: &[i64],
        first: usize,
    ) -> Res<Store<S>> {
        let bytes = storage_bytes(storage.clone())?;
        let (base, view) =
            super::producers::foreign::make(producer, dtype, &bytes, shape, strides, first)?;
        Ok(Store::Foreign {
            producer,
            base,
            view,
            template: storage,
        })
    }

    #[cfg(not(feature = "python"))]
    pub(super) fn foreign(
        _: Producer,
        _: DType,
        _: Vec<S>,
        _: &[i64],
        _: &[i64],
        _: usize,
    ) -> Res<Store<S>> {
        Err("this build has no Python support (feature `python`)".into())
    }

    /// Runs `f` on the tensor, acquired through the producer's own path (`acquire` of the
    /// exporter with the run's GPU runtime, `__dlpack__` of the NumPy view, or a
    /// `CudaExport` of the device memory).
    pub(super) fn with_tensor<R>(
        &self,
        run: &RunContext,
        f: impl FnOnce(&mut dyn Tensor) -> Res<R>,
    ) -> Res<R> {
        let options = AcquireOptions::default();
        match self {
            Store::Rust(o) => {
                let mut t = acquire_with_runtime(o, &options, run.runtime).map_err(e)?;
                f(&mut t)
            }
            Store::Framed { owned, .. } => {
                let mut t = acquire_with_runtime(owned, &options, run.runtime).map_err(e)?;
                f(&mut t)
            }
            #[cfg(feature = "python")]
            Store::Numpy { view, .. }
            | Store::Foreign { view, .. }
            | Store::NumpyFramed { view, .. } => {
                let mut t =
                    pyo3::Python::attach(|py| dlpack_mpi::python::acquire(view.bind(py), &options))
                        .map_err(e)?;
                f(&mut t)
            }
            #[cfg(feature = "cuda")]
            Store::Cuda {
                slice,
                dtype,
                shape,
                strides,
                byte_offset,
                framed,
                ..
            } => {
                let mut slice = slice.borrow_mut();
                let layout = (*dtype, &shape[..], &strides[..], *byte_offset);
                match framed {
                    // The shifted-pointer form: a view from the exported `data` on.
                    Some((data_at, frame)) if *data_at > 0 => {
                        // Whole elements of the dtype from `data` (CudaExport's rule).
                        let esize = dtype.size_bytes().unwrap_or(1);
                        let end = data_at + (frame.total - data_at) / esize * esize;
                        let mut view = slice.slice_mut(*data_at..end);
                        with_cuda_export(&mut view, layout, run, f)
                    }
                    _ => with_cuda_export(&mut *slice, layout, run, f),
                }
            }
        }
    }

    /// Copies `storage` to new device memory, to be exported with `shape`, `strides`
    /// (elements) from `byte_offset`.
    #[cfg(feature = "cuda")]
    pub(super) fn cuda(
        run: &RunContext,
        dtype: DType,
        storage: Vec<S>,
        shape: &[i64],
        strides: &[i64],
        byte_offset: u64,
    ) -> Res<Store<S>> {
        let mut bytes = storage_bytes(storage.clone())?;
        // cudarc allocates at least one byte (an empty tensor still has a pointer).
        if bytes.is_empty() {
            bytes.push(0);
        }
        Store::uploaded(
            run,
            &bytes,
            (dtype, storage),
            (shape, strides, byte_offset),
            None,
        )
    }

    /// An offset tensor in new device memory: `storage` at `offset` in a guarded frame
    /// (its allocation's own alignment, at least 256 bytes: `cuMemAlloc`), exported with
    /// `shape`, `strides` (elements) from storage element `first`; `rank` names the rank in
    /// a written guard's message.
    #[cfg(feature = "cuda")]
    pub(super) fn cuda_framed(
        run: &RunContext,
        (dtype, storage): (DType, Vec<S>),
        (shape, strides, first): (&[i64], &[i64], usize),
        (offset, rank): (Offset, i32),
    ) -> Res<Store<S>> {
        let bytes = storage_bytes(storage.clone())?;
        let esize = dtype.size_bytes().unwrap_or(1);
        let total = Frame::total(bytes.len(), offset.bytes, esize);
        let frame = Frame::at(0, bytes.len(), offset.bytes, total, rank);
        let mut buffer = vec![GUARD; total];
        frame.fill(&mut buffer, &bytes);
        let (data_at, byte_offset) = frame.view(offset.form, (first * esize) as u64);
        let layout = (shape, strides, byte_offset);
        Store::uploaded(
            run,
            &buffer,
            (dtype, storage),
            layout,
            Some((data_at, frame)),
        )
    }

    /// `bytes` copied to new device memory: the store of `storage`'s elements there (at
    /// `framed`'s data offset inside its guarded frame, when framed), exported with `shape`,
    /// `strides` (elements) from `byte_offset`.
    #[cfg(feature = "cuda")]
    fn uploaded(
        run: &RunContext,
        bytes: &[u8],
        (dtype, template): (DType, Vec<S>),
        (shape, strides, byte_offset): (&[i64], &[i64], u64),
        framed: Option<(usize, Frame)>,
    ) -> Res<Store<S>> {
        let slice = run
            .cuda_stream()?
            .clone_htod(bytes)
            .map_err(|err| format!("CUDA: {err}"))?;
        Ok(Store::Cuda {
            slice: std::cell::RefCell::new(slice),
            template,
            dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            byte_offset,
            framed,
        })
    }

    /// An offset tensor made by Rust: `storage` at `offset` in a guarded frame of host
    /// memory labelled `device`, exported with `shape`, `strides` (elements) from storage
    /// element `first`; `rank` names the rank in a written guard's message.
    pub(super) fn framed(
        (dtype, storage): (DType, Vec<S>),
        (shape, strides, first): (&[i64], &[i64], usize),
        (offset, rank): (Offset, i32),
        device: Device,
    ) -> Res<Store<S>> {
        let bytes = storage_bytes(storage.clone())?;
        let esize = dtype.size_bytes().unwrap_or(1);
        let total = Frame::total(bytes.len(), offset.bytes, esize);
        let mut owned = Owned::new(vec![GUARD; total]);
        let address = owned.as_slice().as_ptr() as usize;
        let frame = Frame::at(address, bytes.len(), offset.bytes, total, rank);
        frame.fill(owned.as_mut_slice(), &bytes);
        let (data_at, byte_offset) = frame.view(offset.form, (first * esize) as u64);
        let owned = owned
            .with_dtype(dtype)
            .and_then(|o| o.with_layout_at(data_at, shape, Some(strides), byte_offset))
            .map(|o| o.labelled(device))
            .map_err(e)?;
        Ok(Store::Framed {
            owned,
            frame,
            template: storage,
        })
    }

    /// The storage, in storage order.
    pub(super) fn into_vec(self, run: &RunContext) -> Res<Vec<S>> {
        #[cfg(not(feature = "cuda"))]
        let _ = run;
        match self {
            Store::Rust(o) => Ok(o.into_vec()),
            Store::Framed {
                owned,
                frame,
                template,
            } => from_bytes(template, frame.take(&owned.into_vec())?),
            #[cfg(feature = "python")]
            Store::NumpyFramed {
                base,
                frame,
                template,
                ..
            } => {
                let bytes = pyo3::Python::attach(|py| {
                    let t = dlpack_mpi::python::acquire(base.bind(py), &AcquireOptions::default())?;
                    t.as_slice::<u8>().map(<[u8]>::to_vec)
                })
                .map_err(e)?;
                from_bytes(template, frame.take(&bytes)?)
            }
            #[cfg(feature = "cuda")]
            Store::Cuda {
                slice,
                template,
                framed,
                ..
            } => {
                let bytes = run
                    .cuda_stream()?
                    .clone_dtoh(&slice.into_inner())
                    .map_err(|err| format!("CUDA: {err}"))?;
                match framed {
                    Some((_, frame)) => from_bytes(template, frame.take(&bytes)?),
                    None => from_bytes(template, &bytes),
                }
            }
            #[cfg(feature = "python")]
            Store::Foreign {
                producer,
                base,
                template,
                ..
            } => {
                if producer == Producer::Jax {
                    // Never written (JAX arrays are immutable): what was made.
                    return Ok(template);
                }
                from_bytes(template, &super::producers::foreign::bytes(&base)?)
            }
            #[cfg(feature = "python")]
            Store::Numpy { base, .. } => pyo3::Python::attach(|py| {
                let t = dlpack_mpi::python::acquire(base.bind(py), &AcquireOptions::default())?;
                t.as_slice::<S>().map(<[S]>::to_vec)
            })
            .map_err(e),
        }
    }

    /// A NumPy array of `storage` (which it copies) viewed with `shape`, `strides`
    /// (elements) from storage element `first`.
    #[cfg(feature = "python")]
    pub(super) fn numpy(
        dtype: DType,
        storage: Vec<S>,
        shape: &[i64],
        strides: &[i64],
        first: usize,
    ) -> Res<Store<S>> {
        use pyo3::types::PyAnyMethods;
        let name = numpy_name(dtype)?;
        let esize = dtype.size_bytes().unwrap_or(0);
        pyo3::Python::attach(|py| -> Result<Store<S>, String> {
            let np = dlpack_mpi::python::numpy(py).map_err(e)?;
            let base = np
                .call_method1("zeros", (storage.len(), name))
                .map_err(|err| py_err("zeros", err))?;
            {
                let mut t =
                    dlpack_mpi::python::acquire(&base, &AcquireOptions::default()).map_err(e)?;
                t.as_mut_slice::<S>().map_err(e)?.copy_from_slice(&storage);
            }
            let from = base
                .get_item(pyo3::types::PySlice::new(py, first as isize, isize::MAX, 1))
                .map_err(|err| py_err("slice", err))?;
            let view = as_strided(&np, from, shape, strides, esize)?;
            Ok(Store::Numpy {
                base: base.unbind(),
                view: view.unbind(),
                _elem: std::marker::PhantomData,
            })
        })
    }

    #[cfg(not(feature = "python"))]
    pub(super) fn numpy(_: DType, _: Vec<S>, _: &[i64], _: &[i64], _: usize) -> Res<Store<S>> {
        Err("this build has no Python support (feature `python`)".into())
    }

    /// An offset tensor made by NumPy, in the shifted-pointer form NumPy exports: a `uint8`
    /// array holding `storage` at `offset` in a guarded frame, and a view of it as `dtype`
    /// with `shape`, `strides` (elements) from storage element `first` (an unaligned view,
    /// which NumPy exports with `data` at that element and `byte_offset` 0); `rank` names
    /// the rank in a written guard's message.
    #[cfg(feature = "python")]
    pub(super) fn numpy_framed(
        (dtype, storage): (DType, Vec<S>),
        (shape, strides, first): (&[i64], &[i64], usize),
        (offset, rank): (Offset, i32),
    ) -> Res<Store<S>> {
        use pyo3::types::PyAnyMethods;
        let name = numpy_name(dtype)?;
        let bytes = storage_bytes(storage.clone())?;
        let esize = dtype.size_bytes().unwrap_or(1);
        let total = Frame::total(bytes.len(), offset.bytes, esize);
        pyo3::Python::attach(|py| -> Result<Store<S>, String> {
            let np = dlpack_mpi::python::numpy(py).map_err(e)?;
            let base = np
                .call_method1("zeros", (total, "uint8"))
                .map_err(|err| py_err("zeros", err))?;
            let frame = {
                let mut t =
                    dlpack_mpi::python::acquire(&base, &AcquireOptions::default()).map_err(e)?;
                let frame = Frame::at(
                    t.data_ptr() as usize,
                    bytes.len(),
                    offset.bytes,
                    total,
                    rank,
                );
                frame.fill(t.as_mut_slice::<u8>().map_err(e)?, &bytes);
                frame
            };
            let at = (frame.start() + first * esize) as isize;
            let element = base
                .get_item(pyo3::types::PySlice::new(py, at, at + esize as isize, 1))
                .and_then(|b| b.call_method1("view", (name,)))
                .map_err(|err| py_err("view", err))?;
            let view = as_strided(&np, element, shape, strides, esize)?;
            Ok(Store::NumpyFramed {
                base: base.unbind(),
                view: view.unbind(),
                frame,
                template: storage,
            })
        })
    }

    #[cfg(not(feature = "python"))]
    pub(super) fn numpy_framed(
        _: (DType, Vec<S>),
        _: (&[i64], &[i64], usize),
        _: (Offset, i32),
    ) -> Res<Store<S>> {
        Err("this build has no Python support (feature `python`)".into())
    }
}

/// A NumPy error as a case's message: what was being done, then NumPy's exception.
#[cfg(feature = "python")]
fn py_err(what: &str, err: pyo3::PyErr) -> String {
    format!("NumPy: {what}: {err}")
}

/// NumPy's name of `dtype`; a skip (`SKIP_MARK`) when NumPy has no such dtype.
#[cfg(feature = "python")]
fn numpy_name(dtype: DType) -> Res<&'static str> {
    dlpack_mpi::python::numpy_dtype_name(dtype)
        .ok_or_else(|| format!("{}NumPy has no dtype {dtype}", super::context::SKIP_MARK))
}

/// `np.lib.stride_tricks.as_strided(from, shape=shape, strides=…)`: a view of `from` with
/// `shape` and `strides` (elements of `esize` bytes).
#[cfg(feature = "python")]
fn as_strided<'py>(
    np: &pyo3::Bound<'py, pyo3::types::PyModule>,
    from: pyo3::Bound<'py, pyo3::PyAny>,
    shape: &[i64],
    strides: &[i64],
    esize: usize,
) -> Res<pyo3::Bound<'py, pyo3::PyAny>> {
    use pyo3::types::PyAnyMethods;
    let byte_strides: Vec<i64> = strides.iter().map(|s| s * esize as i64).collect();
    let kwargs = pyo3::types::PyDict::new(np.py());
    kwargs
        .set_item("shape", shape.to_vec())
        .and_then(|()| kwargs.set_item("strides", byte_strides))
        .map_err(|err| py_err("kwargs", err))?;
    np.getattr("lib")
        .and_then(|l| l.getattr("stride_tricks"))
        .and_then(|st| st.call_method("as_strided", (from,), Some(&kwargs)))
        .map_err(|err| py_err("as_strided", err))
}

/// The run's producer and the installed Python producers' mask: a pinned producer checked
/// (Python support built, its package importable); `Auto` stays `Auto` (per dtype, see
/// [`super::producers::producer_for`]) when any Python producer imports, else `Rust`.
pub(super) fn resolve_producer(requested: Producer) -> Result<(Producer, i32), String> {
    match requested {
        Producer::Rust => Ok((Producer::Rust, 0)),
        Producer::Numpy => numpy_version().map(|_| (Producer::Numpy, 0)),
        Producer::Auto => match super::producers::probe(requested) {
            Ok(0) | Err(_) => {
                // Said on every output level (standard error, also under -q): a run of a
                // build with Python support that got no Python producer must not look like
                // one that had them (a virtual environment first on PATH without NumPy, say).
                #[cfg(feature = "python")]
                no_python_producer(numpy_version().err().unwrap_or_default());
                Ok((Producer::Rust, 0))
            }
            Ok(mask) => Ok((Producer::Auto, mask)),
        },
        pinned => super::producers::probe(pinned).map(|mask| (pinned, mask)),
    }
}

/// The notice of `--producer auto` falling back to Rust-made tensors (rank 0, standard
/// error), with NumPy's import error.
#[cfg(feature = "python")]
fn no_python_producer(why: String) {
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({why})")
    };
    eprintln!(
        "dlpack-mpi check: --producer auto: no Python producer (NumPy, JAX, Paddle) imports \
         in this interpreter, so every tensor is Rust-made{why}"
    );
}

/// NumPy's version in the embedded interpreter (started here if needed).
#[cfg(feature = "python")]
pub(super) fn numpy_version() -> Result<String, String> {
    use pyo3::types::PyAnyMethods;
    pyo3::Python::initialize();
    pyo3::Python::attach(|py| {
        let np = dlpack_mpi::python::numpy(py).map_err(|err| format!("producer `numpy`: {err}"))?;
        np.getattr("__version__")
            .map(|v| v.to_string())
            .map_err(|err| format!("producer `numpy`: {err}"))
    })
}

#[cfg(not(feature = "python"))]
pub(super) fn numpy_version() -> Result<String, String> {
    Err(
        "producer `numpy` needs Python support, which this build does not have \
         (feature `python`)"
            .into(),
    )
}
