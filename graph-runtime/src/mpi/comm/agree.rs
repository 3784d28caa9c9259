//! The leaders' agreement: one round in which every process learns whether every rank of
//! the group brings the same header, and, when the plan is [`Plan::Small`](super::plan::Plan),
//! every process's data with it.
//!
//! Each leader sends every other a fixed record (failed?, all its ranks alike?, a digest
//! of the header and its length, does the data ride?) and, when it rides, its ranks' data:
//! through their mailboxes in shared memory when every process is on this machine
//! (`mpi::shm`), by point-to-point messages otherwise. When every process sent the same
//! digest of alike ranks, every rank of the group has that header and the verdict is
//! [`agree`](crate::comm::agree) over it, the same on every process; otherwise the leaders
//! exchange every rank's header (and the error of a failed rank) in [`settle`], and every
//! process runs `agree` over all of them. Either way no payload starts before every
//! process has the verdict, and each wait polls against the group's abort.

use std::sync::MutexGuard;

use ::mpi::traits::Communicator as _;
use ::mpi::traits::*;

use super::board::{aborted, Bytes, Outcome, Post};
use super::leader::{Leader, Parts, Stop, TAG_FIRST};
use super::pack::{input, Mine};
use super::plan::{pad, round_bytes, Caps, Facts, SMALL};
use crate::comm::{agree as verdict, Call, Collective, Disagreement, Status};
use crate::mpi::wait::{self, Abandoned};
use crate::mpi::wire::{self, Failure, OwnedHeader};
use crate::DType;

/// Words of the record each leader sends first in a stage: failed?, its ranks' headers
/// alike?, the header's digest and length, and whether the data rides along.
pub(super) const RECORD: usize = 5;

/// The most bytes of a leader's message in a stage's first round: its record and data.
pub(crate) const FIRST_ROUND_BYTES: usize = RECORD * 8 + SMALL;

/// The verdict, the same on every process: `Ok` with the header every rank agreed on (the
/// first rank's of this process) and whether every process's data came with the records,
/// or why not. `small`: the plan of this header lets the data ride.
pub(super) fn agree(parts: &mut Parts<'_>, small: bool) -> Result<(OwnedHeader, bool), Outcome> {
    let (caps, facts, collective, stop) = (parts.caps, &parts.facts, parts.collective, parts.stop);
    let (posts, mine) = (parts.posts, &parts.mine);
    let leader = &mut *parts.leader;
    let bad = |reason: &str| Outcome::Comm(reason.to_string());
    let first = wire::decode(&posts[0].words).ok_or_else(|| bad("a rank posted no header"))?;
    // Word 3 of a header is its status (see `wire::encode`): 0 for `Ok`.
    let failed = posts.iter().any(|p| p.words.get(3).is_none_or(|&w| w != 0));
    let alike = posts.iter().all(|p| p.words == posts[0].words);
    let processes = caps.processes();
    // This process's ranks whose data rides: every one, or a broadcast's root.
    let locals: Vec<usize> = match collective {
        Collective::Broadcast { root } => (0..posts.len())
            .filter(|&l| caps.first() + l == root)
            .collect(),
        _ => (0..posts.len()).collect(),
    };
    let has = |d: DType| {
        let bytes = facts.bytes(d);
        bytes == 0
            || locals
                .iter()
                .all(|&l| input(mine, posts, l, d, bytes).is_ok())
    };
    // If every process brings this header (the fast case), each decides alike.
    let carry = !failed
        && alike
        && first.collective == collective
        && small
        && DType::ALL.into_iter().all(has);
    let record = [
        u64::from(failed),
        u64::from(alike),
        wire::digest(&posts[0].words),
        posts[0].words.len() as u64,
        u64::from(carry),
    ];
    let data = match carry {
        true => round_bytes(facts, collective, caps, caps.process),
        false => 0,
    };
    let len = RECORD * 8 + data;
    let write = |message: &mut [u8]| {
        message[..RECORD * 8].copy_from_slice(bytemuck::cast_slice(&record));
        if carry {
            write_data(&mut message[RECORD * 8..], facts, &locals, mine, posts);
        }
    };
    let got = first_round(leader, caps, len, write, stop)?;
    let peers = || (0..processes).filter(|&q| q != caps.process).zip(&got);
    let mut fast = !failed && alike;
    let record_of = |q: usize| -> Option<&[u64]> {
        let bytes = leader.message(q).get(..RECORD * 8)?;
        bytemuck::try_cast_slice(bytes).ok()
    };
    for (q, &len) in peers() {
        let theirs = record_of(q).filter(|_| len >= RECORD * 8);
        let theirs = theirs.ok_or_else(|| bad("a process sent no record"))?;
        fast &= theirs[0] == 0 && theirs[1] == 1 && theirs[2..4] == record[2..4];
    }
    if !fast {
        return settle(leader, caps, posts, collective, first, stop).map(|h| (h, false));
    }
    // Same header everywhere: every process decided alike whether to carry its data
    // (and if not, every process sees it and says so).
    let carried_by = |q: usize| record_of(q).map_or(u64::MAX, |r| r[RECORD - 1]);
    let expected = |q: usize| RECORD * 8 + round_bytes(facts, collective, caps, q);
    let odd = |(q, &len): (usize, &usize)| {
        carried_by(q) != record[RECORD - 1] || carry && len != expected(q)
    };
    if let Some((q, len)) = peers().find(|&p| odd(p)) {
        return Err(Outcome::Comm(format!(
            "the processes disagree on the data of a stage (process {q}: {len} bytes, \
             carried: {}; here: {carry}, {} bytes expected)",
            carried_by(q),
            expected(q)
        )));
    }
    // Every rank of every process brought this very header.
    match verdict(caps.size, collective, |_| first.header()) {
        Ok(()) => Ok((first, carry)),
        Err(d) => Err(Outcome::Disagreed(d)),
    }
}

/// The data of a message that carries it, after the record: every dtype's region of each
/// of `locals` (the contributing ranks here), [`pad`]ded; each one there (checked by
/// `agree`).
fn write_data(
    message: &mut [u8],
    facts: &Facts,
    locals: &[usize],
    mine: &Mine<'_>,
    posts: &[MutexGuard<'_, Post>],
) {
    let mut at = 0;
    for d in DType::ALL {
        let bytes = facts.bytes(d);
        if bytes == 0 {
            // Not `input`: for a dtype the leader has no region of, its error
            // message would be formatted on every stage.
            continue;
        }
        for &l in locals {
            if let Ok(src) = input(mine, posts, l, d, bytes) {
                message[at..at + bytes].copy_from_slice(src);
            }
            at += pad(bytes);
        }
    }
}

/// The first round: `write` fills this leader's message of `len` bytes, which every other
/// leader gets while theirs come in (see [`Leader::message`]). How many bytes came from
/// each other process, in process order.
fn first_round(
    leader: &mut Leader,
    caps: &Caps,
    len: usize,
    write: impl FnOnce(&mut [u8]),
    stop: Stop<'_>,
) -> Result<Vec<usize>, Outcome> {
    let Some(boxes) = &mut leader.mailboxes else {
        return first_round_by_messages(leader, caps, len, write, stop);
    };
    write(boxes.outbox(len).ok_or_else(|| aborted(Abandoned))?);
    boxes.exchange(len, || stop.now()).map_err(aborted)?;
    Ok((0..caps.processes())
        .filter(|&q| q != caps.process)
        .map(|q| boxes.inbox(q).len())
        .collect())
}

/// The first round by MPI messages: `write` fills the leader's message of `len` bytes,
/// sent to every other leader while theirs come in (`inbox`). How many bytes came from
/// each other process, in process order.
fn first_round_by_messages(
    leader: &mut Leader,
    caps: &Caps,
    len: usize,
    write: impl FnOnce(&mut [u8]),
    stop: Stop<'_>,
) -> Result<Vec<usize>, Outcome> {
    let (processes, process) = (caps.processes(), caps.process);
    let Leader {
        comm, send, inbox, ..
    } = leader;
    let message = send.bytes_mut(len);
    write(message);
    let message = &*message;
    inbox.resize_with(processes, Bytes::default);
    let comm = &comm.0;
    let statuses = ::mpi::request::scope(|scope| {
        let mut requests = Vec::with_capacity(2 * processes);
        for (q, buf) in inbox.iter_mut().enumerate() {
            if q != process {
                let from = comm.process_at_rank(q as i32);
                let buf = buf.bytes_mut(FIRST_ROUND_BYTES);
                requests.push(from.immediate_receive_into_with_tag(scope, buf, TAG_FIRST));
            }
        }
        for q in (0..processes).filter(|&q| q != process) {
            let to = comm.process_at_rank(q as i32);
            requests.push(to.immediate_send_with_tag(scope, message, TAG_FIRST));
        }
        // SAFETY: on `Err` the buffers of every request (`send` and `inbox`, the
        // leader's own) are leaked below, under the leader's lock, before anything
        // else can reach them.
        unsafe { wait::all_statuses(requests, || stop.now()) }
    });
    let Ok(statuses) = statuses else {
        wait::leak(&mut send.0);
        inbox.iter_mut().for_each(|b| wait::leak(&mut b.0));
        return Err(aborted(Abandoned));
    };
    Ok(statuses
        .iter()
        .map(|s| usize::try_from(s.count(u8::equivalent_datatype())).unwrap_or(0))
        .collect())
}

/// The verdict when the records differ: the leaders exchange every rank's header and
/// the failure of each failed one, and every process runs [`agree`](crate::comm::agree)
/// over all of them, which names the same value and the same shapes everywhere.
fn settle(
    leader: &mut Leader,
    caps: &Caps,
    posts: &[MutexGuard<'_, Post>],
    collective: Collective,
    first: OwnedHeader,
    stop: Stop<'_>,
) -> Result<OwnedHeader, Outcome> {
    let bad = |reason: &str| Outcome::Comm(reason.to_string());
    // Every rank's header, and the failure of each failed one, from every process.
    let words = &mut leader.headers;
    words.clear();
    words.push(posts.len() as u64);
    for p in posts {
        words.push(p.words.len() as u64);
        words.extend_from_slice(&p.words);
        Failure::encode(p.failure.as_ref(), words);
    }
    let every = wait::all_gather_words(&leader.comm.0, words, || stop.now()).map_err(aborted)?;
    let mut headers: Vec<(OwnedHeader, Option<Failure>)> = Vec::with_capacity(caps.size);
    let mut rest = &every[..];
    let corrupt = || bad("a process sent headers that do not decode");
    for _ in 0..caps.processes() {
        let n = wire::take(&mut rest).ok_or_else(corrupt)?;
        for _ in 0..n {
            let len = wire::take(&mut rest).ok_or_else(corrupt)?;
            let h = wire::take_n(&mut rest, len)
                .and_then(wire::decode)
                .ok_or_else(corrupt)?;
            let f = Failure::decode(&mut rest).ok_or_else(corrupt)?;
            headers.push((h, f));
        }
    }
    if headers.len() != caps.size {
        return Err(corrupt());
    }
    let failed_rank = headers.iter().position(|(h, _)| h.status == Status::Failed);
    if let Some(rank) = failed_rank {
        // The error every process reports: the first in rank order. The process
        // that hosts its rank reports it from there; the others learn it here, and
        // so does a rank of theirs that failed too (see `StepCtx::drain`).
        let first = headers.iter().position(|(_, f)| f.is_some());
        let failure = first.and_then(|q| headers[q].1.clone());
        let local = caps.first()..caps.first() + posts.len();
        let here = match first {
            Some(q) => local.contains(&q),
            None => headers[local]
                .iter()
                .any(|(h, _)| h.status == Status::Failed),
        };
        return Err(Outcome::Failed {
            rank,
            failure,
            here,
        });
    }
    if headers.iter().any(|(h, _)| h.collective != collective) {
        let calls = headers
            .iter()
            .map(|(h, _)| Some(Call::Stage(h.collective)))
            .collect();
        return Err(Outcome::Disagreed(Disagreement::Calls { calls }));
    }
    match verdict(caps.size, collective, |q| headers[q].0.header()) {
        Ok(()) => Ok(first),
        Err(d) => Err(Outcome::Disagreed(d)),
    }
}
