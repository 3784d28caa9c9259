//! The actors of one group as `launch` takes them: ready values, or a constructor that
//! runs on each actor's own thread.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::BoxError;

/// Makes one actor on its own thread, given its rank and its group's size.
pub(super) type Maker<A> = Box<dyn FnOnce(usize, usize) -> Result<A, BoxError> + Send>;

/// Boxes an actor as something that may change threads: exists only for `A: Send`.
pub(crate) type SendBox<A> = fn(A) -> Box<dyn Any + Send>;

/// The actors of one group, as a graph's `launch` takes them.
///
/// Either ready values, moved to their threads (the actor type must then be
/// `Send + 'static`). Such an actor may also run a step on the thread that calls `execute`:
/// when that thread would otherwise only wait for the actors, it runs the first actor's
/// step itself, then (when the actor threads outnumber the cores) every step that none has
/// started yet, as rayon's `join` runs one half of its work on the calling thread and
/// steals the other if it is still there (only on a backend whose endpoints may change
/// threads, such as `Cpu`, and only for an `execute` without a timeout, with nothing else
/// in flight):
///
/// ```
/// use actorgraph::Actors;
/// let from_vec: Actors<u32> = vec![1, 2, 3].into();
/// let from_array: Actors<u32> = [1, 2].into();
/// assert_eq!((from_vec.len(), from_array.len()), (3, 2));
/// ```
///
/// or a constructor that each actor's own thread calls with its rank and the group's size,
/// as Ray builds each actor in its worker. The actor then never changes threads, so it may
/// hold state that is not `Send` (an `Rc`, a thread-bound handle, a thread-local RNG); it
/// runs after the thread has attached its communicator (on the NCCL backend, with the
/// actor's GPU current). Such actors are dropped on their threads: `teardown`, which hands
/// actors back to the caller, needs `Send`.
///
/// ```
/// use actorgraph::Actors;
/// use std::rc::Rc;
/// struct Worker { rank: usize, scratch: Rc<Vec<f32>> }
/// let workers = Actors::each(4, |rank, size| Worker { rank, scratch: Rc::new(vec![0.0; size]) });
/// assert_eq!(workers.len(), 4);
/// ```
pub struct Actors<A> {
    makers: Vec<Maker<A>>,
    /// Set for ready values (`A: Send`): the actors may run a step on another thread.
    send: Option<SendBox<A>>,
}

impl<A: 'static> Actors<A> {
    /// `size` actors, actor `rank` made by `make(rank, size)` on its own thread.
    pub fn each<F>(size: usize, make: F) -> Self
    where
        F: Fn(usize, usize) -> A + Send + Sync + 'static,
    {
        Self::try_each(size, move |rank, size| {
            Ok::<A, std::convert::Infallible>(make(rank, size))
        })
    }

    /// [`each`](Self::each) with a constructor that can fail: `launch` then returns
    /// [`Error::ActorInit`](crate::Error::ActorInit) with the error of the lowest failing
    /// rank, and no execution runs. A constructor that panics fails the same way.
    pub fn try_each<F, E>(size: usize, make: F) -> Self
    where
        F: Fn(usize, usize) -> Result<A, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        let make = Arc::new(make);
        let makers = (0..size)
            .map(|_| {
                let make = Arc::clone(&make);
                Box::new(move |rank, size| make(rank, size).map_err(Into::into)) as Maker<A>
            })
            .collect();
        Self { makers, send: None }
    }

    /// The number of actors.
    pub fn len(&self) -> usize {
        self.makers.len()
    }

    /// Whether there are none (`launch` refuses an empty group).
    pub fn is_empty(&self) -> bool {
        self.makers.is_empty()
    }

    /// Each actor's maker, by rank, and how to box an actor that may change threads, if
    /// the actors may.
    pub(crate) fn into_parts(self) -> (Vec<Maker<A>>, Option<SendBox<A>>) {
        (self.makers, self.send)
    }
}

impl<A: Send + 'static> From<Vec<A>> for Actors<A> {
    fn from(actors: Vec<A>) -> Self {
        let makers = actors
            .into_iter()
            .map(|actor| Box::new(move |_, _| Ok(actor)) as Maker<A>)
            .collect();
        Self {
            makers,
            send: Some(|actor| Box::new(actor)),
        }
    }
}

impl<A: Send + 'static, const N: usize> From<[A; N]> for Actors<A> {
    fn from(actors: [A; N]) -> Self {
        Vec::from(actors).into()
    }
}

/// Ready values, as from a `Vec`: `let workers: Actors<_> = (0..4).map(Worker::new).collect()`.
impl<A: Send + 'static> FromIterator<A> for Actors<A> {
    fn from_iter<T: IntoIterator<Item = A>>(iter: T) -> Self {
        iter.into_iter().collect::<Vec<A>>().into()
    }
}

impl<A> fmt::Debug for Actors<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Actors")
            .field("len", &self.makers.len())
            .finish_non_exhaustive()
    }
}
