//! What `kdtree-engine bench` measures: per-forward time of a model on the GPU at T = 1, 2, 3, 4,
//! 6, 8, ... tokens after a context, against the floor that the bytes the forward must read set at
//! the copy bandwidth measured in the same run.
//!
//! A forward must read every dense weight once (attention, dense MLPs, shared experts, routers, the
//! LM head), every routed expert that some token of the forward routes to once per MoE layer, and
//! the KV cache entries its rows attend to; activations are negligible at these T.

use serde::Serialize;

use crate::model::WeightBytes;

/// One (context, T) row of the bench.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ForwardRow {
    /// Tokens in the cache before the forward.
    pub context: usize,
    /// Tokens in the forward (the tree's nodes).
    pub t: usize,
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    /// Distinct routed experts per MoE layer, averaged over the layers of the one profiled forward.
    pub experts_per_layer: f64,
    pub bytes: ReadBytes,
    /// `bytes.total / copy bandwidth`.
    pub floor_us: f64,
    pub pct_of_floor: f64,
    /// GPU time by op class in one profiled forward (CUDA events around each op; a wait for the host
    /// before an op counts in its time).
    pub split_us: Vec<(String, f64)>,
}

impl ForwardRow {
    /// The share of the profiled forward's GPU time spent in attention (with its cache writes).
    pub(crate) fn attention_share(&self) -> f64 {
        let total: f64 = self.split_us.iter().map(|(_, us)| us).sum();
        let attention: f64 = self.split_us.iter().filter(|(c, _)| c == "attention").map(|(_, us)| us).sum();
        if total > 0.0 { attention / total } else { 0.0 }
    }
}

/// One context of the bench: its prefill and its greedy decode.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ContextRow {
    pub context: usize,
    /// The whole prompt's prefill, chunked, timed with CUDA events.
    pub prefill_us: f64,
    pub prefill_tokens_per_s: f64,
    /// Greedy one-token forwards after the context.
    pub decode_tokens_per_s: Option<f64>,
    /// KV bytes one token adds over every layer.
    pub kv_bytes_per_token: usize,
}

/// The bytes one forward reads, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ReadBytes {
    pub dense: usize,
    pub lm_head: usize,
    pub experts: usize,
    pub kv: usize,
    pub total: usize,
}

impl ReadBytes {
    /// The bytes of a forward over `entries` cache entries (context and new tokens) of `kv_entry`
    /// bytes each, touching `experts_per_layer` experts in each MoE layer.
    pub fn of(w: &WeightBytes, experts_per_layer: f64, entries: usize, kv_entry: usize) -> ReadBytes {
        let experts = (experts_per_layer * (w.moe_layers * w.expert) as f64).round() as usize;
        let kv = entries * kv_entry;
        ReadBytes { dense: w.dense, lm_head: w.lm_head, experts, kv, total: w.dense + w.lm_head + experts + kv }
    }

    /// Microseconds to move these bytes at `gbps` GB/s.
    pub fn floor_us(&self, gbps: f64) -> f64 {
        self.total as f64 / (gbps * 1e3)
    }
}

/// The peak resident set of this process so far, bytes (Linux `VmHWM`; `None` elsewhere).
pub fn peak_rss() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim();
    kb.parse::<usize>().ok().map(|kb| kb * 1024)
}

/// The Ts of a sweep, up to `max`: powers of two and the halves between them (3, 6, 12, ..). They
/// are also the cost model's points, the tree sizes cost-aware DDTree may choose from.
pub fn sweep(max: usize) -> Vec<usize> {
    let powers = std::iter::successors(Some(1usize), |t| t.checked_mul(2)).take_while(|&t| t <= max);
    let mut ts: Vec<usize> = powers.flat_map(|t| [t, t + t / 2]).filter(|&t| t <= max).collect();
    ts.dedup();
    ts
}

/// The per-context table for people: prefill and decode speed.
pub fn context_table(rows: &[ContextRow]) -> String {
    let mut t = crate::table::table(
        &["context", "prefill ms", "prefill tokens/s", "decode tokens/s", "KV bytes a token"],
        &[0, 1, 2, 3, 4],
    );
    for r in rows {
        t.add_row(vec![
            r.context.to_string(),
            format!("{:.1}", r.prefill_us / 1e3),
            format!("{:.0}", r.prefill_tokens_per_s),
            r.decode_tokens_per_s.map_or("-".into(), |v| format!("{v:.1}")),
            r.kv_bytes_per_token.to_string(),
        ]);
    }
    format!("{t}\n")
}

/// A table for people.
pub fn table(rows: &[ForwardRow], copy_gbps: f64) -> String {
    let header = [
        "context",
        "T",
        "median us",
        "p10",
        "p90",
        "experts",
        "MB read",
        "KV MB",
        "floor us",
        "% floor",
        "attention",
        "split (GPU us by op class)",
    ];
    let mut t = crate::table::table(&header, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    for r in rows {
        // The six largest classes; the JSON has them all.
        let split: Vec<String> = r.split_us.iter().take(6).map(|(c, us)| format!("{c} {us:.0}")).collect();
        t.add_row(vec![
            r.context.to_string(),
            r.t.to_string(),
            format!("{:.1}", r.median_us),
            format!("{:.1}", r.p10_us),
            format!("{:.1}", r.p90_us),
            format!("{:.1}", r.experts_per_layer),
            format!("{:.1}", r.bytes.total as f64 / 1e6),
            format!("{:.1}", r.bytes.kv as f64 / 1e6),
            format!("{:.1}", r.floor_us),
            format!("{:.1}%", r.pct_of_floor),
            format!("{:.0}%", 100.0 * r.attention_share()),
            split.join(", "),
        ]);
    }
    format!("copy bandwidth {copy_gbps:.0} GB/s (read + write), measured in this run\n{t}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_count_dense_weights_once_and_experts_per_touch() {
        let w = WeightBytes { dense: 1000, lm_head: 500, expert: 10, moe_layers: 2, experts_per_layer: 64, int4: 0 };
        let b = ReadBytes::of(&w, 8.0, 3, 4);
        assert_eq!(b, ReadBytes { dense: 1000, lm_head: 500, experts: 160, kv: 12, total: 1672 });
        assert!((b.floor_us(1.0) - 1.672).abs() < 1e-12);
        assert_eq!(sweep(128), [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]);
        assert_eq!(sweep(5), [1, 2, 3, 4]);
        assert_eq!(sweep(1), [1]);
    }

    #[test]
    fn the_table_has_a_line_per_row_with_its_figures() {
        let w = WeightBytes { dense: 1000, lm_head: 500, expert: 10, moe_layers: 2, experts_per_layer: 64, int4: 0 };
        let row = |t| ForwardRow {
            context: 64,
            t,
            median_us: 2000.0,
            p10_us: 1900.0,
            p90_us: 2100.0,
            experts_per_layer: 8.0,
            bytes: ReadBytes::of(&w, 8.0, 3, 4),
            floor_us: 1000.0,
            pct_of_floor: 50.0,
            split_us: vec![("moe".into(), 600.0), ("attention".into(), 200.0)],
        };
        let text = table(&[row(1), row(2)], 4000.0);
        assert_eq!(text.lines().count(), 1 + 2 + 2, "{text}");
        assert!(text.contains("4000 GB/s") && text.contains("50.0%") && text.contains("moe 600"), "{text}");
        assert_eq!(row(1).attention_share(), 0.25);
        let ctx = ContextRow {
            context: 4096,
            prefill_us: 2e6,
            prefill_tokens_per_s: 2048.0,
            decode_tokens_per_s: None,
            kv_bytes_per_token: 2304,
        };
        let text = context_table(&[ctx]);
        assert!(text.contains("2000.0") && text.contains("2304") && text.contains(" - "), "{text}");
    }
}
