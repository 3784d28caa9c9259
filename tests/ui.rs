//! Compile-fail and compile-pass cases of `#[actor]` and `graph!`: every error points at
//! the user's tokens and reads well.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
