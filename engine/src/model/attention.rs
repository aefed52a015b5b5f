//! Multi-head latent attention (DeepSeek-V3 `DeepseekV3Attention`): queries through the low-rank
//! `q_a_proj` -> `q_a_layernorm` -> `q_b_proj` (or one `q_proj`); keys and values from the shared
//! latent `kv_a_proj_with_mqa` -> `kv_a_layernorm` -> `kv_b_proj`, plus one rotary key part shared
//! by all heads. Each head's query and key are `[nope | rope]`, in that order.
//!
//! The cache keeps only the latent `[c_kv | k_pe]` of each token, and attention runs in the absorbed
//! form of DeepSeek-V3's inference code: `kv_b_proj` is never applied to cached tokens, its key part
//! moves the queries into latent space and its value part takes the outputs back
//! ([`crate::registry::Backend::attention`]).

use super::WeightBytes;
use super::checkpoint::Checkpoint;
use super::config::Config;
use super::probe::Probe;
use crate::error::Result;
use crate::registry::{Backend, Heads, HostLinear, Rope, RopeLayout, RopeSpan};

enum QueryProj<B: Backend> {
    Direct(B::Linear),
    /// `a` is `None` where `q_a_proj` is stacked over `kv_a_proj_with_mqa` ([`Attention::x_a`]).
    LowRank {
        a: Option<B::Linear>,
        norm: B::Vector,
        b: B::Linear,
    },
}

pub(crate) struct Attention<B: Backend> {
    q: QueryProj<B>,
    /// `kv_a_proj_with_mqa`, or `[q_a_proj; kv_a_proj_with_mqa]`: both read the layer's input, so where
    /// their formats stack they are one GEMM (one launch, one pass over x), its first `q_a_rows`
    /// columns the low-rank query's. Every output comes from its own weight row: the same values.
    x_a: B::Linear,
    q_a_rows: usize,
    kv_a_norm: B::Vector,
    kv_b: B::Absorb,
    o: B::Linear,
}

impl<B: Backend> Attention<B> {
    pub fn load(
        ckpt: &Checkpoint,
        c: &Config,
        be: &B,
        prefix: &str,
        heads_layout: Heads,
        bytes: &mut WeightBytes,
    ) -> Result<Self> {
        let (h, heads) = (c.hidden_size, c.num_attention_heads);
        let mut host = |name: &str, n, k| {
            let module = format!("{prefix}.{name}");
            let w = ckpt.linear(&module, n, k, c.quant_group(&module))?;
            bytes.dense(&w);
            Ok::<_, crate::error::EngineError>((module, w))
        };
        let (kv_b_module, kv_b) = host("kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)?;
        let kv_b = be.absorb(&kv_b_module, &kv_b, heads_layout)?;
        let (kv_a_module, kv_a) = host("kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, h)?;
        let q_out = heads * c.qk_head_dim();
        let (q, x_a, q_a_rows) = match c.q_lora_rank {
            None => {
                let (module, w) = host("q_proj", q_out, h)?;
                (QueryProj::Direct(be.linear_weight(&module, w)?), be.linear_weight(&kv_a_module, kv_a)?, 0)
            }
            Some(r) => {
                let (q_a_module, q_a) = host("q_a_proj", r, h)?;
                let (b_module, b) = host("q_b_proj", q_out, r)?;
                let norm = be.vector(&ckpt.tensor(&format!("{prefix}.q_a_layernorm.weight"), &[r])?)?;
                let b = be.linear_weight(&b_module, b)?;
                if q_a.same_format(&kv_a) {
                    let fused = HostLinear::stack(q_a, kv_a)?;
                    let x_a = be.linear_weight(&format!("{prefix}.q_a_kv_a_proj"), fused)?;
                    (QueryProj::LowRank { a: None, norm, b }, x_a, r)
                } else {
                    let a = Some(be.linear_weight(&q_a_module, q_a)?);
                    (QueryProj::LowRank { a, norm, b }, be.linear_weight(&kv_a_module, kv_a)?, 0)
                }
            }
        };
        Ok(Self {
            q,
            x_a,
            q_a_rows,
            kv_b,
            o: {
                let (module, w) = host("o_proj", h, heads * c.v_head_dim)?;
                be.linear_weight(&module, w)?
            },
            kv_a_norm: be.vector(&ckpt.tensor(&format!("{prefix}.kv_a_layernorm.weight"), &[c.kv_lora_rank])?)?,
        })
    }

    /// Attends the batch's normalised hidden rows `x` to the cache of layer `layer` plus themselves,
    /// appending their latent entries to it. Returns `[n, hidden]`. `probe` checks each op's output.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        b: &B,
        c: &Config,
        rope: &Rope<B>,
        x: &B::Tensor,
        layer: usize,
        cache: &mut B::Cache,
        batch: &B::Batch,
        probe: &Probe<'_, B>,
    ) -> Result<B::Tensor> {
        let (nope, r) = (c.qk_nope_head_dim, c.qk_rope_head_dim);
        let layout = if c.rope_interleave { RopeLayout::Interleaved } else { RopeLayout::HalfSplit };
        let checked = |op: &str, x: B::Tensor| probe.check(&x, format_args!("self_attn.{op}")).map(|()| x);
        let x_a = b.linear(x, &self.x_a)?;
        let mut q = match &self.q {
            QueryProj::Direct(w) => checked("q_proj", b.linear(x, w)?)?,
            QueryProj::LowRank { a, norm, b: wb } => {
                let eps = c.rms_norm_eps;
                let qa = match a {
                    Some(a) => {
                        let qa = checked("q_a_proj", b.linear(x, a)?)?;
                        b.rmsnorm(&qa, norm, eps)?
                    }
                    // The first q_a_rows columns of x_a, normalised where they lie.
                    None => {
                        probe.check_made(|| b.columns(&x_a, 0, self.q_a_rows), "self_attn.q_a_proj")?;
                        b.rmsnorm_columns(&x_a, (0, self.q_a_rows), norm, eps)?
                    }
                };
                let qa = checked("q_a_layernorm", qa)?;
                checked("q_b_proj", b.linear(&qa, wb)?)?
            }
        };
        // Each head's query is [nope | rope]: rotate the rope part in place.
        b.rope(&mut q, RopeSpan { stride: nope + r, offset: nope, dim: r, layout }, &rope.cos, &rope.sin, batch)?;
        probe.check(&q, "self_attn.q after rope")?;
        // kv_a is [latent | k_rope], columns q_a_rows.. of x_a: the latent is normalised where it lies,
        // the rope part copied out and rotated; both are cached.
        let kv_a = self.q_a_rows;
        probe.check_made(|| b.columns(&x_a, kv_a, c.kv_lora_rank + r), "self_attn.kv_a_proj_with_mqa")?;
        let latent = b.rmsnorm_columns(&x_a, (kv_a, c.kv_lora_rank), &self.kv_a_norm, c.rms_norm_eps)?;
        let latent = checked("kv_a_layernorm", latent)?;
        let mut k_rope = b.columns(&x_a, kv_a + c.kv_lora_rank, r)?;
        b.rope(&mut k_rope, RopeSpan { stride: r, offset: 0, dim: r, layout }, &rope.cos, &rope.sin, batch)?;
        probe.check(&k_rope, "self_attn.k_rope after rope")?;
        b.kv_append(cache, layer, &latent, &k_rope, batch)?;
        let out = checked("attention", b.attention(&q, cache, layer, batch, &self.kv_b)?)?;
        checked("o_proj", b.linear(&out, &self.o)?)
    }
}
