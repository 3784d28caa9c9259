//! What the training examples (`train`, `linreg`) share: a seeded random number generator
//! and the parsing of a numeric flag. Not an example itself: Cargo builds only files
//! directly in `examples/` and folders with a `main.rs`.

use std::fmt::Display;
use std::str::FromStr;

/// SplitMix64: a few lines, and the same numbers on every platform for a given seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1): the top 24 bits fit an f32 mantissa exactly.
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `items` in a uniformly random order (Fisher-Yates).
    #[allow(dead_code)] // `linreg` does not shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            // The modulo bias is below 2^-50 for any slice that fits in memory.
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// `value` parsed and within `lo..=hi` (which also rejects NaN), or a message saying why not.
pub fn parse_in<T: FromStr + PartialOrd + Display>(
    flag: &str,
    value: &str,
    lo: T,
    hi: T,
) -> Result<T, String> {
    match value.parse::<T>() {
        Ok(v) if lo <= v && v <= hi => Ok(v),
        _ => Err(format!(
            "{flag} wants a number in {lo}..={hi}, got `{value}`"
        )),
    }
}
