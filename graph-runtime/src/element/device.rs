//! What an element type needs with a GPU backend (feature `nccl`): every element type can
//! live on a GPU and go through NCCL.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::NcclType;

pub trait OnDevice: DeviceRepr + ValidAsZeroBits + NcclType {}

impl<T: DeviceRepr + ValidAsZeroBits + NcclType> OnDevice for T {}
