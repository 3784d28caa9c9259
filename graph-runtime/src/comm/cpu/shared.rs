//! [`Plan::Shared`](super::plan::Plan::Shared): a large allreduce whose result is written
//! once, into rank 0's regions, and handed to every rank. Each rank reduces its chunk, as
//! in [`chunked`](super::chunked), but writes it into rank 0's regions only; after the
//! stage, the fused stage asks for rank 0's buffers (`shares_results`) and
//! `exchange_results` hands them over through a mailbox at one more barrier, so that every
//! rank's outputs view the same memory, and so the same bits.

use super::chunked::{reduce_chunks, Push};
use super::peer::Round;
use super::post::{Buf, NO_ROUND};
use super::CpuComm;
use crate::comm::{Call, Disagreement, Header, SharedBuffers, StageError};
use crate::{DType, ReduceOp};

/// Runs [`Plan::Shared`](super::plan::Plan::Shared) with `op`.
///
/// # Safety
/// As for [`chunked::run`](super::chunked::run).
#[inline]
pub(super) unsafe fn run(
    round: &Round<'_>,
    header: &Header<'_>,
    bufs: &[Buf; DType::COUNT],
    op: ReduceOp,
) {
    // SAFETY: forwarded to the caller; every rank writes its own chunk into rank 0's
    // regions, and nowhere else.
    unsafe { reduce_chunks(round, header, bufs, op, 0, Push::None) };
}

/// Per rank, the result buffers rank 0 hands it after a stage that shares results, with
/// the round of the exchange. Each rank takes its own entry, so the box is empty again
/// without another barrier.
pub(super) struct Mailbox(std::sync::Mutex<Vec<(u64, SharedBuffers)>>);

impl Mailbox {
    /// An empty mailbox for `size` ranks.
    pub(super) fn new(size: usize) -> Self {
        Self(std::sync::Mutex::new(
            (0..size).map(|_| (NO_ROUND, Default::default())).collect(),
        ))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, SharedBuffers)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `rank`'s entry, leaving it empty.
    pub(super) fn take(&self, rank: usize) -> (u64, SharedBuffers) {
        std::mem::replace(&mut self.lock()[rank], (NO_ROUND, SharedBuffers::default()))
    }

    /// Empties `rank`'s entry: results left for it that it will never take.
    pub(super) fn clear(&self, rank: usize) {
        self.lock()[rank] = (NO_ROUND, SharedBuffers::default());
    }
}

impl CpuComm {
    /// `exchange_results`: rank 0 lends `buffers` to every other rank, which receive them
    /// in `buffers`.
    pub(super) fn hand_over(&mut self, buffers: &mut SharedBuffers) -> Result<(), StageError> {
        self.check_unbroken()?;
        // The round that `open_round` is about to open: rank 0 fills every entry for it
        // before it posts, and each rank empties its own after the round's barrier, before
        // the stage that could fill it again (one barrier later at least).
        let round = self.group.barrier.generation(self.rank);
        if self.rank == 0 {
            let mut boxes = self.group.mailbox.lock();
            for entry in boxes.iter_mut().skip(1) {
                *entry = (round, buffers.clone());
            }
        }
        let opened = self
            .open_round(Call::ExchangeResults, false, |_| {})
            .map(drop);
        let (entry_round, mine) = self.group.mailbox.take(self.rank);
        opened?;
        if self.rank != 0 {
            if entry_round != round {
                return Err(StageError::Disagreed(Disagreement::Buffers {
                    reason: "rank 0 handed no results for this round".into(),
                }));
            }
            *buffers = mine;
        }
        Ok(())
    }
}
