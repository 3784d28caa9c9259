//! After a timeout: the census that names the late ranks of every process.
//!
//! Each process's driver knows only where its own ranks were when its deadline passed. Every
//! process of a stuck group times out (they wait for each other in a stage, and call
//! `execute_timeout` with the same timeout), so each then brings its ranks' states to one
//! `MPI_Iallgatherv` on a communicator of the census's own: the group's own may hold a
//! stage that was given up on, and a new collective there would be matched with it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::wait;
use super::SendComm;
use crate::comm::RankState;

/// The least time a census waits for the other processes: they time out at about the same
/// moment, give or take how far apart their `execute_timeout` calls began.
pub(super) const MIN_GRACE: Duration = Duration::from_secs(2);

/// A group's census: its communicator, and its ranks in each process.
pub(crate) struct Census {
    comm: Mutex<SendComm>,
    counts: Vec<usize>,
    process: usize,
}

impl Census {
    pub(crate) fn new(comm: SendComm, counts: Vec<usize>, process: usize) -> Self {
        Self {
            comm: Mutex::new(comm),
            counts,
            process,
        }
    }

    /// Every rank's state, by global rank, from `mine` (this process's ranks'), or `None`
    /// if the other processes did not all come within the grace: the timeout, at least
    /// [`MIN_GRACE`].
    pub(crate) fn take(&self, mine: &[RankState], timeout: Duration) -> Option<Vec<RankState>> {
        let deadline = Instant::now() + timeout.max(MIN_GRACE);
        // MPI would read past `mine` otherwise.
        if self.counts.get(self.process) != Some(&mine.len()) {
            return None;
        }
        let counts: Vec<i32> = self
            .counts
            .iter()
            .map(|&n| i32::try_from(n).ok())
            .collect::<Option<_>>()?;
        let displs = wait::displacements(&counts)?;
        let total = self.counts.iter().sum();
        let mut all = vec![0u8; total];
        let mine: Vec<u8> = mine.iter().map(|&s| encode(s)).collect();
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        wait::all_gather_varcount(&comm.0, &mine, counts, displs, &mut all, || {
            Instant::now() >= deadline
        })
        .ok()?;
        all.into_iter().map(decode).collect()
    }
}

fn encode(s: RankState) -> u8 {
    match s {
        RankState::Done => 0,
        RankState::InCode => 1,
        RankState::InCollective => 2,
        RankState::OnEdge => 3,
    }
}

fn decode(b: u8) -> Option<RankState> {
    Some(match b {
        0 => RankState::Done,
        1 => RankState::InCode,
        2 => RankState::InCollective,
        3 => RankState::OnEdge,
        _ => return None,
    })
}
