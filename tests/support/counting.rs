//! A backend around the CPU one whose communicators count their `stage` calls and the
//! dtype regions each gets (one call per fused stage, whatever the bucket mixes), record
//! the thread each rank attached on, and can fail one rank's attach.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use actorgraph::comm::{AbortHandle, Collective, CpuComm, Header, RegionMut, StageError};
use actorgraph::prelude::*;
use actorgraph::{Backend, Communicator};

/// What the communicators of one [`Counting`] backend saw, over all ranks.
#[derive(Default)]
pub struct Counts {
    /// `stage` calls.
    pub stages: AtomicUsize,
    /// The regions handed to those calls.
    pub regions: AtomicUsize,
    /// Each rank that attached, with the thread it attached on.
    pub attached: Mutex<Vec<(usize, ThreadId)>>,
}

/// CPU communicators that count into `counts`; rank `fail_attach`, if any, cannot attach.
#[derive(Default)]
pub struct Counting {
    pub counts: Arc<Counts>,
    pub fail_attach: Option<usize>,
}

/// One rank of a [`Counting`] backend.
pub struct CountingComm {
    inner: CpuComm,
    counts: Arc<Counts>,
    fail_attach: bool,
}

impl Communicator for CountingComm {
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
        self.counts.stages.fetch_add(1, SeqCst);
        self.counts.regions.fetch_add(regions.len(), SeqCst);
        self.inner.stage(header, collective, regions, outputs)
    }
    fn abort_handle(&self) -> AbortHandle {
        self.inner.abort_handle()
    }
    fn attach(&mut self) -> Result<(), Error> {
        if self.fail_attach {
            return Err(Error::Backend(format!(
                "rank {} has no device",
                self.rank()
            )));
        }
        let me = (self.rank(), std::thread::current().id());
        self.counts.attached.lock().unwrap().push(me);
        Ok(())
    }
}

impl Backend for Counting {
    type Comm = CountingComm;
    fn communicators(&self, size: usize) -> Result<Vec<CountingComm>, Error> {
        Ok(Cpu
            .communicators(size)?
            .into_iter()
            .enumerate()
            .map(|(rank, inner)| CountingComm {
                inner,
                counts: Arc::clone(&self.counts),
                fail_attach: self.fail_attach == Some(rank),
            })
            .collect())
    }
}
