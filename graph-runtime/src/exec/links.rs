//! The wiring of a graph's edges: [`Links`], the table of every edge, shared by all its
//! groups. It makes each edge with every producer -> consumer pair's end where the
//! backend's wiring says (a slot in memory when both ends are in this process, the
//! backend's transport when they are not), and reaches every edge without its type for
//! the failure path, the flush that ends a step and the abort that releases every waiting
//! actor.

use std::sync::Arc;

use super::edge::{Edge, EdgeCtl, End, Slot};
use super::route::Route;
use crate::comm::Wiring;
use crate::travel::{cannot_travel, Codec};
use crate::{Backend, Error};

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
    use crate::comm::Port;

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
}
