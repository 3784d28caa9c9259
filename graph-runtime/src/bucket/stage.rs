//! [`FusedStage`]: one fused collective stage on one rank, driven in a fixed sequence
//! (begin, add, prepare, pack, start or run, output) and kept across executions, and the handles
//! through which a value's walk over its parts reaches it ([`Layout`], [`Hand`],
//! [`Parts`]). What those handles do is in `parts.rs`, which depends on this file, not
//! the other way.

use std::marker::PhantomData;

use super::device::{device_of, on_device, Device};
use super::failure::{stage_error, SlotOf};
use super::kept::Kept;
use super::region::{Regions, SlotIdx};
use super::{Bucketable, Gather, Scatter};
use crate::comm::{
    Collective, Communicator, Header, Progress, SharedBuffers, SlotData, SlotDesc, StageError,
    Status,
};
use crate::{DType, Element, Error};

/// Where a fused stage is in its sequence (see [`FusedStage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Between executions: `begin` comes next.
    Idle,
    /// Laying out: `add`s, then `prepare`.
    Adding,
    /// The buffers are taken: `pack`s, then `run`.
    Packing,
    /// The collective ran (or failed): the `output`s.
    Ran,
}

/// One slot's place: where it is (what `add` returned for it) and its element type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Place {
    pub(super) idx: SlotIdx,
    pub(super) dtype: DType,
    /// The value this slot is a part of, by its position in the bucket.
    value: usize,
    /// The item this slot belongs to, when the value is a list laid out item by item.
    item: Option<usize>,
    /// Whether the slot holds a list's length (`Layout::agree_len`), not elements.
    length: bool,
}

/// The state of one fused collective stage on one rank, kept across executions.
///
/// Generated code drives it in a fixed sequence per execution: [`begin`](Self::begin),
/// an `add` per value, [`prepare`](Self::prepare), a `pack` per value, `run` (through the
/// step context), then an `output` per value. The `add`/`pack`/`output` methods come in one
/// flavour per kind of collective, each bound by the trait that kind needs, so that a value
/// of the wrong type gets one error.
///
/// The sequence is enforced: a call out of order (an `add` after `prepare`, a `pack` of a
/// slot this layout does not have, a `run` without `prepare`, a value never packed) does
/// nothing but make `run` fail with an error on this rank, which takes part in the stage
/// as failed, so that its peers skip it too. `output` is always memory-safe; out of order
/// its result is meaningless.
pub struct FusedStage {
    pub(super) name: &'static str,
    /// The names of the stage's values as written in the graph, by slot (empty when not
    /// known).
    values: &'static [&'static str],
    phase: Phase,
    pub(super) slots: Kept<SlotDesc>,
    /// The shapes of the values, back to back (see [`Header::dims`]).
    pub(super) dims: Kept<usize>,
    /// Per slot, its place.
    pub(super) places: Kept<Place>,
    /// Per slot, whether its value was handed to the stage (packed or lent) in this
    /// execution: apart from `places`, which stay the same from one execution to the next.
    handed_slots: Vec<bool>,
    /// How many of them were handed in this execution.
    pub(super) handed: usize,
    /// How many values were added in this execution (a value may take several slots).
    value_count: usize,
    /// The item of a list whose parts are being laid out (see `Layout::items`).
    pub(super) item: Option<usize>,
    /// An error found before `run` (a failed device copy, a value on the wrong GPU, a call
    /// out of order): `run` reports it, after joining the stage as failed so that no peer
    /// waits.
    pub(super) failed: Option<Error>,
    /// Device mode (the communicator runs on a GPU): the actor's device. Set by
    /// `prepare_device`, cleared by `prepare`.
    pub(super) device: Option<Device>,
    /// Where each slot's elements are for this execution (see [`Header::data`]): packed
    /// into our region (an entry that holds no pointer, so the region may be borrowed
    /// mutably again), or lent by the value. Lent entries are set only by `Stage::pack`,
    /// whose borrow keeps the value alive until the `Stage` is dropped; every later use
    /// of this stage starts with `begin`, which clears them.
    data: Vec<SlotData<'static>>,
    /// The packed inputs; the in-place collectives leave their results here.
    pub(super) inputs: Regions,
    /// The results of `allgather` and `reducescatter`, whose lengths differ from the
    /// inputs'. Reused like the inputs: only while no view of them is alive.
    pub(super) outputs: Regions,
    /// This rank and the group's size, as of the last `run`.
    rank: usize,
    pub(super) ranks: usize,
    /// The execution this stage last took part in (see `StepCtx::drain`).
    pub(crate) last_round: u64,
    /// Whether the step completes this stage later than it starts it, with calls between:
    /// it starts through [`Communicator::start_stage`] (see [`FusedStage::start`]).
    pub(crate) deferred: bool,
    /// Started and in flight: its collective, and whether its results are then shared
    /// (see `run`).
    pending: Option<(Collective, bool)>,
}

impl FusedStage {
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            values: &[],
            phase: Phase::Idle,
            slots: Kept::new(),
            dims: Kept::new(),
            places: Kept::new(),
            handed_slots: Vec::new(),
            handed: 0,
            value_count: 0,
            item: None,
            failed: None,
            device: None,
            data: Vec::new(),
            inputs: Regions::new(),
            outputs: Regions::new(),
            rank: 0,
            ranks: 1,
            last_round: 0,
            deferred: false,
            pending: None,
        }
    }

    /// The stage as written in the graph.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The slots of the current layout (for its trace span).
    pub(crate) fn slots(&self) -> &[SlotDesc] {
        &self.slots
    }

    /// Names the stage's values, by slot, as written in the graph (for errors).
    pub(crate) fn name_values(&mut self, values: &'static [&'static str]) {
        self.values = values;
    }

    /// Starts a new layout.
    pub fn begin(&mut self) {
        self.phase = Phase::Adding;
        self.slots.clear();
        self.dims.clear();
        self.places.clear();
        self.handed_slots.clear();
        self.handed = 0;
        self.value_count = 0;
        self.item = None;
        self.data.clear();
        self.failed = None;
        self.inputs.reset();
    }

    /// Notes a call out of order, for `run` to report (the first one).
    #[cold]
    fn misuse(&mut self, what: std::fmt::Arguments<'_>) {
        if self.failed.is_none() {
            self.failed = Some(Error::Backend(format!(
                "stage `{}`: {what} (a fused stage runs begin, add, prepare, pack, run, \
                 output, in that order)",
                self.name
            )));
        }
    }

    /// Appends a value of `dtype` and `shape`, `len` elements in `rows` rows, to the
    /// layout; on the device or not, a list's length or not. (Scalars rather than a `SlotDesc`: built by the caller and passed in memory,
    /// it costs a stalled load per value.)
    #[inline]
    fn push_slot(
        &mut self,
        (dtype, len, rows): (DType, usize, usize),
        shape: &[usize],
        (device, length): (bool, bool),
    ) -> SlotIdx {
        if self.phase != Phase::Adding {
            self.misuse(format_args!("a value was added outside the layout phase"));
            return SlotIdx::NONE;
        }
        let Some(offset) = self.inputs.append(dtype, len, device) else {
            self.misuse(format_args!(
                "the values add up to more than usize::MAX elements"
            ));
            return SlotIdx::NONE;
        };
        let slot = self.slots.len();
        let ndim = shape.len();
        self.slots.push(SlotDesc {
            dtype,
            len,
            rows,
            ndim,
        });
        self.dims.extend_from_slice(shape);
        let idx = SlotIdx {
            slot,
            offset,
            len,
            device,
            parts: 1,
        };
        self.places.push(Place {
            idx,
            dtype,
            value: self.value_count,
            item: self.item,
            length,
        });
        self.handed_slots.push(false);
        self.data.push(SlotData::packed(dtype, len));
        idx
    }

    /// Appends a value, with all its parts, to the layout and returns its place.
    pub fn add<T: Bucketable>(&mut self, value: &T) -> SlotIdx {
        let first = self.slots.len();
        value.add_parts(&mut Layout {
            st: self,
            gather: false,
            depth: 0,
        });
        self.added(first)
    }

    /// [`add`](Self::add) for `allgather`.
    pub fn add_gather<T: Gather>(&mut self, value: &T) -> SlotIdx {
        let first = self.slots.len();
        value.add_parts(&mut Layout {
            st: self,
            gather: true,
            depth: 0,
        });
        self.added(first)
    }

    /// [`add`](Self::add) for `reducescatter`: the header carries each part's rows too.
    pub fn add_scatter<T: Scatter>(&mut self, value: &T) -> SlotIdx {
        let first = self.slots.len();
        value.add_scatter_parts(&mut Layout {
            st: self,
            gather: false,
            depth: 0,
        });
        self.added(first)
    }

    /// The place of the value whose parts took the slots from `first` on: its one part's,
    /// or the range of its parts.
    #[inline]
    fn added(&mut self, first: usize) -> SlotIdx {
        self.value_count += 1;
        match self.slots.len() - first {
            1 => self.places[first].idx,
            parts => SlotIdx {
                slot: first,
                offset: 0,
                len: 0,
                device: false,
                parts,
            },
        }
    }

    /// Appends one part, a value's own elements, to the layout.
    #[inline]
    pub(super) fn add_leaf<T: Bucketable>(&mut self, value: &T) {
        let (dtype, len) = (<T::Elem as Element>::DTYPE, value.bucket_len());
        self.push_slot((dtype, len, len), value.shape(), (on_device(value), false));
    }

    /// [`add_leaf`](Self::add_leaf) for `reducescatter`.
    #[inline]
    pub(super) fn add_scatter_leaf<T: Scatter>(&mut self, value: &T) {
        let (dtype, len) = (<T::Elem as Element>::DTYPE, value.bucket_len());
        self.push_slot(
            (dtype, len, value.rows()),
            value.shape(),
            (on_device(value), false),
        );
    }

    /// Appends a part of `len` host elements of `E` to the layout.
    pub(super) fn add_raw<E: Element>(&mut self, len: usize, rows: usize, shape: &[usize]) {
        self.push_slot((E::DTYPE, len, rows), shape, (false, false));
    }

    /// Appends a list's length, a part without elements whose shape is `shape`.
    pub(super) fn add_length(&mut self, shape: &[usize]) {
        self.push_slot((DType::U8, 0, 0), shape, (false, true));
    }

    /// Refuses a value during the layout: `run` reports `error` (the first one).
    pub(crate) fn refuse(&mut self, error: Error) {
        self.failed.get_or_insert(error);
    }

    /// Slot `slot`'s place; none if the layout has no such slot.
    #[inline]
    pub(super) fn slot_at(&self, slot: usize) -> SlotIdx {
        self.places.get(slot).map_or(SlotIdx::NONE, |p| p.idx)
    }

    /// The element type of the slot at `at`, if the layout has it.
    #[inline]
    pub(super) fn slot_dtype(&self, at: SlotIdx) -> Option<DType> {
        self.places
            .get(at.slot)
            .filter(|p| p.idx == at)
            .map(|p| p.dtype)
    }

    /// Ends the layout phase: `false` (and the misuse noted) when it was not in it.
    pub(super) fn end_layout(&mut self) -> bool {
        if self.phase != Phase::Adding {
            self.misuse(format_args!("`prepare` outside the layout phase"));
            return false;
        }
        self.phase = Phase::Packing;
        true
    }

    /// [`prepare`](Self::prepare) in `comm`'s memory: on its GPU when it has the device
    /// capability (device mode), else on the host.
    #[inline]
    pub(crate) fn prepare_on<C: Communicator>(&mut self, comm: &mut C) {
        match device_of(comm) {
            Some(device) => self.prepare_device(device),
            None => self.prepare(),
        }
    }

    /// Takes the flat buffers for this layout (reusing last execution's where no view of
    /// them is alive).
    pub fn prepare(&mut self) {
        self.device = None;
        if self.end_layout() {
            self.inputs.prepare();
        }
    }

    /// Whether `at` is slot `at.slot` of this layout, of element type `E`, in the packing
    /// phase; marks it handed. Notes the misuse when it is not.
    #[inline]
    fn hand<E: Element>(&mut self, at: SlotIdx) -> bool {
        let packing = self.phase == Phase::Packing;
        let place = self.places.get(at.slot);
        match place.filter(|p| packing && p.idx == at && p.dtype == E::DTYPE) {
            Some(_) => {
                if let Some(handed @ false) = self.handed_slots.get_mut(at.slot) {
                    *handed = true;
                    self.handed += 1;
                }
                true
            }
            None => {
                self.misuse(format_args!(
                    "a value was packed outside the packing phase or into a slot it does not have"
                ));
                false
            }
        }
    }

    /// Copies a value, with all its parts, into its place.
    pub fn pack<T: Bucketable>(&mut self, value: &T, at: SlotIdx) {
        self.hand_value(value, at, false)
    }

    /// Hands each part of `value` to the slots `add` gave it, lent or copied; notes a
    /// value that handed another number of parts than it laid out.
    #[inline]
    fn hand_value<T: Bucketable>(&mut self, value: &T, at: SlotIdx, lend: bool) {
        let end = at.slot.saturating_add(at.parts);
        let mut hand = Hand {
            st: self,
            next: at.slot,
            end,
            lend,
            values: PhantomData,
        };
        value.hand_parts(&mut hand);
        if hand.next != end {
            self.misuse(format_args!("a value handed other parts than it laid out"));
        }
    }

    /// Copies one part, a value's own elements, into its place.
    pub(super) fn pack_leaf<T: Bucketable>(&mut self, value: &T, at: SlotIdx) {
        if !self.hand::<T::Elem>(at) {
            return;
        }
        if self.device.is_some() {
            return self.pack_device(value, at);
        }
        if at.device {
            // On a host communicator; `run` reports it.
            return;
        }
        let Some(region) = self.inputs.get::<T::Elem>() else {
            return;
        };
        match region.slice_mut().get_mut(at.offset..at.offset + at.len) {
            Some(dst) => {
                value.pack(dst);
                // No pointer into the region is kept: the communicator reads the value
                // from the region it is given.
                self.data[at.slot] = SlotData::packed(<T::Elem as Element>::DTYPE, at.len);
            }
            // `prepare` took an unshared buffer of the layout's length: only an `output`
            // view taken since (out of order) can hold it now.
            None => self.misuse(format_args!("a value was packed into a buffer in use")),
        }
    }

    /// Copies a part's elements, `data`, into its place.
    pub(super) fn pack_slice<E: Element>(&mut self, data: &[E], at: SlotIdx) {
        if !self.hand::<E>(at) {
            return;
        }
        if data.len() != at.len {
            return self.misuse(format_args!(
                "a part handed another number of elements than it laid out"
            ));
        }
        if self.device.is_some() {
            return self.pack_device_slice(data, at);
        }
        let Some(region) = self.inputs.get::<E>() else {
            return;
        };
        match region.slice_mut().get_mut(at.offset..at.offset + at.len) {
            Some(dst) => {
                dst.copy_from_slice(data);
                self.data[at.slot] = SlotData::packed(E::DTYPE, at.len);
            }
            _ => self.misuse(format_args!(
                "a part handed another number of elements than it laid out"
            )),
        }
    }

    /// Lends each part's elements in place when it has them contiguously, else packs it.
    ///
    /// Only `Stage::pack` calls this (and tests, with values that outlive the stage): its
    /// borrow of `value` lasts until the `Stage` is dropped, which is what makes the
    /// pointers kept here valid when the communicator reads them.
    pub(crate) fn lend<T: Bucketable>(&mut self, value: &T, at: SlotIdx) {
        self.hand_value(value, at, true)
    }

    /// [`lend`](Self::lend) of one part, a value's own elements. Its caller, [`Hand`],
    /// borrows every part for as long as `lend`'s caller borrows the value.
    pub(super) fn lend_leaf<T: Bucketable>(&mut self, value: &T, at: SlotIdx) {
        if at.device {
            return self.pack_leaf(value, at);
        }
        if self.device.is_some() {
            return self.pack_leaf(value, at);
        }
        match value.elements() {
            Some(elements) if elements.len() == at.len => {
                if self.hand::<T::Elem>(at) {
                    // SAFETY: the elements stay alive and unchanged while the `Stage` that
                    // lent them borrows `value` (see above), and `begin` drops this entry
                    // before the stage is used again. They are not in any region of ours:
                    // a region's buffer is reused only while nothing else holds it.
                    self.data[at.slot] = unsafe { SlotData::new(elements).extend() };
                }
            }
            _ => self.pack_leaf(value, at),
        }
    }

    /// [`pack`](Self::pack) for `allgather`.
    pub fn pack_gather<T: Gather>(&mut self, value: &T, at: SlotIdx) {
        self.pack(value, at)
    }

    /// [`pack`](Self::pack) for `reducescatter`.
    pub fn pack_scatter<T: Scatter>(&mut self, value: &T, at: SlotIdx) {
        self.pack(value, at)
    }

    /// Moves to the output phase; notes a `run` out of order or a value not handed.
    fn end_packing(&mut self) {
        if std::mem::replace(&mut self.phase, Phase::Ran) != Phase::Packing {
            self.misuse(format_args!("`run` outside the packing phase"));
        } else if self.handed != self.places.len() {
            let slot = self
                .handed_slots
                .iter()
                .position(|&h| !h)
                .unwrap_or_default();
            self.misuse(format_args!("value {slot} was never packed"));
        }
    }

    /// Agrees with the other ranks, then runs the collective over every region at once.
    pub(crate) fn run<C: Communicator>(
        &mut self,
        comm: &mut C,
        collective: Collective,
        group: &'static str,
    ) -> Result<(), Error> {
        self.start(comm, collective, group)?;
        self.finish(comm, group)
    }

    /// Whether the stage is started and not yet finished.
    #[inline]
    pub(crate) fn in_flight(&self) -> bool {
        self.pending.is_some()
    }

    /// Waits for the stage that [`FusedStage::start`] left in flight, if it did: its results
    /// are then in the buffers, as after [`FusedStage::run`].
    pub(crate) fn finish<C: Communicator>(
        &mut self,
        comm: &mut C,
        group: &'static str,
    ) -> Result<(), Error> {
        let Some((collective, share)) = self.pending.take() else {
            return Ok(());
        };
        let (inputs, outputs) = (&mut self.inputs, &mut self.outputs);
        let result = inputs.with_slices(|ins| {
            outputs.with_slices(|outs| comm.complete_stage(collective, ins, outs))
        });
        let result = result.and_then(|()| self.exchange(comm, share));
        result.map_err(|e| self.stage_error(e, group))
    }

    /// Agrees with the other ranks and starts the collective over every region at once: to
    /// its end, unless the stage is [deferred](Self::deferred) and the communicator goes on
    /// in the background (then [`FusedStage::finish`] waits for it). Lent values are read
    /// during this call only.
    pub(crate) fn start<C: Communicator>(
        &mut self,
        comm: &mut C,
        collective: Collective,
        group: &'static str,
    ) -> Result<(), Error> {
        self.rank = comm.rank();
        self.ranks = comm.size();
        self.end_packing();
        if self.device.is_some() {
            return self.run_device(comm, collective, group);
        }
        if let Some(e) = self.failed.take() {
            self.skip(comm);
            return Err(e);
        }
        if let Some(slot) = self.places.iter().position(|p| p.idx.device) {
            self.skip(comm);
            return Err(Error::Placement(format!(
                "stage `{}`: value {slot} is on a GPU, but group `{group}` runs on a host \
                 communicator: copy it with `to_host()`, or launch the graph on the Nccl backend",
                self.name
            )));
        }
        if collective.has_outputs() {
            if self
                .outputs
                .size_outputs(&self.inputs, collective, self.ranks)
                .is_none()
            {
                // Take part as failed, so that no peer waits for us.
                self.skip(comm);
                return Err(Error::Backend(format!(
                    "stage `{}`: the output of {} ranks does not fit in memory",
                    self.name, self.ranks
                )));
            }
            self.outputs.prepare();
        } else {
            self.outputs.reset();
        }
        let header = Header {
            status: Status::Ok,
            slots: &self.slots,
            dims: &self.dims,
            data: &self.data,
        };
        let deferred = self.deferred;
        // A deferred stage's results are each rank's own: sharing them would make every
        // rank meet again after it.
        let share = !deferred && comm.shares_results(collective, &header);
        let (inputs, outputs) = (&mut self.inputs, &mut self.outputs);
        let result = inputs.with_slices(|ins| {
            outputs.with_slices(|outs| match deferred {
                true => comm.start_stage(&header, collective, ins, outs),
                false => comm
                    .stage(&header, collective, ins, outs)
                    .map(|()| Progress::Complete),
            })
        });
        let result = result.and_then(|progress| match progress {
            Progress::Complete => self.exchange(comm, share),
            Progress::InFlight => {
                self.pending = Some((collective, share));
                Ok(())
            }
        });
        result.map_err(|e| self.stage_error(e, group))
    }

    /// After a stage whose results are `shared`, every rank's views of the lending rank's
    /// buffers.
    fn exchange<C: Communicator>(&mut self, comm: &mut C, shared: bool) -> Result<(), StageError> {
        if !shared {
            return Ok(());
        }
        // After the stage: no `&mut` into our buffers is alive any more.
        let mut buffers = SharedBuffers::default();
        if comm.lends_results() {
            self.inputs.offer(&mut buffers);
        }
        comm.exchange_results(&mut buffers)?;
        let mut views = [0; DType::COUNT];
        for slot in &self.slots {
            views[slot.dtype.index()] += 1;
        }
        self.inputs.adopt(&mut buffers, &views);
        Ok(())
    }

    /// Lets go of rank 0's buffers once this rank's outputs view them (they keep their own
    /// references), so that rank 0 can reuse them for the next execution.
    pub(crate) fn release_shared(&mut self) {
        self.inputs.release_shared();
    }

    /// Takes part in the stage as a failed rank, so that the other ranks skip it too.
    /// Returns the error of another rank that the communicator reported instead (under
    /// MPI, an earlier rank's failure in another process), for the caller to weigh
    /// against its own.
    pub(crate) fn skip<C: Communicator>(&mut self, comm: &mut C) -> Option<Error> {
        // The verdict is "rank r failed" on every rank whatever the collective (a failed
        // rank is the first thing the agreement checks, and its collective need not match
        // the others'); the caller already has its error.
        let skip = Collective::AllReduce(crate::ReduceOp::Sum);
        // The same call as the other ranks make for this stage.
        let skipped = match self.deferred {
            true => comm
                .start_stage(&Header::FAILED, skip, &mut [], &mut [])
                .and_then(|progress| match progress {
                    Progress::InFlight => comm.complete_stage(skip, &mut [], &mut []),
                    Progress::Complete => Ok(()),
                }),
            false => comm.stage(&Header::FAILED, skip, &mut [], &mut []),
        };
        match skipped {
            Err(StageError::Comm(e)) => Some(e),
            _ => None,
        }
    }

    /// The walk of the parts' results of the value at `at`.
    #[inline]
    fn parts(&mut self, at: SlotIdx) -> Parts<'_> {
        Parts {
            src: Source::Stage {
                st: self,
                next: at.slot,
                end: at.slot.saturating_add(at.parts),
            },
        }
    }

    /// This rank's result for a value of an in-place collective (`allreduce`,
    /// `broadcast`): views into the flat buffer.
    pub fn output<T: Bucketable>(&mut self, value: &T, at: SlotIdx) -> T {
        value.unpack_parts(&mut self.parts(at))
    }

    /// This rank's result for a value of `reduce`: the reduction on the root, `None`
    /// elsewhere.
    pub fn output_rooted<T: Bucketable>(
        &mut self,
        value: &T,
        at: SlotIdx,
        root: usize,
    ) -> Option<T> {
        (self.rank == root).then(|| self.output(value, at))
    }

    /// This rank's result for a value of `allgather`: every rank's value, in rank order.
    pub fn output_gathered<T: Gather>(&mut self, value: &T, at: SlotIdx) -> T::Gathered {
        value.gather_parts(&mut self.parts(at))
    }

    /// This rank's result for a value of `reducescatter`: its chunk of the reduction.
    pub fn output_scattered<T: Scatter>(&mut self, value: &T, at: SlotIdx) -> T {
        value.scatter_parts(&mut self.parts(at))
    }
}

impl FusedStage {
    /// The error a failed stage reports, with the stage and its values named as written.
    pub(super) fn stage_error(&self, e: StageError, group: &'static str) -> Error {
        // The header counts slots; errors name the value a slot is a part of.
        let slot_of = |slot: usize| {
            let place = self.places.get(slot);
            let value = place.map_or(slot, |p| p.value);
            SlotOf {
                value,
                name: self.values.get(value).copied().unwrap_or(""),
                item: place.and_then(|p| p.item),
                length: place.is_some_and(|p| p.length),
            }
        };
        stage_error(e, group, (self.name, self.rank), slot_of)
    }
}

/// Lays out a value's parts: one slot per part, in order (see
/// [`Bucketable::add_parts`]).
///
/// `#[derive(Bucketable)]` writes these walks for a struct; by hand, for a value whose
/// parts are not its fields, they read:
///
/// ```
/// use actorgraph::prelude::*;
/// use actorgraph::{Hand, Layout, Parts, Reduced};
///
/// /// Weights and their step count; only the weights travel.
/// struct Params { weights: Vec<Tensor<f32>>, steps: usize }
///
/// impl Bucketable for Params {
///     type Elem = u8; // no elements of its own: the stage walks its parts
///     fn bucket_len(&self) -> usize { 0 }
///     fn pack(&self, _: &mut [u8]) {}
///     fn unpack(&self, _: Reduced<'_, u8>) -> Self {
///         self.unpack_parts(&mut Parts::detached())
///     }
///     fn add_parts(&self, layout: &mut Layout<'_>) {
///         layout.add(&self.weights);
///     }
///     fn hand_parts<'v>(&'v self, hand: &mut Hand<'_, 'v>) {
///         hand.add(&self.weights);
///     }
///     fn unpack_parts(&self, parts: &mut Parts<'_>) -> Self {
///         Params { weights: parts.unpack(&self.weights), steps: self.steps }
///     }
/// }
///
/// struct Worker(f32);
///
/// #[actor]
/// impl Worker {
///     fn params(&mut self) -> Params {
///         Params { weights: vec![Tensor::full([2], self.0); 3], steps: 7 }
///     }
/// }
///
/// graph! {
///     G(workers: [Worker]) {
///         let p = workers.params();
///         allreduce(p, Max)
///     }
/// }
///
/// let mut g = G::launch(vec![Worker(1.0), Worker(2.0)], Cpu)?;
/// let p = &g.execute()?[0];
/// assert_eq!((p.weights[2].to_vec(), p.steps), (vec![2.0; 2], 7));
/// # Ok::<(), actorgraph::Error>(())
/// ```
pub struct Layout<'a> {
    pub(super) st: &'a mut FusedStage,
    /// The stage concatenates along the first dimension (`allgather`), which the
    /// agreement then does not compare.
    pub(super) gather: bool,
    /// How deep in the value the walk is: 0 in the value's own `add_parts`, one more in
    /// each part's.
    pub(super) depth: usize,
}

/// Hands a value's parts to the stage after the layout, in the same order (see
/// [`Bucketable::hand_parts`]): lent in place to a communicator that reads values in
/// place, else copied into the stage's buffer.
pub struct Hand<'a, 'v> {
    pub(super) st: &'a mut FusedStage,
    pub(super) next: usize,
    pub(super) end: usize,
    pub(super) lend: bool,
    /// The parts are borrowed for `'v`, which outlives the stage's use of lent elements.
    pub(super) values: PhantomData<&'v ()>,
}

/// Where [`Parts`] takes each part's result from.
pub(super) enum Source<'a> {
    /// The stage's buffers, from slot `next` to `end`.
    Stage {
        st: &'a mut FusedStage,
        next: usize,
        end: usize,
    },
    /// No stage: each part's result is a copy of the part itself, as if the collective ran
    /// on one rank (see [`Parts::detached`]).
    Detached,
}

/// Builds a value's result from its parts' results, in the order of the layout (see
/// [`Bucketable::unpack_parts`]).
pub struct Parts<'a> {
    pub(super) src: Source<'a>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

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
        assert_eq!(st.inputs.F32.len, 7);
        assert_eq!(st.inputs.I64.len, 2);
        st.prepare();
        st.pack(&a, ia);
        st.pack(&b, ib);
        st.pack(&c, ic);
        st.pack(&e, ie);
        assert_eq!(st.output(&c, ic).to_vec(), vec![2.0; 4]);
        assert_eq!(st.output(&b, ib).to_vec(), vec![7; 2]);
        assert_eq!(st.output(&e, ie).len(), 0);
        assert_eq!(
            *st.slots,
            [
                (DType::F32, 3),
                (DType::I64, 2),
                (DType::F32, 4),
                (DType::F32, 0)
            ]
            .map(|(d, n)| SlotDesc::shaped(d, &[n]).unwrap())
        );
        assert_eq!(*st.dims, [3, 2, 4, 0]);
    }

    /// A fused stage over several tensors of mixed dtypes and lengths gives, for each
    /// tensor, exactly what reducing that tensor alone gives.
    #[test]
    fn fused_stage_matches_a_per_tensor_reference() {
        use crate::comm::{reduce_reference, Backend};
        use crate::{Cpu, ReduceOp};

        let n = 3;
        // Under Miri, a few blocks (of 8 elements there) rather than a few thousand.
        const LONG: usize = if cfg!(miri) { 29 } else { 2500 };
        const LENS: [usize; 5] = [5, 0, 1, LONG, 7];
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
