//! The shared-memory communicator: ranks are threads of this process.
//!
//! A stage is one sequence of barrier epochs over every dtype region at once:
//!
//! 1. **Plan** (`plan.rs`): each rank picks the stage's algorithm from its
//!    header, the collective and the group's capabilities. Ranks whose headers agree pick
//!    the same one.
//! 2. **Post** (`post.rs`): every rank posts its call (the collective, with its
//!    op and root), its header and the addresses of its regions, or, for an eager plan, a
//!    copy of its header and values; then it waits at the barrier and checks that every
//!    rank posted the same call for this barrier round.
//! 3. **Agree** (`check.rs`): only then does it read the headers, then every
//!    rank's buffers against them, and every rank reaches the same verdict.
//! 4. **Run**: the plan's executor moves the payload, reading the peers' buffers directly
//!    (no locks: the barriers order every write before the reads of it, and a final
//!    barrier keeps every buffer alive and unchanged until no peer reads it).
//!
//! | plan | after the header check | barriers |
//! | --- | --- | --- |
//! | `Eager` (`eager.rs`): allreduce of at most `EAGER_BYTES` per rank (`EAGER_BYTES_CROWDED` when the ranks outnumber the cores) | nothing: every rank copied its header and values into its post before the barrier, and now checks every copy and reduces all of them, in rank order, into its own region | 1 |
//! | `Chunked` (`chunked.rs`): allreduce | rank r reduces its 1/N chunk of every region, in rank order, block by block, and writes each block into every rank's region | 2 |
//! | `Shared` (`shared.rs`): allreduce of `SHARE_BYTES` or more | the same, but each block goes into rank 0's region only, which rank 0 then hands to every rank (`exchange_results`) | 3 |
//! | `Chunked`: reduce | the same, but writes each block into the root's region only | 2 |
//! | `ReduceScatter` (`copy.rs`) | rank r reduces its chunk of every value, in rank order, into its output region | 2 |
//! | `Gather` (`copy.rs`): allgather | rank r copies every rank's part of every value into its output region | 2 |
//! | `Broadcast` (`copy.rs`) | every rank but the root copies the root's regions over its own | 2 |
//!
//! Inputs are read where they are (`Header::data`): in the values themselves when they
//! lend their elements, else at their place in the packed region. Each element is reduced
//! exactly once, by one rank, in rank order, and everything else is a copy (or, for a
//! shared result, the same memory), so every rank holds bitwise-identical results; in an
//! eager allreduce every rank reduces every element, with the same kernels over the same
//! copies in the same rank order, which gives the same bits.
//!
//! # What makes it sound whatever the callers do
//!
//! The communicator is public: code in other crates may call `stage` and
//! `exchange_results` in any order, with any arguments, on any rank. None of it can make a
//! rank read memory that a peer no longer keeps or is writing:
//! - Each post is tied to one barrier round (the rank's count of its barrier waits, which
//!   is the same on every rank for the waits that pass together) and names its call.
//!   After the round's barrier, a rank reads every peer's round and call from atomics,
//!   and dereferences nothing a peer posted unless every rank made the same call for this
//!   very round. A rank that posted for the round is inside the same call, and stays in
//!   it until the call's last barrier. Only then does the rank hold a `Round`, the guard
//!   through which every dereference of a peer's memory goes (`peer.rs`, which
//!   states the invariant).
//! - When the calls differ, every rank sees the same posts and returns the same
//!   [`Disagreement::Calls`]; the ranks no longer pair their calls, so each endpoint is
//!   broken from then on, and every later call fails at once with the same error: no
//!   rank waits at a barrier that the others will not reach. (The limit: a rank that
//!   simply stops calling, or calls `stage` more often than its peers before they notice,
//!   still leaves its peers at the barrier until the group is aborted, as a rank stuck in
//!   a method would; it never makes them read anything.)
//! - Then the headers are checked ([`agree`](fn@crate::comm::agree)) and every rank's
//!   buffers against them, and the payload touches only memory the checked layout gives
//!   it. Each rank takes the base pointer of each of its regions once, before it posts,
//!   and from then on every access to the region, its own and its peers', goes through
//!   that pointer; no rank creates a reference over memory that another rank may touch at
//!   the same time (a kernel's slices cover one block of one rank's chunk, which only that
//!   rank touches in that phase).

mod check;
mod chunked;
mod copy;
mod eager;
#[cfg(all(test, loom))]
mod loom_tests;
mod peer;
mod plan;
mod post;
mod shared;
#[cfg(all(test, not(loom)))]
mod tests;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use self::peer::Round;
use self::plan::{plan, Caps, Facts, Plan};
use self::post::{open_round, own_bufs, Buf, Post};
use self::shared::Mailbox;
use crate::comm::{
    AbortHandle, Backend, Call, Collective, Communicator, Disagreement, Header, RegionMut,
    SharedBuffers, StageError, Status,
};
use crate::sync::Barrier;
use crate::{DType, Error};

/// The shared-memory CPU backend, the default: no set-up, ranks are the actor threads.
///
/// ```
/// use actorgraph::{Backend, Communicator, Cpu};
/// let comms = Cpu::default().communicators(3)?;
/// assert_eq!(comms[2].rank(), 2);
/// assert_eq!(comms[2].size(), 3);
/// # Ok::<(), actorgraph::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl Backend for Cpu {
    type Comm = CpuComm;

    fn communicators(&self, size: usize) -> Result<Vec<CpuComm>, Error> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let group = Arc::new(Group {
            barrier: Barrier::new(size),
            mailbox: Mailbox::new(size),
        });
        // The same for every rank, so that they all plan alike.
        let crowded = Caps::new(size, cores).crowded;
        Ok((0..size)
            .map(|rank| CpuComm {
                rank,
                size,
                crowded,
                group: Arc::clone(&group),
                broken: None,
            })
            .collect())
    }
}

/// One rank's endpoint of a [`Cpu`] communicator.
///
/// Every rank must make the same calls in the same order; when they do not, every rank
/// gets [`Disagreement::Calls`] (see [`Call`]) and the communicator is broken for good:
/// every later call returns that error again, at once.
pub struct CpuComm {
    rank: usize,
    size: usize,
    /// Whether the ranks outnumber the cores (see [`Caps`]).
    crowded: bool,
    group: Arc<Group>,
    /// Set when the ranks' calls disagreed: they no longer pair up.
    broken: Option<Disagreement>,
}

/// What the ranks of a group share.
struct Group {
    /// The barrier, with each rank's posts beside its arrivals: two per rank, for even and
    /// odd rounds. A rank writes a post again for round r + 2 at the earliest, so after
    /// the barrier of round r + 1, which every peer reaches only once it is done reading
    /// the post of round r.
    barrier: Barrier<Post>,
    /// The result buffers rank 0 hands each rank after a stage that shares results.
    mailbox: Mailbox,
}

/// Turns a panic between a round's first and last barrier into an abort: peers may be
/// reading this rank's regions and header there, so its frame must not unwind away.
/// Nothing there can panic (no user code runs between those barriers, only the checked
/// layout and the kernels); this only makes a bug in them fail loudly instead of unsoundly.
struct NoUnwind;

impl Drop for NoUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::process::abort();
        }
    }
}

impl CpuComm {
    /// What the plan knows of this group.
    #[inline]
    fn caps(&self) -> Caps {
        Caps {
            ranks: self.size,
            crowded: self.crowded,
        }
    }

    /// Fails at once once the ranks' calls have disagreed.
    fn check_unbroken(&self) -> Result<(), StageError> {
        match &self.broken {
            Some(why) => Err(StageError::Disagreed(why.clone())),
            None => Ok(()),
        }
    }

    /// Posts `call` for the next barrier round (after `publish` has filled in the rest of
    /// the post), waits at the round's barrier, and checks that every rank made the same
    /// call for this round (see [`open_round`]): only then may a peer's post be
    /// dereferenced, through the guard returned. When the calls differ, the communicator
    /// is broken from then on.
    /// `failed`: whether this rank joins a stage as failed (see [`Call::pairs_with`]).
    #[inline]
    fn open_round(
        &mut self,
        call: Call,
        failed: bool,
        publish: impl FnOnce(&Post),
    ) -> Result<Round<'_>, StageError> {
        let barrier = &self.group.barrier;
        match open_round(barrier, self.rank, self.size, call, failed, publish) {
            Ok(round) => {
                // SAFETY: `open_round` found that every rank made this call for `round`,
                // and the guard borrows this endpoint, so it ends before our next call's
                // first barrier (a stage's own last barrier is `Round::close`).
                let guard = unsafe { Round::new(barrier, round, self.rank, self.size) };
                Ok(guard)
            }
            Err(StageError::Disagreed(why)) => {
                self.broken = Some(why.clone());
                // Results rank 0 left for us will never be taken: let them go now.
                self.group.mailbox.clear(self.rank);
                Err(StageError::Disagreed(why))
            }
            Err(e) => Err(e),
        }
    }
}

impl Communicator for CpuComm {
    fn rank(&self) -> usize {
        self.rank
    }

    // Nothing here is bound to a thread: the peers meet in memory this process shares.
    fn runs_on_any_thread(&self) -> bool {
        true
    }

    fn size(&self) -> usize {
        self.size
    }

    fn stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        self.check_unbroken()?;
        let mut bufs = [Buf::EMPTY; DType::COUNT];
        own_bufs(&mut bufs, regions, outputs);
        // Planned from our own header, before we post: an eager plan decides what goes
        // into the post. Whether the stage runs eagerly is decided after the barrier,
        // from every post alike: only if every rank posted its copy.
        let plan = plan(Facts::of(header), collective, self.caps());
        let eager = matches!(plan, Plan::Eager(_));

        // Post, and open the round.
        let failed = header.status == Status::Failed;
        let round = self.open_round(Call::Stage(collective), failed, |post| {
            post.eager.store(eager, Relaxed);
            // SAFETY: the caller's header and regions are live and ours for the call.
            // Aliasing: no peer reads this post's copy now (it was last read for the round
            // two before, before every peer arrived at the barrier we passed to get here),
            // and we post it only after this write.
            let copied = eager
                && post
                    .copy
                    .with_mut(|copy| unsafe { (*copy).fill(header, &bufs) });
            // A rank whose copy holds its values publishes no addresses: no peer reads
            // them (see `eager::agree` and `check::mixed_verdict`), and the stores would
            // take lines from the peers at every stage (see BENCHMARKS.md).
            if !copied {
                post.publish(header, &bufs);
            }
        })?;

        // Agree, then run: eagerly, from the copies, if every rank posted one.
        let eager_posts = round.eager_posts();
        if let Plan::Eager(op) = plan {
            if eager_posts == round.size() {
                let want =
                    eager::agree(&round, header, collective).map_err(StageError::Disagreed)?;
                // SAFETY: every post is eager, and `eager::agree` returned `want` for it.
                unsafe { eager::run(&round, &want, &bufs, op) };
                return Ok(());
            }
        }
        // From here until the last barrier, peers may read our header and regions.
        let armed = NoUnwind;
        let verdict = if eager_posts == 0 {
            // SAFETY: no post is eager.
            unsafe { check::agree_published(&round, header, collective) }
        } else {
            Err(check::mixed_verdict(&round, collective))
        };
        if let Err(why) = verdict {
            // Every rank reaches this verdict, but a slower peer may still be reading our
            // header, whose slices live in the caller's fused stage: with executions in
            // flight, a rank that returned now could reach this stage again in the next
            // execution and rewrite them. Return only once every rank is done reading (a
            // barrier that costs only on this failure path).
            round.close();
            drop(armed);
            return Err(StageError::Disagreed(why));
        }
        // From here on, the verdict says every rank posted, for each dtype, an input region
        // of the length its slots add up to and an output region of the length the
        // collective needs, all alive until the stage's last barrier, and input data for
        // every slot that matches it; and every rank planned from the same facts, so every
        // rank runs the same plan.
        // SAFETY: that is what each executor requires (see `chunked::run`).
        unsafe {
            match plan {
                Plan::Chunked { op, root } => chunked::run(&round, header, &bufs, op, root),
                Plan::Shared(op) => shared::run(&round, header, &bufs, op),
                Plan::ReduceScatter(op) => copy::reduce_scatter(&round, header, &bufs, op),
                Plan::Gather => copy::gather(&round, header, &bufs),
                Plan::Broadcast { root } => copy::broadcast(&round, header, root),
                // We posted our copy, so some peer did not (else the stage ran eagerly
                // above), which `check::mixed_verdict` refuses.
                Plan::Eager(_) => unreachable!("an eager plan passed a mixed round's check"),
            }
        }
        round.close();
        drop(armed);
        Ok(())
    }

    fn reads_in_place(&self) -> bool {
        true
    }

    fn shares_results(&self, collective: Collective, header: &Header<'_>) -> bool {
        // The plan of the payload, which runs only when no rank failed.
        let facts = Facts {
            bytes: header.bytes(),
            failed: false,
        };
        matches!(plan(facts, collective, self.caps()), Plan::Shared(_))
    }

    fn exchange_results(&mut self, buffers: &mut SharedBuffers) -> Result<(), StageError> {
        self.hand_over(buffers)
    }

    fn abort_handle(&self) -> AbortHandle {
        let group = Arc::clone(&self.group);
        AbortHandle::new(move || group.barrier.abort())
    }
}
