//! The context cache and one drafting round, written once over the target's backend's ops: on the
//! CPU they are the reference ops, on CUDA the drafter's layers stay on the GPU.

use super::weights::{DflashModel, Layer};
use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use crate::model::Model;
use crate::registry::{Backend, GqaShape, LogitTransform, RopeLayout, RopeSpan, RowStore, Shaped};

/// Every committed token's keys and values, per drafter layer: `k_norm`ed and rotated keys, values,
/// each rows of `kv_heads * head_dim` on the backend. Token `i` sits at position `i`.
pub struct DflashContext<B: Backend> {
    keys: Vec<B::Rows>,
    values: Vec<B::Rows>,
    len: usize,
}

impl<B: Backend> DflashContext<B> {
    /// Committed tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the first `len` tokens (no-op when it holds fewer).
    pub fn truncate(&mut self, len: usize) {
        self.keys.iter_mut().chain(self.values.iter_mut()).for_each(|rows| rows.truncate(len));
        self.len = self.len.min(len);
    }
}

impl<B: Backend> DflashModel<B> {
    /// An empty context.
    pub fn new_context(&self) -> Result<DflashContext<B>> {
        let width = self.shape().kv_width();
        let rows = || (0..self.layers.len()).map(|_| self.backend.new_rows(width)).collect::<Result<Vec<_>>>();
        Ok(DflashContext { keys: rows()?, values: rows()?, len: 0 })
    }

    /// Appends the committed tokens whose target features are `taps` (`[tokens, tap_width]` on the
    /// backend: the target's hidden states after each of `target_layer_ids`, in that order), at the
    /// positions after the context's.
    pub fn extend_context(&self, ctx: &mut DflashContext<B>, taps: &B::Tensor) -> Result<()> {
        let (c, b) = (&self.config, &*self.backend);
        if taps.cols() != c.tap_width() {
            return Err(EngineError::shape(
                "DFlash context",
                format!(
                    "taps of {} values a token, not {} ({} target layers x hidden {})",
                    taps.cols(),
                    c.tap_width(),
                    c.target_layer_ids.len(),
                    c.hidden_size
                ),
            ));
        }
        let rows = taps.rows();
        let batch = self.batch(ctx.len, rows)?;
        let features = b.linear(taps, &self.fc)?;
        let features = b.rmsnorm(&features, &self.hidden_norm, c.rms_norm_eps)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let (k, v) = self.keys_values(layer, &features, &batch)?;
            b.append_rows(&mut ctx.keys[i], &k)?;
            b.append_rows(&mut ctx.values[i], &v)?;
        }
        ctx.len += rows;
        Ok(())
    }

    /// One round: the block `[bonus, mask × (block_size − 1)]` at the positions after `ctx`, run through
    /// the drafter over `ctx` and itself, read through `target`'s LM head: the block's raw logits
    /// `[block_size, vocab]`, on the backend, before the config's transform ([`Self::transform`]). Row
    /// `i` drafts the token `i` places after `bonus`; row 0 (the bonus's own) drafts nothing.
    pub(crate) fn block_logits(&self, target: &Model<B>, ctx: &DflashContext<B>, bonus: u32) -> Result<B::Tensor> {
        let (c, b) = (&self.config, &*self.backend);
        let n = c.block_size;
        let batch = self.batch(ctx.len, n)?;
        let block: Vec<u32> = std::iter::once(bonus).chain(std::iter::repeat_n(c.mask_token_id, n - 1)).collect();
        let mut x = target.embed(&block)?;
        if c.input_embedding_scale != 1.0 {
            // Rare (the published configs leave it at 1): scaled on the host rather than by a kernel.
            let mut host = b.to_host(&x)?;
            host.iter_mut().for_each(|v| *v *= c.input_embedding_scale);
            x = b.upload(&host, c.hidden_size)?;
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let h = b.rmsnorm(&x, &layer.input_norm, c.rms_norm_eps)?;
            let attn = self.attend(layer, &h, &batch, [&ctx.keys[i], &ctx.values[i]])?;
            b.add_assign(&mut x, &b.linear(&attn, &layer.o_proj)?)?;
            let h = b.rmsnorm(&x, &layer.post_norm, c.rms_norm_eps)?;
            let act = b.silu_mul(&b.linear(&h, &layer.gate_up)?, &layer.down_proj)?;
            b.add_assign(&mut x, &b.linear(&act, &layer.down_proj)?)?;
        }
        target.lm_head(&b.rmsnorm(&x, &self.norm, c.rms_norm_eps)?)
    }

    /// `Self::block_logits` on the host, transformed, without the bonus row: `[block_size − 1,
    /// vocab]`, the logits the reference implementation reports.
    pub fn draft_logits(&self, target: &Model<B>, ctx: &DflashContext<B>, bonus: u32) -> Result<Vec<f32>> {
        let mut logits = self.backend.to_host(&self.block_logits(target, ctx, bonus)?)?;
        logits.drain(..target.config.vocab_size);
        let transform = self.transform();
        logits.iter_mut().for_each(|v| *v = transform.apply(*v));
        Ok(logits)
    }

    /// How the logits become scores: the config's `output_multiplier` and `final_logit_softcapping`.
    pub(crate) fn transform(&self) -> LogitTransform {
        LogitTransform { multiplier: self.config.output_multiplier, softcap: self.config.final_logit_softcapping }
    }

    /// The block's attention output `[rows, heads * head_dim]` over the context `[keys, values]` and itself.
    fn attend(&self, layer: &Layer<B>, h: &B::Tensor, batch: &B::Batch, ctx: [&B::Rows; 2]) -> Result<B::Tensor> {
        let b = &*self.backend;
        let q = b.linear(h, &layer.q_proj)?;
        let q = self.head_norm_rope(q, self.shape().q_width(), &layer.q_norm, batch)?;
        let (k, v) = self.keys_values(layer, h, batch)?;
        b.gqa_attention(&q, ctx, [&k, &v], self.shape())
    }

    /// A layer's keys (`k_norm`ed, rotated) and values of the rows of `x` at the batch's positions.
    fn keys_values(&self, layer: &Layer<B>, x: &B::Tensor, batch: &B::Batch) -> Result<(B::Tensor, B::Tensor)> {
        let b = &*self.backend;
        let width = self.shape().kv_width();
        let kv = b.linear(x, &layer.kv_proj)?;
        let k = self.head_norm_rope(b.columns(&kv, 0, width)?, width, &layer.k_norm, batch)?;
        Ok((k, b.columns(&kv, width, width)?))
    }

    /// Each head of each row of `x` (rows of `cols`) RMSNormed by `weight` (`[head_dim]`), then rotated
    /// whole (half-split pairs) at its row's position.
    fn head_norm_rope(&self, x: B::Tensor, cols: usize, weight: &B::Vector, batch: &B::Batch) -> Result<B::Tensor> {
        let (b, hd) = (&*self.backend, self.config.head_dim);
        let heads = b.reshape(x, hd)?;
        let mut x = b.reshape(b.rmsnorm(&heads, weight, self.config.rms_norm_eps)?, cols)?;
        let span = RopeSpan { stride: hd, offset: 0, dim: hd, layout: RopeLayout::HalfSplit };
        b.rope(&mut x, span, &self.rope.cos, &self.rope.sin, batch)?;
        Ok(x)
    }

    fn shape(&self) -> GqaShape {
        let c = &self.config;
        GqaShape { heads: c.num_attention_heads, kv_heads: c.num_key_value_heads, head_dim: c.head_dim }
    }

    /// The batch of `rows` rows at positions `start..start + rows`, all inside the rotary table: what
    /// rope reads.
    fn batch(&self, start: usize, rows: usize) -> Result<B::Batch> {
        let max = self.rope.max_positions;
        if start + rows > max {
            return Err(EngineError::PositionOutOfRange { position: start + rows - 1, max });
        }
        let positions: Vec<usize> = (start..start + rows).collect();
        self.backend.batch(&vec![0; rows], &positions, &TreeMask::causal(rows), start)
    }
}
