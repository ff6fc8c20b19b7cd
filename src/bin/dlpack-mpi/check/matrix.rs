//! The case matrix: operations, layouts, and the name of a case
//! (`op/dtype/layout/device/transport/len`, and `/off3b`-style with an offset).

use dlpack_mpi::transport::DeviceComm;
use mpi::topology::SimpleCommunicator;

use super::placement::{Offset, Placement};
use crate::launch::Dev;

/// The communicator every case goes through.
pub(super) type Comm<'c> = DeviceComm<'c, SimpleCommunicator>;

/// An operation the check runs (case names' `op` part).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    SendRecv,
    Sendrecv,
    IsendIrecv,
    Bcast,
    Reduce,
    Allreduce,
    AllreduceInplace,
    Gather,
    Gatherv,
    Scatter,
    Scatterv,
    Allgather,
    Allgatherv,
    Alltoall,
    Alltoallv,
    ReduceScatterBlock,
    Ibcast,
    Ireduce,
    Iallreduce,
    IallreduceInplace,
    Igather,
    Igatherv,
    Iscatter,
    Iscatterv,
    Iallgather,
    Iallgatherv,
    Ialltoall,
    Ialltoallv,
    IreduceScatterBlock,
    FusedAllreduce,
    FusedAllreduceInto,
    FusedBcast,
    FusedReduceScatter,
    IfusedAllreduce,
    PlanAllreduce,
    PlanAllreduceMax,
    PlanBcast,
}

impl Op {
    /// Every operation, in the order the matrix runs them: the blocking ones, then the
    /// nonblocking collectives in the same order (so that the blocking ones keep their
    /// matrix columns), then the fused collectives over lists of tensors, then their plans.
    pub(super) const ALL: [Op; 37] = [
        Op::SendRecv,
        Op::Sendrecv,
        Op::IsendIrecv,
        Op::Bcast,
        Op::Reduce,
        Op::Allreduce,
        Op::AllreduceInplace,
        Op::Gather,
        Op::Gatherv,
        Op::Scatter,
        Op::Scatterv,
        Op::Allgather,
        Op::Allgatherv,
        Op::Alltoall,
        Op::Alltoallv,
        Op::ReduceScatterBlock,
        Op::Ibcast,
        Op::Ireduce,
        Op::Iallreduce,
        Op::IallreduceInplace,
        Op::Igather,
        Op::Igatherv,
        Op::Iscatter,
        Op::Iscatterv,
        Op::Iallgather,
        Op::Iallgatherv,
        Op::Ialltoall,
        Op::Ialltoallv,
        Op::IreduceScatterBlock,
        Op::FusedAllreduce,
        Op::FusedAllreduceInto,
        Op::FusedBcast,
        Op::FusedReduceScatter,
        Op::IfusedAllreduce,
        Op::PlanAllreduce,
        Op::PlanAllreduceMax,
        Op::PlanBcast,
    ];

    /// The name of `--op` and of case names.
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::SendRecv => "send-recv",
            Op::Sendrecv => "sendrecv",
            Op::IsendIrecv => "isend-irecv",
            Op::Bcast => "bcast",
            Op::Reduce => "reduce",
            Op::Allreduce => "allreduce",
            Op::AllreduceInplace => "allreduce-inplace",
            Op::Gather => "gather",
            Op::Gatherv => "gatherv",
            Op::Scatter => "scatter",
            Op::Scatterv => "scatterv",
            Op::Allgather => "allgather",
            Op::Allgatherv => "allgatherv",
            Op::Alltoall => "alltoall",
            Op::Alltoallv => "alltoallv",
            Op::ReduceScatterBlock => "reduce-scatter-block",
            Op::Ibcast => "ibcast",
            Op::Ireduce => "ireduce",
            Op::Iallreduce => "iallreduce",
            Op::IallreduceInplace => "iallreduce-inplace",
            Op::Igather => "igather",
            Op::Igatherv => "igatherv",
            Op::Iscatter => "iscatter",
            Op::Iscatterv => "iscatterv",
            Op::Iallgather => "iallgather",
            Op::Iallgatherv => "iallgatherv",
            Op::Ialltoall => "ialltoall",
            Op::Ialltoallv => "ialltoallv",
            Op::IreduceScatterBlock => "ireduce-scatter-block",
            Op::FusedAllreduce => "fused-allreduce",
            Op::FusedAllreduceInto => "fused-allreduce-into",
            Op::FusedBcast => "fused-bcast",
            Op::FusedReduceScatter => "fused-reduce-scatter",
            Op::IfusedAllreduce => "ifused-allreduce",
            Op::PlanAllreduce => "plan-allreduce",
            Op::PlanAllreduceMax => "plan-allreduce-max",
            Op::PlanBcast => "plan-bcast",
        }
    }

    /// Whether the case is a fused collective over a list of tensors (`super::fused`).
    pub(super) fn is_fused(self) -> bool {
        matches!(
            self,
            Op::FusedAllreduce
                | Op::FusedAllreduceInto
                | Op::FusedBcast
                | Op::FusedReduceScatter
                | Op::IfusedAllreduce
        )
    }

    /// Whether the case is a plan of a fused collective (`super::plans`).
    pub(super) fn is_planned(self) -> bool {
        matches!(
            self,
            Op::PlanAllreduce | Op::PlanAllreduceMax | Op::PlanBcast
        )
    }

    /// Whether the matrix has cases of this operation in `layout`: not those of a fused
    /// collective whose list is written in place (`fused-allreduce`, `fused-bcast`,
    /// `ifused-allreduce`, and the plans) in the broadcast layout, whose written tensors
    /// are contiguous (the contiguous cases' lists, repeated values aside).
    pub(super) fn runs_layout(self, layout: Layout) -> bool {
        let in_place = self.is_planned()
            || matches!(
                self,
                Op::FusedAllreduce | Op::FusedBcast | Op::IfusedAllreduce
            );
        !(in_place && layout == Layout::Broadcast)
    }

    /// The blocking collective whose nonblocking form this is (`iallreduce` →
    /// `allreduce`, `ifused-allreduce` → `fused-allreduce`): the case posts it in an rsmpi
    /// scope, completes it, and checks what the blocking case checks. `None` for the
    /// blocking operations and for `isend-irecv` (a point-to-point case of its own).
    pub(super) fn posts(self) -> Option<Op> {
        Some(match self {
            Op::Ibcast => Op::Bcast,
            Op::Ireduce => Op::Reduce,
            Op::Iallreduce => Op::Allreduce,
            Op::IallreduceInplace => Op::AllreduceInplace,
            Op::Igather => Op::Gather,
            Op::Igatherv => Op::Gatherv,
            Op::Iscatter => Op::Scatter,
            Op::Iscatterv => Op::Scatterv,
            Op::Iallgather => Op::Allgather,
            Op::Iallgatherv => Op::Allgatherv,
            Op::Ialltoall => Op::Alltoall,
            Op::Ialltoallv => Op::Alltoallv,
            Op::IreduceScatterBlock => Op::ReduceScatterBlock,
            Op::IfusedAllreduce => Op::FusedAllreduce,
            _ => return None,
        })
    }
}

/// The transport part of case names: `host` for host memory, `managed` for managed memory,
/// the communicator's mode (`direct` or `staged`) for device memory.
pub(super) fn transport_part(dev: Dev, dc: &Comm<'_>) -> &'static str {
    match dev {
        Dev::Cpu | Dev::CudaHost => "host",
        Dev::CudaManaged => "managed",
        Dev::Cuda if dc.is_direct() => "direct",
        Dev::Cuda => "staged",
    }
}

/// The transport part of the names of `place`'s cases ([`Placement::transport`] of
/// [`transport_part`]: `host+staged` for `cpu:cuda`).
pub(super) fn placement_transport(place: Placement, dc: &Comm<'_>) -> String {
    place.transport(|d| transport_part(d, dc))
}

/// A case's name: `op/dtype/layout/device/transport/len`, then `/off3b` (or `p`) for an
/// offset; the device part is the placement's ([`Placement::name`]: `cpu`, `cpu:cuda`,
/// `even-cpu+odd-cuda`).
pub(super) fn case_name(
    op: Op,
    dtype: &str,
    layout: Layout,
    (device, transport): (&str, &str),
    len: i64,
    offset: Offset,
) -> String {
    let mut name = format!(
        "{}/{dtype}/{}/{device}/{transport}/{len}",
        op.name(),
        layout.name(),
    );
    if let Some(part) = offset.name_part() {
        name.push('/');
        name.push_str(&part);
    }
    name
}

/// How a case stores its logical vector of `n` elements (case names' `layout` part).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// 1-d, C-contiguous.
    Contiguous,
    /// 3-d `[a, b, c]` (`a·b·c = n`) in Fortran order: strides `[1, a, a·b]`.
    Fortran,
    /// 2-d `[a, b]` transposed: strides `[1, a]`.
    Transposed,
    /// Every other element of `2n`: stride 2.
    Step,
    /// Reversed: stride −1 from the last element.
    Negative,
    /// Stride 0 over one element (send side only; receives are contiguous).
    Broadcast,
    /// 0-d (`ndim = 0`, one element; only for length 1).
    Scalar,
}

pub(super) const LAYOUTS: [Layout; 7] = [
    Layout::Contiguous,
    Layout::Fortran,
    Layout::Transposed,
    Layout::Step,
    Layout::Negative,
    Layout::Broadcast,
    Layout::Scalar,
];

impl Layout {
    pub(super) fn name(self) -> &'static str {
        match self {
            Layout::Contiguous => "contiguous",
            Layout::Fortran => "fortran",
            Layout::Transposed => "transposed",
            Layout::Step => "step",
            Layout::Negative => "negative",
            Layout::Broadcast => "broadcast",
            Layout::Scalar => "scalar",
        }
    }

    /// Shape, strides (elements), storage elements, and the storage position of each
    /// logical element, for `n` logical elements; `recv` = the receive side (broadcast
    /// receives are contiguous).
    pub(super) fn place(self, n: i64, recv: bool) -> (Vec<i64>, Vec<i64>, usize, Vec<usize>) {
        let nu = n as usize;
        // Buffers of another length in a scalar case (a gather's P elements, a v-variant's
        // empty block) are contiguous: a 0-d tensor holds exactly one element.
        let this = if self == Layout::Scalar && n != 1 {
            Layout::Contiguous
        } else {
            self
        };
        let largest_divisor_at_most = |m: i64, limit: f64| -> i64 {
            (1..=m.max(1))
                .rev()
                .find(|d| m % d == 0 && (*d as f64) <= limit)
                .unwrap_or(1)
        };
        match this {
            Layout::Contiguous => (vec![n], vec![1], nu, (0..nu).collect()),
            Layout::Broadcast if recv => (vec![n], vec![1], nu, (0..nu).collect()),
            Layout::Broadcast => (vec![n], vec![0], nu.min(1), vec![0; nu]),
            Layout::Scalar => (vec![], vec![], nu, (0..nu).collect()),
            Layout::Step => (vec![n], vec![2], 2 * nu, (0..nu).map(|l| 2 * l).collect()),
            Layout::Negative => (vec![n], vec![-1], nu, (0..nu).map(|l| nu - 1 - l).collect()),
            Layout::Transposed => {
                let a = largest_divisor_at_most(n, (n as f64).sqrt());
                let b = if n == 0 { 0 } else { n / a };
                let pos = (0..nu)
                    .map(|l| {
                        let (i, j) = (l as i64 / b.max(1), l as i64 % b.max(1));
                        (i + a * j) as usize
                    })
                    .collect();
                (vec![a, b], vec![1, a], nu, pos)
            }
            Layout::Fortran => {
                let a = largest_divisor_at_most(n, (n as f64).cbrt());
                let rest = if n == 0 { 0 } else { n / a };
                let b = largest_divisor_at_most(rest, (rest as f64).sqrt());
                let c = if rest == 0 { 0 } else { rest / b };
                let pos = (0..nu)
                    .map(|l| {
                        let l = l as i64;
                        let (i, j, k) =
                            (l / (b * c).max(1), (l / c.max(1)) % b.max(1), l % c.max(1));
                        (i + a * j + a * b * k) as usize
                    })
                    .collect();
                (vec![a, b, c], vec![1, a, a * b], nu, pos)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every blocking single-tensor collective has one nonblocking form, named with an `i`
    /// in front; of the fused ones, the all-reduce in place.
    #[test]
    fn nonblocking_collectives_pair_with_blocking_ones() {
        let posted: Vec<Op> = Op::ALL.iter().filter_map(|o| o.posts()).collect();
        assert_eq!(posted.len(), 14);
        assert_eq!(Op::IfusedAllreduce.posts(), Some(Op::FusedAllreduce));
        assert_eq!(Op::ALL.iter().filter(|o| o.is_fused()).count(), 5);
        assert_eq!(Op::ALL.iter().filter(|o| o.is_planned()).count(), 3);
        for op in Op::ALL {
            if let Some(blocking) = op.posts() {
                assert_eq!(op.name(), format!("i{}", blocking.name()));
                assert_eq!(blocking.posts(), None);
                assert_eq!(posted.iter().filter(|b| **b == blocking).count(), 1);
            }
        }
        let collectives = Op::ALL.iter().filter(|o| {
            o.posts().is_none()
                && !o.is_fused()
                && !o.is_planned()
                && !matches!(o, Op::SendRecv | Op::Sendrecv | Op::IsendIrecv)
        });
        assert!(collectives.clone().all(|o| posted.contains(o)));
        assert_eq!(collectives.count(), 13);
    }
}
