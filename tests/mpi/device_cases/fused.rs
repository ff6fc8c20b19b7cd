//! Fused collectives on `DeviceComm` (issue 25, item 1) on the simulated device: the
//! members of a bucket are packed on the device (one batch of device-to-device 2-D copies)
//! and the bucket crosses to the host once (staged) or goes to MPI as it is (direct), not
//! once per member. Copy counts and bytes are exact; values are checked element by
//! element, and the gaps of strided members keep theirs.

use super::*;
use dlpack_mpi::runtime::CopyKind;

/// (copies to the host, their bytes, copies to the device, their bytes).
pub(super) fn crossings(rt: &SimulatedRuntime) -> (usize, usize, usize, usize) {
    rt.calls()
        .iter()
        .fold((0, 0, 0, 0), |(h, hb, d, db), c| match c {
            RuntimeCall::CopyToHost { bytes, .. } => (h + 1, hb + bytes, d, db),
            RuntimeCall::CopyToDevice { bytes, .. } => (h, hb, d + 1, db + bytes),
            _ => (h, hb, d, db),
        })
}

/// What one call copied: [`crossings`] and [`on_device`].
type Copied = ((usize, usize, usize, usize), (usize, usize));

/// Device-to-device 2-D copy batches (runtime calls) and their bytes.
pub(super) fn on_device(rt: &SimulatedRuntime) -> (usize, usize) {
    rt.calls().iter().fold((0, 0), |(n, b), c| match c {
        RuntimeCall::Copy2d {
            kind: CopyKind::DeviceToDevice,
            bytes,
            ..
        } => (n + 1, b + bytes),
        _ => (n, b),
    })
}

/// Rank `r`'s value of element `i` of member `m`.
pub(super) fn val(r: i32, m: usize, i: usize) -> f32 {
    (r + 1) as f32 * ((m + i) % 5 + 1) as f32
}

fn summed(p: i32, m: usize, i: usize) -> f32 {
    (0..p).map(|r| val(r, m, i)).sum()
}

/// Member `m` of `n` f32 on `device`, step 2 when `strided` (gaps hold −7).
pub(super) fn member(
    device: Device,
    m: usize,
    n: usize,
    strided: bool,
    r: i32,
) -> Result<Owned<f32>, String> {
    if !strided {
        return Ok(on(device, (0..n).map(|i| val(r, m, i)).collect()));
    }
    let mut v = vec![-7.0f32; 2 * n.max(1)];
    for i in 0..n {
        v[2 * i] = val(r, m, i);
    }
    Owned::new(v)
        .labelled(device)
        .with_layout(&[n as i64], Some(&[2]), 0)
        .map_err(|e| e.to_string())
}

/// The logical values of a member made by [`member`], after checking its gaps.
pub(super) fn logical(o: &mut Owned<f32>, n: usize, strided: bool) -> Result<Vec<f32>, String> {
    let all = o.as_slice();
    if !strided {
        return Ok(all.to_vec());
    }
    ensure!(
        all.iter().skip(1).step_by(2).all(|&g| g == -7.0),
        "a gap was written: {all:?}"
    );
    Ok(all.iter().step_by(2).take(n).copied().collect())
}

/// The shapes of the lists: (elements, strided), a zero-size member among them.
pub(super) const SHAPES: &[(usize, bool)] =
    &[(5, false), (6, true), (0, false), (3, false), (9, true)];

/// The in-place fused all-reduce of [`SHAPES`] on `dc`, blocking or nonblocking; returns
/// the runtime's (crossings, device copies) of the call.
fn in_place(
    w: &SimpleCommunicator,
    rt: &SimulatedRuntime,
    dc: &DeviceComm<'_, SimpleCommunicator>,
    (nonblocking, device): (bool, Device),
) -> Result<Copied, String> {
    let (me, p) = (w.rank(), w.size());
    let mut ms: Vec<Owned<f32>> = SHAPES
        .iter()
        .enumerate()
        .map(|(m, &(n, st))| member(device, m, n, st, me))
        .collect::<Result<_, _>>()?;
    let seen;
    {
        let mut ts: Vec<ManagedTensor<'_>> =
            ms.iter().map(|o| take(o, rt)).collect::<Result<_, _>>()?;
        let mut refs: Vec<&mut dyn Tensor> = ts.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        rt.clear_calls();
        if nonblocking {
            let done: Result<(), Error> = mpi::request::scope(|scope| {
                dc.immediate_all_reduce_tensors_in_place(scope, &mut refs, ReduceOp::Sum)?
                    .wait()
                    .map(drop)
            });
            call!(done);
        } else {
            call!(dc.all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum));
        }
        seen = (crossings(rt), on_device(rt));
    }
    for (m, (o, &(n, st))) in ms.iter_mut().zip(SHAPES).enumerate() {
        let want: Vec<f32> = (0..n).map(|i| summed(p, m, i)).collect();
        ensure_eq!(logical(o, n, st)?, want);
    }
    Ok(seen)
}

/// Staged: the list's 23 f32 (92 bytes, one bucket) are packed on the device (one batch),
/// cross to the host once and back once, and are unpacked by one more batch.
fn staged_in_place(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    for nonblocking in [false, true] {
        let (cross, dev) = in_place(w, &rt, &dc, (nonblocking, CUDA0))?;
        ensure_eq!(cross, (1, 92, 1, 92));
        ensure_eq!(dev, (2, 184));
        ensure_eq!(dc.last_route(), Some(Route::Staged));
    }
    // Managed members, strided ones included, are packed by the device's copies as well.
    let (cross, dev) = in_place(w, &rt, &dc, (false, MANAGED))?;
    ensure_eq!(cross, (1, 92, 1, 92));
    ensure_eq!(dev, (2, 184));
    Ok(())
}

/// Direct (a CUDA-aware MPI): MPI reduces the device bucket; nothing crosses to the host.
fn direct_in_place(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    std::env::set_var("DLPACK_MPI_CUDA_AWARE", "1");
    let dc = DeviceComm::new(w, Some(&rt as &dyn DeviceRuntime), Transport::Auto);
    std::env::remove_var("DLPACK_MPI_CUDA_AWARE");
    let dc = call!(dc);
    for nonblocking in [false, true] {
        let (cross, dev) = in_place(w, &rt, &dc, (nonblocking, CUDA0))?;
        ensure_eq!(cross, (0, 0, 0, 0));
        ensure_eq!(dev, (2, 184));
        ensure_eq!(dc.last_route(), Some(Route::Direct));
    }
    // A float32 member, then a float16 one: the float16 bucket is staged (its reduction is a
    // host function), the float32 one goes direct; exactly one crossing each way (8 bytes).
    let (me, p) = (w.rank(), w.size());
    let f = member(CUDA0, 0, 3, false, me)?;
    let mut h = on_half(0, me);
    {
        let mut tf = take(&f, &rt)?;
        let mut th = take(&h, &rt)?;
        let mut refs: Vec<&mut dyn Tensor> = vec![&mut tf, &mut th];
        rt.clear_calls();
        call!(dc.all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum));
        ensure_eq!(crossings(&rt), (1, 8, 1, 8));
        ensure_eq!(dc.last_route(), Some(Route::Staged));
    }
    let want: Vec<f16> = (0..4).map(|i| f16::from_f32(summed(p, 50, i))).collect();
    ensure_eq!(h.as_slice(), &want[..]);
    Ok(())
}

/// Forty members of 10 f32 and three of float16: two buckets (one per dtype), so two
/// crossings each way, not forty-three; the float16 sums are exact (host reduction).
fn many_members_two_buckets(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let mut fs: Vec<Owned<f32>> = (0..40)
        .map(|m| member(CUDA0, m, 10, m % 3 == 0, me))
        .collect::<Result<_, _>>()?;
    let mut hs: Vec<Owned<f16>> = (0..3).map(|m| on_half(m, me)).collect::<Vec<_>>();
    {
        let mut ft: Vec<ManagedTensor<'_>> =
            fs.iter().map(|o| take(o, &rt)).collect::<Result<_, _>>()?;
        let mut ht: Vec<ManagedTensor<'_>> =
            hs.iter().map(|o| take(o, &rt)).collect::<Result<_, _>>()?;
        let (a, b) = ft.split_at_mut(20);
        let mut refs: Vec<&mut dyn Tensor> = a.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        refs.extend(ht.iter_mut().map(|t| t as &mut dyn Tensor));
        refs.extend(b.iter_mut().map(|t| t as &mut dyn Tensor));
        rt.clear_calls();
        call!(dc.all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum));
        ensure_eq!(crossings(&rt), (2, 1600 + 24, 2, 1600 + 24));
    }
    for (m, o) in fs.iter_mut().enumerate() {
        let want: Vec<f32> = (0..10).map(|i| summed(p, m, i)).collect();
        ensure_eq!(logical(o, 10, m % 3 == 0)?, want);
    }
    for (m, o) in hs.iter_mut().enumerate() {
        let want: Vec<f16> = (0..4)
            .map(|i| f16::from_f32(summed(p, 50 + m, i)))
            .collect();
        ensure_eq!(o.as_slice(), &want[..]);
    }
    Ok(())
}

fn on_half(m: usize, r: i32) -> Owned<f16> {
    Owned::new(
        (0..4)
            .map(|i| f16::from_f32(val(r, 50 + m, i)))
            .collect::<Vec<_>>(),
    )
    .labelled(CUDA0)
}

/// A staged fused broadcast from rank 0, nonblocking: the root packs and crosses to the
/// host once; every other rank crosses back once and unpacks; values land, gaps keep theirs.
fn staged_broadcast(w: &SimpleCommunicator) -> Outcome {
    let me = w.rank();
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let mut ms: Vec<Owned<f32>> = SHAPES
        .iter()
        .enumerate()
        .map(|(m, &(n, st))| member(CUDA0, m, n, st, if me == 0 { 0 } else { 9 }))
        .collect::<Result<_, _>>()?;
    {
        let mut ts: Vec<ManagedTensor<'_>> =
            ms.iter().map(|o| take(o, &rt)).collect::<Result<_, _>>()?;
        let mut refs: Vec<&mut dyn Tensor> = ts.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        rt.clear_calls();
        let done: Result<(), Error> = mpi::request::scope(|scope| {
            dc.immediate_broadcast_tensors(scope, &mut refs, 0)?
                .wait()
                .map(drop)
        });
        call!(done);
        let want = if me == 0 {
            (1, 92, 0, 0)
        } else {
            (0, 0, 1, 92)
        };
        ensure_eq!(crossings(&rt), want);
    }
    for (m, (o, &(n, st))) in ms.iter_mut().zip(SHAPES).enumerate() {
        let want: Vec<f32> = (0..n).map(|i| val(0, m, i)).collect();
        ensure_eq!(logical(o, n, st)?, want);
    }
    Ok(())
}

/// Refusals: a `READ_ONLY` member on the last rank only (refused before any copy there; its
/// error names the member, every other rank returns `PeerRefused`, nothing changes); a list of host and
/// device members (`MixedDevices`); a reduce-scatter from device into host members
/// (`MixedDevices`).
fn refusals(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let mut a = member(CUDA0, 0, 4, false, me)?;
    let mut b = member(CUDA0, 1, 4, false, me)?;
    if me == p - 1 {
        b = b.read_only();
    }
    {
        let mut ta = take(&a, &rt)?;
        let mut tb = take(&b, &rt)?;
        rt.clear_calls();
        let mut refs: Vec<&mut dyn Tensor> = vec![&mut ta, &mut tb];
        let got = dc.all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum);
        match got {
            Err(Error::Member { index: 1, source }) if me == p - 1 => {
                ensure!(
                    matches!(*source, Error::ReadOnly | Error::Immutable { .. }),
                    "member 1: {source:?}"
                );
            }
            Err(Error::PeerRefused { .. }) if me != p - 1 => {}
            Ok(()) if p == 1 => return Err("a read-only member was reduced".into()),
            other => return Err(format!("rank {me}: {other:?}")),
        }
        // The refusing rank copies nothing; its peers staged their bucket before the
        // agreement (as every staged collective does) but copy nothing back.
        let (_, _, back, _) = crossings(&rt);
        ensure_eq!(back, 0);
        if me == p - 1 {
            ensure_eq!(crossings(&rt), (0, 0, 0, 0));
        }
    }
    ensure_eq!(
        a.as_slice(),
        &(0..4).map(|i| val(me, 0, i)).collect::<Vec<_>>()[..]
    );
    let host = Owned::new(vec![1.0f32; 3]);
    let dev = on(CUDA0, vec![1.0; 3]);
    {
        let mut th = take(&host, &rt)?;
        let mut td = take(&dev, &rt)?;
        let mut refs: Vec<&mut dyn Tensor> = vec![&mut td, &mut th];
        match dc.all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum) {
            Err(Error::MixedDevices { index: 1, .. }) => {}
            other => return Err(format!("expected MixedDevices, got {other:?}")),
        }
    }
    // A device send list and a host receive list.
    let send = on(CUDA0, vec![1.0; 2 * p as usize]);
    let mut recv = Owned::new(vec![0.0f32; 2]);
    {
        let ts = take(&send, &rt)?;
        let mut tr = take(&recv, &rt)?;
        let sends: Vec<&dyn Tensor> = vec![&ts];
        let mut recvs: Vec<&mut dyn Tensor> = vec![&mut tr];
        match dc.reduce_scatter_block_tensors(&sends, &mut recvs, ReduceOp::Sum) {
            Err(Error::MixedDevices { index: 0, .. }) => {}
            other => return Err(format!("expected MixedDevices, got {other:?}")),
        }
    }
    ensure_eq!(recv.as_slice(), &[0.0, 0.0][..]);
    Ok(())
}

/// The fused reduce-scatter of [`SHAPES`] (each member's receive; its send holds every
/// rank's block, `p` times as many elements, strided alike) on `dc`, blocking or
/// nonblocking; returns the runtime's (crossings, device copies) of the call.
fn reduce_scatter(
    w: &SimpleCommunicator,
    rt: &SimulatedRuntime,
    dc: &DeviceComm<'_, SimpleCommunicator>,
    (nonblocking, device): (bool, Device),
) -> Result<Copied, String> {
    let (me, p) = (w.rank(), w.size());
    let pu = p as usize;
    let sends: Vec<Owned<f32>> = SHAPES
        .iter()
        .enumerate()
        .map(|(m, &(n, st))| member(device, m, n * pu, st, me))
        .collect::<Result<_, _>>()?;
    let mut recvs: Vec<Owned<f32>> = SHAPES
        .iter()
        .enumerate()
        .map(|(m, &(n, st))| member(device, m + 7, n, st, -3))
        .collect::<Result<_, _>>()?;
    let seen;
    {
        let ss: Vec<ManagedTensor<'_>> = sends
            .iter()
            .map(|o| take(o, rt))
            .collect::<Result<_, _>>()?;
        let mut rs: Vec<ManagedTensor<'_>> = recvs
            .iter()
            .map(|o| take(o, rt))
            .collect::<Result<_, _>>()?;
        let srefs: Vec<&dyn Tensor> = ss.iter().map(|t| t as &dyn Tensor).collect();
        let mut rrefs: Vec<&mut dyn Tensor> = rs.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        rt.clear_calls();
        if nonblocking {
            let done: Result<(), Error> = mpi::request::scope(|scope| {
                dc.immediate_reduce_scatter_block_tensors(scope, &srefs, &mut rrefs, ReduceOp::Sum)?
                    .wait()
                    .map(drop)
            });
            call!(done);
        } else {
            call!(dc.reduce_scatter_block_tensors(&srefs, &mut rrefs, ReduceOp::Sum));
        }
        seen = (crossings(rt), on_device(rt));
    }
    let at = me as usize;
    for (m, (o, &(n, st))) in recvs.iter_mut().zip(SHAPES).enumerate() {
        let want: Vec<f32> = (0..n).map(|j| summed(p, m, at * n + j)).collect();
        ensure!(
            logical(o, n, st)? == want,
            "member {m}: {:?} vs {want:?}",
            logical(o, n, st)?
        );
    }
    Ok(seen)
}

/// Staged: every rank's blocks of the list (92 bytes per rank) are packed on the device
/// into one send buffer (the two strided members whole first, then one 2-D copy per
/// member: two batches), which crosses to the host once; this rank's 92 bytes cross back
/// once and are unpacked by one batch. Direct: nothing crosses.
fn staged_and_direct_reduce_scatter(w: &SimpleCommunicator) -> Outcome {
    let p = w.size() as usize;
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    // The strided members' elements (6 and 9 per rank), packed whole, then every member's
    // runs into the send buffer, then this rank's block unpacked.
    // At one rank the bucket is its own send buffer (MPI_IN_PLACE): packed, then unpacked.
    let dev = match p {
        1 => (2, 184),
        _ => (3, (6 + 9) * 4 * p + 92 * p + 92),
    };
    for nonblocking in [false, true] {
        let (cross, copies) = reduce_scatter(w, &rt, &dc, (nonblocking, CUDA0))?;
        ensure_eq!(cross, (1, 92 * p, 1, 92));
        ensure_eq!(copies, dev);
        ensure_eq!(dc.last_route(), Some(Route::Staged));
    }
    // Managed members, strided ones included, are packed by the device's copies as well.
    let (cross, copies) = reduce_scatter(w, &rt, &dc, (false, MANAGED))?;
    ensure_eq!(cross, (1, 92 * p, 1, 92));
    ensure_eq!(copies, dev);
    std::env::set_var("DLPACK_MPI_CUDA_AWARE", "1");
    let direct = DeviceComm::new(w, Some(&rt as &dyn DeviceRuntime), Transport::Auto);
    std::env::remove_var("DLPACK_MPI_CUDA_AWARE");
    let direct = call!(direct);
    let (cross, copies) = reduce_scatter(w, &rt, &direct, (false, CUDA0))?;
    ensure_eq!(cross, (0, 0, 0, 0));
    ensure_eq!(copies, dev);
    ensure_eq!(direct.last_route(), Some(Route::Direct));
    half_reduce_scatter(w, &rt, &direct)
}

/// A float16 reduce-scatter on the direct route is staged all the same (its reduction is a
/// host function): one crossing each way, 2 × 4 bytes per rank; the sums are exact.
fn half_reduce_scatter(
    w: &SimpleCommunicator,
    rt: &SimulatedRuntime,
    dc: &DeviceComm<'_, SimpleCommunicator>,
) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let pu = p as usize;
    let send: Owned<f16> = Owned::new(
        (0..4 * pu)
            .map(|i| f16::from_f32(val(me, 50, i)))
            .collect::<Vec<_>>(),
    )
    .labelled(CUDA0);
    let mut recv: Owned<f16> = on_half(1, -3);
    {
        let ts = take(&send, rt)?;
        let mut tr = take(&recv, rt)?;
        let sends: Vec<&dyn Tensor> = vec![&ts];
        let mut recvs: Vec<&mut dyn Tensor> = vec![&mut tr];
        rt.clear_calls();
        call!(dc.reduce_scatter_block_tensors(&sends, &mut recvs, ReduceOp::Sum));
        ensure_eq!(crossings(rt), (1, 8 * pu, 1, 8));
        ensure_eq!(dc.last_route(), Some(Route::Staged));
    }
    let at = me as usize * 4;
    let want: Vec<f16> = (0..4)
        .map(|j| f16::from_f32(summed(p, 50, at + j)))
        .collect();
    ensure_eq!(recv.as_slice(), &want[..]);
    Ok(())
}

pub(super) const CASES: &[(&str, Case)] = &[
    ("fused_staged_in_place", staged_in_place),
    ("fused_direct_in_place", direct_in_place),
    ("fused_many_members_two_buckets", many_members_two_buckets),
    ("fused_staged_broadcast", staged_broadcast),
    ("fused_refusals", refusals),
    ("fused_reduce_scatter", staged_and_direct_reduce_scatter),
];
