//! Compile-fail and compile-pass cases of `#[actor]` and `graph!`: every error points at
//! the user's tokens and reads well.

/// Cases whose expected output lists a trait's implementors (rustc's "the following other
/// types implement trait"), a list the `ndarray` and `candle` features lengthen: they are
/// checked in a build without those features (`cargo test --test ui`, which CI runs too).
const LISTS_IMPLEMENTORS: [&str; 4] = [
    "derive_not_a_struct.rs",
    "not_gatherable.rs",
    "not_reducible.rs",
    "not_scatterable.rs",
];

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    if cfg!(any(feature = "ndarray", feature = "candle")) {
        let mut cases: Vec<_> = std::fs::read_dir("tests/ui/fail")
            .expect("tests/ui/fail")
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .filter(|p| !LISTS_IMPLEMENTORS.iter().any(|n| p.ends_with(n)))
            .collect();
        cases.sort();
        assert!(cases.len() > 10, "the compile-fail cases are found");
        cases.iter().for_each(|p| t.compile_fail(p));
    } else {
        t.compile_fail("tests/ui/fail/*.rs");
    }
    t.pass("tests/ui/pass/*.rs");
}
