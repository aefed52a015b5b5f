//! The CPU reference GEMM against a plain f64 triple loop, and its batch invariance.

use half::{bf16, f16};
use kdtree_quant::sample::symmetric as values;
use kdtree_quant::{Dtype, Half, QuantizedWeight, reference};
use proptest::prelude::*;

/// (m, n, k, group size) with K a multiple of the group size; N and M not multiples of any block.
fn problem() -> impl Strategy<Value = (usize, usize, usize, usize, u64)> {
    (1usize..9, 1usize..11, 1usize..5, prop::sample::select(vec![32usize, 64, 128]), any::<u64>())
        .prop_map(|(m, n, groups, g, seed)| (m, n, groups * g, g, seed))
}

fn check<T: Half>(m: usize, n: usize, k: usize, g: usize, seed: u64) -> Result<(), TestCaseError> {
    let w = QuantizedWeight::quantize(&values(n * k, seed, 1.0), n, k, g, Dtype::Bf16).unwrap();
    let x: Vec<T> = values(m * k, seed ^ 0x9e37, 3.0).into_iter().map(T::from_f32).collect();
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let wd = w.dequantize();

    let y32 = reference::w4a16_gemm_f32(&xf, m, &w).unwrap();
    let y = reference::w4a16_gemm(&x, m, &w).unwrap();
    // Error bound of the f32 accumulation: one product rounding, K/8 lane additions, 3 pairwise
    // additions: |err| <= gamma_n * sum |x w| with n = K/8 + 4, gamma_n = n u / (1 - n u), u = 2^-24.
    let nu = (k / 8 + 4) as f64 * 2f64.powi(-24);
    let gamma = nu / (1.0 - nu);
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut abs) = (0f64, 0f64);
            for kk in 0..k {
                let p = xf[i * k + kk] as f64 * wd[j * k + kk] as f64;
                exact += p;
                abs += p.abs();
            }
            let got = y32[i * n + j] as f64;
            prop_assert!((got - exact).abs() <= gamma * abs, "y[{i},{j}] = {got}, f64 {exact}, bound {}", gamma * abs);
            // The activation-dtype output is that f32 value rounded once.
            prop_assert_eq!(y[i * n + j].to_f32(), T::DTYPE.round(y32[i * n + j]));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn agrees_with_f64_triple_loop_bf16((m, n, k, g, seed) in problem()) { check::<bf16>(m, n, k, g, seed)?; }

    #[test]
    fn agrees_with_f64_triple_loop_f16((m, n, k, g, seed) in problem()) { check::<f16>(m, n, k, g, seed)?; }

    #[test]
    fn a_row_never_depends_on_the_other_rows((m, n, k, g, seed) in problem()) {
        let w = QuantizedWeight::quantize(&values(n * k, seed, 1.0), n, k, g, Dtype::F16).unwrap();
        let x = values(m * k, seed ^ 5, 1.0);
        let all = reference::w4a16_gemm_f32(&x, m, &w).unwrap();
        for i in 0..m {
            let one = reference::w4a16_gemm_f32(&x[i * k..(i + 1) * k], 1, &w).unwrap();
            prop_assert_eq!(&all[i * n..(i + 1) * n], &one[..], "row {}", i);
        }
    }

    #[test]
    fn equals_dot_with_the_dequantized_weight((m, n, k, g, seed) in problem()) {
        let w = QuantizedWeight::quantize(&values(n * k, seed, 1.0), n, k, g, Dtype::Bf16).unwrap();
        let x = values(m * k, seed ^ 3, 1.0);
        let wd = w.dequantize();
        let y = reference::w4a16_gemm_f32(&x, m, &w).unwrap();
        for i in 0..m {
            for j in 0..n {
                prop_assert_eq!(y[i * n + j].to_bits(), reference::dot(&x[i * k..(i + 1) * k], &wd[j * k..(j + 1) * k]).to_bits());
            }
        }
    }
}

#[test]
fn dot_has_the_documented_order() {
    // Lane l sums k = l, l + 8, ...; lanes are then added pairwise.
    let a: Vec<f32> = (0..19).map(|i| 1.0 + i as f32 * 1e-3).collect();
    let b: Vec<f32> = (0..19)
        .map(|i| 1e8f32.powf(if i % 3 == 0 { 1.0 } else { -0.25 }) * if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let mut lanes = [0f32; 8];
    for k in 0..19 {
        lanes[k % 8] += a[k] * b[k];
    }
    let expect = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    assert_eq!(reference::dot(&a, &b).to_bits(), expect.to_bits());
}

#[test]
fn wrong_activation_length_is_an_error() {
    let w = QuantizedWeight::quantize(&[0.5; 64], 2, 32, 32, Dtype::F16).unwrap();
    assert!(matches!(
        reference::w4a16_gemm_f32(&[0.0; 33], 1, &w),
        Err(kdtree_quant::QuantError::LengthMismatch { expected: 32, actual: 33, .. })
    ));
}
