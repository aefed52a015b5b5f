//! How a W4A16 variant launches ([`DenseFamily`] for [`W4a16`]): grid, block, shared memory and the
//! split-K workspace. [`crate::w4a16::dense::DenseKernel`] launches it.

use kdtree_quant::{Dtype, QuantizedWeight};

use crate::w4a16::dense::{DenseFamily, Layout};
use crate::w4a16::rules::{TILE_N, shared_bytes};
use crate::w4a16::{Algo, DeviceWeights, W4a16, accuracy, layout};
use crate::{Arch, Result};

/// An upper bound of the templates' static shared memory (split-K's 16-byte flag): it counts
/// against the 48 KiB a launch may use without opting in, so a launch of exactly 48 KiB dynamic
/// needs the opt-in.
const STATIC_SMEM: usize = 1024;

impl DenseFamily for W4a16 {
    /// The device's own arch: `mma.sync` runs on every arch from sm_80.
    fn compile_arch(&self, device: Arch) -> Arch {
        device
    }

    fn layout(&self) -> Layout {
        Layout::Tiles
    }

    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn group_size(&self) -> usize {
        self.group_size as usize
    }

    fn block_rows(&self) -> usize {
        self.bm as usize
    }

    /// Stream and gemv: their `bm`.
    fn row_limit(&self) -> Option<usize> {
        self.algo.has_row_limit().then_some(self.bm as usize)
    }

    /// One counter per output tile, then the split-K partials. The counters come first: gemv and
    /// stream keep one per 64-column tile, whatever M, so one workspace zeroed once serves them at
    /// every M up to its size; mma's grow with M (zero again before a launch of another M).
    fn workspace_len(&self, m: usize, n: usize) -> usize {
        if self.split_k == 1 {
            return 0;
        }
        let (gx, gy, _) = self.grid(m, n);
        let tiles = match self.algo {
            Algo::Gemv | Algo::Stream => gx,
            Algo::Mma => gx * gy,
        };
        self.split_k as usize * m * n + tiles
    }

    fn tolerance(&self) -> f64 {
        accuracy::tolerance(self)
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

    /// Gemv and stream: (column tiles, splits); mma: (row blocks, column blocks, splits).
    fn grid(&self, m: usize, n: usize) -> (usize, usize, usize) {
        let ntiles = n.div_ceil(TILE_N as usize);
        match self.algo {
            Algo::Gemv | Algo::Stream => (ntiles, self.split_k as usize, 1),
            Algo::Mma => {
                (m.div_ceil(self.bm as usize), ntiles.div_ceil((self.bn / TILE_N) as usize), self.split_k as usize)
            }
        }
    }

    fn threads(&self) -> u32 {
        self.warps * 32
    }

    fn shared_bytes(&self) -> usize {
        shared_bytes(self)
    }

    fn static_bytes(&self) -> usize {
        STATIC_SMEM
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Variant;

    #[test]
    fn workspace_holds_partials_and_one_counter_per_tile() {
        let v = W4a16::from_name("w4a16_mma_bf16_g32_m16n64k128_w4_s4_sk4_f32acc").expect("in the space");
        // M = 20 -> 2 row blocks; N = 300 -> 5 column tiles.
        assert_eq!(v.workspace_len(20, 300), 4 * 20 * 300 + 2 * 5);
        let g = W4a16::from_name("w4a16_gemv_bf16_g32_m1n64k128_w4_s1_sk1_f32acc").expect("in the space");
        assert_eq!(g.workspace_len(1, 300), 0);
        // Stream blocks own a column tile, whatever M: 5 tiles.
        let s = W4a16::from_name("w4a16_stream_bf16_g32_m16n64k128_w4_s4_sk4_f32acc").expect("in the space");
        assert_eq!(s.workspace_len(13, 300), 4 * 13 * 300 + 5);
    }

    #[test]
    fn supports_names_the_limits() {
        let g = W4a16::from_name("w4a16_gemv_f16_g64_m4n64k128_w4_s1_sk4_f32acc").expect("in the space");
        assert!(g.supports(4, 100, 192));
        assert!(!g.supports(5, 100, 192), "gemv rows");
        assert!(!g.supports(4, 100, 160), "K not a multiple of 64");
        assert!(!g.supports(0, 100, 192));
        let m = W4a16::from_name("w4a16_mma_f16_g64_m16n64k128_w4_s4_sk1_f32acc").expect("in the space");
        assert!(m.supports(1000, 7, 64));
        let s = W4a16::from_name("w4a16_stream_f16_g32_m8n64k128_w4_s4_sk1_f32acc").expect("in the space");
        assert!(s.supports(8, 100, 96));
        assert!(!s.supports(9, 100, 96), "stream rows");
    }
}
