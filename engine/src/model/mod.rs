//! The DeepSeek-V3 architecture as Kimi K2 uses it, loaded from a Hugging Face-style folder
//! (`config.json`, safetensors shards, optionally `model.safetensors.index.json`).
//!
//! What checks it (tests under `engine/tests/`):
//!
//! | part | reference |
//! |---|---|
//! | whole forward: MLA (q_lora and q_proj), interleaved and half-split rope, YaRN and its mscale², dense MLP, MoE with shared experts, INT4 unpacking | a NumPy float64 transcription of transformers' `modeling_deepseek_v3.py` (`reference.rs`, agreement 5e-7 of the logits' scale) |
//! | routing, ties included | a scalar re-implementation of the `noaux_tc` router (`routing.rs`) |
//! | INT4 experts | the same checkpoint with dequantized f32 weights, bitwise (`int4.rs`) |
//! | KV cache, tree masks, compaction | one-token forwards, bitwise (`model.rs`) |
//!
//! Not supported yet: FP8 (block-quantized) checkpoints such as DeepSeek-V3's own release, softmax
//! scoring and the older `greedy`/`group_limited_greedy` routers, rope scaling other than YaRN.
//!
//! Every forward checks that its logits are finite ([`Model::forward`], [`Model::forward_argmax`],
//! and so greedy and DDTree decoding): a NaN or an infinity in a weight (one embedding row, one INT4
//! scale) would otherwise decode as token 0 forever. When some are not, the forward runs again with
//! every op's output checked, and the error names the first op whose output is not finite:
//! `layer 1 moe: 3 of 192 values are not finite ...`, or `embedding: ...` (see `probe`).
//!
//! Loading maps the shards and hands each weight to the backend as it is read (bf16 weights stay
//! bf16; an INT4 weight's three tensors may sit in different shards), dropping the mapped pages of
//! every tensor once copied, so the host holds about one weight at a time beyond the backend's copy.

mod attention;
mod checkpoint;
mod config;
pub(crate) mod json;
mod layout;
mod mlp;
mod moe;
mod planned_weights;
mod probe;
mod quant_config;
mod rotary;
mod shard_path;

use std::path::Path;
use std::sync::Arc;

pub(crate) use checkpoint::Checkpoint;
pub(crate) use config::check_rope;
pub use config::{Config, Yarn};
pub use layout::{Layout, Skipped};
pub use planned_weights::{DenseShape, Int4Experts, Int4Weight, PlannedWeights};
pub use quant_config::QuantConfig;
pub(crate) use rotary::{inv_freq, yarn_inv_freq};
pub use rotary::{softmax_scale, yarn_mscale};

use attention::Attention;
use mlp::Mlp;
use moe::Moe;
use probe::Probe;

use crate::cpu::CpuBackend;
use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use crate::ops::cpu::count_nonfinite;
use crate::registry::{Argmax, Backend, ComputeDtype, Dtypes, Heads, HostLinear, KvDtype, KvStore, Rope, Taps};

enum FeedForward<B: Backend> {
    Dense(Mlp<B>),
    Moe(Moe<B>),
}

struct Layer<B: Backend> {
    input_norm: B::Vector,
    attn: Attention<B>,
    post_norm: B::Vector,
    ffn: FeedForward<B>,
}

/// The bytes of a model's weights, by what reads them: every forward reads `dense` (attention,
/// dense MLPs, shared experts, routers, norms, the LM head); a routed expert's `expert` bytes are read
/// once per forward in each MoE layer where some token routes to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WeightBytes {
    pub dense: usize,
    pub lm_head: usize,
    /// One routed expert's weights (gate, up and down).
    pub expert: usize,
    pub moe_layers: usize,
    pub experts_per_layer: usize,
    /// Of all the above, the INT4 weights' bytes.
    pub int4: usize,
}

/// A loaded model on backend `B`: its weights, and the ops they run through.
/// Prompt tokens per forward of [`Model::prefill`] unless set otherwise: long enough that a chunk's
/// weights are read for many tokens at once, short enough that a chunk's routed assignments (1024
/// x top-8 for Kimi K2) fit one grouped MoE launch and its activations stay small.
pub const DEFAULT_PREFILL_CHUNK: usize = 1024;

pub struct Model<B: Backend = CpuBackend> {
    pub config: Config,
    prefill_chunk: usize,
    backend: Arc<B>,
    embed: B::Linear,
    layers: Vec<Layer<B>>,
    norm: B::Vector,
    /// `None` when the LM head is the embedding table (`tie_word_embeddings`).
    lm_head: Option<B::Linear>,
    rope: Rope<B>,
    heads: Heads,
    bytes: WeightBytes,
    skipped: Skipped,
    dtypes: Dtypes,
}

impl<B: Backend> std::fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("backend", &self.backend.describe()).field("config", &self.config).finish()
    }
}

impl Model<CpuBackend> {
    /// Loads `dir` onto the CPU backend.
    pub fn load(dir: &Path) -> Result<Model<CpuBackend>> {
        Model::load_on(dir, Arc::new(CpuBackend))
    }
}

impl WeightBytes {
    /// Counts `w` as read by every forward.
    fn dense(&mut self, w: &HostLinear) {
        self.dense += w.bytes();
        self.int4_part(w);
    }

    /// Counts `w` as (part of) a routed expert.
    fn expert(&mut self, w: &HostLinear) {
        self.expert += w.bytes();
        self.int4_part(w);
    }

    fn int4_part(&mut self, w: &HostLinear) {
        if let HostLinear::Int4(_) = w {
            self.int4 += w.bytes();
        }
    }
}

impl<B: Backend> Model<B> {
    /// Loads `dir`, its dense weights computed in the checkpoint's dtype; each weight goes to
    /// `backend` as it is read, so the host holds at most one weight beyond the backend's copy.
    pub fn load_on(dir: &Path, backend: Arc<B>) -> Result<Model<B>> {
        Model::load_as(dir, backend, None)
    }

    /// [`Self::load_on`] with the dense weights computed in `dtype`, each converted as it is read;
    /// `None` keeps every weight in its stored dtype and names the checkpoint's dtype (its embedding
    /// table's) the compute dtype. The KV cache's dtype follows: the backend's choice for f32 weights
    /// when the compute dtype is f32 ([`Backend::kv_dtype`]). A dtype the backend cannot compute in
    /// is an error before any weight is read.
    pub fn load_as(dir: &Path, backend: Arc<B>, dtype: Option<ComputeDtype>) -> Result<Model<B>> {
        let config = Config::load(&dir.join("config.json"))?;
        let mut ckpt = Checkpoint::open(dir, config.layout)?;
        let config_file = dir.join("config.json").display().to_string();
        ckpt.check_float_dtypes(&config_file, config.torch_dtype.as_deref())?;
        let embed_name = "model.embed_tokens.weight";
        let checkpoint = match ckpt.float_dtype(embed_name) {
            Some(d) => d,
            // Read to name the missing tensor or its unsupported dtype.
            None => {
                let (v, h) = (config.vocab_size, config.hidden_size);
                return Err(ckpt.dense(embed_name, v, h).err().unwrap_or_else(|| missing_dtype(embed_name)));
            }
        };
        let compute = dtype.unwrap_or(checkpoint);
        backend.supports_compute(compute).map_err(|reason| EngineError::ComputeDtype {
            backend: backend.describe(),
            dtype: compute,
            reason,
        })?;
        // Asked for: every dense weight converted. Otherwise each keeps its stored dtype (a bf16
        // checkpoint's odd f32 weight stays f32, as it always has).
        if dtype.is_some() {
            ckpt.set_compute(compute);
        }
        let dtypes = Dtypes { compute, checkpoint, chosen: dtype.is_some() };
        config.check_checkpoint_layers(&config_file, ckpt.names())?;
        config.check_checkpoint_shared_experts(&config_file, ckpt.names())?;
        let (c, b) = (&config, &*backend);
        let (h, v) = (c.hidden_size, c.vocab_size);
        let mut bytes = WeightBytes::default();
        let vector = |name: &str, len: usize| b.vector(&ckpt.tensor(name, &[len])?);
        let embed =
            b.linear_weight("model.embed_tokens", HostLinear::Dense(ckpt.dense("model.embed_tokens.weight", v, h)?))?;
        let heads = c.heads(b.kv_dtype(compute == ComputeDtype::F32));
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let attn = Attention::load(&ckpt, c, b, &format!("{p}.self_attn"), heads, &mut bytes)?;
            let ffn = if c.is_moe_layer(i) {
                let moe = Moe::load(&ckpt, c, b, &format!("{p}.mlp"), &mut bytes)?;
                bytes.moe_layers += 1;
                FeedForward::Moe(moe)
            } else {
                FeedForward::Dense(Mlp::load(&ckpt, c, b, &format!("{p}.mlp"), c.intermediate_size, &mut bytes)?)
            };
            bytes.dense += 8 * h;
            layers.push(Layer {
                input_norm: vector(&format!("{p}.input_layernorm.weight"), h)?,
                attn,
                post_norm: vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                ffn,
            });
        }
        bytes.experts_per_layer = if bytes.moe_layers > 0 { c.n_routed_experts } else { 0 };
        bytes.expert = bytes.expert.checked_div(bytes.moe_layers * c.n_routed_experts).unwrap_or(0);
        let lm_head = if c.tie_word_embeddings && !ckpt.contains("lm_head.weight") {
            bytes.lm_head = compute.bytes() * v * h;
            None
        } else {
            let w = ckpt.linear("lm_head", v, h, c.quant_group("lm_head"))?;
            bytes.lm_head = w.bytes();
            bytes.int4_part(&w);
            Some(b.linear_weight("lm_head", w)?)
        };

        Ok(Model {
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            norm: vector("model.norm.weight", h)?,
            rope: Rope::new(b, &rotary::rope_table(c))?,
            heads,
            embed,
            layers,
            lm_head,
            bytes,
            skipped: ckpt.skipped(),
            dtypes,
            config,
            backend,
        })
    }

    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// The checkpoint's tensors outside the text model (a multimodal checkpoint's vision tower and
    /// projector), which the load skipped unread.
    pub fn skipped(&self) -> Skipped {
        self.skipped
    }

    /// The dtype dense weights are computed in, and the checkpoint's.
    pub fn dtypes(&self) -> Dtypes {
        self.dtypes
    }

    /// What the weights weigh, by who reads them.
    pub fn weight_bytes(&self) -> WeightBytes {
        self.bytes
    }

    /// An empty cache for this model.
    /// MLA's sizes and the KV cache's dtype.
    pub fn heads(&self) -> Heads {
        self.heads
    }

    /// Stores the KV cache of caches made from now on in `kv` instead of the backend's default for
    /// this checkpoint; an error, changing nothing, where the backend cannot.
    pub fn set_kv_dtype(&mut self, kv: KvDtype) -> Result<()> {
        let heads = Heads { kv, ..self.heads };
        let group = kdtree_jit::mla::fp8::GROUP;
        let ready = if kv == KvDtype::Fp8 && !heads.mla.latent.is_multiple_of(group) {
            Err(format!("kv_lora_rank {} is not a multiple of its scale groups of {group}", heads.mla.latent))
        } else {
            self.backend.prepare_kv(heads)
        };
        if let Err(reason) = ready {
            return Err(EngineError::KvDtype {
                backend: self.backend.describe(),
                compute: self.dtypes.compute,
                kv,
                reason,
            });
        }
        self.heads = heads;
        Ok(())
    }

    /// Prompt tokens per forward of [`Self::prefill`]; at least 1.
    pub fn set_prefill_chunk(&mut self, tokens: usize) -> Result<()> {
        if tokens == 0 {
            return Err(EngineError::ArgumentOutOfRange {
                what: "the prefill chunk".into(),
                value: 0,
                limit: "it must hold at least 1 token".into(),
            });
        }
        self.prefill_chunk = tokens;
        Ok(())
    }

    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    /// Appends `prompt` to `cache` at the positions after its entries, in causal forwards of at most
    /// [`Self::prefill_chunk`] tokens, and returns the argmax of the last token's logits: the first
    /// token greedy decoding emits. A row's result does not depend on the rows computed with it, so
    /// the chunk size changes no bits, with one exception on CUDA: forwards of more than
    /// [`crate::cuda::MAX_STREAMED_ROWS`] rows run the dense 16-bit linears on cuBLAS where fewer
    /// run a tuned streamed variant, which sums in another order (last bits). No forward holds more
    /// than a chunk's activations, so a prompt of any length that fits the context and the cache
    /// runs.
    pub fn prefill(&self, cache: &mut B::Cache, prompt: &[u32]) -> Result<u32> {
        self.prefill_tapped(cache, prompt, &[], |_| Ok(()))
    }

    /// [`Self::prefill`], handing each chunk's hidden states after each of `layers`
    /// ([`Self::forward_argmax_tapped`]) to `commit` as the chunk is done, so that no more than a
    /// chunk's are ever held. With no layers, `commit` is not called.
    pub fn prefill_tapped(
        &self,
        cache: &mut B::Cache,
        prompt: &[u32],
        layers: &[usize],
        mut commit: impl FnMut(&B::Tensor) -> Result<()>,
    ) -> Result<u32> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt { op: "prefill" });
        }
        let mut next = 0;
        for chunk in prompt.chunks(self.prefill_chunk) {
            let start = cache.len();
            let positions: Vec<usize> = (start..start + chunk.len()).collect();
            let (ids, taps) = self.forward_argmax_tapped(cache, chunk, &positions, None, layers)?;
            next = ids[chunk.len() - 1];
            if let Some(taps) = taps {
                commit(&taps)?;
            }
        }
        Ok(next)
    }

    pub fn new_cache(&self) -> B::Cache {
        self.backend.new_cache(self.config.num_hidden_layers, self.heads, self.rope.max_positions)
    }

    /// Runs `tokens` at position ids `positions`, attending to everything in `cache` plus the new
    /// tokens `mask` allows (`None` = causal). Appends all new K/V to the cache (nothing on error).
    /// Returns logits `[tokens.len(), vocab]`, f32, on the host.
    ///
    /// Logits that are not all finite are an error, [`EngineError::NonFinite`], naming the first op of
    /// the forward whose output was not (found by running it again with every op checked).
    pub fn forward(
        &self,
        cache: &mut B::Cache,
        tokens: &[u32],
        positions: &[usize],
        mask: Option<&TreeMask>,
    ) -> Result<Vec<f32>> {
        let start = cache.len();
        let logits = self.backend.to_host(&self.forward_on(cache, tokens, positions, mask)?)?;
        match count_nonfinite(&logits) {
            0 => Ok(logits),
            bad => Err(self.first_nonfinite(cache, start, tokens, positions, mask, bad, logits.len())),
        }
    }

    /// [`Self::forward`], but only each row's argmax (ties to the lowest index) leaves the backend, with
    /// the count of non-finite logits that [`Self::forward`]'s check needs.
    pub fn forward_argmax(
        &self,
        cache: &mut B::Cache,
        tokens: &[u32],
        positions: &[usize],
        mask: Option<&TreeMask>,
    ) -> Result<Vec<u32>> {
        Ok(self.forward_argmax_tapped(cache, tokens, positions, mask, &[])?.0)
    }

    /// [`Self::forward_argmax`], and with `layers` the hidden states of every row after each of them,
    /// `[rows, layers.len() * hidden]` on the backend, a row's layers in the order given: what a DFlash
    /// drafter conditions on. As in transformers' `hidden_states`, the last layer's is after the final
    /// norm. They are written inside the forward, so a backend that records forwards (CUDA graphs)
    /// records this one too.
    pub fn forward_argmax_tapped(
        &self,
        cache: &mut B::Cache,
        tokens: &[u32],
        positions: &[usize],
        mask: Option<&TreeMask>,
        layers: &[usize],
    ) -> Result<(Vec<u32>, Option<B::Tensor>)> {
        if let Some(&layer) = layers.iter().find(|&&l| l >= self.layers.len()) {
            return Err(EngineError::ArgumentOutOfRange {
                what: "the tapped layer".into(),
                value: layer as u64,
                limit: format!("the model has {} layers, numbered from 0", self.layers.len()),
            });
        }
        let start = cache.len();
        let b = &*self.backend;
        let hidden = self.config.hidden_size;
        let taps = (!layers.is_empty()).then_some(Taps { layers, cols: layers.len() * hidden });
        let checked = self.checked(cache, tokens, positions, mask, |cache, mask| {
            b.forward_argmax(cache, tokens, positions, mask, taps, |cache, batch, mut out| {
                let mut tap = |layer: usize, x: &B::Tensor| -> Result<()> {
                    let Some(out) = out.as_deref_mut() else { return Ok(()) };
                    for (slot, _) in layers.iter().enumerate().filter(|(_, l)| **l == layer) {
                        b.place_columns(out, slot * hidden, x)?;
                    }
                    Ok(())
                };
                self.run(cache, batch, &Probe::off(b), &mut tap)
            })
        })?;
        match checked {
            Argmax { ids, nonfinite: 0, taps } => Ok((ids, taps)),
            Argmax { nonfinite, .. } => {
                let total = tokens.len() * self.config.vocab_size;
                Err(self.first_nonfinite(cache, start, tokens, positions, mask, nonfinite, total))
            }
        }
    }

    /// [`Self::forward`] with the logits left on the backend, unchecked: they may hold NaN.
    pub(crate) fn forward_on(
        &self,
        cache: &mut B::Cache,
        tokens: &[u32],
        positions: &[usize],
        mask: Option<&TreeMask>,
    ) -> Result<B::Tensor> {
        self.forward_probed(cache, tokens, positions, mask, &Probe::off(&*self.backend))
    }

    /// The error of a forward from a cache of `start` entries whose logits held `bad` of `total` values
    /// that are not finite: the forward runs again from that cache with every op's output checked, and
    /// the first that is not finite is named. The cache is left with its `start` entries.
    #[allow(clippy::too_many_arguments)]
    fn first_nonfinite(
        &self,
        cache: &mut B::Cache,
        start: usize,
        tokens: &[u32],
        positions: &[usize],
        mask: Option<&TreeMask>,
        bad: usize,
        total: usize,
    ) -> EngineError {
        cache.truncate(start);
        let rerun = self.forward_probed(cache, tokens, positions, mask, &Probe::every_op(&*self.backend));
        cache.truncate(start);
        match rerun {
            Err(e) => e,
            // Every op's output was finite this time: only a backend that does not repeat itself gets here.
            Ok(_) => EngineError::NonFinite {
                op: "lm_head (the logits; a checked re-run of the forward found every output finite)".into(),
                count: bad,
                total,
            },
        }
    }

    /// The forward, `probe` checking each op's output; commits the cache on success, rolls it back on error.
    fn forward_probed(
        &self,
        cache: &mut B::Cache,
        tokens: &[u32],
        positions: &[usize],
        mask: Option<&TreeMask>,
        probe: &Probe<'_, B>,
    ) -> Result<B::Tensor> {
        self.checked(cache, tokens, positions, mask, |cache, mask| {
            let batch = self.backend.batch(tokens, positions, mask, cache.len())?;
            self.run(cache, &batch, probe, &mut no_taps)
        })
    }

    /// Checks a forward's inputs, then runs `forward` with its mask (causal when `None`); commits the
    /// cache when it succeeds, rolls it back when it fails.
    fn checked<R>(
        &self,
        cache: &mut B::Cache,
        tokens: &[u32],
        positions: &[usize],
        mask: Option<&TreeMask>,
        forward: impl FnOnce(&mut B::Cache, &TreeMask) -> Result<R>,
    ) -> Result<R> {
        let n = tokens.len();
        let causal;
        let mask = match mask {
            Some(m) => m,
            None => {
                causal = TreeMask::causal(n);
                &causal
            }
        };
        if n == 0 || positions.len() != n || mask.len() != n {
            return Err(EngineError::shape(
                "forward",
                format!("{n} tokens, {} positions, a mask of {}", positions.len(), mask.len()),
            ));
        }
        let max = self.rope.max_positions;
        if let Some(&position) = positions.iter().find(|&&p| p >= max) {
            return Err(EngineError::PositionOutOfRange { position, max });
        }
        let vocab = self.config.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab });
        }
        let result = forward(cache, mask);
        match &result {
            Ok(_) => cache.commit(n),
            Err(_) => cache.rollback(),
        }
        result
    }

    /// The embedding table's rows for `tokens`, `[tokens.len(), hidden]`: what the first layer reads,
    /// and what a drafter that borrows the target's embedding (DFlash) embeds its block with.
    pub fn embed(&self, tokens: &[u32]) -> Result<B::Tensor> {
        let positions: Vec<usize> = (0..tokens.len()).collect();
        let batch = self.backend.batch(tokens, &positions, &TreeMask::causal(tokens.len()), 0)?;
        self.backend.embedding(&self.embed, &batch)
    }

    /// The LM head on rows `x` that are already normalised, `[rows, vocab]`: the last op of a forward,
    /// and how a drafter that borrows the target's head (DFlash) reads its logits.
    pub fn lm_head(&self, x: &B::Tensor) -> Result<B::Tensor> {
        self.backend.linear(x, self.lm_head.as_ref().unwrap_or(&self.embed))
    }

    /// The layers of one forward of `batch`, to its logits; `tap` sees each layer's output (the last
    /// layer's after the final norm).
    fn run(
        &self,
        cache: &mut B::Cache,
        batch: &B::Batch,
        probe: &Probe<'_, B>,
        tap: &mut dyn FnMut(usize, &B::Tensor) -> Result<()>,
    ) -> Result<B::Tensor> {
        let (c, b) = (&self.config, &*self.backend);
        let mut x = b.embedding(&self.embed, batch)?;
        probe.check(&x, "embedding")?;
        // Each residual add is fused with the norm that reads its sum (the next layer's input norm,
        // or the final norm after the last layer).
        let first_norm = self.layers.first().map_or(&self.norm, |l| &l.input_norm);
        let mut normed = b.rmsnorm(&x, first_norm, c.rms_norm_eps)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let probe = probe.layer(i);
            probe.check(&normed, "input_layernorm")?;
            let attn = layer.attn.forward(b, c, &self.rope, &normed, i, cache, batch, &probe)?;
            let normed_attn = b.add_rmsnorm(&mut x, &attn, &layer.post_norm, c.rms_norm_eps)?;
            probe.check(&x, "residual after self_attn")?;
            probe.check(&normed_attn, "post_attention_layernorm")?;
            let ffn = match &layer.ffn {
                FeedForward::Dense(mlp) => mlp.forward(b, &normed_attn, &probe, "mlp")?,
                FeedForward::Moe(moe) => moe.forward(b, &normed_attn, &probe)?,
            };
            let next_norm = self.layers.get(i + 1).map_or(&self.norm, |l| &l.input_norm);
            normed = b.add_rmsnorm(&mut x, &ffn, next_norm, c.rms_norm_eps)?;
            probe.check(&x, "residual after mlp")?;
            if i + 1 < self.layers.len() {
                tap(i, &x)?;
            }
        }
        probe.check(&normed, "norm")?;
        if let Some(last) = self.layers.len().checked_sub(1) {
            tap(last, &normed)?;
        }
        let logits = self.lm_head(&normed)?;
        probe.check(&logits, "lm_head")?;
        Ok(logits)
    }
}

fn missing_dtype(tensor: &str) -> EngineError {
    EngineError::NotFloat { tensor: tensor.into() }
}

/// The tap of a forward that hands out no hidden states.
fn no_taps<T>(_: usize, _: &T) -> Result<()> {
    Ok(())
}
