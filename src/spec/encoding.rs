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
    #[inline]
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

/// The choices are pure functions of the facts, the need and the policy's answer, so they
/// run without MPI (and under Miri).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlpack::{acquire, AcquireOptions, Owned};
    use crate::spec::Access;

    /// No stream is requested: the CUDA-labelled tensors here are host memory with no
    /// runtime to synchronize.
    fn options() -> AcquireOptions {
        AcquireOptions {
            stream: crate::dlpack::StreamPolicy::Unsynchronized,
            ..AcquireOptions::default()
        }
    }

    fn facts(owned: &Owned<f32>, reach: Option<Reach>) -> Facts {
        let t = acquire(owned, &options()).unwrap();
        Facts::of(&t, Access::Read, reach).unwrap()
    }

    #[test]
    fn each_need_gets_its_encoding() {
        let run = Owned::new(vec![0f32; 12]);
        let step = Owned::new(vec![0f32; 12])
            .with_layout(&[6], Some(&[2]), 0)
            .unwrap();
        let (r, s) = (facts(&run, None), facts(&step, None));
        let never = |_| -> Result<bool> { panic!("the policy is asked for strided p2p only") };
        for need in [Need::Message, Need::Counted, Need::Units, Need::Copy] {
            assert_eq!(Encoding::choose(&r, need, never).unwrap(), Encoding::Run);
        }
        assert_eq!(
            Encoding::choose(&r, Need::Chunks, never).unwrap(),
            Encoding::Chunked
        );
        let packs = |block| {
            assert_eq!(block, 4, "step 2 of f32: one-element blocks");
            Ok(true)
        };
        let derived = |_| Ok(false);
        let c = |need, p: &dyn Fn(usize) -> Result<bool>| Encoding::choose(&s, need, p).unwrap();
        assert_eq!(c(Need::Message, &packs), Encoding::Packed { whole: true });
        assert_eq!(c(Need::Counted, &packs), Encoding::Packed { whole: false });
        assert_eq!(c(Need::Message, &derived), Encoding::Derived);
        assert_eq!(c(Need::Counted, &derived), Encoding::Derived);
        assert_eq!(c(Need::Units, &derived), Encoding::Packed { whole: false });
        assert_eq!(c(Need::Copy, &derived), Encoding::Packed { whole: true });
        assert_eq!(c(Need::Chunks, &derived), Encoding::Chunked);
    }

    /// Memory only MPI may take (a device pointer on the direct route) goes as its own run;
    /// any encoding of a strided layout of it is a typed refusal naming the device.
    #[test]
    fn mpi_only_memory_is_never_packed_on_the_host() {
        let cuda = crate::device::Device::new(crate::device::device_type::CUDA, 1);
        let run = Owned::new(vec![0f32; 8]).labelled(cuda);
        let step = Owned::new(vec![0f32; 8])
            .with_layout(&[4], Some(&[2]), 0)
            .unwrap()
            .labelled(cuda);
        let r = facts(&run, Some(Reach::MpiOnly));
        assert_eq!(
            Encoding::choose(&r, Need::Message, |_| Ok(true)).unwrap(),
            Encoding::Run
        );
        let s = facts(&step, Some(Reach::MpiOnly));
        for need in [Need::Message, Need::Units, Need::Chunks, Need::Copy] {
            match Encoding::choose(&s, need, |_| Ok(false)) {
                Err(Error::UnsupportedDevice {
                    device_type,
                    device_id,
                    reason,
                }) => {
                    assert_eq!((device_type, device_id), (2, 1));
                    assert!(reason.contains("never on the host"), "{reason}");
                }
                other => panic!("{need:?}: expected UnsupportedDevice, got {other:?}"),
            }
        }
        // Without a stager's word, the CUDA label itself is refused (naming DeviceComm).
        let t = acquire(&run, &options()).unwrap();
        assert!(matches!(
            Facts::of(&t, Access::Read, None),
            Err(Error::UnsupportedDevice { .. })
        ));
    }
}
