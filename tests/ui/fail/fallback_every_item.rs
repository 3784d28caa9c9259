//! A graph with one error still expands to its struct with every item, so code that uses
//! all of them shows that one error only.
use actorgraph::prelude::*;
use std::time::Duration;

struct Worker;

#[actor]
impl Worker {
    fn comp1(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

struct Head;

#[actor]
impl Head {
    fn score(&mut self) -> f32 {
        1.0
    }
}

graph! {
    G(workers: [Worker], heads: [Head; 2], x: Tensor<f32>) {
        let c = workers.comp1(x);
        let s = heads.score();
        (allreduce(c, Mean), s)
    }
}

async fn run_async(g: &mut G, x: Tensor<f32>) -> Result<usize, Error> {
    let out: Vec<(Tensor<f32>, f32)> = g.execute_async(x.clone()).await?;
    let ticket = g.submit(x)?;
    let again: Vec<(Tensor<f32>, f32)> = g.wait_async(ticket).await?;
    Ok(out.len() + again.len())
}

fn main() -> Result<(), Error> {
    assert_eq!(G::GROUPS, ["workers", "heads"]);
    println!("{}", G::to_dot());
    let mut g = G::launch(vec![Worker, Worker], [Head, Head], Cpu)?;
    let options = LaunchOptions::default().max_in_flight(2);
    let mut h = G::launch_with(vec![Worker, Worker], [Head, Head], Cpu, options)?;
    let made = G::launch_actors(Actors::each(2, |_, _| Worker), [Head, Head].into(), Cpu, options)?;
    drop(made);
    let out: Vec<(Tensor<f32>, f32)> = g.execute(Tensor::zeros([1]))?;
    let late: Vec<(Tensor<f32>, f32)> = g.execute_timeout(Tensor::zeros([1]), Duration::from_secs(1))?;
    let ticket = h.submit(Tensor::zeros([1]))?;
    assert_eq!(h.in_flight(), 1);
    assert_eq!((h.ranks("workers"), h.group_size("heads")), (Some(0..2), Some(2)));
    assert_ne!(G::FINGERPRINT, 0);
    let waited: Vec<(Tensor<f32>, f32)> = h.wait(ticket)?;
    let named: Vec<GOutput> = h.execute(Tensor::zeros([1]))?;
    assert_eq!(named.len(), 2);
    drop(run_async(&mut h, Tensor::zeros([1])));
    assert_eq!(out.len() + late.len() + waited.len(), 6);
    let ranks: Vec<usize> = g.each_workers(|ctx, _: &mut Worker| ctx.rank())?;
    let scores: Vec<f32> = g.try_each_heads(|_, h: &mut Head| Ok::<f32, Error>(h.score()))?;
    assert_eq!(ranks.len() + scores.len(), 4);
    let (workers, heads): (Vec<Worker>, [Head; 2]) = g.teardown()?;
    assert_eq!(workers.len() + heads.len(), 4);
    let (workers, heads) = h.teardown_each();
    for w in workers.into_iter().chain(heads.into_iter().map(|h| h.map(|_| Worker))) {
        let _worker: Worker = w?;
    }
    Ok(())
}
