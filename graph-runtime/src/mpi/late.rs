//! After a timeout: the census that names the late ranks of every process.
//!
//! Each process's driver knows only where its own ranks were when its deadline passed. Every
//! process of a stuck group times out (they wait for each other in a stage, and call
//! `execute_timeout` with the same timeout), so each then sends its ranks' states to every
//! other process, on a communicator of the census's own: the group's own may hold a stage
//! that was given up on, whose messages a new one there could match.
//!
//! Messages from process to process rather than one collective, because the process that
//! made the others time out may be one that had not yet started the execution: it never
//! comes to the census, and a collective would tell the others nothing. With messages,
//! every process that comes hears from every other that comes, and each names the same
//! absent processes' ranks as the late ones.

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

    /// Every rank's state, by global rank, from `mine` (this process's ranks') and those
    /// the other processes sent within the grace: the timeout, at least [`MIN_GRACE`].
    /// Every rank of a process that sent nothing in that time is [`RankState::InCode`]:
    /// it was not in this execution's stage when the others timed out (or not yet in
    /// the census), so it is what they waited for. `None` if `mine` is not this process's
    /// share.
    pub(crate) fn take(&self, mine: &[RankState], timeout: Duration) -> Option<Vec<RankState>> {
        let deadline = Instant::now() + timeout.max(MIN_GRACE);
        // The others receive exactly this process's count of states.
        if self.counts.get(self.process) != Some(&mine.len()) {
            return None;
        }
        let mine: Vec<u8> = mine.iter().map(|&s| encode(s)).collect();
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let heard = wait::exchange(&comm.0, &mine, &self.counts, self.process, || {
            Instant::now() >= deadline
        });
        let mut every = Vec::with_capacity(self.counts.iter().sum());
        for (got, &n) in heard.into_iter().zip(&self.counts) {
            match got {
                Some(states) => {
                    for s in states {
                        every.push(decode(s)?);
                    }
                }
                None => every.extend(std::iter::repeat_n(RankState::InCode, n)),
            }
        }
        Some(every)
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
