//! Element-wise kernels of the CPU collectives, written so that the compiler vectorizes
//! them: the op is matched once per block, not once per element.

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
    match op {
        ReduceOp::Sum | ReduceOp::Avg => pairs.for_each(|(a, &b)| *a = a.add(b.to_acc())),
        ReduceOp::Prod => pairs.for_each(|(a, &b)| *a = a.mul(b.to_acc())),
        ReduceOp::Min => pairs.for_each(|(a, &b)| *a = a.min(b.to_acc())),
        ReduceOp::Max => pairs.for_each(|(a, &b)| *a = a.max(b.to_acc())),
    }
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
}
