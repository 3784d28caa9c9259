//! The leader's side of a stage: its MPI communicator and scratch ([`Leader`]), and the
//! parts of the stage that the agreement and each plan's executor work on ([`Parts`]).

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Acquire;
use std::sync::MutexGuard;

use ::mpi::request::{Request, Scope};

use super::board::{Bytes, Post, Shared};
use super::pack::{Mine, Unpacked};
use super::plan::{Caps, Facts};
use crate::comm::Collective;
use crate::mpi::shm::Mailboxes;
use crate::mpi::SendComm;

/// Tags of the stage's point-to-point messages. Messages between two processes with one
/// tag arrive in the order they were sent, so a stage's many messages of one tag match
/// their receives in order; stages follow each other on one communicator per group.
pub(super) const TAG_FIRST: i32 = 1;
pub(super) const TAG_SCATTER: i32 = 2;
pub(super) const TAG_GATHER: i32 = 3;

/// What the leader of a group's ranks in one process keeps from stage to stage.
pub(super) struct Leader {
    pub(super) comm: SendComm,
    /// The first round's mailboxes in shared memory, when every process is on this
    /// machine; otherwise the round goes by MPI messages through `send` and `inbox`.
    pub(super) mailboxes: Option<Mailboxes>,
    /// What the leader sends: its record and small data, or an allgather's regions.
    pub(super) send: Bytes,
    /// Each process's record and small data, by process.
    pub(super) inbox: Vec<Bytes>,
    /// A large reduction's chunks of the other processes' ranks.
    pub(super) scratch: Bytes,
    pub(super) headers: Vec<u64>,
}

impl Leader {
    pub(super) fn new(comm: SendComm, mailboxes: Option<Mailboxes>) -> Self {
        Self {
            comm,
            mailboxes,
            send: Bytes::default(),
            inbox: Vec::new(),
            scratch: Bytes::default(),
            headers: Vec::new(),
        }
    }

    /// Process `q`'s message in the last first round: its record, then its data if it
    /// carried any (aligned for every element type).
    pub(super) fn message(&self, q: usize) -> &[u8] {
        match &self.mailboxes {
            Some(boxes) => boxes.inbox(q),
            None => self
                .inbox
                .get(q)
                .map_or(&[], |b| bytemuck::cast_slice(&b.0)),
        }
    }
}

/// Whether the group was aborted: the leader's waits in an agreement give up.
#[derive(Clone, Copy)]
pub(super) struct Stop<'a>(pub(super) &'a AtomicBool);

impl Stop<'_> {
    #[inline]
    pub(super) fn now(self) -> bool {
        self.0.load(Acquire)
    }
}

/// The parts of a stage the leader works on between the two meetings of the board, each
/// borrowed apart from the others.
pub(super) struct Parts<'a> {
    /// The group's layout.
    pub(super) caps: &'a Caps,
    /// The facts of the leader's header, which are those of the header every rank agrees
    /// on (if they agree).
    pub(super) facts: Facts,
    pub(super) collective: Collective,
    pub(super) leader: &'a mut Leader,
    /// Every rank's post, by local rank.
    pub(super) posts: &'a [MutexGuard<'a, Post>],
    /// The leader's own regions (its inputs, and the results of a plan that leaves them
    /// there), and its outputs.
    pub(super) mine: Mine<'a>,
    pub(super) outs: Mine<'a>,
    /// The leader's lent values it did not pack into `mine`.
    pub(super) unpacked: Unpacked<'a>,
    pub(super) shared: &'a mut Shared,
    pub(super) stop: Stop<'a>,
}

/// `bytes` as the `i32` count of one MPI call, or why not.
#[inline]
pub(super) fn mpi_count(bytes: usize) -> Result<i32, String> {
    i32::try_from(bytes).map_err(|_| format!("{bytes} bytes are over MPI's 2 GiB per call"))
}

/// Waits for every request of a stage's payload, to the end: once every process has
/// agreed, the requests may use the leader's own regions, which could not be left to MPI.
/// A patient thread (the progress thread) tests and naps instead of waiting inside MPI,
/// which spins (see `mpi::wait::be_patient`).
pub(super) fn wait_all<'a, D: ?Sized, S: Scope<'a>>(requests: Vec<Request<'a, D, S>>) {
    if !crate::mpi::wait::patient() {
        for r in requests {
            r.wait();
        }
        return;
    }
    let mut pending = requests;
    let mut left = Vec::with_capacity(pending.len());
    let mut spins = 0;
    while !pending.is_empty() {
        left.extend(pending.drain(..).filter_map(|r| r.test().err()));
        std::mem::swap(&mut pending, &mut left);
        if !pending.is_empty() {
            crate::mpi::wait::idle(&mut spins);
        }
    }
}
