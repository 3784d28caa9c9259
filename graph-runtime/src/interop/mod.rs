//! The tensors Rust users already have, in buckets: each integration behind its feature,
//! in a module of its own, implementing the value traits (`Bucketable`, `Gather`,
//! `Scatter`, `GatherList`) for the foreign type and the conversions to and from
//! [`Tensor`](crate::Tensor).

#[cfg(feature = "candle")]
mod candle;
#[cfg(feature = "ndarray")]
mod ndarray;
