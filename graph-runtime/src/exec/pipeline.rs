//! Several executions in flight: tickets, the bound on how many, and the results collected
//! ahead of the ticket that asks for them. Driver-side bookkeeping only; the actors' input
//! and output queues live in the [`Group`](super::Group)s.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};

use super::lock;
use crate::Error;

/// How a graph is launched: see `G::launch_with` on a generated graph type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchOptions {
    max_in_flight: usize,
}

impl Default for LaunchOptions {
    /// One execution in flight at a time, as `G::launch` does.
    fn default() -> Self {
        Self { max_in_flight: 1 }
    }
}

impl LaunchOptions {
    /// The most executions that may be submitted and not yet waited for (at least 1; 0 is
    /// taken as 1). Each actor keeps an input and an output queue of this capacity,
    /// allocated at launch.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// The bound set by [`LaunchOptions::max_in_flight`].
    pub fn in_flight_bound(&self) -> usize {
        self.max_in_flight
    }
}

/// A submitted execution, redeemed for its result with `G::wait` (or `G::wait_async`) on
/// the graph that issued it.
///
/// Dropping a ticket without waiting abandons its result: the execution still runs, and
/// the graph discards its result when it next needs the room.
#[must_use = "a ticket is redeemed with `wait` for its execution's result"]
pub struct Ticket {
    seq: u64,
    book: Arc<Book>,
    redeemed: bool,
}

impl Ticket {
    /// The ticket's position in submission order, counted from 0 for the graph's first
    /// submission (`execute` calls count too).
    pub fn index(&self) -> u64 {
        self.seq
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket").field("index", &self.seq).finish()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.redeemed {
            lock(&self.book.abandoned).push(self.seq);
        }
    }
}

/// What tickets share with their graph: the ones dropped unredeemed.
#[derive(Default)]
struct Book {
    abandoned: Mutex<Vec<u64>>,
}

/// A graph's executions in flight, oldest first: `base..collected` have been collected
/// from the groups (their results wait in `ready`), `collected..next` are still running.
pub struct Pipeline<T> {
    book: Arc<Book>,
    max: usize,
    /// The oldest execution whose result is neither handed out nor discarded.
    base: u64,
    /// Results of `base..base + ready.len()`; `None` once handed out.
    ready: VecDeque<Option<Result<T, Error>>>,
    /// The next submission's index.
    next: u64,
}

impl<T> Pipeline<T> {
    /// An empty pipeline with room for `options.max_in_flight` executions.
    pub fn new(options: LaunchOptions) -> Self {
        let max = options.max_in_flight;
        Self {
            book: Arc::new(Book {
                abandoned: Mutex::new(Vec::with_capacity(max)),
            }),
            max,
            base: 0,
            ready: VecDeque::with_capacity(max),
            next: 0,
        }
    }

    /// The bound set at launch.
    pub fn max_in_flight(&self) -> usize {
        self.max
    }

    /// Executions submitted whose results are neither handed out nor discarded.
    pub fn in_flight(&self) -> usize {
        // At most `max`, so it fits.
        (self.next - self.base) as usize
    }

    fn collected(&self) -> u64 {
        self.base + self.ready.len() as u64
    }

    /// Whether the oldest execution still running on the actors was abandoned (its ticket
    /// dropped) and is all that stands between a full pipeline and room for one more: the
    /// caller then collects it (with [`Pipeline::push_collected`]) to make room.
    pub fn must_drain(&mut self) -> bool {
        self.retire();
        self.in_flight() >= self.max
            && self.ready.is_empty()
            && lock(&self.book.abandoned).contains(&self.base)
    }

    /// [`Error::InFlightFull`] if there is no room for another submission.
    pub fn room(&mut self) -> Result<(), Error> {
        self.retire();
        if self.in_flight() < self.max {
            Ok(())
        } else {
            Err(Error::InFlightFull {
                max_in_flight: self.max,
            })
        }
    }

    /// Records a submission (made after [`Pipeline::room`] said yes) and returns its ticket.
    pub fn issue(&mut self) -> Ticket {
        let seq = self.next;
        self.next += 1;
        Ticket {
            seq,
            book: Arc::clone(&self.book),
            redeemed: false,
        }
    }

    /// [`Error::ForeignTicket`] if `ticket` comes from another graph.
    pub fn check(&self, ticket: &Ticket) -> Result<(), Error> {
        if Arc::ptr_eq(&ticket.book, &self.book) {
            Ok(())
        } else {
            Err(Error::ForeignTicket)
        }
    }

    /// Whether the result for `ticket` still has to be collected from the groups: collect
    /// the oldest execution still running and [`Pipeline::push_collected`] it, then ask
    /// again.
    pub fn needs_collect(&self, ticket: &Ticket) -> bool {
        ticket.seq >= self.collected()
    }

    /// The result of the oldest execution still running, just collected.
    pub fn push_collected(&mut self, result: Result<T, Error>) {
        self.ready.push_back(Some(result));
        self.retire();
    }

    /// The result for `ticket`, once collected (see [`Pipeline::needs_collect`]).
    pub fn take(&mut self, mut ticket: Ticket) -> Result<T, Error> {
        ticket.redeemed = true;
        let result = ticket
            .seq
            .checked_sub(self.base)
            .and_then(|k| self.ready.get_mut(k as usize))
            .and_then(Option::take);
        self.retire();
        // A ticket is redeemed once (it is not `Clone`) and collected before it is taken,
        // so its result is there; the fallback is unreachable but not a panic.
        result.unwrap_or(Err(Error::ForeignTicket))
    }

    /// Drops, from the front, results handed out or abandoned.
    fn retire(&mut self) {
        let mut abandoned = lock(&self.book.abandoned);
        while let Some(front) = self.ready.front() {
            let seq = self.base;
            let gone = front.is_none() || abandoned.contains(&seq);
            if !gone {
                break;
            }
            abandoned.retain(|&s| s != seq);
            self.ready.pop_front();
            self.base += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect_one(p: &mut Pipeline<u64>) {
        let seq = p.collected();
        p.push_collected(Ok(seq));
    }

    #[test]
    fn results_come_back_by_ticket_and_the_bound_holds() {
        let mut p = Pipeline::new(LaunchOptions::default().max_in_flight(3));
        let tickets: Vec<Ticket> = (0..3).map(|_| p.issue()).collect();
        assert!(matches!(
            p.room(),
            Err(Error::InFlightFull { max_in_flight: 3 })
        ));
        let mut tickets = tickets.into_iter();
        let (t0, t1, t2) = match (tickets.next(), tickets.next(), tickets.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => unreachable!(),
        };
        // Out of order: t1's wait collects t0's result ahead.
        while p.needs_collect(&t1) {
            collect_one(&mut p);
        }
        assert_eq!(p.take(t1).ok(), Some(1));
        assert_eq!(p.in_flight(), 3);
        assert_eq!(p.take(t0).ok(), Some(0));
        assert_eq!(p.in_flight(), 1);
        p.room().ok();
        // An abandoned ticket's result is discarded once collected.
        drop(t2);
        assert!(!p.must_drain());
        collect_one(&mut p);
        assert_eq!(p.in_flight(), 0);
    }

    #[test]
    fn a_full_pipeline_of_abandoned_tickets_drains() {
        let mut p: Pipeline<u64> = Pipeline::new(LaunchOptions::default());
        drop(p.issue());
        assert!(p.room().is_err());
        assert!(p.must_drain());
        collect_one(&mut p);
        assert!(p.room().is_ok());
        let other: Pipeline<u64> = Pipeline::new(LaunchOptions::default());
        let t = p.issue();
        assert!(matches!(other.check(&t), Err(Error::ForeignTicket)));
        assert!(p.check(&t).is_ok());
        collect_one(&mut p);
        assert_eq!(p.take(t).ok(), Some(1));
    }
}
