//! The header check that every communicator runs before any payload moves: the same
//! verdict on every rank from the same headers.

use super::{Collective, Disagreement, Header, SlotDesc, Status};
use crate::DType;

/// Decides, identically on every rank, whether a stage's payload may run.
///
/// `header(q)` is rank `q`'s header. Every rank must see the same headers and the same
/// collective, so every rank reaches the same verdict. In order, it rejects: a failed rank
/// (the lowest), a root that is not a rank, a header whose [`dims`](Header::dims) do not
/// match its slots, the lowest slot whose dtype, length or shape differs between ranks
/// (among the slots that every rank has), buckets of different sizes, and, for
/// `ReduceScatter`, a slot whose rows or length do not divide by the number of ranks. A
/// slot before buckets' sizes: a list of values begins with a slot for its length (see
/// `Layout::agree_len`), so lists of different lengths are named by their value.
///
/// Shapes agree when they are equal, except for `AllGather`, which concatenates the
/// ranks' values along their first dimension: there every dimension but the first must be
/// equal (with the lengths equal, the first is too, unless the value is empty).
/// `ReduceScatter` reduces element by element before it splits along the first dimension,
/// so it needs equal shapes, like `AllReduce`.
///
/// ```
/// use actorgraph::comm::{agree, Collective, Disagreement, Header, SlotDesc, Status};
/// use actorgraph::{DType, ReduceOp};
/// let a = [SlotDesc::flat(DType::F32, 10)];
/// let b = [SlotDesc::flat(DType::F32, 20)];
/// let sum = Collective::AllReduce(ReduceOp::Sum);
/// let header = |slots| Header { status: Status::Ok, slots, dims: &[], data: &[] };
/// let headers = [header(&a), header(&b)];
/// let verdict = agree(2, sum, |q| headers[q]);
/// assert!(matches!(verdict, Err(Disagreement::Slot { slot: 0, .. })));
///
/// let same = [header(&a); 3];
/// let verdict = agree(3, Collective::ReduceScatter(ReduceOp::Sum), |q| same[q]);
/// assert_eq!(verdict, Err(Disagreement::NotDivisible { slot: 0, len: 10, size: 3 }));
///
/// // The same six elements as [2, 3] and as [3, 2] do not agree.
/// let m = [SlotDesc::shaped(DType::F32, &[2, 3]).unwrap()];
/// let t = [SlotDesc::shaped(DType::F32, &[3, 2]).unwrap()];
/// let shaped = [
///     Header { status: Status::Ok, slots: &m, dims: &[2, 3], data: &[] },
///     Header { status: Status::Ok, slots: &t, dims: &[3, 2], data: &[] },
/// ];
/// match agree(2, sum, |q| shaped[q]) {
///     Err(Disagreement::Slot { slot: 0, shapes, .. }) => assert_eq!(shapes, [[2, 3], [3, 2]]),
///     other => panic!("{other:?}"),
/// }
/// ```
pub fn agree<'a>(
    size: usize,
    collective: Collective,
    header: impl Fn(usize) -> Header<'a>,
) -> Result<(), Disagreement> {
    // All but the first dimension, for a collective that concatenates along it.
    let skip = usize::from(collective == Collective::AllGather);
    // Shapes of equal `ndim`, compared element by element: they are short, and a slice
    // comparison calls memcmp for each, which costs more here than the whole loop.
    let same = |a: (&SlotDesc, &[usize]), b: (&SlotDesc, &[usize])| {
        (a.0.dtype, a.0.len, a.0.ndim) == (b.0.dtype, b.0.len, b.0.ndim)
            && a.1.iter().zip(b.1).skip(skip).all(|(x, y)| x == y)
    };
    // One pass over the ranks finds everything the verdict may name (a communicator's
    // `header(q)` may read shared memory, so it is called once per rank on the way to
    // `Ok`); the verdict then names the first finding in the order documented above.
    let first = header(0);
    let (mut failed, mut sizes_differ, mut bad_dims) = (None, false, None);
    let mut bad_slot: Option<usize> = None;
    // The number of slots every rank has.
    let mut common = first.slots.len();
    for q in 0..size {
        let theirs = if q == 0 { first } else { header(q) };
        if theirs.status == Status::Failed && failed.is_none() {
            failed = Some(q);
        }
        if theirs.slots.len() != first.slots.len() {
            sizes_differ = true;
            common = common.min(theirs.slots.len());
        }
        let ndims = theirs
            .slots
            .iter()
            .try_fold(0usize, |n, s| n.checked_add(s.ndim));
        if ndims != Some(theirs.dims.len()) {
            bad_dims.get_or_insert(q);
            continue;
        }
        if q == 0 || bad_dims.is_some() {
            continue;
        }
        // The common case first: the very same slots and dimensions as rank 0's.
        let key = |s: &SlotDesc| (s.dtype, s.len, s.ndim);
        let mut keys = first.slots.iter().zip(theirs.slots);
        if keys.all(|(a, b)| key(a) == key(b)) && skip == 0 && first.dims.iter().eq(theirs.dims) {
            continue;
        }
        let (Some(mine), Some(shapes)) = (first.shapes(), theirs.shapes()) else {
            continue;
        };
        let mut pairs = first
            .slots
            .iter()
            .zip(mine)
            .zip(theirs.slots.iter().zip(shapes));
        if let Some(slot) = pairs.position(|(a, b)| !same(a, b)) {
            bad_slot = Some(bad_slot.map_or(slot, |b| b.min(slot)));
        }
    }
    if let Some(rank) = failed {
        return Err(Disagreement::Failed { rank });
    }
    if let Some(root) = collective.root().filter(|&root| root >= size) {
        return Err(Disagreement::Root { root, size });
    }
    if let Some(q) = bad_dims {
        return Err(Disagreement::Buffers {
            reason: format!("rank {q}'s header does not hold the dimensions its slots declare"),
        });
    }
    if let Some(slot) = bad_slot.filter(|&slot| slot < common) {
        let each = |q: usize| {
            let h = header(q);
            let shape = h.shapes().and_then(|mut s| s.nth(slot)).unwrap_or_default();
            let count = h
                .slots
                .get(slot)
                .map_or((DType::U8, 0), |s| (s.dtype, s.len));
            (count, shape.to_vec())
        };
        let (counts, shapes) = (0..size).map(each).unzip();
        return Err(Disagreement::Slot {
            slot,
            counts,
            shapes,
        });
    }
    if sizes_differ {
        return Err(Disagreement::BucketSize {
            counts: (0..size).map(|q| header(q).slots.len()).collect(),
        });
    }
    if let Collective::ReduceScatter(_) = collective {
        // The lowest slot that does not divide, on the lowest rank.
        let mut bad: Option<(usize, usize)> = None;
        for q in 0..size {
            let slots = header(q).slots;
            let found = slots.iter().enumerate().find_map(|(slot, s)| {
                let len = [s.rows, s.len].into_iter().find(|n| n % size != 0)?;
                Some((slot, len))
            });
            if let Some((slot, len)) = found.filter(|f| bad.is_none_or(|b| f.0 < b.0)) {
                bad = Some((slot, len));
            }
        }
        if let Some((slot, len)) = bad {
            return Err(Disagreement::NotDivisible { slot, len, size });
        }
    }
    Ok(())
}
