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

/// Reduces `srcs` (one slice per rank, in rank order) into `dst`: the reference every
/// communicator must match bit for bit.
pub fn reduce_reference<E: Element>(srcs: &[&[E]], op: ReduceOp) -> Vec<E> {
    let mut acc = srcs.first().map(|s| s.to_vec()).unwrap_or_default();
    for s in &srcs[1..] {
        combine(&mut acc, s, op);
    }
    finish(&mut acc, op, srcs.len());
    acc
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
