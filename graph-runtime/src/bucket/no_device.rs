//! A fused stage's device mode without a GPU backend (feature `nccl` off): [`Device`] has
//! no values, so `FusedStage::device` is always `None` and every device branch of the
//! stage folds away.

use super::region::SlotIdx;
use super::{Bucketable, FusedStage};
use crate::comm::{Collective, Communicator};
use crate::Error;

/// A GPU a stage could run on: none.
#[derive(Clone, Copy, Debug)]
pub(super) enum Device {}

/// Whether a value lives on a GPU: never.
pub(super) fn on_device<T: Bucketable>(_: &T) -> bool {
    false
}

/// The GPU that a communicator's collectives run on: none.
pub(super) fn device_of<C: Communicator>(_: &mut C) -> Option<Device> {
    None
}

impl FusedStage {
    pub(super) fn prepare_device(&mut self, device: Device) {
        match device {}
    }

    pub(super) fn pack_device<T: Bucketable>(&mut self, _: &T, _: SlotIdx) {
        if let Some(device) = self.device {
            match device {}
        }
    }

    pub(super) fn pack_device_slice<E: crate::Element>(&mut self, _: &[E], _: SlotIdx) {
        if let Some(device) = self.device {
            match device {}
        }
    }

    pub(super) fn run_device<C: Communicator>(
        &mut self,
        _: &mut C,
        _: Collective,
        _: &'static str,
    ) -> Result<(), Error> {
        match self.device {
            Some(device) => match device {},
            None => Err(Error::Backend(
                "internal error: a host stage ran in device mode".into(),
            )),
        }
    }
}
