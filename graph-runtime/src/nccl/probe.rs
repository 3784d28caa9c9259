//! Placeholder: being written (probe of libcuda / libnccl).
use crate::Error;

/// The version of the NCCL library this process opens, as (major, minor, patch).
pub fn nccl_version() -> Result<(u32, u32, u32), Error> {
    require_nccl()?;
    Err(Error::Backend("todo".into()))
}

/// The number of GPUs the CUDA driver reports.
pub fn device_count() -> Result<usize, Error> {
    require_cuda()?;
    Err(Error::Backend("todo".into()))
}

pub(crate) fn require_cuda() -> Result<(), Error> {
    Ok(())
}

pub(crate) fn require_nccl() -> Result<(), Error> {
    Ok(())
}
