//! What every operation of [`crate::comm`] shares, in layers: a file uses only
//! files of its own layer or lower ones (no file here names an operation of `ops`).
//!
//! 1. [`progress`] (the queues of pending agreements and the progress every blocking path
//!    polls), [`ledger`] (what each rank knows of a communicator's collectives),
//!    [`diagnosis`] (the words of a failed agreement), and the leaves: [`signature`], [`checks`], [`packing`], [`blocks`], [`bcast`], [`snapshot`],
//!    [`halfops`];
//! 2. [`agree`] (the agreement before a collective), [`call`] (one MPI collective call and
//!    the prepared data operation, [`call::Batch`] for several), [`stager`] (the sealed
//!    [`stager::Endpoint`] and the unsafe staging seam), [`operands`] (facts → encoding →
//!    side, and the collectives' common prologue), [`held`] (matched messages);
//! 3. [`mode`] (how a collective runs: the [`mode::Mode`] trait, blocking);
//! 4. [`pending`] (one nonblocking collective's driver: returns its state);
//! 5. [`request`] (`TensorRequest` over that state or a point-to-point request, and the
//!    nonblocking mode), [`plan`] (`Plan`: a batch agreed once, run step after step),
//!    [`exchange`] (`Exchange`: point-to-point messages matched once, run step after step).

pub(crate) mod agree;
pub(crate) mod bcast;
pub(crate) mod blocks;
pub(crate) mod call;
pub(crate) mod checks;
pub(crate) mod diagnosis;
pub(crate) mod exchange;
pub mod halfops;
pub(crate) mod held;
pub(crate) mod ledger;
pub(crate) mod mode;
pub(crate) mod operands;
pub(crate) mod packing;
pub(crate) mod pending;
pub(crate) mod plan;
pub(crate) mod progress;
pub(crate) mod request;
pub(crate) mod signature;
pub(crate) mod snapshot;
pub(crate) mod stager;

// rsmpi's request type and scopes, named once for the nonblocking driver.
pub(crate) use mpi::request::{Request, Scope};
