//! The packing policy: whether [`super::TensorComm`]'s point-to-point and broadcast
//! operations hand MPI a strided tensor as one derived datatype (zero-copy) or as a packed
//! copy. Process-wide, set by [`set_packing`] or the `DLPACK_MPI_PACKING` environment
//! variable; only `comm` consults it.

use crate::error::{Error, Result};

/// How strided (non-contiguous) tensors reach MPI in [`super::TensorComm`]'s
/// point-to-point and broadcast operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Packing {
    /// Zero-copy: one derived datatype describes the elements in place (the default).
    #[default]
    DerivedDatatype,
    /// Pack into a contiguous scratch buffer before sending and unpack after a receive
    /// completes: for MPI stacks where derived datatypes are slow (some GPU paths).
    Copy,
}

static PACKING: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(u8::MAX);

/// The environment variable that sets the packing policy when [`set_packing`] was not called.
pub const PACKING_ENV: &str = "DLPACK_MPI_PACKING";

/// Reads a `DLPACK_MPI_PACKING` value: `copy` → [`Packing::Copy`], `derived` →
/// [`Packing::DerivedDatatype`], unset or empty → `None`.
///
/// # Errors
/// [`Error::InvalidSetting`] naming any other value (a typo is not read as the default, as
/// `DLPACK_MPI_CUDA_AWARE` is not).
pub fn parse_packing(value: Option<&str>) -> Result<Option<Packing>> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) if v.eq_ignore_ascii_case("copy") => Ok(Some(Packing::Copy)),
        Some(v) if v.eq_ignore_ascii_case("derived") => Ok(Some(Packing::DerivedDatatype)),
        Some(v) => Err(Error::InvalidSetting {
            name: PACKING_ENV,
            value: v.to_string(),
            expected: "copy or derived",
        }),
    }
}

/// The process-wide packing policy: [`set_packing`], else `DLPACK_MPI_PACKING=copy|derived`
/// in the environment, else [`Packing::DerivedDatatype`]. Reductions and per-rank blocks of
/// strided tensors always go through packed copies (MPI's predefined reductions take
/// predefined datatypes only); the nonblocking operations always use the spec as given.
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_PACKING` holds another value (also a value
/// that is not UTF-8); the operations that consult the policy (point-to-point and broadcast
/// of strided tensors) return it before any MPI call.
pub fn packing() -> Result<Packing> {
    use std::sync::atomic::Ordering;
    match PACKING.load(Ordering::Relaxed) {
        0 => Ok(Packing::DerivedDatatype),
        1 => Ok(Packing::Copy),
        _ => {
            let value = std::env::var_os(PACKING_ENV).map(|v| v.to_string_lossy().into_owned());
            let from_env = parse_packing(value.as_deref())?.unwrap_or_default();
            set_packing(from_env);
            Ok(from_env)
        }
    }
}

/// Sets the process-wide packing policy (see [`packing`]). Every rank of a job may choose
/// independently: both forms put the same bytes on the wire.
pub fn set_packing(policy: Packing) {
    let v = match policy {
        Packing::DerivedDatatype => 0,
        Packing::Copy => 1,
    };
    PACKING.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the [`Packing::Copy`] policy applies to a side that is not one run.
///
/// # Errors
/// As [`packing`].
pub(super) fn copy_packing(contiguous: bool) -> Result<bool> {
    Ok(!contiguous && packing()? == Packing::Copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_values() {
        assert_eq!(parse_packing(None).unwrap(), None);
        assert_eq!(parse_packing(Some(" ")).unwrap(), None);
        assert_eq!(parse_packing(Some("copy")).unwrap(), Some(Packing::Copy));
        assert_eq!(
            parse_packing(Some("Derived")).unwrap(),
            Some(Packing::DerivedDatatype)
        );
        match parse_packing(Some("cpoy")) {
            Err(Error::InvalidSetting { name, value, .. }) => {
                assert_eq!((name, value.as_str()), (PACKING_ENV, "cpoy"));
            }
            other => panic!("expected InvalidSetting, got {other:?}"),
        }
    }
}
