//! The values: SplitMix64 draws addressed by their index in the seed's stream, so that any piece
//! of any tensor is made on its own (in parallel) and still comes out as the sequential stream
//! would make it. Same seed and spec, same bytes.

use std::ops::Range;

use half::bf16;
use kdtree_quant::{Dtype, scales};

use super::plan::{Fill, GROUP, Unit};

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// Draws per piece: about a millisecond of work, a few MB of output.
const PIECE_DRAWS: usize = 1 << 20;

/// Draw `i` of SplitMix64 seeded with `seed` is `mix(seed + (i + 1) * GAMMA)`.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Draws `first..first + len` of the stream as uniform values in `[-scale, scale)` (24 random bits).
fn uniform(seed: u64, first: u64, len: usize, scale: f32) -> impl Iterator<Item = f32> {
    let start = seed.wrapping_add(first.wrapping_add(1).wrapping_mul(GAMMA));
    (0..len as u64).map(move |i| {
        let z = mix(start.wrapping_add(i.wrapping_mul(GAMMA)));
        ((z >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale
    })
}

/// A slice of one unit's work: elements, or rows of an INT4 weight.
#[derive(Clone, Debug)]
pub(crate) struct Piece<'a> {
    pub unit: &'a Unit,
    pub range: Range<usize>,
}

/// The pieces of `unit`, in order.
pub(crate) fn pieces(unit: &Unit) -> impl Iterator<Item = Piece<'_>> {
    let (len, step) = match unit.fill {
        Fill::Int4 { n, k, .. } => (n, (PIECE_DRAWS / k).max(1)),
        _ => (unit.draws() as usize, PIECE_DRAWS),
    };
    (0..len.div_ceil(step)).map(move |i| Piece { unit, range: i * step..((i + 1) * step).min(len) })
}

impl Piece<'_> {
    /// The piece's bytes as (tensor of the unit, byte offset in that tensor's data, bytes).
    pub fn make(&self, seed: u64) -> Vec<(usize, u64, Vec<u8>)> {
        let Range { start, end } = self.range.clone();
        let first = self.unit.first_draw;
        let bytes = |values: Vec<u16>| bytemuck::cast_slice::<u16, u8>(&values).to_vec();
        match self.unit.fill {
            Fill::Uniform { scale } => {
                let v = uniform(seed, first + start as u64, end - start, scale).map(|x| bf16::from_f32(x).to_bits());
                vec![(0, 2 * start as u64, bytes(v.collect()))]
            }
            Fill::Norm => {
                let v =
                    uniform(seed, first + start as u64, end - start, 0.2).map(|x| bf16::from_f32(1.0 + x).to_bits());
                vec![(0, 2 * start as u64, bytes(v.collect()))]
            }
            Fill::NormF32 => {
                let v: Vec<f32> = uniform(seed, first + start as u64, end - start, 0.2).map(|x| 1.0 + x).collect();
                vec![(0, 4 * start as u64, bytemuck::cast_slice(&v).to_vec())]
            }
            Fill::UniformF32 { scale } => {
                let v: Vec<f32> = uniform(seed, first + start as u64, end - start, scale).collect();
                vec![(0, 4 * start as u64, bytemuck::cast_slice(&v).to_vec())]
            }
            Fill::Int4 { n, k, scale } => {
                let mut w = uniform(seed, first + (start * k) as u64, (end - start) * k, scale);
                let (mut packed, mut scales) = (Vec::new(), Vec::new());
                let mut group = [0f32; GROUP];
                for _ in 0..(end - start) * k / GROUP {
                    group.iter_mut().for_each(|g| *g = w.next().expect("rows * k draws"));
                    let (bits, words) = quantize_group(&group);
                    scales.push(bits);
                    packed.extend(words);
                }
                let mut out = vec![
                    (0, (start * k / 2) as u64, bytemuck::cast_slice(&packed).to_vec()),
                    (1, (start * k / GROUP * 2) as u64, bytes(scales)),
                ];
                if start == 0 {
                    out.push((2, 0, bytemuck::cast_slice(&[n as i64, k as i64]).to_vec()));
                }
                out
            }
        }
    }
}

/// One group of [`kdtree_quant::QuantizedWeight::quantize`] with bf16 scales, with no allocation and a rounding
/// that compiles to plain instructions (`f32::round` is a library call on baseline x86-64): the
/// scale (as bits) and the four packed words. A test pins it to the original.
fn quantize_group(w: &[f32; GROUP]) -> (u16, [u32; GROUP / 8]) {
    let absmax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    let bits = scales::round_up(Dtype::Bf16, absmax / 7.5);
    let s = bf16::from_bits(bits).to_f32();
    if s == 0.0 {
        return (bits, [0x8888_8888; GROUP / 8]); // q = 0 everywhere: nibble 8
    }
    let mut words = [0u32; GROUP / 8];
    for (word, chunk) in words.iter_mut().zip(w.chunks_exact(8)) {
        for (j, &v) in chunk.iter().enumerate() {
            // Round half away from zero, as f32::round: |x| <= 7.5, so the truncation and the
            // fraction are exact.
            let x = v / s;
            let a = x.abs();
            let r = a as i32 + i32::from(a - (a as i32) as f32 >= 0.5);
            let q = if x < 0.0 { -r } else { r }.clamp(-8, 7);
            *word |= ((q + 8) as u32) << (4 * j);
        }
    }
    (bits, words)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sequential SplitMix64 the first tiny models were drawn with.
    fn sequential(seed: u64, len: usize) -> Vec<u64> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_add(GAMMA);
                mix(s)
            })
            .collect()
    }

    #[test]
    fn addressed_draws_equal_the_sequential_stream() {
        let seq: Vec<f32> =
            sequential(42, 100).iter().map(|z| ((z >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * 2.0).collect();
        let tail: Vec<f32> = uniform(42, 37, 63, 2.0).collect();
        assert_eq!(&seq[37..], &tail[..]);
        assert!(seq.iter().all(|v| (-2.0..2.0).contains(v)));
    }

    #[test]
    fn the_fused_quantizer_is_kdtree_quants() {
        // Random groups of several magnitudes, an all-zero group, and exact halves: with absmax
        // 1.875 the scale is 0.25, and 0.625 / 0.25 = 2.5 rounds away from zero.
        let mut w: Vec<f32> = uniform(7, 0, 64 * GROUP, 1.0).enumerate().map(|(i, v)| v * (i / GROUP) as f32).collect();
        w[..GROUP].fill(0.0);
        let halves = [1.875, 0.625, -0.625, 0.375, -1.875, 0.125, -0.125, 1.125];
        w[GROUP..2 * GROUP].iter_mut().zip(halves.iter().cycle()).for_each(|(x, &h)| *x = h);
        let expect = kdtree_quant::QuantizedWeight::quantize(&w, 16, 4 * GROUP, GROUP, Dtype::Bf16).unwrap();
        let (mut packed, mut bits) = (Vec::new(), Vec::new());
        for g in w.chunks_exact(GROUP) {
            let (b, words) = quantize_group(g.try_into().unwrap());
            bits.push(b);
            packed.extend(words);
        }
        assert_eq!((packed, bits), (expect.packed, expect.scales.bits));
    }
}
