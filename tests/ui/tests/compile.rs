//! Compile-fail and compile-pass cases of `#[actor]` and `graph!`: every error points at
//! the user's tokens and reads well.
//!
//! They build against actorgraph without features, in every workspace build: this package
//! enables none (see its `Cargo.toml`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("fail/*.rs");
    t.pass("pass/*.rs");
}
