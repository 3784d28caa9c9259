//! A queue of jobs that several ranks fill, one worker runs and every rank then reads: how
//! the ranks of a process hand a deferred stage to their group's progress thread and take
//! its results back (`mpi::comm::background`).
//!
//! Each rank numbers its jobs 0, 1, 2, ... in the order it posts them, and every rank posts
//! the same jobs in the same order, so job `seq` is the `seq`-th post of each. The worker
//! runs a job once every rank has posted it, in order; a rank reads a job once the worker
//! has run it, and the job is recycled once every rank has read it. A rank may post
//! further jobs before it reads an earlier one: nothing waits but the worker (for posts)
//! and a reader (for the worker). Jobs are boxed and recycled, so steady state allocates
//! nothing, and the worker runs a job outside the lock, while the ranks post the next.

use std::collections::VecDeque;
use std::sync::PoisonError;

use crate::sync::prims::{Condvar, Mutex, MutexGuard};

/// The jobs of `ranks` ranks and their worker.
pub(crate) struct Jobs<J> {
    ranks: usize,
    queue: Mutex<Queue<J>>,
    /// Rung when a job is posted by every rank, when one has run, on stop and on abort.
    bell: Condvar,
}

struct Queue<J> {
    entries: VecDeque<Entry<J>>,
    /// The number of the first entry.
    first: u64,
    /// The next job the worker runs.
    next: u64,
    /// Jobs every rank has read, for reuse.
    free: Vec<Box<J>>,
    stopped: bool,
}

struct Entry<J> {
    /// `None` while the worker runs it.
    job: Option<Box<J>>,
    posted: usize,
    ran: bool,
    read: usize,
}

impl<J: Default> Jobs<J> {
    pub(crate) fn new(ranks: usize) -> Self {
        Self {
            ranks,
            queue: Mutex::new(Queue {
                entries: VecDeque::new(),
                first: 0,
                next: 0,
                free: Vec::new(),
                stopped: false,
            }),
            bell: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue<J>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, queue: MutexGuard<'a, Queue<J>>) -> MutexGuard<'a, Queue<J>> {
        self.bell
            .wait(queue)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A rank's part in job `seq` (its `seq`-th post): `post` writes into it. `post` runs
    /// under the queue's lock: keep it to copying.
    pub(crate) fn post(&self, seq: u64, post: impl FnOnce(&mut J)) {
        let mut queue = self.lock();
        let q = &mut *queue;
        while q.first + q.entries.len() as u64 <= seq {
            let job = q.free.pop().unwrap_or_default();
            q.entries.push_back(Entry {
                job: Some(job),
                posted: 0,
                ran: false,
                read: 0,
            });
        }
        let Some(entry) = seq
            .checked_sub(q.first)
            .and_then(|at| q.entries.get_mut(at as usize))
        else {
            return; // read by every rank already: a rank posted out of turn
        };
        if let Some(job) = entry.job.as_deref_mut() {
            post(job);
        }
        entry.posted += 1;
        if entry.posted == self.ranks {
            self.bell.notify_all();
        }
    }

    /// For the worker: the next job, once every rank has posted it, to run and hand back
    /// with [`Jobs::ran`]; `None` once stopped.
    pub(crate) fn next(&self) -> Option<(u64, Box<J>)> {
        let mut queue = self.lock();
        loop {
            if queue.stopped {
                return None;
            }
            let seq = queue.next;
            let at = (seq - queue.first) as usize;
            let ranks = self.ranks;
            if let Some(entry) = queue.entries.get_mut(at).filter(|e| e.posted == ranks) {
                if let Some(job) = entry.job.take() {
                    queue.next += 1;
                    return Some((seq, job));
                }
            }
            queue = self.wait(queue);
        }
    }

    /// For the worker: job `seq`, run, back for the ranks to read.
    pub(crate) fn ran(&self, seq: u64, job: Box<J>) {
        let mut queue = self.lock();
        let first = queue.first;
        if let Some(entry) = queue.entries.get_mut((seq - first) as usize) {
            entry.job = Some(job);
            entry.ran = true;
        }
        self.bell.notify_all();
    }

    /// A rank's reading of job `seq` (its `seq`-th post) once the worker has run it: what
    /// `read` makes of it. `None` if `stop()` says to give up first (checked whenever the
    /// bell rings: [`Jobs::ring`] after setting what it reads).
    pub(crate) fn read<R>(
        &self,
        seq: u64,
        stop: impl Fn() -> bool,
        read: impl FnOnce(&J) -> R,
    ) -> Option<R> {
        let mut queue = self.lock();
        loop {
            let at = seq.checked_sub(queue.first)? as usize;
            let entry = queue.entries.get_mut(at)?;
            if entry.ran {
                let result = entry.job.as_deref().map(read);
                entry.read += 1;
                let q = &mut *queue;
                while q.entries.front().is_some_and(|e| e.read == self.ranks) {
                    if let Some(job) = q.entries.pop_front().and_then(|e| e.job) {
                        q.free.push(job);
                    }
                    q.first += 1;
                }
                return result;
            }
            if stop() {
                return None;
            }
            queue = self.wait(queue);
        }
    }

    /// Wakes every waiter, for them to look at what changed (an abort).
    pub(crate) fn ring(&self) {
        let _queue = self.lock();
        self.bell.notify_all();
    }

    /// Ends the worker's [`Jobs::next`]: it returns `None` from now on.
    pub(crate) fn stop(&self) {
        let mut queue = self.lock();
        queue.stopped = true;
        self.bell.notify_all();
    }
}
