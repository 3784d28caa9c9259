//! Communicators: what a fused stage asks of a backend, and the CPU implementation.

mod cpu;
pub(crate) mod reduce;

pub use cpu::{Cpu, CpuComm};
pub use reduce::reduce_reference;

use std::sync::Arc;

use crate::{DType, Error};

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Collective {
    /// Every rank gets the element-wise reduction of every rank's buffer.
    AllReduce(ReduceOp),
}

/// Whether a rank reached a fused stage with its values, or failed before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The rank has its values and takes part in the payload.
    Ok,
    /// The rank failed earlier in this execution; every rank skips the payload.
    Failed,
}

/// One value of a bucket: its dtype and element count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotDesc {
    /// The element type.
    pub dtype: DType,
    /// The number of elements.
    pub len: usize,
}

/// What a rank brings to a fused stage, agreed on by every rank before any payload moves.
#[derive(Clone, Copy, Debug)]
pub struct Header<'a> {
    /// Whether this rank has its values.
    pub status: Status,
    /// Its values' dtypes and element counts, in bucket order.
    pub slots: &'a [SlotDesc],
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
/// `header(q)` is rank `q`'s header. Every rank must see the same headers, so every rank
/// reaches the same verdict.
///
/// ```
/// use actorgraph::comm::{agree, Disagreement, Header, SlotDesc, Status};
/// use actorgraph::DType;
/// let a = [SlotDesc { dtype: DType::F32, len: 10 }];
/// let b = [SlotDesc { dtype: DType::F32, len: 20 }];
/// let headers = [Header { status: Status::Ok, slots: &a }, Header { status: Status::Ok, slots: &b }];
/// let verdict = agree(2, |q| headers[q]);
/// assert!(matches!(verdict, Err(Disagreement::Slot { slot: 0, .. })));
/// ```
pub fn agree<'a>(size: usize, header: impl Fn(usize) -> Header<'a>) -> Result<(), Disagreement> {
    if let Some(rank) = (0..size).find(|&q| header(q).status == Status::Failed) {
        return Err(Disagreement::Failed { rank });
    }
    let first = header(0).slots;
    if (1..size).any(|q| header(q).slots.len() != first.len()) {
        return Err(Disagreement::BucketSize {
            counts: (0..size).map(|q| header(q).slots.len()).collect(),
        });
    }
    for (slot, want) in first.iter().enumerate() {
        if (1..size).any(|q| header(q).slots[slot] != *want) {
            return Err(Disagreement::Slot {
                slot,
                counts: (0..size)
                    .map(|q| {
                        let s = header(q).slots[slot];
                        (s.dtype, s.len)
                    })
                    .collect(),
            });
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
region_mut!(F32: f32, F64: f64, I8: i8, U8: u8, I32: i32, U32: u32, I64: i64, U64: u64);

/// The per-rank endpoint of a group's collectives.
///
/// A fused stage calls [`Communicator::stage`] once on every rank, in the same order on
/// every rank. The communicator first agrees on the ranks' [`Header`]s (see [`agree`]); if
/// they disagree, every rank returns [`StageError::Disagreed`] without touching the
/// regions. Otherwise it runs the collective over every region in one launch.
pub trait Communicator: Send + 'static {
    /// This endpoint's rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Runs one fused stage: header agreement, then `collective` over every region.
    ///
    /// `regions` holds at most one region per dtype; a failed rank passes none.
    fn stage(
        &mut self,
        header: &Header<'_>,
        collective: Collective,
        regions: &mut [RegionMut<'_>],
    ) -> Result<(), StageError>;

    /// A handle that aborts this communicator's whole group (see [`AbortHandle`]). The
    /// default cannot abort anything: override it if `stage` can block on a peer.
    fn abort_handle(&self) -> AbortHandle {
        AbortHandle::noop()
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
