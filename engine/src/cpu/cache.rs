//! The CPU backend's KV cache: MLA's latent, per layer and token one entry `[c_kv | k_pe]` of
//! `latent + rope` values shared by every head (1152 bytes in bf16 at Kimi K2's sizes, 71x less than
//! decompressed per-head keys and values in f32). Values are held as f32 but rounded to the cache's
//! dtype when appended, so they are the values a bf16 cache on the GPU holds.

use crate::error::Result;
use crate::registry::{Heads, KvStore, check_compact};

/// Latent entries of every layer, entry `t` of each layer being token `t` of the sequence.
#[derive(Clone, Debug)]
pub struct KvCache {
    len: usize,
    heads: Heads,
    layers: Vec<Vec<f32>>,
}

impl KvCache {
    /// An empty cache of `layers` layers laid out by `heads`.
    pub(crate) fn new(layers: usize, heads: Heads) -> Self {
        Self { len: 0, heads, layers: vec![Vec::new(); layers] }
    }

    pub(crate) fn heads(&self) -> Heads {
        self.heads
    }

    /// Layer `i`'s entries, `[entries, latent + rope]`, the uncommitted ones of a forward included.
    pub(crate) fn layer(&self, i: usize) -> &[f32] {
        &self.layers[i]
    }

    /// Appends the new entries of layer `i` as the cache's dtype holds them
    /// ([`crate::registry::KvDtype::store`]);
    /// [`Self::commit`] then counts them.
    pub(crate) fn append(&mut self, i: usize, entries: impl IntoIterator<Item = f32>) {
        let (kv, width, latent) = (self.heads.kv, self.heads.width(), self.heads.mla.latent);
        let start = self.layers[i].len();
        self.layers[i].extend(entries);
        self.layers[i][start..].chunks_mut(width).for_each(|e| kv.store(e, latent));
    }
}

impl KvStore for KvCache {
    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        let w = self.heads.width();
        for l in &mut self.layers {
            l.truncate(self.len * w);
        }
    }

    fn compact(&mut self, start: usize, keep: &[usize]) -> Result<()> {
        check_compact(self.len, start, keep)?;
        let w = self.heads.width();
        for l in &mut self.layers {
            for (i, &j) in keep.iter().enumerate() {
                l.copy_within((start + j) * w..(start + j + 1) * w, (start + i) * w);
            }
        }
        self.truncate(start + keep.len());
        Ok(())
    }

    fn commit(&mut self, n: usize) {
        self.len += n;
    }

    fn rollback(&mut self) {
        self.truncate(self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::KvDtype;
    use kdtree_jit::mla::MlaShape;

    /// Entries of 2 values.
    const HEADS: Heads =
        Heads { mla: MlaShape { heads: 1, nope: 1, rope: 1, v: 1, latent: 1, scale: 1.0 }, kv: KvDtype::F32 };

    fn filled(n: usize) -> KvCache {
        let mut c = KvCache::new(2, HEADS);
        for layer in 0..2 {
            c.append(layer, (0..n * 2).map(|i| (layer * 100 + i) as f32));
        }
        c.commit(n);
        c
    }

    #[test]
    fn compact_moves_kept_entries_after_the_prefix() {
        let mut c = filled(6);
        c.compact(2, &[1, 3]).unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(c.layer(1), [100.0, 101.0, 102.0, 103.0, 106.0, 107.0, 110.0, 111.0]);
        assert!(c.compact(0, &[1, 1]).is_err() && c.compact(1, &[3]).is_err());
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn truncate_and_rollback_drop_the_tail() {
        let mut c = filled(3);
        c.append(0, [9.0, 9.0]);
        c.rollback();
        assert_eq!(c.layer(0).len(), 6);
        c.truncate(1);
        assert_eq!((c.len(), c.layer(1).to_vec()), (1, vec![100.0, 101.0]));
    }

    #[test]
    fn a_bf16_cache_holds_values_rounded_to_bf16() {
        let mut c = KvCache::new(1, Heads { kv: KvDtype::Bf16, ..HEADS });
        c.append(0, [1.0 + 1.0 / 512.0, 3.0]);
        assert_eq!(c.layer(0), [1.0, 3.0]);
        assert_eq!(HEADS.kv_bytes_per_token(61), 61 * 2 * 4);
    }

    #[test]
    fn an_fp8_cache_holds_each_entrys_quantized_values() {
        let mla = MlaShape { heads: 1, nope: 1, rope: 16, v: 1, latent: 64, scale: 1.0 };
        let heads = Heads { mla, kv: KvDtype::Fp8 };
        let entries: Vec<f32> =
            (0..2 * 80).map(|i| (i as f32 * 0.37).sin() * if i < 80 { 1.0 } else { 100.0 }).collect();
        let mut c = KvCache::new(1, heads);
        c.append(0, entries.iter().copied());
        // Each entry is quantized on its own: the same values as one alone, scaled to its own range.
        let mut first = entries[..80].to_vec();
        kdtree_jit::mla::fp8::round_entry(&mut first, 64);
        assert_eq!(c.layer(0)[..80], first[..]);
        assert_ne!(c.layer(0)[..64], entries[..64]);
        assert!(c.layer(0).iter().zip(&entries).all(|(a, b)| (a - b).abs() <= b.abs() / 16.0 + 100.0 * 2f32.powi(-9)));
        // 64 codes, 2 scale bytes padded to 80, 16 bf16 rope values; 61 layers.
        assert_eq!(heads.kv_bytes_per_token(61), 61 * 112);
    }
}
