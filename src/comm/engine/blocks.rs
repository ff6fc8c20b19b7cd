//! The per-rank blocks of a v-collective's tensor ([`Blocks`]): one type for the
//! `(counts, displacements)` pair that gatherv, scatterv, all-gatherv and all-to-allv take.

/// One block per rank of a communicator, inside one tensor: rank `i`'s block is the
/// `counts[i]` elements from element `displacements[i]` (both in DLPack elements, logical
/// row-major order), MPI's `recvcounts`/`displs` (MPI-4.1 §6.5) in elements rather than
/// datatype units.
///
/// The operations check each list has one entry per rank ([`crate::Error::LengthMismatch`]),
/// that every block lies inside the tensor ([`crate::Error::OutOfBounds`]), that the blocks
/// MPI writes do not overlap ([`crate::Error::BlocksOverlap`]) and that this rank's own
/// block is its count ([`crate::Error::CountMismatch`]), all before any MPI call.
///
/// ```
/// use dlpack_mpi::comm::Blocks;
/// // three ranks: 1, 2 and 3 elements, packed one after the other
/// let (counts, displacements) = ([1, 2, 3], [0, 1, 3]);
/// let blocks = Blocks::new(&counts, &displacements);
/// assert_eq!(blocks.counts, &[1, 2, 3]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocks<'a> {
    /// Elements of each rank's block, one entry per rank.
    pub counts: &'a [i64],
    /// First element of each rank's block, one entry per rank.
    pub displacements: &'a [i64],
}

impl<'a> Blocks<'a> {
    /// Rank `i`'s block is `counts[i]` elements from element `displacements[i]`.
    pub fn new(counts: &'a [i64], displacements: &'a [i64]) -> Self {
        Blocks {
            counts,
            displacements,
        }
    }
}
