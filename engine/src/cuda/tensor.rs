//! The CUDA backend's activations and per-forward inputs.

use cudarc::driver::CudaSlice;

/// f32 rows on the GPU; `data` holds exactly `rows * cols` values.
pub struct CudaTensor {
    pub data: CudaSlice<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl CudaTensor {
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One forward's inputs on the GPU, uploaded once and read by every layer.
pub struct CudaBatch {
    pub n: usize,
    pub tokens: CudaSlice<u32>,
    pub positions: CudaSlice<u32>,
    /// Visibility among the new tokens, `[n, words]` with `words = n.div_ceil(32)`: bit `b` of
    /// word `w` of row `i` is whether token `i` sees token `32 w + b`.
    pub mask: CudaSlice<u32>,
}

/// [`CudaBatch::mask`]'s bits, built on the host.
pub fn mask_bits(mask: &crate::TreeMask) -> Vec<u32> {
    let n = mask.len();
    let words = n.div_ceil(32);
    let mut bits = vec![0u32; n * words];
    for i in 0..n {
        for j in 0..n {
            if mask.visible(i, j) {
                bits[i * words + j / 32] |= 1 << (j % 32);
            }
        }
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TreeMask;

    #[test]
    fn mask_bits_follow_the_tree() {
        let tree = TreeMask::from_parents(&[None, Some(0), Some(0), Some(1)]);
        assert_eq!(mask_bits(&tree), [0b1, 0b11, 0b101, 0b1011]);
        let wide = mask_bits(&TreeMask::causal(40));
        assert_eq!((wide.len(), wide[39 * 2], wide[39 * 2 + 1]), (80, u32::MAX, 0xff));
    }
}
