//! The sides of an operation as the packing policy ([`super::Packing`]) wants them: the
//! spec (its own run, or one derived datatype over the elements), or a packed copy.

use std::ffi::c_void;

use mpi::datatype::{AsDatatype, Buffer, BufferMut, Collection, DatatypeRef, Pointer, PointerMut};
use mpi::Count;

use super::packing::packs;
use crate::dlpack::Tensor;
use crate::error::Result;
use crate::spec::flat::FlatSpec;
use crate::spec::{RecvSpec, SendSpec};

/// A send buffer chosen by the packing policy; an rsmpi [`Buffer`] either way.
#[derive(Debug)]
pub(crate) enum SendSide<'t> {
    /// The spec as built: the tensor's run, or a derived datatype over its elements.
    Spec(SendSpec<'t>),
    /// A packed copy of the elements in logical order, owned until this value drops.
    Packed(FlatSpec),
}

impl<'t> SendSide<'t> {
    /// `spec` (built from `tensor`), or a packed copy when the policy packs the tensor.
    ///
    /// # Errors
    /// As [`super::packing`]; [`crate::Error::CountTooLarge`] for a packed copy beyond `int`
    /// units.
    pub(crate) fn new(tensor: &dyn Tensor, spec: SendSpec<'t>) -> Result<Self> {
        let elem = spec.element_type().size_bytes();
        if packs(tensor, spec.is_contiguous(), elem)? {
            Ok(SendSide::Packed(FlatSpec::send(tensor, &spec)?.counted()?))
        } else {
            Ok(SendSide::Spec(spec))
        }
    }
}

// SAFETY: delegates to the spec or the flat, which each uphold the contract.
unsafe impl Pointer for SendSide<'_> {
    fn pointer(&self) -> *const c_void {
        match self {
            SendSide::Spec(s) => s.pointer(),
            SendSide::Packed(f) => f.pointer(),
        }
    }
}

// SAFETY: as above.
unsafe impl Collection for SendSide<'_> {
    fn count(&self) -> Count {
        match self {
            SendSide::Spec(s) => s.count(),
            SendSide::Packed(f) => f.count(),
        }
    }
}

// SAFETY: as above.
unsafe impl AsDatatype for SendSide<'_> {
    type Out = DatatypeRef<'static>;
    fn as_datatype(&self) -> Self::Out {
        match self {
            SendSide::Spec(s) => s.as_datatype(),
            SendSide::Packed(f) => f.as_datatype(),
        }
    }
}

// SAFETY: see the impls above.
unsafe impl Buffer for SendSide<'_> {}

/// A receive buffer chosen by the packing policy: the spec, or a packed scratch that the
/// caller unpacks ([`FlatSpec::finish`]) after MPI completes, once it has matched the value
/// (so that the spec's borrow of the tensor has ended).
#[derive(Debug)]
pub(crate) enum RecvSide<'t> {
    /// The spec as built.
    Spec(RecvSpec<'t>),
    /// A scratch buffer in logical order (`FlatSpec::ready` made it).
    Packed(FlatSpec),
}

// SAFETY: delegates to the spec or the flat, which each uphold the contract.
unsafe impl Pointer for RecvSide<'_> {
    fn pointer(&self) -> *const c_void {
        match self {
            RecvSide::Spec(s) => s.pointer(),
            RecvSide::Packed(f) => f.pointer(),
        }
    }
}

// SAFETY: as above (both are writable receive buffers).
unsafe impl PointerMut for RecvSide<'_> {
    fn pointer_mut(&mut self) -> *mut c_void {
        match self {
            RecvSide::Spec(s) => s.pointer_mut(),
            RecvSide::Packed(f) => f.pointer_mut(),
        }
    }
}

// SAFETY: as above.
unsafe impl Collection for RecvSide<'_> {
    fn count(&self) -> Count {
        match self {
            RecvSide::Spec(s) => s.count(),
            RecvSide::Packed(f) => f.count(),
        }
    }
}

// SAFETY: as above.
unsafe impl AsDatatype for RecvSide<'_> {
    type Out = DatatypeRef<'static>;
    fn as_datatype(&self) -> Self::Out {
        match self {
            RecvSide::Spec(s) => s.as_datatype(),
            RecvSide::Packed(f) => f.as_datatype(),
        }
    }
}

// SAFETY: see the impls above.
unsafe impl Buffer for RecvSide<'_> {}
// SAFETY: see the impls above.
unsafe impl BufferMut for RecvSide<'_> {}
