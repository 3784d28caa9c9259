//! The device capability of a communicator, without a GPU backend (feature `nccl` off):
//! there is no device memory, so nothing implements [`DeviceComm`] and
//! [`Communicator::device_comm`](super::Communicator::device_comm) is always `None`.

/// A communicator whose collectives run over a GPU's memory; with feature `nccl` off, no
/// communicator is one.
pub trait DeviceComm {}
