//! The edges' protocol: values, failure markers, gathers, scatters, stale and skipped
//! rounds, and the abort, each through a [`Links`] table as the graph makes them.

use std::thread;

use super::*;
use crate::exec::links::Links;

#[test]
fn a_value_crosses_and_the_slot_empties_every_round() {
    let mut links = Links::new();
    let e = links.edge::<Vec<u32>>("h", "enc", Route::Zip, 2);
    let e2 = e.clone();
    let consumer = thread::spawn(move || {
        (1..=100)
            .map(|round| e2.recv(1, round).unwrap()[0])
            .sum::<u32>()
    });
    for round in 1..=100u64 {
        e.send(1, round, vec![round as u32]).unwrap();
    }
    assert_eq!(consumer.join().unwrap(), 5050);
}

#[test]
fn a_failure_marker_names_the_producer() {
    let mut links = Links::new();
    let e = links.edge::<u8>("t", "w", Route::One { from: 0, to: 1 }, 2);
    links.get(0).unwrap().fail_from(0, 1, None);
    assert_eq!(e.recv(1, 1), Err(RecvError::failed(0)));
    // The slot is empty again: the next round works.
    e.send(0, 2, 7).unwrap();
    assert_eq!(e.recv(1, 2), Ok(7));
}

#[test]
fn a_gather_collects_every_producer_in_rank_order_and_empties_after_a_failure() {
    let mut links = Links::new();
    // Three producers of another group feed consumer rank 0.
    let e = links.edge::<String>("l", "w", Route::Gather { to: 0, keep: false }, 3);
    for rank in 0..3 {
        e.send(rank, 1, format!("r{rank}")).unwrap();
    }
    assert_eq!(e.recv_gather(0, 1, None).unwrap(), ["r0", "r1", "r2"]);
    // Rank 1 fails: the consumer still takes every message, and names rank 1.
    e.send(0, 2, "a".into()).unwrap();
    links.get(0).unwrap().fail_from(1, 2, None);
    e.send(2, 2, "c".into()).unwrap();
    assert_eq!(e.recv_gather(0, 2, None), Err(RecvError::failed(1)));
    for rank in 0..3 {
        e.send(rank, 3, format!("{rank}")).unwrap();
    }
    assert_eq!(e.recv_gather(0, 3, None).unwrap(), ["0", "1", "2"]);
    // A rank that gathers nothing gets no value.
    assert_eq!(e.recv_gather(1, 3, None), Err(RecvError::Aborted));
}

#[test]
fn a_gather_to_a_group_gives_every_consumer_every_value_in_rank_order() {
    let mut links = Links::new();
    // Three producers, two consumers.
    let e = links.edge::<u8>("l", "w", Route::GatherAll { producers: 3 }, 2);
    for rank in 0..3 {
        e.send_each(rank, 1, rank as u8, |v| *v).unwrap();
    }
    assert_eq!(e.recv_gather(1, 1, None).unwrap(), [0, 1, 2]);
    assert_eq!(e.recv_gather(0, 1, None).unwrap(), [0, 1, 2]);
    // Producer 2 fails: both consumers name it, and every slot is empty again.
    e.send_each(0, 2, 5, |v| *v).unwrap();
    e.send_each(1, 2, 6, |v| *v).unwrap();
    links.get(0).unwrap().fail_from(2, 2, None);
    assert_eq!(e.recv_gather(0, 2, None), Err(RecvError::failed(2)));
    links.get(0).unwrap().drain_to(1, 2);
    for rank in 0..3 {
        e.send_each(rank, 3, 10 + rank as u8, |v| *v).unwrap();
    }
    assert_eq!(e.recv_gather(0, 3, None).unwrap(), [10, 11, 12]);
    assert_eq!(e.recv_gather(1, 3, None).unwrap(), [10, 11, 12]);
}

#[test]
fn a_recycled_gather_vec_takes_the_next_rounds_values() {
    let mut links = Links::new();
    let e = links.edge::<u8>("l", "w", Route::Gather { to: 0, keep: false }, 2);
    e.send(0, 1, 1).unwrap();
    e.send(1, 1, 2).unwrap();
    let first = e.recv_gather(0, 1, None).unwrap();
    let buffer = first.as_ptr();
    e.recycle(first);
    e.send(0, 2, 3).unwrap();
    e.send(1, 2, 4).unwrap();
    let second = e.recv_gather(0, 2, None).unwrap();
    assert_eq!((second.as_slice(), second.as_ptr()), (&[3, 4][..], buffer));
    // No room for a second spare: it is dropped, not kept.
    e.recycle(vec![9]);
    e.recycle(second);
    assert_eq!(e.spares().len(), 1);
}

#[test]
fn a_gather_within_a_group_keeps_the_consumers_own_value() {
    let mut links = Links::new();
    let e = links.edge::<u8>("l", "w", Route::Gather { to: 1, keep: true }, 3);
    // Rank 1 sends nothing: it is the consumer.
    for rank in [0, 1, 2] {
        e.send(rank, 1, 10 + rank as u8).unwrap();
    }
    assert_eq!(e.recv_gather(1, 1, Some(99)).unwrap(), [10, 99, 12]);
    // A failed consumer drains the others' messages; the next round works.
    e.send(0, 2, 0).unwrap();
    e.send(2, 2, 2).unwrap();
    links.get(0).unwrap().drain_to(1, 2);
    e.send(0, 3, 3).unwrap();
    e.send(2, 3, 5).unwrap();
    assert_eq!(e.recv_gather(1, 3, Some(4)).unwrap(), [3, 4, 5]);
}

#[test]
fn a_scatter_moves_the_kth_value_to_rank_k_and_refuses_another_length() {
    let mut links = Links::new();
    let e = links.edge::<Box<u8>>(
        "v",
        "w",
        Route::Scatter {
            from: 1,
            keep: true,
        },
        3,
    );
    let values: Vec<Box<u8>> = (0..3).map(Box::new).collect();
    let addr = &*values[2] as *const u8;
    let kept = e.send_scatter(1, 1, values).unwrap().unwrap();
    assert_eq!(kept.as_deref(), Some(&1));
    let last = e.recv(2, 1).unwrap();
    assert_eq!((*last, &*last as *const u8), (2, addr));
    assert_eq!(*e.recv(0, 1).unwrap(), 0);
    // Rank 1 keeps its value: it reads no slot.
    assert_eq!(e.recv(1, 1), Err(RecvError::Aborted));
    // Another length: nothing is sent; the failure path then marks every slot.
    assert_eq!(e.send_scatter(1, 2, vec![Box::new(0)]).err(), Some((1, 3)));
    links.get(0).unwrap().fail_from(1, 2, None);
    assert_eq!(e.recv(0, 2), Err(RecvError::failed(1)));
    assert_eq!(e.recv(2, 2), Err(RecvError::failed(1)));
}

#[test]
fn a_stale_message_is_dropped_and_a_later_one_waits() {
    let mut links = Links::new();
    let e = links.edge::<u8>("h", "enc", Route::Zip, 1);
    // Round 1's consumer never ran: its message is stale in round 2.
    e.send(0, 1, 1).unwrap();
    let e2 = e.clone();
    let producer = thread::spawn(move || e2.send(0, 2, 2));
    assert_eq!(e.recv(0, 2), Ok(2));
    producer.join().unwrap().unwrap();
    // The producer skipped round 3: the consumer learns it, and round 4's message
    // stays for round 4.
    e.send(0, 4, 4).unwrap();
    assert_eq!(e.recv(0, 3), Err(RecvError::failed(0)));
    assert_eq!(e.recv(0, 4), Ok(4));
}

#[test]
fn fan_clones_to_every_other_rank() {
    let mut links = Links::new();
    let e = links.edge::<String>(
        "t",
        "w",
        Route::Fan {
            from: 1,
            skip_from: true,
        },
        3,
    );
    e.send_each(1, 1, "x".to_string(), String::clone).unwrap();
    assert_eq!(e.recv(0, 1).unwrap(), "x");
    assert_eq!(e.recv(2, 1).unwrap(), "x");
    links.get(0).unwrap().fail_from(1, 2, None);
    assert_eq!(e.recv(0, 2), Err(RecvError::failed(1)));
    assert_eq!(e.recv(2, 2), Err(RecvError::failed(1)));
}

#[test]
fn abort_releases_a_blocked_consumer_and_a_blocked_producer() {
    let mut links = Links::new();
    let e = links.edge::<u8>("h", "enc", Route::Zip, 2);
    let (c, p) = (e.clone(), e.clone());
    let consumer = thread::spawn(move || c.recv(0, 1));
    p.send(1, 1, 1).unwrap();
    let producer = thread::spawn(move || p.send(1, 2, 2));
    // Rank 0 waits for its first message, rank 1 for room for its second.
    let slot = |i: usize| match &e.slots[i] {
        End::Here(s) => s,
        _ => unreachable!("every end of a local edge is here"),
    };
    slot(0).sent.until_parked(1);
    slot(1).taken.until_parked(1);
    links.abort();
    assert_eq!(consumer.join().unwrap(), Err(RecvError::Aborted));
    assert!(matches!(producer.join().unwrap(), Err(SendError::Stopped)));
    assert!(matches!(e.send(0, 3, 3), Err(SendError::Stopped)));
}
