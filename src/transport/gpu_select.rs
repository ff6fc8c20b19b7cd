//! Which GPU each rank uses: [`select_device`] gives every rank of a multi-GPU node its own
//! device and makes it the runtime's device before any context exists.
//!
//! The ordinal comes from, in this order:
//!
//! 1. an explicit argument (the CLI's `--gpu N`), [`DeviceSource::Flag`];
//! 2. the override `DLPACK_MPI_DEVICE=<ordinal>` ([`DEVICE_ENV`]), [`DeviceSource::Environment`];
//! 3. the node-local rank modulo the number of devices the runtime sees,
//!    [`DeviceSource::NodeLocalRank`]: ranks `0, 1, 2, 3` of a node with two GPUs use devices
//!    `0, 1, 0, 1`. The node-local rank is the rank in the communicator
//!    `MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL)` returns
//!    (MPI-4.1 §7.4.2: the processes that can share memory, i.e. one node), ordered by rank
//!    in `comm`.
//!
//! An explicit ordinal is not reduced modulo the count: one the runtime does not see is an
//! error, as is an unreadable `DLPACK_MPI_DEVICE` (read strictly, like
//! `DLPACK_MPI_CUDA_AWARE`: a typo is refused, never read as unset), even when a flag is given.
//!
//! This lives in `transport`, not in [`crate::runtime`]: the split needs a communicator, and
//! `runtime` sits below `comm` and uses only `error` and `device` (docs/ARCHITECTURE.md,
//! dependency order). The runtime offers the two pieces this needs and nothing MPI-shaped:
//! [`DeviceRuntime::device_count`] (makes no context) and [`DeviceRuntime::select_device`].

use mpi::topology::Communicator;

use crate::device::device_type;
use crate::error::{Error, Result};
use crate::runtime::DeviceRuntime;
use crate::settings::{parse_device_override, DEVICE_ENV};

/// Which source decided [`DeviceSelection::ordinal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSource {
    /// An explicit argument of [`select_device`] (the CLI's `--gpu`).
    Flag,
    /// The `DLPACK_MPI_DEVICE` environment variable.
    Environment,
    /// The node-local rank modulo the device count.
    NodeLocalRank,
}

/// This rank's place among the ranks of its node (a shared-memory split of a communicator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLocal {
    /// The rank among the node's ranks, `0..size`.
    pub rank: i32,
    /// How many ranks of the communicator run on this node.
    pub size: i32,
}

impl NodeLocal {
    /// This rank's node-local rank and the node's rank count, from
    /// `MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, ...)` keyed by the rank in `comm`
    /// (the split communicator is freed before returning). Collective over `comm`.
    pub fn of<C: Communicator + ?Sized>(comm: &C) -> NodeLocal {
        let node = comm.split_shared(comm.rank());
        NodeLocal {
            rank: node.rank(),
            size: node.size(),
        }
    }
}

/// The device a rank uses and why: what [`select_device`] chose (and the runtime was told).
/// Its `Display` is one line for `info` and report headers, e.g. `CUDA device 1 of 2
/// (node-local rank 3 of 4, modulo 2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSelection {
    /// The device ordinal (`DLDevice::device_id` of this rank's tensors).
    pub ordinal: i32,
    /// This rank's node-local rank.
    pub local_rank: i32,
    /// How many ranks share this node.
    pub local_size: i32,
    /// How many devices the runtime sees.
    pub device_count: usize,
    /// Who decided.
    pub source: DeviceSource,
}

impl DeviceSelection {
    /// Chooses the ordinal for a rank at `local` on a node where the runtime sees
    /// `device_count` devices: `flag`, else the `DLPACK_MPI_DEVICE` value `env`, else
    /// `local.rank % device_count` (module docs). Tells no runtime.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `env` is set and not an ordinal;
    /// [`Error::UnsupportedDevice`] when there is no device, or the explicit ordinal is not
    /// below `device_count`.
    pub fn choose(
        local: NodeLocal,
        device_count: usize,
        flag: Option<i32>,
        env: Option<&str>,
    ) -> Result<DeviceSelection> {
        Self::choose_parsed(local, device_count, flag, parse_device_override(env)?)
    }

    /// [`DeviceSelection::choose`] with the `DLPACK_MPI_DEVICE` value read.
    fn choose_parsed(
        local: NodeLocal,
        device_count: usize,
        flag: Option<i32>,
        from_env: Option<i32>,
    ) -> Result<DeviceSelection> {
        if device_count == 0 {
            return Err(Error::UnsupportedDevice {
                device_type: device_type::CUDA,
                device_id: flag.or(from_env).unwrap_or(0),
                reason: "the GPU runtime sees no device",
            });
        }
        let (ordinal, source) = match (flag, from_env) {
            (Some(o), _) => (o, DeviceSource::Flag),
            (None, Some(o)) => (o, DeviceSource::Environment),
            (None, None) => {
                let rank = local.rank.max(0);
                // A count beyond i32::MAX exceeds every rank: rank % count = rank.
                let o = i32::try_from(device_count).map_or(rank, |count| rank % count);
                (o, DeviceSource::NodeLocalRank)
            }
        };
        crate::runtime::check_ordinal(ordinal, device_count)?;
        Ok(DeviceSelection {
            ordinal,
            local_rank: local.rank,
            local_size: local.size,
            device_count,
            source,
        })
    }
}

impl std::fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (o, n) = (self.ordinal, self.device_count);
        let (r, s) = (self.local_rank, self.local_size);
        match self.source {
            DeviceSource::Flag => write!(f, "CUDA device {o} of {n} (set by --gpu; ")?,
            DeviceSource::Environment => {
                write!(f, "CUDA device {o} of {n} (set by {DEVICE_ENV}; ")?
            }
            DeviceSource::NodeLocalRank => write!(f, "CUDA device {o} of {n} (")?,
        }
        write!(f, "node-local rank {r} of {s}")?;
        if self.source == DeviceSource::NodeLocalRank {
            write!(f, ", modulo {n}")?;
        }
        f.write_str(")")
    }
}

/// Gives this rank its device: the node-local rank from a shared-memory split of `comm`
/// (collective, done first on every rank, so that no rank returns early and leaves its peers
/// inside the split), then [`select_device_at`] with `DLPACK_MPI_DEVICE` from the
/// environment. Call it once per process, after `MPI_Init` and before any other use of
/// `runtime` (and before cudarc's `CudaContext::new`, which should then be given
/// [`DeviceSelection::ordinal`]), so that the first context is made on the chosen device.
///
/// # Errors
/// As [`select_device_at`]. The errors are this rank's own; agree on them across ranks
/// before exiting (a peer may have succeeded).
pub fn select_device<C: Communicator + ?Sized>(
    comm: &C,
    runtime: &dyn DeviceRuntime,
    flag: Option<i32>,
) -> Result<DeviceSelection> {
    let local = NodeLocal::of(comm);
    // A value that is not UTF-8 is refused by name too (lossily shown), never read as unset.
    let from_env = crate::settings::device_override()?;
    select_parsed(local, runtime, flag, from_env)
}

/// The local part of [`select_device`], with the node-local place and the environment value
/// given: asks `runtime` for its device count, chooses ([`DeviceSelection::choose`]) and
/// makes the choice the runtime's device ([`DeviceRuntime::select_device`]). Not collective.
///
/// # Errors
/// [`Error::InvalidSetting`] for an unreadable `env`; [`Error::UnsupportedDevice`] when the
/// runtime sees no device or the explicit ordinal is not one of its devices;
/// [`Error::Cuda`] when the device's context cannot be made.
pub fn select_device_at(
    local: NodeLocal,
    runtime: &dyn DeviceRuntime,
    flag: Option<i32>,
    env: Option<&str>,
) -> Result<DeviceSelection> {
    // An unreadable value is refused before the runtime is asked anything.
    select_parsed(local, runtime, flag, parse_device_override(env)?)
}

/// [`select_device_at`] with the `DLPACK_MPI_DEVICE` value read.
fn select_parsed(
    local: NodeLocal,
    runtime: &dyn DeviceRuntime,
    flag: Option<i32>,
    from_env: Option<i32>,
) -> Result<DeviceSelection> {
    let chosen = DeviceSelection::choose_parsed(local, runtime.device_count(), flag, from_env)?;
    runtime.select_device(chosen.ordinal)?;
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANK3_OF_4: NodeLocal = NodeLocal { rank: 3, size: 4 };

    #[test]
    fn flag_then_environment_then_node_local_rank() {
        for (flag, env, ordinal, source, shown) in [
            (
                None,
                None,
                1,
                DeviceSource::NodeLocalRank,
                "CUDA device 1 of 2 (node-local rank 3 of 4, modulo 2)",
            ),
            (
                None,
                Some("0"),
                0,
                DeviceSource::Environment,
                "CUDA device 0 of 2 (set by DLPACK_MPI_DEVICE; node-local rank 3 of 4)",
            ),
            (
                Some(0),
                Some("1"),
                0,
                DeviceSource::Flag,
                "CUDA device 0 of 2 (set by --gpu; node-local rank 3 of 4)",
            ),
        ] {
            let chosen = DeviceSelection::choose(RANK3_OF_4, 2, flag, env).unwrap();
            assert_eq!(
                (chosen.ordinal, chosen.source),
                (ordinal, source),
                "{shown}"
            );
            assert_eq!(chosen.to_string(), shown);
        }
    }

    #[test]
    fn refusals() {
        // A typo is refused even when a flag decides.
        assert!(matches!(
            DeviceSelection::choose(RANK3_OF_4, 2, Some(0), Some("x")),
            Err(Error::InvalidSetting { .. })
        ));
        for (count, flag, env) in [
            (2, Some(2), None),
            (2, Some(-1), None),
            (2, None, Some("5")),
        ] {
            match DeviceSelection::choose(RANK3_OF_4, count, flag, env) {
                Err(Error::UnsupportedDevice { device_id, .. }) => {
                    assert_eq!(device_id, flag.unwrap_or(5));
                }
                other => panic!("{flag:?}/{env:?}: expected UnsupportedDevice, got {other:?}"),
            }
        }
        assert!(matches!(
            DeviceSelection::choose(RANK3_OF_4, 0, None, None),
            Err(Error::UnsupportedDevice { .. })
        ));
    }
}
