//! What every process of an MPI test checks of an execution that failed on a rank of one
//! process: the same typed error everywhere. The workers of these tests fail with
//! `rank {r} refused` and panic with a message naming their rank. A test binary includes
//! this file with `#[path = "support/expect.rs"] mod expect;`.
#![allow(dead_code)] // each test binary uses its own part

use std::fmt::Debug;

use actorgraph::Error;

/// Panics unless `got` is rank `rank`'s error in `method` of group `workers`, whose own
/// error is `rank {rank} refused`.
pub fn refused<T: Debug>(got: Result<T, Error>, method: &str, rank: usize) {
    match got {
        Err(
            e @ Error::Method {
                group: "workers",
                method: m,
                rank: r,
                ..
            },
        ) if m == method && r == rank => {
            assert!(
                e.to_string().ends_with(&format!("rank {rank} refused")),
                "{e}"
            );
        }
        other => panic!("expected the error of rank {rank}'s {method}, got {other:?}"),
    }
}

/// Panics unless `got` is the panic of rank `rank` in `method` of group `workers`, with a
/// message that contains `says`.
pub fn panicked<T: Debug>(got: Result<T, Error>, method: &str, rank: usize, says: &str) {
    match got {
        Err(Error::Panic {
            group: "workers",
            rank: r,
            method: Some(m),
            message,
        }) if m == method && r == rank => assert!(message.contains(says), "{message}"),
        other => panic!("expected rank {rank}'s panic in {method}, got {other:?}"),
    }
}

/// Panics unless `got` is [`Error::Poisoned`] for rank `rank` of group `workers`.
pub fn poisoned<T: Debug>(got: Result<T, Error>, rank: usize) {
    match got {
        Err(Error::Poisoned {
            group: "workers",
            rank: r,
            ..
        }) if r == rank => {}
        other => panic!("expected rank {rank} poisoned, got {other:?}"),
    }
}
