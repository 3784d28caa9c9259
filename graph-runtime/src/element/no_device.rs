//! What an element type needs without a GPU backend (feature `nccl` off): nothing.

pub trait OnDevice {}

impl<T> OnDevice for T {}
