//! How `#[actor]` describes an actor's methods to `graph!`, and how `graph!` finds them.
//!
//! `#[actor]` implements [`Actor`] for the impl block's self type (generic or not): the list
//! of its methods, each with its parameters as written and, for one that cannot be a graph
//! node, the reason. Each method that can be a node is also described by a
//! [`Signature<MethodId<K>>`](Signature) and callable through a [`Method<MethodId<K>>`]
//! impl, `K` its position in the list. `graph!` never names a generated item: for each call
//! it writes, it asks [`method_index`] at compile time for the method's position, through
//! the graph's [`MethodCall`] impl. A method that does not exist, cannot be a node, or gets
//! the wrong number of arguments is a compile error there, at the user's call, saying so
//! (a panic during constant evaluation), and everything else the graph derives from that
//! call goes through the same associated type, so nothing else reports an error.

use crate::bucket::Gather;
use crate::error::BoxError;

/// The methods of an `#[actor]` impl block, in the order they are written.
///
/// Implemented by `#[actor]`; `graph!` reads it at compile time.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an actor type",
    label = "this type has no `#[actor]` impl block",
    note = "an actor group's type needs an `impl` block marked `#[actor]`, whose methods the graph calls"
)]
pub trait Actor {
    /// Every method of the impl block, nodes and others.
    const METHODS: &'static [MethodInfo];
}

/// One method of an `#[actor]` impl block, as [`method_index`] needs it.
#[derive(Debug, Clone, Copy)]
pub struct MethodInfo {
    name: &'static str,
    /// The parameters after `self`, as written, for messages.
    params: &'static str,
    arity: usize,
    /// Why the method cannot be a graph node, if it cannot.
    not_a_node: Option<&'static str>,
}

impl MethodInfo {
    /// A method a graph can call.
    pub const fn node(name: &'static str, params: &'static str, arity: usize) -> Self {
        Self {
            name,
            params,
            arity,
            not_a_node: None,
        }
    }

    /// A method of the impl block that cannot be a graph node, and why (completing "it ..").
    pub const fn other(name: &'static str, reason: &'static str) -> Self {
        Self {
            name,
            params: "",
            arity: 0,
            not_a_node: Some(reason),
        }
    }
}

/// Names the `K`-th method of an actor's [`Actor::METHODS`].
pub struct MethodId<const K: usize>;

/// The `K`-th method call of a graph, `group.method(..)`: `Method` is the [`MethodId`] of
/// the method it calls, found by [`method_index`] when the graph's type is checked.
pub trait MethodCall<const K: usize> {
    /// The method called.
    type Method;
}

/// The parameters and result of method `M` of actor type `Self`: what the graph checks
/// its values against. Implemented by `#[actor]`.
pub trait Signature<M> {
    /// The arguments, each by reference: `(&'a A, &'a B)`.
    type Args<'a>
    where
        Self: 'a;
    /// What the method returns (the `T` of a `Result<T, E>` for a fallible method).
    type Output;
}

/// Calling method `M` of actor type `Self`. Implemented by `#[actor]`, where each
/// parameter taken by value is `Clone` (the graph's value is cloned into the call) and a
/// fallible method's error converts into [`BoxError`]: a method that does not satisfy
/// that is still a [`Signature`], and a graph that calls it gets the unmet bound as its
/// error.
pub trait Method<M>: Signature<M> {
    /// The method's name, for error messages.
    const NAME: &'static str;
    /// Calls the method; a fallible method's `Err` comes back boxed.
    // `Self: 'a` is written out (not implied by an elided lifetime) so that an impl for a
    // generic type whose parameters are not `'static` (`Model<B>`) can name `Args<'a>`.
    fn call<'a>(&mut self, args: Self::Args<'a>) -> Result<Self::Output, BoxError>
    where
        Self: 'a;
}

/// The result of a fallible method (`Result<T, E>`, also under an alias such as
/// `io::Result<T>`), turned into what [`Method::call`] returns.
pub trait Fallible {
    /// The value the graph sees.
    type Ok;
    /// The result, with its error boxed.
    fn into_result(self) -> Result<Self::Ok, BoxError>;
}

impl<T, E: Into<BoxError>> Fallible for Result<T, E> {
    type Ok = T;
    #[inline]
    fn into_result(self) -> Result<T, BoxError> {
        self.map_err(Into::into)
    }
}

/// The position of the graph node `method` in `A`'s [`Actor::METHODS`], called by a graph
/// with `args` arguments; `actor` is the actor type as the graph writes it.
///
/// # Panics
/// When `A` has no such method, when the method cannot be a graph node, or when `args` is
/// not its number of parameters, with a message that says so. `graph!` evaluates it in a
/// constant, where the panic is a compile error at the user's call.
// `track_caller` makes constant evaluation report the panic where this is called, at the
// user's call, as one sentence: without it, rustc adds a note for this function's frame,
// pointing into the runtime's source.
#[track_caller]
pub const fn method_index<A: Actor + ?Sized>(actor: &str, method: &str, args: usize) -> usize {
    let methods = A::METHODS;
    let mut i = 0;
    while i < methods.len() {
        let m = &methods[i];
        if str_eq(m.name, method) {
            let mut msg = Msg::new();
            if let Some(reason) = m.not_a_node {
                msg.push_all(&["`", actor, "::", method, "` cannot be a graph node: it "]);
                msg.push(reason);
                msg.push("; a graph node takes `&self` or `&mut self`, its arguments as `&T` or `T` and returns a value of its own (methods like this one may stay in the `#[actor]` block as helpers)");
                panic!("{}", msg.as_str());
            }
            if m.arity != args {
                msg.push_all(&["`", actor, "::", method, "` takes "]);
                msg.push_count(m.arity, "argument");
                if m.arity > 0 {
                    msg.push_all(&[" (`", m.params, "`)"]);
                }
                msg.push(" but the graph passes ");
                msg.push_usize(args);
                panic!("{}", msg.as_str());
            }
            return i;
        }
        i += 1;
    }
    let mut msg = Msg::new();
    msg.push_all(&["`", actor, "` has no graph method `", method, "`"]);
    let mut listed = 0;
    let mut j = 0;
    while j < methods.len() {
        if methods[j].not_a_node.is_none() {
            msg.push(if listed == 0 {
                "; its graph methods are: `"
            } else {
                "`, `"
            });
            msg.push(methods[j].name);
            listed += 1;
        }
        j += 1;
    }
    if listed == 0 {
        msg.push("; its `#[actor]` impl block has no method a graph can call");
    } else {
        msg.push("`");
    }
    panic!("{}", msg.as_str());
}

/// The `K`-th value type a graph checks against a bound in a constant (a graph input, a
/// value that leaves its actor, a value an `allgather` takes, a tuple it takes apart):
/// `graph!` implements it as
/// `<T as Valid<{ gatherable::<T>() }>>::Type`, which is `T` when the bound holds. When it
/// does not, the constant fails with the bound's own message, at the user's argument, and
/// every type derived from it is an error that reports nothing more.
///
/// `P` is only there for privacy: the tuple of the types the graph's declaration names,
/// so that an impl is no more public than they are.
pub trait Checked<const K: usize, P: ?Sized> {
    /// The checked type.
    type Type: ?Sized;
}

/// `Self`, once a check in a constant has passed (see [`Checked`]).
// Hidden, so that rustdoc lists its blanket impl on no type of a user's crate (rustdoc
// ignores a hidden impl of a visible trait from another crate); rustc's messages then name
// it by its path, `actorgraph::..`.
#[doc(hidden)]
pub trait Valid<const OK: bool> {
    /// `Self`.
    type Type: ?Sized;
}

impl<T: ?Sized> Valid<true> for T {
    type Type = T;
}

/// A value that leaves its actor's thread: a graph's output, or a value sent to other
/// actors. Implemented for every `Send + 'static` type; it exists for its error message.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot leave its actor: it is not `Send`",
    label = "this value goes to another thread",
    note = "a graph's output goes back to the caller, and a value that other actors read goes to their threads; a value used only on its own actor need not be `Send`"
)]
// Hidden, so that rustdoc lists its blanket impl on no type of a user's crate (rustdoc
// ignores a hidden impl of a visible trait from another crate); rustc's messages then name
// it by its path, `actorgraph::..`.
#[doc(hidden)]
pub trait Sendable: Send + 'static {}

impl<T: Send + 'static> Sendable for T {}

/// The check of a value that leaves its actor (see [`Checked`]).
pub const fn sendable<T: Sendable>() -> bool {
    true
}

/// What a graph input needs: every actor that reads it gets a clone, on its own thread.
/// Implemented for every `Clone + Send + 'static` type; it exists for its error message.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a graph input: it must be `Clone + Send + 'static`",
    label = "every actor that reads this input gets a clone of it, on its own thread",
    note = "a `Tensor` clone copies no data"
)]
// Hidden, so that rustdoc lists its blanket impl on no type of a user's crate (rustdoc
// ignores a hidden impl of a visible trait from another crate); rustc's messages then name
// it by its path, `actorgraph::..`.
#[doc(hidden)]
pub trait Input: Clone + Send + 'static {}

impl<T: Clone + Send + 'static> Input for T {}

/// The check of a graph input's type (see [`Checked`]).
pub const fn input<T: Input>() -> bool {
    true
}

/// What a per-rank input's element needs: it moves to its actor's thread. Implemented for
/// every `Send + 'static` type; it exists for its error message.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a per-rank input: it must be `Send + 'static`",
    label = "each value of this input moves to its actor's thread",
    note = "a per-rank value is moved, never cloned, so it need not be `Clone`"
)]
// Hidden, so that rustdoc lists its blanket impl on no type of a user's crate (rustdoc
// ignores a hidden impl of a visible trait from another crate); rustc's messages then name
// it by its path, `actorgraph::..`.
#[doc(hidden)]
pub trait RankInput: Send + 'static {}

impl<T: Send + 'static> RankInput for T {}

/// The check of a per-rank input's element type (see [`Checked`]).
pub const fn rank_input<T: RankInput>() -> bool {
    true
}

/// What `scatter(v)` splits over a group: a `Vec` with one value per rank, the k-th
/// moved to rank k.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be split over a group: `scatter` takes a `Vec` with one value per rank",
    label = "rank k of the group gets the k-th value of this `Vec`"
)]
pub trait Split {
    /// What each rank gets.
    type Item;
    /// The values, by rank.
    fn into_values(self) -> Vec<Self::Item>;
}

impl<T> Split for Vec<T> {
    type Item = T;
    fn into_values(self) -> Vec<T> {
        self
    }
}

/// The check of a value `scatter` splits (see [`Checked`]).
pub const fn splittable<T: Split>() -> bool {
    true
}

/// The check of a value an `allgather` takes (see [`Checked`]).
pub const fn gatherable<T: Gather>() -> bool {
    true
}

/// A tuple of `N` fields, which a graph may take apart into `N` names.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be taken apart into {N} names",
    label = "this pattern takes apart a tuple of {N} fields",
    note = "a pattern `let (a, b, ..) = ` takes apart a tuple of as many fields as it has names; bind any other value to one name: `let x = ..`"
)]
pub trait Fields<const N: usize> {}

/// The check of a value a graph takes apart into `N` names (see [`Checked`]).
pub const fn destructures<T: Fields<N>, const N: usize>() -> bool {
    true
}

/// A value, as the type of a check (see [`Checked`]): when the check failed, that type is
/// an error, and so is everything derived from the value, silently.
#[inline(always)]
pub fn checked<T>(value: T) -> T {
    value
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A message built at compile time, in a fixed buffer (constant evaluation cannot
/// allocate). Pieces are appended whole, so the bytes are always valid UTF-8; what does
/// not fit is replaced by one `...`.
struct Msg {
    buf: [u8; Msg::CAP],
    len: usize,
    full: bool,
}

impl Msg {
    const CAP: usize = 1024;
    const MORE: &'static str = "...";

    const fn new() -> Self {
        Self {
            buf: [0; Msg::CAP],
            len: 0,
            full: false,
        }
    }

    const fn push(&mut self, s: &str) {
        let b = s.as_bytes();
        if self.full {
            return;
        }
        if self.len + b.len() + Msg::MORE.len() > Msg::CAP {
            self.full = true;
            self.copy(Msg::MORE.as_bytes());
            return;
        }
        self.copy(b);
    }

    const fn copy(&mut self, b: &[u8]) {
        let mut i = 0;
        while i < b.len() {
            self.buf[self.len + i] = b[i];
            i += 1;
        }
        self.len += b.len();
    }

    const fn push_all(&mut self, parts: &[&str]) {
        let mut i = 0;
        while i < parts.len() {
            self.push(parts[i]);
            i += 1;
        }
    }

    const fn push_usize(&mut self, mut n: usize) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        match core::str::from_utf8(digits.split_at(i).1) {
            Ok(s) => self.push(s),
            Err(_) => self.push("?"),
        }
    }

    /// `no arguments`, `1 argument`, `2 arguments`.
    const fn push_count(&mut self, n: usize, noun: &str) {
        if n == 0 {
            self.push_all(&["no ", noun, "s"]);
        } else {
            self.push_usize(n);
            self.push_all(&[" ", noun]);
            if n > 1 {
                self.push("s");
            }
        }
    }

    const fn as_str(&self) -> &str {
        match core::str::from_utf8(self.buf.split_at(self.len).0) {
            Ok(s) => s,
            Err(_) => "actorgraph: a method lookup failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Worker;

    impl Actor for Worker {
        const METHODS: &'static [MethodInfo] = &[
            MethodInfo::node("comp1", "x: &Tensor<f32>", 1),
            MethodInfo::other("weights", "returns a reference"),
            MethodInfo::node("step", "lr: f32, x: &Tensor<f32>", 2),
            MethodInfo::node("tick", "", 0),
        ];
    }

    struct Helpers;

    impl Actor for Helpers {
        const METHODS: &'static [MethodInfo] = &[MethodInfo::other("new", "takes no `self`")];
    }

    fn panic_message(f: impl FnOnce() -> usize + std::panic::UnwindSafe) -> String {
        let payload = std::panic::catch_unwind(f).expect_err("the lookup should fail");
        match (
            payload.downcast_ref::<String>(),
            payload.downcast_ref::<&str>(),
        ) {
            (Some(s), _) => s.clone(),
            (_, Some(s)) => s.to_string(),
            _ => panic!("a panic without a message"),
        }
    }

    #[test]
    fn finds_a_method_by_name_and_arity() {
        const STEP: usize = method_index::<Worker>("Worker", "step", 2);
        assert_eq!(STEP, 2);
        assert_eq!(method_index::<Worker>("W", "comp1", 1), 0);
        assert_eq!(method_index::<Worker>("W", "tick", 0), 3);
    }

    #[test]
    fn an_unknown_method_lists_the_graph_methods() {
        assert_eq!(
            panic_message(|| method_index::<Worker>("W", "nope", 1)),
            "`W` has no graph method `nope`; its graph methods are: `comp1`, `step`, `tick`"
        );
        assert_eq!(
            panic_message(|| method_index::<Helpers>("Helpers", "run", 0)),
            "`Helpers` has no graph method `run`; its `#[actor]` impl block has no method a graph can call"
        );
    }

    #[test]
    fn a_helper_says_why_it_is_not_a_node() {
        let msg = panic_message(|| method_index::<Worker>("Worker", "weights", 0));
        assert!(
            msg.starts_with("`Worker::weights` cannot be a graph node: it returns a reference; "),
            "{msg}"
        );
    }

    #[test]
    fn a_wrong_argument_count_shows_the_parameters() {
        assert_eq!(
            panic_message(|| method_index::<Worker>("Worker", "step", 1)),
            "`Worker::step` takes 2 arguments (`lr: f32, x: &Tensor<f32>`) but the graph passes 1"
        );
        assert_eq!(
            panic_message(|| method_index::<Worker>("Worker", "comp1", 12)),
            "`Worker::comp1` takes 1 argument (`x: &Tensor<f32>`) but the graph passes 12"
        );
        assert_eq!(
            panic_message(|| method_index::<Worker>("Worker", "tick", 1)),
            "`Worker::tick` takes no arguments but the graph passes 1"
        );
    }

    #[test]
    fn a_message_too_long_for_the_buffer_ends_in_an_ellipsis() {
        let long = "x".repeat(2000);
        let msg = panic_message(|| method_index::<Worker>(&long, "nope", 0));
        assert!(msg.len() <= Msg::CAP, "{}", msg.len());
        assert!(msg.ends_with("..."), "{msg}");
    }
}
