//! [`Plan::ScatterGather`](super::plan::Plan): a large reduction as a reduce-scatter in
//! rank order, then an allgather, point to point.
//!
//! Each region is cut in one chunk per process, with the same bounds everywhere. Process
//! `p`'s leader receives chunk `p` of every other process's ranks' regions, folds chunk
//! `p` over every rank in rank order (the same fold as the small plan's:
//! `reduce_reference`, bit for bit) and sends it to every other process, which receive it
//! in place. So every process ends with the same bits, and each leader moves and folds
//! `1/P` of each region instead of all of it.
//!
//! For `allreduce` and `reduce`, the leader's own region is the result (it is the fold's
//! source of the leader's rank, read before it is written); otherwise, and for the other
//! ranks of the process, the result is in `shared.result`.

use std::ops::Range;
use std::sync::MutexGuard;

use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;

use super::board::{Post, Shared};
use super::leader::{wait_all, Leader, Parts, TAG_GATHER, TAG_SCATTER};
use super::pack::{fold, input, pack_kept, within_unpacked, Mine, Unpacked};
use super::plan::{pad, Caps, Facts};
use crate::comm::Collective;
use crate::element::with_dtype;
use crate::{DType, ReduceOp};

/// The first element of process `q`'s chunk of a region of `len` elements cut in `parts`:
/// the same on every process.
fn bound(len: usize, q: usize, parts: usize) -> usize {
    // In u128: `len * q` may pass usize::MAX only for absurd lengths, but never panics.
    (len as u128 * q as u128 / parts as u128) as usize
}

/// How a stage's regions are cut among the processes, and what this process brings.
struct Cut<'a> {
    caps: &'a Caps,
    facts: &'a Facts,
    posts: &'a [MutexGuard<'a, Post>],
    /// The dtypes with a region, in region order.
    dtypes: Vec<DType>,
    /// The leader folds into its own regions (see the module's docs).
    in_place: bool,
    op: ReduceOp,
}

impl Cut<'_> {
    /// Process `q`'s chunk of a region of dtype `d`, in bytes.
    #[inline]
    fn chunk(&self, d: DType, q: usize) -> (usize, usize) {
        let (l, es, parts) = (self.facts.lens[d.index()], d.size(), self.caps.processes());
        (bound(l, q, parts) * es, bound(l, q + 1, parts) * es)
    }

    /// Rank `r`'s part `lo..hi` (this process's chunk) of its region of dtype `d`, for
    /// every rank but the leader: this process's other ranks' posts, and the other
    /// processes' ranks' slots in the scratch.
    #[inline]
    fn theirs<'s>(
        &'s self,
        scratch: &Scratch<'s>,
        d: DType,
        (lo, hi): (usize, usize),
        r: usize,
    ) -> &'s [u8] {
        let (first, n) = (self.caps.first(), self.posts.len());
        if (first..first + n).contains(&r) {
            &self.posts[r - first].data[d.index()].bytes(self.facts.bytes(d))[lo..hi]
        } else {
            let (slot, c) = (if r < first { r } else { r - n }, hi - lo);
            &scratch.bytes[scratch.blocks[d.index()] + slot * pad(c)..][..c]
        }
    }
}

/// This process's chunk of the other processes' ranks' regions, as they came in: for
/// each dtype, from `blocks[d]` on, one chunk per rank in rank order, each [`pad`]ded.
struct Scratch<'s> {
    bytes: &'s [u8],
    blocks: [usize; DType::COUNT],
}

/// A large reduction by `op`. Whether the leader's regions hold its results.
pub(super) fn run(parts: &mut Parts<'_>, op: ReduceOp) -> Result<bool, String> {
    let (caps, facts, collective, posts) =
        (parts.caps, &parts.facts, parts.collective, parts.posts);
    let (leader, mine, unpacked) = (&mut *parts.leader, &mut parts.mine, &parts.unpacked);
    let shared = &mut *parts.shared;
    let dtypes: Vec<DType> = facts.dtypes().collect();
    let in_place = matches!(
        collective,
        Collective::AllReduce(_) | Collective::Reduce { .. }
    ) && dtypes.iter().all(|&d| {
        mine[d.index()]
            .as_ref()
            .is_some_and(|r| r.len() == facts.bytes(d))
    });
    let cut = Cut {
        caps,
        facts,
        posts,
        dtypes,
        in_place,
        op,
    };
    pack_crossing(&cut, mine, unpacked);
    let (blocks, size) = scatter(&cut, leader, mine, unpacked)?;
    let scratch = Scratch {
        bytes: leader.scratch.bytes(size),
        blocks,
    };
    fold_chunks(&cut, &scratch, mine, unpacked, shared)?;
    // Every chunk to every process.
    let results: Vec<&mut [u8]> = if in_place {
        mine.iter_mut()
            .filter_map(|r| r.as_deref_mut())
            .filter(|r| !r.is_empty())
            .collect()
    } else {
        shared
            .result
            .iter_mut()
            .zip(DType::ALL)
            .filter(|(_, d)| facts.lens[d.index()] > 0)
            .map(|(b, d)| b.bytes_mut(facts.bytes(d)))
            .collect()
    };
    if results.len() != cut.dtypes.len() {
        return Err("the leader's regions do not match the header".into());
    }
    gather(&cut, &leader.comm.0, results);
    if in_place && posts.len() > 1 && !shared.lent {
        // The process's other ranks copy the result out of `shared`.
        for (d, r) in mine.iter().enumerate() {
            if let Some(r) = r.as_deref().filter(|_| facts.lens[d] > 0) {
                shared.result[d].bytes_mut(r.len()).copy_from_slice(r);
            }
        }
    }
    Ok(in_place)
}

/// Packs the leader's chunks for other processes (and, unless it folds into its own
/// regions, its own chunk) that lie within no one value it kept out of its regions: where
/// the kept values cross into them.
fn pack_crossing(cut: &Cut<'_>, mine: &mut Mine<'_>, unpacked: &Unpacked<'_>) {
    let p = cut.caps.process;
    for &d in &cut.dtypes {
        for q in (0..cut.caps.processes()).filter(|&q| q != p || !cut.in_place) {
            let (lo, hi) = cut.chunk(d, q);
            if within_unpacked(unpacked, d, lo, hi).is_some() {
                continue;
            }
            if let Some(piece) = mine[d.index()]
                .as_deref_mut()
                .and_then(|r| r.get_mut(lo..hi))
            {
                pack_kept(&unpacked[d.index()], piece, lo);
            }
        }
    }
}

/// The reduce-scatter's moves: chunk `q` of every rank here to process `q`, and chunk `p`
/// of every other process's ranks into the leader's scratch. Every input is checked before
/// any request starts (a request must be waited for). The scratch's layout: where each
/// dtype's block starts, and its bytes.
fn scatter(
    cut: &Cut<'_>,
    leader: &mut Leader,
    mine: &Mine<'_>,
    unpacked: &Unpacked<'_>,
) -> Result<([usize; DType::COUNT], usize), String> {
    let (p, processes, n) = (cut.caps.process, cut.caps.processes(), cut.posts.len());
    let remote = cut.caps.size - n;
    let mut sends: Vec<(usize, &[u8])> = Vec::with_capacity(cut.dtypes.len() * n * processes);
    for &d in &cut.dtypes {
        for q in (0..processes).filter(|&q| q != p) {
            let (lo, hi) = cut.chunk(d, q);
            for l in 0..n {
                let kept = within_unpacked(unpacked, d, lo, hi).filter(|_| l == 0);
                let src = match kept {
                    Some(src) => src,
                    None => &input(mine, cut.posts, l, d, cut.facts.bytes(d))?[lo..hi],
                };
                sends.push((q, src));
            }
        }
    }
    // The scratch: for each dtype, chunk `p` of every other process's ranks.
    let mut blocks = [0usize; DType::COUNT];
    let mut size = 0;
    for &d in &cut.dtypes {
        blocks[d.index()] = size;
        let (lo, hi) = cut.chunk(d, p);
        size += remote * pad(hi - lo);
    }
    let scratch = leader.scratch.bytes_mut(size);
    let comm = &leader.comm.0;
    let mut slots: Vec<(usize, &mut [u8])> = Vec::with_capacity(cut.dtypes.len() * remote);
    let mut rest: &mut [u8] = &mut *scratch;
    for &d in &cut.dtypes {
        let (lo, hi) = cut.chunk(d, p);
        for q in (0..processes).filter(|&q| q != p) {
            for _ in 0..cut.caps.counts[q] {
                let (slot, tail) = std::mem::take(&mut rest).split_at_mut(pad(hi - lo));
                slots.push((q, &mut slot[..hi - lo]));
                rest = tail;
            }
        }
    }
    ::mpi::request::scope(|scope| {
        let mut requests = Vec::with_capacity(slots.len() + sends.len());
        for (q, slot) in slots {
            let from = comm.process_at_rank(q as i32);
            requests.push(from.immediate_receive_into_with_tag(scope, slot, TAG_SCATTER));
        }
        for &(q, src) in &sends {
            let to = comm.process_at_rank(q as i32);
            requests.push(to.immediate_send_with_tag(scope, src, TAG_SCATTER));
        }
        wait_all(requests);
    });
    Ok((blocks, size))
}

/// Chunk `p` of each region, folded over every rank in rank order: into the leader's
/// regions in place, or into `shared.result`.
fn fold_chunks(
    cut: &Cut<'_>,
    scratch: &Scratch<'_>,
    mine: &mut Mine<'_>,
    unpacked: &Unpacked<'_>,
    shared: &mut Shared,
) -> Result<(), String> {
    let first = cut.caps.first();
    for &d in &cut.dtypes {
        let (lo, hi) = cut.chunk(d, cut.caps.process);
        if cut.in_place {
            let Some(dst) = mine[d.index()].as_deref_mut() else {
                return Err(format!("the leader has no {d} region"));
            };
            fold_in_place(cut, scratch, d, (lo, hi), &unpacked[d.index()], dst);
        } else {
            let own = match within_unpacked(unpacked, d, lo, hi) {
                Some(kept) => kept,
                None => &input(mine, cut.posts, 0, d, cut.facts.bytes(d))?[lo..hi],
            };
            let srcs: Vec<&[u8]> = (0..cut.caps.size)
                .map(|r| match r == first {
                    true => own,
                    false => cut.theirs(scratch, d, (lo, hi), r),
                })
                .collect();
            let dst = &mut shared.result[d.index()].bytes_mut(cut.facts.bytes(d))[lo..hi];
            with_dtype!(d, E => fold::<E>(&srcs, None, cut.op, dst));
        }
    }
    Ok(())
}

/// Folds chunk `lo..hi` of dtype `d` into the leader's region `dst`, part by part: where
/// a value it kept out of its region (`kept`) covers the chunk, the leader's source is
/// that value; elsewhere it is `dst` itself.
fn fold_in_place(
    cut: &Cut<'_>,
    scratch: &Scratch<'_>,
    d: DType,
    (lo, hi): (usize, usize),
    kept: &[(Range<usize>, &[u8])],
    dst: &mut [u8],
) {
    let first = cut.caps.first();
    // Part `a..b` of the chunk, the leader's source being `own` (a value it kept out of
    // its region), or `dst` itself.
    let mut fold_part = |a: usize, b: usize, own: Option<&[u8]>| {
        let srcs: Vec<&[u8]> = (0..cut.caps.size)
            .map(|r| match own {
                _ if r != first => &cut.theirs(scratch, d, (lo, hi), r)[a - lo..b - lo],
                Some(own) => own,
                None => &[][..],
            })
            .collect();
        let own_rank = own.is_none().then_some(first);
        with_dtype!(d, E => fold::<E>(&srcs, own_rank, cut.op, &mut dst[a..b]));
    };
    let mut at = lo;
    for (place, src) in kept {
        let (a, b) = (place.start.max(lo), place.end.min(hi));
        if a >= b {
            continue;
        }
        if at < a {
            fold_part(at, a, None);
        }
        fold_part(a, b, Some(&src[a - place.start..b - place.start]));
        at = b;
    }
    if at < hi {
        fold_part(at, hi, None);
    }
}

/// The allgather's moves: this process's folded chunk of each region of `results` to
/// every other process, and every other process's chunk into its place in `results`.
fn gather(cut: &Cut<'_>, comm: &SimpleCommunicator, results: Vec<&mut [u8]>) {
    let (p, processes) = (cut.caps.process, cut.caps.processes());
    ::mpi::request::scope(|scope| {
        let mut requests = Vec::with_capacity(cut.dtypes.len() * 2 * processes);
        for (&d, buf) in cut.dtypes.iter().zip(results) {
            let mut rest = buf;
            for q in 0..processes {
                let (lo, hi) = cut.chunk(d, q);
                let (part, tail) = std::mem::take(&mut rest).split_at_mut(hi - lo);
                rest = tail;
                if q == p {
                    let part: &[u8] = part;
                    for t in (0..processes).filter(|&t| t != p) {
                        let to = comm.process_at_rank(t as i32);
                        requests.push(to.immediate_send_with_tag(scope, part, TAG_GATHER));
                    }
                } else {
                    let from = comm.process_at_rank(q as i32);
                    requests.push(from.immediate_receive_into_with_tag(scope, part, TAG_GATHER));
                }
            }
        }
        wait_all(requests);
    });
}
