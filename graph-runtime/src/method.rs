//! How `#[actor]` describes a method to `graph!`.

use crate::error::BoxError;

/// A method of actor type `Self` that a graph can call, described by `#[actor]`.
///
/// `M` is a zero-sized marker that `#[actor]` generates per method; `graph!` names it to
/// reach the method's argument and output types, so every edge of a graph is checked by
/// rustc. Users do not implement this trait by hand.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no graph method `{M}`",
    note = "graph methods come from an `impl` block marked `#[actor]`"
)]
pub trait Method<M>: 'static {
    /// The arguments, each by reference: `(&'a A, &'a B)`.
    type Args<'a>;
    /// What the method returns (the `T` of a `Result<T, E>` for a fallible method).
    type Output: Send + 'static;
    /// The method's name, for error messages.
    const NAME: &'static str;
    /// Calls the method; a fallible method's `Err` comes back boxed.
    fn call(&mut self, args: Self::Args<'_>) -> Result<Self::Output, BoxError>;
}

/// Turns a fallible method's result into the boxed form [`Method::call`] returns.
pub fn into_result<T, E>(r: Result<T, E>) -> Result<T, BoxError>
where
    E: Into<BoxError>,
{
    r.map_err(Into::into)
}
