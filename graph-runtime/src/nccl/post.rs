//! [`Post`]: one rank's entry in a stage's header agreement, the unit that the ranks of a
//! process read in shared memory (`agree.rs`) and that the leaders exchange between
//! processes (`across.rs`). Both depend on this file; it depends on neither.

use crate::comm::{Call, Header, SlotDesc, Status};

/// A copy of a rank's call and, for an agreement, its header.
#[derive(Default)]
pub(super) struct Post {
    /// The barrier round it is for (`None`: never written).
    pub(super) round: Option<u64>,
    pub(super) call: Option<Call>,
    /// For a launch confirmation: whether the launch went through.
    pub(super) launched: bool,
    pub(super) failed: bool,
    pub(super) slots: Vec<SlotDesc>,
    pub(super) dims: Vec<usize>,
}

impl Post {
    pub(super) fn header(&self) -> Header<'_> {
        Header {
            status: if self.failed {
                Status::Failed
            } else {
                Status::Ok
            },
            slots: &self.slots,
            dims: &self.dims,
            data: &[],
        }
    }
}
