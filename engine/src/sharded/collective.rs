//! How the simulated ranks split a dimension, and the log of what their collectives would move.

use std::ops::Range;

/// Splits `len` into `ranks` contiguous blocks in rank order, as even as can be: the first
/// `len % ranks` blocks hold one more. Blocks may be empty when `ranks > len`.
pub(crate) fn blocks(len: usize, ranks: usize) -> Vec<Range<usize>> {
    let (base, extra) = (len / ranks, len % ranks);
    let mut start = 0;
    (0..ranks)
        .map(|r| {
            let end = start + base + usize::from(r < extra);
            let block = start..end;
            start = end;
            block
        })
        .collect()
}

/// One kind of collective: how many ran and the bytes they delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Traffic {
    pub count: usize,
    /// The size of every gathered result (NCCL's `recvbuff`), summed.
    pub bytes: usize,
}

impl Traffic {
    fn add(&mut self, bytes: usize) {
        self.count += 1;
        self.bytes += bytes;
    }
}

/// The collectives of the forwards since the log was last taken, by the op that needs them. With
/// one rank nothing is communicated and nothing is logged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CollectiveLog {
    /// The embedding rows, each from the rank holding its vocabulary block: an all-gather of `[T, hidden]`.
    pub embedding: Traffic,
    /// Every linear's column blocks: an all-gather of `[T, N]` f32.
    pub linear: Traffic,
    /// Expert-parallel MoE: each rank's experts' outputs for their `(token, slot)`s, gathered
    /// (`pairs * hidden` f32 per layer).
    pub moe: Traffic,
    /// Attention by heads: each rank's heads' outputs, all-gathered (`[T, heads * v]` f32).
    pub attention: Traffic,
    /// Vocabulary-parallel argmax: each rank's `(max, index)` per row (8 bytes a rank a row).
    pub argmax: Traffic,
}

/// Which op a collective serves.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Embedding,
    Linear,
    Moe,
    Attention,
    Argmax,
}

impl CollectiveLog {
    pub(crate) fn record(&mut self, op: Op, bytes: usize) {
        match op {
            Op::Embedding => self.embedding.add(bytes),
            Op::Linear => self.linear.add(bytes),
            Op::Moe => self.moe.add(bytes),
            Op::Attention => self.attention.add(bytes),
            Op::Argmax => self.argmax.add(bytes),
        }
    }

    /// Every kind together.
    pub fn total(&self) -> Traffic {
        [self.embedding, self.linear, self.moe, self.attention, self.argmax]
            .iter()
            .fold(Traffic::default(), |a, t| Traffic { count: a.count + t.count, bytes: a.bytes + t.bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_dimension_in_order_and_differ_by_at_most_one() {
        for len in 0..20 {
            for ranks in 1..10 {
                let b = blocks(len, ranks);
                assert_eq!(b.len(), ranks);
                assert_eq!(b[0].start, 0);
                assert_eq!(b[ranks - 1].end, len);
                assert!(b.windows(2).all(|w| w[0].end == w[1].start && w[0].len() >= w[1].len()));
                assert!(b[0].len() - b[ranks - 1].len() <= 1);
            }
        }
        assert_eq!(blocks(10, 4), [0..3, 3..6, 6..8, 8..10]);
    }
}
