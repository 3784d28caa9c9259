// An actor that is not `Send` can be made on its own thread (`Actors::each`), but not
// moved there from a `Vec`, nor handed back by `teardown`: one error each, at the call.
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
    let ready = vec![Local { state: Rc::new(1.0) }];
    let _ = G::launch(ready, Cpu);
    let mut g = G::launch_actors(
        Actors::each(2, |_, _| Local { state: Rc::new(1.0) }),
        Cpu,
        LaunchOptions::default(),
    )
    .unwrap();
    let _ = g.execute();
    let _ = g.teardown();
}
