// A crate that shadows prelude and std names uses actors and graphs, and a module without
// any prelude defines some: the generated code names everything by absolute paths.
// (Also included by `tests/hygiene.rs`.)

/// The crate's own error, result, tensor and vector types, and a module named `std`.
#[derive(Debug)]
pub struct Error;

impl ::std::fmt::Display for Error {
    fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
        f.write_str("the crate's own error")
    }
}

impl ::std::error::Error for Error {}

pub type Result<T> = ::core::result::Result<T, Error>;
pub struct Tensor;
pub struct Vec;
pub struct String;
pub struct Option;
pub struct Box;
pub struct Arc;
pub struct Duration;
pub struct PhantomData;
pub trait Clone {}
pub trait Send {}
pub trait Sync {}
pub trait Into {}
pub trait From {}
pub trait Default {}
pub trait Iterator {}
pub trait Future {}
pub trait Fn {}
mod std {}
mod core {}
mod actorgraph {}

use ::actorgraph::{actor, graph, Cpu};

type T32 = ::actorgraph::Tensor<f32>;

struct Worker {
    rank: usize,
}

#[actor]
impl Worker {
    fn grad(&mut self, x: &T32) -> T32 {
        ::actorgraph::Tensor::full(x.shape(), self.rank as f32)
    }
    fn loss(&mut self, scale: f32) -> Result<f32> {
        if scale < 0.0 {
            return Err(Error);
        }
        Ok(scale)
    }
    fn pair(&mut self) -> (f32, f32) {
        (1.0, 2.0)
    }
}

graph! {
    pub Shadowed(workers: [Worker], x: T32, s: f32) {
        let g = workers.grad(x);
        let l = workers.loss(s);
        let (a, b) = workers.pair();
        let all = allgather(l);
        let edge = workers[0].loss(s);
        let seen = workers.loss(edge);
        (allreduce([g, a, b]), all, seen)
    }
}

graph! {
    /// A group and inputs named as the parameters of the graph's own methods (`launch`'s
    /// `backend` and `options`, `execute_timeout`'s `timeout`, `wait`'s `ticket`).
    pub Named(backend: [Worker], options: f32, timeout: f32, ticket: f32) {
        let o = backend.loss(options);
        let t = backend.loss(timeout);
        let k = backend.loss(ticket);
        (o, t, k)
    }
}

#[no_implicit_prelude]
mod no_prelude {
    use ::actorgraph::{actor, graph};

    pub struct Counter {
        pub calls: u64,
    }

    #[actor]
    impl Counter {
        fn tick(&mut self, by: &u64) -> u64 {
            self.calls += *by;
            self.calls
        }
        fn check(&mut self, n: u64) -> ::core::result::Result<u64, ::std::string::String> {
            ::core::result::Result::Ok(n)
        }
    }

    pub struct Echo;

    #[actor]
    impl Echo {
        fn echo(&mut self, t: &u64) -> u64 {
            *t
        }
    }

    pub struct Cell {
        pub calls: u64,
    }

    #[actor]
    impl Cell {
        fn tick(&mut self, by: &u64) -> u64 {
            self.calls += *by;
            self.calls
        }
        fn echo_back(&mut self, v: &u64) -> u64 {
            *v
        }
    }

    pub struct Hub;

    #[actor]
    impl Hub {
        fn echo(&mut self, t: &u64) -> u64 {
            *t
        }
        fn split(&mut self, n: &u64) -> ::std::vec::Vec<u64> {
            ::std::vec![*n, *n + 1]
        }
        fn sum(&mut self, all: &[u64]) -> u64 {
            ::core::iter::Iterator::sum(::core::iter::IntoIterator::into_iter(all))
        }
    }

    graph! {
        /// Per-rank inputs, one rank's value, gather, scatter and a mixed output.
        pub Shapes(cells: [Cell; 2], hubs: [Hub], by: PerRank<u64>) {
            let t = cells.tick(by);
            let one = hubs.echo(t[1]);
            let s = hubs[0].split(one);
            let parts = cells.echo_back(scatter(s));
            let total = hubs[0].sum(gather(parts));
            let every = hubs.sum(gather(t));
            (parts, total, every)
        }
    }

    graph! {
        pub Ticks(counters: [Counter; 2], echoes: [Echo], by: u64) {
            let t = counters.tick(by);
            let c = counters.check(t);
            let e = echoes.echo(t);
            (allreduce(c, Max), e)
        }
    }
}

pub fn main() {
    let workers = ::std::vec![Worker { rank: 0 }, Worker { rank: 1 }];
    let mut g = Shadowed::launch(workers, Cpu).unwrap();
    type Out = (
        (::actorgraph::Tensor<f32>, f32, f32),
        ::std::vec::Vec<f32>,
        f32,
    );
    let out: ::std::vec::Vec<Out> = g.execute(::actorgraph::Tensor::zeros([2]), 0.5).unwrap();
    assert_eq!(out[1].0 .0.to_vec(), ::std::vec![1.0; 2]);
    assert_eq!((out[1].0 .1, out[1].0 .2), (2.0, 4.0));
    assert_eq!(out[0].1, ::std::vec![0.5, 0.5]);
    assert_eq!(out[1].2, 0.5);
    let err = g
        .execute(::actorgraph::Tensor::zeros([2]), -1.0)
        .unwrap_err();
    assert!(
        matches!(err, ::actorgraph::Error::Method { method: "loss", .. }),
        "{err}"
    );
    let _workers: ::std::vec::Vec<Worker> = g.teardown().unwrap();

    let backend = ::std::vec![Worker { rank: 0 }];
    let options = ::actorgraph::LaunchOptions::default().max_in_flight(2);
    let mut n = Named::launch_with(backend, Cpu, options).unwrap();
    let ticket = n.submit(1.0, 2.0, 3.0).unwrap();
    let out: ::std::vec::Vec<NamedOutput> = n.wait(ticket).unwrap();
    assert_eq!(out, ::std::vec![(1.0, 2.0, 3.0)]);
    let timeout = ::std::time::Duration::from_secs(60);
    let out = n.execute_timeout(1.0, 2.0, 3.0, timeout).unwrap();
    assert_eq!(out, ::std::vec![(1.0, 2.0, 3.0)]);

    let counters = [no_prelude::Counter { calls: 0 }, no_prelude::Counter { calls: 5 }];
    let echoes = ::std::vec![no_prelude::Echo, no_prelude::Echo];
    let mut t = no_prelude::Ticks::launch(counters, echoes, Cpu).unwrap();
    let out: ::std::vec::Vec<(u64, u64)> = t.execute(2).unwrap();
    assert_eq!(out, ::std::vec![(7, 2), (7, 7)]);

    let cells = [no_prelude::Cell { calls: 0 }, no_prelude::Cell { calls: 5 }];
    let hubs = ::std::vec![no_prelude::Hub, no_prelude::Hub];
    let mut t = no_prelude::Shapes::launch(cells, hubs, Cpu).unwrap();
    let out = t.execute(::std::vec![1, 2]).unwrap();
    assert_eq!(out, ::std::vec![(7, ::core::option::Option::Some(15), 8), (8, ::core::option::Option::None, 8)]);
}
