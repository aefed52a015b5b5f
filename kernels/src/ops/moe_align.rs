//! The routed assignments sorted by expert and cut into tiles on the GPU: what the grouped W4A16 kernel
//! (kdtree-jit's `w4a16::grouped`) reads, built without the routing crossing to the host.

use cudarc::driver::{CudaSlice, CudaView};
use kdtree_jit::kernel::Kernels;

use crate::error::Result;
use crate::{launch, shape};

/// The device buffers of one alignment. [`Alignment::new`] sizes them; the host knows only their
/// bounds, the contents (and the tile count) stay on the device.
pub struct Alignment {
    /// Assignment indices `t * top_k + j` ordered by (expert, index); ids past the experts last.
    pub sorted: CudaSlice<u32>,
    /// Its inverse: `positions[a]` is assignment a's position in `sorted`, where its expert's row lies.
    pub positions: CudaSlice<u32>,
    /// `[experts + 1]`: expert e's assignments are `sorted[offsets[e]..offsets[e + 1]]`.
    pub offsets: CudaSlice<u32>,
    /// `[max_tiles][3]` (expert, start, rows <= bm); the first `meta[0]` are valid.
    pub tiles: CudaSlice<u32>,
    /// (tiles, experts with assignments, assignments whose id is not an expert).
    pub meta: CudaSlice<u32>,
    pub experts: usize,
    pub bm: usize,
    pub max_tiles: usize,
}

impl Alignment {
    /// Buffers for `assignments` assignments over `experts` experts in tiles of `bm` rows. Their contents
    /// are undefined until [`moe_align`] writes them.
    pub fn new(k: &Kernels, assignments: usize, experts: usize, bm: usize) -> Result<Alignment> {
        let max_tiles = kdtree_jit::w4a16::grouped::tile_bound(experts, assignments, bm);
        let s = k.stream();
        // SAFETY: moe_align writes sorted, positions, offsets and meta in full and every tile below meta[0], the
        // only ones a reader may read; device memory holds no Rust invariants.
        let alloc = |len: usize| unsafe { s.alloc::<u32>(len.max(1)) };
        Ok(Alignment {
            sorted: alloc(assignments)?,
            positions: alloc(assignments)?,
            offsets: alloc(experts + 1)?,
            tiles: alloc(3 * max_tiles)?,
            meta: alloc(3)?,
            experts,
            bm,
            max_tiles,
        })
    }
}

/// Sorts the router's `ids` (`[tokens * top_k]`, on the device) by expert into `out` (and each
/// assignment's position in that order into `out.positions`), which
/// [`Alignment::new`] made for `ids.len()` assignments: each expert's assignments in index order, cut
/// into tiles of at most `out.bm` rows, experts ascending. Deterministic: integer counts, a fixed order.
/// An id past the experts sorts last into no tile (its rows are not computed; `meta[2]` counts them);
/// the router never writes one. At most [`shape::MAX_EXPERTS`] experts and
/// [`shape::MAX_ASSIGNMENTS`] assignments.
pub fn moe_align(k: &Kernels, ids: &CudaView<u32>, out: &mut Alignment) -> Result<()> {
    let lens = (out.sorted.len(), out.positions.len(), out.offsets.len(), out.tiles.len(), out.meta.len());
    let a = shape::moe_align(ids.len(), out.experts, out.bm, lens)?;
    // SAFETY: ids holds n values; sorted and positions at least n, offsets experts + 1, tiles 3 * max_tiles, meta 3
    // (checked above); experts <= MAX_EXPERTS < the kernel's 1024 buckets, bm > 0.
    unsafe {
        launch::moe_align(
            k,
            ids,
            &mut out.sorted,
            &mut out.positions,
            &mut out.offsets,
            &mut out.tiles,
            &mut out.meta,
            a.n,
            a.experts,
            a.bm,
            a.max_tiles,
        )
    }?;
    Ok(())
}
