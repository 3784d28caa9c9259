//! Soundness regressions of issue 12: what safe code could do to the runtime's memory
//! through the public API, a `Communicator` of its own, and the `__private` items that
//! generated code uses, each now a typed error or a right result.
//!
//! Miri is what finds undefined behaviour: CI runs this file under Miri with both borrow
//! models and strict provenance (`.ci/run`). Without Miri the tests still check the
//! behaviour. The file also holds the two small graphs CI runs under Miri: a 2-actor
//! allreduce below and above the size from which ranks share one result buffer.
#![forbid(unsafe_code)]

use actorgraph::__private::{Group, Links, StepCtx, SyncPoint};
use actorgraph::comm::{
    Call, Collective, CpuComm, Disagreement, Header, RegionMut, SharedBuffers, SlotData, SlotDesc,
    StageError, Status,
};
use actorgraph::prelude::*;
use actorgraph::{Communicator, DType, Element, Reduced};

const SUM: Collective = Collective::AllReduce(ReduceOp::Sum);

/// Runs `rank` on its own thread for each endpoint of a 2-rank CPU communicator.
fn two_ranks<R: Send>(rank: impl Fn(usize, &mut CpuComm) -> R + Sync) -> Vec<R> {
    let comms = Cpu.communicators(2).unwrap();
    std::thread::scope(|s| {
        let threads: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(r, mut comm)| {
                let rank = &rank;
                s.spawn(move || rank(r, &mut comm))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// One stage over `[rank + 1; 4]` (lent in place, the region a copy) with `collective`;
/// the result and what the region holds afterwards.
fn stage_of(
    comm: &mut CpuComm,
    rank: usize,
    collective: Collective,
) -> (Result<(), StageError>, Vec<f32>) {
    let input = vec![rank as f32 + 1.0; 4];
    let mut region = input.clone();
    let slots = [SlotDesc::flat(DType::F32, 4)];
    let header = Header {
        status: Status::Ok,
        slots: &slots,
        dims: &[],
        data: &[SlotData::new(&input[..])],
    };
    let mut regions = [f32::region_mut(&mut region)];
    let r = comm.stage(&header, collective, &mut regions, &mut []);
    (r, region)
}

fn calls_error(r: Result<(), StageError>) -> Vec<Option<Call>> {
    match r {
        Err(StageError::Disagreed(Disagreement::Calls { calls })) => calls,
        other => panic!("expected the ranks' calls to disagree, got {other:?}"),
    }
}

/// Finding 1: rank 0 reduces into rank 1's region while rank 1 copies rank 1's own
/// values over it (a data race). Now every rank sees that the calls differ before it
/// reads anything, and the communicator stays broken, failing at once.
#[test]
fn ranks_that_pass_different_collectives_get_an_error_not_a_race() {
    let collectives = [SUM, Collective::Broadcast { root: 1 }];
    let results = two_ranks(|rank, comm| {
        let first = stage_of(comm, rank, collectives[rank]);
        // The ranks no longer pair their calls: even the same call now fails, at once.
        let second = stage_of(comm, rank, SUM);
        (first, second)
    });
    for (rank, ((first, region), (second, _))) in results.into_iter().enumerate() {
        let want = collectives.map(|c| Some(Call::Stage(c)));
        assert_eq!(calls_error(first), want);
        assert_eq!(region, vec![rank as f32 + 1.0; 4], "nothing moved");
        assert_eq!(calls_error(second), want, "broken for good");
    }
}

/// Finding 2: rank 1 exchanges results while rank 0 runs a stage (of no values, so that
/// the headers agree); their barriers paired up and rank 0 read rank 1's post, never
/// written for that round (a null reference).
#[test]
fn exchange_results_against_a_stage_is_an_error_on_both_ranks() {
    let results = two_ranks(|rank, comm| {
        if rank == 0 {
            let header = Header {
                status: Status::Ok,
                slots: &[],
                dims: &[],
                data: &[],
            };
            comm.stage(&header, SUM, &mut [], &mut [])
        } else {
            comm.exchange_results(&mut SharedBuffers::default())
        }
    });
    for r in results {
        assert_eq!(
            calls_error(r),
            [Some(Call::Stage(SUM)), Some(Call::ExchangeResults)]
        );
    }
}

/// Ranks whose calls went out of step earlier (rank 1 made an extra call) never read a
/// post of another round: rank 0's stage pairs with rank 1's exchange, and both stop.
#[test]
fn an_extra_call_on_one_rank_stops_both_ranks() {
    let results = two_ranks(|rank, comm| {
        if rank == 1 {
            let extra = comm.exchange_results(&mut SharedBuffers::default());
            (extra, stage_of(comm, rank, SUM).0)
        } else {
            (stage_of(comm, rank, SUM).0, stage_of(comm, rank, SUM).0)
        }
    });
    for (first, second) in results {
        let want = [Some(Call::Stage(SUM)), Some(Call::ExchangeResults)];
        assert_eq!(calls_error(first), want);
        assert_eq!(calls_error(second), want);
    }
}

/// A value that cannot lend its elements: it is packed into the stage's buffer (the
/// documented `Bucketable` example).
#[derive(Clone, Debug, PartialEq)]
struct Grad2([f32; 2]);

impl Bucketable for Grad2 {
    type Elem = f32;
    fn bucket_len(&self) -> usize {
        2
    }
    fn pack(&self, dst: &mut [f32]) {
        dst.copy_from_slice(&self.0)
    }
    fn unpack(&self, reduced: Reduced<'_, f32>) -> Self {
        let s = reduced.as_slice();
        Grad2([s[0], s[1]])
    }
}

struct Worker {
    rank: usize,
}

/// Elements of the large allreduce: above the size from which the CPU communicator
/// writes one result for every rank (1 MiB; 1 KiB under Miri).
const BIG: usize = if cfg!(miri) { 512 } else { 1 << 19 };

#[actor]
impl Worker {
    fn grad(&mut self) -> Grad2 {
        let r = self.rank as f32;
        Grad2([r, 10.0 + r])
    }
    fn tensor(&mut self) -> Tensor<f32> {
        Tensor::full([3], self.rank as f32 + 1.0)
    }
    fn loss(&mut self) -> f64 {
        0.5
    }
    fn big(&mut self) -> Tensor<f32> {
        Tensor::full([BIG], self.rank as f32 + 1.0)
    }
}

graph! {
    Small(workers: [Worker]) {
        let g = workers.grad();
        let t = workers.tensor();
        let l = workers.loss();
        allreduce([g, t, l])
    }

    Pair(workers: [Worker]) {
        let g = workers.grad();
        let t = workers.tensor();
        allreduce([g, t])
    }

    Large(workers: [Worker]) {
        let b = workers.big();
        let g = workers.grad();
        allreduce([b, g])
    }
}

fn workers(n: usize) -> Vec<Worker> {
    (0..n).map(|rank| Worker { rank }).collect()
}

/// Finding 3: a packed value (here `Grad2`, next to a lent tensor and a scalar) kept a
/// pointer into the stage's buffer that the next value's packing invalidated (Stacked
/// Borrows). Also the 2-actor allreduce that CI runs under Miri, twice, so that the
/// second execution reuses the buffers.
#[test]
fn a_small_allreduce_through_a_graph() {
    let mut g = Small::launch(workers(2), Cpu).unwrap();
    for _ in 0..2 {
        let out = g.execute().unwrap();
        for (grad, t, loss) in &out {
            assert_eq!(grad, &Grad2([1.0, 21.0]));
            assert_eq!(t.to_vec(), vec![3.0; 3]);
            assert_eq!(*loss, 1.0);
        }
    }
    g.teardown().unwrap();
}

/// The other allreduce that CI runs under Miri: large enough that every rank's outputs
/// view one buffer, written once (and handed over by `exchange_results`).
#[test]
fn a_large_allreduce_shares_one_result_buffer() {
    let mut g = Large::launch(workers(2), Cpu).unwrap();
    for _ in 0..2 {
        let out = g.execute().unwrap();
        assert!(
            out[0].0.shares_storage(&out[1].0),
            "one buffer for both ranks"
        );
        for (b, grad) in &out {
            assert_eq!(b.len(), BIG);
            assert!(b.as_slice().iter().all(|&x| x == 3.0));
            assert_eq!(grad, &Grad2([1.0, 21.0]));
        }
    }
    g.teardown().unwrap();
}

/// A communicator of one rank, written in safe code, that holds on to every slice a
/// header lends while it writes its region, and checks that none of them changes (for
/// stages of `f32` values only).
struct Snoop;

impl Backend for Snoop {
    type Comm = Snoop;
    fn communicators(&self, size: usize) -> Result<Vec<Snoop>, Error> {
        assert_eq!(size, 1, "one rank only");
        Ok(vec![Snoop])
    }
}

impl Communicator for Snoop {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn reads_in_place(&self) -> bool {
        true
    }
    fn stage(
        &mut self,
        header: &Header<'_>,
        _collective: Collective,
        regions: &mut [RegionMut<'_>],
        _outputs: &mut [RegionMut<'_>],
    ) -> Result<(), StageError> {
        let Some(RegionMut::F32(region)) = regions.first_mut() else {
            return Err(StageError::Comm(Error::Backend("no f32 region".into())));
        };
        let mut offset = 0;
        for (slot, data) in header.slots.iter().zip(header.data) {
            let place = offset..offset + slot.len;
            offset += slot.len;
            // A lent slice, held while its value's place in the region is written.
            let Some(lent) = data.lent::<f32>() else {
                continue;
            };
            let before = lent[0];
            region[place.clone()].fill(42.0);
            if lent[0] != before {
                return Err(StageError::Comm(Error::Backend(
                    "a lent slice changed under a write to the region".into(),
                )));
            }
            // One rank: the allreduce of a value is the value.
            region[place].copy_from_slice(lent);
        }
        Ok(())
    }
}

/// Finding 4: `SlotData` handed out a safe `&[E]` into the packed buffer that the same
/// `stage` call hands out as `&mut`; a communicator in safe code read a value through it,
/// wrote the region, and read the value change under its shared slice. Now a packed value
/// lends no slice (the communicator reads it from the region), and a lent one is never in
/// a region.
#[test]
fn a_lent_slice_never_aliases_a_region() {
    let mut g = Pair::launch(workers(1), Snoop).unwrap();
    let out = g.execute().unwrap();
    assert_eq!(out[0].0, Grad2([0.0, 10.0]));
    assert_eq!(out[0].1.to_vec(), vec![1.0; 3]);
}

/// How a hand-written step drives its one fused stage (what `graph!` generates, in
/// order, is `Right`).
#[derive(Clone, Copy, Debug)]
enum Order {
    Right,
    /// Finding 5: an `add` after `pack`, then `prepare` again, which grew the buffer while
    /// a packed value still pointed into it (a use after free).
    AddAfterPack,
    PackBeforePrepare,
    RunWithoutPrepare,
    NeverPacked,
    RunTwice,
}

/// One execution of a hand-written step over `__private`: the reduced tensor, or the
/// stage's error.
fn step(
    _worker: &mut Worker,
    ctx: &mut StepCtx<CpuComm>,
    order: &Order,
) -> Result<Vec<f32>, Error> {
    let (a, b) = (Grad2([1.0, 2.0]), Tensor::full([3], 4.0f32));
    let late = Tensor::full([64], 1.0f32);
    let mut st = ctx.stage(0, &["a", "b"]);
    let ia = st.add(&a);
    let ib = st.add(&b);
    if !matches!(order, Order::PackBeforePrepare | Order::RunWithoutPrepare) {
        st.prepare();
    }
    st.pack(&a, ia);
    if let Order::AddAfterPack = order {
        let at = st.add(&late);
        st.prepare();
        st.pack(&late, at);
    }
    if !matches!(order, Order::NeverPacked) {
        st.pack(&b, ib);
    }
    if let Order::PackBeforePrepare = order {
        st.prepare();
    }
    st.run(SUM)?;
    if let Order::RunTwice = order {
        st.run(SUM)?;
    }
    let (a, b) = (st.output(&a, ia), st.output(&b, ib));
    Ok(a.0.iter().copied().chain(b.to_vec()).collect())
}

/// A group of `n` workers whose step, written by hand over `__private`, runs one fused
/// stage.
fn hand_written<I: Clone + Send + 'static, O: Send + 'static>(
    n: usize,
    step: fn(&mut Worker, &mut StepCtx<CpuComm>, &I) -> Result<O, Error>,
) -> Group<Worker, I, O> {
    let schedule = &[SyncPoint::Stage(0)];
    Group::launch(
        "workers",
        &LaunchOptions::default(),
        workers(n).into(),
        &Cpu,
        &["stage"],
        schedule,
        &Links::new(),
        &step,
        |worker, ctx, input, step| step(worker, ctx, input),
    )
    .unwrap()
}

/// Finding 5, and every other order a hand-written step could call a fused stage in:
/// each is an error from `run`, none a panic or undefined behaviour, and the stage works
/// again at the next execution.
#[test]
fn fused_stage_calls_out_of_order_are_an_error() {
    let mut group = hand_written(1, step);
    let mut run = |order| {
        group.submit(order);
        group.collect(None).map(|mut out| out.remove(0))
    };
    for order in [
        Order::AddAfterPack,
        Order::PackBeforePrepare,
        Order::RunWithoutPrepare,
        Order::NeverPacked,
        Order::RunTwice,
    ] {
        match run(order) {
            Err(Error::Backend(message)) => {
                assert!(message.contains("in that order"), "{order:?}: {message}")
            }
            other => panic!("{order:?}: expected an error, got {other:?}"),
        }
        assert_eq!(run(Order::Right).unwrap(), [1.0, 2.0, 4.0, 4.0, 4.0]);
    }
    group.teardown().unwrap();
}

/// Section 4 at the communicator: `[2, 3]` against `[3, 2]`, the same six elements, is a
/// disagreement on every rank, with both shapes, and nothing is reduced.
#[test]
fn every_rank_sees_a_transposed_shape() {
    let results = two_ranks(|rank, comm| {
        let shape: &[usize] = if rank == 0 { &[2, 3] } else { &[3, 2] };
        let input = vec![1.0f32; 6];
        let mut region = input.clone();
        let slots = [SlotDesc::shaped(DType::F32, shape).unwrap()];
        let header = Header {
            status: Status::Ok,
            slots: &slots,
            dims: shape,
            data: &[SlotData::new(&input[..])],
        };
        let r = comm.stage(&header, SUM, &mut [f32::region_mut(&mut region)], &mut []);
        (r, region)
    });
    for (r, region) in results {
        match r {
            Err(StageError::Disagreed(Disagreement::Slot {
                slot: 0, shapes, ..
            })) => {
                assert_eq!(shapes, [vec![2, 3], vec![3, 2]])
            }
            other => panic!("expected a shape disagreement, got {other:?}"),
        }
        assert_eq!(region, vec![1.0; 6], "nothing reduced");
    }
}

/// Section 4 through a fused stage: each rank's own error from `run` (a hand-written
/// step returns it as its output) is the shape mismatch, naming the value.
#[test]
fn every_rank_names_the_transposed_value() {
    fn transposed(w: &mut Worker, ctx: &mut StepCtx<CpuComm>, _: &()) -> Result<String, Error> {
        let shape = if w.rank == 0 { [2, 3] } else { [3, 2] };
        let g = Tensor::full(shape, 1.0f32);
        let mut st = ctx.stage(0, &["g"]);
        let at = st.add(&g);
        st.prepare();
        st.pack(&g, at);
        Ok(st
            .run(SUM)
            .map_or_else(|e| e.to_string(), |()| "reduced".into()))
    }
    let mut group = hand_written(2, transposed);
    group.submit(());
    for message in group.collect(None).unwrap() {
        assert_eq!(
            message,
            "shape mismatch in stage `stage`, value `g` (slot 0): rank 0 has f32 [2, 3], rank 1 has f32 [3, 2]"
        );
    }
    group.teardown().unwrap();
}
