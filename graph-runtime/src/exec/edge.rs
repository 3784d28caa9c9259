//! Edges: values that cross from one actor's thread to another's.
//!
//! A graph value used by a method of other actors than the ones that hold it (a per-actor
//! value of group A read by group B, or a value of `workers[0]` read by `workers[1]`)
//! travels over an [`Edge`]: one slot per producer -> consumer pair, each holding at most one
//! message. The producer's step sends right after the value exists; the consumer's step
//! receives right before the method that reads it. The value itself moves (a `Tensor` is an
//! `Arc`, so nothing is copied); a value sent to several actors is cloned once per extra
//! receiver.
//!
//! Every execution puts exactly one message in every slot an actor is scheduled to fill,
//! even when the actor failed: it then sends a failure marker instead of the value (see
//! `StepCtx::drain`), and a consumer that failed takes and drops the message it was due.
//! So a slot is empty again at the end of every execution, nothing waits for a message that
//! will not come, and the consumer of a failed producer learns it and fails in turn.
//!
//! Messages carry the execution's round. A slot holds one message, so a producer that runs
//! ahead of its consumer (several executions in flight) waits for the slot to empty: the
//! edge is its own back-pressure, and needs no driver-side ordering.
//!
//! Waits spin, yield, then park (see [`crate::sync`]) and are abortable: when the graph
//! breaks or is torn down, [`Links::abort`] releases every actor blocked on an edge.
//! Steady state allocates nothing: a slot is two epochs and a mutex-guarded `Option`.

use std::sync::{Arc, PoisonError};

use crate::comm::{Missed, Port, Wiring};
use crate::sync::prims::Mutex;
use crate::sync::{Epoch, Interrupted};
use crate::travel::{cannot_travel, Codec, Outgoing};
use crate::{Backend, Error};

/// What a value read by several actors needs: each gets its own clone (a `Tensor` clone
/// copies no data). Implemented for every `Clone` type; it exists for its error message.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is read by several actors, so it must implement `Clone`",
    label = "this value goes to several actors",
    note = "each actor gets its own clone; a `Tensor` clone copies no data"
)]
pub trait EdgeValue: Clone {}

impl<T: Clone> EdgeValue for T {}

/// Which actors an edge connects, by rank. Sizes are checked at `launch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Rank i of the producing group feeds rank i of the consuming group (equal sizes).
    Zip,
    /// Rank `from` feeds every rank of the consuming group. With `skip_from` (producer and
    /// consumer are one group), rank `from` keeps its own value and gets no message.
    Fan {
        /// The producing rank.
        from: usize,
        /// Whether the consumer with rank `from` is the producer itself.
        skip_from: bool,
    },
    /// Rank `from` feeds rank `to`, and nobody else.
    One {
        /// The producing rank.
        from: usize,
        /// The consuming rank.
        to: usize,
    },
    /// Every producing rank feeds consumer `to`, which gets the values in rank order (a
    /// gather: one slot per producer). With `keep` (producer and consumer are one group),
    /// rank `to` keeps its own value and gets no message.
    Gather {
        /// The consuming rank.
        to: usize,
        /// Whether the consumer is producing rank `to` itself.
        keep: bool,
    },
    /// Every producing rank feeds every rank of another group, which gets the values in
    /// rank order (a gather to a group: one slot per producer and consumer, consumer c's
    /// from `c * producers`).
    GatherAll {
        /// The number of producing ranks.
        producers: usize,
    },
    /// Producer `from` splits a `Vec` over the consumers, the k-th value to rank k (a
    /// scatter: one slot per consumer). With `keep` (producer and consumer are one group),
    /// rank `from` keeps its own value and sends itself no message.
    Scatter {
        /// The producing rank.
        from: usize,
        /// Whether the consumer with rank `from` is the producer itself.
        keep: bool,
    },
}

impl Route {
    /// The number of slots for a consuming group of `consumers` actors.
    fn slots(self, consumers: usize) -> usize {
        match self {
            Route::Zip | Route::Fan { .. } | Route::Gather { .. } | Route::Scatter { .. } => {
                consumers
            }
            Route::One { .. } => 1,
            Route::GatherAll { producers } => consumers * producers,
        }
    }

    /// The slots producer `rank` fills.
    fn outgoing(self, rank: usize, n: usize) -> impl Iterator<Item = usize> {
        let range = match self {
            Route::Zip if rank < n => rank..rank + 1,
            Route::Fan { from, .. } | Route::Scatter { from, .. } if from == rank => 0..n,
            Route::One { from, .. } if from == rank => 0..1,
            Route::Gather { .. } if rank < n => rank..rank + 1,
            Route::GatherAll { producers } if rank < producers => rank..n,
            _ => 0..0,
        };
        // A producer of a gather to a group fills one slot per consumer, `producers` apart.
        let step = match self {
            Route::GatherAll { producers } => producers.max(1),
            _ => 1,
        };
        let skip = match self {
            Route::Fan {
                from,
                skip_from: true,
            } => Some(from),
            Route::Gather { to, keep: true } => Some(to),
            Route::Scatter { from, keep: true } => Some(from),
            _ => None,
        };
        range.step_by(step).filter(move |&s| Some(s) != skip)
    }

    /// The slot consumer `rank` reads, if it reads one.
    fn incoming(self, rank: usize, n: usize) -> Option<usize> {
        match self {
            Route::Zip if rank < n => Some(rank),
            Route::Fan {
                from,
                skip_from: keep,
            }
            | Route::Scatter { from, keep }
                if rank < n && !(keep && rank == from) =>
            {
                Some(rank)
            }
            Route::One { to, .. } if to == rank => Some(0),
            _ => None,
        }
    }

    /// The slots consumer `rank` gathers from, in rank order ([`Route::Gather`] only),
    /// with the slot it keeps its own value for instead.
    fn gathered(self, rank: usize, n: usize) -> Option<(std::ops::Range<usize>, Option<usize>)> {
        match self {
            Route::Gather { to, keep } if to == rank => Some((0..n, keep.then_some(to))),
            Route::GatherAll { producers } if (rank + 1) * producers <= n => {
                Some((rank * producers..(rank + 1) * producers, None))
            }
            _ => None,
        }
    }

    /// The consuming rank of slot `slot`.
    fn consumer(self, slot: usize) -> usize {
        match self {
            Route::Zip | Route::Fan { .. } | Route::Scatter { .. } => slot,
            Route::One { to, .. } | Route::Gather { to, .. } => to,
            Route::GatherAll { producers } => slot / producers.max(1),
        }
    }

    /// Whether slot `slot` carries no message: its consumer keeps its own value.
    fn unused(self, slot: usize) -> bool {
        match self {
            Route::Fan {
                from,
                skip_from: true,
            }
            | Route::Scatter { from, keep: true } => slot == from,
            Route::Gather { to, keep: true } => slot == to,
            _ => false,
        }
    }

    /// The producing rank of slot `slot`.
    fn producer(self, slot: usize) -> usize {
        match self {
            Route::Zip | Route::Gather { .. } => slot,
            Route::GatherAll { producers } => slot % producers.max(1),
            Route::Fan { from, .. } | Route::One { from, .. } | Route::Scatter { from, .. } => from,
        }
    }
}

/// One message: the value, or `None` when its producer failed this round.
struct Msg<T> {
    round: u64,
    value: Option<T>,
}

/// One producer -> consumer pair. `sent` and `taken` count the messages put in and taken
/// out; the slot is full when they differ. Each has one writer (the producer, the consumer),
/// so neither side needs a lock to know where it stands; the mutex only guards the data.
struct Slot<T> {
    sent: Epoch,
    taken: Epoch,
    msg: Mutex<Option<Msg<T>>>,
}

impl<T> Slot<T> {
    fn new() -> Self {
        Self {
            sent: Epoch::new(),
            taken: Epoch::new(),
            msg: Mutex::new(None),
        }
    }

    fn lock(&self) -> crate::sync::prims::MutexGuard<'_, Option<Msg<T>>> {
        // The slot holds plain data; a panic elsewhere cannot leave it half-written.
        self.msg.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the slot to be empty, then fills it.
    fn put(&self, round: u64, value: Option<T>) -> Result<(), Interrupted> {
        loop {
            if self.sent.is_aborted() {
                return Err(Interrupted::Aborted);
            }
            let taken = self.taken.current();
            // Only this thread advances `sent`.
            if self.sent.current() == taken {
                break;
            }
            // Full: the consumer has not taken the last round's message yet.
            self.taken.wait_past(taken, None)?;
        }
        *self.lock() = Some(Msg { round, value });
        self.sent.advance();
        Ok(())
    }

    /// Waits for this round's message and takes it. A message of an earlier round (its
    /// consumer never ran that round) is dropped; one of a later round means that its
    /// producer skipped this round, and stays for the round it belongs to.
    fn take(&self, round: u64) -> Result<Option<T>, TakeError> {
        loop {
            // Only this thread advances `taken`.
            let taken = self.taken.current();
            let sent = self.sent.current();
            if sent == taken {
                self.sent
                    .wait_past(sent, None)
                    .map_err(|_| TakeError::Aborted)?;
                continue;
            }
            let mut guard = self.lock();
            match guard.as_ref().map(|m| m.round) {
                Some(r) if r > round => return Err(TakeError::Skipped),
                _ => {}
            }
            let msg = guard.take();
            drop(guard);
            self.taken.advance();
            match msg {
                Some(Msg { round: r, value }) if r == round => return Ok(value),
                // Stale (or, impossibly, missing): dropped; wait for this round's.
                _ => continue,
            }
        }
    }

    fn abort(&self) {
        self.sent.abort();
        self.taken.abort();
    }
}

/// Why a consumer got no value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TakeError {
    /// The edge was aborted: the graph broke or is being torn down.
    Aborted,
    /// The producer sent a later round's message: it never ran this round.
    Skipped,
}

/// Why a [`Edge::recv`] returned no value.
#[derive(Debug)]
pub(crate) enum RecvError {
    /// The producing rank failed this round (or never ran it).
    Failed {
        /// The producing rank.
        from_rank: usize,
        /// Its error, when it is in another process (whose errors this one cannot see
        /// otherwise) and the transport carried it.
        cause: Option<Error>,
    },
    /// A value arrived from another process and could not be read.
    Unreadable {
        /// The producing rank.
        from_rank: usize,
        /// Why.
        reason: String,
    },
    /// The edge was aborted.
    Aborted,
}

impl RecvError {
    fn failed(from_rank: usize) -> Self {
        RecvError::Failed {
            from_rank,
            cause: None,
        }
    }
}

// Errors compare by what they say.
impl PartialEq for RecvError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                RecvError::Failed { from_rank, cause },
                RecvError::Failed {
                    from_rank: r,
                    cause: c,
                },
            ) => {
                from_rank == r
                    && cause.as_ref().map(ToString::to_string)
                        == c.as_ref().map(ToString::to_string)
            }
            (
                RecvError::Unreadable { from_rank, reason },
                RecvError::Unreadable {
                    from_rank: r,
                    reason: w,
                },
            ) => from_rank == r && reason == w,
            (RecvError::Aborted, RecvError::Aborted) => true,
            _ => false,
        }
    }
}

/// Why a send did not happen.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The edge was aborted.
    Stopped,
    /// The value could not be encoded to leave the process (a serde type's `Serialize`
    /// failed).
    Encode(String),
}

impl From<Interrupted> for SendError {
    fn from(_: Interrupted) -> Self {
        SendError::Stopped
    }
}

impl From<Missed> for SendError {
    fn from(_: Missed) -> Self {
        SendError::Stopped
    }
}

/// One producer -> consumer pair, by where its ends are.
enum End<T> {
    /// Both in this process: a slot in memory.
    Here(Slot<T>),
    /// One here, the other in another process: the backend's transport.
    Away(Box<dyn Port>),
    /// Both in other processes: never touched here.
    Elsewhere,
}

impl<T> End<T> {
    fn put(&self, round: u64, value: Option<T>) -> Result<(), Interrupted> {
        match self {
            End::Here(slot) => slot.put(round, value),
            // Generated code sends only from the producer, whose end is never elsewhere;
            // a value for another process goes through `Edge::put_away`.
            End::Away(_) | End::Elsewhere => Ok(()),
        }
    }
}

/// A value's way from the actors that hold it to the actors that read it, one slot per
/// producer -> consumer pair (see the module docs).
pub struct Edge<T> {
    /// The value's name in the graph, for errors.
    value: &'static str,
    /// The group that produces it, for errors.
    from_group: &'static str,
    route: Route,
    slots: Box<[End<T>]>,
    /// How the value travels to another process, if its type can (see `crate::travel`).
    codec: Option<Codec<T>>,
    /// A gather's `Vec`s handed back by their consumers once read (see
    /// [`StepCtx::recycle`](crate::exec::StepCtx::recycle)), for the next round: at most one
    /// per consumer, all made at creation, so steady state allocates nothing.
    spares: Mutex<Vec<Vec<T>>>,
}

impl<T> Edge<T> {
    /// The value's name in the graph.
    pub fn value(&self) -> &'static str {
        self.value
    }

    /// The group that produces the value.
    pub fn from_group(&self) -> &'static str {
        self.from_group
    }
}

impl<T: Send + 'static> Edge<T> {
    fn new(
        value: &'static str,
        from_group: &'static str,
        route: Route,
        slots: Box<[End<T>]>,
        codec: Option<Codec<T>>,
    ) -> Self {
        let (vecs, each) = match route {
            Route::Gather { .. } => (1, slots.len()),
            Route::GatherAll { producers } => (slots.len() / producers.max(1), producers),
            _ => (0, 0),
        };
        // Every `Vec` the consumers will hold at once, made now with its room: however their
        // steps interleave, steady state allocates nothing.
        let mut spares = Vec::with_capacity(vecs);
        spares.extend((0..vecs).map(|_| Vec::with_capacity(each)));
        Self {
            value,
            from_group,
            route,
            slots,
            codec,
            spares: Mutex::new(spares),
        }
    }

    /// `value` encoded to leave the process (it is kept until every send is complete).
    fn outgoing(&self, value: T) -> Result<Arc<Outgoing>, SendError> {
        let Some(codec) = &self.codec else {
            // `launch` refuses an edge that must travel without a codec.
            return Err(SendError::Encode("its type cannot travel".into()));
        };
        Outgoing::new(value, codec).map_err(SendError::Encode)
    }

    /// Receives this round's value from a port.
    fn take_away(&self, port: &dyn Port, slot: usize, round: u64) -> Result<T, RecvError> {
        let from_rank = self.route.producer(slot);
        let Some(codec) = &self.codec else {
            return Err(RecvError::Aborted);
        };
        let mut got = Ok(None);
        let arrived = port.recv(round, &mut |r| {
            got = codec.read(r);
            matches!(got, Ok(Some(_)))
        });
        let unread = |why: &str| RecvError::Unreadable {
            from_rank,
            reason: format!(
                "reading what rank {from_rank} of group `{}` sent: {why}",
                self.from_group
            ),
        };
        match (arrived, got) {
            (Ok(()), Ok(Some(v))) => Ok(v),
            (Ok(()), Ok(None)) => Err(unread("it does not decode (sent by another program?)")),
            (Ok(()), Err(why)) => Err(unread(&why)),
            (Err(Missed::Failed(cause)), _) => Err(RecvError::Failed { from_rank, cause }),
            (Err(Missed::Skipped), _) => Err(RecvError::failed(from_rank)),
            (Err(Missed::Aborted), _) => Err(RecvError::Aborted),
        }
    }

    /// Takes slot `slot`'s message of this round, wherever its producer is.
    fn take_slot(&self, slot: usize, round: u64) -> Result<T, RecvError> {
        let from_rank = self.route.producer(slot);
        match &self.slots[slot] {
            End::Here(s) => match s.take(round) {
                Ok(Some(v)) => Ok(v),
                Ok(None) | Err(TakeError::Skipped) => Err(RecvError::failed(from_rank)),
                Err(TakeError::Aborted) => Err(RecvError::Aborted),
            },
            End::Away(port) => self.take_away(&**port, slot, round),
            End::Elsewhere => Err(RecvError::Aborted),
        }
    }

    fn spares(&self) -> crate::sync::prims::MutexGuard<'_, Vec<Vec<T>>> {
        // Plain data; a panic elsewhere cannot leave it half-written.
        self.spares.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a gather's `Vec` (emptied) for the next round, if there is room.
    pub(crate) fn recycle(&self, mut values: Vec<T>) {
        values.clear();
        let mut spares = self.spares();
        if spares.len() < spares.capacity() {
            spares.push(values);
        }
    }

    /// Sends producer `rank`'s value to the one consumer it feeds ([`Route::Zip`],
    /// [`Route::One`]). A rank that feeds nobody drops the value.
    pub(crate) fn send(&self, rank: usize, round: u64, value: T) -> Result<(), SendError> {
        match self.route.outgoing(rank, self.slots.len()).next() {
            Some(slot) => match &self.slots[slot] {
                End::Away(port) => Ok(port.send(round, &self.outgoing(value)?)?),
                end => Ok(end.put(round, Some(value))?),
            },
            None => Ok(()),
        }
    }

    /// Sends producer `rank`'s value to every consumer it feeds ([`Route::Fan`]): a clone
    /// each, and the value itself to the last one.
    pub(crate) fn send_each(
        &self,
        rank: usize,
        round: u64,
        value: T,
        clone: fn(&T) -> T,
    ) -> Result<(), SendError> {
        let n = self.slots.len();
        let here = |slot: &usize| matches!(self.slots[*slot], End::Here(_));
        let away = |slot: &usize| matches!(self.slots[*slot], End::Away(_));
        let mut value = Some(value);
        // Encoded once for every other process it goes to (a clone, unless no actor here
        // reads it).
        if self.route.outgoing(rank, n).any(|s| away(&s)) {
            let v = match self.route.outgoing(rank, n).any(|s| here(&s)) {
                true => value.as_ref().map(clone),
                false => value.take(),
            };
            let out = self.outgoing(v.ok_or(SendError::Stopped)?)?;
            for slot in self.route.outgoing(rank, n) {
                if let End::Away(port) = &self.slots[slot] {
                    port.send(round, &out)?;
                }
            }
        }
        let mut targets = self.route.outgoing(rank, n).filter(here).peekable();
        while let Some(slot) = targets.next() {
            let v = if targets.peek().is_none() {
                value.take()
            } else {
                value.as_ref().map(clone)
            };
            self.slots[slot].put(round, v)?;
        }
        Ok(())
    }

    /// Receives consumer `rank`'s value of this round.
    pub(crate) fn recv(&self, rank: usize, round: u64) -> Result<T, RecvError> {
        let Some(slot) = self.route.incoming(rank, self.slots.len()) else {
            // Generated code never asks a rank that reads nothing.
            return Err(RecvError::Aborted);
        };
        self.take_slot(slot, round)
    }
}

impl<T: Send + 'static> Edge<T> {
    /// Sends producer `rank`'s values of a [`Route::Scatter`], the k-th to consumer k,
    /// each moved; returns the one it keeps for itself (`keep`). `Err((got, expected))`
    /// when there is not one value per consumer: then nothing is sent (the caller fails,
    /// and its failure path puts a marker in every slot).
    pub(crate) fn send_scatter(
        &self,
        rank: usize,
        round: u64,
        values: Vec<T>,
    ) -> Result<Result<Option<T>, SendError>, (usize, usize)> {
        if values.len() != self.slots.len() {
            return Err((values.len(), self.slots.len()));
        }
        let kept = match self.route {
            Route::Scatter { from, keep: true } if from == rank => Some(from),
            _ => None,
        };
        let mut own = None;
        for (slot, value) in values.into_iter().enumerate() {
            let sent = match &self.slots[slot] {
                _ if Some(slot) == kept => {
                    own = Some(value);
                    Ok(())
                }
                End::Away(port) => self
                    .outgoing(value)
                    .and_then(|out| Ok(port.send(round, &out)?)),
                end => end.put(round, Some(value)).map_err(SendError::from),
            };
            if let Err(e) = sent {
                return Ok(Err(e));
            }
        }
        Ok(Ok(own))
    }

    /// Receives every producer's value of this round, in rank order, as consumer `rank` of
    /// a [`Route::Gather`]; `own` is its own value when it is one of the producers. Every
    /// slot is emptied even when one producer failed (the lowest failed rank is reported),
    /// so the next round finds them empty.
    pub(crate) fn recv_gather(
        &self,
        rank: usize,
        round: u64,
        mut own: Option<T>,
    ) -> Result<Vec<T>, RecvError> {
        let Some((slots, kept)) = self.route.gathered(rank, self.slots.len()) else {
            // Generated code never asks a rank that gathers nothing.
            return Err(RecvError::Aborted);
        };
        // A recycled `Vec` has the room already: no allocation after the first rounds.
        let mut values = self.spares().pop().unwrap_or_default();
        values.reserve(slots.len());
        let mut failed = None;
        for slot in slots {
            let got = if Some(slot) == kept {
                own.take()
                    .ok_or_else(|| RecvError::failed(self.route.producer(slot)))
            } else {
                self.take_slot(slot, round)
            };
            match got {
                Ok(v) => values.push(v),
                Err(RecvError::Aborted) => return Err(RecvError::Aborted),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            None => Ok(values),
            Some(e) => Err(e),
        }
    }
}

/// What a failed rank does with the edges it has not reached yet, without their types.
pub(crate) trait EdgeCtl: Send + Sync {
    /// Puts a failure marker in every slot producer `rank` fills; `cause` is its error,
    /// which a marker to another process carries.
    fn fail_from(&self, rank: usize, round: u64, cause: Option<&Error>);
    /// Takes and drops the message consumer `rank` is due.
    fn drain_to(&self, rank: usize, round: u64);
    /// Waits until every send of producer `rank` of `group` to another process is
    /// complete (see [`Links::flush`]).
    fn flush_from(&self, group: &str, rank: usize);
    /// Releases every wait on this edge, for good.
    fn abort(&self);
}

impl<T: Send + 'static> EdgeCtl for Edge<T> {
    fn fail_from(&self, rank: usize, round: u64, cause: Option<&Error>) {
        for slot in self.route.outgoing(rank, self.slots.len()) {
            // Aborted: nobody is left to tell.
            let _ = match &self.slots[slot] {
                End::Here(s) => s.put(round, None).map_err(SendError::from),
                End::Away(port) => port.fail(round, cause).map_err(SendError::from),
                End::Elsewhere => Ok(()),
            };
        }
    }

    fn drain_to(&self, rank: usize, round: u64) {
        let drop_slot = |slot: usize| match &self.slots[slot] {
            End::Here(s) => {
                let _ = s.take(round);
            }
            // Whatever arrives is received and dropped, so the next round finds the
            // stream where it belongs.
            End::Away(port) => {
                let _ = port.recv(round, &mut |_| false);
            }
            End::Elsewhere => {}
        };
        if let Some((slots, kept)) = self.route.gathered(rank, self.slots.len()) {
            slots.filter(|&s| Some(s) != kept).for_each(drop_slot);
            return;
        }
        if let Some(slot) = self.route.incoming(rank, self.slots.len()) {
            // Whatever arrives (value, marker, abort) is dropped.
            drop_slot(slot);
        }
    }

    fn flush_from(&self, group: &str, rank: usize) {
        if group != self.from_group {
            return;
        }
        for slot in self.route.outgoing(rank, self.slots.len()) {
            if let End::Away(port) = &self.slots[slot] {
                // Aborted: the graph is stopping, and the wait that matters reports it.
                let _ = port.flush();
            }
        }
    }

    fn abort(&self) {
        for end in self.slots.iter() {
            match end {
                End::Here(s) => s.abort(),
                End::Away(port) => port.abort(),
                End::Elsewhere => {}
            }
        }
    }
}

/// Every edge of a graph, shared by all its groups: the steps reach them typed, the failure
/// path and the abort reach them through this table.
#[derive(Clone, Default)]
pub struct Links {
    edges: Vec<Arc<dyn EdgeCtl>>,
    /// Where each group's ranks live (see [`Backend::wiring`]).
    wiring: Wiring,
    /// The producer -> consumer pairs of the edges made so far: the next pair's number.
    pairs: usize,
    /// Whether any edge leaves the process: only then does a step end with
    /// [`Links::flush`].
    remote: bool,
}

impl Links {
    /// A table with no edges, all of whose ends are in this process.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table with no edges, whose ends are where `backend` says (see
    /// [`Backend::wiring`]).
    pub fn wired<B: Backend>(backend: &B) -> Result<Self, Error> {
        Ok(Self {
            wiring: backend.wiring()?,
            ..Self::default()
        })
    }

    /// Creates the edge with index `self.len()` for value `value` of group `from_group`,
    /// along `route`, to a consuming group of `consumers` actors (for a
    /// [`Route::Gather`], the number of producers: one slot each), every end in this
    /// process.
    pub fn edge<T: Send + 'static>(
        &mut self,
        value: &'static str,
        from_group: &'static str,
        route: Route,
        consumers: usize,
    ) -> Arc<Edge<T>> {
        let slots = (0..route.slots(consumers))
            .map(|_| End::Here(Slot::new()))
            .collect();
        self.push(Edge::new(value, from_group, route, slots, None))
    }

    /// Like [`Links::edge`], to group `to_group`, with each pair's ends where the wiring
    /// says (ranks are global: `consumers` counts every process's). A pair whose ends are
    /// in different processes goes through the wiring's transport, with `codec` (from
    /// `travel::Probe`); without one, [`Error::CannotTravel`]: every process computes
    /// the same verdict, since each knows where every rank is.
    pub fn edge_to<T: Send + 'static>(
        &mut self,
        value: &'static str,
        from_group: &'static str,
        to_group: &'static str,
        route: Route,
        consumers: usize,
        codec: Option<Codec<T>>,
    ) -> Result<Arc<Edge<T>>, Error> {
        let n = route.slots(consumers);
        let first = self.pairs;
        self.pairs += n;
        let w = &self.wiring;
        let me = w.process();
        let mut slots = Vec::with_capacity(n);
        for slot in 0..n {
            let from = w.process_of(from_group, route.producer(slot));
            let to = w.process_of(to_group, route.consumer(slot));
            let end = match (from, to) {
                _ if route.unused(slot) => End::Here(Slot::new()),
                (Some(f), Some(t)) if f == t => match f == me {
                    true => End::Here(Slot::new()),
                    false => End::Elsewhere,
                },
                (Some(f), Some(t)) => {
                    if codec.is_none() {
                        return Err(cannot_travel::<T>(value, from_group, to_group));
                    }
                    let end = match (f == me, t == me, w.ports()) {
                        (true, _, Some(ports)) => {
                            Some(ports.open(first + slot, t, true, value, from_group)?)
                        }
                        (_, true, Some(ports)) => {
                            Some(ports.open(first + slot, f, false, value, from_group)?)
                        }
                        _ => None,
                    };
                    match end {
                        Some(port) => {
                            self.remote = true;
                            End::Away(port)
                        }
                        None => End::Elsewhere,
                    }
                }
                // A rank past its group's end: `launch` checked the sizes already.
                _ => End::Elsewhere,
            };
            slots.push(end);
        }
        Ok(self.push(Edge::new(value, from_group, route, slots.into(), codec)))
    }

    fn push<T: Send + 'static>(&mut self, edge: Edge<T>) -> Arc<Edge<T>> {
        let edge = Arc::new(edge);
        self.edges.push(edge.clone());
        edge
    }

    /// Waits until every value rank `rank` of `group` sent to another process this round
    /// has left (a step ends with it): a transport may need the sender's process to take
    /// part in a large transfer, and it may do nothing more until its next execution.
    /// Nothing to do when every edge is in this process.
    pub(crate) fn flush(&self, group: &str, rank: usize) {
        if self.remote {
            self.edges.iter().for_each(|e| e.flush_from(group, rank));
        }
    }

    /// The number of edges.
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    /// Whether the graph has no edges.
    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    pub(crate) fn get(&self, idx: usize) -> Option<&dyn EdgeCtl> {
        self.edges.get(idx).map(|e| &**e)
    }

    /// Releases every actor waiting on any edge, for good: the graph broke or stops.
    pub fn abort(&self) {
        self.edges.iter().for_each(|e| e.abort());
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn a_value_crosses_and_the_slot_empties_every_round() {
        let mut links = Links::new();
        let e = links.edge::<Vec<u32>>("h", "enc", Route::Zip, 2);
        let e2 = e.clone();
        let consumer = thread::spawn(move || {
            (1..=100)
                .map(|round| e2.recv(1, round).unwrap()[0])
                .sum::<u32>()
        });
        for round in 1..=100u64 {
            e.send(1, round, vec![round as u32]).unwrap();
        }
        assert_eq!(consumer.join().unwrap(), 5050);
    }

    #[test]
    fn a_failure_marker_names_the_producer() {
        let mut links = Links::new();
        let e = links.edge::<u8>("t", "w", Route::One { from: 0, to: 1 }, 2);
        links.get(0).unwrap().fail_from(0, 1, None);
        assert_eq!(e.recv(1, 1), Err(RecvError::failed(0)));
        // The slot is empty again: the next round works.
        e.send(0, 2, 7).unwrap();
        assert_eq!(e.recv(1, 2), Ok(7));
    }

    #[test]
    fn a_gather_collects_every_producer_in_rank_order_and_empties_after_a_failure() {
        let mut links = Links::new();
        // Three producers of another group feed consumer rank 0.
        let e = links.edge::<String>("l", "w", Route::Gather { to: 0, keep: false }, 3);
        for rank in 0..3 {
            e.send(rank, 1, format!("r{rank}")).unwrap();
        }
        assert_eq!(e.recv_gather(0, 1, None).unwrap(), ["r0", "r1", "r2"]);
        // Rank 1 fails: the consumer still takes every message, and names rank 1.
        e.send(0, 2, "a".into()).unwrap();
        links.get(0).unwrap().fail_from(1, 2, None);
        e.send(2, 2, "c".into()).unwrap();
        assert_eq!(e.recv_gather(0, 2, None), Err(RecvError::failed(1)));
        for rank in 0..3 {
            e.send(rank, 3, format!("{rank}")).unwrap();
        }
        assert_eq!(e.recv_gather(0, 3, None).unwrap(), ["0", "1", "2"]);
        // A rank that gathers nothing gets no value.
        assert_eq!(e.recv_gather(1, 3, None), Err(RecvError::Aborted));
    }

    #[test]
    fn a_gather_to_a_group_gives_every_consumer_every_value_in_rank_order() {
        let mut links = Links::new();
        // Three producers, two consumers.
        let e = links.edge::<u8>("l", "w", Route::GatherAll { producers: 3 }, 2);
        for rank in 0..3 {
            e.send_each(rank, 1, rank as u8, |v| *v).unwrap();
        }
        assert_eq!(e.recv_gather(1, 1, None).unwrap(), [0, 1, 2]);
        assert_eq!(e.recv_gather(0, 1, None).unwrap(), [0, 1, 2]);
        // Producer 2 fails: both consumers name it, and every slot is empty again.
        e.send_each(0, 2, 5, |v| *v).unwrap();
        e.send_each(1, 2, 6, |v| *v).unwrap();
        links.get(0).unwrap().fail_from(2, 2, None);
        assert_eq!(e.recv_gather(0, 2, None), Err(RecvError::failed(2)));
        links.get(0).unwrap().drain_to(1, 2);
        for rank in 0..3 {
            e.send_each(rank, 3, 10 + rank as u8, |v| *v).unwrap();
        }
        assert_eq!(e.recv_gather(0, 3, None).unwrap(), [10, 11, 12]);
        assert_eq!(e.recv_gather(1, 3, None).unwrap(), [10, 11, 12]);
    }

    #[test]
    fn a_recycled_gather_vec_takes_the_next_rounds_values() {
        let mut links = Links::new();
        let e = links.edge::<u8>("l", "w", Route::Gather { to: 0, keep: false }, 2);
        e.send(0, 1, 1).unwrap();
        e.send(1, 1, 2).unwrap();
        let first = e.recv_gather(0, 1, None).unwrap();
        let buffer = first.as_ptr();
        e.recycle(first);
        e.send(0, 2, 3).unwrap();
        e.send(1, 2, 4).unwrap();
        let second = e.recv_gather(0, 2, None).unwrap();
        assert_eq!((second.as_slice(), second.as_ptr()), (&[3, 4][..], buffer));
        // No room for a second spare: it is dropped, not kept.
        e.recycle(vec![9]);
        e.recycle(second);
        assert_eq!(e.spares().len(), 1);
    }

    #[test]
    fn a_gather_within_a_group_keeps_the_consumers_own_value() {
        let mut links = Links::new();
        let e = links.edge::<u8>("l", "w", Route::Gather { to: 1, keep: true }, 3);
        // Rank 1 sends nothing: it is the consumer.
        for rank in [0, 1, 2] {
            e.send(rank, 1, 10 + rank as u8).unwrap();
        }
        assert_eq!(e.recv_gather(1, 1, Some(99)).unwrap(), [10, 99, 12]);
        // A failed consumer drains the others' messages; the next round works.
        e.send(0, 2, 0).unwrap();
        e.send(2, 2, 2).unwrap();
        links.get(0).unwrap().drain_to(1, 2);
        e.send(0, 3, 3).unwrap();
        e.send(2, 3, 5).unwrap();
        assert_eq!(e.recv_gather(1, 3, Some(4)).unwrap(), [3, 4, 5]);
    }

    #[test]
    fn a_scatter_moves_the_kth_value_to_rank_k_and_refuses_another_length() {
        let mut links = Links::new();
        let e = links.edge::<Box<u8>>(
            "v",
            "w",
            Route::Scatter {
                from: 1,
                keep: true,
            },
            3,
        );
        let values: Vec<Box<u8>> = (0..3).map(Box::new).collect();
        let addr = &*values[2] as *const u8;
        let kept = e.send_scatter(1, 1, values).unwrap().unwrap();
        assert_eq!(kept.as_deref(), Some(&1));
        let last = e.recv(2, 1).unwrap();
        assert_eq!((*last, &*last as *const u8), (2, addr));
        assert_eq!(*e.recv(0, 1).unwrap(), 0);
        // Rank 1 keeps its value: it reads no slot.
        assert_eq!(e.recv(1, 1), Err(RecvError::Aborted));
        // Another length: nothing is sent; the failure path then marks every slot.
        assert_eq!(e.send_scatter(1, 2, vec![Box::new(0)]).err(), Some((1, 3)));
        links.get(0).unwrap().fail_from(1, 2, None);
        assert_eq!(e.recv(0, 2), Err(RecvError::failed(1)));
        assert_eq!(e.recv(2, 2), Err(RecvError::failed(1)));
    }

    /// A transport that opens nothing: it records which pairs, peers and directions
    /// `edge_to` asked for.
    struct Record(std::sync::Mutex<Vec<(usize, usize, bool)>>);

    impl crate::comm::Ports for Record {
        fn open(
            &self,
            pair: usize,
            peer: usize,
            sending: bool,
            _: &'static str,
            _: &'static str,
        ) -> Result<Box<dyn Port>, Error> {
            self.0.lock().unwrap().push((pair, peer, sending));
            Err(Error::Backend("recorded".into()))
        }
    }

    #[test]
    fn pairs_across_processes_need_a_codec_and_the_transport() {
        // Process 1 of two: `w` has ranks 0, 1 on process 0 and rank 2 here.
        let ports = Arc::new(Record(Default::default()));
        let wiring = Wiring::across(1, vec![("w", vec![2, 1])], ports.clone());
        let mut links = Links {
            wiring,
            ..Links::default()
        };
        // Rank 2's value read by rank 2 only: stays here, needs no codec.
        let e = links
            .edge_to::<String>("s", "w", "w", Route::One { from: 2, to: 2 }, 3, None)
            .unwrap();
        e.send(2, 1, "here".into()).unwrap();
        assert_eq!(e.recv(2, 1).unwrap(), "here");
        // Rank 0's value read by every rank: rank 2's pair crosses, and without a codec
        // it is refused, whichever process asks.
        match links.edge_to::<String>(
            "t",
            "w",
            "w",
            Route::Fan {
                from: 0,
                skip_from: true,
            },
            3,
            None,
        ) {
            Err(Error::CannotTravel { value: "t", ty, .. }) => assert!(ty.contains("String")),
            other => panic!("{:?}", other.err()),
        }
        // With one, the pair into this process opens a receiving port from process 0, the
        // pair that stays on process 0 opens nothing here. Pairs are numbered edge after
        // edge: 1 for the first edge, 3 for the refused one, then these.
        let codec = {
            use crate::travel::{Probe, ViaTravel as _};
            (&&&Probe::<String>::NEW).codec()
        };
        let opened = links.edge_to::<String>(
            "u",
            "w",
            "w",
            Route::Fan {
                from: 0,
                skip_from: true,
            },
            3,
            codec,
        );
        assert!(matches!(opened, Err(Error::Backend(_))));
        assert_eq!(*ports.0.lock().unwrap(), [(4 + 2, 0, false)]);
    }

    #[test]
    fn a_stale_message_is_dropped_and_a_later_one_waits() {
        let mut links = Links::new();
        let e = links.edge::<u8>("h", "enc", Route::Zip, 1);
        // Round 1's consumer never ran: its message is stale in round 2.
        e.send(0, 1, 1).unwrap();
        let e2 = e.clone();
        let producer = thread::spawn(move || e2.send(0, 2, 2));
        assert_eq!(e.recv(0, 2), Ok(2));
        producer.join().unwrap().unwrap();
        // The producer skipped round 3: the consumer learns it, and round 4's message
        // stays for round 4.
        e.send(0, 4, 4).unwrap();
        assert_eq!(e.recv(0, 3), Err(RecvError::failed(0)));
        assert_eq!(e.recv(0, 4), Ok(4));
    }

    #[test]
    fn fan_clones_to_every_other_rank() {
        let mut links = Links::new();
        let e = links.edge::<String>(
            "t",
            "w",
            Route::Fan {
                from: 1,
                skip_from: true,
            },
            3,
        );
        e.send_each(1, 1, "x".to_string(), String::clone).unwrap();
        assert_eq!(e.recv(0, 1).unwrap(), "x");
        assert_eq!(e.recv(2, 1).unwrap(), "x");
        links.get(0).unwrap().fail_from(1, 2, None);
        assert_eq!(e.recv(0, 2), Err(RecvError::failed(1)));
        assert_eq!(e.recv(2, 2), Err(RecvError::failed(1)));
    }

    #[test]
    fn abort_releases_a_blocked_consumer_and_a_blocked_producer() {
        let mut links = Links::new();
        let e = links.edge::<u8>("h", "enc", Route::Zip, 2);
        let (c, p) = (e.clone(), e.clone());
        let consumer = thread::spawn(move || c.recv(0, 1));
        p.send(1, 1, 1).unwrap();
        let producer = thread::spawn(move || p.send(1, 2, 2));
        // Rank 0 waits for its first message, rank 1 for room for its second.
        let slot = |i: usize| match &e.slots[i] {
            End::Here(s) => s,
            _ => unreachable!("every end of a local edge is here"),
        };
        slot(0).sent.until_parked(1);
        slot(1).taken.until_parked(1);
        links.abort();
        assert_eq!(consumer.join().unwrap(), Err(RecvError::Aborted));
        assert!(matches!(producer.join().unwrap(), Err(SendError::Stopped)));
        assert!(matches!(e.send(0, 3, 3), Err(SendError::Stopped)));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    #[test]
    fn loom_edge_carries_a_value_then_a_failure_marker() {
        loom::model(|| {
            let mut links = Links::new();
            let e = links.edge::<u32>("h", "enc", Route::Zip, 1);
            let e2 = e.clone();
            let producer = thread::spawn(move || {
                e2.send(0, 1, 41).unwrap();
                // Round 2 failed: waits until round 1's value is taken, then says so.
                e2.fail_from(0, 2, None);
            });
            assert_eq!(e.recv(0, 1), Ok(41));
            assert_eq!(e.recv(0, 2), Err(RecvError::failed(0)));
            producer.join().unwrap();
        });
    }

    #[test]
    fn loom_gather_takes_every_producer_then_a_failure_marker() {
        loom::model(|| {
            let mut links = Links::new();
            let e = links.edge::<u32>("l", "w", Route::Gather { to: 0, keep: true }, 2);
            let e2 = e.clone();
            // Rank 1 produces for rank 0, which keeps its own value.
            let producer = thread::spawn(move || {
                e2.send(1, 1, 7).unwrap();
                e2.fail_from(1, 2, None);
            });
            assert_eq!(e.recv_gather(0, 1, Some(3)), Ok(vec![3, 7]));
            assert_eq!(e.recv_gather(0, 2, Some(4)), Err(RecvError::failed(1)));
            producer.join().unwrap();
        });
    }

    /// A consumer that finds a later round's message reads it without taking it (the
    /// producer skipped its round) and takes it in its round.
    #[test]
    fn loom_a_later_round_waits_in_the_slot_for_its_round() {
        loom::model(|| {
            let mut links = Links::new();
            let e = links.edge::<u32>("h", "enc", Route::Zip, 1);
            let e2 = e.clone();
            // The producer never ran round 1.
            let producer = thread::spawn(move || e2.send(0, 2, 8).unwrap());
            // Round 1 waits for a message and finds round 2's: its producer skipped it.
            assert_eq!(e.recv(0, 1), Err(RecvError::failed(0)));
            assert_eq!(e.recv(0, 2), Ok(8));
            producer.join().unwrap();
        });
    }

    #[test]
    fn loom_edge_abort_releases_the_consumer() {
        loom::model(|| {
            let mut links = Links::new();
            let e = links.edge::<u32>("h", "enc", Route::Zip, 1);
            let consumer = thread::spawn(move || e.recv(0, 1));
            links.abort();
            assert_eq!(consumer.join().unwrap(), Err(RecvError::Aborted));
        });
    }
}
