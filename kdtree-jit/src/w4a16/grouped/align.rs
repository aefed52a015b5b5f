//! The assignments of an MoE layer sorted by expert and cut into tiles: what the grouped kernel reads.
//! The GPU builds them (kdtree-kernels' `moe_align`, no host sync); this is the same computation on the
//! CPU, its reference, and what the grouped kernel's own tests feed it.
//!
//! An assignment is `a = t * top_k + j`, token t's j-th expert `ids[a]`. Sorted by (expert, a), each
//! expert's run is cut into tiles of at most `bm` rows: entries (expert, start, rows) where `start` is
//! the tile's first position in the sorted list, tiles in (expert, start) order.

/// `(expert, start, rows)`: rows `start..start + rows` of the sorted list, all routed to `expert`.
pub(crate) type Tile = [u32; 3];

/// The sorted assignments and their tiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alignment {
    /// Assignment indices ordered by (expert, index); those with an id >= the experts come last.
    pub sorted: Vec<u32>,
    /// `experts + 1` entries: expert e's assignments are `sorted[offsets[e]..offsets[e + 1]]`;
    /// `offsets[experts]` is the count of valid assignments.
    pub offsets: Vec<u32>,
    pub tiles: Vec<Tile>,
    /// Experts with at least one assignment.
    pub experts_touched: usize,
    /// Assignments whose id is not an expert: sorted last, in no tile (their rows are not computed).
    pub invalid: usize,
}

/// The most tiles `assignments` assignments over `experts` experts can need with tiles of `bm` rows,
/// whatever the routing. An expert with c > 0 assignments needs ceil(c / bm) <= floor(c / bm) + 1
/// tiles, one with none needs 0, so over the non-empty experts, at most min(experts, assignments) of
/// them, the tiles number at most min(experts, assignments) + sum floor(c_e / bm), and the sum of
/// floors is at most the floor of the sum, floor(assignments / bm). Not tight (each expert's
/// remainder counts once in the first term and again in the second), but within min(experts,
/// assignments) of the truth, and the grid's idle blocks return at once.
pub fn tile_bound(experts: usize, assignments: usize, bm: usize) -> usize {
    experts.min(assignments) + assignments / bm.max(1)
}

/// [`Alignment`] of `ids` (`[tokens * top_k]`, any order within a token) over `experts` experts.
pub fn align(ids: &[u32], experts: usize, bm: usize) -> Alignment {
    let bucket = |id: u32| (id as usize).min(experts);
    let mut count = vec![0usize; experts + 1];
    for &id in ids {
        count[bucket(id)] += 1;
    }
    let mut offsets = Vec::with_capacity(experts + 2);
    let mut sum = 0;
    for c in &count {
        offsets.push(sum as u32);
        sum += c;
    }
    let mut next: Vec<usize> = offsets.iter().map(|&o| o as usize).collect();
    let mut sorted = vec![0u32; ids.len()];
    for (a, &id) in ids.iter().enumerate() {
        let b = bucket(id);
        sorted[next[b]] = a as u32;
        next[b] += 1;
    }
    let bm = bm.max(1);
    let mut tiles = Vec::new();
    for (e, &c) in count[..experts].iter().enumerate() {
        let start = offsets[e] as usize;
        for first in (0..c).step_by(bm) {
            tiles.push([e as u32, (start + first) as u32, bm.min(c - first) as u32]);
        }
    }
    Alignment {
        sorted,
        offsets,
        tiles,
        experts_touched: count[..experts].iter().filter(|&&c| c > 0).count(),
        invalid: count[experts],
    }
}

impl Alignment {
    /// The expert of sorted position `r`, or `None` past the valid assignments.
    pub fn expert_of(&self, r: usize) -> Option<usize> {
        let experts = self.offsets.len() - 1;
        if r >= self.offsets[experts] as usize {
            return None;
        }
        Some(self.offsets.partition_point(|&o| o as usize <= r) - 1)
    }

    /// The tile table as the kernel reads it: `[tiles][3]` u32.
    pub fn tile_words(&self) -> Vec<u32> {
        self.tiles.iter().flatten().copied().collect()
    }
}

/// Router-like ids for tests, fuzzers and tuning: per token `top_k` distinct experts, ascending (as
/// the `noaux_tc` router writes them). Experts are drawn with weight 1 / (e + 1)^skew: 0 is uniform,
/// larger values give a few hot experts and a long, often empty tail; `hot` puts that expert in every
/// token. Deterministic in `seed`. Needs top_k <= experts (and `hot` below experts).
pub fn sample_routing(
    tokens: usize,
    experts: usize,
    top_k: usize,
    skew: f64,
    hot: Option<usize>,
    seed: u64,
) -> Vec<u32> {
    assert!(top_k <= experts && hot.is_none_or(|h| h < experts), "{top_k} of {experts} experts, hot {hot:?}");
    let mut sample = kdtree_quant::sample::Uniform::new(seed);
    let mut uniform = move || f64::from(sample.next().expect("endless"));
    let weights: Vec<f64> = (0..experts).map(|e| 1.0 / ((e + 1) as f64).powf(skew)).collect();
    let total: f64 = weights.iter().sum();
    let mut ids = Vec::with_capacity(tokens * top_k);
    for _ in 0..tokens {
        let mut picked: Vec<usize> = hot.into_iter().collect();
        while picked.len() < top_k {
            let mut u = uniform() * total;
            let mut e = 0;
            while e + 1 < experts && u >= weights[e] {
                u -= weights[e];
                e += 1;
            }
            // A repeat (likely when skewed) takes another expert, drawn uniformly among the free ones.
            while picked.contains(&e) {
                e = (e + 1 + (uniform() * experts as f64) as usize) % experts;
            }
            picked.push(e);
        }
        picked.sort_unstable();
        ids.extend(picked.iter().map(|&e| e as u32));
    }
    ids
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_small_routing_by_hand() {
        // Three tokens, top-2: t0 -> 1, 3; t1 -> 1, 2; t2 -> 0, 1. Tiles of 2 rows.
        let a = align(&[1, 3, 1, 2, 0, 1], 4, 2);
        assert_eq!(a.sorted, [4, 0, 2, 5, 3, 1]);
        assert_eq!(a.offsets, [0, 1, 4, 5, 6]);
        assert_eq!(a.tiles, [[0, 0, 1], [1, 1, 2], [1, 3, 1], [2, 4, 1], [3, 5, 1]]);
        assert_eq!((a.experts_touched, a.invalid), (4, 0));
        assert_eq!(a.expert_of(3), Some(1));
        assert_eq!(a.expert_of(6), None);
        assert!(a.tiles.len() <= tile_bound(4, 6, 2));
    }

    #[test]
    fn ids_past_the_experts_sort_last_in_no_tile() {
        let a = align(&[2, 9, 0, 2], 3, 8);
        assert_eq!(a.sorted, [2, 0, 3, 1]);
        assert_eq!(a.offsets, [0, 1, 1, 3]);
        assert_eq!(a.tiles, [[0, 0, 1], [2, 1, 2]]);
        assert_eq!((a.experts_touched, a.invalid), (2, 1));
    }

    #[test]
    fn the_bound_holds_for_many_small_experts_and_one_hot_one() {
        // 5 experts, 9 assignments, bm 4: four experts with one each, one with 5 -> 4 + 2 = 6 tiles.
        let a = align(&[0, 1, 2, 3, 4, 4, 4, 4, 4], 5, 4);
        assert_eq!(a.tiles.len(), 6);
        assert_eq!(tile_bound(5, 9, 4), 5 + 2);
        // One expert with everything: ceil(N / bm) tiles.
        assert_eq!(align(&[3; 17], 384, 8).tiles.len(), 3);
        assert_eq!(tile_bound(384, 0, 8), 0);
    }

    #[test]
    fn sampled_routings_look_like_the_routers() {
        let ids = sample_routing(50, 384, 8, 1.5, Some(7), 3);
        assert_eq!(ids.len(), 400);
        for token in ids.chunks_exact(8) {
            assert!(token.windows(2).all(|w| w[0] < w[1]) && token.contains(&7), "{token:?}");
        }
        assert_eq!(ids, sample_routing(50, 384, 8, 1.5, Some(7), 3));
        // Skewed: far fewer experts touched than uniform.
        let touched = |ids: &[u32]| align(ids, 384, 8).experts_touched;
        assert!(touched(&ids) < touched(&sample_routing(50, 384, 8, 0.0, None, 3)));
        assert_eq!(sample_routing(3, 4, 4, 0.0, None, 1), [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]);
    }

    proptest! {
        #[test]
        fn tiles_cover_each_expert_in_order_within_the_bound(
            experts in 1usize..400,
            ids in proptest::collection::vec(0u32..420, 0..600),
            bm in prop::sample::select(vec![1usize, 4, 8, 16]),
        ) {
            let a = align(&ids, experts, bm);
            prop_assert!(a.tiles.len() <= tile_bound(experts, ids.len(), bm));
            // sorted is a permutation, ordered by (bucket, index).
            let key = |i: u32| ((ids[i as usize] as usize).min(experts), i);
            prop_assert!(a.sorted.windows(2).all(|w| key(w[0]) < key(w[1])));
            prop_assert_eq!(a.sorted.len(), ids.len());
            // Tiles partition the valid positions, each within one expert, at most bm rows.
            let mut next = 0u32;
            for &[e, start, rows] in &a.tiles {
                prop_assert_eq!(start, next);
                prop_assert!(rows >= 1 && rows as usize <= bm);
                for r in start..start + rows {
                    prop_assert_eq!(ids[a.sorted[r as usize] as usize], e);
                }
                next += rows;
            }
            prop_assert_eq!(next, a.offsets[experts]);
            prop_assert_eq!(a.invalid, ids.iter().filter(|&&id| id as usize >= experts).count());
        }
    }
}
