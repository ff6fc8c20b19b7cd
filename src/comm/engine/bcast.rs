//! The buffer of a broadcast as each rank holds it: [`BroadcastBuffer`], so that the root
//! may pass a shared (e.g. `READ_ONLY`) tensor while the other ranks pass one to receive
//! into (MPI-4.1 §6.4: the root's buffer is only read).

use std::fmt;

use mpi::topology::Rank;

use crate::dlpack::Tensor;
use crate::error::{Error, Result};

/// One rank's buffer of `broadcast_tensor_from`.
///
/// ```no_run
/// use dlpack_mpi::comm::BroadcastBuffer;
/// use dlpack_mpi::prelude::*;
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
/// use mpi::traits::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let universe = mpi::initialize().ok_or("MPI was already initialized")?;
/// let world = universe.world();
/// let root = 0;
/// let weights = Owned::new(vec![0.5f32; 4]).read_only(); // shared: never written
/// let received = Owned::new(vec![0.0f32; 4]);
/// let shared = acquire(&weights, &AcquireOptions::default())?;
/// let mut into = acquire(&received, &AcquireOptions::default())?;
/// let buffer = if world.rank() == root {
///     BroadcastBuffer::Send(&shared) // READ_ONLY is fine at the root
/// } else {
///     BroadcastBuffer::Recv(&mut into) // every element is written
/// };
/// world.broadcast_tensor_from(buffer, root)?;
/// # Ok(())
/// # }
/// ```
pub enum BroadcastBuffer<'b> {
    /// At the root: the tensor to send, only read (it may be `READ_ONLY`). Refused at any
    /// other rank ([`Error::BroadcastNotRoot`]).
    Send(&'b dyn Tensor),
    /// At any rank: a tensor of the root's count and dtype; received into at the other
    /// ranks, only read at the root (the form of `broadcast_tensor`).
    Recv(&'b mut dyn Tensor),
}

impl<'b> BroadcastBuffer<'b> {
    /// The tensor the root sends (either form).
    pub(in crate::comm) fn sent(&self) -> &dyn Tensor {
        match self {
            BroadcastBuffer::Send(t) => *t,
            BroadcastBuffer::Recv(t) => &**t,
        }
    }

    /// The same buffer, borrowed for a shorter `'x`.
    pub(in crate::comm) fn reborrow<'x>(self) -> BroadcastBuffer<'x>
    where
        'b: 'x,
    {
        match self {
            BroadcastBuffer::Send(t) => BroadcastBuffer::Send(t),
            BroadcastBuffer::Recv(t) => BroadcastBuffer::Recv(t),
        }
    }

    /// The tensor the root sends, for the whole borrow (either form).
    pub(in crate::comm) fn into_sent(self) -> &'b dyn Tensor {
        match self {
            BroadcastBuffer::Send(t) => t,
            BroadcastBuffer::Recv(t) => t,
        }
    }

    /// The tensor a non-root rank `rank` receives into.
    ///
    /// # Errors
    /// [`Error::BroadcastNotRoot`] for a [`BroadcastBuffer::Send`].
    pub(in crate::comm) fn received(self, rank: Rank, root: Rank) -> Result<&'b mut dyn Tensor> {
        match self {
            BroadcastBuffer::Recv(t) => Ok(t),
            BroadcastBuffer::Send(_) => Err(Error::BroadcastNotRoot { rank, root }),
        }
    }
}

impl fmt::Debug for BroadcastBuffer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (form, t) = match self {
            BroadcastBuffer::Send(t) => ("Send", *t),
            BroadcastBuffer::Recv(t) => ("Recv", &**t),
        };
        f.debug_struct(form)
            .field("dtype", &t.dtype().to_string())
            .field("shape", &t.shape())
            .finish()
    }
}
