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
    fn g(&mut self, p: &(Tensor<f32>, Tensor<f32>)) -> Tensor<f32> {
        p.0.clone()
    }
}

graph! {
    G(a: [A], b: [B]) {
        let x = a.f();
        let y = a[0].f();
        b.g((x, y))
    }
}

fn main() {}
