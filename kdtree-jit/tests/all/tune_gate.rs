//! The gate with the W4A16 tolerance table against simulated kernels: arithmetic a correct kernel
//! may do passes, the bugs a wrong kernel has do not.

use kdtree_jit::tune::gate::pass;
use kdtree_jit::tune::key::Shape;
use kdtree_jit::tune::problem::Problem;
use kdtree_jit::w4a16::{self, Acc, Algo, W4a16};
use kdtree_quant::Dtype;

fn tolerance(dtype: Dtype, acc: Acc) -> f64 {
    let v =
        W4a16 { algo: Algo::Mma, dtype, group_size: 32, acc, bm: 16, bn: 64, bk: 128, warps: 4, stages: 4, split_k: 1 };
    w4a16::tolerance(&v)
}

const M: usize = 8;

fn problem(dtype: Dtype, k: u32) -> Problem {
    Problem::random(Shape { n: 192, k }, 32, dtype, M, 7).unwrap()
}

/// A kernel's arithmetic on the CPU: weights dequantized in the activation dtype, products of one
/// k16 step (one mma) summed in f32, steps summed in `acc` serially (the worst order) over `split`
/// K slices, the result rounded to `dtype`.
/// `skip_group` leaves one group of K out, as an off-by-one in a loop bound would.
fn simulate(p: &Problem, acc: Acc, split: usize, skip_group: Option<usize>) -> Vec<f32> {
    let (n, k, g) = (p.weight.n, p.weight.k, p.weight.group_size);
    let dtype = p.dtype;
    let x = p.x_f32();
    let round_acc = |v: f32| if acc == Acc::F16 { Dtype::F16.round(v) } else { v };
    let mut w = vec![0f32; k];
    let mut y = vec![0f32; M * n];
    for col in 0..n {
        p.weight.dequantize_row(col, &mut w);
        w.iter_mut().for_each(|v| *v = dtype.round(*v));
        for row in 0..M {
            let xr = &x[row * k..(row + 1) * k];
            let mut total = 0f32;
            for slice in 0..split {
                let mut sum = 0f32;
                for step in (slice * k / split..(slice + 1) * k / split).step_by(16) {
                    let products = (step..step + 16).filter(|kk| Some(kk / g) != skip_group).map(|kk| xr[kk] * w[kk]);
                    sum = round_acc(sum + products.sum::<f32>());
                }
                total += sum;
            }
            y[row * n + col] = dtype.round(total);
        }
    }
    y
}

#[test]
fn correct_kernel_arithmetic_passes_for_every_dtype_and_accumulation() {
    for (dtype, acc) in [(Dtype::Bf16, Acc::F32), (Dtype::F16, Acc::F32), (Dtype::F16, Acc::F16)] {
        for k in [2048, 7168] {
            let p = problem(dtype, k);
            let tol = tolerance(dtype, acc);
            for split in [1, 4] {
                if let Err(e) = pass(&simulate(&p, acc, split, None), p.reference(M), tol) {
                    panic!("{dtype} {acc:?} K={k} split {split}: {e}");
                }
            }
        }
    }
}

#[test]
fn kernel_bugs_are_rejected() {
    let p = problem(Dtype::Bf16, 7168);
    let tol = tolerance(Dtype::Bf16, Acc::F32);
    let good = simulate(&p, Acc::F32, 1, None);
    let reference = p.reference(M);
    assert!(pass(&simulate(&p, Acc::F32, 1, Some(100)), reference, tol).is_err(), "one group of 224 left out");
    let mut swapped = good.clone();
    swapped.swap(5, 6);
    assert!(pass(&swapped, reference, tol).is_err(), "two columns swapped");
    let mut nan = good.clone();
    nan[77] = f32::NAN;
    let e = pass(&nan, reference, tol).unwrap_err();
    assert_eq!(e.index, 77);
    assert!(pass(&good[1..], reference, tol).is_err(), "short output");
    assert!(pass(&vec![0.0; good.len()], reference, tol).is_err(), "a kernel that wrote nothing");
}

#[test]
fn the_reference_of_fewer_rows_is_a_prefix() {
    let p = problem(Dtype::Bf16, 2048);
    assert_eq!(p.reference(3).len(), 3 * 192);
    assert_eq!(&p.reference(M)[..3 * 192], p.reference(3));
    // int4 weights + scales + X + Y.
    assert_eq!(p.bytes(2), (192 * 2048 / 2 + 192 * 64 * 2 + 2 * 2 * (2048 + 192)) as u64);
}
