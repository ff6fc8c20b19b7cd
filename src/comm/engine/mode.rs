//! How a collective runs once its body has declared its operands and how to prepare its
//! data operation ([`Mode`]): blocking ([`Blocking`]: stage, prepare, agree, run, finish,
//! all in the call) or nonblocking (`Immediate`, one layer up in [`super::request`]: the
//! same steps, with the agreement and the data operation posted and completed by the
//! returned request). Each collective of [`crate::comm`] is one body generic
//! over the mode, so its blocking and nonblocking forms check, encode and call MPI in the
//! same way.

use mpi::raw::AsRaw;

use super::agree::agree;
use super::call::Operation;
use super::checks::{check_intra, missing};
use super::signature::Signature;
use super::stager::{with_stand_ins, Declared, Endpoint, Kind, ReadIn, Unused, WriteIn};
use crate::dlpack::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::Access;
use mpi::topology::{Communicator, Rank};

/// How a collective's prepared operation runs.
pub(in crate::comm) trait Mode<'a> {
    /// What the collective returns: `()` blocking, a request nonblocking.
    type Out;

    /// Stages `declared`, prepares the operation on the stand-ins with `prepare` (every
    /// fallible step), agrees on `sig` and the outcome across the ranks, and runs the
    /// operation (or posts it).
    ///
    /// # Errors
    /// The stager's, `prepare`'s and the agreement's, and for a nonblocking collective the
    /// posting errors of the nonblocking driver.
    fn collective<E, P>(
        self,
        tc: &'a E,
        sig: Signature<'a>,
        declared: Declared<'a>,
        prepare: P,
    ) -> Result<Self::Out>
    where
        E: Endpoint + ?Sized,
        P: for<'x> FnOnce(Option<ReadIn<'x>>, Option<WriteIn<'x>>) -> Result<Operation<'x>>;

    /// Agrees on `sig` and the outcome of a preparation made without a stager (a fused
    /// list's), and runs the operation (or posts it).
    ///
    /// # Errors
    /// `prepared`'s and the agreement's.
    fn prepared<E: Endpoint + ?Sized>(
        self,
        tc: &'a E,
        sig: Signature<'a>,
        prepared: Result<Operation<'a>>,
    ) -> Result<Self::Out>;

    /// A refusal found before any operand was declared: agreed as the collective's outcome
    /// (the peers return [`Error::PeerRefused`]), then returned.
    ///
    /// # Errors
    /// `e`, always.
    fn refuse<E: Endpoint + ?Sized>(
        self,
        tc: &'a E,
        sig: Signature<'a>,
        e: Error,
    ) -> Result<Self::Out>;
}

/// The blocking form: everything happens in the call.
#[derive(Debug, Clone, Copy)]
pub(in crate::comm) struct Blocking;

impl<'a> Mode<'a> for Blocking {
    type Out = ();

    #[inline]
    fn collective<E, P>(
        self,
        tc: &'a E,
        sig: Signature<'a>,
        declared: Declared<'a>,
        prepare: P,
    ) -> Result<()>
    where
        E: Endpoint + ?Sized,
        P: for<'x> FnOnce(Option<ReadIn<'x>>, Option<WriteIn<'x>>) -> Result<Operation<'x>>,
    {
        let comm = tc.communicator();
        with_stand_ins(
            tc.stager(),
            comm,
            Kind::Collective(sig.clone()),
            declared,
            |s, r| {
                let (op, form) = agree(comm, &sig, prepare(s, r))?;
                op.run(comm.as_raw(), form)
            },
        )
    }

    fn prepared<E: Endpoint + ?Sized>(
        self,
        tc: &'a E,
        sig: Signature<'a>,
        prepared: Result<Operation<'a>>,
    ) -> Result<()> {
        let comm = tc.communicator();
        let (op, form) = agree(comm, &sig, prepared)?;
        op.run(comm.as_raw(), form)
    }

    fn refuse<E: Endpoint + ?Sized>(self, tc: &'a E, sig: Signature<'a>, e: Error) -> Result<()> {
        agree::<_, ()>(tc.communicator(), &sig, Err(e)).map(drop)
    }
}

/// The opening every collective with a send and a receive operand on each rank shares
/// (all-gather(v), all-to-all(v), all-reduce, reduce-scatter-block; the role of mpi4py's
/// `for_cco_send`/`for_cco_recv`): `tc`'s communicator checked as an intra-communicator,
/// `send` (read) and `recv` (written with `access`) declared to its stager (`reduce`: the
/// dtype of a reduction both take part in), and the collective run in `mode` with
/// `prepare` on both stand-ins (`what` names them if one is missing).
///
/// # Errors
/// [`crate::Error::Intercommunicator`], and as [`Mode::collective`].
pub(in crate::comm) fn pair_collective<'a, E, M, P>(
    tc: &'a E,
    mode: M,
    sig: Signature<'a>,
    (send, recv, access): (&'a dyn Tensor, &'a mut dyn Tensor, Access),
    reduce: Option<DType>,
    what: &'static str,
    prepare: P,
) -> Result<M::Out>
where
    E: Endpoint + ?Sized,
    M: Mode<'a>,
    P: for<'x> FnOnce(ReadIn<'x>, WriteIn<'x>) -> Result<Operation<'x>>,
{
    check_intra(tc.communicator())?;
    let declared = Declared::pair(send, (recv, access), reduce);
    mode.collective(tc, sig, declared, move |s, r| {
        let (s, r) = s.zip(r).ok_or_else(|| missing(what))?;
        prepare(s, r)
    })
}

/// The opening of a collective one of whose operands only the root uses (gather(v),
/// scatter(v), reduce): `tc`'s communicator checked as an intra-communicator, the operands
/// declared to its stager — `send` (read), `recv` (written with its access), `reduce` the
/// dtype of a reduction both take part in — except, at a rank that is not `root`, the
/// root's operand `unused` (checked as at the root, never staged or handed to MPI), and the
/// collective run in `mode` with `prepare` on the stand-ins and `(size, is_root)`.
///
/// # Errors
/// [`crate::Error::Intercommunicator`], and as [`Mode::collective`].
pub(in crate::comm) fn rooted_collective<'a, E, M, P>(
    tc: &'a E,
    mode: M,
    sig: Signature<'a>,
    (send, recv, reduce): RootedOperands<'a>,
    (root, unused): (Rank, Unused),
    prepare: P,
) -> Result<M::Out>
where
    E: Endpoint + ?Sized,
    M: Mode<'a>,
    P: for<'x> FnOnce(
        Option<ReadIn<'x>>,
        Option<WriteIn<'x>>,
        (Rank, bool),
    ) -> Result<Operation<'x>>,
{
    let comm = tc.communicator();
    check_intra(comm)?;
    let (size, is_root) = (comm.size(), comm.rank() == root);
    let unused = if is_root { Unused::Neither } else { unused };
    let declared = Declared {
        send,
        recv,
        reduce,
        unused,
    };
    mode.collective(tc, sig, declared, move |s, r| {
        prepare(s, r, (size, is_root))
    })
}

/// The operands of [`rooted_collective`]: send, receive with its access, reduction dtype.
pub(in crate::comm) type RootedOperands<'a> = (
    Option<&'a dyn Tensor>,
    Option<(&'a mut dyn Tensor, Access)>,
    Option<DType>,
);
