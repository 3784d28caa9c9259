//! What the examples with flags and a self-check (`train`, `linreg`, `nccl_allreduce`)
//! share: a seeded random number generator, the parsing of a numeric flag, and `main`'s
//! exit codes. Not an example itself: Cargo builds only files directly in `examples/` and
//! folders with a `main.rs`.

// Each example uses a part: `nccl_allreduce` no `Rng`, `linreg` no shuffle.
#![allow(dead_code)]

use std::fmt::Display;
use std::process::ExitCode;
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

/// An example's `main`: its flags parsed (`parse`), then `run`, whose `Ok(false)` is a
/// failed self-check. Exit codes: 0 when the run checks out, 1 when it does not or fails,
/// 2 for bad flags (with `usage`).
pub fn main<A, E: Display>(
    usage: &str,
    parse: impl FnOnce() -> Result<A, String>,
    run: impl FnOnce(&A) -> Result<bool, E>,
) -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("error: {msg}\n{usage}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
