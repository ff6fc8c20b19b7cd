//! How an operand's elements reach MPI ([`Encoding`]), chosen from its [`Facts`], what the
//! operation needs of it ([`Need`]) and the packing policy, **before** any MPI datatype is
//! built: the side ([`super::side::Side`]) then builds exactly the one product its encoding
//! names (a large-count type, a derived datatype, or a packed copy), never one it drops.

use super::facts::Facts;
use super::operand::Reach;
use crate::error::{Error, Result};

/// What an operation needs of one operand's encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// A point-to-point message: any encoding the packing policy picks; a packed copy
    /// beyond `int` units goes whole as one large-count datatype (the receiver compares the
    /// whole message).
    Message,
    /// Any encoding the packing policy picks, counted in MPI's `int`: a packed copy beyond
    /// `int` units is [`Error::CountTooLarge`] (broadcast, a gather's send, nonblocking).
    Counted,
    /// Predefined units of the element that split into per-rank blocks (gathers, scatters,
    /// all-to-alls): the tensor's own run, or a packed copy when strided; at most `int`.
    Units,
    /// A reduction's flat path: the tensor's own run or a packed copy, any number of units,
    /// reduced in chunks of at most 2^30 units ([`Encoding::Chunked`]).
    Chunks,
    /// A packed copy whenever the tensor is strided, whatever the policy (windows of a
    /// strided tensor are parts of its packed copy); a contiguous tensor as for
    /// [`Need::Message`].
    Copy,
}

/// How an operand's elements reach MPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// The tensor's own elements, one run: `count` units of the predefined type.
    Run,
    /// The tensor's own run beyond MPI's `int` units: one large-count datatype, count 1.
    LargeRun,
    /// One committed derived datatype that visits the elements in place, count 1.
    Derived,
    /// A packed copy in logical row-major order, owned by the side; `whole`: beyond `int`
    /// units it is one large-count datatype (else [`Error::CountTooLarge`]).
    Packed {
        /// Whether a copy beyond `int` units goes as one large-count datatype.
        whole: bool,
    },
    /// A flat run (the tensor's own, or a packed copy when strided) that a reduction hands
    /// to MPI in chunks of at most 2^30 units of the predefined type.
    Chunked,
}

impl Encoding {
    /// The encoding of an operand with `facts` for `need`. `packs(block_bytes)` is the
    /// packing policy's answer for a strided layout whose contiguous inner block is
    /// `block_bytes` (asked only for [`Need::Message`] and [`Need::Counted`]).
    ///
    /// # Errors
    /// The policy's ([`Error::InvalidSetting`]); [`Error::UnsupportedDevice`] when the
    /// operand is [`Reach::MpiOnly`] and the encoding would read or write its bytes on the
    /// host or describe device memory by a derived datatype (a strided device tensor goes
    /// through the transport's device-side packing, never here).
    pub(crate) fn choose(
        facts: &Facts,
        need: Need,
        packs: impl FnOnce(usize) -> Result<bool>,
    ) -> Result<Encoding> {
        let encoding = match (facts.is_contiguous(), need) {
            (true, Need::Chunks) => Encoding::Chunked,
            (true, Need::Units) => Encoding::Run,
            (true, _) if facts.units().is_ok_and(|u| u > i32::MAX as usize) => Encoding::LargeRun,
            (true, _) => Encoding::Run,
            (false, Need::Chunks) => Encoding::Chunked,
            (false, Need::Units) => Encoding::Packed { whole: false },
            (false, Need::Copy) => Encoding::Packed { whole: true },
            (false, need) => {
                let block = facts
                    .inner_run_elems()
                    .saturating_mul(facts.element.size_bytes());
                if packs(block)? {
                    Encoding::Packed {
                        whole: need == Need::Message,
                    }
                } else {
                    Encoding::Derived
                }
            }
        };
        if facts.reach == Reach::MpiOnly && !facts.is_contiguous() {
            return Err(mpi_only_refusal(facts));
        }
        Ok(encoding)
    }
}

/// The refusal of a host-side pack, unpack or derived datatype over memory only MPI may
/// take (a device pointer on the direct route).
pub(crate) fn mpi_only_refusal(facts: &Facts) -> Error {
    Error::UnsupportedDevice {
        device_type: facts.device.device_type,
        device_id: facts.device.device_id,
        reason: "device memory that only a CUDA-aware MPI may take goes to MPI as one \
                 contiguous run; a strided layout of it is packed on the device by \
                 DeviceComm, never on the host",
    }
}
