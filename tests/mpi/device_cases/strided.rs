//! Strided device tensors (issue 13, item 4) on the simulated runtime: their elements, and
//! only their elements, are copied packed by 2-D copies (`runtime::StridedCopy`), to a pinned
//! buffer on the staged route and to a device scratch buffer on the direct route, and
//! unpacked into a strided receive tensor. Each case checks the values received, the bytes
//! in between left as they were, and the bytes the runtime copied.

use super::*;
use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::layout;
use dlpack_mpi::runtime::CopyKind;

/// Strided device tensors keep their layout through staging: a step-2 and a negative-stride
/// send, received into a step-2 tensor whose gap elements must keep their values.
fn c64_strided_staged(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let (rank, size) = (w.rank(), w.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let base: Vec<f32> = (0..10).map(|i| (rank * 100 + i) as f32).collect();
    let step2 = Owned::new(base.clone())
        .with_layout(&[5], Some(&[2]), 0)
        .map_err(|e| e.to_string())?
        .labelled(CUDA0);
    let mut into = Owned::new(vec![-7.0f32; 10])
        .with_layout(&[5], Some(&[2]), 4)
        .map_err(|e| e.to_string())?
        .labelled(CUDA0);
    {
        let s = take(&step2, &rt)?;
        let mut d = take(&into, &rt)?;
        call!(dc.sendrecv_tensor(&s, next, 3, &mut d, prev, 3));
    }
    let got = into.as_slice().to_vec();
    for i in 0..5 {
        ensure_eq!(got[2 * i], -7.0);
        ensure_eq!(got[2 * i + 1], (prev * 100 + 2 * i as i32) as f32);
    }
    let reversed = Owned::new(base)
        .with_layout(&[10], Some(&[-1]), 36)
        .map_err(|e| e.to_string())?
        .labelled(CUDA0);
    let mut plain = on(CUDA0, vec![0.0; 10]);
    {
        let s = take(&reversed, &rt)?;
        let mut d = take(&plain, &rt)?;
        call!(dc.sendrecv_tensor(&s, next, 4, &mut d, prev, 4));
    }
    let want: Vec<f32> = (0..10).rev().map(|i| (prev * 100 + i) as f32).collect();
    ensure_eq!(plain.as_slice(), &want[..]);
    Ok(())
}

/// A layout over a storage of `storage` f32 elements.
struct Layout {
    name: &'static str,
    shape: &'static [i64],
    strides: &'static [i64],
    byte_offset: u64,
    storage: usize,
}

/// Step 2, transposed, Fortran order, a 3-D permutation, rows of a wider matrix.
const LAYOUTS: &[Layout] = &[
    Layout {
        name: "step-2",
        shape: &[50],
        strides: &[2],
        byte_offset: 0,
        storage: 100,
    },
    Layout {
        name: "transposed 6x7",
        shape: &[6, 7],
        strides: &[1, 6],
        byte_offset: 0,
        storage: 42,
    },
    Layout {
        name: "Fortran 2x3x4",
        shape: &[2, 3, 4],
        strides: &[1, 2, 6],
        byte_offset: 0,
        storage: 24,
    },
    Layout {
        name: "permuted 3x4x5 (axes 2,0,1 of 4x5x3)",
        shape: &[3, 4, 5],
        strides: &[1, 15, 3],
        byte_offset: 0,
        storage: 60,
    },
    Layout {
        name: "rows 4x5 of 4x8, offset 2",
        shape: &[4, 5],
        strides: &[8, 1],
        byte_offset: 8,
        storage: 32,
    },
];

impl Layout {
    fn len(&self) -> usize {
        self.shape.iter().product::<i64>() as usize
    }

    /// Storage indices of the elements, in logical row-major order.
    fn indices(&self) -> Vec<usize> {
        let first = self.byte_offset as i64 / 4;
        layout::plan(self.shape, Some(self.strides))
            .expect("a valid layout")
            .offsets()
            .map(|o| (first + o) as usize)
            .collect()
    }

    fn tensor(&self, storage: Vec<f32>) -> Result<Owned<f32>, String> {
        Ok(Owned::new(storage)
            .with_layout(self.shape, Some(self.strides), self.byte_offset)
            .map_err(|e| format!("{}: {e}", self.name))?
            .labelled(CUDA0))
    }
}

fn sum_2d(rt: &SimulatedRuntime, kind: CopyKind) -> usize {
    rt.calls()
        .iter()
        .map(|c| match c {
            RuntimeCall::Copy2d { kind: k, bytes, .. } if *k == kind => *bytes,
            _ => 0,
        })
        .sum()
}

/// One ring exchange of `l` (send and receive both laid out as `l`) through `dc`; returns
/// the receive storage.
fn ring(
    w: &SimpleCommunicator,
    dc: &DeviceComm<'_, SimpleCommunicator>,
    rt: &SimulatedRuntime,
    l: &Layout,
    tag: i32,
) -> Result<Vec<f32>, String> {
    let (rank, size) = (w.rank(), w.size());
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    let src = l.tensor(
        (0..l.storage)
            .map(|i| (rank * 1000) as f32 + i as f32)
            .collect(),
    )?;
    let mut dst = l.tensor(vec![-7.0; l.storage])?;
    {
        let s = take(&src, rt)?;
        let mut d = take(&dst, rt)?;
        rt.clear_calls();
        call!(dc.sendrecv_tensor(&s, next, tag, &mut d, prev, tag));
    }
    let got = dst.as_slice().to_vec();
    let mut want = vec![-7.0f32; l.storage];
    for i in l.indices() {
        want[i] = (prev * 1000) as f32 + i as f32;
    }
    ensure!(got == want, "{}: received {got:?}, want {want:?}", l.name);
    Ok(got)
}

/// Staged: each layout is packed device → host (only its elements) and unpacked host →
/// device into the strided receive tensor; no span copy.
pub(super) fn strided_staged_packs_only_the_elements(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    for (k, l) in LAYOUTS.iter().enumerate() {
        ring(w, &dc, &rt, l, 20 + k as i32)?;
        let bytes = l.len() * 4;
        ensure_eq!(dc.last_route(), Some(Route::Staged));
        ensure_eq!(sum_2d(&rt, CopyKind::DeviceToHost), bytes);
        ensure_eq!(sum_2d(&rt, CopyKind::HostToDevice), bytes);
        ensure_eq!(copies(&rt), (0, 0));
        ensure_eq!(rt.bytes_copied(), 2 * bytes);
    }
    Ok(())
}

/// Direct (MPI declared CUDA-aware): each layout is packed into a device scratch buffer
/// (device → device), sent contiguous, and unpacked device → device; nothing crosses to the
/// host, and the scratch buffers are pooled and freed with the `DeviceComm`.
pub(super) fn strided_direct_packs_on_the_device(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    std::env::set_var("DLPACK_MPI_CUDA_AWARE", "1");
    let dc = DeviceComm::new(w, Some(&rt as &dyn DeviceRuntime), Transport::Direct);
    std::env::remove_var("DLPACK_MPI_CUDA_AWARE");
    let dc = call!(dc);
    for (k, l) in LAYOUTS.iter().enumerate() {
        ring(w, &dc, &rt, l, 40 + k as i32)?;
        let bytes = l.len() * 4;
        ensure_eq!(dc.last_route(), Some(Route::Direct));
        ensure_eq!(sum_2d(&rt, CopyKind::DeviceToDevice), 2 * bytes);
        ensure_eq!(rt.bytes_copied(), 2 * bytes);
        ensure_eq!(copies(&rt), (0, 0));
    }
    // 200 more messages allocate nothing more: the two scratch buffers are reused.
    let l = &LAYOUTS[1];
    let before = rt.device_live_bytes();
    for i in 0..200 {
        ring(w, &dc, &rt, l, 60 + i % 2)?;
        ensure!(
            !rt.calls()
                .iter()
                .any(|c| matches!(c, RuntimeCall::AllocDevice { .. })),
            "message {i} allocated device scratch"
        );
    }
    ensure_eq!(rt.device_live_bytes(), before);
    ensure!(before > 0, "the direct route used no device scratch");
    drop(dc);
    ensure_eq!(rt.device_live_bytes(), 0);
    Ok(())
}

/// Receive-side unpack with another layout than the sender's, and an in-place all-reduce of
/// a strided device tensor (packed, reduced, unpacked; the bytes between stay).
pub(super) fn strided_unpack_and_in_place(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let (rank, size) = (w.rank(), w.size());
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    let tl = &LAYOUTS[1];
    // Transposed 6 × 7 out, into a C-order 6 × 7 on a step-2 storage (strides 14, 2).
    let src = tl.tensor((0..42).map(|i| (rank * 1000 + i) as f32).collect())?;
    let mut dst = Owned::new(vec![-7.0f32; 84])
        .with_layout(&[6, 7], Some(&[14, 2]), 0)
        .map_err(|e| e.to_string())?
        .labelled(CUDA0);
    {
        let s = take(&src, &rt)?;
        let mut d = take(&dst, &rt)?;
        call!(dc.sendrecv_tensor(&s, next, 80, &mut d, prev, 80));
    }
    let got = dst.as_slice().to_vec();
    for (k, i) in tl.indices().into_iter().enumerate() {
        ensure_eq!(got[2 * k], (prev * 1000) as f32 + i as f32);
        ensure_eq!(got[2 * k + 1], -7.0);
    }
    let mut t = LAYOUTS[3].tensor(vec![1.0; 60])?;
    {
        let mut d = take(&t, &rt)?;
        rt.clear_calls();
        call!(dc.all_reduce_tensor_in_place(&mut d, ReduceOp::Sum));
        ensure_eq!(rt.bytes_copied(), 2 * 60 * 4);
    }
    ensure_eq!(t.as_slice(), &vec![size as f32; 60][..]);
    Ok(())
}

/// Where 2-D copies cannot express the layout cheaply: a reversed axis of 10 elements is ten
/// one-element copies; one of 5000 (over `MAX_STRIDED_COPIES`) copies the whole span, as a
/// strided host tensor.
pub(super) fn strided_fallbacks(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let (rank, size) = (w.rank(), w.size());
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    for (n, tag) in [(10usize, 90), (5000, 91)] {
        let rev = Owned::new(
            (0..n)
                .map(|i| (rank * 10_000 + i as i32) as f32)
                .collect::<Vec<f32>>(),
        )
        .with_layout(&[n as i64], Some(&[-1]), (n as u64 - 1) * 4)
        .map_err(|e| e.to_string())?
        .labelled(CUDA0);
        let mut plain = on(CUDA0, vec![0.0; n]);
        {
            let s = take(&rev, &rt)?;
            let mut d = take(&plain, &rt)?;
            rt.clear_calls();
            call!(dc.sendrecv_tensor(&s, next, tag, &mut d, prev, tag));
        }
        let want: Vec<f32> = (0..n)
            .rev()
            .map(|i| (prev * 10_000 + i as i32) as f32)
            .collect();
        ensure_eq!(plain.as_slice(), &want[..]);
        let per_element = rt
            .calls()
            .iter()
            .any(|c| matches!(c, RuntimeCall::Copy2d { copies, .. } if *copies == n));
        ensure_eq!(per_element, n == 10);
        ensure_eq!(
            sum_2d(&rt, CopyKind::DeviceToHost),
            if n == 10 { 40 } else { 0 }
        );
    }
    Ok(())
}

/// The cases of this file, run after `device_cases.rs`'s own.
pub(super) const CASES: &[(&str, Case)] = &[
    ("c64_strided_staged", c64_strided_staged),
    (
        "strided_staged_packs_only_the_elements",
        strided_staged_packs_only_the_elements,
    ),
    (
        "strided_direct_packs_on_the_device",
        strided_direct_packs_on_the_device,
    ),
    ("strided_unpack_and_in_place", strided_unpack_and_in_place),
    ("strided_fallbacks", strided_fallbacks),
];
