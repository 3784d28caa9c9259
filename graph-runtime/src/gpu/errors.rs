//! How a failed CUDA driver call becomes an [`Error::Gpu`] that names it, including the
//! failures cudarc stores for a later call. Every other file of `gpu` depends on this one;
//! it depends on none of them.

use cudarc::driver::{CudaContext, DriverError};

use crate::Error;

/// [`Error::Gpu`] for `e`, a failure of the driver call `call`.
pub(crate) fn driver_error(call: &'static str, e: DriverError) -> Error {
    // The code's name, and the driver's description of it when it has one.
    let message = match e.error_string() {
        Ok(text) => format!("{:?}: {}", e.0, text.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    };
    Error::Gpu { call, message }
}

/// Maps a CUDA driver error to [`Error::Gpu`] naming the call.
#[inline]
pub(crate) fn gpu(call: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| driver_error(call, e)
}

/// Reads the error cudarc stored in `ctx` (if any): cudarc keeps the error of a driver
/// call it makes where it cannot return one (freeing memory in `Drop`, recording a
/// buffer's use when a borrow of its address ends) and returns it from the next call on
/// that GPU that checks, on any thread, as that call's failure. Read right after such a
/// place, it is reported there, as `what`.
#[inline]
pub(crate) fn take_stored(ctx: &CudaContext, what: &'static str) -> Result<(), Error> {
    ctx.check_err().map_err(|e| driver_error(what, e))
}

/// What [`take_stored`] names an error cudarc stored recording a buffer's use.
pub(crate) const TRACKING: &str =
    "cuEventRecord/cuStreamWaitEvent (cudarc's tracking of a GPU buffer's uses, stored)";
