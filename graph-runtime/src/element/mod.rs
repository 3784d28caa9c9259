//! Element types that tensors hold and collectives reduce.

use std::fmt;

/// The element types, once: every per-dtype item of the crate is generated from this list
/// (the `DType` enum and its tables, the `Element` impls, `with_dtype!`, `RegionMut`, the
/// regions of a fused stage, the scalar `Bucketable` impls, the NCCL type mapping).
///
/// Calls `$m!` with `$arg` (if given, one token tree), then one `Variant: type [name,
/// kind, doc]` entry per dtype, in `DType::ALL` order; `kind` is how `Element` computes on
/// it (`float`, `half`: through `f32`, or `int`: wrapping).
macro_rules! for_each_dtype {
    // `$m` as tokens, not a `path` fragment: a fragment followed by `!` is no macro call
    // in expression position.
    ($($m:ident)::+ $(, $arg:tt)?) => {
        $($m)::+! {
            $($arg)?
            F16: half::f16 ["f16", half, "[`half::f16`], IEEE 754 binary16."],
            BF16: half::bf16 ["bf16", half, "[`half::bf16`], bfloat16."],
            F32: f32 ["f32", float, "`f32`"],
            F64: f64 ["f64", float, "`f64`"],
            I8: i8 ["i8", int, "`i8`"],
            U8: u8 ["u8", int, "`u8`"],
            I32: i32 ["i32", int, "`i32`"],
            U32: u32 ["u32", int, "`u32`"],
            I64: i64 ["i64", int, "`i64`"],
            U64: u64 ["u64", int, "`u64`"]
        }
    };
}
pub(crate) use for_each_dtype;

macro_rules! dtype {
    ($($d:ident: $t:ty [$name:literal, $kind:ident, $doc:literal]),*) => {
        /// The element type of a tensor, known at run time.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum DType {
            $(#[doc = $doc] $d,)*
        }

        impl DType {
            /// Every dtype, in the order regions of a fused stage are laid out.
            pub const ALL: [DType; DType::COUNT] = [$(DType::$d),*];

            /// Number of dtypes.
            pub const COUNT: usize = [$(DType::$d),*].len();

            /// Size of one element in bytes.
            pub const fn size(self) -> usize {
                match self { $(DType::$d => std::mem::size_of::<$t>(),)* }
            }

            /// Position of this dtype in [`DType::ALL`].
            pub const fn index(self) -> usize {
                self as usize
            }

            /// The Rust name of the element type.
            pub const fn name(self) -> &'static str {
                match self { $(DType::$d => $name,)* }
            }
        }
    };
}
for_each_dtype!(dtype);

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg_attr(not(feature = "nccl"), path = "no_device.rs")]
mod device;

mod sealed {
    pub trait Sealed: super::device::OnDevice {}
}

/// A scalar type that tensors hold and collectives reduce.
///
/// Implemented for [`half::f16`], [`half::bf16`], `f32`, `f64`, `i8`, `u8`, `i32`, `u32`,
/// `i64` and `u64`.
///
/// How each [`ReduceOp`](crate::ReduceOp) behaves:
/// - A reduction folds the ranks' values in rank order in the type's accumulator
///   ([`Element::Acc`]) and converts the result once at the end, so every rank gets the
///   same bits.
/// - `f16` and `bf16` accumulate in `f32`: a sum over N ranks is rounded to 16 bits once,
///   not N - 1 times, which loses no more precision than NCCL's reductions do. Every other
///   type accumulates in itself.
/// - Integer `Sum` and `Prod` wrap on overflow (as NCCL's do); integer `Avg` is the
///   wrapping sum divided by the number of ranks, rounded toward zero (`[3, 4]` over two
///   ranks averages to `3`, `[-3, -4]` to `-3`).
/// - Float `Avg` is the sum divided by the number of ranks; `Min`/`Max` on floats ignore NaN
///   when the other operand is a number (IEEE 754 `minNum`/`maxNum`).
///
/// ```
/// use actorgraph::{comm::reduce_reference, half::f16, ReduceOp};
/// // 2048 + 1 + 1 in f16 steps would round to 2048 twice; accumulated in f32 it is 2050.
/// let (a, b, c) = ([f16::from_f32(2048.0)], [f16::ONE], [f16::ONE]);
/// let sum = reduce_reference(&[&a[..], &b[..], &c[..]], ReduceOp::Sum);
/// assert_eq!(sum, vec![f16::from_f32(2050.0)]);
/// assert_eq!(reduce_reference(&[&[3i32][..], &[4][..]], ReduceOp::Avg), vec![3]);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a tensor element type",
    label = "not an element type",
    note = "element types are f16, bf16 (from the `half` crate), f32, f64, i8, u8, i32, u32, i64 and u64"
)]
pub trait Element:
    Copy + Default + PartialEq + PartialOrd + fmt::Debug + Send + Sync + 'static + sealed::Sealed
{
    /// The run-time tag of this type.
    const DTYPE: DType;
    /// The type reductions accumulate in: `f32` for `f16` and `bf16`, `Self` for the others.
    type Acc: Element;
    /// Widens a value into the accumulator (exact).
    fn to_acc(self) -> Self::Acc;
    /// Narrows an accumulated value back (rounding to nearest, ties to even, for `f16` and
    /// `bf16`; exact for the others).
    fn from_acc(acc: Self::Acc) -> Self;
    /// `a + b` (wrapping for integers; computed in `f32` and rounded once for `f16`/`bf16`).
    fn add(self, other: Self) -> Self;
    /// `a * b` (wrapping for integers; computed in `f32` and rounded once for `f16`/`bf16`).
    fn mul(self, other: Self) -> Self;
    /// The smaller of the two.
    fn min(self, other: Self) -> Self;
    /// The larger of the two.
    fn max(self, other: Self) -> Self;
    /// `self / n`, used by `Avg`; rounds toward zero for integers.
    fn div_count(self, n: usize) -> Self;
    /// Wraps a slice of this type for the type-erased communicator interface.
    fn region_mut(slice: &mut [Self]) -> RegionMut<'_>;
}

/// The `Element` impls. Every kind of element shares the skeleton; `@ops` is what differs.
macro_rules! element {
    ($($d:ident: $t:ty [$name:literal, $kind:ident, $doc:literal]),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            element!(@ops $kind $t);
            fn region_mut(slice: &mut [Self]) -> RegionMut<'_> {
                RegionMut::$d(slice)
            }
        }
    )*};
    (@ops float $t:ty) => {
        type Acc = $t;
        #[inline(always)]
        fn to_acc(self) -> Self {
            self
        }
        #[inline(always)]
        fn from_acc(acc: Self) -> Self {
            acc
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            self + o
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            self * o
        }
        #[inline(always)]
        fn min(self, o: Self) -> Self {
            <$t>::min(self, o)
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            <$t>::max(self, o)
        }
        #[inline(always)]
        fn div_count(self, n: usize) -> Self {
            self / n as $t
        }
    };
    // 16-bit floats: every op goes through `f32` and rounds once.
    (@ops half $t:ty) => {
        type Acc = f32;
        #[inline(always)]
        fn to_acc(self) -> f32 {
            self.to_f32()
        }
        #[inline(always)]
        fn from_acc(acc: f32) -> Self {
            <$t>::from_f32(acc)
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            Self::from_acc(self.to_acc() + o.to_acc())
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            Self::from_acc(self.to_acc() * o.to_acc())
        }
        #[inline(always)]
        fn min(self, o: Self) -> Self {
            Self::from_acc(self.to_acc().min(o.to_acc()))
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            Self::from_acc(self.to_acc().max(o.to_acc()))
        }
        #[inline(always)]
        fn div_count(self, n: usize) -> Self {
            Self::from_acc(self.to_acc() / n as f32)
        }
    };
    (@ops int $t:ty) => {
        type Acc = $t;
        #[inline(always)]
        fn to_acc(self) -> Self {
            self
        }
        #[inline(always)]
        fn from_acc(acc: Self) -> Self {
            acc
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            self.wrapping_add(o)
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            self.wrapping_mul(o)
        }
        #[inline(always)]
        fn min(self, o: Self) -> Self {
            Ord::min(self, o)
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            Ord::max(self, o)
        }
        #[inline(always)]
        fn div_count(self, n: usize) -> Self {
            // A group never has more ranks than the type can count (n <= 128 for i8 is
            // not guaranteed), so divide in i128 and narrow back: exact for every n.
            (self as i128 / n as i128) as $t
        }
    };
}
for_each_dtype!(element);

macro_rules! region_mut {
    ($($d:ident: $t:ty [$($info:tt)*]),*) => {
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
for_each_dtype!(region_mut);

/// Runs `$body` with the type alias `$E` bound to the Rust type of `$dtype`.
macro_rules! with_dtype {
    // The arms, from `for_each_dtype!` (first: its input would not parse as the other's).
    ((@arms ($dtype:expr) $E:ident ($body:expr)) $($d:ident: $t:ty [$($info:tt)*]),*) => {
        match $dtype {
            $($crate::DType::$d => {
                type $E = $t;
                $body
            })*
        }
    };
    ($dtype:expr, $E:ident => $body:expr) => {
        $crate::element::for_each_dtype!(crate::element::with_dtype, (@arms ($dtype) $E ($body)))
    };
}
pub(crate) use with_dtype;

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn dtype_order_matches_the_enum() {
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(d.index(), i);
        }
        assert_eq!(f16::DTYPE.size(), 2);
        assert_eq!(bf16::DTYPE.name(), "bf16");
    }

    #[test]
    fn half_ops_round_once_from_f32() {
        let a = f16::from_f32(1.0);
        let b = f16::from_f32(2.0f32.powi(-11)); // half an ulp of 1.0: ties to even
        assert_eq!(a.add(b), f16::from_f32(1.0));
        assert_eq!(bf16::from_f32(3.0).div_count(2), bf16::from_f32(1.5));
        assert_eq!(f16::from_f32(-1.0).min(f16::NAN), f16::from_f32(-1.0));
        assert_eq!(i8::MIN.div_count(200), 0);
    }
}
