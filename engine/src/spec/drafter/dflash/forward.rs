//! The context cache and one drafting round, on the CPU reference ops.

use super::attention::{Shape, attention};
use super::weights::{DflashModel, Layer};
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::ops::cpu::{dense_linear, rmsnorm, rope_half_split, silu_mul};
use crate::registry::Backend;

/// Every committed token's keys and values, per drafter layer: `k_norm`ed and rotated keys, values,
/// each `[tokens, kv_heads * head_dim]`. Token `i` sits at position `i`.
#[derive(Clone, Debug, Default)]
pub struct DflashContext {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
}

impl DflashContext {
    /// Committed tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the first `len` tokens (no-op when it holds fewer).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let keep = |rows: &mut Vec<f32>| rows.truncate(rows.len() / self.len * len);
        self.keys.iter_mut().chain(self.values.iter_mut()).for_each(keep);
        self.len = len;
    }
}

impl DflashModel {
    /// An empty context.
    pub fn new_context(&self) -> DflashContext {
        let layers = self.layers.len();
        DflashContext { keys: vec![Vec::new(); layers], values: vec![Vec::new(); layers], len: 0 }
    }

    /// Appends the committed tokens whose target features are `taps` (`[tokens, tap_width]`: the
    /// target's hidden states after each of `target_layer_ids`, in that order), at the positions after
    /// the context's.
    pub fn extend_context(&self, ctx: &mut DflashContext, taps: &[f32]) -> Result<()> {
        let c = &self.config;
        let width = c.tap_width();
        if !taps.len().is_multiple_of(width) {
            return Err(EngineError::InvalidArgument(format!(
                "DFlash context: {} values are not whole rows of {width} ({} target layers x hidden {})",
                taps.len(),
                c.target_layer_ids.len(),
                c.hidden_size
            )));
        }
        let rows = taps.len() / width;
        let positions = self.positions(ctx.len, rows)?;
        let mut features = dense_linear(taps, rows, &self.fc)?;
        features = norm(&features, &self.hidden_norm, c.rms_norm_eps);
        for (i, layer) in self.layers.iter().enumerate() {
            let (k, v) = self.keys_values(layer, &features, rows, &positions)?;
            ctx.keys[i].extend(k);
            ctx.values[i].extend(v);
        }
        ctx.len += rows;
        Ok(())
    }

    /// One round: the block `[bonus, mask × (block_size − 1)]` at the positions after `ctx`, run through
    /// the drafter over `ctx` and itself, read through `target`'s LM head. Returns the logits of the
    /// `block_size − 1` masked positions, `[block_size − 1, vocab]`: the drafts of the tokens after `bonus`.
    /// The drafter's layers run on the host; the target's embedding and head run on its backend.
    pub fn draft_logits<B: Backend>(&self, target: &Model<B>, ctx: &DflashContext, bonus: u32) -> Result<Vec<f32>> {
        let c = &self.config;
        let n = c.block_size;
        let positions = self.positions(ctx.len, n)?;
        let block: Vec<u32> = std::iter::once(bonus).chain(std::iter::repeat_n(c.mask_token_id, n - 1)).collect();
        let b = &**target.backend();
        let mut x = b.to_host(&target.embed(&block)?)?;
        if x.len() != n * c.hidden_size {
            return Err(EngineError::InvalidArgument(format!(
                "DFlash block: the target's embedding gave {} values, {n} rows of hidden {} were expected",
                x.len(),
                c.hidden_size
            )));
        }
        x.iter_mut().for_each(|v| *v *= c.input_embedding_scale);
        for (i, layer) in self.layers.iter().enumerate() {
            let h = norm(&x, &layer.input_norm, c.rms_norm_eps);
            let attn = self.attend(layer, &h, n, &positions, [&ctx.keys[i], &ctx.values[i]])?;
            add(&mut x, &dense_linear(&attn, n, &layer.o_proj)?);
            let h = norm(&x, &layer.post_norm, c.rms_norm_eps);
            let (gate, up) = (dense_linear(&h, n, &layer.gate_proj)?, dense_linear(&h, n, &layer.up_proj)?);
            let mut act = vec![0f32; gate.len()];
            silu_mul(&gate, &up, &mut act);
            add(&mut x, &dense_linear(&act, n, &layer.down_proj)?);
        }
        // The bonus row drafts nothing: it is the token the target already chose.
        let masked = norm(&x[c.hidden_size..], &self.norm, c.rms_norm_eps);
        let mut logits = b.to_host(&target.lm_head(&b.upload(&masked, c.hidden_size)?)?)?;
        for v in &mut logits {
            *v *= c.output_multiplier;
            if let Some(cap) = c.final_logit_softcapping {
                *v = cap * (*v / cap).tanh();
            }
        }
        Ok(logits)
    }

    /// The block's attention output `[rows, heads * head_dim]` over the context `[keys, values]` and itself.
    fn attend(&self, layer: &Layer, h: &[f32], rows: usize, positions: &[usize], ctx: [&[f32]; 2]) -> Result<Vec<f32>> {
        let c = &self.config;
        let mut q = dense_linear(h, rows, &layer.q_proj)?;
        q = norm(&q, &layer.q_norm, c.rms_norm_eps);
        rope_half_split(&mut q, c.head_dim, positions, &self.rope.cos, &self.rope.sin);
        let (k, v) = self.keys_values(layer, h, rows, positions)?;
        let shape = Shape { heads: c.num_attention_heads, kv_heads: c.num_key_value_heads, head_dim: c.head_dim };
        Ok(attention(&q, [ctx[0], &k], [ctx[1], &v], shape))
    }

    /// A layer's keys (`k_norm`ed, rotated) and values of `rows` rows of `x` at `positions`.
    fn keys_values(&self, layer: &Layer, x: &[f32], rows: usize, positions: &[usize]) -> Result<(Vec<f32>, Vec<f32>)> {
        let c = &self.config;
        let mut k = norm(&dense_linear(x, rows, &layer.k_proj)?, &layer.k_norm, c.rms_norm_eps);
        rope_half_split(&mut k, c.head_dim, positions, &self.rope.cos, &self.rope.sin);
        Ok((k, dense_linear(x, rows, &layer.v_proj)?))
    }

    /// Positions `start..start + rows`, all inside the rotary table.
    fn positions(&self, start: usize, rows: usize) -> Result<Vec<usize>> {
        let max = self.rope.max_positions();
        match start + rows {
            end if end > max => Err(EngineError::PositionOutOfRange { position: end - 1, max }),
            end => Ok((start..end).collect()),
        }
    }
}

/// RMSNorm of every `weight.len()`-wide piece of `x` (rows, or heads of rows).
fn norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    rmsnorm(x, weight, eps, &mut out);
    out
}

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}
