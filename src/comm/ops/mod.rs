//! Each operation of [`crate::comm`] written once, over the shared engine
//! ([`super::engine`]), generic over the mode ([`super::engine::mode::Mode`]: blocking or
//! nonblocking) and the endpoint ([`super::engine::stager::Endpoint`]: a communicator and
//! its stager). Nothing here names the public trait: its methods (one layer up, in
//! [`crate::comm`]) call these.

pub(crate) mod collective;
pub(in crate::comm) mod exchange;
pub(crate) mod fused;
pub(crate) mod gathered;
pub(crate) mod p2p;
pub(crate) mod reduce;
pub(crate) mod window;
