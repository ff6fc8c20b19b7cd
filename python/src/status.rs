//! `dlpack_mpi.Status`: what a receive returns.

use pyo3::prelude::*;

/// What a receive returns: the `source` rank, the `tag`, and `count`, the elements
/// received (always the receive array's: a message of another size raises `Unfit` from
/// `recv`, `CountMismatch` from an `irecv`'s completion).
#[pyclass(module = "dlpack_mpi", frozen, get_all, skip_from_py_object)]
#[derive(Clone, Debug)]
pub struct Status {
    /// The rank the message came from.
    source: i32,
    /// Its tag.
    tag: i32,
    /// Elements received.
    count: i64,
}

impl Status {
    pub(crate) fn of(status: &mpi::point_to_point::Status, count: i64) -> Status {
        Status {
            source: status.source_rank(),
            tag: status.tag(),
            count,
        }
    }
}

#[pymethods]
impl Status {
    fn __repr__(&self) -> String {
        format!(
            "Status(source={}, tag={}, count={})",
            self.source, self.tag, self.count
        )
    }
}
