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
//! breaks or is torn down, [`Links::abort`](super::Links::abort) releases every actor
//! blocked on an edge.
//! Steady state allocates nothing: a slot is two epochs and a mutex-guarded `Option`.

use std::sync::{Arc, PoisonError};

use super::route::Route;
use crate::comm::{Missed, Port};
use crate::sync::prims::Mutex;
use crate::sync::{Epoch, Interrupted};
use crate::travel::{Codec, Outgoing};
use crate::Error;

/// What a value read by several actors needs: each gets its own clone (a `Tensor` clone
/// copies no data). Implemented for every `Clone` type; it exists for its error message.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is read by several actors, so it must implement `Clone`",
    label = "this value goes to several actors",
    note = "each actor gets its own clone; a `Tensor` clone copies no data"
)]
pub trait EdgeValue: Clone {}

impl<T: Clone> EdgeValue for T {}

/// One message: the value, or `None` when its producer failed this round.
struct Msg<T> {
    round: u64,
    value: Option<T>,
}

/// One producer -> consumer pair. `sent` and `taken` count the messages put in and taken
/// out; the slot is full when they differ. Each has one writer (the producer, the consumer),
/// so neither side needs a lock to know where it stands; the mutex only guards the data.
pub(super) struct Slot<T> {
    sent: Epoch,
    taken: Epoch,
    msg: Mutex<Option<Msg<T>>>,
}

impl<T> Slot<T> {
    pub(super) fn new() -> Self {
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
pub(super) enum End<T> {
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
    pub(super) fn new(
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
    /// complete (see [`Links::flush`](super::Links::flush)).
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

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;
