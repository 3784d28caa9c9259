//! Element types that tensors hold and collectives reduce.

use std::fmt;

/// The element type of a tensor, known at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// `f32`
    F32,
    /// `f64`
    F64,
    /// `i8`
    I8,
    /// `u8`
    U8,
    /// `i32`
    I32,
    /// `u32`
    U32,
    /// `i64`
    I64,
    /// `u64`
    U64,
}

impl DType {
    /// Every dtype, in the order regions of a fused stage are laid out.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
    ];

    /// Number of dtypes.
    pub const COUNT: usize = Self::ALL.len();

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Position of this dtype in [`DType::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The Rust name of the element type.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A scalar type that tensors hold and collectives reduce.
///
/// Implemented for `f32`, `f64`, `i8`, `u8`, `i32`, `u32`, `i64` and `u64`. Integer sums
/// and products wrap on overflow (as NCCL's do); `Avg` on integers is the wrapping sum
/// divided by the number of ranks, rounded toward zero. `Min`/`Max` on floats ignore NaN
/// when the other operand is a number (IEEE 754 `minNum`/`maxNum`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a tensor element type",
    label = "not an element type",
    note = "element types are f32, f64, i8, u8, i32, u32, i64 and u64"
)]
pub trait Element:
    Copy + Default + PartialEq + PartialOrd + fmt::Debug + Send + Sync + 'static + sealed::Sealed
{
    /// The run-time tag of this type.
    const DTYPE: DType;
    /// `a + b` (wrapping for integers).
    fn add(self, other: Self) -> Self;
    /// `a * b` (wrapping for integers).
    fn mul(self, other: Self) -> Self;
    /// The smaller of the two.
    fn min(self, other: Self) -> Self;
    /// The larger of the two.
    fn max(self, other: Self) -> Self;
    /// `self / n`, used by `Avg`; rounds toward zero for integers.
    fn div_count(self, n: usize) -> Self;
    /// Wraps a slice of this type for the type-erased communicator interface.
    fn region_mut(slice: &mut [Self]) -> crate::comm::RegionMut<'_>;
}

macro_rules! float_element {
    ($t:ty, $d:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
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
            fn region_mut(slice: &mut [Self]) -> crate::comm::RegionMut<'_> {
                crate::comm::RegionMut::$d(slice)
            }
        }
    };
}

macro_rules! int_element {
    ($t:ty, $d:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
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
            fn region_mut(slice: &mut [Self]) -> crate::comm::RegionMut<'_> {
                crate::comm::RegionMut::$d(slice)
            }
        }
    };
}

float_element!(f32, F32);
float_element!(f64, F64);
int_element!(i8, I8);
int_element!(u8, U8);
int_element!(i32, I32);
int_element!(u32, U32);
int_element!(i64, I64);
int_element!(u64, U64);

/// Runs `$body` with the type alias `$E` bound to the Rust type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, $E:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $E = f32;
                $body
            }
            $crate::DType::F64 => {
                type $E = f64;
                $body
            }
            $crate::DType::I8 => {
                type $E = i8;
                $body
            }
            $crate::DType::U8 => {
                type $E = u8;
                $body
            }
            $crate::DType::I32 => {
                type $E = i32;
                $body
            }
            $crate::DType::U32 => {
                type $E = u32;
                $body
            }
            $crate::DType::I64 => {
                type $E = i64;
                $body
            }
            $crate::DType::U64 => {
                type $E = u64;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;
