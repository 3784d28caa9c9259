//! Where the ends of a graph's edges live: what a backend whose groups span processes
//! tells `launch` (see [`Backend::wiring`](crate::Backend::wiring)), so that an edge
//! between actors of one process stays a slot in memory and one between processes goes
//! through the backend's transport.

use std::sync::Arc;

use crate::travel::{Outgoing, Reader};
use crate::Error;

/// Where each rank of each group of the graph just joined lives, and the transport for
/// the edges between processes. The default ([`Wiring::local`]): every rank in this
/// process.
///
/// ```
/// use actorgraph::comm::Wiring;
/// let w = Wiring::local();
/// assert_eq!(w.process_of("workers", 7), Some(0));
/// assert!(w.is_here("workers", 7));
/// ```
#[derive(Clone)]
pub struct Wiring {
    process: usize,
    /// Each group's number of ranks per process, in process order.
    groups: Vec<(&'static str, Vec<usize>)>,
    ports: Option<Arc<dyn Ports>>,
}

impl Default for Wiring {
    fn default() -> Self {
        Self::local()
    }
}

impl Wiring {
    /// Every rank of every group in this process: no edge leaves it.
    pub fn local() -> Self {
        Self {
            process: 0,
            groups: Vec::new(),
            ports: None,
        }
    }

    /// This process is `process`; `groups` gives each group's number of ranks in each
    /// process, in process order (a group's ranks are global, process 0's first); `ports`
    /// opens the ends of the edges between processes.
    pub fn across(
        process: usize,
        groups: Vec<(&'static str, Vec<usize>)>,
        ports: Arc<dyn Ports>,
    ) -> Self {
        Self {
            process,
            groups,
            ports: Some(ports),
        }
    }

    /// This process's place among the processes.
    pub fn process(&self) -> usize {
        self.process
    }

    /// The process that hosts rank `rank` of `group` (`None` past the group's end).
    pub fn process_of(&self, group: &str, rank: usize) -> Option<usize> {
        let Some((_, counts)) = self.groups.iter().find(|(g, _)| *g == group) else {
            // A group this wiring does not describe lives here (a local wiring).
            return Some(self.process);
        };
        let mut first = 0;
        for (p, &n) in counts.iter().enumerate() {
            if rank < first + n {
                return Some(p);
            }
            first += n;
        }
        None
    }

    /// Whether rank `rank` of `group` is in this process.
    pub fn is_here(&self, group: &str, rank: usize) -> bool {
        self.process_of(group, rank) == Some(self.process)
    }

    /// The transport, if any edge may leave the process.
    pub(crate) fn ports(&self) -> Option<&Arc<dyn Ports>> {
        self.ports.as_ref()
    }
}

/// A backend's transport for edges between processes: opens one end of a producer ->
/// consumer pair whose other end is in another process.
pub trait Ports: Send + Sync {
    /// The end of pair number `pair` (numbered the same way on every process: edge after
    /// edge, slot after slot) whose other end is in process `peer`: the producer's end if
    /// `sending`, else the consumer's. `value` and `from_group` name the edge for errors.
    fn open(
        &self,
        pair: usize,
        peer: usize,
        sending: bool,
        value: &'static str,
        from_group: &'static str,
    ) -> Result<Box<dyn Port>, Error>;
}

/// Why a [`Port::recv`] gave no value.
#[derive(Debug)]
pub enum Missed {
    /// The producer failed this round; with its error, when the transport carries it.
    Failed(Option<Error>),
    /// The producer sent a later round's message: it never ran this round. The message
    /// stays for its round.
    Skipped,
    /// The port was aborted: the graph broke or is being torn down.
    Aborted,
}

/// One end of a producer -> consumer pair that crosses processes. Holds at most one
/// message in flight, as an in-memory slot does: a send waits until the previous one is
/// complete. Every wait is polled and ends on [`Port::abort`].
pub trait Port: Send + Sync {
    /// Sends this round's value (the producer's end).
    fn send(&self, round: u64, value: &Arc<Outgoing>) -> Result<(), Missed>;
    /// Sends this round's failure marker, with the producer's error if it has one.
    fn fail(&self, round: u64, cause: Option<&Error>) -> Result<(), Missed>;
    /// Waits until the last send is complete (its buffers may go).
    fn flush(&self) -> Result<(), Missed>;
    /// Receives this round's message (the consumer's end) and hands a value's reader to
    /// `decode`, which returns whether it read a value. A message of an earlier round is
    /// dropped.
    fn recv(
        &self,
        round: u64,
        decode: &mut dyn FnMut(&mut Reader<'_>) -> bool,
    ) -> Result<(), Missed>;
    /// Ends every wait on this port, for good.
    fn abort(&self);
}
