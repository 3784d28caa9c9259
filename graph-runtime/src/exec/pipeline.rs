//! Several executions in flight: tickets, the bound on how many, and the results collected
//! ahead of the ticket that asks for them. Driver-side bookkeeping only; the actors' input
//! and output queues live in the [`Group`](super::Group)s.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::lock;
use crate::Error;

/// How a graph is launched: see `G::launch_with` on a generated graph type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchOptions {
    max_in_flight: usize,
    poll_runs_steps: bool,
    /// 0 until the launch divides the cores among the actors (see `resolve_threads`).
    compute_threads: usize,
    pin_threads: bool,
    overlap: bool,
}

impl Default for LaunchOptions {
    /// One execution in flight at a time, as `G::launch` does.
    fn default() -> Self {
        Self {
            max_in_flight: 1,
            poll_runs_steps: false,
            compute_threads: 0,
            pin_threads: false,
            overlap: true,
        }
    }
}

impl LaunchOptions {
    /// The most executions that may be submitted and not yet waited for (at least 1; 0 is
    /// taken as 1). Each actor keeps an input and an output queue of this capacity,
    /// allocated at launch.
    ///
    /// Executions in flight pay off when the steps are long, or when the actors outnumber
    /// the cores. For small steps with a core for every actor, `execute` is faster. It runs
    /// the first actor's step on the caller's thread, and a submitted execution cannot do
    /// that, since `submit` must not block. So on a 2-core machine with 4 B allreduces,
    /// 4 actors with 4 in flight take less time an execution than `execute`, and 2 actors
    /// with 4 in flight take several times more (see the pipelined rows of
    /// `BENCHMARKS.md`).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// The bound set by [`LaunchOptions::max_in_flight`].
    pub fn in_flight_bound(&self) -> usize {
        self.max_in_flight
    }

    /// Lets the thread that polls an `execute_async` (or a `wait_async`) with nothing
    /// else in flight run, to their end, the steps that no actor thread has started, when
    /// the actor threads outnumber the cores, as `execute` does (off by default). On a
    /// machine with fewer cores than the threads a graph needs, this spares the executor
    /// and the actors their turns on the cores: an async execution of two small actors on
    /// two cores is several times faster with it (see the async rows of `BENCHMARKS.md`).
    ///
    /// Only for graphs whose steps are short and never wait for a task of the runtime
    /// that awaits them: such a step, run on that runtime's thread, would wait for a task
    /// that cannot run until it returns. Without this option an async execution never
    /// blocks its thread.
    pub fn poll_runs_steps(mut self, on: bool) -> Self {
        self.poll_runs_steps = on;
        self
    }

    /// Whether [`LaunchOptions::poll_runs_steps`] is on.
    pub fn polls_run_steps(&self) -> bool {
        self.poll_runs_steps
    }

    /// The threads each actor's compute may use (at least 1; 0 is taken as 1), where a
    /// launch otherwise divides the process's cores among its actors
    /// ([`threads::per_actor`](crate::threads::per_actor)): the value of `torchrun`'s
    /// `OMP_NUM_THREADS`. Methods read it from [`Ctx::compute_threads`](crate::Ctx); a
    /// launch from a process with one thread also sets it in the environment variables
    /// that rayon, candle, OpenMP and BLAS read ([`threads::THREAD_VARS`](crate::threads::THREAD_VARS)),
    /// where they are not set. See "Threads and cores" in the README.
    ///
    /// ```
    /// # use actorgraph::prelude::*;
    /// # struct Worker;
    /// # #[actor] impl Worker { fn threads(&mut self) -> usize { Ctx::current().unwrap().compute_threads() } }
    /// # graph! { G(workers: [Worker]) { workers.threads() } }
    /// let options = LaunchOptions::default().compute_threads(3);
    /// let mut g = G::launch_with(vec![Worker, Worker], Cpu, options)?;
    /// assert_eq!(g.execute()?, vec![3, 3]);
    /// # Ok::<(), actorgraph::Error>(())
    /// ```
    pub fn compute_threads(mut self, n: usize) -> Self {
        self.compute_threads = n.max(1);
        self
    }

    /// Pins each actor's thread to cores of its own (off by default): on Linux, a block of
    /// [`Ctx::compute_threads`](crate::Ctx) cores of the launching thread's CPU set per
    /// actor, the actors of every group and graph of the process taking the blocks in turn,
    /// around again when they outnumber the cores; elsewhere, nothing. A step that
    /// `execute` runs on its caller's thread (see [`LaunchOptions::max_in_flight`]) runs
    /// where the caller does.
    ///
    /// Pinning keeps an actor's data in its core's caches and stops the scheduler from
    /// moving it, which pays when the process has the cores to itself; on a shared
    /// machine, or with more actors than cores, it takes freedom the scheduler would use.
    pub fn pin_threads(mut self, on: bool) -> Self {
        self.pin_threads = on;
        self
    }

    /// Whether [`LaunchOptions::pin_threads`] is on.
    pub fn pins_threads(&self) -> bool {
        self.pin_threads
    }

    /// Lets a fused stage go on while the actor runs the calls after it that do not read
    /// its results (on by default): the stage starts where the graph has it, and its
    /// results are waited for at their first use, or at the end of the step. Which stages
    /// can go on is read from the graph; whether one does is the backend's (across
    /// processes, the MPI backend's). Off, every stage runs to its end before the actor's
    /// next call, as a graph written in that order would; the results are the same bit
    /// for bit either way. See "Overlapping communication" in the README.
    ///
    /// ```
    /// # use actorgraph::prelude::*;
    /// # struct Worker;
    /// # #[actor] impl Worker {
    /// #     fn grad(&mut self, x: f32) -> f32 { x }
    /// #     fn other(&mut self) -> f32 { 1.0 }
    /// # }
    /// graph! {
    ///     G(workers: [Worker], x: f32) {
    ///         let g = workers.grad(x);
    ///         let r = allreduce(g);       // starts here,
    ///         let o = workers.other();    // goes on while this runs,
    ///         (r, o)                      // and is waited for here.
    ///     }
    /// }
    /// let options = LaunchOptions::default().overlap(false);
    /// let mut g = G::launch_with(vec![Worker, Worker], Cpu, options)?;
    /// assert_eq!(g.execute(2.0)?, vec![(4.0, 1.0), (4.0, 1.0)]);
    /// # Ok::<(), actorgraph::Error>(())
    /// ```
    pub fn overlap(mut self, on: bool) -> Self {
        self.overlap = on;
        self
    }

    /// Whether [`LaunchOptions::overlap`] is on.
    pub fn overlaps(&self) -> bool {
        self.overlap
    }

    /// The value set by [`LaunchOptions::compute_threads`], or what the launch chose; `None`
    /// before a launch that chooses.
    pub fn threads_per_actor(&self) -> Option<usize> {
        (self.compute_threads > 0).then_some(self.compute_threads)
    }

    /// Called by a graph's launch, on its caller's thread, before any actor's thread starts:
    /// gives each actor its share of the cores among the process's `actors`, unless set,
    /// and sets the compute libraries' variables where that is sound
    /// ([`threads`](crate::threads)).
    #[doc(hidden)]
    pub fn resolve_threads(mut self, actors: usize) -> Self {
        if self.compute_threads == 0 {
            self.compute_threads = crate::threads::per_actor(actors);
        }
        crate::threads::set_library_threads(self.compute_threads);
        self
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
            let mut abandoned = lock(&self.book.abandoned);
            abandoned.push(self.seq);
            self.book.pending.store(abandoned.len(), Ordering::Release);
        }
    }
}

/// What tickets share with their graph: the ones dropped unredeemed.
#[derive(Default)]
struct Book {
    abandoned: Mutex<Vec<u64>>,
    /// `abandoned`'s length, written under its lock: while it is 0 (a graph whose tickets
    /// are all redeemed, or that only `execute`s), the pipeline reads it instead of taking
    /// the lock, at each of its steps. A ticket dropped on another thread meanwhile is
    /// seen at the next step, as it would be had it been dropped just after the lock.
    pending: AtomicUsize,
}

impl Book {
    /// The abandoned tickets, locked; `None`, without locking, when there are none.
    fn abandoned(&self) -> Option<std::sync::MutexGuard<'_, Vec<u64>>> {
        (self.pending.load(Ordering::Acquire) > 0).then(|| lock(&self.abandoned))
    }
}

/// A graph's executions in flight: the ones still running on the actors (`collected..next`,
/// in submission order) and the results collected from the groups but not yet handed to
/// their tickets. Both count against the bound: a result waiting for its ticket holds its
/// execution's room until it is read or its ticket dropped.
pub struct Pipeline<T> {
    book: Arc<Book>,
    max: usize,
    /// Results collected ahead of their tickets, with their submission index; at most
    /// `max`, and removed as soon as they are handed out or abandoned.
    held: VecDeque<(u64, Result<T, Error>)>,
    /// The index of the oldest execution still running: every earlier one is collected.
    collected: u64,
    /// The next submission's index.
    next: u64,
    /// The index of the [`Pipeline::issue_direct`] execution not yet collected: only
    /// between the two calls, unless the `execute` that issued it unwound in between.
    /// Then it counts as abandoned, as a ticket dropped while unwinding would.
    direct: Option<u64>,
}

impl<T> Pipeline<T> {
    /// An empty pipeline with room for `options.max_in_flight` executions.
    pub fn new(options: LaunchOptions) -> Self {
        let max = options.max_in_flight;
        Self {
            book: Arc::new(Book {
                abandoned: Mutex::new(Vec::with_capacity(max)),
                pending: AtomicUsize::new(0),
            }),
            max,
            held: VecDeque::with_capacity(max),
            collected: 0,
            next: 0,
            direct: None,
        }
    }

    /// Executions submitted whose results are neither read nor discarded: still running,
    /// or collected and waiting for their tickets.
    pub fn in_flight(&self) -> usize {
        // Both parts are at most `max`, so they fit.
        (self.next - self.collected) as usize + self.held.len()
    }

    /// Whether the pipeline is full and the oldest execution still running was abandoned
    /// (its ticket dropped): the caller then collects it (with
    /// [`Pipeline::push_collected`]), which discards it and makes room for one more.
    pub fn must_drain(&mut self) -> bool {
        self.retire();
        self.in_flight() >= self.max
            && self.collected < self.next
            && self
                .book
                .abandoned()
                .is_some_and(|a| a.contains(&self.collected))
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

    /// Records a submission made with nothing else in flight whose result goes straight
    /// to its caller, with no ticket: an `execute`'s, collected by the same call, which
    /// then calls [`Pipeline::collected_direct`] instead of
    /// [`Pipeline::push_collected`]. Its submission index.
    pub fn issue_direct(&mut self) -> u64 {
        debug_assert_eq!(self.in_flight(), 0);
        let seq = self.next;
        self.next += 1;
        self.direct = Some(seq);
        seq
    }

    /// The execution of [`Pipeline::issue_direct`] is collected, its result handed to its
    /// caller.
    pub fn collected_direct(&mut self) {
        debug_assert_eq!(self.collected + 1, self.next);
        self.direct = None;
        self.collected += 1;
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
        ticket.seq >= self.collected
    }

    /// The result of the oldest execution still running, just collected: kept for its
    /// ticket, or discarded if the ticket was dropped.
    pub fn push_collected(&mut self, result: Result<T, Error>) {
        let seq = self.collected;
        self.collected += 1;
        if let Some(mut abandoned) = self.book.abandoned() {
            if let Some(i) = abandoned.iter().position(|&s| s == seq) {
                abandoned.swap_remove(i);
                self.book.pending.store(abandoned.len(), Ordering::Release);
                return;
            }
        }
        self.held.push_back((seq, result));
    }

    /// The result for `ticket`, once collected (see [`Pipeline::needs_collect`]).
    pub fn take(&mut self, mut ticket: Ticket) -> Result<T, Error> {
        ticket.redeemed = true;
        let result = self
            .held
            .iter()
            .position(|&(seq, _)| seq == ticket.seq)
            .and_then(|i| self.held.remove(i))
            .map(|(_, result)| result);
        // A ticket is redeemed once (it is not `Clone`) and collected before it is taken,
        // so its result is there; the fallback is unreachable but not a panic.
        result.unwrap_or(Err(Error::ForeignTicket))
    }

    /// Whether an execution submitted is still running on the actors (not yet collected
    /// from the groups): the caller then collects the oldest (with
    /// [`Pipeline::push_collected`]) and asks again.
    pub fn is_running(&mut self) -> bool {
        self.retire();
        self.collected < self.next
    }

    /// Discards the held results whose tickets were dropped since they were collected.
    fn retire(&mut self) {
        if let Some(seq) = self.direct.take() {
            let mut abandoned = lock(&self.book.abandoned);
            abandoned.push(seq);
            self.book.pending.store(abandoned.len(), Ordering::Release);
        }
        let Some(mut abandoned) = self.book.abandoned() else {
            return;
        };
        let collected = self.collected;
        self.held.retain(|(seq, _)| !abandoned.contains(seq));
        abandoned.retain(|&seq| seq >= collected);
        self.book.pending.store(abandoned.len(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect_one(p: &mut Pipeline<u64>) {
        let seq = p.collected;
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
        assert_eq!(p.in_flight(), 2, "t0 held, t2 running");
        assert_eq!(p.take(t0).ok(), Some(0));
        assert_eq!(p.in_flight(), 1);
        p.room().ok();
        // An abandoned ticket's result is discarded once collected.
        drop(t2);
        assert!(!p.must_drain());
        collect_one(&mut p);
        assert_eq!(p.in_flight(), 0);
    }

    /// Reading the newest result first leaves the older ones held for their tickets: they
    /// count, the one read does not, and its room is free at once.
    #[test]
    fn a_result_read_out_of_order_frees_its_room() {
        let mut p = Pipeline::new(LaunchOptions::default().max_in_flight(4));
        let mut tickets: Vec<Ticket> = (0..4).map(|_| p.issue()).collect();
        let newest = tickets.pop().unwrap();
        while p.needs_collect(&newest) {
            collect_one(&mut p);
        }
        assert_eq!(p.take(newest).ok(), Some(3));
        assert_eq!(p.in_flight(), 3);
        assert!(p.room().is_ok());
        let t4 = p.issue();
        assert!(p.room().is_err(), "three held and one running fill it");
        // A held result whose ticket is dropped frees its room too.
        drop(tickets.remove(1));
        assert_eq!(p.in_flight(), 4, "counted until the pipeline looks");
        assert!(p.room().is_ok());
        assert_eq!(p.in_flight(), 3);
        for (t, want) in tickets.into_iter().zip([0, 2]) {
            assert_eq!(p.take(t).ok(), Some(want));
        }
        while p.needs_collect(&t4) {
            collect_one(&mut p);
        }
        assert_eq!(p.take(t4).ok(), Some(4));
        assert_eq!(p.in_flight(), 0);
    }

    /// An `execute`'s direct execution takes its index in submission order between the
    /// tickets', and the book of abandoned tickets is looked at, and emptied, as before.
    #[test]
    fn a_direct_execution_takes_its_place_between_tickets() {
        let mut p = Pipeline::new(LaunchOptions::default().max_in_flight(2));
        drop(p.issue());
        assert_eq!(p.book.pending.load(Ordering::Acquire), 1);
        assert!(!p.must_drain(), "one of two in flight: room left");
        collect_one(&mut p);
        assert_eq!(p.in_flight(), 0, "the abandoned result is discarded");
        assert_eq!(p.book.pending.load(Ordering::Acquire), 0);
        assert_eq!(p.issue_direct(), 1);
        assert_eq!(p.in_flight(), 1);
        p.collected_direct();
        assert_eq!(p.in_flight(), 0);
        let t = p.issue();
        assert_eq!(t.index(), 2);
        collect_one(&mut p);
        assert_eq!(p.take(t).ok(), Some(2));
        assert_eq!(p.in_flight(), 0);
        // An `execute` that unwound between the two calls left its execution in flight:
        // abandoned, it is drained (collected and discarded) once the pipeline is full.
        assert_eq!(p.issue_direct(), 3);
        assert!(p.room().is_ok(), "one of two in flight");
        let t = p.issue();
        assert!(p.must_drain(), "full, and its oldest abandoned");
        collect_one(&mut p);
        assert_eq!(p.in_flight(), 1, "only the ticket's execution left");
        collect_one(&mut p);
        assert_eq!(p.take(t).ok(), Some(4));
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
