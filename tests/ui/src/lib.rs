//! Empty: this package holds actorgraph's compile-fail and compile-pass cases (`fail/`,
//! `pass/`), which its test `tests/compile.rs` builds with trybuild.
