//! Multi-head latent attention (DeepSeek-V3 `DeepseekV3Attention`): queries through the low-rank
//! `q_a_proj` -> `q_a_layernorm` -> `q_b_proj` (or one `q_proj`); keys and values from the shared
//! latent `kv_a_proj_with_mqa` -> `kv_a_layernorm` -> `kv_b_proj`, plus one rotary key part shared
//! by all heads. Each head's query and key are `[nope | rope]`, in that order.

use super::cache::KvCache;
use super::checkpoint::Checkpoint;
use super::config::Config;
use crate::error::Result;
use crate::mask::TreeMask;
use crate::ops::cpu::{AttentionShape, RopeTable};
use crate::registry::{LinearWeight, OpRegistry, RopeLayout};

#[derive(Clone, Debug)]
enum QueryProj {
    Direct(LinearWeight),
    LowRank { a: LinearWeight, norm: Vec<f32>, b: LinearWeight },
}

#[derive(Clone, Debug)]
pub(crate) struct Attention {
    q: QueryProj,
    kv_a: LinearWeight,
    kv_a_norm: Vec<f32>,
    kv_b: LinearWeight,
    o: LinearWeight,
}

/// What one attention call needs besides the weights.
pub(crate) struct AttnCtx<'a> {
    pub config: &'a Config,
    pub ops: &'a OpRegistry,
    pub rope: &'a RopeTable,
    pub scale: f32,
    pub positions: &'a [usize],
    pub mask: &'a TreeMask,
}

impl Attention {
    pub fn load(ckpt: &Checkpoint, c: &Config, prefix: &str) -> Result<Self> {
        let (h, heads) = (c.hidden_size, c.num_attention_heads);
        let linear = |name: &str, n, k| {
            let module = format!("{prefix}.{name}");
            ckpt.linear(&module, n, k, c.quant_group(&module))
        };
        let q_out = heads * c.qk_head_dim();
        let q = match c.q_lora_rank {
            None => QueryProj::Direct(linear("q_proj", q_out, h)?),
            Some(r) => QueryProj::LowRank {
                a: linear("q_a_proj", r, h)?,
                norm: ckpt.tensor(&format!("{prefix}.q_a_layernorm.weight"), &[r])?,
                b: linear("q_b_proj", q_out, r)?,
            },
        };
        Ok(Self {
            q,
            kv_a: linear("kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, h)?,
            kv_a_norm: ckpt.tensor(&format!("{prefix}.kv_a_layernorm.weight"), &[c.kv_lora_rank])?,
            kv_b: linear("kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)?,
            o: linear("o_proj", h, heads * c.v_head_dim)?,
        })
    }

    pub fn linears_mut(&mut self) -> Vec<&mut LinearWeight> {
        let mut all = match &mut self.q {
            QueryProj::Direct(w) => vec![w],
            QueryProj::LowRank { a, b, .. } => vec![a, b],
        };
        all.extend([&mut self.kv_a, &mut self.kv_b, &mut self.o]);
        all
    }

    /// Attends the `n` normalised hidden rows `x` to the cache of layer `layer` plus themselves,
    /// appending their keys and values to it. Returns `[n, hidden]`.
    pub fn forward(&self, x: &[f32], layer: usize, cache: &mut KvCache, cx: &AttnCtx<'_>) -> Result<Vec<f32>> {
        let (c, ops) = (cx.config, cx.ops);
        let n = cx.positions.len();
        let (heads, nope, rope, vd) = (c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
        let qk = nope + rope;
        let layout = if c.rope_interleave { RopeLayout::Interleaved } else { RopeLayout::HalfSplit };

        let mut q = match &self.q {
            QueryProj::Direct(w) => ops.linear(x, n, w)?,
            QueryProj::LowRank { a, norm, b } => {
                let qa = ops.rmsnorm(&ops.linear(x, n, a)?, norm, c.rms_norm_eps);
                ops.linear(&qa, n, b)?
            }
        };
        // The rotary part of every head, gathered, rotated and put back.
        let mut q_rope: Vec<f32> = q.chunks_exact(qk).flat_map(|head| head[nope..].to_vec()).collect();
        ops.rope(&mut q_rope, rope, cx.positions, cx.rope, layout);
        for (head, r) in q.chunks_exact_mut(qk).zip(q_rope.chunks_exact(rope)) {
            head[nope..].copy_from_slice(r);
        }

        let kv_a = ops.linear(x, n, &self.kv_a)?;
        let width = c.kv_lora_rank + rope;
        let latent: Vec<f32> = kv_a.chunks_exact(width).flat_map(|r| r[..c.kv_lora_rank].to_vec()).collect();
        let mut k_rope: Vec<f32> = kv_a.chunks_exact(width).flat_map(|r| r[c.kv_lora_rank..].to_vec()).collect();
        ops.rope(&mut k_rope, rope, cx.positions, cx.rope, layout);
        let kv = ops.linear(&ops.rmsnorm(&latent, &self.kv_a_norm, c.rms_norm_eps), n, &self.kv_b)?;

        let (mut k, mut v) = (Vec::with_capacity(n * heads * qk), Vec::with_capacity(n * heads * vd));
        for (t, row) in kv.chunks_exact(heads * (nope + vd)).enumerate() {
            for head in row.chunks_exact(nope + vd) {
                k.extend_from_slice(&head[..nope]);
                k.extend_from_slice(&k_rope[t * rope..(t + 1) * rope]);
                v.extend_from_slice(&head[nope..]);
            }
        }
        let past = cache.len();
        cache.append(layer, &k, &v);
        let kv = cache.layer(layer);
        let shape = AttentionShape { heads, qk_dim: qk, v_dim: vd, scale: cx.scale };
        let out = ops.attention(&q, &kv.k, &kv.v, past, cx.mask, shape);
        ops.linear(&out, n, &self.o)
    }
}
