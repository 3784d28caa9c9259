//! Waiting for MPI requests without blocking inside MPI, so that a timeout can stop it.
//!
//! A leader that blocked in `MPI_Wait` for a process whose actor never came would block
//! forever: `execute_timeout` could not return. Here every wait polls `MPI_Testall` and
//! gives up when told to stop (the group's communicator was aborted, or a census ran out of
//! time). A collective request cannot be cancelled (`MPI_Cancel` is for point-to-point
//! ones), so a request given up on stays pending in MPI, which may still read or write its
//! buffers whenever the other processes make their part of the call: those buffers are
//! leaked, never freed nor reused (see [`leak`]).

use ::mpi::datatype::PartitionMut;
use ::mpi::ffi;
use ::mpi::point_to_point::Status;
use ::mpi::request::{scope, Request, Scope};
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;

/// A wait given up on: the requests are still pending, their buffers leaked.
#[derive(Debug)]
pub(super) struct Abandoned;

/// Polls before this many failed tests go without yielding the thread: a stage between
/// processes of one machine completes within a few of them.
const SPINS: u32 = 64;

/// How long a patient waiter naps between polls, once spinning and yielding went on
/// long enough: what keeps a wire moving (OpenMPI advances TCP only inside MPI calls)
/// without taking a core from the actors.
const NAP: std::time::Duration = std::time::Duration::from_micros(50);

thread_local! {
    /// Whether this thread waits patiently (see [`be_patient`]).
    static PATIENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes this thread's waits for other processes nap between polls once a short spin and
/// a few yields did not end them: for the progress thread, whose waits overlap the actors'
/// computation on the same cores (see `comm::background`). Other waiters stay eager: an
/// actor waiting for a stage has nothing else to do.
pub(crate) fn be_patient() {
    PATIENT.with(|p| p.set(true));
}

/// One failed poll more: spin, yield, or (patient) nap.
#[inline]
pub(super) fn idle(spins: &mut u32) {
    idle_after(spins, SPINS);
}

/// [`idle`], spinning for the first `eager` polls.
#[inline]
pub(super) fn idle_after(spins: &mut u32, eager: u32) {
    *spins = spins.saturating_add(1);
    if *spins <= eager {
        std::hint::spin_loop();
    } else if *spins <= eager.saturating_add(SPINS) || !patient() {
        std::thread::yield_now();
    } else {
        std::thread::sleep(NAP);
    }
}

/// Whether this thread waits patiently.
#[inline]
pub(super) fn patient() -> bool {
    PATIENT.with(std::cell::Cell::get)
}

/// Waits until every request of `requests` is complete, or `stop()` says to give up.
///
/// # Safety
///
/// On `Err(Abandoned)` the requests are still pending: MPI may read and write the buffers
/// they were made over at any later time. The caller must leak every one of those buffers
/// (never free, reuse, read or write them again: [`leak`]) before it lets anything else
/// reach them. On `Ok` every request is complete and its buffers are the caller's again.
pub(super) unsafe fn all<'a, D: ?Sized + 'a, S: Scope<'a>>(
    requests: Vec<Request<'a, D, S>>,
    stop: impl Fn() -> bool,
) -> Result<(), Abandoned> {
    // SAFETY: this function's contract, passed on.
    unsafe { poll(requests, None, stop) }
}

/// [`all`], with the status of each request, in order (a receive's says how many bytes
/// came).
///
/// # Safety
///
/// As for [`all`].
pub(super) unsafe fn all_statuses<'a, D: ?Sized + 'a, S: Scope<'a>>(
    requests: Vec<Request<'a, D, S>>,
    stop: impl Fn() -> bool,
) -> Result<Vec<Status>, Abandoned> {
    // SAFETY: `MPI_Status` is a plain C struct of integers: all zeroes is a valid value,
    // overwritten by `MPI_Testall` for each request it completes.
    let mut statuses = vec![unsafe { std::mem::zeroed::<ffi::MPI_Status>() }; requests.len()];
    // SAFETY: this function's contract, passed on.
    unsafe { poll(requests, Some(&mut statuses), stop)? };
    Ok(statuses.into_iter().map(Status::from_raw).collect())
}

/// The polling of [`all`]: `statuses`, when given, holds one status per request.
///
/// # Safety
///
/// As for [`all`].
unsafe fn poll<'a, D: ?Sized + 'a, S: Scope<'a>>(
    requests: Vec<Request<'a, D, S>>,
    mut statuses: Option<&mut [ffi::MPI_Status]>,
    stop: impl Fn() -> bool,
) -> Result<(), Abandoned> {
    let mut raw: Vec<ffi::MPI_Request> = requests
        .into_iter()
        // SAFETY: `into_raw` only unregisters the request from its scope, so that a scope
        // whose requests are given up on does not abort the process; the request is
        // completed below, or its buffers are left to MPI by the caller (this function's
        // contract).
        .map(|r| unsafe { r.into_raw().0 })
        .collect();
    let count = i32::try_from(raw.len()).unwrap_or(i32::MAX);
    let mut spins = 0u32;
    loop {
        let mut done = 0;
        let status_ptr = match statuses.as_deref_mut() {
            Some(s) => s.as_mut_ptr(),
            None => ffi::RSMPI_STATUSES_IGNORE,
        };
        // SAFETY: `raw` holds `count` live requests (or `MPI_REQUEST_NULL` for the ones
        // completed by an earlier test, which `MPI_Testall` skips); `status_ptr` is
        // `MPI_STATUSES_IGNORE` or `count` writable statuses. `MPI_Testall` completes all
        // of them at once or none (MPI 3.1, 3.7.5), so the statuses it writes belong to
        // the call that returns `done`.
        unsafe {
            ffi::MPI_Testall(count, raw.as_mut_ptr(), &mut done, status_ptr);
        }
        if done != 0 {
            return Ok(());
        }
        if stop() {
            return Err(Abandoned);
        }
        idle(&mut spins);
    }
}

/// Leaves a buffer of an abandoned request to MPI for good: its memory is never freed, so
/// MPI may write into it whenever it completes the request; `buf` is left empty.
pub(super) fn leak<T>(buf: &mut Vec<T>) {
    std::mem::forget(std::mem::take(buf));
}

/// `MPI_Iallgather` of `mine` into `all` (one `mine` per process, in process order),
/// waited for until `stop()`. On `Err` the buffers are leaked and `all` is empty.
pub(super) fn all_gather<T: Equivalence + Copy>(
    comm: &SimpleCommunicator,
    mine: &[T],
    all: &mut Vec<T>,
    stop: impl Fn() -> bool,
) -> Result<(), Abandoned> {
    // Owned, so that it can be left to MPI if the wait is given up on.
    let mut send = mine.to_vec();
    let done = scope(|scope| {
        let request = comm.immediate_all_gather_into(scope, &send[..], &mut all[..]);
        // SAFETY: on `Err`, `send` and `all` are leaked below, before anything else can
        // reach them.
        unsafe { self::all(vec![request], stop) }
    });
    if done.is_err() {
        leak(&mut send);
        leak(all);
    }
    done
}

/// `MPI_Iallgatherv` of `mine` into `all`, process `p`'s `counts[p]` elements at
/// `displs[p]`, waited for until `stop()`. On `Err` the buffers are leaked and `all` is
/// empty.
pub(super) fn all_gather_varcount<T: Equivalence + Copy>(
    comm: &SimpleCommunicator,
    mine: &[T],
    mut counts: Vec<i32>,
    mut displs: Vec<i32>,
    all: &mut Vec<T>,
    stop: impl Fn() -> bool,
) -> Result<(), Abandoned> {
    let mut send = mine.to_vec();
    let done = {
        let mut recv = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
        scope(|scope| {
            let request = comm.immediate_all_gather_varcount_into(scope, &send[..], &mut recv);
            // SAFETY: on `Err`, every buffer of the request (`send`, `all`, `counts`,
            // `displs`) is leaked below, before anything else can reach them.
            unsafe { self::all(vec![request], stop) }
        })
    };
    if done.is_err() {
        leak(&mut send);
        leak(all);
        leak(&mut counts);
        leak(&mut displs);
    }
    done
}

/// The tag of [`exchange`]'s messages.
const TAG_EXCHANGE: i32 = 1;

/// Sends `mine` to every other process of `comm` and receives `counts[q]` bytes from each
/// other process `q`, until every message came or `stop()` says to give up: what came from
/// each process, in process order (`mine` for this process, `process`), `None` from one
/// whose message had not come.
///
/// Point-to-point, rather than one collective: a process that never comes holds up no one
/// else's message, so the processes that do come all learn from each other, and agree on
/// which did not. A receive given up on stays pending, its buffer leaked; a send not yet
/// complete at the end is left to complete on its own, its buffer leaked (see [`leak`]).
pub(super) fn exchange(
    comm: &SimpleCommunicator,
    mine: &[u8],
    counts: &[usize],
    process: usize,
    stop: impl Fn() -> bool,
) -> Vec<Option<Vec<u8>>> {
    // Owned, so that they can be left to MPI.
    let mut send = mine.to_vec();
    let mut inbox: Vec<Vec<u8>> = counts.iter().map(|&n| vec![0u8; n]).collect();
    let others = || (0..counts.len()).filter(move |&q| q != process);
    let (mut receives, mut sends): (Vec<ffi::MPI_Request>, Vec<ffi::MPI_Request>) =
        scope(|scope| {
            let mut receives = Vec::with_capacity(counts.len());
            for (q, buf) in inbox.iter_mut().enumerate().filter(|&(q, _)| q != process) {
                let from = comm.process_at_rank(q as i32);
                let request =
                    from.immediate_receive_into_with_tag(scope, &mut buf[..], TAG_EXCHANGE);
                // SAFETY: `into_raw` only unregisters the request from its scope; it is
                // completed below, or its buffer is leaked below.
                receives.push(unsafe { request.into_raw().0 });
            }
            let sends = others()
                .map(|q| {
                    let to = comm.process_at_rank(q as i32);
                    let request = to.immediate_send_with_tag(scope, &send[..], TAG_EXCHANGE);
                    // SAFETY: as for the receives.
                    unsafe { request.into_raw().0 }
                })
                .collect();
            (receives, sends)
        });
    let mut spins = 0u32;
    loop {
        for request in receives.iter_mut().filter(|r| **r != null_request()) {
            let mut flag = 0;
            // SAFETY: a live request of this function (a completed one is
            // `MPI_REQUEST_NULL`, skipped above); MPI sets it to `MPI_REQUEST_NULL` once
            // complete.
            unsafe { ffi::MPI_Test(request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        }
        if receives.iter().all(|&r| r == null_request()) || stop() {
            break;
        }
        idle(&mut spins);
    }
    let mut sent = 0;
    let count = i32::try_from(sends.len()).unwrap_or(i32::MAX);
    // SAFETY: `sends` holds `count` live or null requests of this function.
    unsafe {
        ffi::MPI_Testall(
            count,
            sends.as_mut_ptr(),
            &mut sent,
            ffi::RSMPI_STATUSES_IGNORE,
        )
    };
    if sent == 0 {
        for request in sends.iter_mut().filter(|r| **r != null_request()) {
            // SAFETY: a live send request: freeing it lets the send complete on its own
            // (MPI 3.1, 3.7.3), reading `send`, which is leaked below.
            unsafe { ffi::MPI_Request_free(request) };
        }
        leak(&mut send);
    }
    let mut heard: Vec<Option<Vec<u8>>> = Vec::with_capacity(counts.len());
    let mut pending = receives.into_iter();
    for (q, buf) in inbox.iter_mut().enumerate() {
        if q == process {
            heard.push(Some(mine.to_vec()));
        } else if pending.next() == Some(null_request()) {
            heard.push(Some(std::mem::take(buf)));
        } else {
            // Still pending: MPI may write into it whenever that process sends.
            leak(buf);
            heard.push(None);
        }
    }
    heard
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: a constant of the MPI library, set before any MPI call can be made.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// Where each process's block starts when blocks of `counts` lie back to back: the
/// displacements of an `MPI_Iallgatherv`. `None` past `i32::MAX`, which MPI cannot address.
pub(super) fn displacements(counts: &[i32]) -> Option<Vec<i32>> {
    counts
        .iter()
        .scan(Some(0i32), |at, &n| {
            let here = (*at)?;
            *at = here.checked_add(n);
            Some(Some(here))
        })
        .collect()
}

/// Every process's `words`, process after process (an `MPI_Iallgather` of the lengths,
/// then an `MPI_Iallgatherv`), waited for until `stop()`.
pub(super) fn all_gather_words(
    comm: &SimpleCommunicator,
    words: &[u64],
    stop: impl Fn() -> bool,
) -> Result<Vec<u64>, Abandoned> {
    let processes = usize::try_from(comm.size()).unwrap_or(0);
    let mut lens = vec![0u64; processes];
    all_gather(comm, &[words.len() as u64], &mut lens, &stop)?;
    // Past what MPI can address, nothing is gathered: every process has the same lengths,
    // so each gets the same empty result (which decodes as no headers, alike everywhere).
    let Some(counts) = lens
        .iter()
        .map(|&n| i32::try_from(n).ok())
        .collect::<Option<Vec<i32>>>()
    else {
        return Ok(Vec::new());
    };
    let Some(displs) = displacements(&counts) else {
        return Ok(Vec::new());
    };
    let total = lens.iter().sum::<u64>();
    let mut every = vec![0u64; usize::try_from(total).unwrap_or(0)];
    all_gather_varcount(comm, words, counts, displs, &mut every, stop)?;
    Ok(every)
}
