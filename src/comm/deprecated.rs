//! The settings' earlier paths under `comm` (they moved to [`crate::settings`]), each a
//! deprecated item hidden from the docs. Nothing in the crate uses them.

use crate::error::Result;
use crate::settings;

old_paths! {
    "use dlpack_mpi::settings::Agreement" => type Agreement = settings::Agreement;
    "use dlpack_mpi::settings::AGREEMENT_ENV" => const AGREEMENT_ENV: &str = settings::AGREEMENT_ENV;
    "use dlpack_mpi::settings::agreement" => fn agreement() -> Result<settings::Agreement> = settings::agreement;
    "use dlpack_mpi::settings::parse_agreement" => fn parse_agreement(value: Option<&str>) -> Result<Option<settings::Agreement>> = settings::parse_agreement;
    "use dlpack_mpi::settings::set_agreement" => fn set_agreement(agreement: settings::Agreement) = settings::set_agreement;
    "use dlpack_mpi::settings::Packing" => type Packing = settings::Packing;
    "use dlpack_mpi::settings::PACKING_ENV" => const PACKING_ENV: &str = settings::PACKING_ENV;
    "use dlpack_mpi::settings::PACK_THRESHOLD_ENV" => const PACK_THRESHOLD_ENV: &str = settings::PACK_THRESHOLD_ENV;
    "use dlpack_mpi::settings::DEFAULT_PACK_THRESHOLD_BYTES" => const DEFAULT_PACK_THRESHOLD_BYTES: usize = settings::DEFAULT_PACK_THRESHOLD_BYTES;
    "use dlpack_mpi::settings::MPICH_PACK_THRESHOLD_BYTES" => const MPICH_PACK_THRESHOLD_BYTES: usize = settings::MPICH_PACK_THRESHOLD_BYTES;
    "use dlpack_mpi::settings::packing" => fn packing() -> Result<settings::Packing> = settings::packing;
    "use dlpack_mpi::settings::parse_packing" => fn parse_packing(value: Option<&str>) -> Result<Option<settings::Packing>> = settings::parse_packing;
    "use dlpack_mpi::settings::set_packing" => fn set_packing(policy: settings::Packing) = settings::set_packing;
    "use dlpack_mpi::settings::pack_threshold_bytes" => fn pack_threshold_bytes() -> Result<usize> = settings::pack_threshold_bytes;
    "use dlpack_mpi::settings::parse_pack_threshold" => fn parse_pack_threshold(value: Option<&str>) -> Result<Option<usize>> = settings::parse_pack_threshold;
    "use dlpack_mpi::settings::set_pack_threshold_bytes" => fn set_pack_threshold_bytes(bytes: usize) = settings::set_pack_threshold_bytes;
    "use dlpack_mpi::settings::default_pack_threshold_for" => fn default_pack_threshold_for(library: &str) -> usize = settings::default_pack_threshold_for;
    "use dlpack_mpi::comm::OWN_BUCKET_BYTES" => const ALONE_BYTES: usize = super::OWN_BUCKET_BYTES;
}
