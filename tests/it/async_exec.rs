//! `execute_async`: the same results as `execute` from tokio's current-thread and
//! multi-thread runtimes, no blocking of the executor's thread, errors as in `execute`, and
//! a future dropped mid-flight leaves the graph usable.

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use actorgraph::prelude::*;

use crate::support::gate::Gate;
use crate::support::within;

struct Worker {
    rank: usize,
    gate: Gate,
}

#[actor]
impl Worker {
    /// `rank + x`, once through the gate if `hold`; fails on rank `fail` if given.
    fn grad(&mut self, x: &f32, hold: &bool, fail: &Option<usize>) -> Result<Tensor<f32>, String> {
        if *hold {
            self.gate.pass();
        }
        if *fail == Some(self.rank) {
            return Err(format!("rank {} fails on purpose", self.rank));
        }
        Ok(Tensor::full([3], self.rank as f32 + x))
    }
}

struct Head;

#[actor]
impl Head {
    fn double(&mut self, t: &Tensor<f32>) -> Tensor<f32> {
        Tensor::from_slice(&t.to_vec().iter().map(|v| v * 2.0).collect::<Vec<_>>())
    }
}

graph! {
    Step(workers: [Worker], x: f32, hold: bool, fail: Option<usize>) {
        let g = workers.grad(x, hold, fail);
        allreduce(g)
    }

    Piped(workers: [Worker], heads: [Head], x: f32, hold: bool, fail: Option<usize>) {
        let g = workers.grad(x, hold, fail);
        let s = allreduce(g);
        let d = heads.double(s);
        (s, d)
    }
}

/// `n` workers held, when asked, at `gate`.
fn workers(n: usize, gate: &Gate) -> Vec<Worker> {
    (0..n)
        .map(|rank| Worker {
            rank,
            gate: gate.clone(),
        })
        .collect()
}

fn heads(n: usize) -> Vec<Head> {
    (0..n).map(|_| Head).collect()
}

fn vals(out: &[Tensor<f32>]) -> Vec<Vec<f32>> {
    out.iter().map(Tensor::to_vec).collect()
}

fn current_thread() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(e) => panic!("no runtime: {e}"),
    }
}

fn multi_thread() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("no runtime: {e}"),
    }
}

#[test]
fn async_equals_execute_on_a_current_thread_runtime() -> Result<(), Error> {
    within(60, || {
        let mut g = Step::launch(workers(4, &Gate::closed()), Cpu)?;
        let rt = current_thread();
        for i in 0..200 {
            let x = i as f32;
            let sync = g.execute(x, false, None)?;
            let fut = rt.block_on(g.execute_async(x, false, None))?;
            assert_eq!(vals(&sync), vals(&fut));
            assert_eq!(fut[1].to_vec(), vec![6.0 + 4.0 * x; 3]);
        }
        g.teardown().map(drop)
    })
}

#[test]
fn async_equals_execute_on_a_multi_thread_runtime_across_groups() -> Result<(), Error> {
    within(60, || {
        let mut g = Piped::launch(workers(3, &Gate::closed()), heads(3), Cpu)?;
        let rt = multi_thread();
        // The future is `Send`: the graph moves into a spawned task and comes back.
        let task = rt.spawn(async move {
            let mut outs = Vec::new();
            for i in 0..100 {
                outs.push(g.execute_async(i as f32, false, None).await);
            }
            (g, outs)
        });
        let (mut g, outs) = rt
            .block_on(task)
            .map_err(|e| Error::Backend(format!("task failed: {e}")))?;
        for (i, out) in outs.into_iter().enumerate() {
            let sync = g.execute(i as f32, false, None)?;
            let out = out?;
            assert_eq!(out.len(), 3);
            for (a, b) in out.iter().zip(&sync) {
                assert_eq!(a.0.to_vec(), b.0.to_vec());
                assert_eq!(a.1.to_vec(), b.1.to_vec());
            }
            assert_eq!(out[0].1.to_vec(), vec![2.0 * (3.0 + 3.0 * i as f32); 3]);
        }
        g.teardown().map(drop)
    })
}

#[test]
fn waiting_does_not_block_the_executor_thread() -> Result<(), Error> {
    within(60, || {
        let gate = Gate::closed();
        let mut g = Step::launch(workers(2, &gate), Cpu)?;
        let rt = current_thread();
        // Quick executions first: a poll that ran the steps nobody had started (which
        // only `LaunchOptions::poll_runs_steps` allows) would run the held one below and
        // wait at the gate on the thread of the task that opens it.
        for _ in 0..20 {
            rt.block_on(g.execute_async(1.0, false, None))?;
        }
        let opened = Cell::new(false);
        // The execution cannot finish before the other task, on the same thread, opens the
        // gate: if awaiting it blocked the thread, this would hang (and `within` fail).
        let (out, ()) = rt.block_on(async {
            tokio::join!(
                async {
                    let out = g.execute_async(1.0, true, None).await;
                    assert!(opened.get(), "finished while the actors were held");
                    out
                },
                async {
                    for _ in 0..10 {
                        tokio::task::yield_now().await;
                    }
                    opened.set(true);
                    gate.open();
                }
            )
        });
        assert_eq!(out?[0].to_vec(), vec![3.0; 3]);
        g.teardown().map(drop)
    })
}

#[test]
fn a_method_error_comes_back_from_the_future_and_the_next_call_works() -> Result<(), Error> {
    within(60, || {
        let mut g = Piped::launch(workers(3, &Gate::closed()), heads(3), Cpu)?;
        let rt = current_thread();
        match rt.block_on(g.execute_async(0.0, false, Some(2))) {
            Err(Error::Method {
                group: "workers",
                rank: 2,
                method: "grad",
                ..
            }) => {}
            other => panic!("expected workers[2].grad's error, got {other:?}"),
        }
        let out = rt.block_on(g.execute_async(1.0, false, None))?;
        assert_eq!(out[2].0.to_vec(), vec![6.0; 3]);
        g.teardown().map(drop)
    })
}

/// Polls `fut` once with a waker that does nothing.
fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_future_dropped_mid_flight_is_finished_by_the_next_call() -> Result<(), Error> {
    within(60, || {
        let gate = Gate::closed();
        let mut g = Piped::launch(workers(4, &gate), heads(4), Cpu)?;
        let rt = current_thread();
        // Dropped before its first poll: nothing was submitted.
        drop(g.execute_async(5.0, false, None));
        assert_eq!(g.in_flight(), 0);
        // Dropped mid-flight (its actors held at the gate), then a synchronous execute.
        {
            let mut fut = pin!(g.execute_async(7.0, true, None));
            assert!(poll_once(fut.as_mut()).is_pending());
        }
        // Still running, its result abandoned: the next call waits for it (one in flight).
        assert_eq!(g.in_flight(), 1);
        gate.open();
        let out = g.execute(1.0, false, None)?;
        assert_eq!(out[0].0.to_vec(), vec![10.0; 3]);
        // Dropped mid-flight (with a failure in it), then an async execute.
        gate.close();
        {
            let mut fut = pin!(g.execute_async(7.0, true, Some(1)));
            assert!(poll_once(fut.as_mut()).is_pending());
        }
        gate.open();
        let out = rt.block_on(g.execute_async(2.0, false, None))?;
        assert_eq!(out[3].1.to_vec(), vec![28.0; 3]);
        // Dropped mid-flight, then teardown: the actors come back intact.
        gate.close();
        {
            let mut fut = pin!(g.execute_async(7.0, true, None));
            assert!(poll_once(fut.as_mut()).is_pending());
        }
        gate.open();
        let (w, h) = g.teardown()?;
        assert_eq!((w.len(), h.len()), (4, 4));
        Ok(())
    })
}

#[test]
fn a_dropped_future_with_room_to_spare_is_discarded_later() -> Result<(), Error> {
    within(60, || {
        let options = LaunchOptions::default().max_in_flight(2);
        let gate = Gate::closed();
        let mut g = Step::launch_with(workers(2, &gate), Cpu, options)?;
        let rt = current_thread();
        for k in 0..20 {
            gate.close();
            {
                let mut fut = pin!(g.execute_async(100.0, true, None));
                assert!(poll_once(fut.as_mut()).is_pending());
            }
            gate.open();
            // Room for one more: it runs behind the abandoned one, whose result is dropped.
            let out = rt.block_on(g.execute_async(k as f32, false, None))?;
            assert_eq!(out[0].to_vec(), vec![1.0 + 2.0 * k as f32; 3]);
        }
        g.teardown().map(drop)
    })
}
