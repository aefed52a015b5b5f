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
use crate::registry::{Backend, Heads, Rope, RopeLayout, RopeSpan};

enum QueryProj<B: Backend> {
    Direct(B::Linear),
    LowRank { a: B::Linear, norm: B::Vector, b: B::Linear },
}

pub(crate) struct Attention<B: Backend> {
    q: QueryProj<B>,
    kv_a: B::Linear,
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
        let host = |name: &str, n, k| {
            let module = format!("{prefix}.{name}");
            ckpt.linear(&module, n, k, c.quant_group(&module)).map(|w| (module, w))
        };
        let kv_b = {
            let (module, w) = host("kv_b_proj", heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)?;
            bytes.dense(&w);
            be.absorb(&module, &w, heads_layout)?
        };
        let mut linear = |name: &str, n, k| {
            let (module, w) = host(name, n, k)?;
            bytes.dense(&w);
            be.linear_weight(&module, w)
        };
        let q_out = heads * c.qk_head_dim();
        let q = match c.q_lora_rank {
            None => QueryProj::Direct(linear("q_proj", q_out, h)?),
            Some(r) => {
                let a = linear("q_a_proj", r, h)?;
                let b = linear("q_b_proj", q_out, r)?;
                QueryProj::LowRank {
                    a,
                    norm: be.vector(&ckpt.tensor(&format!("{prefix}.q_a_layernorm.weight"), &[r])?)?,
                    b,
                }
            }
        };
        Ok(Self {
            q,
            kv_a: linear("kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, h)?,
            kv_b,
            o: linear("o_proj", h, heads * c.v_head_dim)?,
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
        let mut q = match &self.q {
            QueryProj::Direct(w) => checked("q_proj", b.linear(x, w)?)?,
            QueryProj::LowRank { a, norm, b: wb } => {
                let qa = checked("q_a_proj", b.linear(x, a)?)?;
                let qa = checked("q_a_layernorm", b.rmsnorm(&qa, norm, c.rms_norm_eps)?)?;
                checked("q_b_proj", b.linear(&qa, wb)?)?
            }
        };
        // Each head's query is [nope | rope]: rotate the rope part in place.
        b.rope(&mut q, RopeSpan { stride: nope + r, offset: nope, dim: r, layout }, &rope.cos, &rope.sin, batch)?;
        probe.check(&q, "self_attn.q after rope")?;
        // kv_a is [latent | k_rope]: the latent is normalised, the rope part rotated; both are cached.
        let kv_a = checked("kv_a_proj_with_mqa", b.linear(x, &self.kv_a)?)?;
        let latent = b.rmsnorm(&b.columns(&kv_a, 0, c.kv_lora_rank)?, &self.kv_a_norm, c.rms_norm_eps)?;
        let latent = checked("kv_a_layernorm", latent)?;
        let mut k_rope = b.columns(&kv_a, c.kv_lora_rank, r)?;
        b.rope(&mut k_rope, RopeSpan { stride: r, offset: 0, dim: r, layout }, &rope.cos, &rope.sin, batch)?;
        probe.check(&k_rope, "self_attn.k_rope after rope")?;
        b.kv_append(cache, layer, &latent, &k_rope, batch)?;
        let out = checked("attention", b.attention(&q, cache, layer, batch, &self.kv_b)?)?;
        checked("o_proj", b.linear(&out, &self.o)?)
    }
}
