//! Behaviour cases of shared/design/CASES.md that need no MPI communication: import,
//! ownership, layout, dtype and producer-protocol cases. Each test is named after its id.
//! The cases that move data between ranks are in `tests/mpi/mpi_cases.rs`.

mod common;

use std::cell::RefCell;

use common::{rss_bytes, RawTensor};
use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::{
    acquire, AcquireOptions, DeviceQuery, ExportRequest, Exporter, ManagedTensor, Owned,
    StreamPolicy, Tensor, TensorView,
};
use dlpack_mpi::dtype::{self, DType, ReduceOp};
use dlpack_mpi::layout;
use dlpack_mpi::spec::{RecvSpec, SendSpec};
// Deprecated, still tested while they exist.
#[allow(deprecated)]
use dlpack_mpi::spec::{VectorRecvSpec, VectorSendSpec};
use dlpack_mpi::Error;
use mpi::datatype::{Collection, Pointer};

const I32: (u8, u8, u16) = (0, 32, 1);
const I64: (u8, u8, u16) = (0, 64, 1);
const F32: (u8, u8, u16) = (2, 32, 1);

#[test]
fn c01_unsupported_major_version_releases() {
    for major in [0, 2] {
        let mut raw = RawTensor::new(&[0i32, 1, 2, 3], I32);
        raw.version = (major, 0);
        let (r, count) = raw.import_v1();
        assert_eq!(
            r.unwrap_err(),
            Error::UnsupportedVersion { major, minor: 0 }
        );
        assert_eq!(
            count.get(),
            1,
            "deleter must run exactly once for major {major}"
        );
    }
}

#[test]
fn c02_legacy_and_versioned_are_distinct_and_both_described() {
    let raw = RawTensor::new(&[1i64, 2, 3, 4], I64);
    let (v0, c0) = raw.import_v0();
    let (v1, c1) = raw.import_v1();
    let (v0, v1) = (v0.unwrap(), v1.unwrap());
    assert!(!v0.is_versioned() && v0.version().is_none());
    assert_eq!(v1.version(), Some((1, 3)));
    assert_eq!(v0.as_slice::<i64>().unwrap(), &[1, 2, 3, 4]);
    assert_eq!(v1.as_slice::<i64>().unwrap(), &[1, 2, 3, 4]);
    drop((v0, v1));
    assert_eq!((c0.get(), c1.get()), (1, 1));
}

#[test]
fn c03_negative_ndim() {
    let mut raw = RawTensor::new(&[1i32], I32);
    raw.ndim = Some(-1);
    for (r, c) in [raw.import_v1(), raw.import_v0()] {
        assert!(
            matches!(r, Err(Error::InvalidTensor { ref field, value: -1, .. }) if field == "ndim"),
            "{r:?}"
        );
        assert_eq!(c.get(), 1);
    }
}

#[test]
fn c04_negative_extent() {
    let raw = RawTensor::new(&[1i32], I32).shape(&[-1], Some(&[1]));
    let (r, c) = raw.import_v1();
    assert!(
        matches!(r, Err(Error::InvalidTensor { ref field, value: -1, .. }) if field == "shape[0]"),
        "{r:?}"
    );
    assert_eq!(c.get(), 1);
}

#[test]
fn c05_null_shape_with_ndim() {
    let mut raw = RawTensor::new(&[1i32], I32);
    raw.shape = None;
    raw.ndim = Some(1);
    let (r, c) = raw.import_v1();
    assert!(
        matches!(r, Err(Error::InvalidTensor { ref field, .. }) if field == "shape"),
        "{r:?}"
    );
    assert_eq!(c.get(), 1);
}

#[test]
fn c06_zero_d_tensor_is_one_element() {
    let mut raw = RawTensor::new(&[3.5f64], (2, 64, 1));
    raw.shape = None;
    raw.strides = None;
    let (t, c) = raw.import_v1();
    let t = t.unwrap();
    assert_eq!(t.ndim(), 0);
    assert_eq!(t.num_elements(), 1);
    let s = SendSpec::new(&t).unwrap();
    assert_eq!(s.count(), 1);
    assert_eq!(t.as_slice::<f64>().unwrap(), &[3.5]);
    drop(t);
    assert_eq!(c.get(), 1);
}

#[test]
fn c07_zero_size_null_data() {
    let mut raw = RawTensor::new::<i32>(&[], I32).shape(&[0, 3], Some(&[3, 1]));
    raw.null_data = true;
    let (t, c) = raw.import_v1();
    let mut t = t.unwrap();
    assert_eq!(SendSpec::new(&t).unwrap().count(), 0);
    let r = RecvSpec::new(&mut t).unwrap();
    assert_eq!((r.count(), r.pointer().is_null()), (0, true));
    drop(t);
    assert_eq!(c.get(), 1);
}

#[test]
fn c08_empty_tensor_with_odd_strides_is_contiguous() {
    let raw = RawTensor::new::<f32>(&[], F32).shape(&[1, 8, 0, 128], Some(&[1024, 128, 128, 1]));
    let (t, _) = raw.import_v1();
    let t = t.unwrap();
    assert_eq!(SendSpec::new(&t).unwrap().count(), 0);
}

#[test]
fn c09_repeated_imports_release_every_time_memory_flat() {
    let raw = RawTensor::new(&[7u8; 4096], (1, 8, 1));
    let cycle = |n: usize| {
        for i in 0..n {
            let (t, c) = if i % 2 == 0 {
                raw.import_v0()
            } else {
                raw.import_v1()
            };
            let t = t.unwrap();
            assert_eq!(SendSpec::new(&t).unwrap().count(), 4096);
            drop(t);
            assert_eq!(c.get(), 1);
        }
    };
    cycle(1000); // warm the allocator
    let before = rss_bytes();
    cycle(10_000);
    let after = rss_bytes();
    // 10 000 leaked 4 KiB tensors would be 40 MiB; allow allocator noise only.
    assert!(
        after < before + 16 * 1024 * 1024,
        "resident memory grew from {before} to {after} bytes"
    );
}

#[test]
fn c10_null_deleter_is_never_called() {
    let mut raw = RawTensor::new(&[1i32, 2], I32);
    raw.null_deleter = true;
    let (t, c) = raw.import_v1();
    let t = t.unwrap();
    assert_eq!(t.as_slice::<i32>().unwrap(), &[1, 2]);
    drop(t); // must not call through NULL
    assert_eq!(c.get(), 0);
    let (t, _) = raw.import_v0();
    drop(t.unwrap());
}

#[test]
fn c11_failed_validation_still_releases() {
    let mut raw = RawTensor::new(&[1i32, 2], I32);
    raw.null_data = true; // NULL data with 2 elements
    for (r, c) in [raw.import_v1(), raw.import_v0()] {
        assert!(matches!(r, Err(Error::InvalidTensor { ref field, .. }) if field == "data"));
        assert_eq!(c.get(), 1);
    }
}

#[test]
fn c20_unit_extent_strides_are_ignored() {
    for strides in [[1, 2, 1], [4, 2, 1], [0, 2, 1], [99, 2, 1]] {
        let raw = RawTensor::new(&[0f32, 1., 2., 3.], F32).shape(&[1, 2, 2], Some(&strides));
        let (t, _) = raw.import_v1();
        let t = t.unwrap();
        assert_eq!(SendSpec::new(&t).unwrap().count(), 4, "strides {strides:?}");
    }
}

fn send_error(raw: &RawTensor) -> Error {
    let (t, c) = raw.import_v1();
    let t = t.unwrap();
    let e = SendSpec::new(&t).unwrap_err();
    drop(t);
    assert_eq!(c.get(), 1);
    e
}

/// Logical-order element offsets of a layout, as the derived datatype visits them. The
/// delivered values (C21–C25 over MPI) are in tests/mpi/mpi_cases.rs; without MPI a strided spec
/// cannot build its datatype and says so.
fn logical_offsets(shape: &[i64], strides: &[i64]) -> Vec<i64> {
    layout::plan(shape, Some(strides))
        .unwrap()
        .offsets()
        .collect()
}

fn strided_spec_needs_mpi(raw: &RawTensor) {
    let (t, c) = raw.import_v1();
    let t = t.unwrap();
    assert_eq!(SendSpec::new(&t).unwrap_err(), Error::MpiNotInitialized);
    drop(t);
    assert_eq!(c.get(), 1);
}

#[test]
fn c21_fortran_order_is_visited_in_logical_order() {
    let vals: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let c = RawTensor::new(&vals, F32).shape(&[2, 2, 2], Some(&[4, 2, 1]));
    let (t, _) = c.import_v1();
    assert_eq!(SendSpec::new(&t.unwrap()).unwrap().count(), 8);
    // F order: logical (i, j, k) is at i + 2j + 4k, never raw memory order.
    assert_eq!(
        logical_offsets(&[2, 2, 2], &[1, 2, 4]),
        vec![0, 4, 2, 6, 1, 5, 3, 7]
    );
    strided_spec_needs_mpi(&RawTensor::new(&vals, F32).shape(&[2, 2, 2], Some(&[1, 2, 4])));
}

#[test]
fn c22_permuted_strides_are_visited_in_logical_order() {
    assert_eq!(
        logical_offsets(&[2, 2, 2], &[4, 1, 2]),
        vec![0, 2, 1, 3, 4, 6, 5, 7]
    );
    assert_eq!(
        logical_offsets(&[2, 2, 2], &[2, 4, 1]),
        vec![0, 1, 4, 5, 2, 3, 6, 7]
    );
}

#[test]
fn c23_step_slice_visits_every_other_element() {
    assert_eq!(logical_offsets(&[3], &[2]), vec![0, 2, 4]);
    strided_spec_needs_mpi(&RawTensor::new(&[0f32, 1., 2., 3., 4.], F32).shape(&[3], Some(&[2])));
}

#[test]
fn c24_negative_stride_stays_inside_the_allocation() {
    let p = layout::plan(&[3], Some(&[-1])).unwrap();
    assert_eq!(p.offsets().collect::<Vec<_>>(), vec![0, -1, -2]);
    // From the last of three elements, the lowest element is the allocation's first.
    assert_eq!((p.lowest_elem, p.highest_elem), (-2, 0));
}

#[test]
fn c25_broadcast_send_repeats_one_element() {
    assert_eq!(logical_offsets(&[6], &[0]), vec![0; 6]);
    strided_spec_needs_mpi(&RawTensor::new(&[2f32], F32).shape(&[6], Some(&[0])));
}

#[test]
fn c26_broadcast_receive_is_overlap() {
    let raw = RawTensor::new(&[2f32], F32).shape(&[6], Some(&[0]));
    let (t, c) = raw.import_v1();
    let mut t = t.unwrap();
    assert_eq!(
        RecvSpec::new(&mut t).unwrap_err(),
        Error::Overlap {
            axis: 0,
            extent: 6,
            stride_elems: 0
        }
    );
    drop(t);
    assert_eq!(c.get(), 1);
}

#[test]
fn c27_byte_offset_applied_once() {
    let vals: Vec<i32> = (0..9).collect();
    let mut raw = RawTensor::new(&vals, I32).shape(&[8], Some(&[1]));
    raw.byte_offset = 4;
    let (t, _) = raw.import_v1();
    let t = t.unwrap();
    let s = SendSpec::new(&t).unwrap();
    assert_eq!(
        s.pointer(),
        t.data_ptr()
            .cast::<u8>()
            .wrapping_add(4)
            .cast_const()
            .cast()
    );
    assert_eq!(s.count(), 8);
    assert_eq!(t.as_slice::<i32>().unwrap(), &[1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn c28_overflowing_offset_or_shape() {
    let mut raw = RawTensor::new(&[1i32], I32);
    raw.byte_offset = u64::MAX - 3;
    let (r, c) = raw.import_v1();
    assert!(
        matches!(
            r,
            Err(Error::Overflow {
                quantity: "data + byte_offset",
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(c.get(), 1);
    let raw = RawTensor::new(&[1i32], I32).shape(&[i64::MAX / 2, 3], Some(&[3, 1]));
    let (r, c) = raw.import_v1();
    assert!(
        matches!(
            r,
            Err(Error::Overflow {
                quantity: "element count",
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(c.get(), 1);
    // Count fits i64 but the byte span does not fit the address space.
    let raw = RawTensor::new(&[1i64], I64).shape(&[i64::MAX / 4], Some(&[1]));
    let (t, _) = raw.import_v1();
    assert!(matches!(
        SendSpec::new(&t.unwrap()),
        Err(Error::Overflow { .. })
    ));
}

#[test]
fn c30_bool_is_logical_only() {
    let e = dtype::lookup(DType::new(6, 8)).unwrap();
    for op in [
        ReduceOp::LogicalAnd,
        ReduceOp::LogicalOr,
        ReduceOp::LogicalXor,
    ] {
        assert!(e.check_reduction(op).is_ok());
    }
    assert!(matches!(
        e.check_reduction(ReduceOp::Sum),
        Err(Error::UnsupportedReduction {
            op: ReduceOp::Sum,
            ..
        })
    ));
    assert_eq!(e.row.unit.name(), "MPI_C_BOOL");
}

#[test]
fn c31_half_types_carry_bits_and_reduce_arithmetically() {
    // The bits travel as MPI_UINT16_T; sum/prod/min/max go through user-defined ops
    // (delivered values in tests/mpi/mpi_cases.rs); logical and bitwise ops are refused.
    for d in [DType::new(2, 16), DType::new(4, 16)] {
        let e = dtype::lookup(d).unwrap();
        assert_eq!(e.size_bytes(), 2);
        assert!(e.row.transfer_only);
        assert_eq!(e.row.unit.name(), "MPI_UINT16_T");
        for op in [
            ReduceOp::Sum,
            ReduceOp::Product,
            ReduceOp::Min,
            ReduceOp::Max,
        ] {
            assert!(e.check_reduction(op).is_ok(), "{d} {op}");
        }
        let err = e.check_reduction(ReduceOp::BitwiseXor).unwrap_err();
        assert!(err.to_string().contains(&d.to_string()), "{err}");
    }
}

#[test]
fn c32_complex_sum_and_product_only() {
    let e = dtype::lookup(DType::new(5, 64)).unwrap();
    assert!(e.check_reduction(ReduceOp::Sum).is_ok());
    assert!(e.check_reduction(ReduceOp::Product).is_ok());
    assert!(e.check_reduction(ReduceOp::Max).is_err());
    assert_eq!(e.row.unit.name(), "MPI_C_FLOAT_COMPLEX");
}

#[test]
fn c33_lanes_are_whole_vectors() {
    // Decided: lanes = 4 is sent as 4 MPI units per element (see dtype module docs).
    let vals: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let raw = RawTensor::new(&vals, (2, 32, 4)).shape(&[3], Some(&[1]));
    let (t, _) = raw.import_v1();
    let t = t.unwrap();
    let s = SendSpec::new(&t).unwrap();
    assert_eq!((s.len_elems(), s.count()), (3, 12));
    let r = s.range_of(1, 2).unwrap();
    assert_eq!(r.count(), 8);
    assert_eq!(
        r.pointer(),
        s.pointer().cast::<u8>().wrapping_add(16).cast()
    );
}

#[test]
fn c34_opaque_and_unknown_codes_are_refused_by_name() {
    for (code, bits, name) in [(3u8, 64u8, "code3_bits64"), (99, 8, "code99_bits8")] {
        let raw = RawTensor::new(&[0u64], (code, bits, 1));
        let e = send_error(&raw);
        assert!(matches!(e, Error::UnsupportedDtype { dtype, .. } if dtype.code == code));
        assert!(e.to_string().contains(name), "{e}");
    }
    // Sub-byte and oversized types are refused too.
    for d in [
        DType::new(17, 4),
        DType::new(2, 128),
        DType::new(0, 12),
        DType::new(2, 32).with_lanes(0),
    ] {
        assert!(dtype::lookup(d).is_err(), "{d}");
    }
}

#[test]
fn c35_table_sizes_match_elements() {
    // The MPI-side half (MPI_Type_size) runs in tests/mpi/mpi_cases.rs.
    for row in dtype::TABLE {
        let d = DType::new(row.code, row.bits);
        assert_eq!(d.size_bytes(), Some(row.unit.size_bytes()), "{d}");
        assert_eq!(*dtype::lookup(d).unwrap().row, *row);
    }
}

#[test]
fn c40_read_only_send_works() {
    let mut raw = RawTensor::new(&(0i64..10).collect::<Vec<_>>(), I64);
    raw.flags = 1;
    let (t, _) = raw.import_v1();
    let t = t.unwrap();
    assert!(t.is_read_only());
    assert_eq!(SendSpec::new(&t).unwrap().count(), 10);
}

#[test]
fn c41_read_only_receive_is_refused() {
    let mut raw = RawTensor::new(&(0i64..10).collect::<Vec<_>>(), I64);
    raw.flags = 1;
    let (t, c) = raw.import_v1();
    let mut t = t.unwrap();
    assert_eq!(RecvSpec::new(&mut t).unwrap_err(), Error::ReadOnly);
    assert_eq!(t.as_mut_slice::<i64>().unwrap_err(), Error::ReadOnly);
    drop(t);
    assert_eq!(c.get(), 1);
}

#[test]
fn c42_is_copied_receive_is_refused_send_works() {
    let mut raw = RawTensor::new(&[1i32, 2], I32);
    raw.flags = 2;
    let (t, _) = raw.import_v1();
    let mut t = t.unwrap();
    assert!(t.is_copied());
    assert_eq!(SendSpec::new(&t).unwrap().count(), 2);
    assert_eq!(RecvSpec::new(&mut t).unwrap_err(), Error::IsCopied);
}

#[test]
#[allow(deprecated)]
fn c45_vector_blocks_past_the_tensor_are_refused() {
    let owned = Owned::new(vec![0i32; 6]);
    let mut t = acquire(&owned, &AcquireOptions::default()).unwrap();
    let r = RecvSpec::new(&mut t).unwrap();
    let e = VectorRecvSpec::new(r, &[2, 3, 2], &[0, 2, 5]).unwrap_err();
    assert_eq!(
        e,
        Error::OutOfBounds {
            what: "block 2".into(),
            displacement: 5,
            count: 2,
            len: 6
        }
    );
    let s = SendSpec::new(&t).unwrap();
    assert!(VectorSendSpec::new(s, &[1, -1], &[0, 1]).is_err());
    assert!(VectorSendSpec::new(s, &[1, 1], &[0, i64::MAX]).is_err());
    assert!(VectorSendSpec::new(s, &[1, 1], &[0]).is_err());
}

/// A test producer that records the requests it sees.
struct Recorder {
    device: Option<Device>,
    seen: RefCell<Vec<ExportRequest>>,
    data: Owned<f32>,
}

impl Recorder {
    fn new(device: Option<Device>, returns: Device) -> Self {
        Recorder {
            device,
            seen: RefCell::new(Vec::new()),
            data: Owned::new(vec![1.0f32; 4]).labelled(returns),
        }
    }
}

impl Exporter for Recorder {
    fn dlpack_device(&self) -> Option<Device> {
        self.device
    }
    fn dlpack(&self, request: &ExportRequest) -> dlpack_mpi::Result<ManagedTensor<'_>> {
        self.seen.borrow_mut().push(*request);
        self.data.dlpack(request)
    }
}

const CUDA0: Device = Device::new(device_type::CUDA, 0);
const ROCM0: Device = Device::new(device_type::ROCM, 0);

#[test]
fn c50_cpu_exporter_gets_no_stream() {
    let e = Recorder::new(Some(Device::CPU), Device::CPU);
    let t = acquire(&e, &AcquireOptions::default()).unwrap();
    assert_eq!(t.as_slice::<f32>().unwrap(), &[1.0; 4]);
    let seen = e.seen.borrow();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].stream, None);
    assert_eq!(seen[0].max_version, (1, 3));
    assert_eq!(seen[0].copy, Some(false));
}

#[test]
fn c51_cuda_exporter_sees_consumer_stream_or_minus_one_never_zero() {
    let e = Recorder::new(Some(CUDA0), CUDA0);
    // Default policy: the consumer's stream (the legacy default stream in this build);
    // synchronizing it needs the GPU support, so acquire refuses the tensor afterwards.
    let r = acquire(&e, &AcquireOptions::default());
    assert!(
        matches!(r, Err(Error::UnsupportedDevice { device_type: 2, .. })),
        "{r:?}"
    );
    let unsync = AcquireOptions {
        stream: StreamPolicy::Unsynchronized,
        ..Default::default()
    };
    let t = acquire(&e, &unsync).unwrap();
    // The tensor is CUDA memory: no host path in this build.
    assert!(matches!(
        SendSpec::new(&t),
        Err(Error::UnsupportedDevice { .. })
    ));
    let user = AcquireOptions {
        stream: StreamPolicy::Synchronize {
            stream: Some(0x7f00),
        },
        ..Default::default()
    };
    let _ = acquire(&e, &user);
    let streams: Vec<_> = e.seen.borrow().iter().map(|r| r.stream).collect();
    assert_eq!(streams, vec![Some(1), Some(-1), Some(0x7f00)]);
    let zero = AcquireOptions {
        stream: StreamPolicy::Synchronize { stream: Some(0) },
        ..Default::default()
    };
    assert!(acquire(&e, &zero).is_err());
    assert_eq!(
        e.seen.borrow().len(),
        3,
        "stream 0 must never reach the producer"
    );
}

#[test]
fn c52_rocm_default_stream_is_zero() {
    let e = Recorder::new(Some(ROCM0), ROCM0);
    let _ = acquire(&e, &AcquireOptions::default());
    assert_eq!(e.seen.borrow()[0].stream, Some(0));
}

#[test]
fn c53_no_device_query_asks_without_stream_and_trusts_the_tensor() {
    let cpu = Recorder::new(None, Device::CPU);
    let t = acquire(&cpu, &AcquireOptions::default()).unwrap();
    assert_eq!(SendSpec::new(&t).unwrap().count(), 4);
    assert_eq!(cpu.seen.borrow()[0].stream, None);
    let gpu = Recorder::new(None, CUDA0);
    let r = acquire(&gpu, &AcquireOptions::default());
    assert_eq!(gpu.seen.borrow()[0].stream, None);
    assert!(
        matches!(r, Err(Error::UnsupportedDevice { device_type: 2, .. })),
        "{r:?}"
    );
}

#[test]
fn c54_required_device_query() {
    let e = Recorder::new(None, Device::CPU);
    let strict = AcquireOptions {
        device_query: DeviceQuery::Required,
        ..Default::default()
    };
    let err = acquire(&e, &strict).unwrap_err();
    assert_eq!(err, Error::MissingDeviceQuery);
    assert!(err.to_string().contains("dlpack_device"));
    assert!(e.seen.borrow().is_empty());
}

#[test]
fn device_mismatch_between_query_and_tensor() {
    let e = Recorder::new(Some(Device::CPU), Device::new(device_type::CUDA_HOST, 0));
    let r = acquire(&e, &AcquireOptions::default());
    assert!(matches!(
        r,
        Err(Error::DeviceMismatch {
            reported_type: 1,
            actual_type: 3,
            ..
        })
    ));
}

#[test]
fn pinned_host_is_host_memory() {
    // C60's host-side half: kDLCUDAHost needs no device path.
    let e = Recorder::new(
        Some(Device::new(device_type::CUDA_HOST, 0)),
        Device::new(device_type::CUDA_HOST, 0),
    );
    let t = acquire(&e, &AcquireOptions::default()).unwrap();
    assert_eq!(e.seen.borrow()[0].stream, None);
    assert_eq!(SendSpec::new(&t).unwrap().count(), 4);
}

#[test]
fn borrowed_view_is_not_owned() {
    let mut vals = [1i32, 2, 3];
    let mut shape = [3i64];
    let mut t = dlpack_mpi::dlpack::DLTensor {
        data: vals.as_mut_ptr().cast(),
        device: Device::CPU.into(),
        ndim: 1,
        dtype: DType::new(0, 32).into(),
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    // SAFETY: t, vals and shape outlive the view.
    let v = unsafe { TensorView::from_raw(&mut t) }.unwrap();
    assert_eq!(v.as_slice::<i32>().unwrap(), &[1, 2, 3]);
    assert_eq!(SendSpec::new(&v).unwrap().count(), 3);
    // SAFETY: NULL is refused before any read.
    let null = unsafe { TensorView::from_raw(std::ptr::null_mut()) };
    assert!(matches!(null, Err(Error::NullPointer { .. })));
}

#[test]
fn ranges_are_bounds_checked() {
    let owned = Owned::new((0..10).collect::<Vec<i32>>());
    let t = acquire(&owned, &AcquireOptions::default()).unwrap();
    let s = SendSpec::range(&t, 3, 4).unwrap();
    assert_eq!(s.count(), 4);
    assert!(matches!(
        SendSpec::range(&t, 8, 3),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        SendSpec::range(&t, -1, 1),
        Err(Error::OutOfBounds { .. })
    ));
    assert_eq!(SendSpec::range(&t, 10, 0).unwrap().count(), 0);
}

#[test]
fn empty_tensors_hand_mpi_a_null_pointer() {
    // Vec::<u8>::new() has the dangling address 0x1 = Open MPI's MPI_IN_PLACE.
    let owned = Owned::new(Vec::<u8>::new());
    let mut t = acquire(&owned, &AcquireOptions::default()).unwrap();
    assert!(!t.data_ptr().is_null());
    assert!(SendSpec::new(&t).unwrap().pointer().is_null());
    assert!(RecvSpec::new(&mut t).unwrap().pointer().is_null());
    let full = Owned::new(vec![1u8, 2]);
    let t = acquire(&full, &AcquireOptions::default()).unwrap();
    assert!(SendSpec::range(&t, 2, 0).unwrap().pointer().is_null());
    assert!(!SendSpec::range(&t, 1, 1).unwrap().pointer().is_null());
}

#[test]
#[allow(deprecated)] // VectorSendSpec
fn counts_beyond_mpi_int_are_never_truncated() {
    // 3e9 one-byte elements: a truncated int count would be negative. Such a message goes
    // through a large-count derived datatype (tests/mpi/mpi_cases.rs checks its size), which
    // needs MPI; the spec never hands MPI a wrapped count. Nothing reads the small storage.
    let raw = RawTensor::new(&[0u8; 8], (1, 8, 1)).shape(&[3_000_000_000], Some(&[1]));
    let (t, c) = raw.import_v1();
    let t = t.unwrap();
    assert_eq!(SendSpec::new(&t).unwrap_err(), Error::MpiNotInitialized);
    // Per-rank blocks are counted in MPI's int: 2^31 units do not fit.
    let owned = Owned::new(vec![0f32; 8])
        .with_dtype(DType::new(2, 32).with_lanes(4))
        .unwrap();
    let small = acquire(&owned, &AcquireOptions::default()).unwrap();
    let s = SendSpec::new(&small).unwrap();
    assert!(matches!(
        VectorSendSpec::new(s, &[1, 1], &[0, 1 << 29]),
        Err(Error::OutOfBounds { .. } | Error::CountTooLarge { .. })
    ));
    drop(t);
    assert_eq!(c.get(), 1);
}
