//! The edges' protocol under every interleaving (loom).

use loom::thread;

use super::*;
use crate::exec::links::Links;

#[test]
fn loom_edge_carries_a_value_then_a_failure_marker() {
    loom::model(|| {
        let mut links = Links::new();
        let e = links.edge::<u32>("h", "enc", Route::Zip, 1);
        let e2 = e.clone();
        let producer = thread::spawn(move || {
            e2.send(0, 1, 41).unwrap();
            // Round 2 failed: waits until round 1's value is taken, then says so.
            e2.fail_from(0, 2, None);
        });
        assert_eq!(e.recv(0, 1), Ok(41));
        assert_eq!(e.recv(0, 2), Err(RecvError::failed(0)));
        producer.join().unwrap();
    });
}

#[test]
fn loom_gather_takes_every_producer_then_a_failure_marker() {
    loom::model(|| {
        let mut links = Links::new();
        let e = links.edge::<u32>("l", "w", Route::Gather { to: 0, keep: true }, 2);
        let e2 = e.clone();
        // Rank 1 produces for rank 0, which keeps its own value.
        let producer = thread::spawn(move || {
            e2.send(1, 1, 7).unwrap();
            e2.fail_from(1, 2, None);
        });
        assert_eq!(e.recv_gather(0, 1, Some(3)), Ok(vec![3, 7]));
        assert_eq!(e.recv_gather(0, 2, Some(4)), Err(RecvError::failed(1)));
        producer.join().unwrap();
    });
}

/// A consumer that finds a later round's message reads it without taking it (the
/// producer skipped its round) and takes it in its round.
#[test]
fn loom_a_later_round_waits_in_the_slot_for_its_round() {
    loom::model(|| {
        let mut links = Links::new();
        let e = links.edge::<u32>("h", "enc", Route::Zip, 1);
        let e2 = e.clone();
        // The producer never ran round 1.
        let producer = thread::spawn(move || e2.send(0, 2, 8).unwrap());
        // Round 1 waits for a message and finds round 2's: its producer skipped it.
        assert_eq!(e.recv(0, 1), Err(RecvError::failed(0)));
        assert_eq!(e.recv(0, 2), Ok(8));
        producer.join().unwrap();
    });
}

#[test]
fn loom_edge_abort_releases_the_consumer() {
    loom::model(|| {
        let mut links = Links::new();
        let e = links.edge::<u32>("h", "enc", Route::Zip, 1);
        let consumer = thread::spawn(move || e.recv(0, 1));
        links.abort();
        assert_eq!(consumer.join().unwrap(), Err(RecvError::Aborted));
    });
}
