// An actor holding an `Rc`, made on its own thread: the graph compiles and runs.
use actorgraph::prelude::*;
use std::rc::Rc;

struct Local {
    state: Rc<f32>,
}

#[actor]
impl Local {
    fn value(&mut self) -> f32 {
        *self.state
    }
}

graph! {
    G(locals: [Local]) {
        let v = locals.value();
        allreduce(v)
    }
}

fn main() {
    let made = Actors::each(2, |rank, _| Local { state: Rc::new(rank as f32) });
    let mut g = G::launch_actors(made, Cpu, LaunchOptions::default()).unwrap();
    assert_eq!(g.execute().unwrap(), vec![1.0, 1.0]);
}
