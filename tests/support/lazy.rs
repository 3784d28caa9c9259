//! A backend around the CPU one whose stages go on after `start_stage` returns, as the MPI
//! backend's do: `start_stage` keeps the inputs for itself and leaves zeros in the regions,
//! and the collective runs only in `complete_stage`. A step that read a result before its
//! completion would see those zeros. Every call is written to a log, beside the methods'
//! own entries, to show what ran while a stage was in flight. (Its collective waits for
//! every rank's completion, which `Communicator::start_stage` does not allow: enough for
//! graphs of one group, where every rank completes at the same place.)

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use actorgraph::comm::{
    AbortHandle, Collective, CpuComm, Header, Progress, RegionMut, SlotData, SlotDesc, StageError,
    Status,
};
use actorgraph::prelude::*;
use actorgraph::{Backend, Communicator};

/// What happened, in order, over every rank: `"<rank> <what>"`.
pub type Log = Arc<Mutex<Vec<String>>>;

/// Writes `what` to `log` as rank `rank`'s.
pub fn note(log: &Log, rank: usize, what: impl std::fmt::Display) {
    log.lock().unwrap().push(format!("{rank} {what}"));
}

/// CPU communicators whose stages complete late; they log into `log`.
#[derive(Default, Clone)]
pub struct Lazy {
    pub log: Log,
}

/// One rank of a [`Lazy`] backend.
pub struct LazyComm {
    inner: CpuComm,
    log: Log,
    /// The stages started and not yet completed, oldest first.
    in_flight: VecDeque<Kept>,
}

/// What a stage in flight keeps: its header and its inputs.
struct Kept {
    status: Status,
    slots: Vec<SlotDesc>,
    dims: Vec<usize>,
    collective: Collective,
    inputs: Vec<Box<dyn Any + Send>>,
}

/// Runs `$body` with `$s` bound to the slice of whichever element type the region has.
macro_rules! with_slice {
    ($region:expr, $s:ident => $body:expr) => {
        match $region {
            RegionMut::F16($s) => $body,
            RegionMut::BF16($s) => $body,
            RegionMut::F32($s) => $body,
            RegionMut::F64($s) => $body,
            RegionMut::I8($s) => $body,
            RegionMut::U8($s) => $body,
            RegionMut::I32($s) => $body,
            RegionMut::U32($s) => $body,
            RegionMut::I64($s) => $body,
            RegionMut::U64($s) => $body,
            _ => unreachable!("a dtype this test does not know"),
        }
    };
}

/// A copy of `region`, which is then zeroed.
fn take(region: &mut RegionMut<'_>) -> Box<dyn Any + Send> {
    with_slice!(region, s => {
        let kept = s.to_vec();
        s.fill(Default::default());
        Box::new(kept)
    })
}

/// Puts a copy `take` made back into `region`.
fn put(region: &mut RegionMut<'_>, kept: &dyn Any) {
    with_slice!(region, s => s.copy_from_slice(kept.downcast_ref::<Vec<_>>().unwrap()))
}

impl Communicator for LazyComm {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        note(&self.log, self.rank(), "stage");
        self.inner.stage(header, collective, regions, outputs)
    }
    fn start_stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<Progress, StageError> {
        note(&self.log, self.rank(), "start");
        // Nothing is lent: this communicator reads packed regions only.
        assert!(header.data.iter().all(SlotData::is_packed));
        outputs.iter_mut().for_each(|o| drop(take(o)));
        self.in_flight.push_back(Kept {
            status: header.status,
            slots: header.slots.to_vec(),
            dims: header.dims.to_vec(),
            collective,
            inputs: regions.iter_mut().map(take).collect(),
        });
        Ok(Progress::InFlight)
    }
    fn complete_stage(
        &mut self,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        note(&self.log, self.rank(), "complete");
        let kept = self.in_flight.pop_front().expect("a stage in flight");
        assert_eq!(kept.collective, collective);
        for (region, input) in regions.iter_mut().zip(&kept.inputs) {
            put(region, input.as_ref());
        }
        let data: Vec<SlotData<'_>> = kept
            .slots
            .iter()
            .map(|s| SlotData::packed(s.dtype, s.len))
            .collect();
        let header = Header {
            status: kept.status,
            slots: &kept.slots,
            dims: &kept.dims,
            data: match kept.status {
                Status::Ok => &data,
                Status::Failed => &[],
            },
        };
        self.inner.stage(&header, collective, regions, outputs)
    }
    fn abort_handle(&self) -> AbortHandle {
        self.inner.abort_handle()
    }
}

impl Backend for Lazy {
    type Comm = LazyComm;
    fn communicators(&self, size: usize) -> Result<Vec<LazyComm>, Error> {
        Ok(Cpu
            .communicators(size)?
            .into_iter()
            .map(|inner| LazyComm {
                inner,
                log: Arc::clone(&self.log),
                in_flight: VecDeque::new(),
            })
            .collect())
    }
}
