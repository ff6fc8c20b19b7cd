//! How a collective runs once its body has declared its operands and how to prepare its
//! data operation ([`Mode`]): blocking ([`Blocking`]: stage, prepare, agree, run, finish,
//! all in the call) or nonblocking ([`Immediate`]: the same steps, with the agreement and
//! the data operation posted and completed by the returned [`TensorRequest`]). Each
//! collective of [`super::TensorComm`] is one body generic over the mode, so its blocking
//! and nonblocking forms check, encode and call MPI in the same way.

use mpi::raw::AsRaw;
use mpi::request::Scope;

use super::agree::agree;
use super::call::Operation;
use super::immediate::TensorRequest;
use super::pending;
use super::signature::Signature;
use super::stager::{with_stand_ins, Kind, ReadIn, Unused, WriteIn};
use super::TensorComm;
use crate::dlpack::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::Access;

/// The operands a collective declares to its communicator's stager: the tensor MPI reads,
/// the tensor it writes (with how), the dtype of a reduction both take part in, and which
/// one only the root uses where this rank is not the root.
pub(super) struct Declared<'a> {
    pub(super) send: Option<&'a dyn Tensor>,
    pub(super) recv: Option<(&'a mut dyn Tensor, Access)>,
    pub(super) reduce: Option<DType>,
    pub(super) unused: Unused,
}

impl<'a> Declared<'a> {
    /// A send and a receive operand, both used.
    pub(super) fn pair(
        send: &'a dyn Tensor,
        recv: (&'a mut dyn Tensor, Access),
        reduce: Option<DType>,
    ) -> Self {
        Declared {
            send: Some(send),
            recv: Some(recv),
            reduce,
            unused: Unused::Neither,
        }
    }

    /// One operand MPI reads.
    pub(super) fn read(send: &'a dyn Tensor) -> Self {
        Declared {
            send: Some(send),
            recv: None,
            reduce: None,
            unused: Unused::Neither,
        }
    }

    /// One operand MPI writes (or updates).
    pub(super) fn write(recv: (&'a mut dyn Tensor, Access), reduce: Option<DType>) -> Self {
        Declared {
            send: None,
            recv: Some(recv),
            reduce,
            unused: Unused::Neither,
        }
    }
}

/// How a collective's prepared operation runs.
pub(super) trait Mode<'a> {
    /// What the collective returns: `()` blocking, a request nonblocking.
    type Out;

    /// Stages `declared`, prepares the operation on the stand-ins with `prepare` (every
    /// fallible step), agrees on `sig` and the outcome across the ranks, and runs the
    /// operation (or posts it).
    ///
    /// # Errors
    /// The stager's, `prepare`'s and the agreement's, and for a nonblocking collective the
    /// posting errors of [`pending::post`].
    fn collective<T, P>(
        self,
        tc: &'a T,
        sig: Signature<'a>,
        declared: Declared<'a>,
        prepare: P,
    ) -> Result<Self::Out>
    where
        T: TensorComm + ?Sized,
        P: for<'x> FnOnce(Option<ReadIn<'x>>, Option<WriteIn<'x>>) -> Result<Operation<'x>>;

    /// Agrees on `sig` and the outcome of a preparation made without a stager (a fused
    /// list's), and runs the operation (or posts it).
    ///
    /// # Errors
    /// `prepared`'s and the agreement's.
    fn prepared<T: TensorComm + ?Sized>(
        self,
        tc: &'a T,
        sig: Signature<'a>,
        prepared: Result<Operation<'a>>,
    ) -> Result<Self::Out>;

    /// A refusal found before any operand was declared: agreed as the collective's outcome
    /// (the peers return [`Error::PeerRefused`]), then returned.
    ///
    /// # Errors
    /// `e`, always.
    fn refuse<T: TensorComm + ?Sized>(
        self,
        tc: &'a T,
        sig: Signature<'a>,
        e: Error,
    ) -> Result<Self::Out>;
}

/// The blocking form: everything happens in the call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Blocking;

impl<'a> Mode<'a> for Blocking {
    type Out = ();

    #[inline]
    fn collective<T, P>(
        self,
        tc: &'a T,
        sig: Signature<'a>,
        declared: Declared<'a>,
        prepare: P,
    ) -> Result<()>
    where
        T: TensorComm + ?Sized,
        P: for<'x> FnOnce(Option<ReadIn<'x>>, Option<WriteIn<'x>>) -> Result<Operation<'x>>,
    {
        let comm = tc.communicator();
        with_stand_ins(
            tc.stager(),
            comm,
            Kind::Collective(sig),
            declared.send,
            declared.recv,
            (declared.reduce, declared.unused),
            |s, r| agree(comm, &sig, prepare(s, r))?.run(comm.as_raw()),
        )
    }

    fn prepared<T: TensorComm + ?Sized>(
        self,
        tc: &'a T,
        sig: Signature<'a>,
        prepared: Result<Operation<'a>>,
    ) -> Result<()> {
        let comm = tc.communicator();
        agree(comm, &sig, prepared)?.run(comm.as_raw())
    }

    fn refuse<T: TensorComm + ?Sized>(self, tc: &'a T, sig: Signature<'a>, e: Error) -> Result<()> {
        agree(tc.communicator(), &sig, Err(e))
    }
}

/// The nonblocking form, inside the rsmpi scope `Sc`: returns a [`TensorRequest`] that
/// owns the prepared operation (and any staged copies) until MPI completes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Immediate<Sc>(pub(super) Sc);

impl<'a, Sc: Scope<'a> + Copy> Mode<'a> for Immediate<Sc> {
    type Out = TensorRequest<'a, Sc>;

    #[inline]
    fn collective<T, P>(
        self,
        tc: &'a T,
        sig: Signature<'a>,
        declared: Declared<'a>,
        prepare: P,
    ) -> Result<TensorRequest<'a, Sc>>
    where
        T: TensorComm + ?Sized,
        P: for<'x> FnOnce(Option<ReadIn<'x>>, Option<WriteIn<'x>>) -> Result<Operation<'x>>,
    {
        pending::post(tc, self.0, sig, declared, prepare)
    }

    fn prepared<T: TensorComm + ?Sized>(
        self,
        tc: &'a T,
        sig: Signature<'a>,
        prepared: Result<Operation<'a>>,
    ) -> Result<TensorRequest<'a, Sc>> {
        pending::start(tc.communicator(), self.0, sig, prepared, None)
    }

    fn refuse<T: TensorComm + ?Sized>(
        self,
        tc: &'a T,
        sig: Signature<'a>,
        e: Error,
    ) -> Result<TensorRequest<'a, Sc>> {
        pending::refuse(tc.communicator(), self.0, sig, e)
    }
}
