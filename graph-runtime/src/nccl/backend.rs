//! `Nccl`, the backend: which GPU each rank of a group runs on.

use super::calls::nccl_err;
use super::NcclComm;
use crate::comm::Backend;
use crate::gpu::{device_count, require_cuda, require_nccl};
use crate::Error;
use cudarc::nccl::result as nccl;

/// The NCCL backend: actor `r` of a group runs on GPU `devices[r]`, and the group's fused
/// stages run as NCCL collectives on the actors' GPUs.
///
/// Each actor thread binds its GPU's context and creates its own stream and NCCL
/// communicator when the group is launched. GPU tensors in a bucket are copied into the
/// stage's flat device buffer and their results are views of it; host values (a scalar
/// loss, a `Vec`, a host tensor) are copied to the GPU and back.
///
/// ```no_run
/// # fn main() -> Result<(), actorgraph::Error> {
/// use actorgraph::nccl::Nccl;
/// let backend = Nccl::all()?; // one actor per visible GPU
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Nccl {
    devices: Vec<usize>,
}

impl Nccl {
    /// A backend that puts actor `r` of a group on GPU `devices[r]`.
    ///
    /// The first call sets `NCCL_RUNTIME_CONNECT=0` unless it is set: NCCL then connects
    /// a communicator's peers when it is created, not inside the first collective that
    /// needs them, where a rank would wait for a failed peer beyond any abort (see the
    /// NCCL page of the reference).
    ///
    /// An error, before anything is opened, if libcuda or libnccl cannot be loaded
    /// ([`Error::LibraryMissing`]), if a GPU does not exist ([`Error::NoSuchDevice`]), if
    /// there is none, or if one appears twice (NCCL cannot hold one GPU twice in a
    /// communicator).
    pub fn new(devices: impl IntoIterator<Item = usize>) -> Result<Self, Error> {
        require_cuda()?;
        require_nccl()?;
        connect_at_init();
        // `ncclAvg` and bf16 came with NCCL 2.10.
        let version = super::nccl_version()?;
        if version < (2, 10, 0) {
            return Err(Error::Backend(format!(
                "NCCL {}.{}.{} is too old: the Nccl backend needs NCCL 2.10 or newer",
                version.0, version.1, version.2
            )));
        }
        let devices: Vec<usize> = devices.into_iter().collect();
        if devices.is_empty() {
            return Err(Error::Backend(
                "the Nccl backend needs at least one GPU".into(),
            ));
        }
        let count = device_count()?;
        for (i, &ordinal) in devices.iter().enumerate() {
            if ordinal >= count {
                return Err(Error::NoSuchDevice { ordinal, count });
            }
            if devices[..i].contains(&ordinal) {
                return Err(Error::Backend(format!(
                    "GPU {ordinal} is given twice: NCCL cannot hold one GPU twice in a \
                     communicator (put one actor per GPU)"
                )));
            }
        }
        Ok(Self { devices })
    }

    /// A backend over every GPU the driver sees, in order.
    pub fn all() -> Result<Self, Error> {
        Self::new(0..device_count()?)
    }

    /// The GPU of each rank.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }
}

/// The variable that says when NCCL connects a communicator's peers: `0` at init, `1`
/// inside the first collective that needs them (NCCL's default since 2.22).
const RUNTIME_CONNECT: &str = "NCCL_RUNTIME_CONNECT";

/// Makes NCCL connect peers when a communicator is created, unless the user chose
/// otherwise (`NCCL_RUNTIME_CONNECT` set): with lazy connection, a rank's first
/// collective that needs a connection waits inside the NCCL call (on the host) until
/// every peer makes it too, so a peer that fails between the agreement and its launch
/// leaves it there, where no abort reaches. At init, every rank is known to be there.
///
/// Called before this process's first `ncclGetUniqueId` (every communicator is made
/// after a `Nccl::new`), which is when NCCL starts reading its environment.
fn connect_at_init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Some(value) = runtime_connect(std::env::var_os(RUNTIME_CONNECT).is_some()) {
            // Before NCCL's first call that reads the environment; CUDA reads none of
            // this. Other threads of the program that call `getenv` meanwhile are the
            // usual hazard of `setenv`, which no API avoids: NCCL takes its settings
            // from the environment only.
            std::env::set_var(RUNTIME_CONNECT, value);
        }
    });
}

/// The value to give `NCCL_RUNTIME_CONNECT`: `0` (connect at init), unless the user set
/// it.
fn runtime_connect(user_set: bool) -> Option<&'static str> {
    (!user_set).then_some("0")
}

impl Backend for Nccl {
    type Comm = NcclComm;

    fn communicators(&self, size: usize) -> Result<Vec<NcclComm>, Error> {
        if size != self.devices.len() {
            return Err(Error::Backend(format!(
                "the Nccl backend has {} GPU(s) for a group of {size} actors: give it one GPU \
                 per actor",
                self.devices.len()
            )));
        }
        let id = nccl::get_uniqueid().map_err(nccl_err("ncclGetUniqueId"))?;
        Ok(NcclComm::group(&self.devices, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_connect_at_init_unless_the_user_chose() {
        assert_eq!(runtime_connect(false), Some("0"));
        assert_eq!(runtime_connect(true), None);
    }
}
