// `#[derive(Bucketable)]` takes a struct; an enum is an error at the enum, and a field that
// cannot go through a collective is an error at the field.
use actorgraph::prelude::*;

#[derive(Bucketable)]
enum Grad {
    Dense(Tensor<f32>),
    Empty,
}

#[derive(Bucketable)]
struct Named {
    w: Tensor<f32>,
    name: String,
}

fn main() {}
