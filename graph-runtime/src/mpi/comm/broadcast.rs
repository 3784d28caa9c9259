//! [`Plan::Broadcast`](super::plan::Plan): `MPI_Ibcast`s in place in the leader's regions,
//! as `MPI_Bcast` does in the caller's buffer, each region in its pieces, all started
//! together. The root's leader fills each piece just before it starts it (from the
//! values it kept, see `pack::Unpacked`, or its root rank's post), so that the first
//! pieces travel while it packs the rest; the pieces are the same on every process.

use ::mpi::traits::*;

use super::leader::{wait_all, Parts};
use super::pack::pack_kept;
use crate::DType;

/// A large broadcast from rank `root`, each region of dtype `d` in `pieces[d]` pieces.
/// Whether the leader's regions hold the results (they do unless a region is missing);
/// the process's other ranks copy them from `shared.result`.
pub(super) fn run(
    parts: &mut Parts<'_>,
    root: usize,
    pieces: &[usize; DType::COUNT],
) -> Result<bool, String> {
    let (caps, facts, posts, unpacked) = (parts.caps, &parts.facts, parts.posts, &parts.unpacked);
    let (mine, shared) = (&mut parts.mine, &mut *parts.shared);
    let from = caps.process_of(root).ok_or("the root is no rank")?;
    let root_here = (from == caps.process).then(|| root - caps.first());
    let bytes = |d: DType| facts.bytes(d);
    // In the leader's regions when it has them, whole; the same MPI calls either way.
    let in_place = DType::ALL.iter().all(|&d| {
        bytes(d) == 0
            || mine[d.index()]
                .as_ref()
                .is_some_and(|r| r.len() == bytes(d))
    });
    // Checked before any request starts (a request must be waited for).
    match root_here {
        Some(0) if !in_place => return Err("the root's leader has no whole regions".into()),
        Some(r) if r >= posts.len() => return Err("the root is no rank here".into()),
        _ => {}
    }
    let mut bufs: Vec<(DType, &mut [u8])> = Vec::new();
    for (d, (region, result)) in mine.iter_mut().zip(&mut shared.result).enumerate() {
        let (d, bytes) = (DType::ALL[d], bytes(DType::ALL[d]));
        if bytes > 0 {
            bufs.push(match region.as_deref_mut() {
                Some(region) if in_place => (d, region),
                _ => (d, result.bytes_mut(bytes)),
            });
        }
    }
    let root = parts.leader.comm.0.process_at_rank(from as i32);
    ::mpi::request::scope(|scope| {
        let mut requests = Vec::new();
        for (d, buf) in bufs.iter_mut() {
            let (len, mut at) = (buf.len().div_ceil(pieces[d.index()]), 0);
            let mut rest = &mut **buf;
            while !rest.is_empty() {
                let cut = len.min(rest.len());
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(cut);
                match root_here {
                    Some(0) => pack_kept(&unpacked[d.index()], piece, at),
                    Some(r) => piece
                        .copy_from_slice(&posts[r].data[d.index()].bytes(at + piece.len())[at..]),
                    None => {}
                }
                at += piece.len();
                rest = tail;
                requests.push(root.immediate_broadcast_into(scope, piece));
            }
        }
        wait_all(requests);
    });
    if in_place && posts.len() > 1 {
        for (region, result) in mine.iter().zip(&mut shared.result) {
            if let Some(region) = region.as_deref().filter(|r| !r.is_empty()) {
                result.bytes_mut(region.len()).copy_from_slice(region);
            }
        }
    }
    Ok(in_place)
}
