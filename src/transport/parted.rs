//! The receiving end of the parted point-to-point protocol ([`super::pipeline`]) for
//! [`DeviceComm`]'s `recv_tensor`: which tensors a parted message may be meant for, and the
//! parts received into a contiguous or a strided tensor (staged or not), with the drain of a
//! refused message.

use mpi::point_to_point::Status;
use mpi::topology::Communicator;
use mpi::Tag;

use super::pipeline::MIN_PIPELINE_CHUNK_BYTES;
use super::route::Route;
use super::stage::{host_write_checks, Placement};
use super::DeviceComm;
use crate::dlpack::Tensor;
use crate::error::{Error, Result};
use crate::spec::facts::Facts;
use crate::spec::scratch::Scratch;
use crate::spec::side::unpack;
use crate::spec::Access;

impl<C: Communicator + ?Sized> DeviceComm<'_, C> {
    /// The facts of a receive tensor a parted message could be meant for: elements of more
    /// bytes in all than the smallest part ([`MIN_PIPELINE_CHUNK_BYTES`]), whatever this
    /// side's part size (the sender's header gives its own), in any layout (a strided tensor
    /// receives the parts packed and unpacks them, [`DeviceComm::recv_parted_strided`]).
    pub(super) fn parted_candidate(
        &self,
        tensor: &dyn Tensor,
        placement: Option<&Placement>,
    ) -> Result<Option<Facts>> {
        let x = match placement {
            Some(p) => p.facts.clone(),
            // Host memory: the receive checks (READ_ONLY, IS_COPIED, overlap) happen here,
            // because a parted message is received without TensorComm; a small tensor (the
            // per-message common case) skips this and gets them from TensorComm.
            None if tensor.dtype().size_bytes().is_some_and(|b| {
                b as i128 * i128::from(tensor.num_elements()) > MIN_PIPELINE_CHUNK_BYTES as i128
            }) =>
            {
                host_write_checks(tensor)?;
                Facts::measure(tensor)?
            }
            None => return Ok(None),
        };
        let bytes = usize::try_from(x.len_elems)
            .ok()
            .and_then(|n| n.checked_mul(x.element.size_bytes()));
        Ok(bytes
            .is_some_and(|b| b > MIN_PIPELINE_CHUNK_BYTES)
            .then_some(x))
    }

    pub(super) fn recv_parted(
        &self,
        placement: Option<Placement>,
        tensor: &dyn Tensor,
        x: &Facts,
        tag: Tag,
        first: (Status, usize),
    ) -> Result<Status> {
        let pipe = self.pipe();
        let total = x.span_bytes() / x.element.size_bytes();
        let staged = match placement.as_ref().filter(|p| p.route == Route::Staged) {
            Some(p) => Some((
                p,
                pipe.part_buffers(x.element, first.1)
                    .map_err(|e| self.refuse_parts(e, total, x, tag, &first))?,
            )),
            None => None,
        };
        self.note(placement.as_ref().map_or(Route::Host, |p| p.route));
        let base = placement
            .as_ref()
            .map_or(tensor.first_element_ptr() as usize, |p| {
                p.facts.first as usize
            });
        pipe.recv_parts(staged, base, total, x.element, tag, first)
    }

    /// A refusal after a valid part header, before any part was posted: receives and
    /// discards the parts ([`super::pipeline::Pipe::drain`]) so that the sender completes, then returns `e`.
    fn refuse_parts(
        &self,
        e: Error,
        total: usize,
        x: &Facts,
        tag: Tag,
        (header, part): &(Status, usize),
    ) -> Error {
        let n = u64::try_from(total).unwrap_or(u64::MAX);
        let parts = (*part, n, x.element.size_bytes());
        self.pipe()
            .drain(header.source_rank(), tag, parts, Some(x.element));
        e
    }

    /// A parted message into a strided receive tensor: the parts land in the tensor's
    /// contiguous stand-in when staging packs it ([`Stage`]: a pinned buffer, or a device
    /// scratch on the direct route), else in a host scratch buffer that the pack kernels
    /// then unpack into the stand-in or the tensor; the stand-in goes to the device as for
    /// every staged receive. Nothing of the tensor changes unless every part arrived.
    pub(super) fn recv_parted_strided(
        &self,
        placement: Option<Placement>,
        tensor: &mut dyn Tensor,
        (x, total): (&Facts, usize),
        tag: Tag,
        first: (Status, usize),
    ) -> Result<Status> {
        let refuse = |e| self.refuse_parts(e, total, x, tag, &first);
        let (_, st) = self
            .stage_pair(None, Some((&*tensor, placement, Access::Write)))
            .map_err(refuse)?;
        let pipe = self.pipe();
        let status = {
            let mut view = st.stand_in_view().map_err(refuse)?;
            let t: &mut dyn Tensor = match view.as_mut() {
                Some(v) => v,
                None => &mut *tensor,
            };
            let facts = Facts::measure(&*t).map_err(refuse)?;
            match &facts.plan {
                None => {
                    let base = t.first_element_ptr() as usize;
                    pipe.recv_parts(None, base, total, x.element, tag, first)?
                }
                Some(plan) => {
                    let e = x.element.size_bytes();
                    // total × e fits usize (parted_candidate).
                    let mut packed = Scratch::take(total * e).map_err(refuse)?;
                    let base = packed.as_mut_ptr() as usize;
                    let status = pipe.recv_parts(None, base, total, x.element, tag, first)?;
                    unpack(t, plan, x.element, &packed)?;
                    status
                }
            }
        };
        st.finish()?;
        Ok(status)
    }
}
