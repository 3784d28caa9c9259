//! Several actor groups in one graph: independent steps, outputs zipped by rank.

use actorgraph::prelude::*;

struct Encoder {
    rank: usize,
}

struct Critic {
    scale: f64,
}

#[actor]
impl Encoder {
    fn encode(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        Tensor::from_vec(
            x.as_slice().iter().map(|v| v + self.rank as f32).collect(),
            x.shape(),
        )
        .unwrap()
    }
}

#[actor]
impl Critic {
    fn score(&mut self, w: &f64) -> Tensor<f64> {
        Tensor::scalar(self.scale * w)
    }
}

graph! {
    /// Two groups, one input each and one shared, zipped into one output.
    Pair(encoders: [Encoder], critics: [Critic], x: Tensor<f32>, w: f64) {
        let e = encoders.encode(x);
        let s = critics.score(w);
        let total = allreduce(s, Sum);
        (allreduce(e), total, e)
    }
}

#[test]
fn two_groups_zip_into_one_output() {
    let enc: Vec<_> = (0..3).map(|rank| Encoder { rank }).collect();
    let cri: Vec<_> = (0..3).map(|r| Critic { scale: r as f64 }).collect();
    let mut g = Pair::launch(enc, cri, Cpu).unwrap();
    assert_eq!(Pair::GROUPS, &["encoders", "critics"]);
    let out: Vec<(Tensor<f32>, Tensor<f64>, Tensor<f32>)> =
        g.execute(Tensor::from_slice(&[1.0, 2.0]), 2.0).unwrap();
    assert_eq!(out.len(), 3);
    for (rank, (reduced, total, raw)) in out.iter().enumerate() {
        // (1 + 2 + 4) summed over ranks 0..3 of (x + rank)
        assert_eq!(reduced.to_vec(), vec![6.0, 9.0]);
        assert_eq!(total.to_vec(), vec![6.0]);
        assert_eq!(raw.to_vec(), vec![1.0 + rank as f32, 2.0 + rank as f32]);
    }
    let (enc, cri): (Vec<Encoder>, Vec<Critic>) = g.teardown().unwrap();
    assert_eq!((enc.len(), cri.len()), (3, 3));
}

#[test]
fn zipped_groups_must_have_the_same_size() {
    let enc: Vec<_> = (0..3).map(|rank| Encoder { rank }).collect();
    let cri: Vec<_> = (0..2).map(|r| Critic { scale: r as f64 }).collect();
    match Pair::launch(enc, cri, Cpu) {
        Err(Error::GroupSizeMismatch {
            first_len: 3,
            second_len: 2,
            ..
        }) => {}
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("groups of different sizes must not launch"),
    }
}
