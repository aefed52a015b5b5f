//! The weight layout the W4A16 kernels read, and its CPU repack from (and back to) the
//! compressed-tensors format of [`QuantizedWeight`].
//!
//! All three algorithms read the same layout. It was designed for mma's B fragments; stream reads
//! word i as the A fragment of columns 16i..16i+15 (pairs 0, 2, 1, 3 = registers a0..a3), gemv as is.
//! Columns are padded up to a multiple of 64 (zero scales), then:
//!
//! - `packed`: u32 words `[N/64][K/16][32 lanes][4 words]`. Tile (nt, kt) is one warp's 512-byte
//!   coalesced read: lane l = 4g + t loads its 4 words as one 16-byte vector. Word i of lane
//!   (g, t) holds the eight values one thread needs for two m16n8k16 B fragments, columns
//!   16i + g and 16i + 8 + g, rows k = 2t, 2t+1, 2t+8, 2t+9 of the k16 tile. Nibble j = p + 4h
//!   (pair p, half h; at bits 4j, stored as q + 8) is column 16i + 8(p / 2) + g, k = 2t + 8(p % 2) + h,
//!   so the dequantization's pair p (nibbles p and p + 4) is one B-fragment register as is.
//! - `scales`: `[K/G][N/64 * 64]` in the activation dtype; inside each 64-column tile, position
//!   8g + 2i + h holds column 16i + 8h + g, so lane (g, ·) reads its eight scales as one vector.

use rayon::prelude::*;

use kdtree_quant::{Dtype, QuantizedWeight, Scales, int4};

use crate::w4a16::W4a16;
use crate::w4a16::rules::{TILE_K, TILE_N};
use crate::{Error, Result, Variant};

const TILE_COLS: usize = TILE_N as usize;
const TILE_DEPTH: usize = TILE_K as usize;
/// u32 words of one 64 x 16 tile: 32 lanes x 4.
const TILE_WORDS: usize = 128;

/// Repacked weights on the host, ready to upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceWeights {
    pub packed: Vec<u32>,
    pub scales: Vec<u16>,
}

/// Where nibble `j` of word `w` (index within its tile) comes from: (column, k) within the tile.
fn source(w: usize, j: usize) -> (usize, usize) {
    let (lane, i) = (w / 4, w % 4);
    let (g, t) = (lane / 4, lane % 4);
    let (p, h) = (j % 4, j / 4);
    (16 * i + 8 * (p / 2) + g, 2 * t + 8 * (p % 2) + h)
}

/// Column of scale position `pos` within a 64-column tile.
fn scale_column(pos: usize) -> usize {
    let (g, i, h) = (pos / 8, (pos % 8) / 2, pos % 2);
    16 * i + 8 * h + g
}

fn padded(n: usize) -> usize {
    n.div_ceil(TILE_COLS) * TILE_COLS
}

/// Lengths of the repacked buffers of an [n, k] weight with group size `g`.
pub fn lengths(n: usize, k: usize, g: usize) -> (usize, usize) {
    (padded(n) * k / 8, k / g * padded(n))
}

fn mismatch(variant: &str, reason: String) -> Error {
    Error::Unsupported { variant: variant.into(), reason }
}

/// Repacks `w` into the layout `v` reads. The weight's group size must be the variant's and its
/// scales must be in the variant's dtype (the kernels read scales as activation-dtype values).
pub fn repack(v: &W4a16, w: &QuantizedWeight) -> Result<DeviceWeights> {
    repack_as(&v.name(), v.group_size, v.dtype, w)
}

/// [`repack`] for a variant of any space that reads this layout: its name (for errors), group size
/// and dtype.
pub(crate) fn repack_as(variant: &str, group_size: u32, dtype: Dtype, w: &QuantizedWeight) -> Result<DeviceWeights> {
    if w.group_size != group_size as usize {
        return Err(mismatch(variant, format!("weight has group size {}, variant {group_size}", w.group_size)));
    }
    if w.scales.dtype != dtype {
        return Err(mismatch(variant, format!("weight has {} scales, variant reads {dtype}", w.scales.dtype)));
    }
    let (n, k, g) = (w.n, w.k, w.group_size);
    let words_per_row = k / int4::PER_WORD;
    // Stored nibble of (column, k); padded columns hold q = 0 (stored 8) under a zero scale.
    let nibble = |col: usize, kk: usize| -> u32 {
        if col >= n { int4::OFFSET as u32 } else { (w.packed[col * words_per_row + kk / 8] >> (4 * (kk % 8))) & 0xF }
    };
    let ktiles = k / TILE_DEPTH;
    let mut packed = vec![0u32; lengths(n, k, g).0];
    packed.par_chunks_mut(ktiles * TILE_WORDS).enumerate().for_each(|(nt, chunk)| {
        for (kt, tile) in chunk.chunks_exact_mut(TILE_WORDS).enumerate() {
            for (wi, word) in tile.iter_mut().enumerate() {
                *word = (0..8).fold(0, |acc, j| {
                    let (c, kk) = source(wi, j);
                    acc | nibble(nt * TILE_COLS + c, kt * TILE_DEPTH + kk) << (4 * j)
                });
            }
        }
    });
    let npad = padded(n);
    let groups = k / g;
    let mut scales = vec![0u16; groups * npad];
    for (grp, row) in scales.chunks_exact_mut(npad).enumerate() {
        for (pos, s) in row.iter_mut().enumerate() {
            let col = pos / TILE_COLS * TILE_COLS + scale_column(pos % TILE_COLS);
            if col < n {
                *s = w.scales.bits[col * groups + grp];
            }
        }
    }
    Ok(DeviceWeights { packed, scales })
}

/// The inverse of [`repack`]: the [n, k] weight that `d` holds (padding dropped).
pub fn unpack(v: &W4a16, d: &DeviceWeights, n: usize, k: usize) -> Result<QuantizedWeight> {
    unpack_as(&v.name(), v.group_size, v.dtype, d, n, k)
}

/// The inverse of [`repack_as`].
pub(crate) fn unpack_as(
    variant: &str,
    group_size: u32,
    dtype: Dtype,
    d: &DeviceWeights,
    n: usize,
    k: usize,
) -> Result<QuantizedWeight> {
    let g = group_size as usize;
    kdtree_quant::check_group("w4a16 layout", k, g)?;
    let (packed_len, scales_len) = lengths(n, k, g);
    if d.packed.len() != packed_len || d.scales.len() != scales_len {
        return Err(mismatch(
            variant,
            format!(
                "buffers hold {} words and {} scales, an {n} x {k} weight needs {packed_len} and {scales_len}",
                d.packed.len(),
                d.scales.len()
            ),
        ));
    }
    let ktiles = k / TILE_DEPTH;
    let mut q = vec![0i8; n * k];
    for (t, tile) in d.packed.chunks_exact(TILE_WORDS).enumerate() {
        let (nt, kt) = (t / ktiles, t % ktiles);
        for (wi, &word) in tile.iter().enumerate() {
            for j in 0..8 {
                let (c, kk) = source(wi, j);
                let col = nt * TILE_COLS + c;
                if col < n {
                    q[col * k + kt * TILE_DEPTH + kk] = ((word >> (4 * j)) & 0xF) as i8 - int4::OFFSET;
                }
            }
        }
    }
    let (npad, groups) = (padded(n), k / g);
    let mut bits = vec![0u16; n * groups];
    for (grp, row) in d.scales.chunks_exact(npad).enumerate() {
        for (pos, &s) in row.iter().enumerate() {
            let col = pos / TILE_COLS * TILE_COLS + scale_column(pos % TILE_COLS);
            if col < n {
                bits[col * groups + grp] = s;
            }
        }
    }
    Ok(QuantizedWeight::from_q(&q, n, k, g, Scales { dtype, bits })?)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::w4a16::{Acc, Algo};
    use kdtree_quant::Dtype;

    fn variant(algo: Algo, dtype: Dtype, group_size: u32) -> W4a16 {
        W4a16 { algo, dtype, group_size, acc: Acc::F32, bm: 16, bn: 64, bk: 128, warps: 4, stages: 4, split_k: 1 }
    }

    #[test]
    fn every_nibble_of_a_tile_comes_from_a_distinct_element() {
        let mut seen = std::collections::HashSet::new();
        for w in 0..TILE_WORDS {
            for j in 0..8 {
                let (c, kk) = source(w, j);
                assert!(c < TILE_COLS && kk < TILE_DEPTH);
                assert!(seen.insert((c, kk)), "({c}, {kk}) twice");
            }
        }
        let cols: std::collections::HashSet<usize> = (0..TILE_COLS).map(scale_column).collect();
        assert_eq!(cols.len(), TILE_COLS);
    }

    #[test]
    fn pair_zero_of_lane_five_word_one_is_its_first_b_fragment_register() {
        // lane 5 = (g 1, t 1); word 1 -> columns 17 and 25; pair 0 = nibbles 0 and 4 = k 2, 3 of column 17.
        assert_eq!(source(5 * 4 + 1, 0), (17, 2));
        assert_eq!(source(5 * 4 + 1, 4), (17, 3));
        assert_eq!(source(5 * 4 + 1, 3), (25, 10));
    }

    #[test]
    fn mismatched_group_or_dtype_is_an_error() {
        let w = QuantizedWeight::quantize(&[0.5; 64 * 64], 64, 64, 32, Dtype::F16).unwrap();
        assert!(repack(&variant(Algo::Mma, Dtype::F16, 64), &w).is_err());
        assert!(repack(&variant(Algo::Mma, Dtype::Bf16, 32), &w).is_err());
        let d = repack(&variant(Algo::Mma, Dtype::F16, 32), &w).unwrap();
        assert!(unpack(&variant(Algo::Mma, Dtype::F16, 32), &d, 64, 96).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn repack_round_trips(
            n in 1usize..200,
            kg in 1usize..5,
            gi in 0usize..3,
            bf16 in any::<bool>(),
            gemv in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let g = [32, 64, 128][gi];
            let k = kg * g;
            let dtype = if bf16 { Dtype::Bf16 } else { Dtype::F16 };
            let v = variant(if gemv { Algo::Gemv } else { Algo::Mma }, dtype, g as u32);
            let mut state = seed | 1;
            let mut next = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state };
            let q: Vec<i8> = (0..n * k).map(|_| (next() % 16) as i8 - 8).collect();
            let bits: Vec<u16> = (0..n * k / g).map(|_| (next() % 0x7b00) as u16).collect();
            let w = QuantizedWeight::from_q(&q, n, k, g, Scales { dtype, bits }).unwrap();
            let d = repack(&v, &w).unwrap();
            prop_assert_eq!((d.packed.len(), d.scales.len()), lengths(n, k, g));
            prop_assert_eq!(unpack(&v, &d, n, k).unwrap(), w);
        }
    }
}
