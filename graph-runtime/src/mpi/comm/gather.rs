//! [`Plan::GatherBySlot`] and [`Plan::GatherByRegion`]: a large allgather as nonblocking
//! `MPI_Iallgatherv`s started together, one per value when they are few (each sent from
//! where it is and received where the output wants it), one per dtype region when they
//! are many (whose per-call cost would otherwise add up).
//!
//! [`Plan::GatherBySlot`]: super::plan::Plan::GatherBySlot
//! [`Plan::GatherByRegion`]: super::plan::Plan::GatherByRegion

use std::ops::Range;
use std::sync::MutexGuard;

use ::mpi::datatype::PartitionMut;
use ::mpi::traits::*;

use super::board::{Bytes, Post};
use super::leader::{mpi_count, wait_all, Parts};
use super::pack::{input, leader_bytes, slot_places, Mine, Unpacked};
use super::plan::{Caps, Facts};
use crate::comm::SlotDesc;
use crate::DType;

/// The counts and displacements of an `MPI_Iallgatherv` of `one` bytes from each rank:
/// each process's ranks' bytes, from its first rank's place on.
fn partition(caps: &Caps, one: usize) -> Result<(Vec<i32>, Vec<i32>), String> {
    mpi_count(caps.size * one)?;
    let counts = caps.counts.iter().map(|&c| mpi_count(c * one));
    let displs = caps.offsets.iter().map(|&o| mpi_count(o * one));
    Ok((
        counts.collect::<Result<Vec<i32>, String>>()?,
        displs.collect::<Result<Vec<i32>, String>>()?,
    ))
}

/// A large allgather of few values: one `MPI_Iallgatherv` per value, started together,
/// each sending the value from where it is (with one rank in this process: the value it
/// lent, or its place in the leader's region; with more, every rank's packed one after
/// the other) and receiving straight into its place in the output (the leader's, when it
/// is this process's only rank; else `shared.all`, laid out as the output, from which
/// every rank copies once). Whether the leader's outputs hold the results.
pub(super) fn by_slot(parts: &mut Parts<'_>, slots: &[SlotDesc]) -> Result<bool, String> {
    let (caps, facts, posts) = (parts.caps, &parts.facts, parts.posts);
    let (mine, unpacked) = (&parts.mine, &parts.unpacked);
    let (outs, shared, leader) = (&mut parts.outs, &mut *parts.shared, &mut *parts.leader);
    let (n, size) = (posts.len(), caps.size);
    let places: Vec<(DType, Range<usize>)> = slot_places(slots)
        .filter(|&(_, _, len)| len > 0)
        .map(|(d, at, len)| (d, at * d.size()..(at + len) * d.size()))
        .collect();
    // Each value's counts and displacements: its bytes from each process's ranks.
    let mut partitions = Vec::with_capacity(places.len());
    for (_, place) in &places {
        partitions.push(partition(caps, place.len())?);
    }
    // With several ranks here, each value's send is theirs, one after the other.
    if n > 1 {
        pack_by_slot(&mut leader.send, &places, facts, (mine, unpacked), posts)?;
    }
    let into_outputs = n == 1
        && DType::ALL.iter().all(|&d| {
            let want = size * facts.bytes(d);
            want == 0 || outs[d.index()].as_ref().is_some_and(|o| o.len() == want)
        });
    // Each dtype's output, cut into the values' parts in order.
    let mut rest: [&mut [u8]; DType::COUNT] = Default::default();
    for (d, (out, all)) in outs.iter_mut().zip(&mut shared.all).enumerate() {
        let want = size * facts.bytes(DType::ALL[d]);
        rest[d] = match out.as_deref_mut() {
            Some(out) if into_outputs => out,
            _ => all.bytes_mut(want),
        };
    }
    let mut recvs = Vec::with_capacity(places.len());
    let mut sends = Vec::with_capacity(places.len());
    let mut at = 0;
    for ((d, place), (counts, displs)) in places.iter().zip(&partitions) {
        let buf = std::mem::take(&mut rest[d.index()]);
        let (recv, tail) = buf.split_at_mut(size * place.len());
        rest[d.index()] = tail;
        recvs.push(PartitionMut::new(recv, &counts[..], &displs[..]));
        sends.push(if n > 1 {
            let send = leader.send.bytes(at + n * place.len());
            at += n * place.len();
            &send[at - n * place.len()..]
        } else {
            leader_bytes(mine, unpacked, *d, place.clone())
                .ok_or_else(|| format!("the leader has no {d} value of {} bytes", place.len()))?
        });
    }
    let comm = &leader.comm.0;
    ::mpi::request::scope(|scope| {
        let requests = sends
            .iter()
            .zip(recvs.iter_mut())
            .map(|(send, recv)| comm.immediate_all_gather_varcount_into(scope, *send, recv))
            .collect();
        wait_all(requests);
    });
    shared.by_slot = !into_outputs;
    Ok(into_outputs)
}

/// Packs into `send` each value at `places`, every rank's of this process one after the
/// other, value after value: the leader's from where it is ([`leader_bytes`]), the
/// others' from their posts.
fn pack_by_slot(
    send: &mut Bytes,
    places: &[(DType, Range<usize>)],
    facts: &Facts,
    (mine, unpacked): (&Mine<'_>, &Unpacked<'_>),
    posts: &[MutexGuard<'_, Post>],
) -> Result<(), String> {
    let total: usize = places.iter().map(|(_, p)| posts.len() * p.len()).sum();
    let send = send.bytes_mut(total);
    let mut at = 0;
    for (d, place) in places {
        for (l, post) in posts.iter().enumerate() {
            let src = match l {
                0 => leader_bytes(mine, unpacked, *d, place.clone()),
                _ => post.data[d.index()]
                    .bytes(facts.bytes(*d))
                    .get(place.clone()),
            };
            let src = src.ok_or_else(|| {
                format!("rank {l} here has no {d} value of {} bytes", place.len())
            })?;
            send[at..at + place.len()].copy_from_slice(src);
            at += place.len();
        }
    }
    Ok(())
}

/// A large allgather of many values: one `MPI_Iallgatherv` per dtype region, started
/// together, from every rank's region of this process one after the other, into
/// `shared.all`. The leader's outputs never hold the results.
pub(super) fn by_region(parts: &mut Parts<'_>) -> Result<bool, String> {
    let (caps, facts, posts, mine) = (parts.caps, &parts.facts, parts.posts, &parts.mine);
    let (shared, leader) = (&mut *parts.shared, &mut *parts.leader);
    let n = posts.len();
    let dtypes: Vec<DType> = facts.dtypes().collect();
    let mut partitions = Vec::with_capacity(dtypes.len());
    for &d in &dtypes {
        partitions.push(partition(caps, facts.bytes(d))?);
    }
    // The send buffer holds every dtype's block, one after the other.
    let blocks: Vec<usize> = dtypes.iter().map(|&d| n * facts.bytes(d)).collect();
    let send = leader.send.bytes_mut(blocks.iter().sum());
    {
        let mut at = 0;
        for (&d, &block) in dtypes.iter().zip(&blocks) {
            let one = block / n;
            for l in 0..n {
                let src = input(mine, posts, l, d, one)?;
                send[at + l * one..at + (l + 1) * one].copy_from_slice(src);
            }
            at += block;
        }
    }
    let send = &*send;
    let mut partitions = partitions.iter();
    let mut recvs = Vec::with_capacity(dtypes.len());
    for (d, all) in shared.all.iter_mut().enumerate() {
        let bytes = caps.size * facts.bytes(DType::ALL[d]);
        if bytes == 0 {
            continue;
        }
        let Some((counts, displs)) = partitions.next() else {
            break;
        };
        recvs.push(PartitionMut::new(
            all.bytes_mut(bytes),
            &counts[..],
            &displs[..],
        ));
    }
    let comm = &leader.comm.0;
    ::mpi::request::scope(|scope| {
        let mut at = 0;
        let mut requests = Vec::with_capacity(recvs.len());
        for (recv, &block) in recvs.iter_mut().zip(&blocks) {
            let request =
                comm.immediate_all_gather_varcount_into(scope, &send[at..at + block], recv);
            requests.push(request);
            at += block;
        }
        wait_all(requests);
    });
    Ok(false)
}
