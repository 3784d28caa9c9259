//! The flat-buffer layout of one fused stage: one region per dtype, every value of the
//! bucket packed into its dtype's region, outputs handed out as views into it.

use std::sync::Arc;

use crate::comm::{
    Collective, Communicator, Disagreement, Header, RegionMut, SlotDesc, StageError, Status,
};
use crate::tensor::Storage;
use crate::{DType, Element, Error, Tensor};

/// A value that can travel through a fused collective stage.
///
/// A stage asks each value for its length, lets it copy its elements into the stage's flat
/// buffer, and, after the collective, asks it to build its result from the reduced
/// elements. Implemented for [`Tensor<E>`] (the result is a zero-copy view into the flat
/// buffer); implement it for your own types to put them in a bucket.
///
/// ```
/// use actorgraph::{Bucketable, Reduced};
///
/// /// A pair of gradients that travels as one value.
/// #[derive(Clone)]
/// struct Grad2([f32; 2]);
///
/// impl Bucketable for Grad2 {
///     type Elem = f32;
///     fn bucket_len(&self) -> usize { 2 }
///     fn pack(&self, dst: &mut [f32]) { dst.copy_from_slice(&self.0) }
///     fn unpack(&self, reduced: Reduced<'_, f32>) -> Self {
///         let s = reduced.as_slice();
///         Grad2([s[0], s[1]])
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot go through a collective",
    label = "this value's type does not implement `Bucketable`",
    note = "collectives take `Tensor<E>` with E one of f32, f64, i8, u8, i32, u32, i64, u64, or a type that implements `actorgraph::Bucketable`"
)]
pub trait Bucketable: Sized + Send + 'static {
    /// The element type the value is made of.
    type Elem: Element;
    /// The number of elements the value puts in the bucket.
    fn bucket_len(&self) -> usize;
    /// Copies the elements into `dst` (`dst.len() == self.bucket_len()`).
    fn pack(&self, dst: &mut [Self::Elem]);
    /// Builds the result from the reduced elements; `self` is this rank's input value.
    fn unpack(&self, reduced: Reduced<'_, Self::Elem>) -> Self;
}

/// The reduced elements of one value of a bucket, inside the stage's flat buffer.
pub struct Reduced<'a, E> {
    buf: &'a Arc<Storage<E>>,
    offset: usize,
    len: usize,
}

impl<E: Element> Reduced<'_, E> {
    /// The reduced elements.
    pub fn as_slice(&self) -> &[E] {
        &self.buf.host()[self.offset..self.offset + self.len]
    }

    /// A tensor of `shape` viewing the reduced elements without copying them.
    pub fn to_tensor_like(&self, like: &Tensor<E>) -> Tensor<E> {
        Tensor::view(
            Arc::clone(self.buf),
            self.offset,
            self.len,
            Arc::clone(like.shape_arc()),
        )
    }
}

impl<E: Element> Bucketable for Tensor<E> {
    type Elem = E;
    fn bucket_len(&self) -> usize {
        self.len()
    }
    fn pack(&self, dst: &mut [E]) {
        dst.copy_from_slice(self.as_slice());
    }
    fn unpack(&self, reduced: Reduced<'_, E>) -> Self {
        reduced.to_tensor_like(self)
    }
}

/// One dtype's part of a stage's flat buffer.
pub(crate) struct Region<E> {
    /// Reused across executions while no output view holds it.
    buf: Option<Arc<Storage<E>>>,
    len: usize,
}

impl<E: Element> Region<E> {
    const fn new() -> Self {
        Self { buf: None, len: 0 }
    }

    /// Makes `buf` an unshared buffer of at least `len` elements, reusing the last one when
    /// no view of it is alive: in steady state this allocates nothing.
    fn prepare(&mut self) {
        if self.len == 0 {
            return;
        }
        if let Some(v) = self.buf.as_mut().and_then(Arc::get_mut) {
            let v = v.host_mut();
            if v.len() < self.len {
                v.resize(self.len, E::default());
            }
            return;
        }
        self.buf = Some(Arc::new(Storage::Host(vec![E::default(); self.len])));
    }

    fn slice_mut(&mut self) -> &mut [E] {
        match self.buf.as_mut().and_then(Arc::get_mut) {
            Some(v) => &mut v.host_mut()[..self.len],
            None => &mut [],
        }
    }
}

macro_rules! regions {
    ($($field:ident: $t:ty),*) => {
        /// One region per dtype; fields are named after the `DType` variants so that one
        /// list drives both.
        #[allow(non_snake_case)]
        pub(crate) struct Regions { $($field: Region<$t>,)* }

        impl Regions {
            const fn new() -> Self {
                Self { $($field: Region::new(),)* }
            }
            fn reset(&mut self) {
                $(self.$field.len = 0;)*
            }
            fn prepare(&mut self) {
                $(self.$field.prepare();)*
            }
            fn len_of(&mut self, d: DType) -> &mut usize {
                match d { $(DType::$field => &mut self.$field.len,)* }
            }
            /// The non-empty regions, at most one per dtype, on the stack.
            fn with_slices<R>(&mut self, f: impl FnOnce(&mut [RegionMut<'_>]) -> R) -> R {
                let mut all: [RegionMut<'_>; DType::COUNT] = [$(<$t>::region_mut(self.$field.slice_mut()),)*];
                let mut n = 0;
                for i in 0..DType::COUNT {
                    if !all[i].is_empty() {
                        all.swap(n, i);
                        n += 1;
                    }
                }
                f(&mut all[..n])
            }
        }

        /// Maps an element type to its region.
        pub(crate) trait HasRegion: Element {
            fn region(r: &mut Regions) -> &mut Region<Self>;
        }
        $(impl HasRegion for $t {
            fn region(r: &mut Regions) -> &mut Region<Self> { &mut r.$field }
        })*
    };
}

regions!(F32: f32, F64: f64, I8: i8, U8: u8, I32: i32, U32: u32, I64: i64, U64: u64);

/// A slot's position in its dtype's region.
#[derive(Clone, Copy, Debug)]
pub struct SlotIdx {
    offset: usize,
    len: usize,
}

/// The state of one fused collective stage on one rank, kept across executions.
///
/// Generated code drives it in a fixed sequence per execution: [`begin`](Self::begin),
/// [`add`](Self::add) per value, [`pack`](Self::pack) per value, `run` (through the step context), then
/// [`output`](Self::output) per value.
pub struct FusedStage {
    name: &'static str,
    slots: Vec<SlotDesc>,
    regions: Regions,
    /// The execution this stage last took part in (see `StepCtx::drain`).
    pub(crate) last_round: u64,
}

impl FusedStage {
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            slots: Vec::new(),
            regions: Regions::new(),
            last_round: 0,
        }
    }

    /// The stage as written in the graph.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Starts a new layout.
    pub fn begin(&mut self) {
        self.slots.clear();
        self.regions.reset();
    }

    /// Appends a value to the layout and returns its place.
    #[allow(private_bounds)]
    pub fn add<T: Bucketable>(&mut self, value: &T) -> SlotIdx
    where
        T::Elem: HasRegion,
    {
        let len = value.bucket_len();
        let dtype = <T::Elem as Element>::DTYPE;
        self.slots.push(SlotDesc { dtype, len });
        let region_len = self.regions.len_of(dtype);
        let offset = *region_len;
        *region_len += len;
        SlotIdx { offset, len }
    }

    /// Takes the flat buffers for this layout (reusing last execution's where no view of
    /// them is alive).
    pub fn prepare(&mut self) {
        self.regions.prepare();
    }

    /// Copies a value into its place.
    #[allow(private_bounds)]
    pub fn pack<T: Bucketable>(&mut self, value: &T, at: SlotIdx)
    where
        T::Elem: HasRegion,
    {
        let region = T::Elem::region(&mut self.regions);
        let dst = &mut region.slice_mut()[at.offset..at.offset + at.len];
        value.pack(dst);
    }

    /// Agrees with the other ranks, then runs the collective over every region at once.
    pub(crate) fn run<C: Communicator>(
        &mut self,
        comm: &mut C,
        collective: Collective,
        group: &'static str,
    ) -> Result<(), Error> {
        let header = Header {
            status: Status::Ok,
            slots: &self.slots,
        };
        let rank = comm.rank();
        let result = self
            .regions
            .with_slices(|regions| comm.stage(&header, collective, regions));
        result.map_err(|e| stage_error(e, self.name, group, rank))
    }

    /// Takes part in the stage as a failed rank, so that the other ranks skip it too.
    pub(crate) fn skip<C: Communicator>(&mut self, comm: &mut C) {
        let header = Header {
            status: Status::Failed,
            slots: &[],
        };
        // The verdict is "rank r failed" on every rank; the caller already has its error.
        let _ = comm.stage(&header, collective_for_skip(), &mut []);
    }

    /// This rank's result for a value.
    #[allow(private_bounds)]
    pub fn output<T: Bucketable>(&mut self, value: &T, at: SlotIdx) -> T
    where
        T::Elem: HasRegion,
    {
        let region = T::Elem::region(&mut self.regions);
        match &region.buf {
            Some(buf) => value.unpack(Reduced {
                buf,
                offset: at.offset,
                len: at.len,
            }),
            // Only empty regions have no buffer: hand out an empty view.
            None => {
                let buf = Arc::new(Storage::Host(Vec::new()));
                value.unpack(Reduced {
                    buf: &buf,
                    offset: 0,
                    len: 0,
                })
            }
        }
    }
}

fn collective_for_skip() -> Collective {
    Collective::AllReduce(crate::ReduceOp::Sum)
}

fn stage_error(e: StageError, stage: &'static str, group: &'static str, rank: usize) -> Error {
    match e {
        StageError::Comm(e) => e,
        StageError::Aborted => Error::Broken {
            group,
            reason: format!("the communicator was aborted during stage `{stage}`"),
        },
        StageError::Disagreed(Disagreement::Failed { rank: failed_rank }) => Error::Aborted {
            group,
            rank,
            failed_rank,
        },
        StageError::Disagreed(Disagreement::BucketSize { counts }) => {
            Error::BucketMismatch { stage, counts }
        }
        StageError::Disagreed(Disagreement::Slot { slot, counts }) => Error::ShapeMismatch {
            stage,
            slot,
            counts,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_groups_values_by_dtype() {
        let mut st = FusedStage::new("t");
        st.begin();
        let a = Tensor::full([3], 1.0f32);
        let b = Tensor::full([2], 7i64);
        let c = Tensor::full([4], 2.0f32);
        let e = Tensor::<f32>::zeros([0]);
        let (ia, ib, ic, ie) = (st.add(&a), st.add(&b), st.add(&c), st.add(&e));
        assert_eq!((ia.offset, ia.len), (0, 3));
        assert_eq!((ib.offset, ib.len), (0, 2));
        assert_eq!((ic.offset, ic.len), (3, 4));
        assert_eq!((ie.offset, ie.len), (7, 0));
        assert_eq!(st.regions.F32.len, 7);
        assert_eq!(st.regions.I64.len, 2);
        st.prepare();
        st.pack(&a, ia);
        st.pack(&b, ib);
        st.pack(&c, ic);
        st.pack(&e, ie);
        assert_eq!(st.output(&c, ic).to_vec(), vec![2.0; 4]);
        assert_eq!(st.output(&b, ib).to_vec(), vec![7; 2]);
        assert_eq!(st.output(&e, ie).len(), 0);
        assert_eq!(
            st.slots,
            vec![
                SlotDesc {
                    dtype: DType::F32,
                    len: 3
                },
                SlotDesc {
                    dtype: DType::I64,
                    len: 2
                },
                SlotDesc {
                    dtype: DType::F32,
                    len: 4
                },
                SlotDesc {
                    dtype: DType::F32,
                    len: 0
                },
            ]
        );
    }

    /// A fused stage over several tensors of mixed dtypes and lengths gives, for each
    /// tensor, exactly what reducing that tensor alone gives.
    #[test]
    fn fused_stage_matches_a_per_tensor_reference() {
        use crate::comm::{reduce_reference, Backend};
        use crate::{Cpu, ReduceOp};

        let n = 3;
        const LENS: [usize; 5] = [5, 0, 1, 2500, 7];
        let lens = LENS;
        let f = |rank: usize, k: usize| -> Tensor<f32> {
            Tensor::from_vec(
                (0..LENS[k])
                    .map(|i| ((i * 31 + rank * 7 + k) % 13) as f32 - 6.5)
                    .collect(),
                [LENS[k]],
            )
            .unwrap()
        };
        let g = |rank: usize| -> Tensor<i64> {
            Tensor::from_vec((0..9).map(|i| (i * rank) as i64 - 3).collect(), [3, 3]).unwrap()
        };
        for op in [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Avg,
        ] {
            let comms = Cpu.communicators(n).unwrap();
            let threads: Vec<_> = comms
                .into_iter()
                .enumerate()
                .map(|(rank, mut comm)| {
                    std::thread::spawn(move || {
                        let mut st = FusedStage::new("test");
                        let fs: Vec<Tensor<f32>> = (0..lens.len()).map(|k| f(rank, k)).collect();
                        let gi = g(rank);
                        st.begin();
                        let slots: Vec<SlotIdx> = fs.iter().map(|t| st.add(t)).collect();
                        let gslot = st.add(&gi);
                        st.prepare();
                        fs.iter().zip(&slots).for_each(|(t, &s)| st.pack(t, s));
                        st.pack(&gi, gslot);
                        st.run(&mut comm, Collective::AllReduce(op), "g").unwrap();
                        let outs: Vec<Vec<f32>> = fs
                            .iter()
                            .zip(&slots)
                            .map(|(t, &s)| st.output(t, s).to_vec())
                            .collect();
                        (outs, st.output(&gi, gslot).to_vec())
                    })
                })
                .collect();
            let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            for k in 0..lens.len() {
                let inputs: Vec<Vec<f32>> = (0..n).map(|r| f(r, k).to_vec()).collect();
                let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
                let want: Vec<u32> = reduce_reference(&refs, op)
                    .iter()
                    .map(|x| x.to_bits())
                    .collect();
                for (outs, _) in &results {
                    let got: Vec<u32> = outs[k].iter().map(|x| x.to_bits()).collect();
                    assert_eq!(got, want, "op {op:?} tensor {k}");
                }
            }
            let inputs: Vec<Vec<i64>> = (0..n).map(|r| g(r).to_vec()).collect();
            let refs: Vec<&[i64]> = inputs.iter().map(|v| v.as_slice()).collect();
            let want = reduce_reference(&refs, op);
            for (_, gout) in &results {
                assert_eq!(gout, &want, "op {op:?} i64 tensor");
            }
        }
    }

    #[test]
    fn buffer_is_reused_only_when_no_view_is_alive() {
        let mut st = FusedStage::new("t");
        let a = Tensor::full([4], 1u8);
        let round = |st: &mut FusedStage| {
            st.begin();
            let i = st.add(&a);
            st.prepare();
            st.pack(&a, i);
            st.output(&a, i)
        };
        let first = round(&mut st);
        let second = round(&mut st);
        assert!(
            !first.shares_storage(&second),
            "a held view must not be reused"
        );
        drop(first);
        drop(second);
        let third = round(&mut st);
        let ptr = third.as_slice().as_ptr();
        drop(third);
        let fourth = round(&mut st);
        assert_eq!(fourth.as_slice().as_ptr(), ptr, "a free buffer is reused");
    }
}
