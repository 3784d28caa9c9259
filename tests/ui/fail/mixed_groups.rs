use actorgraph::prelude::*;

struct A;
struct B;

#[actor]
impl A {
    fn f(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

#[actor]
impl B {
    fn g(&mut self) -> Tensor<f32> {
        Tensor::zeros([1])
    }
}

graph! {
    G(a: [A], b: [B]) {
        let x = a.f();
        let y = b.g();
        allreduce([x, y])
    }
}

fn main() {}
