//! What an actor's generated step sees: its rank, its communicator, its stages.

use std::any::Any;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::bucket::{Bucketable, FusedStage, Gather, Scatter, SlotIdx};
use crate::comm::{Collective, Communicator};
use crate::exec::Flag;
use crate::method::Method;
use crate::Error;

/// The per-actor context of a generated step: calls methods, runs fused stages, and keeps
/// every rank's collectives in step when this rank fails.
pub struct StepCtx<C> {
    group: &'static str,
    rank: usize,
    comm: C,
    stages: Box<[FusedStage]>,
    round: u64,
    poisoned: Option<String>,
    /// Set while this rank is inside a collective (see `Group::collect`'s timeout).
    in_collective: Arc<[Flag]>,
}

impl<C: Communicator> StepCtx<C> {
    pub(crate) fn new(
        group: &'static str,
        comm: C,
        stage_names: &[&'static str],
        in_collective: Arc<[Flag]>,
    ) -> Self {
        Self {
            group,
            rank: comm.rank(),
            comm,
            stages: stage_names.iter().map(|&n| FusedStage::new(n)).collect(),
            round: 0,
            poisoned: None,
            in_collective,
        }
    }

    /// The message of the panic that poisoned this actor, if one did.
    pub(crate) fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// This actor's rank in its group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Calls a method, turning its `Err` or its panic into an [`Error`] that names it.
    #[inline]
    pub fn call<A: Method<M>, M>(
        &mut self,
        actor: &mut A,
        args: A::Args<'_>,
    ) -> Result<A::Output, Error> {
        match catch_unwind(AssertUnwindSafe(|| actor.call(args))) {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(source)) => Err(Error::Method {
                group: self.group,
                rank: self.rank,
                method: A::NAME,
                source,
            }),
            Err(payload) => Err(self.poison(Some(A::NAME), payload)),
        }
    }

    /// Starts fused stage `idx` of this execution.
    #[inline]
    pub fn stage<'v>(&mut self, idx: usize) -> Stage<'_, 'v, C> {
        let st = &mut self.stages[idx];
        st.begin();
        Stage {
            st,
            comm: &mut self.comm,
            group: self.group,
            round: self.round,
            in_collective: &self.in_collective[self.rank].0,
            _values: PhantomData,
        }
    }

    /// Runs one execution of `step`; whatever happens, this rank takes part in every stage,
    /// so no peer waits for it forever.
    pub(crate) fn execute<A, I, O>(
        &mut self,
        actor: &mut A,
        step: fn(&mut A, &mut Self, &I) -> Result<O, Error>,
        input: &I,
    ) -> Result<O, Error> {
        self.round += 1;
        let result = match &self.poisoned {
            Some(message) => Err(Error::Poisoned {
                group: self.group,
                rank: self.rank,
                message: message.clone(),
            }),
            None => match catch_unwind(AssertUnwindSafe(|| step(actor, self, input))) {
                Ok(r) => r,
                Err(payload) => Err(self.poison(None, payload)),
            },
        };
        if result.is_err() {
            self.drain();
        }
        result
    }

    /// Fails this execution without running the step (an internal error).
    pub(crate) fn fail<O>(&mut self, reason: &str) -> Result<O, Error> {
        self.round += 1;
        self.drain();
        Err(Error::ActorLost {
            group: self.group,
            rank: self.rank,
            reason: reason.to_string(),
        })
    }

    /// Joins, as a failed rank, every stage this execution has not reached.
    fn drain(&mut self) {
        let flag = &self.in_collective[self.rank].0;
        for st in self.stages.iter_mut() {
            if st.last_round != self.round {
                st.last_round = self.round;
                flag.store(true, Relaxed);
                st.skip(&mut self.comm);
                flag.store(false, Relaxed);
            }
        }
    }

    fn poison(&mut self, method: Option<&'static str>, payload: Box<dyn Any + Send>) -> Error {
        let message = panic_message(payload.as_ref());
        self.poisoned = Some(message.clone());
        // The payload's own drop could panic; keep that off this thread's unwinding path.
        std::mem::forget(payload);
        Error::Panic {
            group: self.group,
            rank: self.rank,
            method,
            message,
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic payload>".to_string()
    }
}

/// One fused stage of one execution on one rank: add the values, pack them, run, and take
/// the outputs.
///
/// `'v` is how long the bucket's values are borrowed: at least until `run` is over, so that
/// a communicator can read them in place instead of from a packed copy.
pub struct Stage<'a, 'v, C> {
    st: &'a mut FusedStage,
    comm: &'a mut C,
    group: &'static str,
    round: u64,
    in_collective: &'a AtomicBool,
    _values: PhantomData<&'v ()>,
}

#[allow(private_bounds)]
impl<'v, C: Communicator> Stage<'_, 'v, C> {
    /// Appends a value to the bucket's layout.
    #[inline]
    pub fn add<T: Bucketable>(&mut self, value: &T) -> SlotIdx
    where
        T::Elem: crate::bucket::HasRegion,
    {
        self.st.add(value)
    }

    /// Takes the flat buffers for the layout.
    #[inline]
    pub fn prepare(&mut self) {
        self.st.prepare()
    }

    /// Hands a value to the stage: lent in place to a communicator that reads values in
    /// place, else copied into the flat buffer.
    #[inline]
    pub fn pack<T: Bucketable>(&mut self, value: &'v T, at: SlotIdx)
    where
        T::Elem: crate::bucket::HasRegion,
    {
        if self.comm.reads_in_place() {
            self.st.lend(value, at)
        } else {
            self.st.pack(value, at)
        }
    }

    /// [`pack`](Self::pack) for `allgather`.
    #[inline]
    pub fn pack_gather<T: Gather>(&mut self, value: &'v T, at: SlotIdx) {
        self.pack(value, at)
    }

    /// [`pack`](Self::pack) for `reducescatter`.
    #[inline]
    pub fn pack_scatter<T: Scatter>(&mut self, value: &'v T, at: SlotIdx) {
        self.pack(value, at)
    }

    /// Agrees with the other ranks and runs the collective over the whole buffer.
    #[inline]
    pub fn run(&mut self, collective: Collective) -> Result<(), Error> {
        self.st.last_round = self.round;
        self.in_collective.store(true, Relaxed);
        let result = self.st.run(self.comm, collective, self.group);
        self.in_collective.store(false, Relaxed);
        result
    }

    /// This rank's result for a value: a view into the flat buffer.
    #[inline]
    pub fn output<T: Bucketable>(&mut self, value: &T, at: SlotIdx) -> T
    where
        T::Elem: crate::bucket::HasRegion,
    {
        self.st.output(value, at)
    }

    /// The stage itself, for the `add`/`pack`/`output` flavours of the collectives whose
    /// results have another type or length (`allgather`, `reducescatter`, `reduce`).
    #[inline]
    pub fn fused(&mut self) -> &mut FusedStage {
        self.st
    }
}
