//! Element-wise kernels of the reductions (the CPU communicator's and the MPI backend's
//! leaders'), written so that the compiler vectorizes them: the op is matched once per
//! block, not once per element, and [`fold_block`] makes one pass per rank, with the result
//! as its own accumulator wherever that rounds nothing.

use std::any::TypeId;

use crate::{Element, ReduceOp};

/// Elements reduced per block: the accumulator stays in L1.
/// (Under Miri, 8: tests then cross block boundaries with few elements.)
pub(crate) const BLOCK: usize = if cfg!(miri) { 8 } else { 1024 };

/// `acc[i] = src[i]`, widened into the accumulator.
#[inline]
pub(crate) fn load<E: Element>(acc: &mut [E::Acc], src: &[E]) {
    let src = &src[..acc.len()];
    acc.iter_mut().zip(src).for_each(|(a, &b)| *a = b.to_acc());
}

/// `acc[i] = op(acc[i], src[i])`, in the accumulator.
#[inline]
pub(crate) fn combine<E: Element>(acc: &mut [E::Acc], src: &[E], op: ReduceOp) {
    let src = &src[..acc.len()];
    let pairs = acc.iter_mut().zip(src);
    with_op!(op, f => pairs.for_each(|(a, &b)| *a = f(*a, b.to_acc())));
}

/// Finishes a reduction over `n` ranks (`Avg` divides; the other ops are done) and
/// narrows it into `dst`: the one rounding of a 16-bit float reduction.
#[inline]
pub(crate) fn finish<E: Element>(acc: &[E::Acc], op: ReduceOp, n: usize, dst: &mut [E]) {
    let dst = &mut dst[..acc.len()];
    if op == ReduceOp::Avg {
        dst.iter_mut()
            .zip(acc)
            .for_each(|(d, &a)| *d = E::from_acc(a.div_count(n)));
    } else {
        dst.iter_mut()
            .zip(acc)
            .for_each(|(d, &a)| *d = E::from_acc(a));
    }
}

/// `dst[i] = op(dst[i], src[i])` (`op(src[i], dst[i])` if `src` comes first in rank
/// order), widened, combined and narrowed in one pass; divided by `avg` before the
/// narrowing when this is the last step of an `Avg`. Exact for any element only when this
/// is the one combination of two ranks: otherwise only where the element is its own
/// accumulator (every step then narrows nothing).
#[inline]
fn combine_into<E: Element>(
    dst: &mut [E],
    src: &[E],
    dst_first: bool,
    op: ReduceOp,
    avg: Option<usize>,
) {
    with_op!(op, f => step(dst, src, E::to_acc, dst_first, avg, f));
}

/// `dst[i] = op(acc[i], dst[i])`: the ranks before `dst`'s own, accumulated, combined
/// with it as [`combine_into`] does.
#[inline]
fn merge_into<E: Element>(dst: &mut [E], acc: &[E::Acc], op: ReduceOp, avg: Option<usize>) {
    with_op!(op, f => step(dst, acc, |a| a, false, avg, f));
}

/// `dst[i] = op(a[i], b[i])`, widened, combined and narrowed in one pass; divided by `avg`
/// as in [`combine_into`], and exact on the same terms.
#[inline]
fn pair_into<E: Element>(dst: &mut [E], a: &[E], b: &[E], op: ReduceOp, avg: Option<usize>) {
    with_op!(op, f => pair(dst, a, b, E::from_acc, avg, f));
}

/// `acc[i] = op(a[i], b[i])` in the accumulator: [`load`] and [`combine`] in one pass.
#[inline]
fn load_pair<E: Element>(acc: &mut [E::Acc], a: &[E], b: &[E], op: ReduceOp) {
    with_op!(op, f => pair(acc, a, b, |x| x, None, f));
}

/// Runs `$body` with `$f` bound to `op`'s combination of two accumulated values: the op is
/// matched once, outside the loop, so that each loop is one the compiler vectorizes.
macro_rules! with_op {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => {
                let $f = |a: E::Acc, b: E::Acc| a.add(b);
                $body
            }
            ReduceOp::Prod => {
                let $f = |a: E::Acc, b: E::Acc| a.mul(b);
                $body
            }
            ReduceOp::Min => {
                let $f = |a: E::Acc, b: E::Acc| a.min(b);
                $body
            }
            ReduceOp::Max => {
                let $f = |a: E::Acc, b: E::Acc| a.max(b);
                $body
            }
        }
    };
}
use with_op;

/// The loop of [`combine_into`] and [`merge_into`]: each branch a loop of its own.
#[inline(always)]
fn step<E: Element, S: Copy>(
    dst: &mut [E],
    src: &[S],
    widen: impl Fn(S) -> E::Acc,
    dst_first: bool,
    avg: Option<usize>,
    f: impl Fn(E::Acc, E::Acc) -> E::Acc,
) {
    let src = &src[..dst.len()];
    let pairs = dst.iter_mut().zip(src);
    match (dst_first, avg) {
        (true, None) => pairs.for_each(|(d, &s)| *d = E::from_acc(f(d.to_acc(), widen(s)))),
        (false, None) => pairs.for_each(|(d, &s)| *d = E::from_acc(f(widen(s), d.to_acc()))),
        (true, Some(n)) => pairs.for_each(|(d, &s)| {
            *d = E::from_acc(f(d.to_acc(), widen(s)).div_count(n));
        }),
        (false, Some(n)) => pairs.for_each(|(d, &s)| {
            *d = E::from_acc(f(widen(s), d.to_acc()).div_count(n));
        }),
    }
}

/// The loop of [`pair_into`] and [`load_pair`].
#[inline(always)]
fn pair<E: Element, D>(
    dst: &mut [D],
    a: &[E],
    b: &[E],
    narrow: impl Fn(E::Acc) -> D,
    avg: Option<usize>,
    f: impl Fn(E::Acc, E::Acc) -> E::Acc,
) {
    let (a, b) = (&a[..dst.len()], &b[..dst.len()]);
    let triples = dst.iter_mut().zip(a).zip(b);
    match avg {
        None => triples.for_each(|((d, &x), &y)| *d = narrow(f(x.to_acc(), y.to_acc()))),
        Some(n) => triples.for_each(|((d, &x), &y)| {
            *d = narrow(f(x.to_acc(), y.to_acc()).div_count(n));
        }),
    }
}

/// `dst[i]` = `srcs[0][i]` combined with `srcs[1][i]`, then `srcs[2][i]`, ... in the
/// accumulator, narrowed once: [`reduce_reference`] over the ranks, bit for bit, block by
/// block ([`fold_block`]). Source `own`, if any, is `dst` itself (its slice in `srcs` is
/// not read).
#[cfg_attr(
    not(feature = "mpi"),
    allow(dead_code, reason = "the MPI backend's fold; tested without it")
)]
pub(crate) fn fold_into<E: Element>(
    srcs: &[&[E]],
    own: Option<usize>,
    op: ReduceOp,
    dst: &mut [E],
) {
    let len = match needs_acc::<E>(srcs.len(), own) {
        true => BLOCK.min(dst.len()),
        false => 0,
    };
    let mut acc = vec![<E::Acc as Default>::default(); len];
    for (at, block) in dst.chunks_mut(BLOCK).enumerate() {
        let range = at * BLOCK..at * BLOCK + block.len();
        let src = |q: usize| &srcs[q][range.clone()];
        fold_block(srcs.len(), src, own, op, block, &mut acc);
    }
}

/// Whether `dst` can be the accumulator of a reduction over `n` ranks: no narrowing
/// before the last step loses anything.
#[inline]
fn in_place<E: Element>(n: usize) -> bool {
    n == 2 || n > 2 && TypeId::of::<E>() == TypeId::of::<E::Acc>()
}

/// Whether [`fold_block`] over `n` ranks, the result being rank `own`'s input, uses its
/// `acc` (which may otherwise be empty).
#[inline]
pub(crate) fn needs_acc<E: Element>(n: usize, own: Option<usize>) -> bool {
    !in_place::<E>(n) || matches!(own, Some(o) if o >= 2)
}

/// One block of a reduction over `n` ranks, in rank order: `dst[i]` = `src(0)[i]`
/// combined with `src(1)[i]`, then `src(2)[i]`, ... in the accumulator, narrowed once,
/// bit for bit [`reduce_reference`]'s. Rank `own`, if any, is `dst` itself: `src(own)` is
/// never called, and `dst` is read before it is written. `acc` is scratch, at least as
/// long as `dst` (which should fit in L1: see [`BLOCK`]) where [`needs_acc`] says so.
///
/// Every step narrows into `dst` when no narrowing loses anything (an element that is its
/// own accumulator) or when there is no step before the last (two ranks): `dst` is then
/// the accumulator, and each step reads and writes one place in one pass; only the ranks
/// before `dst`'s own, if more than one, go through `acc`. Otherwise every rank does.
pub(crate) fn fold_block<'s, E: Element>(
    n: usize,
    src: impl Fn(usize) -> &'s [E],
    own: Option<usize>,
    op: ReduceOp,
    dst: &mut [E],
    acc: &mut [E::Acc],
) {
    if n == 0 {
        return;
    }
    let avg = |q: usize| (op == ReduceOp::Avg && q + 1 == n).then_some(n);
    if in_place::<E>(n) {
        let next = match own {
            Some(0) => {
                combine_into(dst, src(1), true, op, avg(1));
                2
            }
            Some(1) => {
                combine_into(dst, src(0), false, op, avg(1));
                2
            }
            Some(o) => {
                let acc = &mut acc[..dst.len()];
                load_pair(acc, src(0), src(1), op);
                for q in 2..o {
                    combine(acc, src(q), op);
                }
                merge_into(dst, acc, op, avg(o));
                o + 1
            }
            None => {
                pair_into(dst, src(0), src(1), op, avg(1));
                2
            }
        };
        for q in next..n {
            combine_into(dst, src(q), true, op, avg(q));
        }
        return;
    }
    let acc = &mut acc[..dst.len()];
    for q in 0..n {
        let s = if own == Some(q) { &*dst } else { src(q) };
        if q == 0 {
            load::<E>(acc, s);
        } else {
            combine::<E>(acc, s, op);
        }
    }
    finish::<E>(acc, op, n, dst);
}

/// The reference every communicator must match bit for bit: each element folded over the
/// ranks in rank order in the element's accumulator (`f32` for `f16`/`bf16`), one element
/// at a time, and narrowed once. Written independently of the block kernels above so that
/// tests can check them against it.
///
/// ```
/// use actorgraph::{comm::reduce_reference, ReduceOp};
/// let (a, b) = ([1.0f32, 4.0], [3.0f32, -2.0]);
/// assert_eq!(reduce_reference(&[&a[..], &b[..]], ReduceOp::Avg), vec![2.0, 1.0]);
/// ```
pub fn reduce_reference<E: Element>(srcs: &[&[E]], op: ReduceOp) -> Vec<E> {
    let Some(first) = srcs.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|i| {
            let mut acc = first[i].to_acc();
            for s in &srcs[1..] {
                let x = s[i].to_acc();
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Avg => acc.add(x),
                    ReduceOp::Prod => acc.mul(x),
                    ReduceOp::Min => acc.min(x),
                    ReduceOp::Max => acc.max(x),
                };
            }
            if op == ReduceOp::Avg {
                acc = acc.div_count(srcs.len());
            }
            E::from_acc(acc)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_ops_on_integers() {
        let a = [1i32, -4, 7];
        let b = [3i32, 2, -7];
        let srcs: [&[i32]; 2] = [&a, &b];
        assert_eq!(reduce_reference(&srcs, ReduceOp::Sum), vec![4, -2, 0]);
        assert_eq!(reduce_reference(&srcs, ReduceOp::Prod), vec![3, -8, -49]);
        assert_eq!(reduce_reference(&srcs, ReduceOp::Min), vec![1, -4, -7]);
        assert_eq!(reduce_reference(&srcs, ReduceOp::Max), vec![3, 2, 7]);
        assert_eq!(reduce_reference(&srcs, ReduceOp::Avg), vec![2, -1, 0]);
    }

    #[test]
    fn integer_overflow_wraps() {
        let a = [u8::MAX];
        let srcs: [&[u8]; 2] = [&a, &a];
        assert_eq!(reduce_reference(&srcs, ReduceOp::Sum), vec![254]);
        // Avg is the wrapped sum divided by the ranks.
        assert_eq!(reduce_reference(&srcs, ReduceOp::Avg), vec![127]);
    }

    #[test]
    fn half_floats_accumulate_in_f32() {
        use half::{bf16, f16};
        // In bf16, 256 + 1 rounds back to 256; accumulated in f32, 256 + 1 + 1 is 258.
        let (a, b) = ([bf16::from_f32(256.0)], [bf16::ONE]);
        let srcs: [&[bf16]; 3] = [&a, &b, &b];
        assert_eq!(
            reduce_reference(&srcs, ReduceOp::Sum),
            vec![bf16::from_f32(258.0)]
        );
        // Avg divides in f32 before the one rounding: (1 + 2) / 2 = 1.5 exactly.
        let (a, b) = ([f16::ONE], [f16::from_f32(2.0)]);
        let srcs: [&[f16]; 2] = [&a, &b];
        assert_eq!(
            reduce_reference(&srcs, ReduceOp::Avg),
            vec![f16::from_f32(1.5)]
        );
    }

    #[test]
    fn block_kernels_match_the_reference() {
        let a = [1.0f32, -2.0, 3.5];
        let b = [0.5f32, 4.0, -1.0];
        for op in [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Avg,
        ] {
            let mut acc = [0.0f32; 3];
            load(&mut acc, &a);
            combine(&mut acc, &b, op);
            let mut out = [0.0f32; 3];
            finish(&acc, op, 2, &mut out);
            assert_eq!(
                out.to_vec(),
                reduce_reference(&[&a[..], &b[..]], op),
                "{op:?}"
            );
        }
    }

    /// Every dtype kind (own accumulator or not, float or integer), every op, one to five
    /// ranks, every place of the result among them, lengths across a block's end: the
    /// fold gives the reference's bits.
    #[test]
    fn fold_into_matches_the_reference_bit_for_bit() {
        use half::{bf16, f16};
        /// The bits of a value: `==` would let `-0.0` pass for `0.0`.
        trait Bits: Element {
            fn bits(self) -> u64;
        }
        macro_rules! bits {
            ($($t:ty => $f:expr),*) => {$(
                impl Bits for $t {
                    fn bits(self) -> u64 {
                        #[allow(clippy::redundant_closure_call)]
                        u64::from(($f)(self))
                    }
                }
            )*};
        }
        bits!(f32 => f32::to_bits, f64 => f64::to_bits, f16 => f16::to_bits, bf16 => bf16::to_bits, i32 => |x: i32| x as u32, u8 => |x: u8| x);
        fn check<E: Bits>(make: impl Fn(u64) -> E) {
            let ops = [
                ReduceOp::Sum,
                ReduceOp::Prod,
                ReduceOp::Min,
                ReduceOp::Max,
                ReduceOp::Avg,
            ];
            for n in 1..=if cfg!(miri) { 3 } else { 5usize } {
                for len in [0, 3, BLOCK + 5] {
                    let ranks: Vec<Vec<E>> = (0..n)
                        .map(|q| {
                            let seed = (q * 7919 + len) as u64;
                            (0..len as u64)
                                .map(|i| {
                                    make(
                                        (seed * 1_000_003 + i)
                                            .wrapping_mul(6364136223846793005)
                                            .wrapping_add(1442695040888963407),
                                    )
                                })
                                .collect()
                        })
                        .collect();
                    let views: Vec<&[E]> = ranks.iter().map(|r| &r[..]).collect();
                    for op in ops {
                        let want = reduce_reference(&views, op);
                        for own in std::iter::once(None).chain((0..n).map(Some)) {
                            let mut dst = match own {
                                Some(o) => ranks[o].clone(),
                                None => vec![E::default(); len],
                            };
                            // The result's own slice is not read: give it none.
                            let srcs: Vec<&[E]> = (0..n)
                                .map(|q| if own == Some(q) { &[][..] } else { views[q] })
                                .collect();
                            fold_into(&srcs, own, op, &mut dst);
                            let bits = |v: &[E]| v.iter().map(|&x| x.bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&dst),
                                bits(&want),
                                "{} x {n} ranks, {len} elements, {op:?}, own {own:?}",
                                std::any::type_name::<E>()
                            );
                        }
                    }
                }
            }
        }
        // Small values with fractions (whose half-float sums round), signs and zeros.
        let float = |x: u64| ((x >> 40) % 2001) as f32 / 64.0 - 15.625;
        check(float);
        check(|x| f64::from(float(x)) * 1.0e-3);
        check(|x| f16::from_f32(float(x)));
        check(|x| bf16::from_f32(float(x) * 3.0));
        check(|x| (x >> 33) as i32);
        check(|x| (x >> 56) as u8);
    }
}
