//! Seeded sample data for tests, correctness gates and benchmarks: reproducible from a seed, well
//! spread, and free of dependencies. Not for anything that needs statistical quality.

/// Values uniform in [0, 1) with 24 random bits each, deterministic in the seed (xorshift64*).
pub struct Uniform {
    state: u64,
}

impl Uniform {
    pub fn new(seed: u64) -> Uniform {
        // Spread the seed's bits and keep the state non-zero (zero is xorshift's fixed point).
        Uniform { state: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1 }
    }
}

impl Iterator for Uniform {
    type Item = f32;

    fn next(&mut self) -> Option<f32> {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        Some((self.state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// `len` values uniform in [-scale, scale), deterministic in `seed`.
pub fn symmetric(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    Uniform::new(seed).take(len).map(|u| (2.0 * u - 1.0) * scale).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symmetric_is_deterministic_in_range_and_spread() {
        let a = symmetric(10_000, 7, 3.0);
        assert_eq!(a, symmetric(10_000, 7, 3.0));
        assert_ne!(a, symmetric(10_000, 8, 3.0));
        assert!(a.iter().all(|v| (-3.0..3.0).contains(v)));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!(mean.abs() < 0.1, "mean {mean}");
        assert!(a.iter().any(|&v| v < -2.9) && a.iter().any(|&v| v > 2.9));
    }

    #[test]
    fn a_zero_seed_still_varies() {
        let v: Vec<f32> = Uniform::new(0).take(4).collect();
        assert!(v.windows(2).all(|w| w[0] != w[1]), "{v:?}");
    }
}
