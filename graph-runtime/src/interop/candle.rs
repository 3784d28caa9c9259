//! candle (feature `candle`): a [`candle_core::Tensor`] on the CPU goes through a
//! collective as one value, of the dtype it has at run time.
//!
//! A candle tensor's element type is known only at run time, so it is a value of one part
//! laid out by its dtype ([`Layout::raw`]): f16, bf16, f32, f64, u8, u32, i32 and i64 map to
//! the actorgraph element of the same name. Its elements are copied into the stage's
//! buffer (candle keeps them behind a lock, which the stage cannot hold while its peers
//! read them; a non-contiguous tensor is made contiguous first), and its result is a new
//! candle tensor of the input's shape and dtype, copied out of the buffer. A tensor on
//! another candle device than the CPU is refused with [`Error::Placement`], one of another
//! dtype with [`Error::Unsupported`]; either fails the execution on every rank, and the
//! graph stays usable.

use candle_core::{CpuStorage, DType, Device, DeviceLocation, Storage, Tensor};

use crate::bucket::{Bucketable, Gather, GatherList, Hand, Layout, Parts, Reduced, Scatter};
use crate::Error;

/// `$body` with `$e` the actorgraph element type of candle dtype `$dtype`; `$other` for a
/// dtype without one.
macro_rules! with_element {
    ($dtype:expr, $e:ident => $body:expr, _ => $other:expr) => {
        match $dtype {
            DType::U8 => {
                type $e = u8;
                $body
            }
            DType::U32 => {
                type $e = u32;
                $body
            }
            DType::I32 => {
                type $e = i32;
                $body
            }
            DType::I64 => {
                type $e = i64;
                $body
            }
            DType::F16 => {
                type $e = half::f16;
                $body
            }
            DType::BF16 => {
                type $e = half::bf16;
                $body
            }
            DType::F32 => {
                type $e = f32;
                $body
            }
            DType::F64 => {
                type $e = f64;
                $body
            }
            _ => $other,
        }
    };
}

/// Why a tensor on `location` cannot go through a collective, if it cannot.
fn placement(location: DeviceLocation) -> Result<(), Error> {
    match location {
        DeviceLocation::Cpu => Ok(()),
        other => Err(Error::Placement(format!(
            "a candle tensor on {other:?} cannot go through a collective: actorgraph's candle \
             support takes CPU tensors; copy it with `to_device(&Device::Cpu)` first"
        ))),
    }
}

/// Why `t` cannot go through a collective, if it cannot: on another device than the CPU,
/// or of a dtype without an actorgraph element type.
fn check(t: &Tensor) -> Result<(), Error> {
    placement(t.device().location())?;
    with_element!(t.dtype(), E => {
        let _ = std::marker::PhantomData::<E>;
        Ok(())
    }, _ => Err(Error::Unsupported(format!(
        "a candle tensor of dtype {:?} cannot go through a collective: actorgraph has no \
         element type for it (convert it with `to_dtype`)",
        t.dtype()
    ))))
}

/// The number of rows `t` splits into: its first dimension (one for a 0-d tensor).
fn rows(t: &Tensor) -> usize {
    t.dims().first().copied().unwrap_or(1)
}

/// Lays `t` out as one part of its dtype, or refuses it.
fn add(t: &Tensor, layout: &mut Layout<'_>, scatter: bool) {
    if let Err(e) = check(t) {
        return layout.refuse(e);
    }
    let len = t.elem_count();
    let rows = if scatter { rows(t) } else { len };
    with_element!(t.dtype(), E => layout.raw::<E>(len, rows, t.dims()), _ => ())
}

/// Copies `t`'s elements into the stage (a checked tensor's: a refused one laid out none).
fn hand(t: &Tensor, hand: &mut Hand<'_, '_>) {
    if check(t).is_err() {
        return;
    }
    let contiguous;
    let t = if t.is_contiguous() {
        t
    } else {
        match t.contiguous() {
            Ok(c) => {
                contiguous = c;
                &contiguous
            }
            // Not copied: the stage reports the missing part.
            Err(_) => return,
        }
    };
    let (storage, layout) = t.storage_and_layout();
    let (Storage::Cpu(cpu), Some((start, end))) = (&*storage, layout.contiguous_offsets()) else {
        return;
    };
    with_element!(t.dtype(), E => {
        if let Some(data) = elements::<E>(cpu).and_then(|all| all.get(start..end)) {
            hand.copy::<E>(data);
        }
    }, _ => ())
}

fn elements<E: candle_core::WithDType>(cpu: &CpuStorage) -> Option<&[E]> {
    cpu.as_slice::<E>().ok()
}

/// A CPU tensor of `dims` and `t`'s dtype from a part's result; `t` itself when they do
/// not fit, which only a stage driven out of order gives.
fn result<E: crate::Element + candle_core::WithDType>(
    t: &Tensor,
    dims: &[usize],
    data: Reduced<'_, E>,
) -> Tensor {
    Tensor::from_slice(data.as_slice(), dims, &Device::Cpu).unwrap_or_else(|_| t.clone())
}

/// Which of a part's results to take.
#[derive(Clone, Copy)]
enum Kind {
    InPlace,
    Gathered,
    Scattered,
}

/// `t`'s result in a stage, with `dims` as its shape; `t` itself when it was refused.
fn unpack(t: &Tensor, dims: &[usize], parts: &mut Parts<'_>, kind: Kind) -> Tensor {
    if check(t).is_err() {
        return t.clone();
    }
    with_element!(
        t.dtype(),
        E => take(parts, kind, |data: Reduced<'_, E>| result(t, dims, data)),
        _ => t.clone()
    )
}

fn take<E: crate::Element, R>(
    parts: &mut Parts<'_>,
    kind: Kind,
    f: impl FnOnce(Reduced<'_, E>) -> R,
) -> R {
    match kind {
        Kind::InPlace => parts.raw(f),
        Kind::Gathered => parts.raw_gathered(f),
        Kind::Scattered => parts.raw_scattered(f),
    }
}

/// A candle tensor on the CPU, one part of its run-time dtype (see the module's docs). It
/// has no elements of its own as a `Bucketable` (`Elem` is a placeholder): the stage lays
/// it out, hands it and unpacks it by its parts.
impl Bucketable for Tensor {
    type Elem = u8;
    fn bucket_len(&self) -> usize {
        0
    }
    fn pack(&self, _: &mut [u8]) {}
    /// The tensor itself (candle tensors are immutable; a clone shares the storage).
    fn unpack(&self, _: Reduced<'_, u8>) -> Self {
        self.clone()
    }
    fn add_parts(&self, layout: &mut Layout<'_>) {
        add(self, layout, false)
    }
    fn hand_parts<'v>(&'v self, h: &mut Hand<'_, 'v>) {
        hand(self, h)
    }
    fn unpack_parts(&self, parts: &mut Parts<'_>) -> Self {
        unpack(self, self.dims(), parts, Kind::InPlace)
    }
}

/// `[d0, rest..]` becomes `[N * d0, rest..]` (a 0-d tensor `[N]`), of the input's dtype.
impl Gather for Tensor {
    type Gathered = Tensor;
    fn gathered(&self, _: Reduced<'_, u8>, _: usize) -> Tensor {
        self.gather_parts(&mut Parts::detached())
    }
    fn gather_parts(&self, parts: &mut Parts<'_>) -> Tensor {
        let n = parts.ranks();
        let dims: Vec<usize> = match self.dims().split_first() {
            Some((&d0, rest)) => std::iter::once(d0.saturating_mul(n))
                .chain(rest.iter().copied())
                .collect(),
            None => vec![n],
        };
        unpack(self, &dims, parts, Kind::Gathered)
    }
}

impl GatherList for Tensor {
    type List = Vec<Tensor>;
    fn gather_list(list: &[Self], parts: &mut Parts<'_>) -> Self::List {
        list.iter().map(|t| parts.gather(t)).collect()
    }
}

/// `[d0, rest..]` becomes `[d0 / N, rest..]`, of the input's dtype; `d0` must divide by N.
impl Scatter for Tensor {
    fn scattered(&self, _: Reduced<'_, u8>, _: usize) -> Tensor {
        self.clone()
    }
    fn add_scatter_parts(&self, layout: &mut Layout<'_>) {
        add(self, layout, true)
    }
    fn scatter_parts(&self, parts: &mut Parts<'_>) -> Tensor {
        let n = parts.ranks();
        let dims: Vec<usize> = match self.dims().split_first() {
            Some((&d0, rest)) => std::iter::once(d0 / n)
                .chain(rest.iter().copied())
                .collect(),
            None => Vec::new(),
        };
        unpack(self, &dims, parts, Kind::Scattered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No other candle device can be made without its feature and hardware: the refusal is
    /// tested at the check every path goes through, with the locations those devices report.
    #[test]
    fn a_tensor_on_another_device_is_a_placement_error() {
        assert!(placement(DeviceLocation::Cpu).is_ok());
        for loc in [
            DeviceLocation::Cuda { gpu_id: 1 },
            DeviceLocation::Metal { gpu_id: 0 },
        ] {
            match placement(loc) {
                Err(Error::Placement(m)) => {
                    assert!(m.contains(&format!("{loc:?}")), "{m}");
                    assert!(m.contains("to_device(&Device::Cpu)"), "{m}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn an_unmapped_dtype_is_unsupported_and_mapped_ones_pass() {
        let t = Tensor::zeros((2, 2), DType::I16, &Device::Cpu).unwrap();
        assert!(matches!(check(&t), Err(Error::Unsupported(m)) if m.contains("I16")));
        for d in [
            DType::U8,
            DType::U32,
            DType::I32,
            DType::I64,
            DType::F16,
            DType::BF16,
            DType::F32,
            DType::F64,
        ] {
            assert!(check(&Tensor::zeros(3, d, &Device::Cpu).unwrap()).is_ok());
        }
    }
}
