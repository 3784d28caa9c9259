//! The driver of a launched graph: one generic owner of its groups and of its executions in
//! flight, behind every generated graph's `execute`, `submit`, `wait`, their async and
//! timed variants, `in_flight` and teardown. A generated graph keeps only what is its own
//! (its types, its steps, how its inputs reach its groups and how its groups' outputs make
//! its output) and forwards its methods here, so that this code is compiled and reviewed
//! once, not emitted for every graph.
//!
//! A graph's groups are a list, `(Group<A1, I1, O1>, (Group<A2, I2, O2>, ()))`, so that one
//! implementation of [`Groups`] serves any number of groups.

use std::future::{poll_fn, Future};
use std::marker::PhantomData;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::{Ctx, Deadline, Deal, Group, LaunchOptions, Pipeline, Ticket};
use crate::trace::{self, Call, GraphName};
use crate::{BoxError, Error};

/// The actor groups of a graph as a list (see the module docs), in declaration order: what
/// the driver does to every group.
pub trait Groups {
    /// Each group's input, as a list like the groups.
    type Inputs;
    /// Each group's outputs by rank, as a list like the groups.
    type Outputs;

    /// An error if a group cannot run (the first one's, in declaration order).
    fn ready(&self) -> Result<(), Error>;
    /// Breaks every group for good (see [`Group::mark_broken`]).
    fn mark_broken(&mut self, reason: &str);
    /// An error if a group's input cannot give each of its actors theirs (see
    /// [`Deal::check`]), checked for every group before any is submitted.
    fn check(&self, inputs: &Self::Inputs) -> Result<(), Error>;
    /// Queues each group's input and starts its actors (see [`Group::submit`]).
    fn submit(&mut self, inputs: Self::Inputs);
    /// [`Groups::submit`] with nothing else in flight, letting the next collect of each
    /// group run the steps that no actor thread has started; with `hold_first`, the first
    /// group's first actor's step may be left for [`Groups::run_held`] to run on this
    /// thread: whether it was (see [`Group::submit_helped`]).
    fn submit_helped(&mut self, inputs: Self::Inputs, hold_first: bool) -> bool;
    /// Runs the step that [`Groups::submit_helped`] left, on this thread.
    fn run_held(&mut self);
    /// Collects the oldest execution in flight from every group, even after one failed, so
    /// that all stay at the same execution; each failure is pushed to `errors`, in group
    /// order, and then `None` is returned.
    fn collect(
        &mut self,
        deadline: Option<Deadline>,
        errors: &mut Vec<Error>,
    ) -> Option<Self::Outputs>;
    /// Runs on this thread the steps that no actor thread has started (see
    /// [`Group::help`]).
    fn help(&self);
    /// Registers an async execution's waker with every group.
    fn register_waker(&self, waker: &Waker);
    /// Whether every group has finished the oldest execution not yet collected.
    fn is_done(&self) -> bool;
    /// The ranks of this process's actors of group `name` and the group's size (see
    /// [`Group::ranks`]); `None` if the graph has no such group.
    fn ranks(&self, name: &str) -> Option<(std::ops::Range<usize>, usize)>;
}

impl Groups for () {
    type Inputs = ();
    type Outputs = ();

    fn ready(&self) -> Result<(), Error> {
        Ok(())
    }
    fn mark_broken(&mut self, _: &str) {}
    fn check(&self, (): &()) -> Result<(), Error> {
        Ok(())
    }
    fn submit(&mut self, (): ()) {}
    fn submit_helped(&mut self, (): (), _: bool) -> bool {
        false
    }
    fn run_held(&mut self) {}
    fn help(&self) {}
    fn collect(&mut self, _: Option<Deadline>, _: &mut Vec<Error>) -> Option<()> {
        Some(())
    }
    fn register_waker(&self, _: &Waker) {}
    fn is_done(&self) -> bool {
        true
    }
    fn ranks(&self, _: &str) -> Option<(std::ops::Range<usize>, usize)> {
        None
    }
}

impl<A, I, O, R> Groups for (Group<A, I, O>, R)
where
    A: 'static,
    I: Deal,
    O: Send + 'static,
    R: Groups,
{
    type Inputs = (I::Whole, R::Inputs);
    type Outputs = (Vec<O>, R::Outputs);

    fn ready(&self) -> Result<(), Error> {
        self.0.ready()?;
        self.1.ready()
    }

    fn mark_broken(&mut self, reason: &str) {
        self.0.mark_broken(reason);
        self.1.mark_broken(reason);
    }

    fn check(&self, (input, rest): &Self::Inputs) -> Result<(), Error> {
        I::check(input, self.0.name(), self.0.len())?;
        self.1.check(rest)
    }

    fn submit(&mut self, (input, rest): Self::Inputs) {
        self.0.submit(input);
        self.1.submit(rest);
    }

    fn submit_helped(&mut self, (input, rest): Self::Inputs, hold_first: bool) -> bool {
        // One step held at most: a second one could wait on an edge from the first. The
        // steps that no thread has started may be run in any group as it is collected.
        let held = self.0.submit_helped(input, hold_first);
        self.1.submit_helped(rest, false);
        held
    }

    fn run_held(&mut self) {
        self.0.run_held();
    }

    fn collect(
        &mut self,
        deadline: Option<Deadline>,
        errors: &mut Vec<Error>,
    ) -> Option<Self::Outputs> {
        let head = self.0.collect(deadline).map_err(|e| errors.push(e)).ok();
        let rest = self.1.collect(deadline, errors);
        Some((head?, rest?))
    }

    fn help(&self) {
        self.0.help();
        self.1.help();
    }

    fn register_waker(&self, waker: &Waker) {
        self.0.register_waker(waker);
        self.1.register_waker(waker);
    }

    fn is_done(&self) -> bool {
        self.0.is_done() && self.1.is_done()
    }

    fn ranks(&self, name: &str) -> Option<(std::ops::Range<usize>, usize)> {
        if self.0.name() == name {
            Some(self.0.ranks())
        } else {
            self.1.ranks(name)
        }
    }
}

/// Handing the actors back, for groups whose actors are `Send`: each group's actors by
/// rank, as a list like the groups.
pub trait Teardown: Groups {
    /// What [`Teardown::teardown`] returns.
    type Actors;
    /// What [`Teardown::teardown_each`] returns.
    type Each;

    /// Stops every group in declaration order and hands its actors back; the first
    /// group's error if any actor is not intact (see [`Group::teardown`]).
    fn teardown(self) -> Result<Self::Actors, Error>;
    /// Stops every group in declaration order and hands back each actor that is intact,
    /// and why not for each other (see [`Group::teardown_each`]).
    fn teardown_each(self) -> Self::Each;
}

impl Teardown for () {
    type Actors = ();
    type Each = ();

    fn teardown(self) -> Result<(), Error> {
        Ok(())
    }
    fn teardown_each(self) {}
}

impl<A, I, O, R> Teardown for (Group<A, I, O>, R)
where
    A: Send + 'static,
    I: Deal,
    O: Send + 'static,
    R: Teardown,
{
    type Actors = (Vec<A>, R::Actors);
    type Each = (Vec<Result<A, Error>>, R::Each);

    fn teardown(self) -> Result<Self::Actors, Error> {
        // Every group stops, even after one failed.
        let head = self.0.teardown();
        let rest = self.1.teardown();
        Ok((head?, rest?))
    }

    fn teardown_each(self) -> Self::Each {
        let head = self.0.teardown_each();
        (head, self.1.teardown_each())
    }
}

/// The type of graph `Self`'s [`Driver`], which is spelled in the graph's block (where the
/// graph's checked types have names), for its struct to name it (see [`Driven`]). `P` is
/// only there for privacy, as in [`Checked`](crate::__private::Checked).
///
/// It also names the graph's output on one rank, for the public alias (`<Graph>Output`)
/// that the graph's methods return: an alias outside the block can reach that type only
/// through an impl.
pub trait GraphDriver<P: ?Sized> {
    /// The graph's [`Driver`].
    type Driver;
    /// One rank's output of the graph.
    type Output;
}

/// The driver of graph `G`, as the graph's struct holds it.
///
/// Its last field is a `PhantomData`, so that whether it is sized is known without
/// resolving `G`'s driver type: resolving that type evaluates the graph's type checks,
/// which ask whether the graph's struct is sized, which would then ask for that type
/// again (a cycle). Generated code reaches the driver as `.0`, not through a `Deref`: when
/// a check failed, the field's type is an error, and a method called on it reports nothing
/// more.
pub struct Driven<G: GraphDriver<P>, P: ?Sized>(pub G::Driver, PhantomData<fn(*const P)>);

impl<G, P, Gs, In, Out> Driven<G, P>
where
    G: GraphDriver<P, Driver = Driver<Gs, In, Out>>,
    P: ?Sized,
    Gs: Groups,
{
    /// The driver of graph `G`'s groups, just launched (see [`Driver::new`]).
    pub fn new(
        groups: Gs,
        options: LaunchOptions,
        split: fn(In) -> Gs::Inputs,
        assemble: fn(Gs::Outputs) -> Vec<Out>,
    ) -> Self {
        let mut driver = Driver::new(groups, options, split, assemble);
        driver.name = GraphName::of::<G>();
        Self(driver, PhantomData)
    }
}

/// A launched graph's driver: its groups `G`, the executions in flight, and the graph's
/// own two conversions: its inputs `In` into each group's (`split`, which clones an input
/// that several groups read), and its groups' outputs into its output by rank, of `Out`
/// per rank (`assemble`).
pub struct Driver<G: Groups, In, Out> {
    groups: G,
    /// Set while inputs are handed out: still set at the next submission only if the last
    /// one unwound in between (some actors may have got it and others not), which breaks
    /// the graph.
    executing: bool,
    /// The executions in flight, their tickets and the results collected ahead.
    pipeline: Pipeline<Vec<Out>>,
    split: fn(In) -> G::Inputs,
    assemble: fn(G::Outputs) -> Vec<Out>,
    /// The graph's name in its trace spans (nothing without the feature `tracing`).
    name: GraphName,
    /// Whether an async execution with nothing else in flight may run steps on the thread
    /// that polls it ([`LaunchOptions::poll_runs_steps`]).
    poll_runs_steps: bool,
}

impl<G: Groups, In, Out> Driver<G, In, Out> {
    /// The driver of `groups`, just launched with `options`.
    pub fn new(
        groups: G,
        options: LaunchOptions,
        split: fn(In) -> G::Inputs,
        assemble: fn(G::Outputs) -> Vec<Out>,
    ) -> Self {
        Self {
            groups,
            executing: false,
            pipeline: Pipeline::new(options),
            split,
            assemble,
            poll_runs_steps: options.polls_run_steps(),
            name: GraphName::UNNAMED,
        }
    }

    /// Runs one execution and returns its output by rank.
    ///
    /// This thread runs the first actor's step itself when it may (see `exec::help`),
    /// rather than only handing it over and waiting.
    pub fn execute(&mut self, inputs: In) -> Result<Vec<Out>, Error> {
        let span = trace::driver(Call::Execute, self.name);
        self.execute_by(inputs, None, span.span())
    }

    /// [`Driver::execute`]; ranks still running when `timeout` passes make it
    /// [`Error::Timeout`] (and break the graph). This thread runs no actor's step: it must
    /// stay free to give up on late ranks.
    pub fn execute_timeout(&mut self, inputs: In, timeout: Duration) -> Result<Vec<Out>, Error> {
        let span = trace::driver(Call::Execute, self.name);
        self.execute_by(inputs, Some(Deadline::after(timeout)), span.span())
    }

    /// Submits one execution and returns its ticket; [`Error::InFlightFull`] if there is
    /// no room for it.
    pub fn submit(&mut self, inputs: In) -> Result<Ticket, Error> {
        let span = trace::driver(Call::Submit, self.name);
        self.submit_by(inputs, None, span.span())
    }

    /// The output (or error) of the execution of `ticket`, collecting the ones submitted
    /// before it first; [`Error::ForeignTicket`] if another graph issued it.
    pub fn wait(&mut self, ticket: Ticket) -> Result<Vec<Out>, Error> {
        let span = trace::driver(Call::Wait, self.name);
        trace::execution(span.span(), ticket.index());
        self.wait_by(ticket, None)
    }

    /// [`Driver::execute`] as a future that submits on its first poll and waits without
    /// blocking its thread: the actors wake it as they finish.
    ///
    /// With [`LaunchOptions::poll_runs_steps`], the thread that polls may run steps.
    ///
    /// (Not an `async fn`: without the feature `tracing`, the future is `run_async`'s
    /// itself, with no layer around it.)
    pub fn execute_async(
        &mut self,
        inputs: In,
    ) -> impl Future<Output = Result<Vec<Out>, Error>> + '_ {
        let span = trace::execute_async(self.name);
        trace::instrument(self.run_async(inputs, span.clone()), span)
    }

    async fn run_async(&mut self, inputs: In, span: trace::Span) -> Result<Vec<Out>, Error> {
        while self.pipeline.must_drain() {
            poll_fn(|cx| self.poll_done(cx, false)).await;
            self.finish_oldest(None);
        }
        let ticket = self.start(inputs, false)?;
        trace::execution(&span, ticket.index());
        self.wait_async(ticket).await
    }

    /// [`Driver::wait`] as a future that waits without blocking its thread (unless
    /// [`LaunchOptions::poll_runs_steps`]).
    pub async fn wait_async(&mut self, ticket: Ticket) -> Result<Vec<Out>, Error> {
        self.pipeline.check(&ticket)?;
        while self.pipeline.needs_collect(&ticket) {
            let help = self.poll_runs_steps && self.pipeline.in_flight() == 1;
            poll_fn(|cx| self.poll_done(cx, help)).await;
            self.finish_oldest(None);
        }
        self.pipeline.take(ticket)
    }

    /// The executions submitted whose results are neither read nor discarded yet.
    pub fn in_flight(&self) -> usize {
        self.pipeline.in_flight()
    }

    /// The ranks, in the whole group, of the actors of group `group` that this process
    /// hosts (see [`Group::ranks`]); `None` if the graph has no such group.
    pub fn ranks(&self, group: &str) -> Option<std::ops::Range<usize>> {
        self.groups.ranks(group).map(|(r, _)| r)
    }

    /// The number of actors of group `group` in every process together; `None` if the
    /// graph has no such group.
    pub fn group_size(&self, group: &str) -> Option<usize> {
        self.groups.ranks(group).map(|(_, n)| n)
    }

    /// Runs `f` once on every actor of one group of this process (the group `group` picks
    /// from the list), each on its own thread, and returns the values by rank, as
    /// [`Group::try_each`] does. Every execution submitted is collected first, its result
    /// kept for its ticket, so `f` runs after them and an execution submitted later sees
    /// what it changed.
    pub fn try_each<A, I, O, R, F>(
        &mut self,
        group: fn(&mut G) -> &mut Group<A, I, O>,
        f: F,
    ) -> Result<Vec<R>, Error>
    where
        A: 'static,
        I: Deal,
        O: Send + 'static,
        F: Fn(Ctx, &mut A) -> Result<R, BoxError> + Send + Sync + 'static,
        R: Send + 'static,
    {
        while self.pipeline.is_running() {
            self.finish_oldest(None);
        }
        if self.executing {
            self.groups.mark_broken(
                "an earlier `execute` panicked in the driver (an input's `Clone`?) before every actor had its input",
            );
        }
        group(&mut self.groups).try_each(f)
    }

    /// [`Driver::try_each`] with a closure that cannot return an error (it may panic).
    pub fn each<A, I, O, R, F>(
        &mut self,
        group: fn(&mut G) -> &mut Group<A, I, O>,
        f: F,
    ) -> Result<Vec<R>, Error>
    where
        A: 'static,
        I: Deal,
        O: Send + 'static,
        F: Fn(Ctx, &mut A) -> R + Send + Sync + 'static,
        R: Send + 'static,
    {
        self.try_each(group, move |ctx, actor| Ok(f(ctx, actor)))
    }

    /// Hands the actors back (see [`Teardown`]).
    pub fn teardown(self) -> Result<G::Actors, Error>
    where
        G: Teardown,
    {
        self.groups.teardown()
    }

    /// Hands back each actor that is intact, and why not for each other (see
    /// [`Teardown`]).
    pub fn teardown_each(self) -> G::Each
    where
        G: Teardown,
    {
        self.groups.teardown_each()
    }

    /// `span`: the caller's, which gets the execution's index.
    fn execute_by(
        &mut self,
        inputs: In,
        deadline: Option<Deadline>,
        span: &trace::Span,
    ) -> Result<Vec<Out>, Error> {
        while self.pipeline.must_drain() {
            self.finish_oldest(deadline);
        }
        if self.pipeline.in_flight() == 0 {
            // Nothing else in flight: the result goes straight back, with no ticket to
            // issue and redeem through the pipeline's book.
            self.begin(inputs, deadline.is_none())?;
            let seq = self.pipeline.issue_direct();
            trace::execution(span, seq);
            let result = self.finish(deadline);
            self.pipeline.collected_direct();
            return result;
        }
        let ticket = self.start(inputs, false)?;
        trace::execution(span, ticket.index());
        self.wait_by(ticket, deadline)
    }

    /// `span`: the caller's, which gets the execution's index.
    fn submit_by(
        &mut self,
        inputs: In,
        deadline: Option<Deadline>,
        span: &trace::Span,
    ) -> Result<Ticket, Error> {
        while self.pipeline.must_drain() {
            self.finish_oldest(deadline);
        }
        let ticket = self.start(inputs, false)?;
        trace::execution(span, ticket.index());
        Ok(ticket)
    }

    /// Starts one execution, once the pipeline has been drained as it requires: its
    /// ticket, or [`Error::InFlightFull`] if there is no room for it. With `help`, this
    /// thread may run the first actor's step before it returns.
    fn start(&mut self, inputs: In, help: bool) -> Result<Ticket, Error> {
        self.pipeline.room()?;
        self.begin(inputs, help)?;
        Ok(self.pipeline.issue())
    }

    fn wait_by(&mut self, ticket: Ticket, deadline: Option<Deadline>) -> Result<Vec<Out>, Error> {
        self.pipeline.check(&ticket)?;
        while self.pipeline.needs_collect(&ticket) {
            self.finish_oldest(deadline);
        }
        self.pipeline.take(ticket)
    }

    /// Hands the inputs to every actor of every group, behind the executions in flight;
    /// with `help` and nothing else in flight, runs the first actor's step on this thread.
    fn begin(&mut self, inputs: In, help: bool) -> Result<(), Error> {
        if self.executing {
            self.groups.mark_broken(
                "an earlier `execute` panicked in the driver (an input's `Clone`?) before every actor had its input",
            );
        }
        self.groups.ready()?;
        self.executing = true;
        let inputs = (self.split)(inputs);
        self.executing = false;
        // A refused input (a per-rank input of the wrong length) reaches no actor.
        self.groups.check(&inputs)?;
        self.executing = true;
        if help && self.pipeline.in_flight() == 0 {
            // Still `executing` while the step runs: should it unwind here, the next
            // execution finds the graph broken.
            if self.groups.submit_helped(inputs, true) {
                self.groups.run_held();
            }
        } else {
            self.groups.submit(inputs);
        }
        self.executing = false;
        Ok(())
    }

    /// Collects the oldest execution in flight from every group (waiting for it, up to
    /// `deadline`) and hands its output, or its root-cause error, to the pipeline.
    fn finish_oldest(&mut self, deadline: Option<Deadline>) {
        let result = self.finish(deadline);
        self.pipeline.push_collected(result);
    }

    fn finish(&mut self, deadline: Option<Deadline>) -> Result<Vec<Out>, Error> {
        self.groups.ready()?;
        let mut errors = Vec::new();
        match self.groups.collect(deadline, &mut errors) {
            Some(outputs) => Ok((self.assemble)(outputs)),
            // `collect` pushed the error of every group that failed.
            None => Err(Error::root_cause(errors).unwrap_or_else(|| {
                Error::Backend("internal error: an execution failed without an error".into())
            })),
        }
    }

    /// Ready when every actor of every group has finished the oldest execution not yet
    /// collected, or a group is broken (collecting then reports it). Before it returns
    /// `Pending`, it waits briefly for the actors, yielding and never parking (see
    /// `sync::briefly`, which bounds the wait): a small graph is done by then, and the
    /// executor is spared a park and a wake-up. The waker is registered only then, and
    /// the actors checked once more after it (see [`Group::register_waker`]): an execution
    /// found done while waiting costs neither side the waker's lock.
    fn poll_done(&self, cx: &mut Context<'_>, help: bool) -> Poll<()> {
        let ready = || self.groups.ready().is_err() || self.groups.is_done();
        if help {
            self.groups.help();
        }
        if crate::sync::briefly(ready) {
            return Poll::Ready(());
        }
        self.groups.register_waker(cx.waker());
        if ready() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}
