//! The KV cache: full per-head keys (non-rotary part from `kv_b_proj`, rotary part already
//! rotated) and values for every layer and token, in cache order. Caching the decompressed K/V
//! rather than MLA's compressed latent costs memory but keeps attention the plain
//! `softmax(q·k) v` of the reference code, with no weight absorption to re-associate sums.

/// Keys and values of every layer, entry `t` of each layer being token `t` of the sequence.
#[derive(Clone, Debug)]
pub struct KvCache {
    len: usize,
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
    /// An empty cache of `layers` layers, each entry `k_width` key and `v_width` value floats.
    pub(crate) fn new(layers: usize, k_width: usize, v_width: usize) -> Self {
        Self { len: 0, k_width, v_width, layers: vec![LayerKv::default(); layers] }
    }

    /// Entries (tokens) held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the first `len` entries (no-op when it holds fewer).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        for l in &mut self.layers {
            l.k.truncate(self.len * self.k_width);
            l.v.truncate(self.len * self.v_width);
        }
    }

    /// Keeps, after the first `start` entries, only entries `start + keep[0]`, `start + keep[1]`,
    /// ... moved to be contiguous: what tree verification leaves of an accepted path.
    ///
    /// # Panics
    /// If `keep` is not strictly ascending or reaches past the end of the cache.
    pub fn compact(&mut self, start: usize, keep: &[usize]) {
        assert!(keep.windows(2).all(|w| w[0] < w[1]), "compact: keep must be strictly ascending");
        assert!(keep.last().is_none_or(|&j| start + j < self.len), "compact: keep reaches past the cache");
        for l in &mut self.layers {
            for (i, &j) in keep.iter().enumerate() {
                for (buf, w) in [(&mut l.k, self.k_width), (&mut l.v, self.v_width)] {
                    buf.copy_within((start + j) * w..(start + j + 1) * w, (start + i) * w);
                }
            }
        }
        self.truncate(start + keep.len());
    }

    pub(crate) fn layer(&self, i: usize) -> &LayerKv {
        &self.layers[i]
    }

    /// Appends the new entries of layer `i`; [`Self::commit`] then counts them.
    pub(crate) fn append(&mut self, i: usize, k: &[f32], v: &[f32]) {
        self.layers[i].k.extend_from_slice(k);
        self.layers[i].v.extend_from_slice(v);
    }

    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Drops whatever layers appended beyond the counted entries (after a failed forward).
    pub(crate) fn rollback(&mut self) {
        self.truncate(self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize) -> KvCache {
        let mut c = KvCache::new(2, 2, 1);
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
        c.compact(2, &[1, 3]);
        assert_eq!(c.len(), 4);
        assert_eq!(c.layer(1).v, [100.0, 101.0, 103.0, 105.0]);
        assert_eq!(c.layer(0).k, [0.0, 1.0, 2.0, 3.0, 6.0, 7.0, 10.0, 11.0]);
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
