//! What an operation does with each of its tensors ([`Access`]), and how the tensor's
//! memory reaches MPI ([`Reach`]): the one access contract that `comm` and `transport`
//! both take.

/// What MPI does with a tensor in one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// MPI reads it (a send buffer, the root's buffer of a broadcast).
    Read,
    /// MPI writes every element (a receive buffer of the tensor's exact size).
    Write,
    /// MPI reads and writes it, or writes only some of its elements, so its current values
    /// must survive into what MPI works on: in-place reductions, the receive tensors of the
    /// v-collectives (blocks may leave gaps, and a scatterv's root may send less), windows of
    /// a strided tensor.
    Update,
}

impl Access {
    /// Whether MPI writes the tensor (then it must be writable and free of overlap).
    #[inline]
    pub fn writes(self) -> bool {
        self != Access::Read
    }

    /// Whether the current values must be read before MPI runs (a packed copy starts as
    /// a copy of them; a staged copy is read from the device).
    #[inline]
    pub fn reads(self) -> bool {
        self != Access::Write
    }
}

/// How a tensor's memory reaches MPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Host-readable memory (host, pinned host, a staged copy, managed memory after
    /// synchronization): MPI may take the pointer, and the host may pack or unpack it.
    Host,
    /// A device pointer that only a CUDA-aware MPI may take: it goes to MPI as its own
    /// contiguous run (or large-count run) and nothing on the host reads or writes its
    /// bytes. An encoding that would (a packed copy, a derived datatype over device
    /// memory) is refused with [`crate::Error::UnsupportedDevice`].
    MpiOnly,
}
