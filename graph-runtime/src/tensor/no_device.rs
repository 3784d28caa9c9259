//! GPU tensors without a GPU backend (feature `nccl` off): [`Storage::Device`] holds a
//! [`DeviceBuf`], which has no values, so every tensor is on the host and the device arms
//! of `Storage`'s matches fold away.
//!
//! [`Storage::Device`]: super::Storage::Device

use std::convert::Infallible;
use std::marker::PhantomData;

/// What `Storage::Device` holds: nothing can.
#[derive(Debug)]
pub(crate) struct DeviceBuf<E>(Infallible, PhantomData<E>);

/// The number of elements of a device buffer (there is none).
pub(super) fn len<E>(buf: &DeviceBuf<E>) -> usize {
    match buf.0 {}
}
