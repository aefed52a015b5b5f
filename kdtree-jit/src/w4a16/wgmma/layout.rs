//! The weight layout of the wgmma family: the tiles of the shared layout ([`crate::w4a16::layout`])
//! with their words regrouped, so that one thread's 16 bytes are its A fragments for four
//! consecutive k16 steps (the shared layout's 16 bytes are four fragments of one k16 step, which a
//! warp of a 64-row wgmma cannot use: it owns 16 of the rows, and would read one word in four).
//!
//! - `packed`: u32 words `[N/64][K/64][4 warps][32 lanes][4 words]`, K padded up to 64 with q = 0.
//!   Word j of lane l of warp w in chunk (nt, kc) is word w of lane l of the shared layout's tile
//!   (nt, 4 kc + j): as it stands, the m16k16 A fragment (pairs 0, 2, 1, 3 = registers a0..a3) of
//!   features 16w..16w+15 of the 64-column tile at k16 step 4 kc + j, which is what warp w of a
//!   warpgroup supplies to m64nNk16 (its rows 16w..16w+15).
//! - `scales`: the shared layout's, unchanged: lane (g, ·) of warp w reads the scales of features
//!   16w + g and 16w + 8 + g as one u32 at position 8g + 2w of a group's 64.

use kdtree_quant::QuantizedWeight;

use crate::w4a16::DeviceWeights;
use crate::w4a16::layout::{self, repack_as, unpack_as};
use crate::w4a16::wgmma::W4a16Wgmma;
use crate::{Error, Result, Variant};

/// K of one weight chunk: four k16 steps, one 16-byte vector a thread.
pub(crate) const CHUNK_K: usize = 64;
/// u32 words of one 64 x 64 chunk: 4 warps x 32 lanes x 4.
const CHUNK_WORDS: usize = 512;
/// Eight stored nibbles of q = 0: what the K padding holds (under zero scales in the kernel).
const PAD: u32 = 0x8888_8888;

/// Lengths of the repacked buffers of an [n, k] weight with group size `g`.
pub(crate) fn lengths(n: usize, k: usize, g: usize) -> (usize, usize) {
    let (packed, scales) = layout::lengths(n, k, g);
    (packed / k * k.next_multiple_of(CHUNK_K), scales)
}

/// Where word `i` of lane `lane` of the shared layout's tile (nt, kt) goes, with `kchunks` chunks a column tile.
fn position(kchunks: usize, nt: usize, kt: usize, lane: usize, i: usize) -> usize {
    (nt * kchunks + kt / 4) * CHUNK_WORDS + i * 128 + lane * 4 + kt % 4
}

/// The shared layout's tiles of an [n, k] weight, word by word: (position in `tiles`, position here).
fn moves(n: usize, k: usize) -> impl Iterator<Item = (usize, usize)> {
    let (ktiles, kchunks, ntiles) = (k / 16, k.div_ceil(CHUNK_K), n.div_ceil(64));
    (0..ntiles * ktiles * 128).map(move |from| {
        let (tile, lane, i) = (from / 128, from / 4 % 32, from % 4);
        (from, position(kchunks, tile / ktiles, tile % ktiles, lane, i))
    })
}

/// Repacks `w` into the layout `v` reads (group size and scale dtype must be the variant's).
pub(crate) fn repack(v: &W4a16Wgmma, w: &QuantizedWeight) -> Result<DeviceWeights> {
    let tiles = repack_as(&v.name(), v.group_size, v.dtype, w)?;
    let mut packed = vec![PAD; lengths(w.n, w.k, w.group_size).0];
    for (from, to) in moves(w.n, w.k) {
        packed[to] = tiles.packed[from];
    }
    Ok(DeviceWeights { packed, scales: tiles.scales })
}

/// The inverse of [`repack`]: the [n, k] weight that `d` holds (padding dropped).
pub(crate) fn unpack(v: &W4a16Wgmma, d: &DeviceWeights, n: usize, k: usize) -> Result<QuantizedWeight> {
    let g = v.group_size as usize;
    kdtree_quant::check_group("w4a16 wgmma layout", k, g)?;
    let (packed_len, _) = lengths(n, k, g);
    if d.packed.len() != packed_len {
        let reason = format!("{} words, an {n} x {k} weight needs {packed_len}", d.packed.len());
        return Err(Error::Unsupported { variant: v.name(), reason });
    }
    let mut tiles = vec![0u32; layout::lengths(n, k, g).0];
    for (from, to) in moves(n, k) {
        tiles[from] = d.packed[to];
    }
    unpack_as(&v.name(), v.group_size, v.dtype, &DeviceWeights { packed: tiles, scales: d.scales.clone() }, n, k)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use kdtree_quant::{Dtype, Scales};

    fn variant(dtype: Dtype, group_size: u32) -> W4a16Wgmma {
        W4a16Wgmma { dtype, group_size, acc: crate::w4a16::Acc::F32, bm: 64, bn: 64, bk: 64, stages: 2, split_k: 1 }
    }

    fn random_weight(n: usize, k: usize, g: usize, dtype: Dtype, seed: u64) -> QuantizedWeight {
        let mut state = seed | 1;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let q: Vec<i8> = (0..n * k).map(|_| (next() % 16) as i8 - 8).collect();
        let bits: Vec<u16> = (0..n * k / g).map(|_| (next() % 0x7b00) as u16).collect();
        QuantizedWeight::from_q(&q, n, k, g, Scales { dtype, bits }).unwrap()
    }

    #[test]
    fn each_word_is_the_a_fragment_of_its_warps_rows_at_its_k16_step() {
        // Two column tiles (the second partial), K = 96: one full chunk and one half padded.
        let (n, k) = (100, 96);
        let w = random_weight(n, k, 32, Dtype::Bf16, 5);
        let d = repack(&variant(Dtype::Bf16, 32), &w).unwrap();
        let q = w.q();
        let stored = |col: usize, kk: usize| if col < n { (q[col * k + kk] + 8) as u32 } else { 8 };
        let kchunks = 2;
        for (nt, kc, warp, lane, j) in (0..2)
            .flat_map(|nt| (0..kchunks).flat_map(move |kc| (0..4).map(move |warp| (nt, kc, warp))))
            .flat_map(|(nt, kc, warp)| (0..32).flat_map(move |lane| (0..4).map(move |j| (nt, kc, warp, lane, j))))
        {
            let word = d.packed[(nt * kchunks + kc) * CHUNK_WORDS + (warp * 32 + lane) * 4 + j];
            let (g, t) = (lane / 4, lane % 4);
            let kk = 64 * kc + 16 * j + 2 * t;
            if kk >= k {
                assert_eq!(word, PAD);
                continue;
            }
            let row = 64 * nt + 16 * warp + g;
            let nibble = |i: usize| (word >> (4 * i)) & 0xF;
            // a0 = pair 0 (nibbles 0, 4): row g, k 2t and 2t + 1; a2 = pair 1: k + 8; a1 = pair 2: row g + 8.
            assert_eq!((nibble(0), nibble(4)), (stored(row, kk), stored(row, kk + 1)));
            assert_eq!((nibble(1), nibble(5)), (stored(row, kk + 8), stored(row, kk + 9)));
            assert_eq!((nibble(2), nibble(6)), (stored(row + 8, kk), stored(row + 8, kk + 1)));
            assert_eq!((nibble(3), nibble(7)), (stored(row + 8, kk + 8), stored(row + 8, kk + 9)));
        }
    }

    #[test]
    fn mismatched_group_dtype_or_length_is_an_error() {
        let w = random_weight(64, 64, 32, Dtype::F16, 1);
        assert!(repack(&variant(Dtype::F16, 64), &w).is_err());
        assert!(repack(&variant(Dtype::Bf16, 32), &w).is_err());
        let d = repack(&variant(Dtype::F16, 32), &w).unwrap();
        assert!(unpack(&variant(Dtype::F16, 32), &d, 64, 128).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn repack_round_trips(n in 1usize..200, kg in 1usize..6, gi in 0usize..3, bf16 in any::<bool>(), seed in any::<u64>()) {
            let g = [32, 64, 128][gi];
            let k = kg * g;
            let dtype = if bf16 { Dtype::Bf16 } else { Dtype::F16 };
            let v = variant(dtype, g as u32);
            let w = random_weight(n, k, g, dtype, seed);
            let d = repack(&v, &w).unwrap();
            prop_assert_eq!((d.packed.len(), d.scales.len()), lengths(n, k, g));
            prop_assert_eq!(d.packed.len(), n.div_ceil(64) * 64 * k.next_multiple_of(64) / 8);
            prop_assert_eq!(unpack(&v, &d, n, k).unwrap(), w);
        }
    }
}
