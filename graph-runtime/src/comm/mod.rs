//! Communicators: what a fused stage asks of a backend (and, of one whose collectives run
//! over a GPU's memory, [`DeviceComm`]), and the CPU implementation.
//!
//! Here: the vocabulary of a stage (the collective, the header and its slots, the calls
//! the ranks pair up, the verdicts) and the traits a backend implements. Beside it:
//! `agree.rs`, the header check every communicator runs before any payload moves;
//! `abort.rs`, the handle that stops a group from outside; `reduce.rs`, the reduction
//! kernels; `wiring.rs`, where the ends of a graph's edges live; `device.rs`, the device
//! capability; `cpu/`, the shared-memory communicator.

mod abort;
mod agree;
mod cpu;
#[cfg_attr(not(feature = "nccl"), path = "no_device.rs")]
mod device;
pub(crate) mod reduce;
mod wiring;

pub use abort::{AbortHandle, RankState};
pub use agree::agree;
pub use cpu::{Cpu, CpuComm};
pub use device::*;
pub use reduce::reduce_reference;
pub use wiring::{Missed, Port, Ports, Wiring};

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

pub use crate::element::RegionMut;
use crate::{DType, Element, Error};

/// How a reducing collective combines the values of the ranks.
///
/// ```
/// use actorgraph::ReduceOp;
/// assert_eq!(ReduceOp::default(), ReduceOp::Sum);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    #[default]
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the number of ranks (rounded toward zero for integers).
    Avg,
}

impl ReduceOp {
    /// Every reduction, once each, in declaration order: for code that covers them all.
    ///
    /// ```
    /// use actorgraph::ReduceOp;
    /// assert_eq!(ReduceOp::ALL.len(), 5);
    /// assert_eq!(ReduceOp::ALL[0], ReduceOp::default());
    /// ```
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];
}

/// The collective a fused stage runs over its regions.
///
/// Every value of a stage goes through the same collective. Where a value's result has
/// another length than its input (`AllGather`, `ReduceScatter`), the stage hands the
/// communicator a separate output region per dtype (see [`Communicator::stage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Collective {
    /// Every rank gets the element-wise reduction of every rank's values.
    AllReduce(ReduceOp),
    /// Every rank gets, per value, the concatenation of every rank's value in rank order.
    AllGather,
    /// Every rank gets its 1/N contiguous chunk of each value's reduction (rank r gets
    /// elements `[r * len / N, (r + 1) * len / N)`); each value's length along its first
    /// dimension must be a multiple of N.
    ReduceScatter(ReduceOp),
    /// Every rank gets rank `root`'s values.
    Broadcast {
        /// The rank whose values every rank gets.
        root: usize,
    },
    /// Rank `root` gets the element-wise reduction of every rank's values; the other ranks
    /// get nothing.
    Reduce {
        /// How values are combined.
        op: ReduceOp,
        /// The rank that gets the result.
        root: usize,
    },
}

impl Collective {
    /// The collective's name as `graph!` spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce(_) => "allreduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter(_) => "reducescatter",
            Collective::Broadcast { .. } => "broadcast",
            Collective::Reduce { .. } => "reduce",
        }
    }

    /// The root rank, for the collectives that have one.
    pub const fn root(self) -> Option<usize> {
        match self {
            Collective::Broadcast { root } | Collective::Reduce { root, .. } => Some(root),
            _ => None,
        }
    }

    /// The length of the output region for an input region of `len` elements over `ranks`
    /// ranks, for the collectives that need one (`None`: the result is written in place).
    ///
    /// ```
    /// use actorgraph::{comm::Collective, ReduceOp};
    /// assert_eq!(Collective::AllGather.output_len(6, 3), Some(18));
    /// assert_eq!(Collective::ReduceScatter(ReduceOp::Sum).output_len(6, 3), Some(2));
    /// assert_eq!(Collective::AllReduce(ReduceOp::Sum).output_len(6, 3), None);
    /// ```
    pub const fn output_len(self, len: usize, ranks: usize) -> Option<usize> {
        match self {
            Collective::AllGather => len.checked_mul(ranks),
            // Divisibility is the header agreement's business; until then, round down.
            Collective::ReduceScatter(_) => match len.checked_div(ranks) {
                Some(n) => Some(n),
                None => Some(0),
            },
            _ => None,
        }
    }

    /// Whether the stage needs output regions separate from its packed inputs.
    pub const fn has_outputs(self) -> bool {
        matches!(self, Collective::AllGather | Collective::ReduceScatter(_))
    }
}

/// Whether a rank reached a fused stage with its values, or failed before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The rank has its values and takes part in the payload.
    Ok,
    /// The rank failed earlier in this execution; every rank skips the payload.
    Failed,
}

/// One value of a bucket: its dtype, element count, length along its first dimension, and
/// how many dimensions of its shape the header carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotDesc {
    /// The element type.
    pub dtype: DType,
    /// The number of elements.
    pub len: usize,
    /// The number of rows `ReduceScatter` splits the value into: a tensor's first
    /// dimension (1 for a 0-d tensor), a flat value's length. Only `ReduceScatter` reads
    /// it, to check that it divides by the number of ranks.
    pub rows: usize,
    /// The number of dimensions of the value's shape, which [`Header::dims`] holds: 0 for
    /// a value without a shape beyond its length (a scalar, a `Vec`, a 0-d tensor; see
    /// [`Bucketable::shape`](crate::Bucketable::shape)).
    pub ndim: usize,
}

impl SlotDesc {
    /// A flat value: `rows == len`, no shape.
    pub const fn flat(dtype: DType, len: usize) -> Self {
        Self {
            dtype,
            len,
            rows: len,
            ndim: 0,
        }
    }

    /// A value of `shape` (its dimensions go into [`Header::dims`]); `None` if the number
    /// of elements overflows `usize`.
    ///
    /// ```
    /// use actorgraph::{comm::SlotDesc, DType};
    /// let s = SlotDesc::shaped(DType::F32, &[2, 3]).unwrap();
    /// assert_eq!((s.len, s.rows, s.ndim), (6, 2, 2));
    /// ```
    pub fn shaped(dtype: DType, shape: &[usize]) -> Option<Self> {
        let len = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
        Some(Self {
            dtype,
            len,
            rows: shape.first().copied().unwrap_or(1),
            ndim: shape.len(),
        })
    }
}

/// What a rank brings to a fused stage, agreed on by every rank before any payload moves.
#[derive(Clone, Copy, Debug)]
pub struct Header<'a> {
    /// Whether this rank has its values.
    pub status: Status,
    /// Its values' dtypes and element counts, in bucket order.
    pub slots: &'a [SlotDesc],
    /// The shapes of the values, back to back in bucket order: [`SlotDesc::ndim`]
    /// dimensions per value (none for a flat one). Every rank must agree on them (see
    /// [`agree()`]).
    pub dims: &'a [usize],
    /// Where each value's elements are, in bucket order (empty for a failed rank): lent in
    /// place by the value, or packed into the region of its dtype (see [`SlotData`]). A
    /// communicator that [reads values in place](Communicator::reads_in_place) takes its
    /// inputs from here, which saves the copy into the flat buffer.
    pub data: &'a [SlotData<'a>],
}

impl Header<'static> {
    /// The header of a rank that failed before the stage: no values. Every rank then skips
    /// the payload, whatever the collective.
    pub const FAILED: Header<'static> = Header {
        status: Status::Failed,
        slots: &[],
        dims: &[],
        data: &[],
    };
}

impl<'a> Header<'a> {
    /// The bytes of every value together (saturating).
    pub fn bytes(&self) -> usize {
        self.slots
            .iter()
            .map(|s| s.len.saturating_mul(s.dtype.size()))
            .fold(0, usize::saturating_add)
    }

    /// Each value's shape, in bucket order: its [`SlotDesc::ndim`] dimensions from
    /// [`dims`](Self::dims). `None` if `dims` does not hold exactly as many dimensions as
    /// the slots declare.
    ///
    /// ```
    /// use actorgraph::comm::{Header, SlotDesc, Status};
    /// use actorgraph::DType;
    /// let slots = [SlotDesc::shaped(DType::F32, &[2, 3]).unwrap(), SlotDesc::flat(DType::U8, 4)];
    /// let header = Header { status: Status::Ok, slots: &slots, dims: &[2, 3], data: &[] };
    /// let shapes: Vec<&[usize]> = header.shapes().unwrap().collect();
    /// assert_eq!(shapes, [&[2, 3][..], &[][..]]);
    /// ```
    pub fn shapes(&self) -> Option<impl Iterator<Item = &'a [usize]> + 'a> {
        let total = self
            .slots
            .iter()
            .try_fold(0usize, |n, s| n.checked_add(s.ndim))?;
        let (slots, mut rest) = (self.slots, self.dims);
        (total == rest.len()).then(move || {
            slots.iter().map(move |s| {
                let (shape, tail) = rest.split_at(s.ndim);
                rest = tail;
                shape
            })
        })
    }
}

/// Result buffers handed from rank 0 to the other ranks of a stage, by dtype index (see
/// [`Communicator::exchange_results`]); each is an `Arc` of the stage's storage.
pub type SharedBuffers = [Option<Arc<dyn std::any::Any + Send + Sync>>; DType::COUNT];

/// Where one value's input elements are for a stage: lent in place by the value (a
/// type-erased `&'a [E]`), or packed into the stage's region of its dtype.
///
/// A packed value is at its place in the layout (see [`Communicator`]): a communicator
/// reads it from the region it is given, never through a `SlotData`, so that the only
/// references into a region are the ones the communicator holds. Lent elements are never
/// in a region.
///
/// ```
/// use actorgraph::comm::SlotData;
/// use actorgraph::DType;
/// let v = [1.0f32, 2.0];
/// let lent = SlotData::new(&v[..]);
/// assert_eq!((lent.dtype(), lent.len()), (DType::F32, 2));
/// assert_eq!(lent.lent::<f32>(), Some(&v[..]));
/// assert_eq!(lent.lent::<i32>(), None);
///
/// let packed = SlotData::packed(DType::F32, 2);
/// assert!(packed.is_packed());
/// assert_eq!(packed.lent::<f32>(), None);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SlotData<'a> {
    /// The lent elements; `None` for a packed value.
    lent: Option<NonNull<u8>>,
    len: usize,
    dtype: DType,
    _data: PhantomData<&'a [u8]>,
}

// SAFETY: a `SlotData<'a>` stands for a `&'a [E]` of an `Element` type (or for nothing, when
// packed), and every element type is plain `Send + Sync` data, as `&'a [E]` is then `Send`
// and `Sync`: it only ever gives out shared slices (`lent`), for at most `'a`, on whichever
// thread holds it. It lets a fused stage, which keeps its entries between stages, move with
// its actor to another thread (see `exec::help`).
unsafe impl Send for SlotData<'_> {}
// SAFETY: as for `Send` above: shared access gives out only shared slices of `Sync` data.
unsafe impl Sync for SlotData<'_> {}

impl<'a> SlotData<'a> {
    /// The elements of `data`, lent in place.
    pub fn new<E: Element>(data: &'a [E]) -> Self {
        Self {
            lent: Some(NonNull::from(data).cast()),
            len: data.len(),
            dtype: E::DTYPE,
            _data: PhantomData,
        }
    }

    /// `len` elements of `dtype` packed into the stage's region of that dtype, at the
    /// value's place in the layout.
    pub const fn packed(dtype: DType, len: usize) -> Self {
        Self {
            lent: None,
            len,
            dtype,
            _data: PhantomData,
        }
    }

    /// The same entry with a lifetime the caller vouches for.
    ///
    /// # Safety
    /// Lent elements must stay alive and unchanged for as long as the result is used.
    pub(crate) unsafe fn extend<'b>(self) -> SlotData<'b> {
        SlotData {
            lent: self.lent,
            len: self.len,
            dtype: self.dtype,
            _data: PhantomData,
        }
    }

    /// The lent elements, if the value lent them and they are of type `E` (`None` for a
    /// packed value: read it from the region).
    pub fn lent<E: Element>(&self) -> Option<&'a [E]> {
        let ptr = self.lent.filter(|_| self.dtype == E::DTYPE)?;
        // SAFETY: `new` took this pointer from a `&'a [E]` of `len` elements, alive and
        // unchanged for `'a` (`extend`'s callers vouch for the same), and a dtype names
        // exactly one element type.
        Some(unsafe { std::slice::from_raw_parts(ptr.as_ptr().cast::<E>(), self.len) })
    }

    /// The address of the lent elements (`None` for a packed value), for a communicator
    /// that reads them on another thread.
    pub(crate) fn lent_ptr(&self) -> Option<*const u8> {
        self.lent.map(|p| p.as_ptr().cast_const())
    }

    /// Whether the value is packed into its region rather than lent.
    pub fn is_packed(&self) -> bool {
        self.lent.is_none()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One call of a rank into its communicator, as the other ranks see it: what the ranks of
/// a group must make alike, call for call, before any of them reads what another posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Call {
    /// [`Communicator::stage`] of this collective (with its op and root).
    Stage(Collective),
    /// [`Communicator::exchange_results`].
    ExchangeResults,
    /// The confirmation, after a stage's launch, that it went through on this rank (the
    /// NCCL backend's second step of a stage).
    Launched,
}

impl Call {
    /// Whether a rank's call pairs up with another's: the same call, except that the
    /// collective of a stage does not matter when a rank joins it as failed (`any_failed`):
    /// every rank then skips the payload, and a rank that failed before it learnt which
    /// stage it skips may not know the collective.
    pub(crate) fn pairs_with(self, other: Call, any_failed: bool) -> bool {
        match (self, other) {
            (Call::Stage(_), Call::Stage(_)) => self == other || any_failed,
            _ => self == other,
        }
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Call::Stage(c) => write!(f, "stage {c:?}"),
            Call::ExchangeResults => f.write_str("exchange_results"),
            Call::Launched => f.write_str("launch confirmation"),
        }
    }
}

/// Why the ranks of a stage did not run its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disagreement {
    /// `rank` failed before the stage (the lowest such rank).
    Failed {
        /// The failed rank.
        rank: usize,
    },
    /// The ranks made different calls at the same point: another collective, op or root
    /// (unless a rank joined the stage as failed: then the collective does not matter),
    /// or `stage` on one rank and `exchange_results` on another (a bug in the code that
    /// drives the communicator, never in a graph's values). Nothing was read from any
    /// peer. The ranks' calls no longer pair up, so the communicator is broken: every later
    /// call on every rank fails with this again.
    Calls {
        /// Each rank's call at this point, by rank: `None` for a rank that made no call
        /// for this round (it waits elsewhere, e.g. at a later barrier of another call).
        calls: Vec<Option<Call>>,
    },
    /// The ranks put different numbers of values in their buckets.
    BucketSize {
        /// Each rank's number of values.
        counts: Vec<usize>,
    },
    /// The ranks disagree on the dtype, the element count or the shape of one value.
    Slot {
        /// The value's position in the bucket.
        slot: usize,
        /// Each rank's dtype and element count for it.
        counts: Vec<(DType, usize)>,
        /// Each rank's shape for it (empty for a value without one).
        shapes: Vec<Vec<usize>>,
    },
    /// A `ReduceScatter` value cannot be split evenly over the ranks.
    NotDivisible {
        /// The value's position in the bucket.
        slot: usize,
        /// Its length along the split dimension (its rows, or its element count where the
        /// rows divide but the elements do not), on the lowest rank where it does not divide.
        len: usize,
        /// The number of ranks.
        size: usize,
    },
    /// The collective's root is not a rank of the group.
    Root {
        /// The root given.
        root: usize,
        /// The number of ranks.
        size: usize,
    },
    /// The ranks' buffers do not match their headers (a bug in the caller of the
    /// communicator, never in a graph's values).
    Buffers {
        /// What does not match.
        reason: String,
    },
}

/// Where a stage is when [`Communicator::start_stage`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Over: the results are in the regions, as after [`Communicator::stage`].
    Complete,
    /// Going on: [`Communicator::complete_stage`] waits for it.
    InFlight,
}

/// Why a communicator's stage did not complete.
#[derive(Debug)]
pub enum StageError {
    /// The header agreement found a failed rank or different layouts; every rank skipped
    /// the payload and the communicator is ready for the next stage.
    Disagreed(Disagreement),
    /// The communicator was aborted through its [`AbortHandle`]; it stays unusable.
    Aborted,
    /// The communicator itself failed.
    Comm(Error),
}

/// The per-rank endpoint of a group's collectives.
///
/// A fused stage calls [`Communicator::stage`] once on every rank, in the same order on
/// every rank. The communicator first agrees on the ranks' [`Header`]s (see [`agree()`]); if
/// they disagree, every rank returns [`StageError::Disagreed`] without touching the
/// regions. Otherwise it runs the collective over every region in one launch.
///
/// # Layout of the regions
///
/// A stage packs its values into one region per dtype: the values of a dtype, in bucket
/// order (the order of [`Header::slots`]), back to back. A value's result goes:
/// - `AllReduce`, `Broadcast`, `Reduce`: in place, over the value's own elements (for
///   `Reduce`, only the root's result is used);
/// - `AllGather`: into the output region of its dtype, slot-major: a value of `len`
///   elements at offset `o` of its input region gets `N * len` elements at offset `N * o`,
///   rank `q`'s elements at `N * o + q * len`;
/// - `ReduceScatter`: into the output region of its dtype, at offset `o / N`, `len / N`
///   elements: this rank's chunk of the value's reduction.
///
/// An implementation may rely on this layout; [`Collective::output_len`] gives each output
/// region's length. A value that [lends its elements](SlotData::lent) is not packed: its
/// place in `regions` is there for its result only.
///
/// # Soundness
///
/// The trait is safe to implement and to call: safe code may call an implementation's
/// methods in any order, with any arguments, on any rank, and it must stay sound. What the
/// runtime hands an implementation never aliases: `regions` and `outputs` are exclusive,
/// and [`Header::data`] holds either lent elements, a shared slice valid for the call and
/// never inside a region, or the mark of a packed value, which the implementation reads
/// from `regions` at its place. An implementation whose ranks read each other's memory
/// must not trust that its peers made the same call: [`CpuComm`] ties each rank's post to
/// one barrier round and one [`Call`], and dereferences nothing a peer posted until every
/// rank is known to have made the same call for that round (a mismatch is
/// [`Disagreement::Calls`] on every rank).
pub trait Communicator: Send + 'static {
    /// This endpoint's rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Runs one fused stage: header agreement, then `collective` over every region.
    ///
    /// `regions` holds the packed inputs, at most one region per dtype; the in-place
    /// collectives leave their results there. `outputs` holds, for a collective that
    /// [has outputs](Collective::has_outputs), the output region of each dtype of
    /// `regions`, [`Collective::output_len`] long; it is empty for the other collectives.
    /// Empty regions are left out of both, and a failed rank passes none. An output is
    /// written only by its own rank; peers read only inputs.
    fn stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError>;

    /// Starts one fused stage that the step completes later ([`Communicator::complete_stage`]),
    /// running other methods meanwhile: a stage that the graph's next calls do not read.
    /// The arguments are [`stage`](Communicator::stage)'s, and so is what it must do, but it
    /// may return [`Progress::InFlight`] before the stage is over, the rest going on in the
    /// background (on another thread, or on a device's stream). Lent values
    /// ([`Header::data`]) may be read during this call only: the step drops or moves them
    /// after it.
    ///
    /// Every rank of the group calls it for the same stages (the graph's deferred stages;
    /// [`stage`](Communicator::stage) for the others), in the same order; a rank may start
    /// further stages before it completes this one, and completes them in the order it
    /// started them. A stage in flight must end without this rank's help: its completion
    /// may wait for the other ranks' starts, never for their completions, which they may
    /// reach only after this rank's later calls (an edge this rank sends on). The default
    /// runs [`stage`](Communicator::stage) to its end.
    fn start_stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<Progress, StageError> {
        self.stage(header, collective, regions, outputs)
            .map(|()| Progress::Complete)
    }

    /// Waits for the oldest stage that [`start_stage`](Communicator::start_stage) left
    /// [in flight](Progress::InFlight) and leaves its results in `regions` and `outputs`:
    /// the buffers that `start_stage` got, with the same layout, untouched by the rank
    /// meanwhile. An error as [`stage`](Communicator::stage)'s. The default does nothing
    /// (a communicator that never returns `InFlight` is never asked).
    fn complete_stage(
        &mut self,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
        outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        let _ = (collective, regions, outputs);
        Ok(())
    }

    /// Whether this communicator takes its inputs from [`Header::data`] rather than from
    /// packed regions. When it does, a stage packs only the values that cannot lend their
    /// elements in place (their entries say so: [`SlotData::is_packed`]), and the places of
    /// the lent ones in `regions` hold results only; when it does not (the default), every
    /// value is packed into `regions` first.
    fn reads_in_place(&self) -> bool {
        false
    }

    /// Whether `stage`, for this collective and header, writes the results of several ranks
    /// into the regions of one of them only (the one whose
    /// [`lends_results`](Communicator::lends_results) is true); those ranks then share its
    /// buffers through [`Communicator::exchange_results`]. A shared-memory communicator does
    /// this for large allreduces: each element of the result is then written once, not
    /// once per rank. The answer must be the same on every rank that shares (decide from
    /// the agreed header). The default: never.
    fn shares_results(&self, collective: Collective, header: &Header<'_>) -> bool {
        let _ = (collective, header);
        false
    }

    /// Called by every rank after a successful stage for which
    /// [`shares_results`](Communicator::shares_results) is true: the rank that
    /// [lends](Communicator::lends_results) passes its result buffers (by dtype index), and
    /// every other rank receives them in `buffers`.
    fn exchange_results(&mut self, buffers: &mut SharedBuffers) -> Result<(), StageError> {
        let _ = buffers;
        Ok(())
    }

    /// Whether this rank's buffers are the ones [`exchange_results`] hands to the ranks it
    /// shares results with. The default: rank 0 (one group of ranks sharing).
    ///
    /// [`exchange_results`]: Communicator::exchange_results
    fn lends_results(&self) -> bool {
        self.rank() == 0
    }

    /// A handle that aborts this communicator's whole group (see [`AbortHandle`]). The
    /// default cannot abort anything: override it if `stage` can block on a peer.
    fn abort_handle(&self) -> AbortHandle {
        AbortHandle::noop()
    }

    /// Called once on the actor's own thread, before its first step: the place to bind
    /// per-thread resources (a GPU context, a communicator that cannot change threads).
    /// Every rank of a group is attached concurrently, and `launch` returns the first
    /// error. The default does nothing.
    fn attach(&mut self) -> Result<(), Error> {
        Ok(())
    }

    /// Whether, once attached, this endpoint's stages may run on a thread other than the
    /// one [`attach`](Communicator::attach) ran on. If so, and the actors may change
    /// threads (ready values, which are `Send`), the thread that calls `execute` runs the
    /// first actor's step itself instead of handing it over and waiting for it, and then,
    /// when the actor threads outnumber the cores, every step that none has started yet:
    /// one thread switch less per execution, and none at all for steps whose threads are
    /// not running. The default, `false`, keeps every step on its actor's thread (the NCCL
    /// backend's endpoints are bound to their thread's GPU).
    ///
    /// ```
    /// use actorgraph::{Backend, Communicator, Cpu};
    /// let comms = Cpu.communicators(2).unwrap();
    /// assert!(comms.iter().all(|c| c.runs_on_any_thread()));
    /// ```
    fn runs_on_any_thread(&self) -> bool {
        false
    }

    /// The communicator's device capability, if its collectives run over a GPU's memory:
    /// a fused stage then keeps its flat buffers on that GPU (see [`DeviceComm`]). The
    /// default, `None`: host memory.
    fn device_comm(&mut self) -> Option<&mut dyn DeviceComm> {
        None
    }

    /// Called on this rank's thread when its step fails with `error` (before it takes part
    /// in the rest of the execution's stages as a failed rank): a communicator whose peers
    /// cannot see this process's errors (the MPI backend's other processes) keeps it, to
    /// send with the next stage. The default does nothing.
    fn note_failure(&mut self, error: &Error) {
        let _ = error;
    }

    /// Whether the group's ranks live in more than one process. A step whose methods run
    /// after its last stage then ends with an empty stage, so that an error there reaches
    /// the other processes as an error before a stage does. The default: `false` (the
    /// driver of the one process sees every rank's error).
    fn spans_processes(&self) -> bool {
        false
    }
}

/// What `launch` tells a [`Backend`] about a graph before it asks for any communicator
/// (see [`Backend::join`]).
#[derive(Clone, Copy, Debug)]
pub struct GraphInfo<'a> {
    /// The graph's name.
    pub name: &'static str,
    /// A hash of the graph's structure and types, computed by `graph!` (the graph's
    /// `FINGERPRINT`): equal for the same graph in the same program.
    pub fingerprint: u64,
    /// Each group's name and the number of actors this caller gives it, in declaration
    /// order.
    pub groups: &'a [(&'static str, usize)],
    /// The value carried by each edge between actors, in the graph's order.
    pub edges: &'a [&'static str],
}

/// A source of communicators: one endpoint per actor of a group.
pub trait Backend {
    /// The endpoint type.
    type Comm: Communicator;
    /// Creates `size` connected endpoints, indexed by rank.
    fn communicators(&self, size: usize) -> Result<Vec<Self::Comm>, Error>;

    /// Called once by `launch`, before anything else: the size of each of `graph`'s groups,
    /// in declaration order, which `launch` then checks the graph against (roots, indices,
    /// fixed sizes). A backend whose groups span processes agrees here with the other
    /// processes on the layout (see the MPI backend); the default, for a backend whose
    /// ranks are all in this process, returns the number of actors given.
    ///
    /// ```
    /// use actorgraph::comm::GraphInfo;
    /// use actorgraph::{Backend, Cpu};
    /// let info = GraphInfo { name: "G", fingerprint: 7, groups: &[("workers", 3)], edges: &[] };
    /// assert_eq!(Cpu.join(&info).unwrap(), [3]);
    /// ```
    fn join(&self, graph: &GraphInfo<'_>) -> Result<Vec<usize>, Error> {
        Ok(graph.groups.iter().map(|&(_, n)| n).collect())
    }

    /// The endpoints of the `size` actors this process gives group `group` of the graph
    /// just [joined](Backend::join), indexed by local position; each endpoint's
    /// [`rank`](Communicator::rank) is its rank in the whole group. The default:
    /// [`communicators`](Backend::communicators).
    fn group_communicators(
        &self,
        group: &'static str,
        size: usize,
    ) -> Result<Vec<Self::Comm>, Error> {
        let _ = group;
        self.communicators(size)
    }

    /// Called once by `launch` after it launched every group here (`launched` is its
    /// error, if it failed): a backend whose groups span processes learns whether every
    /// process launched, and fails the launch of the others when one did not, so that no
    /// process waits in a stage for one whose graph does not exist. The default: `Ok`.
    fn confirm(&self, launched: Option<&Error>) -> Result<(), Error> {
        let _ = launched;
        Ok(())
    }

    /// Called by `launch` after [`join`](Backend::join), before it makes the graph's edges:
    /// where the ranks of the graph just joined live, and the transport for the edges
    /// between processes (see [`Wiring`]). The default, for a backend whose ranks are all
    /// in this process: [`Wiring::local`], every edge a slot in memory.
    fn wiring(&self) -> Result<Wiring, Error> {
        Ok(Wiring::local())
    }
}
