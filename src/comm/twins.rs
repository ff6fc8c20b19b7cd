//! The nonblocking twins of [`super::TensorComm`]'s collectives, declared by one macro so
//! that each twin's signature, docs and body follow its blocking form the same way; and the
//! earlier names of renamed methods, deprecated, by another.
//!
//! Nonblocking collectives (MPI-4.1 §6.12): each is the blocking method's body run in the
//! nonblocking mode: the same arguments, checks, errors, wire format and agreement, inside
//! an rsmpi scope, returning a [`super::TensorRequest`] that owns the packed copies, the
//! staged copies of a `DeviceComm` and the operation's per-rank arrays until it completes.
//! Posting never waits for the peers (only a rank that refuses its own arguments returns
//! its error once they have posted the same collective); the data operation is posted when
//! the agreement completes, in `test`/`wait` (see
//! [`super::TensorComm::immediate_all_reduce_tensor`]).

/// A nonblocking collective of [`TensorComm`], declared beside its blocking form: the
/// blocking method's body run in the nonblocking mode (same arguments, checks, errors, wire
/// format and agreement), inside an rsmpi scope, returning a [`TensorRequest`]. Its docs
/// name the blocking method, the MPI call and its section of MPI-4.1; extra doc lines come
/// first in the invocation, generic parameters besides the request's `'a` and `Sc` in
/// brackets after the name.
macro_rules! nonblocking {
    (
        $(#[$extra:meta])*
        $name:ident $([$($generics:tt)*])? of $blocking:ident ($mpi:literal, $section:literal)
        ($($params:tt)*) => $body:expr
    ) => {
        #[doc = concat!("Nonblocking [`TensorComm::", stringify!($blocking), "`] (`", $mpi,
            "`, MPI-4.1 §", $section, "); progress as the trait's docs, \"Nonblocking collectives\", say.")]
        $(#[$extra])*
        ///
        /// # Errors
        #[doc = concat!("As [`TensorComm::", stringify!($blocking), "`]: this rank's own refusal \
            from the post; from [`TensorRequest::wait`], [`Error::PeerRefused`] and \
            [`Error::CollectiveMismatch`].")]
        fn $name<'a, $($($generics)*,)? Sc: Scope<'a> + Copy>($($params)*)
            -> Result<TensorRequest<'a, Sc>> {
            $body
        }
    };
}

/// A method's earlier name, deprecated (`$note`) and hidden from the docs, calling the
/// method under its new name; generic parameters in brackets after the old name; one
/// entry per renamed method, each ended by `;`.
macro_rules! renamed {
    ($(
        $old:ident $([$($generics:tt)*])? => $new:ident, $note:literal
        ($($params:tt)*) -> $ret:ty = $body:expr;
    )*) => {$(
        #[doc = concat!("The earlier name of [`TensorComm::", stringify!($new), "`].")]
        ///
        /// # Errors
        #[doc = concat!("As [`TensorComm::", stringify!($new), "`].")]
        #[deprecated(note = $note)]
        #[doc(hidden)]
        fn $old$(<$($generics)*>)?($($params)*) -> $ret {
            $body
        }
    )*};
}
