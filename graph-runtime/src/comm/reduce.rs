//! Element-wise kernels of the CPU collectives, written so that the compiler vectorizes
//! them: the op is matched once per block, not once per element.

use crate::{Element, ReduceOp};

/// Elements reduced per block: the accumulator stays in L1.
pub(crate) const BLOCK: usize = 1024;

/// `acc[i] = op(acc[i], src[i])`.
#[inline]
pub(crate) fn combine<E: Element>(acc: &mut [E], src: &[E], op: ReduceOp) {
    let src = &src[..acc.len()];
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc.iter_mut().zip(src).for_each(|(a, &b)| *a = a.add(b)),
        ReduceOp::Prod => acc.iter_mut().zip(src).for_each(|(a, &b)| *a = a.mul(b)),
        ReduceOp::Min => acc.iter_mut().zip(src).for_each(|(a, &b)| *a = a.min(b)),
        ReduceOp::Max => acc.iter_mut().zip(src).for_each(|(a, &b)| *a = a.max(b)),
    }
}

/// Finishes a reduction over `n` ranks (`Avg` divides; the other ops are done).
#[inline]
pub(crate) fn finish<E: Element>(acc: &mut [E], op: ReduceOp, n: usize) {
    if op == ReduceOp::Avg {
        acc.iter_mut().for_each(|a| *a = a.div_count(n));
    }
}

/// The reference every communicator must match bit for bit: each element folded over the
/// ranks in rank order, one element at a time. Written independently of the block kernels
/// above so that tests can check them against it.
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
            let mut acc = first[i];
            for s in &srcs[1..] {
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Avg => acc.add(s[i]),
                    ReduceOp::Prod => acc.mul(s[i]),
                    ReduceOp::Min => acc.min(s[i]),
                    ReduceOp::Max => acc.max(s[i]),
                };
            }
            if op == ReduceOp::Avg {
                acc = acc.div_count(srcs.len());
            }
            acc
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
}
