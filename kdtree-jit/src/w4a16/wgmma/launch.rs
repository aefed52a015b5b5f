//! How a wgmma variant launches ([`DenseFamily`] for [`W4a16Wgmma`]): grid, block, shared memory
//! and the split-K workspace. [`crate::w4a16::dense::DenseKernel`] launches it.

use kdtree_quant::{Dtype, QuantizedWeight};

use crate::w4a16::dense::{DenseFamily, Layout};
use crate::w4a16::wgmma::rules::{WARPGROUP_N, shared_bytes, static_bytes};
use crate::w4a16::wgmma::{W4a16Wgmma, layout};
use crate::w4a16::{DeviceWeights, accuracy};
use crate::{Arch, Result};

impl DenseFamily for W4a16Wgmma {
    /// The arch-specific target (sm_90a on an H100 or H200): wgmma is not in plain sm_90.
    fn compile_arch(&self, device: Arch) -> Arch {
        device.specific()
    }

    fn layout(&self) -> Layout {
        Layout::Wgmma
    }

    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn group_size(&self) -> usize {
        self.group_size as usize
    }

    /// The token tile.
    fn block_rows(&self) -> usize {
        self.bm as usize
    }

    /// None: token tiles run across M.
    fn row_limit(&self) -> Option<usize> {
        None
    }

    /// One counter per block, then split-K's `[split][M][N]` partials. Their number grows with M,
    /// and the partials start after them: zero the counters again before a launch of another M.
    fn workspace_len(&self, m: usize, n: usize) -> usize {
        if self.split_k == 1 {
            return 0;
        }
        let (gx, gy, _) = self.grid(m, n);
        self.split_k as usize * m * n + gx * gy
    }

    /// As mma's: wgmma too rounds q * s to the dtype and sums in f32.
    fn tolerance(&self) -> f64 {
        accuracy::tolerance_for(self.dtype, self.acc)
    }

    fn repack(&self, w: &QuantizedWeight) -> Result<DeviceWeights> {
        layout::repack(self, w)
    }

    fn unpack(&self, d: &DeviceWeights, n: usize, k: usize) -> Result<QuantizedWeight> {
        layout::unpack(self, d, n, k)
    }

    fn lengths(&self, n: usize, k: usize) -> (usize, usize) {
        layout::lengths(n, k, self.group_size as usize)
    }

    /// (token tiles, feature tiles, splits): token tiles vary fastest, so blocks that read the same
    /// weights run together and the weights come from DRAM once while M spans several tiles.
    fn grid(&self, m: usize, n: usize) -> (usize, usize, usize) {
        (m.div_ceil(self.bm as usize), n.div_ceil(self.bn as usize), self.split_k as usize)
    }

    /// A warpgroup of 128 threads per 64 features.
    fn threads(&self) -> u32 {
        self.bn / WARPGROUP_N * 128
    }

    fn shared_bytes(&self) -> usize {
        shared_bytes(self)
    }

    fn static_bytes(&self) -> usize {
        static_bytes(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Variant;

    #[test]
    fn supports_names_the_limits_and_tiles_tokens_fastest() {
        let v = W4a16Wgmma::from_name("w4a16_wgmma_bf16_g64_m128n128k128_s4_sk2_f32acc").expect("in the space");
        assert!(v.supports(1, 7, 64) && v.supports(300, 18432, 7168));
        assert!(!v.supports(16, 100, 96), "K not a multiple of 64");
        assert!(!v.supports(0, 100, 128));
        assert_eq!(v.grid(300, 18432), (3, 144, 2));
        // A counter per block, then two splits of 300 x 18432 partials.
        assert_eq!(v.workspace_len(300, 18432), 2 * 300 * 18432 + 3 * 144);
        assert_eq!(W4a16Wgmma { split_k: 1, ..v }.workspace_len(300, 18432), 0);
    }
}
