//! No rank left waiting on the device path (issue 14): a refusal that only one rank's
//! `DeviceComm` makes before `TensorComm`'s collective (a placement or staging refusal, such
//! as a `READ_ONLY` device receive tensor) is taken into the agreement the other ranks make,
//! so each of them returns `PeerRefused` naming that rank instead of waiting in MPI.

use super::*;
use dlpack_mpi::comm::TensorComm;

/// The last rank passes a read-only device receive tensor to an all-reduce, a gather (at
/// the root, when the root is the last rank) and an all-gather; every other rank passes
/// valid tensors. The last rank gets `ReadOnly`; every other rank `PeerRefused` naming it;
/// nothing is copied to or from the device on any rank. Then the same collectives run with
/// valid tensors everywhere (the agreement did not leave any message behind).
pub(super) fn one_rank_staging_refusal_is_agreed(w: &SimpleCommunicator) -> Outcome {
    let (rank, size) = (w.rank(), w.size());
    if size < 2 {
        return Ok(());
    }
    let last = size - 1;
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let n = 4usize;
    let src = on(CUDA0, vec![1.0; n]);
    type Op<'a> = &'a dyn Fn(
        &DeviceComm<'_, SimpleCommunicator>,
        &dyn dlpack_mpi::dlpack::Tensor,
        &mut dyn dlpack_mpi::dlpack::Tensor,
    ) -> Result<(), Error>;
    let all = n * size as usize;
    let ops: [(&str, usize, Op); 3] = [
        ("all-reduce", n, &|dc, s, r| {
            dc.all_reduce_tensor(s, r, ReduceOp::Sum)
        }),
        ("gather", all, &|dc, s, r| {
            dc.gather_tensor(s, Some(r), last)
        }),
        ("all-gather", all, &|dc, s, r| dc.all_gather_tensor(s, r)),
    ];
    for (name, len, op) in ops {
        for refuse in [true, false] {
            let recv = on(CUDA0, vec![0.0; len]);
            let recv = if refuse && rank == last {
                recv.read_only()
            } else {
                recv
            };
            let s = take(&src, &rt)?;
            let mut r = take(&recv, &rt)?;
            rt.clear_calls();
            match (refuse, rank == last, op(&dc, &s, &mut r)) {
                (true, true, Err(Error::ReadOnly)) => ensure_eq!(copies(&rt), (0, 0)),
                (true, false, Err(Error::PeerRefused { rank: who, .. })) => {
                    ensure_eq!(who, last);
                    ensure_eq!(copies(&rt).1, 0);
                }
                (false, _, Ok(())) => {}
                (refuse, _, other) => {
                    return Err(format!(
                        "{name} (refusing: {refuse}) at rank {rank}: got {other:?}"
                    ))
                }
            }
        }
    }
    Ok(())
}

pub(super) const CASES: &[(&str, Case)] = &[(
    "one_rank_staging_refusal_is_agreed",
    one_rank_staging_refusal_is_agreed,
)];
