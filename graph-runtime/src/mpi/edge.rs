//! Edges between processes: each producer -> consumer pair whose ends are in different
//! processes is a [`Port`] at each end, over MPI point-to-point on a communicator of the
//! graph's own (a duplicate of the world's, made at the join), with a pair of tags of
//! its own: one for each message's head, one for its large parts.
//!
//! A message is a head (the round, whether it is a value or a failure marker, the lengths
//! of its parts, then the value's inline bytes or the producer's error) and then each
//! large part (a tensor's elements) as a message of its own, sent with `MPI_Isend` from
//! the value's own buffer and received with `MPI_Imrecv` into the buffer of the value the
//! consumer builds: no copy, no serializer. MPI keeps the messages of one source and tag
//! in order, so the parts follow their head.
//!
//! Nothing waits in MPI: a send starts `MPI_Isend`s and returns (the value stays alive in
//! the port until they are complete); a receive polls `MPI_Improbe` (a matched probe: the
//! message it finds is this thread's alone, whatever other threads receive) and then the
//! receive with `MPI_Test`, and every poll checks the port's abort flag, so a timeout or
//! a teardown ends every wait. As an in-memory slot holds one message, a port has one
//! message in flight: the next send first completes the last. And a step ends by
//! completing its sends ([`Port::flush`]), since a large transfer may need the sender's
//! process to take part, and after its step that process may not call MPI again until
//! its next execution.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::mpi::ffi;
use ::mpi::raw::AsRaw;

use super::wire::Failure;
use super::{SendComm, World};
use crate::comm::{Missed, Port, Ports};
use crate::travel::{Outgoing, Reader};
use crate::Error;

/// A head's fixed words: round, kind, number of parts.
const FIXED: usize = 3 * 8;
/// The kinds of message.
const VALUE: u64 = 0;
const FAILURE: u64 = 1;
/// A part travels in messages of at most this many bytes (an MPI count is a C `int`).
const CHUNK: usize = 1 << 30;

/// The graph's communicator for its edges.
struct EdgeComm {
    comm: SendComm,
    /// The largest tag this MPI library allows (`MPI_TAG_UB`).
    tag_ub: usize,
    // After `comm`: the communicator is freed before MPI ends.
    _world: Arc<World>,
}

// SAFETY: `Mpi::init` asks for `MPI_THREAD_MULTIPLE`, under which threads may call
// point-to-point operations on one communicator at the same time; the ports only send,
// probe and receive on it (matched probes: no thread takes another's message), and it is
// freed when the last port is gone, by the thread that drops it.
unsafe impl Sync for EdgeComm {}

/// The MPI backend's [`Ports`]: opened at launch, one port per pair that crosses
/// processes at this process's end.
pub(crate) struct MpiPorts {
    comm: Arc<EdgeComm>,
}

impl MpiPorts {
    pub(crate) fn new(comm: SendComm, world: Arc<World>) -> Self {
        let tag_ub = tag_ub(&comm);
        Self {
            comm: Arc::new(EdgeComm {
                comm,
                tag_ub,
                _world: world,
            }),
        }
    }
}

/// `MPI_TAG_UB` of `comm` (at least 32767, as MPI guarantees).
fn tag_ub(comm: &SendComm) -> usize {
    let mut value: *mut c_int = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: `comm` is a valid communicator (MPI is alive: `World`); MPI writes into
    // `value` a pointer to the attribute's `int`, which MPI owns for the communicator's
    // life, and `flag` says whether it did.
    let ub = unsafe {
        ffi::MPI_Comm_get_attr(
            comm.0.as_raw(),
            ffi::MPI_TAG_UB as c_int,
            (&raw mut value).cast::<c_void>(),
            &raw mut flag,
        );
        if flag != 0 && !value.is_null() {
            *value
        } else {
            32767
        }
    };
    usize::try_from(ub).unwrap_or(32767)
}

impl Ports for MpiPorts {
    fn open(
        &self,
        pair: usize,
        peer: usize,
        sending: bool,
        value: &'static str,
        from_group: &'static str,
    ) -> Result<Box<dyn Port>, Error> {
        let tag = pair.checked_mul(2).filter(|&t| t < self.comm.tag_ub);
        let (Some(tag), Ok(peer)) = (tag, c_int::try_from(peer)) else {
            return Err(Error::Unsupported(format!(
                "value `{value}` of group `{from_group}`: the graph's edges between processes \
                 need more MPI tags than this MPI library has (MPI_TAG_UB = {})",
                self.comm.tag_ub
            )));
        };
        // A pair's two ends are alike: each sends or receives as the edge asks.
        let _ = sending;
        Ok(Box::new(MpiPort {
            comm: Arc::clone(&self.comm),
            peer,
            head_tag: tag as c_int,
            part_tag: (tag + 1) as c_int,
            from_group,
            aborted: AtomicBool::new(false),
            state: Mutex::new(PortState::default()),
        }))
    }
}

/// Requests of `MPI_Isend`s in flight.
#[derive(Default)]
struct Requests(Vec<ffi::MPI_Request>);

// SAFETY: `Mpi::init` asks for `MPI_THREAD_MULTIPLE`, under which a request may be tested
// from any thread; a port's requests are reached only under its mutex, so by one thread at
// a time.
unsafe impl Send for Requests {}

#[derive(Default)]
struct PortState {
    /// The sender's requests in flight, and the value they read from.
    requests: Requests,
    in_flight: Option<Arc<Outgoing>>,
    /// The head being sent, or the one received.
    head: Vec<u8>,
    /// The receiver's head of a later round, kept for its round.
    held: Option<Vec<u8>>,
    /// The parts' lengths of the head received.
    lens: Vec<u64>,
    /// Where the receiver drops what it does not read.
    scratch: Vec<u8>,
}

struct MpiPort {
    comm: Arc<EdgeComm>,
    peer: c_int,
    head_tag: c_int,
    part_tag: c_int,
    from_group: &'static str,
    aborted: AtomicBool,
    state: Mutex<PortState>,
}

impl MpiPort {
    fn lock(&self) -> MutexGuard<'_, PortState> {
        // Plain data: a panic elsewhere leaves nothing half-written that matters.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn raw(&self) -> ffi::MPI_Comm {
        self.comm.comm.0.as_raw()
    }

    /// Polls `done` until it says so or the port is aborted. A wait for another process
    /// spins briefly, then yields, then naps: on a loaded machine the peer needs the core.
    fn poll(&self, mut done: impl FnMut() -> bool) -> Result<(), Missed> {
        let mut spins = 0u32;
        loop {
            if done() {
                return Ok(());
            }
            if self.aborted.load(Ordering::Acquire) {
                return Err(Missed::Aborted);
            }
            spins = spins.saturating_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 20_000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Waits until the sends in flight are complete, then lets their value go.
    fn complete(&self, st: &mut PortState) -> Result<(), Missed> {
        if !st.requests.0.is_empty() {
            let reqs = &mut st.requests.0;
            self.poll(|| {
                let mut flag: c_int = 0;
                // SAFETY: `reqs` are requests of `MPI_Isend`s this port started and has
                // not completed (completed ones are `MPI_REQUEST_NULL`, which `MPI_Testall`
                // accepts); the statuses are ignored.
                unsafe {
                    ffi::MPI_Testall(
                        reqs.len() as c_int,
                        reqs.as_mut_ptr(),
                        &raw mut flag,
                        ffi::RSMPI_STATUSES_IGNORE,
                    );
                }
                flag != 0
            })?;
            reqs.clear();
        }
        st.in_flight = None;
        Ok(())
    }

    /// Starts sending `bytes` with `tag`.
    ///
    /// # Safety
    /// `bytes` stays alive and unchanged until the request added to `reqs` is complete.
    unsafe fn isend(&self, bytes: &[u8], tag: c_int, reqs: &mut Requests) {
        let mut req = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: `bytes` is valid for `len` bytes (at most `CHUNK`, which fits a C `int`)
        // and, as the caller guarantees, until the request completes; MPI only reads it.
        // The communicator is valid while `self.comm` lives, and MPI writes the request.
        unsafe {
            ffi::MPI_Isend(
                bytes.as_ptr().cast::<c_void>(),
                bytes.len() as c_int,
                ffi::RSMPI_UINT8_T,
                self.peer,
                tag,
                self.raw(),
                req.as_mut_ptr(),
            );
            reqs.0.push(req.assume_init());
        }
    }

    /// Sends the head in `st.head` and the parts of `out`, if a value.
    fn start(&self, st: &mut PortState, out: Option<&Arc<Outgoing>>) {
        let PortState {
            requests,
            head,
            in_flight,
            ..
        } = st;
        // SAFETY: `head` is the port's own buffer, which nothing changes until the next
        // send, and that first completes these requests (`complete`), as do `flush` and
        // `Drop`; the parts are the buffers of the value that `in_flight` keeps alive
        // and unchanged for as long (`Outgoing`).
        unsafe {
            self.isend(head, self.head_tag, requests);
            if let Some(out) = out {
                for part in out.writer().parts() {
                    for chunk in part.bytes().chunks(CHUNK) {
                        self.isend(chunk, self.part_tag, requests);
                    }
                }
            }
        }
        *in_flight = out.cloned();
    }

    /// Receives the next message with `tag` into `buf` (resized to fit, or checked to be
    /// `expect` bytes long).
    fn receive(&self, tag: c_int, buf: Recv<'_>) -> Result<(), Missed> {
        let mut message = std::mem::MaybeUninit::<ffi::MPI_Message>::uninit();
        // SAFETY: a zeroed `MPI_Status` is a valid value of the C struct, which MPI fills.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        self.poll(|| {
            let mut flag: c_int = 0;
            // SAFETY: the communicator is valid; MPI writes the flag, and, when it found a
            // message, the message handle and the status.
            unsafe {
                ffi::MPI_Improbe(
                    self.peer,
                    tag,
                    self.raw(),
                    &raw mut flag,
                    message.as_mut_ptr(),
                    &raw mut status,
                );
            }
            flag != 0
        })?;
        let mut count: c_int = 0;
        // SAFETY: `status` is the status of the message just matched.
        unsafe { ffi::MPI_Get_count(&raw const status, ffi::RSMPI_UINT8_T, &raw mut count) };
        let count = usize::try_from(count).unwrap_or(0);
        let dst: &mut [u8] = match buf {
            Recv::Grow(v) => {
                v.resize(count, 0);
                v
            }
            Recv::Exact(dst) => dst,
        };
        // A message longer than its place: received into nothing larger, which MPI
        // reports as truncation; shorter: the rest stays as it was. Either way the
        // caller's checks refuse the value, and the stream stays in step.
        let len = dst.len().min(count);
        let mut req = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: the message was matched by this thread (`MPI_Improbe`), so no other
        // receive takes it; `dst` is valid for `len` bytes and exclusively borrowed until
        // the loop below has seen the request complete: this function does not return
        // before, so MPI writes into nothing else.
        unsafe {
            ffi::MPI_Imrecv(
                dst.as_mut_ptr().cast::<c_void>(),
                len as c_int,
                ffi::RSMPI_UINT8_T,
                message.as_mut_ptr(),
                req.as_mut_ptr(),
            );
        }
        // SAFETY: MPI wrote the request.
        let mut req = unsafe { req.assume_init() };
        // The message is matched: its data is on its way (the sender's step completes
        // its sends before it ends). `dst` stays borrowed until MPI is done with it; an
        // abort asks MPI to cancel the receive, and the wait goes on until MPI says it is
        // over (a thread still here at teardown is detached, as any stuck actor is).
        let mut cancelled = false;
        loop {
            let mut flag: c_int = 0;
            // SAFETY: `req` is the request of the receive just started; completed, MPI
            // sets it to `MPI_REQUEST_NULL`.
            unsafe {
                ffi::MPI_Test(&raw mut req, &raw mut flag, ffi::RSMPI_STATUS_IGNORE);
            }
            if flag != 0 {
                break;
            }
            if !cancelled && self.aborted.load(Ordering::Acquire) {
                cancelled = true;
                // SAFETY: `req` is an active receive request; a cancelled one still
                // completes through `MPI_Test`.
                unsafe { ffi::MPI_Cancel(&raw mut req) };
            }
            std::thread::yield_now();
        }
        if cancelled {
            return Err(Missed::Aborted);
        }
        if count == len {
            Ok(())
        } else {
            Err(Missed::Failed(Some(Error::Backend(format!(
                "a value of group `{}` arrived from process {} with {count} bytes where \
                 {len} were due",
                self.from_group, self.peer
            )))))
        }
    }
}

/// Where [`MpiPort::receive`] puts a message.
enum Recv<'a> {
    /// A buffer resized to the message.
    Grow(&'a mut Vec<u8>),
    /// A buffer of the length the message must have.
    Exact(&'a mut [u8]),
}

fn word(bytes: &[u8], i: usize) -> Option<u64> {
    let w = bytes.get(i * 8..i * 8 + 8)?;
    Some(u64::from_le_bytes(w.try_into().ok()?))
}

impl Port for MpiPort {
    fn send(&self, round: u64, value: &Arc<Outgoing>) -> Result<(), Missed> {
        let mut st = self.lock();
        self.complete(&mut st)?;
        let w = value.writer();
        let head = &mut st.head;
        head.clear();
        head.extend_from_slice(&round.to_le_bytes());
        head.extend_from_slice(&VALUE.to_le_bytes());
        head.extend_from_slice(&(w.parts().len() as u64).to_le_bytes());
        for part in w.parts() {
            // SAFETY: the value that lent the part is alive and unchanged (`value`).
            let len = unsafe { part.bytes() }.len() as u64;
            head.extend_from_slice(&len.to_le_bytes());
        }
        head.extend_from_slice(w.head());
        self.start(&mut st, Some(value));
        Ok(())
    }

    fn fail(&self, round: u64, cause: Option<&Error>) -> Result<(), Missed> {
        let mut st = self.lock();
        self.complete(&mut st)?;
        let mut words = vec![round, FAILURE, 0];
        Failure::encode(cause.and_then(Failure::of).as_ref(), &mut words);
        st.head.clear();
        st.head.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        self.start(&mut st, None);
        Ok(())
    }

    fn flush(&self) -> Result<(), Missed> {
        let mut st = self.lock();
        self.complete(&mut st)
    }

    fn recv(
        &self,
        round: u64,
        decode: &mut dyn FnMut(&mut Reader<'_>) -> bool,
    ) -> Result<(), Missed> {
        let mut guard = self.lock();
        let st = &mut *guard;
        loop {
            match st.held.take() {
                Some(held) => st.head = held,
                None => self.receive(self.head_tag, Recv::Grow(&mut st.head))?,
            }
            let head = &st.head;
            let garbled = || {
                Missed::Failed(Some(Error::Backend(format!(
                    "a message of group `{}` from process {} is not an edge's (another \
                     program?)",
                    self.from_group, self.peer
                ))))
            };
            let (Some(r), Some(kind), Some(parts)) = (word(head, 0), word(head, 1), word(head, 2))
            else {
                return Err(garbled());
            };
            let parts = usize::try_from(parts).map_err(|_| garbled())?;
            st.lens.clear();
            for i in 0..parts {
                st.lens.push(word(head, 3 + i).ok_or_else(garbled)?);
            }
            let body = FIXED + parts * 8;
            if r > round {
                // The producer never ran this round: its message waits for its own.
                st.held = Some(std::mem::take(&mut st.head));
                return Err(Missed::Skipped);
            }
            let mut left = parts;
            let mut outcome = Ok(());
            if r == round && kind == FAILURE {
                let words: Vec<u64> = head[FIXED..]
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                    .collect();
                let cause = Failure::decode(&mut &words[..])
                    .flatten()
                    .map(|f| f.to_error(self.from_group));
                outcome = Err(Missed::Failed(cause));
            } else if r == round {
                let mut broke = None;
                let mut fill = |dst: &mut [u8]| {
                    for chunk in dst.chunks_mut(CHUNK) {
                        if let Err(e) = self.receive(self.part_tag, Recv::Exact(chunk)) {
                            broke = Some(e);
                            return false;
                        }
                    }
                    true
                };
                let body = head.get(body..).unwrap_or_default();
                left = {
                    let mut reader = Reader::new(body, &st.lens, &mut fill);
                    decode(&mut reader);
                    reader.parts_left()
                };
                if let Some(e) = broke {
                    return Err(e);
                }
            }
            // A stale message (its consumer never ran that round), or parts the decoder
            // did not read: received and dropped, so the stream stays in step.
            for &len in &st.lens[parts - left..] {
                let mut len = usize::try_from(len).unwrap_or(0);
                while len > 0 {
                    let n = len.min(CHUNK);
                    st.scratch.resize(n, 0);
                    self.receive(self.part_tag, Recv::Exact(&mut st.scratch[..n]))?;
                    len -= n;
                }
            }
            if r == round {
                return outcome;
            }
        }
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
    }
}

impl Drop for MpiPort {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if st.requests.0.is_empty() {
            return;
        }
        let mut flag: c_int = 0;
        let reqs = &mut st.requests.0;
        // SAFETY: as in `complete`.
        unsafe {
            ffi::MPI_Testall(
                reqs.len() as c_int,
                reqs.as_mut_ptr(),
                &raw mut flag,
                ffi::RSMPI_STATUSES_IGNORE,
            );
        }
        if flag != 0 {
            return;
        }
        // Sends no consumer will take (the graph was aborted): MPI may still read their
        // buffers, so those are never freed, and the requests are released to MPI.
        for req in reqs.iter_mut() {
            // SAFETY: `req` is an active send request or `MPI_REQUEST_NULL`, which
            // `MPI_Request_free` only sets to null.
            unsafe { ffi::MPI_Request_free(req) };
        }
        std::mem::forget(st.in_flight.take());
        std::mem::forget(std::mem::take(&mut st.head));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_head_carries_the_producers_error() {
        let e = Error::Method {
            group: "w",
            rank: 3,
            method: "f",
            source: "boom".into(),
        };
        let mut words = vec![9, FAILURE, 0];
        Failure::encode(Failure::of(&e).as_ref(), &mut words);
        let back = Failure::decode(&mut &words[3..]).flatten().unwrap();
        assert_eq!(back.to_error("w").to_string(), e.to_string());
    }
}
