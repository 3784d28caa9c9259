//! The header agreement of the NCCL backend's stages, on the host.
//!
//! A group's ranks are threads of one process, so they agree in shared memory: each copies
//! its call and header into its post, one barrier, and every rank checks that every rank
//! made the same call for that barrier round, then runs [`agree`] over every post and
//! reaches the same verdict. After the launch, one more barrier: every rank says whether
//! its NCCL calls went through. Nothing of it touches the GPU: a stage neither waits for
//! its stream nor adds a collective, so the payload queues behind the methods' kernels at
//! once.
//!
//! Each rank has two posts, for even and odd barrier rounds (the rank's count of its
//! barrier waits, the same on every rank for the waits that pass together): a rank writes
//! a post again for round r + 2 at the earliest, after the barrier of round r + 1, which
//! every peer reaches only once done reading the post of round r. Posts are copies behind
//! read-write locks (so a writer never meets a reader in that scheme, and readers share),
//! and each says which round and which call it is for: a rank whose calls are out of step
//! with its peers' (an agreement paired with a launch confirmation) is found out on every
//! rank, instead of one reading the other's stale post, and a rank that gives up on an
//! abort leaves nothing a peer could read after it is gone.
//!
//! A group whose ranks span processes (the NCCL backend over MPI) adds a step to each
//! round: after the barrier, the process's first rank exchanges every local post with the
//! other processes' (`across.rs`), and after a second barrier every rank decides over
//! every rank's post, in every process alike. Only that rank reads the local posts
//! between the two barriers, so one post per rank would do there. Its MPI wait polls, and
//! an abort (a timeout) ends it: the round then fails with [`StageError::Aborted`].
//!
//! This file depends on `post.rs` (the posts) and `across.rs` (the exchange); `comm.rs`
//! and `mpi.rs` depend on it, and nothing here depends on them.

use std::sync::{PoisonError, RwLock, RwLockReadGuard};

#[cfg(feature = "mpi")]
use super::across::Across;
use super::post::Post;
use crate::comm::{agree, Call, Collective, Disagreement, Header, StageError, Status};
use crate::sync::Barrier;

/// Where the ranks of a group agree on each stage's headers, and confirm its launch.
pub(super) struct Board {
    barrier: Barrier,
    /// Per rank of this process, two posts.
    posts: Box<[[RwLock<Post>; 2]]>,
    /// The rest of the group, in other processes.
    #[cfg(feature = "mpi")]
    across: Option<Across>,
}

fn read(post: &RwLock<Post>) -> RwLockReadGuard<'_, Post> {
    post.read().unwrap_or_else(PoisonError::into_inner)
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
            posts: (0..size).map(|_| Default::default()).collect(),
            #[cfg(feature = "mpi")]
            across: None,
        }
    }

    /// The board of this process's `local` ranks of a group that spans processes.
    #[cfg(feature = "mpi")]
    pub(super) fn across(local: usize, across: Across) -> Self {
        Self {
            across: Some(across),
            ..Self::new(local)
        }
    }

    /// The rest of the group, if it spans processes.
    #[cfg(feature = "mpi")]
    pub(super) fn other_processes(&self) -> Option<&Across> {
        self.across.as_ref()
    }

    /// Whether some of the group's ranks are in other processes.
    pub(super) fn spans_processes(&self) -> bool {
        #[cfg(feature = "mpi")]
        return self.across.is_some();
        #[cfg(not(feature = "mpi"))]
        false
    }

    /// Fails every current and future agreement: a rank that will never come.
    pub(super) fn abort(&self) {
        // The exchange first: the leader's MPI wait gives up before the barrier releases
        // the other ranks, which then find the round aborted either way.
        #[cfg(feature = "mpi")]
        if let Some(across) = &self.across {
            across.abort();
        }
        self.barrier.abort();
    }

    /// Posts rank `rank`'s `call` for the next barrier round (with `fill` writing the rest
    /// of the post), waits at the round's barrier, and hands every rank's post for the
    /// round to `decide`, once every rank made the same call for it. A different call is
    /// [`Disagreement::Calls`], on every rank alike.
    fn round<R>(
        &self,
        rank: usize,
        call: Call,
        fill: impl FnOnce(&mut Post),
        decide: impl FnOnce(&[&Post]) -> Result<R, StageError>,
    ) -> Result<R, StageError> {
        // Our count of arrivals moves only when we arrive: it is the round that the wait
        // below completes, the same on every rank that passes it.
        let round = self.barrier.generation(rank);
        let parity = (round & 1) as usize;
        {
            let mut mine = self.posts[rank][parity]
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            mine.round = Some(round);
            mine.call = Some(call);
            fill(&mut mine);
        }
        self.barrier.wait(rank).map_err(|_| StageError::Aborted)?;
        #[cfg(feature = "mpi")]
        if let Some(across) = &self.across {
            if rank == 0 {
                let local: Vec<_> = self.posts.iter().map(|p| read(&p[parity])).collect();
                if !across.exchange(local.iter().map(|p| &**p)) {
                    // Given up on (the group was aborted): the other ranks find the
                    // barrier aborted.
                    return Err(StageError::Aborted);
                }
            }
            self.barrier.wait(rank).map_err(|_| StageError::Aborted)?;
            let decided = across.decided();
            let posts: Vec<&Post> = decided.posts.iter().collect();
            return Self::decide(round, call, &posts, decide);
        }
        let guards: Vec<_> = self.posts.iter().map(|p| read(&p[parity])).collect();
        let posts: Vec<&Post> = guards.iter().map(|p| &**p).collect();
        Self::decide(round, call, &posts, decide)
    }

    /// Every rank's verdict over the round's posts: `decide`'s, once every rank made the
    /// same call for the round.
    fn decide<R>(
        round: u64,
        call: Call,
        posts: &[&Post],
        decide: impl FnOnce(&[&Post]) -> Result<R, StageError>,
    ) -> Result<R, StageError> {
        let posted = |p: &Post| p.call.filter(|_| p.round == Some(round));
        let any_failed = posts.iter().any(|p| p.failed);
        let pairs = |p: &&Post| posted(p).is_some_and(|c| c.pairs_with(call, any_failed));
        if posts.is_empty() || !posts.iter().all(pairs) {
            let calls = posts.iter().map(|p| posted(p)).collect();
            return Err(StageError::Disagreed(Disagreement::Calls { calls }));
        }
        decide(posts)
    }

    /// Rank `rank`'s part in the agreement on `header` in its next stage: `Ok` when every
    /// rank's header agrees, else the verdict that every rank reaches;
    /// [`StageError::Aborted`], on every rank, if the group is aborted first.
    pub(super) fn agree(
        &self,
        rank: usize,
        header: &Header<'_>,
        collective: Collective,
    ) -> Result<(), StageError> {
        let fill = |mine: &mut Post| {
            mine.failed = header.status == Status::Failed;
            mine.slots.clear();
            mine.slots.extend_from_slice(header.slots);
            mine.dims.clear();
            mine.dims.extend_from_slice(header.dims);
        };
        self.round(rank, Call::Stage(collective), fill, |posts| {
            agree(posts.len(), collective, |q| posts[q].header()).map_err(StageError::Disagreed)
        })
    }

    /// Rank `rank` says whether its launch of the stage it agreed on succeeded (`ok`), and
    /// learns whether every rank's did: [`StageError::Aborted`] if one failed, or if the
    /// group is aborted first.
    pub(super) fn confirm(&self, rank: usize, ok: bool) -> Result<(), StageError> {
        self.round(
            rank,
            Call::Launched,
            |mine| {
                mine.launched = ok;
                mine.failed = false;
            },
            |posts| match posts.iter().all(|p| p.launched) {
                true => Ok(()),
                false => Err(StageError::Aborted),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SlotDesc;
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
                        dims: &[],
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
                Err(StageError::Disagreed(Disagreement::Slot { slot, counts, .. })) => {
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
    fn many_rounds_each_reach_their_own_verdict() {
        // Rank 1 posts a longer value every seventh round, and rank 2's launch fails every
        // eleventh (of those that agree); a post or flag read in the wrong round would give
        // a verdict that does not match the round's.
        let (ranks, rounds) = (3, 300);
        let board = Arc::new(Board::new(ranks));
        let threads: Vec<_> = (0..ranks)
            .map(|rank| {
                let board = Arc::clone(&board);
                std::thread::spawn(move || {
                    (0..rounds)
                        .map(|round| {
                            let len = round % 5 + usize::from(rank == 1 && round % 7 == 0);
                            let slots = vec![SlotDesc::flat(DType::I32, len); round % 3];
                            let header = Header {
                                status: Status::Ok,
                                slots: &slots,
                                dims: &[],
                                data: &[],
                            };
                            let agreed = board.agree(rank, &header, SUM).is_ok();
                            let ok = !(rank == 2 && round % 11 == 0);
                            agreed && board.confirm(rank, ok).is_ok()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let want: Vec<bool> = (0..rounds)
            .map(|r| (r % 7 != 0 || r % 3 == 0) && r % 11 != 0)
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), want);
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
                    dims: &[],
                    data: &[],
                };
                board.agree(0, &header, SUM)
            })
        };
        board.barrier.until_parked(1, 1);
        board.abort();
        assert!(matches!(waiting.join().unwrap(), Err(StageError::Aborted)));
        let header = Header {
            status: Status::Ok,
            slots: &[],
            dims: &[],
            data: &[],
        };
        assert!(matches!(
            board.agree(1, &header, SUM),
            Err(StageError::Aborted)
        ));
    }

    /// A rank that agrees while its peer confirms a launch (their barriers pair up) is
    /// found out on both, instead of reading the other's post of another round; a failed
    /// rank may join a stage under any collective.
    #[test]
    fn calls_out_of_step_are_found_on_every_rank() {
        let board = Arc::new(Board::new(2));
        let header = |status| Header {
            status,
            slots: &[],
            dims: &[],
            data: &[],
        };
        let threads: Vec<_> = (0..2)
            .map(|rank| {
                let board = Arc::clone(&board);
                std::thread::spawn(move || {
                    // A failed rank 1 under another collective still pairs up.
                    let (status, collective) = match rank {
                        0 => (Status::Ok, SUM),
                        _ => (Status::Failed, Collective::AllGather),
                    };
                    let failed = board.agree(rank, &header(status), collective);
                    let out_of_step = match rank {
                        0 => board.agree(rank, &header(Status::Ok), SUM),
                        _ => board.confirm(rank, true),
                    };
                    (failed, out_of_step)
                })
            })
            .collect();
        for t in threads {
            let (failed, out_of_step) = t.join().unwrap();
            assert!(
                matches!(
                    failed,
                    Err(StageError::Disagreed(Disagreement::Failed { rank: 1 }))
                ),
                "{failed:?}"
            );
            match out_of_step {
                Err(StageError::Disagreed(Disagreement::Calls { calls })) => {
                    assert_eq!(calls, [Some(Call::Stage(SUM)), Some(Call::Launched)])
                }
                other => panic!("expected the calls to disagree, got {other:?}"),
            }
        }
    }
}
