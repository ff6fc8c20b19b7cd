//! The crate's one `MPI_Finalize` hook and the registries it empties.
//!
//! Some state of the crate holds MPI resources or memory an MPI library may have registered,
//! and must be let go while MPI still works: the derived-datatype cache (`spec::datatype`,
//! committed types that would outlive MPI), the scratch pool of packed copies
//! (`spec::scratch`) and the messages held by [`Error::Unfit`](crate::Error::Unfit) errors
//! (`comm::engine::held`, whose senders must not stay blocked). Each is a [`Registry`]: a static that
//! holds the function that empties the state, and that *enlists itself* on each use
//! that may fill it ([`Registry::enlist`]). This module knows none of them.
//!
//! **The hook.** The first enlistment made while MPI is initialized (and not finalized)
//! sets an attribute on `MPI_COMM_SELF` whose delete callback empties every enlisted
//! registry, once, in the order they enlisted (`MPI_Finalize` deletes the attributes of
//! `MPI_COMM_SELF` first, while MPI still works: MPI-4.1 §9.5.1). The registries are
//! independent of each other, so the order does not matter. An enlistment before
//! `MPI_Init` only enlists; the next one after it hooks. If the attribute cannot be set, the
//! state stays until the process exits, as it would without the hook.
//!
//! This module uses nothing of the crate; its one foreign call is the C shim's
//! `dlpack_mpi_on_finalize` (`MPI_Comm_create_keyval` and `MPI_Comm_set_attr`).

use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard, Once};

extern "C" {
    fn dlpack_mpi_on_finalize(hook: extern "C" fn()) -> c_int;
}

/// Process-wide state that `MPI_Finalize` empties (see the module docs).
pub(crate) struct Registry {
    /// Empties it; runs inside `MPI_Finalize`, on the thread that finalizes, while MPI works.
    release: fn(),
    /// Set when it is on the list.
    enlisted: Once,
}

impl Registry {
    /// A registry emptied by `release`.
    pub(crate) const fn new(release: fn()) -> Registry {
        Registry {
            release,
            enlisted: Once::new(),
        }
    }

    /// Puts this registry on the list `MPI_Finalize` empties (the first time), and hooks
    /// `MPI_Finalize` when MPI is initialized and no hook is set yet. Cheap after the first
    /// call made under MPI (two atomic loads): call it on each use that may fill the
    /// registry, on a thread that may call MPI.
    pub(crate) fn enlist(&'static self) {
        self.enlisted.call_once(|| registries().push(self));
        hook();
    }
}

/// The enlisted registries, in the order they enlisted.
fn registries() -> MutexGuard<'static, Vec<&'static Registry>> {
    static LIST: Mutex<Vec<&'static Registry>> = Mutex::new(Vec::new());
    LIST.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Sets the hook once, when MPI is initialized and not finalized (else nothing: a later
/// enlistment sets it).
fn hook() {
    static HOOKED: Once = Once::new();
    if HOOKED.is_completed()
        || !mpi::environment::is_initialized()
        || mpi::environment::is_finalized()
    {
        return;
    }
    HOOKED.call_once(|| {
        // SAFETY: MPI is initialized; the hook is a plain function that lives forever.
        // Failure only means the registries stay until the process exits.
        let _ = unsafe { dlpack_mpi_on_finalize(at_finalize) };
    });
}

/// The delete callback of the `MPI_COMM_SELF` attribute: empties every enlisted registry.
extern "C" fn at_finalize() {
    // The list is copied so that no lock is held while a registry is emptied.
    let list = registries().clone();
    release(&list);
}

/// Empties each registry of `list`, in order.
fn release(list: &[&'static Registry]) {
    for registry in list {
        (registry.release)();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RELEASED: AtomicUsize = AtomicUsize::new(0);

    fn count_release() {
        RELEASED.fetch_add(1, Ordering::SeqCst);
    }

    static TEST_REGISTRY: Registry = Registry::new(count_release);

    #[test]
    #[cfg_attr(miri, ignore = "enlist asks MPI whether it is initialized (a C call)")]
    fn registries_enlist_once_and_are_released_in_order() {
        TEST_REGISTRY.enlist();
        TEST_REGISTRY.enlist();
        let times = registries()
            .iter()
            .filter(|&&r| std::ptr::eq(r, &TEST_REGISTRY))
            .count();
        assert_eq!(times, 1);
        // Not the real hook (it would empty the other tests' registries too): its loop.
        release(&[&TEST_REGISTRY, &TEST_REGISTRY]);
        assert_eq!(RELEASED.load(Ordering::SeqCst), 2);
    }
}
