use actorgraph::prelude::*;

struct A;
struct B;

#[actor]
impl A {
    fn f(&mut self) -> Tensor<f32> {
        Tensor::zeros([2])
    }
}

#[actor]
impl B {
    fn g(&mut self) -> Tensor<f32> {
        Tensor::zeros([2])
    }
}

graph! {
    Gathered(a: [A], b: [B]) {
        let x = a.f();
        let y = b.g();
        allgather([x, y])
    }

    Scattered(a: [A], b: [B]) {
        let x = a.f();
        let y = b.g();
        reducescatter([x, y], Avg)
    }

    Broadcast(a: [A], b: [B]) {
        let x = a.f();
        let y = b.g();
        broadcast([x, y], 0)
    }

    Reduced(a: [A], b: [B]) {
        let x = a.f();
        let y = b.g();
        reduce([x, y], Sum, 0)
    }
}

fn main() {}
