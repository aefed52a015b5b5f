//! The INT4 format: packing, quantization bounds, and errors.

use kdtree_quant::{Dtype, GROUP_SIZES, QuantError, QuantizedWeight, Scales, int4};
use proptest::prelude::*;

fn group_size() -> impl Strategy<Value = usize> {
    prop::sample::select(GROUP_SIZES.to_vec())
}

fn dtype() -> impl Strategy<Value = Dtype> {
    prop::sample::select(Dtype::ALL.to_vec())
}

/// (n, k, group size, weights) with K a multiple of the group size.
fn weight() -> impl Strategy<Value = (usize, usize, usize, Vec<f32>)> {
    (1usize..6, 1usize..4, group_size()).prop_flat_map(|(n, groups, g)| {
        let k = groups * g;
        (Just(n), Just(k), Just(g), prop::collection::vec(-100f32..100f32, n * k))
    })
}

proptest! {
    #[test]
    fn pack_then_unpack_is_identity(
        q in (1usize..4, group_size()).prop_flat_map(|(rows, g)| prop::collection::vec(-8i8..=7, rows * g))
    ) {
        prop_assert_eq!(int4::unpack(&int4::pack(&q)), q);
    }

    #[test]
    fn word_layout_matches_compressed_tensors(q in prop::array::uniform8(-8i8..=7)) {
        // Element j at bits 4j.., stored as q + 8 (compressed-tensors `pack_to_int32`).
        let word = int4::pack_word(q);
        for (j, &v) in q.iter().enumerate() {
            prop_assert_eq!(((word >> (4 * j)) & 0xF) as i8, v + 8);
        }
    }

    #[test]
    fn dequant_error_is_at_most_half_a_step((n, k, g, w) in weight(), dt in dtype()) {
        let qw = QuantizedWeight::quantize(&w, n, k, g, dt).unwrap();
        let deq = qw.dequantize();
        for row in 0..n {
            for col in 0..k {
                let s = qw.scale(row, col / g);
                let err = (w[row * k + col] - deq[row * k + col]).abs();
                // q * s and the subtraction are exact up to one f32 rounding of w.
                prop_assert!(err <= s / 2.0 * (1.0 + 1e-6), "row {row} col {col}: err {err} > s/2 = {}", s / 2.0);
            }
        }
    }

    #[test]
    fn from_q_round_trips((n, k, g, w) in weight(), dt in dtype()) {
        let qw = QuantizedWeight::quantize(&w, n, k, g, dt).unwrap();
        let again = QuantizedWeight::from_q(&qw.q(), n, k, g, qw.scales.clone()).unwrap();
        prop_assert_eq!(again, qw);
    }
}

#[test]
fn scales_follow_the_absmax_over_7_5_convention() {
    let mut w = vec![0f32; 32];
    w[3] = -15.0; // absmax 15 -> s = 2, exactly representable
    w[4] = 6.9;
    let qw = QuantizedWeight::quantize(&w, 1, 32, 32, Dtype::Bf16).unwrap();
    assert_eq!(qw.scale(0, 0), 2.0);
    let q = qw.q();
    assert_eq!(q[3], -8, "-7.5 rounds away from zero to -8");
    assert_eq!(q[4], 3);
}

#[test]
fn k_not_a_multiple_of_the_group_is_an_error() {
    let err = QuantizedWeight::quantize(&[0.0; 48], 1, 48, 32, Dtype::F16).unwrap_err();
    assert!(matches!(err, QuantError::KNotMultipleOfGroup { k: 48, group_size: 32, .. }), "{err}");
    assert!(err.to_string().contains("48") && err.to_string().contains("32"));
}

#[test]
fn unsupported_group_size_is_an_error() {
    let err = QuantizedWeight::quantize(&[0.0; 48], 1, 48, 48, Dtype::F16).unwrap_err();
    assert!(matches!(err, QuantError::UnsupportedGroupSize { group_size: 48 }), "{err}");
}

#[test]
fn disagreeing_lengths_are_errors() {
    let scales = Scales { dtype: Dtype::F16, bits: vec![0; 2] };
    let err = QuantizedWeight::from_parts("layer.w", 2, 64, 32, vec![0; 15], scales.clone()).unwrap_err();
    assert!(matches!(err, QuantError::LengthMismatch { expected: 16, actual: 15, .. }), "{err}");
    assert!(err.to_string().contains("layer.w.weight_packed"));
    let err = QuantizedWeight::from_parts("layer.w", 2, 64, 32, vec![0; 16], scales).unwrap_err();
    assert!(matches!(err, QuantError::LengthMismatch { expected: 4, actual: 2, .. }), "{err}");
}

#[test]
fn out_of_range_q_and_non_finite_weights_are_errors() {
    let scales = Scales { dtype: Dtype::F16, bits: vec![0; 1] };
    let mut q = vec![0i8; 32];
    q[5] = 8;
    assert!(matches!(QuantizedWeight::from_q(&q, 1, 32, 32, scales), Err(QuantError::OutOfRange { value: 8, .. })));
    let mut w = vec![0f32; 32];
    w[1] = f32::NAN;
    assert!(matches!(QuantizedWeight::quantize(&w, 1, 32, 32, Dtype::F16), Err(QuantError::OutOfRange { .. })));
}
