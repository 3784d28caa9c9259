//! Communicators: what a fused stage asks of a backend, and the CPU implementation.

mod cpu;
pub(crate) mod reduce;

pub use cpu::{Cpu, CpuComm};
pub use reduce::reduce_reference;

use std::marker::PhantomData;
use std::sync::Arc;

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

/// One value of a bucket: its dtype, element count, and length along its first dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotDesc {
    /// The element type.
    pub dtype: DType,
    /// The number of elements.
    pub len: usize,
    /// The number of rows `ReduceScatter` splits the value into: a tensor's first
    /// dimension (1 for a 0-d tensor), a flat value's length. The other collectives ignore
    /// it, and the ranks need not agree on it (only on `dtype` and `len`).
    pub rows: usize,
}

impl SlotDesc {
    /// A flat value: `rows == len`.
    pub const fn flat(dtype: DType, len: usize) -> Self {
        Self {
            dtype,
            len,
            rows: len,
        }
    }
}

/// What a rank brings to a fused stage, agreed on by every rank before any payload moves.
#[derive(Clone, Copy, Debug)]
pub struct Header<'a> {
    /// Whether this rank has its values.
    pub status: Status,
    /// Its values' dtypes and element counts, in bucket order.
    pub slots: &'a [SlotDesc],
    /// Where each value's elements are, in bucket order (empty for a failed rank): in the
    /// value itself, or at its place in the packed input region. A communicator that
    /// [reads values in place](Communicator::reads_in_place) takes its inputs from here,
    /// which saves the copy into the flat buffer.
    pub data: &'a [SlotData<'a>],
}

/// Result buffers handed from rank 0 to the other ranks of a stage, by dtype index (see
/// [`Communicator::exchange_results`]); each is an `Arc` of the stage's storage.
pub type SharedBuffers = [Option<Arc<dyn std::any::Any + Send + Sync>>; DType::COUNT];

/// Where one value's elements are: a type-erased `&'a [E]`.
///
/// ```
/// use actorgraph::comm::SlotData;
/// use actorgraph::DType;
/// let v = [1.0f32, 2.0];
/// let d = SlotData::new(&v[..]);
/// assert_eq!((d.dtype(), d.len()), (DType::F32, 2));
/// assert_eq!(d.get::<f32>(), Some(&v[..]));
/// assert_eq!(d.get::<i32>(), None);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SlotData<'a> {
    ptr: *const u8,
    len: usize,
    dtype: DType,
    _data: PhantomData<&'a [u8]>,
}

impl<'a> SlotData<'a> {
    /// The elements of `data`.
    pub fn new<E: Element>(data: &'a [E]) -> Self {
        Self {
            ptr: data.as_ptr().cast(),
            len: data.len(),
            dtype: E::DTYPE,
            _data: PhantomData,
        }
    }

    /// The same elements with a lifetime the caller vouches for.
    ///
    /// # Safety
    /// The elements must stay alive and unchanged for as long as the result is used.
    pub(crate) unsafe fn extend<'b>(self) -> SlotData<'b> {
        SlotData {
            ptr: self.ptr,
            len: self.len,
            dtype: self.dtype,
            _data: PhantomData,
        }
    }

    /// The elements, if they are of type `E`.
    pub fn get<E: Element>(&self) -> Option<&'a [E]> {
        // SAFETY: `new` took a `&'a [E]` of `len` elements of this dtype, and a dtype names
        // exactly one element type.
        (self.dtype == E::DTYPE)
            .then(|| unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len) })
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

    /// The address of the first element.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
}

/// Why the ranks of a stage did not run its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disagreement {
    /// `rank` failed before the stage (the lowest such rank).
    Failed {
        /// The failed rank.
        rank: usize,
    },
    /// The ranks put different numbers of values in their buckets.
    BucketSize {
        /// Each rank's number of values.
        counts: Vec<usize>,
    },
    /// The ranks disagree on the dtype or the element count of one value.
    Slot {
        /// The value's position in the bucket.
        slot: usize,
        /// Each rank's dtype and element count for it.
        counts: Vec<(DType, usize)>,
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

/// Aborts a group's communicator from outside: every blocked and every later
/// [`Communicator::stage`] call returns [`StageError::Aborted`].
///
/// The runtime uses it when an execution times out or an actor thread dies, so that the
/// other ranks stop waiting for a peer that will not come.
///
/// ```
/// use actorgraph::comm::AbortHandle;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
/// let flag = Arc::new(AtomicBool::new(false));
/// let f = flag.clone();
/// let handle = AbortHandle::new(move || f.store(true, Ordering::SeqCst));
/// handle.abort();
/// assert!(flag.load(Ordering::SeqCst));
/// ```
#[derive(Clone)]
pub struct AbortHandle(Option<Arc<dyn Fn() + Send + Sync>>);

impl AbortHandle {
    /// A handle that runs `abort` when used.
    pub fn new(abort: impl Fn() + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(abort)))
    }

    /// A handle that does nothing, for communicators that cannot block.
    pub fn noop() -> Self {
        Self(None)
    }

    /// Aborts the communicator.
    pub fn abort(&self) {
        if let Some(f) = &self.0 {
            f();
        }
    }
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortHandle")
    }
}

/// Decides, identically on every rank, whether a stage's payload may run.
///
/// `header(q)` is rank `q`'s header. Every rank must see the same headers and the same
/// collective, so every rank reaches the same verdict. In order, it rejects: a failed rank
/// (the lowest), a root that is not a rank, buckets of different sizes, a slot whose dtype
/// or length differs between ranks, and, for `ReduceScatter`, a slot whose rows or length
/// do not divide by the number of ranks.
///
/// ```
/// use actorgraph::comm::{agree, Collective, Disagreement, Header, SlotDesc, Status};
/// use actorgraph::{DType, ReduceOp};
/// let a = [SlotDesc::flat(DType::F32, 10)];
/// let b = [SlotDesc::flat(DType::F32, 20)];
/// let sum = Collective::AllReduce(ReduceOp::Sum);
/// let headers = [Header { status: Status::Ok, slots: &a, data: &[] }, Header { status: Status::Ok, slots: &b, data: &[] }];
/// let verdict = agree(2, sum, |q| headers[q]);
/// assert!(matches!(verdict, Err(Disagreement::Slot { slot: 0, .. })));
///
/// let same = [Header { status: Status::Ok, slots: &a, data: &[] }; 3];
/// let verdict = agree(3, Collective::ReduceScatter(ReduceOp::Sum), |q| same[q]);
/// assert_eq!(verdict, Err(Disagreement::NotDivisible { slot: 0, len: 10, size: 3 }));
/// ```
pub fn agree<'a>(
    size: usize,
    collective: Collective,
    header: impl Fn(usize) -> Header<'a>,
) -> Result<(), Disagreement> {
    if let Some(rank) = (0..size).find(|&q| header(q).status == Status::Failed) {
        return Err(Disagreement::Failed { rank });
    }
    if let Some(root) = collective.root().filter(|&root| root >= size) {
        return Err(Disagreement::Root { root, size });
    }
    let first = header(0).slots;
    if (1..size).any(|q| header(q).slots.len() != first.len()) {
        return Err(Disagreement::BucketSize {
            counts: (0..size).map(|q| header(q).slots.len()).collect(),
        });
    }
    let key = |s: &SlotDesc| (s.dtype, s.len);
    for (slot, want) in first.iter().enumerate() {
        if (1..size).any(|q| key(&header(q).slots[slot]) != key(want)) {
            return Err(Disagreement::Slot {
                slot,
                counts: (0..size).map(|q| key(&header(q).slots[slot])).collect(),
            });
        }
    }
    if let Collective::ReduceScatter(_) = collective {
        for slot in 0..first.len() {
            for q in 0..size {
                let s = header(q).slots[slot];
                let bad = [s.rows, s.len].into_iter().find(|n| n % size != 0);
                if let Some(len) = bad {
                    return Err(Disagreement::NotDivisible { slot, len, size });
                }
            }
        }
    }
    Ok(())
}

macro_rules! region_mut {
    ($($d:ident: $t:ty),*) => {
        /// A mutable, typed slice of one dtype region of a fused stage's flat buffer.
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum RegionMut<'a> {
            $(
                #[doc = concat!("A region of `", stringify!($t), "`.")]
                $d(&'a mut [$t]),
            )*
        }

        impl RegionMut<'_> {
            /// The region's dtype.
            pub fn dtype(&self) -> DType {
                match self { $(RegionMut::$d(_) => DType::$d,)* }
            }
            /// The region's length in elements.
            pub fn len(&self) -> usize {
                match self { $(RegionMut::$d(s) => s.len(),)* }
            }
            /// Whether the region is empty.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }
            /// The start of the region, type-erased.
            pub fn as_mut_ptr(&mut self) -> *mut u8 {
                match self { $(RegionMut::$d(s) => s.as_mut_ptr().cast(),)* }
            }
        }
    };
}
crate::element::for_each_dtype!(region_mut);

/// The per-rank endpoint of a group's collectives.
///
/// A fused stage calls [`Communicator::stage`] once on every rank, in the same order on
/// every rank. The communicator first agrees on the ranks' [`Header`]s (see [`agree`]); if
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
/// region's length.
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

    /// Whether this communicator takes its inputs from [`Header::data`] rather than from
    /// packed regions. When it does, a stage packs only the values that cannot lend their
    /// elements in place (and `regions` hold results only); when it does not (the
    /// default), every value is packed into `regions` first.
    fn reads_in_place(&self) -> bool {
        false
    }

    /// Whether `stage`, for this collective and header, writes every rank's results into
    /// rank 0's regions only; the ranks then share rank 0's buffers through
    /// [`Communicator::exchange_results`]. A shared-memory communicator does this for large
    /// allreduces: each element of the result is then written once, not once per rank.
    /// The answer must be the same on every rank (decide from the agreed header). The
    /// default: never.
    fn shares_results(&self, collective: Collective, header: &Header<'_>) -> bool {
        let _ = (collective, header);
        false
    }

    /// Called by every rank after a successful stage for which
    /// [`shares_results`](Communicator::shares_results) is true: rank 0 passes its result
    /// buffers (by dtype index), and every other rank receives them in `buffers`.
    fn exchange_results(&mut self, buffers: &mut SharedBuffers) -> Result<(), StageError> {
        let _ = buffers;
        Ok(())
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

    /// The NCCL endpoint behind this communicator, whose stages run on a GPU (see
    /// [`crate::nccl`]). Not for other implementations.
    #[cfg(feature = "nccl")]
    #[doc(hidden)]
    fn nccl(&mut self) -> Option<&mut crate::nccl::NcclComm> {
        None
    }
}

/// A source of communicators: one endpoint per actor of a group.
pub trait Backend {
    /// The endpoint type.
    type Comm: Communicator;
    /// Creates `size` connected endpoints, indexed by rank.
    fn communicators(&self, size: usize) -> Result<Vec<Self::Comm>, Error>;
}

#[cfg(all(test, not(loom)))]
mod proptests;
