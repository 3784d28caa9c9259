//! Actor types where a user's code puts them: imported under another name, generic (over
//! a user trait, used at two types in two graphs), and in an `#[actor]` block that holds
//! helpers which cannot be graph nodes. Each case is a trybuild pass case in
//! `tests/ui/pass/` (compiled there as its own binary crate), run here as a test.

mod renamed_actor {
    include!("../ui/pass/renamed_actor.rs");
}

mod generic_actors {
    include!("../ui/pass/generic_actors.rs");
}

mod helpers {
    include!("../ui/pass/helpers.rs");
}

mod graph_from_macro {
    include!("../ui/pass/graph_from_macro.rs");
}

#[test]
fn an_actor_imported_under_another_name() {
    renamed_actor::main();
}

#[test]
fn generic_actors_at_two_types_and_over_a_user_trait() {
    generic_actors::main();
}

#[test]
fn helpers_that_cannot_be_nodes_stay_ordinary_methods() {
    helpers::main();
}

#[test]
fn a_graph_written_by_a_macro_rules_macro() {
    graph_from_macro::main();
}
