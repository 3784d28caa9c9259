//! A crate that shadows prelude and std names (`Result`, `Error`, `Tensor`, `Vec`, `Clone`,
//! `Send`, modules `std`, `core` and `actorgraph`, ..), and a module with no prelude at all,
//! define actors and graphs and run them. The case is the trybuild pass case
//! `tests/ui/pass/hygiene.rs`, included at this crate's root.
#![allow(dead_code, non_camel_case_types)]

include!("ui/pass/hygiene.rs");

#[test]
fn generated_code_names_everything_by_absolute_paths() {
    main();
}
