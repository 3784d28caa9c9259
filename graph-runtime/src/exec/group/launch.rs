//! Starting a group: one thread per actor, each attaching its communicator and making its
//! actor on itself, then running its loop (see [`actor_loop`](crate::exec::actor_loop));
//! the launch returns only once every rank has done both or one has failed, so a group
//! either runs whole or not at all. A thread that ends however it ends marks itself
//! exited ([`ExitGuard`]), which is what teardown, drop and a collecting driver wait on.

use std::marker::PhantomData;
use std::sync::atomic::Ordering::Release;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::{Group, GroupSpec};
use crate::comm::{AbortHandle, Backend, Communicator};
use crate::error::caught;
use crate::exec::actor_loop::{actor_loop, helped_loop};
use crate::exec::actors::{Maker, SendBox};
use crate::exec::handoff::{Returned, Shared, Slot};
use crate::exec::help::{Help, Helped};
use crate::exec::links::Links;
use crate::exec::wake::WakeSlot;
use crate::exec::{rank, Activity, Actors, Deal, LaunchOptions, StepCtx, SyncPoint};
use crate::sync::prims::AtomicBool;
use crate::sync::Epoch;
use crate::trace::Dispatch;
use crate::Error;

/// What a rank's thread tells the launch once it has attached and made its actor: its
/// place among this process's actors, and the actor's runner if the driver may run its
/// steps, or why it could not start.
type Attached<I, O> = (usize, Result<Option<Arc<dyn Help<I, O>>>, Error>);

/// Everything one rank's thread starts with, moved into it.
struct RankStart<A, C, I, O, E, F> {
    spec: GroupSpec,
    /// The actor's place among this process's actors.
    rank: usize,
    make: Maker<A>,
    /// How the actor may change threads, if it may (see [`Actors`]).
    send: Option<SendBox<A>>,
    comm: C,
    shared: Arc<Shared<A, I, O>>,
    links: Links,
    edges: E,
    attached_tx: SyncSender<Attached<I, O>>,
    dispatch: Dispatch,
    /// The threads the actor's compute may use ([`LaunchOptions::compute_threads`]).
    threads: usize,
    /// Whether its thread is pinned to cores ([`LaunchOptions::pin_threads`]).
    pin: bool,
    /// Whether deferred stages may go on while the actor computes
    /// ([`LaunchOptions::overlap`]).
    overlap: bool,
    step: F,
}

impl<A, I, O> Group<A, I, O>
where
    A: 'static,
    I: Deal,
    O: Send + 'static,
{
    /// Spawns one thread per actor, named `actorgraph-<group>-<rank>`, each owning its actor,
    /// its communicator endpoint and its fused stages. Each thread attaches its
    /// communicator, then makes its actor; the group runs only if every rank did both.
    /// `spec` names the group, its stages and its schedule (the group's stages and edge
    /// operations in step order); `links` holds every edge of the graph, and `edges` the
    /// ones the steps use, typed, which each thread gets a clone of and hands to every
    /// `step`. `options` bound the executions the driver keeps in flight: the capacity of
    /// each actor's input and output queue (the driver keeps to it; see
    /// [`Pipeline`](crate::exec::Pipeline)).
    pub fn start<B: Backend, E: Clone + Send + 'static>(
        spec: GroupSpec,
        options: &LaunchOptions,
        actors: Actors<A>,
        backend: &B,
        links: &Links,
        edges: &E,
        step: impl Fn(&mut A, &mut StepCtx<B::Comm>, &I, &E) -> Result<O, Error> + Copy + Send + 'static,
    ) -> Result<Self, Error> {
        let name = spec.name;
        let depth = options.in_flight_bound();
        if actors.is_empty() {
            return Err(Error::EmptyGroup { group: name });
        }
        let comms = backend.group_communicators(name, actors.len())?;
        if comms.len() != actors.len() {
            return Err(Error::Backend(format!(
                "the backend made {} communicators for the {} actors of group `{name}`",
                comms.len(),
                actors.len()
            )));
        }
        let mut group = Self::new(name, depth, &comms, links);
        let size = actors.len();
        let (attached_tx, attached) = std::sync::mpsc::sync_channel(size);
        let (makers, send) = actors.into_parts();
        let dispatch = Dispatch::current();
        for (rank, (make, comm)) in makers.into_iter().zip(comms).enumerate() {
            let start = RankStart {
                spec,
                rank,
                make,
                send,
                comm,
                shared: Arc::clone(&group.shared),
                links: links.clone(),
                edges: edges.clone(),
                attached_tx: attached_tx.clone(),
                dispatch: dispatch.clone(),
                // A launch resolves it for all its groups; a step launched by hand may not.
                threads: options
                    .threads_per_actor()
                    .unwrap_or_else(|| crate::threads::per_actor(size)),
                pin: options.pins_threads(),
                overlap: options.overlaps(),
                step,
            };
            match Self::spawn_rank(start) {
                Ok(handle) => group.threads.push(Some(handle)),
                // Dropping `group` stops the threads spawned so far.
                Err(e) => {
                    return Err(Error::ActorLost {
                        group: name,
                        rank,
                        reason: format!("could not spawn its thread: {e}"),
                    })
                }
            }
        }
        drop(attached_tx);
        // Dropping `group` stops the threads; actors already made are dropped there.
        group.wait_attached(&attached)?;
        Ok(group)
    }

    /// [`Group::start`], with the facts of a [`GroupSpec`] given one by one: the entry of
    /// a step written by hand over `__private`, as the soundness tests write one.
    #[expect(
        clippy::too_many_arguments,
        reason = "the signature hand-written steps call; generated code calls `start`"
    )]
    pub fn launch<B: Backend, E: Clone + Send + 'static>(
        name: &'static str,
        options: &LaunchOptions,
        actors: Actors<A>,
        backend: &B,
        stage_names: &'static [&'static str],
        schedule: &'static [SyncPoint],
        links: &Links,
        edges: &E,
        step: impl Fn(&mut A, &mut StepCtx<B::Comm>, &I, &E) -> Result<O, Error> + Copy + Send + 'static,
    ) -> Result<Self, Error> {
        // A hand-written step's context knows its own group's size only.
        let spec = GroupSpec {
            name,
            stages: stage_names,
            deferred: &[],
            schedule,
            groups: &[],
        };
        Self::start(spec, options, actors, backend, links, edges, step)
    }

    /// The group before its threads: a handoff per actor with `depth` cells each, aborted
    /// through the first communicator's handle.
    fn new<C: Communicator>(name: &'static str, depth: usize, comms: &[C], links: &Links) -> Self {
        let size = comms.len();
        let shared = Arc::new(Shared {
            slots: (0..size).map(|_| Slot::new(depth)).collect(),
            activity: (0..size).map(|_| Activity::default()).collect(),
            shutdown: AtomicBool::new(false),
            visiting: AtomicBool::new(false),
            exits: Epoch::new(),
            waker: WakeSlot::new(),
            hand_back: Mutex::new(None),
            visits: (0..size).map(|_| Mutex::new(None)).collect(),
            visited: Epoch::new(),
        });
        Self {
            name,
            shared,
            threads: Vec::with_capacity(size),
            done_seen: vec![0; size],
            abort: comms[0].abort_handle(),
            links: links.clone(),
            broken: None,
            helpers: (0..size).map(|_| None).collect(),
            held: false,
            steal: false,
            submitted: 0,
            depth: depth as u64,
            ranks: (comms[0].rank()..comms[0].rank() + size, comms[0].size()),
            _actors: PhantomData,
        }
    }

    /// Spawns the thread of one rank: it attaches its communicator, makes its actor, tells
    /// the launch, and runs its loop until the group stops.
    fn spawn_rank<C, E, F>(
        start: RankStart<A, C, I, O, E, F>,
    ) -> std::io::Result<JoinHandle<Returned>>
    where
        C: Communicator,
        E: Clone + Send + 'static,
        F: Fn(&mut A, &mut StepCtx<C>, &I, &E) -> Result<O, Error> + Copy + Send + 'static,
    {
        let RankStart {
            spec:
                GroupSpec {
                    name,
                    stages: stage_names,
                    deferred,
                    schedule,
                    groups,
                },
            rank,
            make,
            send,
            mut comm,
            shared,
            links,
            edges,
            attached_tx,
            dispatch,
            threads,
            pin,
            overlap,
            step,
        } = start;
        // The actor's rank in its whole group, which spans processes under MPI; `rank` is
        // its place among this process's actors.
        let (global, group_size) = (comm.rank(), comm.size());
        std::thread::Builder::new()
            .name(format!("actorgraph-{name}-{global}"))
            .spawn(move || {
                let _dispatch = dispatch.enter();
                crate::sync::actor_started();
                if pin {
                    crate::threads::pin_current(threads);
                }
                rank::Ctx::new(name, global, group_size, threads, groups).enter();
                let guard = ExitGuard {
                    shared: &shared,
                    rank,
                    abort: comm.abort_handle(),
                    links: links.clone(),
                };
                let actor = comm
                    .attach()
                    .and_then(|()| make_actor(make, name, global, group_size));
                let actor = match actor {
                    Ok(actor) => actor,
                    Err(e) => {
                        let _ = attached_tx.send((rank, Err(e)));
                        drop(guard);
                        return Returned {
                            actor: None,
                            poisoned: None,
                        };
                    }
                };
                // The actor may run its steps on the driver's thread too, if it and its
                // communicator may change threads.
                let send = send.filter(|_| comm.runs_on_any_thread());
                let activity = Arc::clone(&shared.activity);
                let stages = (stage_names, deferred, overlap);
                let ctx = StepCtx::new(name, (comm, rank), stages, schedule, links, activity);
                let step = move |a: &mut A, c: &mut StepCtx<C>, i: &I| step(a, c, i, &edges);
                let returned = match send {
                    Some(send) => {
                        let helped = Arc::new(Helped::new(
                            send(actor),
                            rank::Ctx::new(name, global, group_size, threads, groups),
                            ctx,
                            step,
                        ));
                        let helper: Arc<dyn Help<I, O>> = helped.clone();
                        let _ = attached_tx.send((rank, Ok(Some(helper))));
                        drop(attached_tx);
                        helped_loop(&helped, &shared, rank)
                    }
                    None => {
                        let _ = attached_tx.send((rank, Ok(None)));
                        drop(attached_tx);
                        actor_loop(actor, ctx, &step, &shared, rank)
                    }
                };
                drop(guard);
                returned
            })
    }

    /// Waits until every rank has attached its communicator and made its actor on its own
    /// thread, keeping the runner of each actor the driver may help; an error if any did
    /// not. (A thread that died before sending closes the channel: `recv` fails.) Of several
    /// failures, the lowest rank's is reported.
    fn wait_attached(&mut self, attached: &Receiver<Attached<I, O>>) -> Result<(), Error> {
        let size = self.len();
        let mut failed: Option<(usize, Error)> = None;
        let mut reported = vec![false; size];
        for _ in 0..size {
            let (rank, e) = match attached.recv() {
                Ok((rank, Ok(helper))) => {
                    reported[rank] = true;
                    self.helpers[rank] = helper;
                    continue;
                }
                Ok((rank, Err(e))) => {
                    reported[rank] = true;
                    (rank, e)
                }
                Err(_) => {
                    let rank = reported.iter().position(|&r| !r).unwrap_or(0);
                    let reason = "its thread ended while attaching its communicator".into();
                    (
                        rank,
                        Error::ActorLost {
                            group: self.name,
                            rank,
                            reason,
                        },
                    )
                }
            };
            if failed.as_ref().is_none_or(|&(r, _)| rank < r) {
                failed = Some((rank, e));
            }
            if matches!(failed, Some((_, Error::ActorLost { .. }))) {
                break;
            }
        }
        match failed {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

/// Marks an actor thread as ended however it ends; if it ends by unwinding, aborts the
/// communicator and the edges so that no peer waits for it, and wakes the driver.
struct ExitGuard<'a, A, I, O> {
    shared: &'a Shared<A, I, O>,
    rank: usize,
    abort: AbortHandle,
    /// Aborted too: an actor of another group may be waiting for this one's values, and
    /// the driver may be collecting that group first.
    links: Links,
}

impl<A, I, O> Drop for ExitGuard<'_, A, I, O> {
    fn drop(&mut self) {
        crate::sync::actor_ended();
        if std::thread::panicking() {
            self.abort.abort();
            self.links.abort();
        }
        let slot = &self.shared.slots[self.rank];
        slot.outbox.exited.store(true, Release);
        // A driver waiting for this rank's output finds none and reports the rank lost.
        slot.outbox.done.advance();
        self.shared.exits.advance();
        // A driver waiting for this rank's part of an `each` finds it gone.
        self.shared.visited.advance();
        self.shared.waker.wake();
    }
}

/// Makes rank `rank`'s actor on its own thread; a failing or panicking maker is
/// [`Error::ActorInit`].
fn make_actor<A>(
    make: Maker<A>,
    group: &'static str,
    rank: usize,
    size: usize,
) -> Result<A, Error> {
    let made = caught(|| make(rank, size)).unwrap_or_else(|why| Err(why.into()));
    made.map_err(|source| Error::ActorInit {
        group,
        rank,
        source,
    })
}
