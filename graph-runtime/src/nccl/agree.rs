//! The header agreement of the NCCL backend's stages, on the host.
//!
//! A group's ranks are threads of one process, so they agree the way the CPU communicator
//! does: each posts where its header is, one barrier, every rank runs [`agree`] over every
//! header and reaches the same verdict, a second barrier (a header lives in its rank's
//! fused stage, which may be rewritten once the rank returns). Nothing of it touches the
//! GPU: a stage neither waits for its stream nor adds a collective, so the payload queues
//! behind the methods' kernels at once.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::comm::{agree, Collective, Header, SlotDesc, StageError, Status};
use crate::sync::Barrier;

/// Where each rank's header is during a stage's agreement.
pub(super) struct Board {
    barrier: Barrier,
    posts: Box<[Padded<Post>]>,
}

#[repr(align(128))]
struct Padded<T>(T);

/// A rank's header, by address: written with relaxed stores before the first barrier,
/// which orders them (and the slots they point to) before every peer's reads.
#[derive(Default)]
struct Post {
    failed: AtomicUsize,
    slots: AtomicUsize,
    nslots: AtomicUsize,
}

impl Post {
    /// # Safety
    /// Between the first and the second barrier of a stage that posted it.
    unsafe fn header(&self) -> Header<'_> {
        let len = self.nslots.load(Relaxed);
        let slots = if len == 0 {
            &[]
        } else {
            // SAFETY: the poster's `len` slots, alive until it passes the second barrier,
            // which it does only after every rank is done here.
            unsafe { std::slice::from_raw_parts(self.slots.load(Relaxed) as *const SlotDesc, len) }
        };
        Header {
            status: if self.failed.load(Relaxed) != 0 {
                Status::Failed
            } else {
                Status::Ok
            },
            slots,
            data: &[],
        }
    }
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board")
            .field("ranks", &self.posts.len())
            .finish()
    }
}

impl Board {
    pub(super) fn new(size: usize) -> Self {
        Self {
            barrier: Barrier::new(size),
            posts: (0..size).map(|_| Padded(Post::default())).collect(),
        }
    }

    /// Fails every current and future agreement: a rank that will never come.
    pub(super) fn abort(&self) {
        self.barrier.abort();
    }

    /// Rank `rank`'s part in the agreement on `header`: `Ok` when every rank's header
    /// agrees, else the verdict that every rank reaches; [`StageError::Aborted`] if the
    /// group is aborted meanwhile.
    pub(super) fn agree(
        &self,
        rank: usize,
        header: &Header<'_>,
        collective: Collective,
    ) -> Result<(), StageError> {
        let size = self.posts.len();
        let mine = &self.posts[rank].0;
        mine.failed
            .store(usize::from(header.status == Status::Failed), Relaxed);
        mine.slots.store(header.slots.as_ptr() as usize, Relaxed);
        mine.nslots.store(header.slots.len(), Relaxed);
        self.wait()?;
        // SAFETY: every rank posted before the barrier we just passed, and keeps its slots
        // until it passes the next one.
        let verdict = agree(size, collective, |q| unsafe { self.posts[q].0.header() });
        self.wait()?;
        verdict.map_err(StageError::Disagreed)
    }

    fn wait(&self) -> Result<(), StageError> {
        self.barrier.wait().map_err(|_| StageError::Aborted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Disagreement;
    use crate::{DType, ReduceOp};
    use std::sync::Arc;

    const SUM: Collective = Collective::AllReduce(ReduceOp::Sum);

    /// Every rank's verdict when rank q posts `layouts[q]` (failed when `None`).
    fn verdicts(
        layouts: Vec<Option<Vec<SlotDesc>>>,
        collective: Collective,
    ) -> Vec<Result<(), StageError>> {
        let board = Arc::new(Board::new(layouts.len()));
        let threads: Vec<_> = layouts
            .into_iter()
            .enumerate()
            .map(|(rank, layout)| {
                let board = Arc::clone(&board);
                std::thread::spawn(move || {
                    let (status, slots) = match &layout {
                        Some(s) => (Status::Ok, &s[..]),
                        None => (Status::Failed, &[][..]),
                    };
                    let header = Header {
                        status,
                        slots,
                        data: &[],
                    };
                    board.agree(rank, &header, collective)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn every_rank_reaches_the_verdict_of_agree() {
        let a = vec![SlotDesc::flat(DType::F32, 10), SlotDesc::flat(DType::U8, 3)];
        let mut b = a.clone();
        b[1] = SlotDesc::flat(DType::U8, 4);
        for v in verdicts(vec![Some(a.clone()), Some(a.clone()), Some(a.clone())], SUM) {
            assert!(v.is_ok(), "{v:?}");
        }
        for v in verdicts(vec![Some(a.clone()), Some(b), Some(a.clone())], SUM) {
            match v {
                Err(StageError::Disagreed(Disagreement::Slot { slot, counts })) => {
                    assert_eq!(slot, 1);
                    assert_eq!(counts, vec![(DType::U8, 3), (DType::U8, 4), (DType::U8, 3)]);
                }
                other => panic!("expected a slot disagreement, got {other:?}"),
            }
        }
        for v in verdicts(vec![Some(a.clone()), None], SUM) {
            assert!(matches!(
                v,
                Err(StageError::Disagreed(Disagreement::Failed { rank: 1 }))
            ));
        }
    }

    #[test]
    fn an_aborted_board_fails_waiting_and_later_agreements() {
        let board = Arc::new(Board::new(2));
        let waiting = {
            let board = Arc::clone(&board);
            std::thread::spawn(move || {
                let header = Header {
                    status: Status::Ok,
                    slots: &[],
                    data: &[],
                };
                board.agree(0, &header, SUM)
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        board.abort();
        assert!(matches!(waiting.join().unwrap(), Err(StageError::Aborted)));
        let header = Header {
            status: Status::Ok,
            slots: &[],
            data: &[],
        };
        assert!(matches!(
            board.agree(1, &header, SUM),
            Err(StageError::Aborted)
        ));
    }
}
