//! The ML producers, JAX and PaddlePaddle, with real tensors (issue 15): every dtype each
//! exports, 0-d, zero-size, sliced and (Paddle) transposed views as send buffers; Paddle and
//! NumPy receive buffers; JAX arrays refused as receive buffers (never written); Paddle's
//! pointer identity and memory flat over 100 000 acquire/release cycles (seed 004);
//! mixed producers in one job; Paddle bfloat16 and JAX float8 reductions as the dtype table
//! says. The device-query rules (Paddle's `(kDLCPU, None)`) are here too.
//!
//! A case whose package does not import prints a `SKIP` line naming it and passes:
//! scripts/setup.sh installs JAX, Paddle and ml-dtypes where the registry answers.

use super::*;
use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::Owned;

/// `true` (after a SKIP line on rank 0) when one of `packages` does not import.
fn missing(c: &Ctx, case: &str, packages: &[&str]) -> Result<bool, String> {
    for pkg in packages {
        if c.truth(&format!("p.missing('{pkg}') is not None"))? {
            if c.rank == 0 {
                println!(
                    "SKIP: {case}: Python package `{pkg}` is not installed (scripts/setup.sh \
                     installs it)"
                );
            }
            return Ok(true);
        }
    }
    Ok(false)
}

/// The DLPack dtype of a NumPy / ML dtype name.
fn ml_dtype(name: &str) -> DType {
    use dlpack_mpi::dtype::code;
    let code = match name {
        "bfloat16" => return DType::new(code::BFLOAT, 16),
        "float8_e3m4" => 7,
        "float8_e4m3" => 8,
        "float8_e4m3b11fnuz" => 9,
        "float8_e4m3fn" => 10,
        "float8_e4m3fnuz" => 11,
        "float8_e5m2" => 12,
        "float8_e5m2fnuz" => 13,
        "float8_e8m0fnu" => 14,
        other => return dtype_of(other),
    };
    DType::new(code, 8)
}

/// The layouts every producer is tried in: (name, shape of the array the view is taken of).
const LAYOUTS: [(&str, &str); 5] = [
    ("contiguous", "[4, 6]"),
    ("sliced", "[4, 6]"),
    ("transposed", "[4, 6]"),
    ("0-d", "[]"),
    ("zero-size", "[0]"),
];

/// Sends `x` (built by `make` for this rank) around the ring into a Rust-owned buffer of the
/// same dtype, and compares the bytes with the previous rank's `x`.
fn ring_into_rust(w: &SimpleCommunicator, c: &Ctx, dtype: &str, make: &str) -> Outcome {
    let (next, prev) = ring(w);
    c.exec(&format!(
        "x = {make}; want = p.logical_bytes({})",
        make.replace("rank", &prev.to_string())
    ))?;
    let n_bytes = c.int("len(want)")? as usize;
    let rcv = Owned::new(vec![0u8; n_bytes])
        .with_dtype(ml_dtype(dtype))
        .map_err(s)?;
    {
        let t = c.acquire("x")?;
        ensure_eq!(t.dtype(), ml_dtype(dtype));
        let mut r = dlpack_mpi::dlpack::acquire(&rcv, &opts()).map_err(s)?;
        w.sendrecv_tensor(&t, next, 150, &mut r, prev, 150)
            .map_err(s)?;
    }
    let got = rcv.into_vec();
    let want: Vec<u8> = c.ev("want")?.extract().map_err(|e: PyErr| e.to_string())?;
    ensure!(got == want, "{make}: received {got:?}, want {want:?}");
    Ok(())
}

pub(super) fn jax_every_dtype_and_layout_sends(w: &SimpleCommunicator, c: &Ctx) -> Outcome {
    if missing(c, "jax_every_dtype_and_layout_sends", &["jax", "ml_dtypes"])? {
        return Ok(());
    }
    let names: Vec<String> = c
        .ev("p.JAX_DTYPES")?
        .extract()
        .map_err(|e: PyErr| e.to_string())?;
    ensure_eq!(names.len(), 23);
    for d in &names {
        for (layout, shape) in LAYOUTS {
            let make = format!("p.view(p.jax_make('{d}', {shape}, rank), '{layout}')");
            ring_into_rust(w, c, d, &make).map_err(|e| format!("jax {d} {layout}: {e}"))?;
        }
    }
    // No copy: the tensor's first element is JAX's own buffer.
    c.exec("x = p.jax_make('float32', [4, 6], rank)")?;
    let t = c.acquire("x")?;
    ensure_eq!(
        t.first_element_ptr() as usize as i64,
        c.int("x.unsafe_buffer_pointer()")?
    );
    Ok(())
}

/// JAX arrays are immutable: refused as receive buffers (point to point, all-reduce output,
/// in place, `as_mut_slice`) with `Error::Immutable`, before any MPI call, and unchanged.
pub(super) fn jax_refused_as_receive_buffer(w: &SimpleCommunicator, c: &Ctx) -> Outcome {
    if missing(c, "jax_refused_as_receive_buffer", &["jax", "ml_dtypes"])? {
        return Ok(());
    }
    let (next, prev) = ring(w);
    c.exec("jx = p.jax_make('float32', [5], rank); before = np.asarray(jx).copy()")?;
    c.exec("src = p.make('float32', [5], rank + 1)")?;
    let immutable = |r: Result<(), Error>, what: &str| -> Outcome {
        match r {
            Err(Error::Immutable {
                producer: "jax.Array",
            }) => Ok(()),
            other => Err(format!("{what}: {other:?}")),
        }
    };
    let src = c.acquire("src")?;
    let mut t = c.acquire("jx")?;
    ensure!(!t.is_versioned(), "JAX answers with a legacy capsule");
    ensure!(t.is_read_only(), "a JAX tensor reports READ_ONLY");
    let msg = w
        .sendrecv_tensor(&src, next, 151, &mut t, prev, 151)
        .unwrap_err()
        .to_string();
    ensure!(msg.contains("immutable"), "message: {msg}");
    immutable(
        w.sendrecv_tensor(&src, next, 151, &mut t, prev, 151)
            .map(|_| ()),
        "sendrecv",
    )?;
    immutable(
        w.all_reduce_tensor(&src, &mut t, ReduceOp::Sum),
        "all_reduce output",
    )?;
    immutable(
        w.all_reduce_tensor_in_place(&mut t, ReduceOp::Sum),
        "all_reduce in place",
    )?;
    immutable(t.as_mut_slice::<f32>().map(|_| ()), "as_mut_slice")?;
    // A send buffer like any other.
    ensure_eq!(t.as_slice::<f32>().map_err(s)?.len(), 5);
    drop(t);
    ensure!(
        c.truth("bool((np.asarray(jx) == before).all())")?,
        "written"
    );
    Ok(())
}

pub(super) fn paddle_every_dtype_and_layout(w: &SimpleCommunicator, c: &Ctx) -> Outcome {
    if missing(c, "paddle_every_dtype_and_layout", &["paddle"])? {
        return Ok(());
    }
    let (next, prev) = ring(w);
    let names: Vec<String> = c
        .ev("p.PADDLE_DTYPES")?
        .extract()
        .map_err(|e: PyErr| e.to_string())?;
    for d in &names {
        for (layout, shape) in LAYOUTS {
            let make = format!("p.view(p.paddle_make('{d}', {shape}, rank), '{layout}')");
            // Into a Rust buffer, then into a fresh Paddle tensor of the view's shape.
            ring_into_rust(w, c, d, &make).map_err(|e| format!("paddle {d} {layout}: {e}"))?;
            c.exec(&format!(
                "x = {make}; want = p.logical_bytes({}); y = p.paddle_zeros('{d}', x.shape)",
                make.replace("rank", &prev.to_string())
            ))?;
            {
                let t = c.acquire("x")?;
                let mut r = c.acquire("y")?;
                if layout == "transposed" {
                    ensure_eq!(t.strides_elems(), Some(&[1i64, 6][..]));
                }
                w.sendrecv_tensor(&t, next, 152, &mut r, prev, 152)
                    .map_err(|e| format!("paddle {d} {layout} into paddle: {e}"))?;
            }
            ensure!(
                c.truth("p.logical_bytes(y) == want")?,
                "paddle {d} {layout} into paddle: {}",
                c.ev("y")?
            );
        }
    }
    // Into a transposed (non-contiguous) Paddle view: the base sees the elements.
    c.exec(
        "base = p.paddle_zeros('float32', [4, 6]); v = base.T; x = p.paddle_make('float32', [6, 4], rank)",
    )?;
    {
        let t = c.acquire("x")?;
        let mut r = c.acquire("v")?;
        w.sendrecv_tensor(&t, next, 153, &mut r, prev, 153)
            .map_err(s)?;
    }
    ensure!(
        c.truth(&format!(
            "bool((base.numpy().T == p.make('float32', [6, 4], {prev})).all())"
        ))?,
        "{}",
        c.ev("base")?
    );
    Ok(())
}

/// Seed 004's expectations: no copy (the tensor's pointer is `data_ptr()`), strides of a
/// transposed view as Paddle has them, and memory flat over 100 000 acquire/release cycles.
pub(super) fn paddle_identity_and_100k_cycles_memory_flat(
    _: &SimpleCommunicator,
    c: &Ctx,
) -> Outcome {
    if missing(
        c,
        "paddle_identity_and_100k_cycles_memory_flat",
        &["paddle"],
    )? {
        return Ok(());
    }
    c.exec("pt = p.paddle_make('float32', [4, 6], rank); pv = pt.T")?;
    for (expr, strides) in [("pt", [6i64, 1]), ("pv", [1, 6])] {
        let t = c.acquire(expr)?;
        ensure_eq!(
            t.first_element_ptr() as usize as i64,
            c.int(&format!("{expr}.data_ptr()"))?
        );
        ensure_eq!(t.strides_elems().unwrap_or(&[6, 1]), &strides[..]);
        ensure_eq!(t.device(), Device::CPU);
    }
    let obj = c.ev("pv")?;
    c.exec("base = sys.getrefcount(pv)")?;
    let cycles = |n: usize| -> Outcome {
        for _ in 0..n {
            let t = python::acquire(&obj, &opts()).map_err(s)?;
            ensure_eq!(t.num_elements(), 24);
        }
        Ok(())
    };
    cycles(2_000)?;
    let before = rss_bytes();
    let start = std::time::Instant::now();
    cycles(100_000)?;
    let after = rss_bytes();
    println!(
        "rank {}: 100000 Paddle acquire/release cycles in {:.2} s: RSS {} -> {} KiB",
        c.rank,
        start.elapsed().as_secs_f64(),
        before / 1024,
        after / 1024
    );
    ensure!(
        c.truth("sys.getrefcount(pv) == base")?,
        "references leaked: {}",
        c.ev("(sys.getrefcount(pv), base)")?
    );
    ensure!(
        after <= before + 256 * 1024,
        "resident memory grew from {before} to {after} bytes over 100 000 cycles"
    );
    Ok(())
}

/// Several producers in one job: even ranks send Paddle tensors and receive into NumPy
/// arrays, odd ranks send JAX arrays and receive into Paddle tensors.
pub(super) fn mixed_producers_in_one_job(w: &SimpleCommunicator, c: &Ctx) -> Outcome {
    if missing(
        c,
        "mixed_producers_in_one_job",
        &["jax", "paddle", "ml_dtypes"],
    )? {
        return Ok(());
    }
    let (next, prev) = ring(w);
    for d in ["float32", "int64", "bool", "complex128"] {
        let (send, recv) = if c.rank % 2 == 0 {
            (
                format!("p.paddle_make('{d}', [3, 5], rank)"),
                format!("np.zeros((3, 5), dtype='{d}')"),
            )
        } else {
            (
                format!("p.jax_make('{d}', [3, 5], rank)"),
                format!("p.paddle_zeros('{d}', [3, 5])"),
            )
        };
        c.exec(&format!("x = {send}; y = {recv}"))?;
        {
            let t = c.acquire("x")?;
            let mut r = c.acquire("y")?;
            w.sendrecv_tensor(&t, next, 154, &mut r, prev, 154)
                .map_err(|e| format!("{d}: {e}"))?;
        }
        ensure!(
            c.truth(&format!(
                "p.logical_bytes(y) == p.make('{d}', [3, 5], {prev}).tobytes()"
            ))?,
            "{d}: rank {} received {}",
            c.rank,
            c.ev("y")?
        );
    }
    Ok(())
}

/// The dtype table: bfloat16 sums through the half-precision ops (Paddle tensors, exact
/// for these small integers); float8 is transfer-only, so a JAX float8 reduction is refused
/// naming the dtype, before any MPI call.
pub(super) fn ml_reductions_follow_dtype_table(w: &SimpleCommunicator, c: &Ctx) -> Outcome {
    if missing(
        c,
        "ml_reductions_follow_dtype_table",
        &["jax", "paddle", "ml_dtypes"],
    )? {
        return Ok(());
    }
    let size = c.size;
    c.exec("x = p.paddle_make('bfloat16', [9], rank); y = p.paddle_zeros('bfloat16', [9])")?;
    {
        let t = c.acquire("x")?;
        let mut r = c.acquire("y")?;
        w.all_reduce_tensor(&t, &mut r, ReduceOp::Sum).map_err(s)?;
    }
    ensure!(
        c.truth(&format!(
            "p.logical_bytes(y) == p.logical_bytes(\
             sum(p.paddle_make('float32', [9], r) for r in range({size})).astype('bfloat16'))"
        ))?,
        "bfloat16 sum: {}",
        c.ev("y")?
    );
    for d in ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"] {
        c.exec(&format!("x = p.jax_make('{d}', [4], rank)"))?;
        let t = c.acquire("x")?;
        let out = Owned::new(vec![0u8; 4])
            .with_dtype(ml_dtype(d))
            .map_err(s)?;
        let mut r = dlpack_mpi::dlpack::acquire(&out, &opts()).map_err(s)?;
        let got = w.all_reduce_tensor(&t, &mut r, ReduceOp::Sum);
        match &got {
            Err(e @ Error::UnsupportedReduction { dtype, .. }) if *dtype == ml_dtype(d) => {
                ensure!(e.to_string().contains(d), "{e} does not name {d}");
            }
            other => return Err(format!("{d} sum: {other:?}")),
        }
    }
    Ok(())
}

/// Device-query rules: a host device with id `None` is device 0 (Paddle's answer); any other
/// device with id `None` is refused; `IntEnum` device types are ints; bools are not.
pub(super) fn device_query_rules(_: &SimpleCommunicator, c: &Ctx) -> Outcome {
    c.exec("import enum\nclass DT(enum.IntEnum):\n    kDLCPU = 1\n    kDLCUDA = 2\n    kDLCUDAHost = 3\n    kDLTPU = 19\n    kDLAscend = 21")?;
    for (value, device) in [
        ("(1, None)", Device::CPU),
        ("(DT.kDLCPU, None)", Device::CPU),
        ("(DT.kDLCPU, 0)", Device::CPU),
        ("(3, None)", Device::new(device_type::CUDA_HOST, 0)),
        ("(11, None)", Device::new(device_type::ROCM_HOST, 0)),
        ("(DT.kDLCUDA, 1)", Device::new(device_type::CUDA, 1)),
        ("(DT.kDLAscend, 0)", Device::new(device_type::ASCEND, 0)),
        ("(DT.kDLTPU, 0)", Device::new(device_type::TPU, 0)),
    ] {
        c.exec(&format!("bd = p.BadDevice(np.arange(2), {value})"))?;
        let got = python::device_query(&c.ev("bd")?).map_err(|e| format!("{value}: {e}"))?;
        ensure!(got == Some(device), "{value}: {got:?}");
    }
    // The CPU rule end to end: the tensor arrives.
    c.exec("bd = p.BadDevice(np.arange(3.0), (DT.kDLCPU, None))")?;
    let t = c.acquire("bd")?;
    ensure_eq!(t.as_slice::<f64>().map_err(s)?, &[0.0, 1.0, 2.0][..]);
    // TPU and Ascend memory are known by name and refused by name (`TensorComm` needs host
    // memory); a NumPy array that claims to be there is a device mismatch.
    for (value, name) in [("(DT.kDLTPU, 0)", "kDLTPU"), ("(21, 0)", "kDLAscend")] {
        c.exec(&format!("bd = p.BadDevice(np.arange(2), {value})"))?;
        let dev = python::device_query(&c.ev("bd")?)
            .map_err(s)?
            .ok_or("no device")?;
        let msg = dev.check_host_accessible().unwrap_err().to_string();
        ensure!(msg.contains(name), "{value}: {msg}");
        let r = python::acquire(&c.ev("bd")?, &opts());
        ensure!(
            matches!(&r, Err(Error::DeviceMismatch { .. })),
            "{value}: {r:?}"
        );
    }
    for value in [
        "(2, None)",
        "(DT.kDLCUDA, None)",
        "(13, None)",
        "(10, None)",
        "(1, True)",
        "(None, None)",
        "(22, 0)",
    ] {
        c.exec(&format!("bd = p.BadDevice(np.arange(2), {value})"))?;
        let r = python::acquire(&c.ev("bd")?, &opts());
        ensure!(
            matches!(&r, Err(Error::InvalidDeviceQuery { .. })),
            "{value}: {r:?}"
        );
        ensure!(c.int("bd.calls")? == 0, "{value}: __dlpack__ called");
    }
    Ok(())
}
