//! The casts, the residual add and SiLU-and-multiply on halves against `half` and the engine's CPU ops.
//! Tolerances:
//! - casts and add_assign: exact, bit for bit (integer rounding on the bits; one f32 add).
//! - silu_mul_halves: bf16 bits equal, except where CUDA's expf (within 2 ulp) and the CPU's (glibc,
//!   within 1) round the f32 product to either side of a bf16 rounding boundary: then one bf16 ulp, which
//!   for random data happens about once in 10⁵ values. A rounding bug would miss half of them.

use crate::common::kernels;
use half::{bf16, f16};
use kdtree_engine::ops::cpu;
use proptest::prelude::*;

fn values(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    kdtree_quant::sample::symmetric(len, seed, scale)
}

/// f32 bit patterns where rounding to bf16 or f16 is easy to get wrong, then pseudo-random bits.
fn edge_cases() -> Vec<f32> {
    let mut bits: Vec<u32> = vec![
        0x0000_0000,
        0x8000_0000, // ±0
        0x0000_0001,
        0x807f_ffff,
        0x0080_0000, // f32 subnormals, the smallest normal
        0x3f80_0000,
        0x3f80_8000,
        0x3f81_8000,
        0x3f80_8001,
        0x3f80_7fff, // bf16 ties to even, down and up
        0x7f7f_ffff,
        0xff7f_ffff,
        0x7f7f_8000,
        0x7f7f_7fff, // the largest finite: bf16 rounds up to inf
        0x7f80_0000,
        0xff80_0000, // ±inf
        0x7fc0_0000,
        0xffc0_0000,
        0x7f80_0001,
        0x7fbf_ffff,
        0xff80_2001,
        0x7fc1_2345, // NaNs, quiet and not
        0x477f_e000,
        0x477f_efff,
        0x477f_f000,
        0x4780_0000, // 65504, below and at f16's overflow tie
        // f16 subnormals: the smallest, the ties 0.5, 1.5 and 2.5 of it, just above 0.5
        0x3380_0000,
        0x3300_0000,
        0x33c0_0000,
        0x3420_0000,
        0x3300_0001,
        // f16's largest subnormal, its tie with the smallest normal, just above, the smallest normal
        0x387f_c000,
        0x387f_e000,
        0x387f_f000,
        0x3880_0000,
        0x3a00_1000,
        0x3a00_3000, // f16 normal ties to even
    ];
    let mut x = 0x9e37_79b9u32;
    for _ in 0..100_003 {
        // xorshift32: every exponent, both signs, NaN payloads included.
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bits.push(x);
    }
    bits.into_iter().map(f32::from_bits).collect()
}

#[test]
#[ignore = "needs a GPU"]
fn casts_to_16_bits_equal_half_bit_for_bit() {
    let x = edge_cases();
    let k = kernels();
    let dx = k.stream().clone_htod(&x).unwrap();
    let mut out = k.stream().alloc_zeros::<u16>(x.len()).unwrap();
    kdtree_kernels::f32_to_bf16(k, &dx, &mut out, x.len()).unwrap();
    let got = k.stream().clone_dtoh(&out).unwrap();
    for (v, g) in x.iter().zip(&got) {
        assert_eq!(*g, bf16::from_f32(*v).to_bits(), "bf16 of {:#010x}", v.to_bits());
    }
    kdtree_kernels::f32_to_f16(k, &dx, &mut out, x.len()).unwrap();
    let got = k.stream().clone_dtoh(&out).unwrap();
    for (v, g) in x.iter().zip(&got) {
        assert_eq!(*g, f16::from_f32(*v).to_bits(), "f16 of {:#010x}", v.to_bits());
    }
}

#[test]
#[ignore = "needs a GPU"]
fn casts_from_16_bits_equal_half_for_every_pattern() {
    // Every bf16 and f16 value, then 3 more so that the tail is not a whole quad.
    let bits: Vec<u16> = (0..=u16::MAX).chain([1, 0x7c01, 0xff81]).collect();
    let k = kernels();
    let db = k.stream().clone_htod(&bits).unwrap();
    let mut out = k.stream().alloc_zeros::<f32>(bits.len()).unwrap();
    kdtree_kernels::bf16_to_f32(k, &db, &mut out, bits.len()).unwrap();
    let got = k.stream().clone_dtoh(&out).unwrap();
    for (b, g) in bits.iter().zip(&got) {
        assert_eq!(g.to_bits(), bf16::from_bits(*b).to_f32().to_bits(), "bf16 {b:#06x}");
    }
    kdtree_kernels::f16_to_f32(k, &db, &mut out, bits.len()).unwrap();
    let got = k.stream().clone_dtoh(&out).unwrap();
    for (b, g) in bits.iter().zip(&got) {
        assert_eq!(g.to_bits(), f16::from_bits(*b).to_f32().to_bits(), "f16 {b:#06x}");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn a_cast_of_n_leaves_the_rest_of_out_alone() {
    let k = kernels();
    let x = k.stream().clone_htod(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let mut out = k.stream().clone_htod(&[7u16; 6]).unwrap();
    kdtree_kernels::f32_to_bf16(k, &x, &mut out, 5).unwrap();
    let want: Vec<u16> = [1.0f32, 2.0, 3.0, 4.0, 5.0].iter().map(|&v| bf16::from_f32(v).to_bits()).chain([7]).collect();
    assert_eq!(k.stream().clone_dtoh(&out).unwrap(), want);
    let err = kdtree_kernels::f32_to_bf16(k, &x, &mut out, 7).unwrap_err();
    assert!(matches!(err, kdtree_kernels::Error::Shape { .. }), "{err}");
}

/// Equal bits, but for at most one value in 4096 that is one bf16 ulp off (see the module doc).
fn bf16_close(got: &[u16], want: &[u16]) -> Result<(), String> {
    let mut off = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g != w {
            off += 1;
            if g.abs_diff(w) != 1 {
                return Err(format!("element {i}: {g:#06x}, the CPU {w:#06x}"));
            }
        }
    }
    let allowed = got.len() / 4096 + 1;
    if off > allowed { Err(format!("{off} values one ulp off, at most {allowed} expected")) } else { Ok(()) }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "needs a GPU"]
    fn add_assign_matches_the_cpu(n in 1usize..20_000, seed: u64) {
        let (x, y) = (values(n, 5.0, seed), values(n, 5.0, !seed));
        let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        let k = kernels();
        let (mut dx, dy) = (k.stream().clone_htod(&x).unwrap(), k.stream().clone_htod(&y).unwrap());
        kdtree_kernels::add_assign(k, &mut dx, &dy).unwrap();
        prop_assert_eq!(k.stream().clone_dtoh(&dx).unwrap(), want);
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn silu_mul_halves_match_the_cpu_in_f32_and_bf16(rows in 1usize..9, inter in 1usize..3000, spare in 0usize..3, seed: u64) {
        let x = values(rows * 2 * inter, 12.0, seed);
        let x16: Vec<u16> = x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
        let reference = |x: &[f32]| -> Vec<u16> {
            let mut want = Vec::with_capacity(rows * inter);
            for row in x.chunks_exact(2 * inter) {
                let mut o = vec![0.0; inter];
                cpu::silu_mul(&row[..inter], &row[inter..], &mut o);
                want.extend(o.iter().map(|&v| bf16::from_f32(v).to_bits()));
            }
            want
        };
        let widened: Vec<f32> = x16.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
        let k = kernels();
        // `spare` rows of slack in both buffers: the op touches only `rows`.
        let mut dx = k.stream().alloc_zeros::<f32>((rows + spare) * 2 * inter).unwrap();
        k.stream().memcpy_htod(&x, &mut dx).unwrap();
        let mut dx16 = k.stream().alloc_zeros::<u16>((rows + spare) * 2 * inter).unwrap();
        k.stream().memcpy_htod(&x16, &mut dx16).unwrap();
        let mut out = k.stream().alloc_zeros::<u16>((rows + spare) * inter).unwrap();
        kdtree_kernels::silu_mul_halves_f32(k, &dx, rows, inter, &mut out).unwrap();
        let got = k.stream().clone_dtoh(&out).unwrap();
        prop_assert!(got[rows * inter..].iter().all(|&b| b == 0));
        if let Err(e) = bf16_close(&got[..rows * inter], &reference(&x)) { prop_assert!(false, "f32 input: {}", e); }
        kdtree_kernels::silu_mul_halves_bf16(k, &dx16, rows, inter, &mut out).unwrap();
        let got = k.stream().clone_dtoh(&out).unwrap();
        if let Err(e) = bf16_close(&got[..rows * inter], &reference(&widened)) { prop_assert!(false, "bf16 input: {}", e); }
    }
}
