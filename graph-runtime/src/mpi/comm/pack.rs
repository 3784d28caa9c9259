//! Moving a stage's bytes between the values, the regions, the posts and the results:
//! packing a rank's inputs, the leader's values kept where they are ([`Unpacked`]),
//! copying each rank's results out, and folding byte regions.

use std::ops::Range;
use std::sync::MutexGuard;

use super::board::{Post, Shared};
use super::plan::{self, Facts};
use crate::comm::reduce::fold_into;
use crate::comm::{Collective, Header, RegionMut, SlotData, SlotDesc};
use crate::element::{for_each_dtype, with_dtype};
use crate::{DType, Element, ReduceOp};

macro_rules! region_bytes {
    ($($d:ident: $t:ty [$($info:tt)*]),*) => {
        /// A region's elements as bytes.
        #[inline]
        pub(super) fn region_bytes<'r>(r: &'r mut RegionMut<'_>) -> &'r mut [u8] {
            match r {
                $(RegionMut::$d(s) => bytemuck::cast_slice_mut::<$t, u8>(s),)*
            }
        }
    };
}
for_each_dtype!(region_bytes);

/// A rank's regions by dtype, as bytes (none for a dtype it has no region of, and none at
/// all for a failed rank).
pub(super) type Mine<'r> = [Option<&'r mut [u8]>; DType::COUNT];

/// `regions` by dtype, as bytes.
#[inline]
pub(super) fn by_dtype<'r>(regions: &'r mut [RegionMut<'_>]) -> Mine<'r> {
    let mut mine: Mine<'r> = Default::default();
    for r in regions.iter_mut() {
        let d = r.dtype();
        mine[d.index()] = Some(region_bytes(r));
    }
    mine
}

/// The offset, within its dtype's region, of each slot, and its dtype and length.
pub(super) fn slot_places(slots: &[SlotDesc]) -> impl Iterator<Item = (DType, usize, usize)> + '_ {
    let mut next = [0usize; DType::COUNT];
    slots.iter().map(move |s| {
        let at = next[s.dtype.index()];
        next[s.dtype.index()] += s.len;
        (s.dtype, at, s.len)
    })
}

/// The elements slot entry `s` lent, as bytes, if it lent elements of `d`.
fn lent_bytes<'a>(s: &SlotData<'a>, d: DType) -> Option<&'a [u8]> {
    with_dtype!(d, E => s.lent::<E>().map(bytemuck::cast_slice::<E, u8>))
}

/// Each slot of dtype `d` of `header`: its index, and its bytes' place in that region.
fn slot_bytes<'h>(
    header: &'h Header<'_>,
    d: DType,
) -> impl Iterator<Item = (usize, Range<usize>)> + 'h {
    let mut at = 0usize;
    header
        .slots
        .iter()
        .enumerate()
        .filter(move |(_, s)| s.dtype == d)
        .map_while(move |(k, s)| {
            let end = at.checked_add(s.len.checked_mul(d.size())?)?;
            Some((k, std::mem::replace(&mut at, end)..end))
        })
}

/// Whether every value of dtype `d` that `header` says was lent is large enough to be
/// copied straight into the post ([`plan::in_place`]).
pub(super) fn posts_in_place(header: &Header<'_>, d: DType) -> bool {
    let lent = |&(k, _): &(usize, Range<usize>)| header.data.get(k).is_some_and(|s| !s.is_packed());
    let mut lent = slot_bytes(header, d).filter(lent).peekable();
    lent.peek().is_some() && lent.all(|(_, place)| plan::in_place(place.len()))
}

/// A rank's input of dtype `d` into `dst`, as long as its `region`: each value from the
/// elements it lent, or from its place in the region where it was packed (see
/// [`Communicator::reads_in_place`](crate::comm::Communicator::reads_in_place)).
pub(super) fn gather_input(header: &Header<'_>, d: DType, region: &[u8], dst: &mut [u8]) {
    for (k, place) in slot_bytes(header, d) {
        let lent = header.data.get(k).and_then(|s| lent_bytes(s, d));
        let src = lent.filter(|l| l.len() == place.len());
        let (Some(src), Some(out)) = (src.or(region.get(place.clone())), dst.get_mut(place)) else {
            return;
        };
        out.copy_from_slice(src);
    }
}

/// Copies the values of dtype `d` that were lent into their places in `region`, as if
/// the stage had packed them, except, if `keep`, those large enough to be read in place
/// ([`plan::in_place`]): those are returned instead (see [`Unpacked`]). Without `keep`
/// the region then holds the rank's whole input.
pub(super) fn pack_lent<'h>(
    header: &Header<'h>,
    d: DType,
    region: &mut [u8],
    keep: bool,
) -> Vec<(Range<usize>, &'h [u8])> {
    let mut kept = Vec::new();
    for (k, place) in slot_bytes(header, d) {
        let lent = header.data.get(k).and_then(|s| lent_bytes(s, d));
        let (Some(src), Some(out)) = (lent, region.get_mut(place.clone())) else {
            continue;
        };
        if src.len() != out.len() {
            continue;
        }
        if keep && plan::in_place(src.len()) {
            kept.push((place, src));
        } else {
            out.copy_from_slice(src);
        }
    }
    kept
}

/// The leader's lent values of at least [`plan::POST_IN_PLACE`] bytes that it did not
/// pack, by dtype: each one's place in its region (whose bytes there are stale) and its
/// elements. In a large reduction the leader sends the chunks that lie within one such
/// value straight from it, and folds its own chunk reading it in place: a region of one
/// large tensor is then never copied into the region before MPI reads it. A large
/// allgather of few values sends each from where it is (`gather::by_slot`), and a large
/// broadcast's root packs them piece by piece (`broadcast`). Smaller values are packed,
/// as a copy per value costs more than it saves.
pub(super) type Unpacked<'h> = [Vec<(Range<usize>, &'h [u8])>; DType::COUNT];

/// Copies the part of each kept value of `values` (one dtype's [`Unpacked`]) that lies
/// within `piece`, the bytes of its region from `at` on, into its place there.
pub(super) fn pack_kept(values: &[(Range<usize>, &[u8])], piece: &mut [u8], at: usize) {
    let end = at.saturating_add(piece.len());
    for (place, src) in values {
        let (a, b) = (place.start.max(at), place.end.min(end));
        if a < b {
            piece[a - at..b - at].copy_from_slice(&src[a - place.start..b - place.start]);
        }
    }
}

/// Copies every value of `unpacked` into its place in the leader's regions, which then
/// hold its whole input (for a plan that reads them whole), and forgets them.
pub(super) fn pack_unpacked(unpacked: &mut Unpacked<'_>, mine: &mut Mine<'_>) {
    for (values, region) in unpacked.iter_mut().zip(mine.iter_mut()) {
        if let Some(region) = region.as_deref_mut() {
            pack_kept(values, region, 0);
        }
        values.clear();
    }
}

/// The part `lo..hi` of the leader's region of dtype `d` that lies within one value of
/// `unpacked`, as that value's elements; `None` if it lies (even partly) elsewhere.
pub(super) fn within_unpacked<'h>(
    unpacked: &Unpacked<'h>,
    d: DType,
    lo: usize,
    hi: usize,
) -> Option<&'h [u8]> {
    unpacked[d.index()]
        .iter()
        .find(|(place, _)| place.start <= lo && hi <= place.end)
        .map(|(place, src)| &src[lo - place.start..hi - place.start])
}

/// The leader's input bytes at `place` of its region of dtype `d`: from the value kept
/// there (see [`Unpacked`]) when one covers it, else from the region.
pub(super) fn leader_bytes<'a>(
    mine: &'a Mine<'_>,
    unpacked: &Unpacked<'a>,
    d: DType,
    place: Range<usize>,
) -> Option<&'a [u8]> {
    within_unpacked(unpacked, d, place.start, place.end)
        .or_else(|| mine[d.index()].as_deref()?.get(place))
}

/// The input of this process's rank `local` for dtype `d`: the leader's own region, the
/// others' posts.
pub(super) fn input<'s>(
    mine: &'s Mine<'_>,
    posts: &'s [MutexGuard<'_, Post>],
    local: usize,
    d: DType,
    bytes: usize,
) -> Result<&'s [u8], String> {
    if local == 0 {
        mine[d.index()]
            .as_deref()
            .and_then(|r| r.get(..bytes))
            .ok_or_else(|| format!("the leader has no {d} region of {bytes} bytes"))
    } else {
        Ok(posts[local].data[d.index()].bytes(bytes))
    }
}

/// Copies rank `rank`'s results (of `size` ranks) out of the leader's buffers.
pub(super) fn copy_out(
    shared: &Shared,
    slots: &[SlotDesc],
    collective: Collective,
    rank: usize,
    size: usize,
    regions: &mut [RegionMut<'_>],
    outputs: &mut [RegionMut<'_>],
) {
    match collective {
        Collective::AllReduce(_) | Collective::Broadcast { .. } | Collective::Reduce { .. } => {
            for r in regions.iter_mut() {
                let dtype = r.dtype();
                let dst = region_bytes(r);
                dst.copy_from_slice(shared.result[dtype.index()].bytes(dst.len()));
            }
        }
        Collective::AllGather if shared.by_slot => {
            for out in outputs.iter_mut() {
                let dtype = out.dtype();
                let dst = region_bytes(out);
                dst.copy_from_slice(shared.all[dtype.index()].bytes(dst.len()));
            }
        }
        Collective::AllGather => {
            let lens = Facts::of(slots).lens;
            for out in outputs.iter_mut() {
                let (dtype, es) = (out.dtype(), out.dtype().size());
                let region = lens[dtype.index()];
                let all = shared.all[dtype.index()].bytes(size * region * es);
                let dst = region_bytes(out);
                for (_, at, len) in slot_places(slots).filter(|s| s.0 == dtype) {
                    for q in 0..size {
                        let to = (size * at + q * len) * es;
                        let from = (q * region + at) * es;
                        dst[to..to + len * es].copy_from_slice(&all[from..from + len * es]);
                    }
                }
            }
        }
        Collective::ReduceScatter(_) => {
            let lens = Facts::of(slots).lens;
            for out in outputs.iter_mut() {
                let (dtype, es) = (out.dtype(), out.dtype().size());
                let result = shared.result[dtype.index()].bytes(lens[dtype.index()] * es);
                let dst = region_bytes(out);
                for (_, at, len) in slot_places(slots).filter(|s| s.0 == dtype) {
                    let chunk = len / size;
                    let (to, from) = (at / size * es, (at + rank * chunk) * es);
                    dst[to..to + chunk * es].copy_from_slice(&result[from..from + chunk * es]);
                }
            }
        }
    }
}

/// [`fold_into`] over byte regions: `srcs` by rank, `dst` the result (and rank `own`'s
/// input, whose source is then ignored).
pub(super) fn fold<E: Element + bytemuck::Pod>(
    srcs: &[&[u8]],
    own: Option<usize>,
    op: ReduceOp,
    dst: &mut [u8],
) {
    // Rank `own`'s source is an empty byte slice, which need not be aligned for `E`
    // (`cast_slice` would panic): it is `&[]` of `E` instead, never read (`dst` holds it).
    let srcs: Vec<&[E]> = srcs
        .iter()
        .enumerate()
        .map(|(q, s)| match own {
            Some(o) if o == q => &[],
            _ => bytemuck::cast_slice(s),
        })
        .collect();
    fold_into(&srcs, own, op, bytemuck::cast_slice_mut(dst));
}
