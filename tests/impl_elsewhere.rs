//! An actor type, its `#[actor]` impl (naming it `crate::types::Worker`) and the graph, in
//! three modules. The case is the trybuild pass case `tests/ui/pass/impl_elsewhere.rs`,
//! included at this crate's root so that `crate::` means the same here.

include!("ui/pass/impl_elsewhere.rs");

#[test]
fn the_impl_and_the_graph_in_other_modules_than_the_type() {
    main();
}
