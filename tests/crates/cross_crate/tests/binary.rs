//! The binary's graph, over the library's actor types, runs and computes the right
//! results; and a graph in this test crate uses the library's types as well.

use std::process::Command;

use actorgraph::prelude::*;
use actorgraph_cross_crate::Scaled;

#[test]
fn the_binary_runs_a_graph_over_the_library_actors() {
    let out = Command::new(env!("CARGO_BIN_EXE_cross-crate"))
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "grad [3.0, 3.0] scaled [8.0] ranks [0, 1, 2]"
    );
}

graph! {
    Generic(scalers: [Scaled<i32>; 2], x: Tensor<i32>) {
        let s = scalers.scale(x);
        allreduce(s, Max)
    }
}

#[test]
fn a_graph_in_another_crate_over_a_generic_library_actor() {
    let mut g = Generic::launch([Scaled { k: 3 }, Scaled { k: -1 }], Cpu).unwrap();
    let out: Vec<Tensor<i32>> = g.execute(Tensor::full([3], 2)).unwrap();
    assert_eq!(out[1].to_vec(), vec![6; 3]);
    assert!(Generic::to_dot().contains("scalers: [Scaled<i32>; 2]"));
}
