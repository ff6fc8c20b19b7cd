//! The nonblocking twins of [`super::TensorComm`]'s collectives, declared by one macro so
//! that each twin's signature, docs and body follow its blocking form the same way.

/// A nonblocking collective of [`TensorComm`], declared beside its blocking form: the
/// blocking method's body run in the nonblocking mode (same arguments, checks, errors, wire
/// format and agreement), inside an rsmpi scope, returning a [`TensorRequest`]. Its docs
/// name the blocking method, the MPI call and its section of MPI-4.1; extra doc lines come
/// first in the invocation.
macro_rules! nonblocking {
    (
        $(#[$extra:meta])*
        $name:ident of $blocking:ident ($mpi:literal, $section:literal)
        ($($params:tt)*) => $body:expr
    ) => {
        #[doc = concat!("Nonblocking [`TensorComm::", stringify!($blocking), "`] (`", $mpi,
            "`, MPI-4.1 §", $section, "); progress as [`TensorComm::immediate_all_reduce_tensor`].")]
        $(#[$extra])*
        ///
        /// # Errors
        #[doc = concat!("As [`TensorComm::", stringify!($blocking), "`]: this rank's own refusal \
            from the post; from [`TensorRequest::wait`], [`Error::PeerRefused`] and \
            [`Error::CollectiveMismatch`].")]
        fn $name<'a, Sc: Scope<'a> + Copy>($($params)*) -> Result<TensorRequest<'a, Sc>> {
            $body
        }
    };
}
