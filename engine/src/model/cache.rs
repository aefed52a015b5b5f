//! The KV cache: full per-head keys (non-rotary part from `kv_b_proj`, rotary part already
//! rotated) and values for every layer and token, in cache order. Caching the decompressed K/V
//! rather than MLA's compressed latent costs memory but keeps attention the plain
//! `softmax(q·k) v` of the reference code, with no weight absorption to re-associate sums.

use crate::error::{EngineError, Result};
use crate::registry::{Heads, KvStore};

/// Keys and values of every layer, entry `t` of each layer being token `t` of the sequence: the
/// CPU backend's cache.
#[derive(Clone, Debug)]
pub struct KvCache {
    len: usize,
    heads: Heads,
    k_width: usize,
    v_width: usize,
    layers: Vec<LayerKv>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

impl KvCache {
    /// An empty cache of `layers` layers of MLA heads `heads`.
    pub(crate) fn new(layers: usize, heads: Heads) -> Self {
        let (k_width, v_width) = (heads.heads * heads.qk(), heads.heads * heads.v);
        Self { len: 0, heads, k_width, v_width, layers: vec![LayerKv::default(); layers] }
    }

    pub(crate) fn heads(&self) -> Heads {
        self.heads
    }

    pub(crate) fn layer(&self, i: usize) -> &LayerKv {
        &self.layers[i]
    }

    /// Appends the new entries of layer `i`; [`Self::commit`] then counts them.
    pub(crate) fn append(&mut self, i: usize, k: &[f32], v: &[f32]) {
        self.layers[i].k.extend_from_slice(k);
        self.layers[i].v.extend_from_slice(v);
    }
}

/// Checks `compact`'s arguments against a cache of `len` entries.
pub(crate) fn check_compact(len: usize, start: usize, keep: &[usize]) -> Result<()> {
    if !keep.windows(2).all(|w| w[0] < w[1]) {
        return Err(EngineError::InvalidArgument(format!("compact: keep {keep:?} is not strictly ascending")));
    }
    if keep.last().is_some_and(|&j| start + j >= len) {
        return Err(EngineError::InvalidArgument(format!(
            "compact: keep {keep:?} after entry {start} reaches past the cache of {len}"
        )));
    }
    Ok(())
}

impl KvStore for KvCache {
    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        for l in &mut self.layers {
            l.k.truncate(self.len * self.k_width);
            l.v.truncate(self.len * self.v_width);
        }
    }

    fn compact(&mut self, start: usize, keep: &[usize]) -> Result<()> {
        check_compact(self.len, start, keep)?;
        for l in &mut self.layers {
            for (i, &j) in keep.iter().enumerate() {
                for (buf, w) in [(&mut l.k, self.k_width), (&mut l.v, self.v_width)] {
                    buf.copy_within((start + j) * w..(start + j + 1) * w, (start + i) * w);
                }
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

    /// Entries of 2 key and 1 value floats.
    const HEADS: Heads = Heads { heads: 1, nope: 1, rope: 1, v: 1, scale: 1.0 };

    fn filled(n: usize) -> KvCache {
        let mut c = KvCache::new(2, HEADS);
        for layer in 0..2 {
            let k: Vec<f32> = (0..n * 2).map(|i| (layer * 100 + i) as f32).collect();
            let v: Vec<f32> = (0..n).map(|i| (layer * 100 + i) as f32).collect();
            c.append(layer, &k, &v);
        }
        c.commit(n);
        c
    }

    #[test]
    fn compact_moves_kept_entries_after_the_prefix() {
        let mut c = filled(6);
        c.compact(2, &[1, 3]).unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(c.layer(1).v, [100.0, 101.0, 103.0, 105.0]);
        assert_eq!(c.layer(0).k, [0.0, 1.0, 2.0, 3.0, 6.0, 7.0, 10.0, 11.0]);
        assert!(c.compact(0, &[1, 1]).is_err() && c.compact(1, &[3]).is_err());
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn truncate_and_rollback_drop_the_tail() {
        let mut c = filled(3);
        c.append(0, &[9.0, 9.0], &[9.0]);
        c.rollback();
        assert_eq!(c.layer(0).v.len(), 3);
        c.truncate(1);
        assert_eq!((c.len(), c.layer(1).k.clone()), (1, vec![100.0, 101.0]));
    }
}
