use actorgraph::prelude::*;

struct Encoder;
struct Decoder;

#[actor]
impl Encoder {
    fn encode(&mut self, x: &Tensor<f32>) -> Tensor<f32> {
        x.clone()
    }
}

#[actor]
impl Decoder {
    fn decode(&mut self, h: &Tensor<i64>) -> Tensor<i64> {
        h.clone()
    }
}

graph! {
    Pipeline(encoders: [Encoder], decoders: [Decoder], x: Tensor<f32>) {
        let h = encoders.encode(x);
        let y = decoders.decode(h);
        let z = decoders[0].decode(h);
        (y, z)
    }
}

fn main() {}
