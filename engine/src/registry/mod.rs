//! The op registry: every op the model's forward calls, over tensors that live on the backend that
//! runs them. [`Backend`] is the registry's contract (candle's `BackendStorage` is the model): a
//! backend owns its tensor, weight and cache types, and the forward in [`crate::model`] is written
//! once, generic over it. [`crate::cpu::CpuBackend`] is the deterministic, batch-invariant reference;
//! [`crate::cuda::CudaBackend`] runs every op on the GPU. No op of one backend falls back to another:
//! a backend either runs an op or returns an error.
//!
//! | op | what |
//! |---|---|
//! | [`Backend::embedding`] | rows of a dense table for the batch's ids |
//! | [`Backend::rmsnorm`] | row-wise RMSNorm |
//! | [`Backend::linear`] | `x · Wᵀ`, dense (bf16) or W4A16 |
//! | [`Backend::silu_mul`] | `silu(a) * b` of the two halves of each row (fused gate/up) |
//! | [`Backend::columns`], [`Backend::rope`] | MLA's column splits and rotary embedding |
//! | [`Backend::kv_append`], [`Backend::attention`] | MLA's latent KV cache and absorbed, tree-masked attention |
//! | [`Backend::new_rows`], [`Backend::append_rows`], [`Backend::gqa_attention`] | a drafter's grouped-query attention, unmasked, over rows of keys and values that grow by appends |
//! | [`Backend::moe`] | routing and the routed experts of one MoE layer |
//! | [`Backend::argmax`], [`Backend::argmax_checked`], [`Backend::to_host`] | what leaves the backend: ids (with a count of NaN and infinite logits), or logits |
//! | [`Backend::upload`] | host rows onto the backend |
//! | [`Backend::forward_argmax`] | a whole forward to its argmax ids, which a backend may record once and replay |

mod dtype;
mod linear;
mod rope;
mod startup;

pub use dtype::{ComputeDtype, Dtypes};
pub use linear::{DenseValues, DenseWeight, HostLinear};
pub(crate) use rope::Rope;
pub use rope::{RopeLayout, RopeSpan, RopeTable};

/// The router's settings: one type for the CPU reference and the GPU router kernel.
pub use kdtree_kernels::Routing;
pub use startup::{BackendKind, Selection, select};

use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use kdtree_jit::mla::{MlaKv, MlaShape};

/// MLA's sizes, which lay out the KV cache: per token and layer one entry `[c_kv | k_pe]` of
/// `latent + rope` values (the normalised compressed kv and the rotated key shared by every head),
/// stored in `kv`. Queries and outputs are per head: a query of `nope + rope`, an output of `v`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Heads {
    /// The sizes, as the MLA kernels and their reference see them.
    pub mla: MlaShape,
    /// How the cache stores its entries.
    pub kv: KvDtype,
}

impl Heads {
    pub fn qk(&self) -> usize {
        self.mla.nope + self.mla.rope
    }

    /// Values of one cache entry, `[c_kv | k_pe]`.
    pub fn width(&self) -> usize {
        self.mla.width()
    }

    /// Bytes of one token's entries over `layers` layers: what a forward reads per cached token.
    pub fn kv_bytes_per_token(&self, layers: usize) -> usize {
        layers * self.kv.entry_bytes(&self.mla)
    }
}

/// The dtype of the KV cache's entries. bf16 is what the GPU's kernels read (and halves f32's
/// bytes); fp8 stores the latent in e4m3 with a power-of-two scale per 32 values and the rope key in
/// bf16 (kdtree-jit's `mla::fp8`: 656 bytes an entry at K2's sizes against bf16's 1152), its values
/// read as the bf16 values they are; f32 keeps an f32 checkpoint's arithmetic exact on the CPU.
/// Queries are rounded to the dtype attention computes in (bf16, or f32) before they meet the cache,
/// as the GPU's tensor cores take them.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    Bf16,
    Fp8,
    F32,
}

impl KvDtype {
    /// The tensor-core family's cache kind, for the dtypes it reads (all but f32).
    pub fn latent(self) -> Option<MlaKv> {
        match self {
            KvDtype::Bf16 => Some(MlaKv::Bf16),
            KvDtype::Fp8 => Some(MlaKv::Fp8),
            KvDtype::F32 => None,
        }
    }

    /// Bytes of one entry of `s`.
    pub(crate) fn entry_bytes(self, s: &MlaShape) -> usize {
        self.latent().map_or(4 * s.width(), |kv| kv.entry_bytes(s))
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8 => "fp8",
            KvDtype::F32 => "f32",
        }
    }

    /// The dtype attention's softmax weights take beside a cache of this dtype: bf16, as the GPU's
    /// tensor cores take them, or f32.
    pub fn weights(self) -> kdtree_jit::mla::reference::Weights {
        match self {
            KvDtype::Bf16 | KvDtype::Fp8 => kdtree_jit::mla::reference::Weights::Bf16,
            KvDtype::F32 => kdtree_jit::mla::reference::Weights::F32,
        }
    }

    /// A query value `x` as attention over this cache takes it (bf16: rounded to nearest even).
    pub fn round(self, x: f32) -> f32 {
        match self {
            KvDtype::Bf16 | KvDtype::Fp8 => half::bf16::from_f32(x).to_f32(),
            KvDtype::F32 => x,
        }
    }

    /// `entry` (`[c_kv | k_pe]`, `latent` values of c_kv) as the cache holds it: rounded to bf16,
    /// quantized to FP8 and read back, or as it is.
    pub(crate) fn store(self, entry: &mut [f32], latent: usize) {
        match self {
            KvDtype::Fp8 => kdtree_jit::mla::fp8::round_entry(entry, latent),
            KvDtype::Bf16 | KvDtype::F32 => entry.iter_mut().for_each(|x| *x = self.round(*x)),
        }
    }
}

/// How a drafter's logits become the scores it softmaxes: `× multiplier`, then `softcap · tanh(x /
/// softcap)` where a softcap is given (DFlash's `output_multiplier`, `final_logit_softcapping`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitTransform {
    pub multiplier: f32,
    pub softcap: Option<f32>,
}

impl LogitTransform {
    pub fn apply(&self, x: f32) -> f32 {
        let x = x * self.multiplier;
        self.softcap.map_or(x, |cap| cap * (x / cap).tanh())
    }
}

/// Head counts and width of a grouped-query attention: query head `h` reads key/value head
/// `h / (heads / kv_heads)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GqaShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl GqaShape {
    /// Values of one row of queries (and outputs).
    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Values of one row of keys (or values).
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// Rows of one width on a backend that grow at the end ([`Backend::append_rows`]) without copying
/// what they hold on every append: a drafter's context keys and values.
pub trait RowStore: Send + Sync {
    /// Rows held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Keeps the first `len` rows (no-op when it holds fewer).
    fn truncate(&mut self, len: usize);
}

/// One MoE layer's routed experts as loaded from the checkpoint, before a backend takes them.
#[derive(Clone, Debug)]
pub struct HostExperts {
    pub routing: Routing,
    /// `mlp.gate.weight`, `[n_experts, hidden]`, applied in f32 like the reference router.
    pub router: Vec<f32>,
    /// `e_score_correction_bias`, `[n_experts]`.
    pub bias: Vec<f32>,
    /// Per expert: gate and up fused into one `[2 * inter, hidden]` weight, and down.
    pub experts: Vec<(HostLinear, HostLinear)>,
}

/// The KV cache of one model on one backend: entries are tokens, in cache order. A forward appends
/// its tokens' entries ([`Backend::kv_append`]), which count only once it [`commit`](Self::commit)s.
pub trait KvStore {
    /// Committed entries.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Keeps the first `len` entries (no-op when it holds fewer).
    fn truncate(&mut self, len: usize);
    /// Keeps, after the first `start` entries, only `start + keep[i]`, moved to be contiguous: what
    /// tree verification leaves of an accepted path. `keep` must be strictly ascending and inside
    /// the cache, else an error and nothing changes.
    fn compact(&mut self, start: usize, keep: &[usize]) -> Result<()>;
    /// Counts the `n` entries the last forward appended.
    fn commit(&mut self, n: usize);
    /// Drops what a failed forward appended beyond the committed entries.
    fn rollback(&mut self);
}

/// Checks [`KvStore::compact`]'s arguments against a cache of `len` entries.
pub(crate) fn check_compact(len: usize, start: usize, keep: &[usize]) -> Result<()> {
    if !keep.windows(2).all(|w| w[0] < w[1]) {
        return Err(EngineError::shape("compact", format!("keep {keep:?} is not strictly ascending")));
    }
    if keep.last().is_some_and(|&j| start + j >= len) {
        return Err(EngineError::shape(
            "compact",
            format!("keep {keep:?} after entry {start} reaches past the cache of {len}"),
        ));
    }
    Ok(())
}

/// Checks [`Backend::gqa_attention`]'s arguments, each as (rows, cols): `q`, the context's keys and
/// values, the block's keys and values.
pub(crate) fn check_gqa(
    q: (usize, usize),
    context: [(usize, usize); 2],
    block: [(usize, usize); 2],
    s: GqaShape,
) -> Result<()> {
    let fits = s.kv_heads > 0
        && s.heads.is_multiple_of(s.kv_heads)
        && q.1 == s.q_width()
        && context.iter().chain(&block).all(|p| p.1 == s.kv_width())
        && context[0].0 == context[1].0
        && block.iter().all(|p| p.0 == q.0);
    if fits {
        return Ok(());
    }
    Err(EngineError::shape(
        "gqa_attention",
        format!("{s:?} over q {q:?}, context keys/values {context:?}, block keys/values {block:?} (rows, cols)"),
    ))
}

/// A tensor's `[rows, cols]`.
pub trait Shaped {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
}

/// A parameter vector's length.
pub trait Length {
    fn length(&self) -> usize;
}

impl Length for Vec<f32> {
    fn length(&self) -> usize {
        Vec::len(self)
    }
}

/// `Err` unless `weight` is as wide as `x`'s rows: a norm of another width, even one whose length
/// divides the tensor's, would normalise other spans than its rows.
pub(crate) fn check_norm(op: &'static str, x: &impl Shaped, weight: &impl Length) -> Result<()> {
    if x.cols() == weight.length() {
        return Ok(());
    }
    Err(EngineError::shape(op, format!("rows of {} against a weight of {}", x.cols(), weight.length())))
}

/// A device that runs the model's ops on tensors of its own.
pub trait Backend: Send + Sync + Sized {
    /// f32 activations, `[rows, cols]` row-major.
    type Tensor: Shaped;
    /// f32 parameters: norm weights, rotary tables.
    type Vector: Send + Sync + Length;
    /// A linear layer's weight (also the embedding table).
    type Linear: Send + Sync;
    /// One MoE layer's router and routed experts.
    type Experts: Send + Sync;
    /// One layer's `kv_b_proj` as absorbed attention applies it: `W_UK` to queries, `W_UV` to outputs.
    type Absorb: Send + Sync;
    /// One forward's inputs: token ids, positions, the mask among the new tokens.
    type Batch;
    type Cache: KvStore;
    type Rows: RowStore;

    /// What the backend is, for people: "cpu", "cuda (NVIDIA H200, sm_90)".
    fn describe(&self) -> String;

    /// Takes a vector of parameters.
    fn vector(&self, v: &[f32]) -> Result<Self::Vector>;
    /// Takes a linear weight; `name` is the checkpoint's module, for errors and reports.
    fn linear_weight(&self, name: &str, w: HostLinear) -> Result<Self::Linear>;
    /// Takes one MoE layer's router and experts.
    fn experts(&self, name: &str, e: HostExperts) -> Result<Self::Experts>;
    /// Takes one layer's `kv_b_proj` weight (`[heads * (nope + v), latent]`) for absorbed attention.
    fn absorb(&self, name: &str, kv_b: &HostLinear, heads: Heads) -> Result<Self::Absorb>;
    /// The KV dtype this backend stores by default for a model whose dense weights are f32
    /// (`f32_weights`) or 16-bit.
    fn kv_dtype(&self, f32_weights: bool) -> KvDtype;
    /// Readies this backend to store the KV caches of a model of `heads` in `heads.kv` (the GPU
    /// loads that cache's kernels); an error, changing nothing, where it cannot.
    fn prepare_kv(&self, _heads: Heads) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Whether this backend computes dense weights in `dtype`, and why not: asked before any weight
    /// is loaded.
    fn supports_compute(&self, _dtype: ComputeDtype) -> std::result::Result<(), String> {
        Ok(())
    }
    /// An empty cache of `layers` layers laid out by `heads`, for up to `max_tokens` tokens (the
    /// model's context).
    fn new_cache(&self, layers: usize, heads: Heads, max_tokens: usize) -> Self::Cache;

    /// Uploads one forward's inputs. `positions` index the rotary table; callers have checked them.
    /// `past` is the cache's committed entries, after which the batch's are appended.
    fn batch(&self, tokens: &[u32], positions: &[usize], mask: &TreeMask, past: usize) -> Result<Self::Batch>;

    /// Rows `tokens` of `table` (`[vocab, dim]`, dense).
    fn embedding(&self, table: &Self::Linear, batch: &Self::Batch) -> Result<Self::Tensor>;
    fn rmsnorm(&self, x: &Self::Tensor, weight: &Self::Vector, eps: f32) -> Result<Self::Tensor>;
    /// `y[m, n] = x[m, k] · Wᵀ`.
    fn linear(&self, x: &Self::Tensor, w: &Self::Linear) -> Result<Self::Tensor>;
    /// `x += y`.
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// The rmsnorm of columns `start .. start + len` of `x` (`weight` has `len` values): the values
    /// of [`Self::columns`] then [`Self::rmsnorm`], which a backend may compute in one pass, reading
    /// the columns where they lie.
    fn rmsnorm_columns(
        &self,
        x: &Self::Tensor,
        (start, len): (usize, usize),
        weight: &Self::Vector,
        eps: f32,
    ) -> Result<Self::Tensor> {
        self.rmsnorm(&self.columns(x, start, len)?, weight, eps)
    }
    /// A residual add and the norm after it: `x += y`, then the rmsnorm of the new `x`. A backend
    /// may fuse the two; the values are those of [`Self::add_assign`] then [`Self::rmsnorm`]. A
    /// weight of another width than the rows is refused before `x` changes.
    fn add_rmsnorm(
        &self,
        x: &mut Self::Tensor,
        y: &Self::Tensor,
        weight: &Self::Vector,
        eps: f32,
    ) -> Result<Self::Tensor> {
        check_norm("add_rmsnorm", x, weight)?;
        self.add_assign(x, y)?;
        self.rmsnorm(x, weight, eps)
    }
    /// `silu(a) * b` where each row of `x` is `[a | b]`, halves of equal width; `down` is the weight
    /// that reads the result next, whose input dtype a backend may round it to.
    fn silu_mul(&self, x: &Self::Tensor, down: &Self::Linear) -> Result<Self::Tensor>;
    /// The same values as rows of `cols` (a whole number of them): a free change of view, such as
    /// rows of heads to rows of one head each.
    fn reshape(&self, x: Self::Tensor, cols: usize) -> Result<Self::Tensor>;
    /// Columns `start..start + len` of every row.
    fn columns(&self, x: &Self::Tensor, start: usize, len: usize) -> Result<Self::Tensor>;
    /// `rows` rows of `cols` zeros.
    fn zeros(&self, rows: usize, cols: usize) -> Result<Self::Tensor>;
    /// Writes `x`'s rows into columns `start..start + x's width` of `dst`'s, which has as many rows.
    fn place_columns(&self, dst: &mut Self::Tensor, start: usize, x: &Self::Tensor) -> Result<()>;
    /// The rows of `x` at `rows`, in that order.
    fn select_rows(&self, x: &Self::Tensor, rows: &[usize]) -> Result<Self::Tensor>;
    /// Rotates `span` of every head of every row of `x` in place, row `r` at the batch's position `r`.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        span: RopeSpan,
        cos: &Self::Vector,
        sin: &Self::Vector,
        batch: &Self::Batch,
    ) -> Result<()>;
    /// Appends the batch's entries to layer `layer` after the committed ones: `latent` is `[n,
    /// latent]` (`kv_a_proj_with_mqa`'s compressed part, normalised), `k_rope` `[n, rope]` (rotated).
    fn kv_append(
        &self,
        cache: &mut Self::Cache,
        layer: usize,
        latent: &Self::Tensor,
        k_rope: &Self::Tensor,
        batch: &Self::Batch,
    ) -> Result<()>;
    /// Absorbed MLA of the batch's queries `q` (`[n, heads, nope + rope]`, rope applied) over layer
    /// `layer`'s committed entries and the new ones the batch's mask lets each see, in cache order;
    /// masked entries are skipped, not zero-weighted, so a tree node's output equals a sequential
    /// forward's over its path. `kv_b` moves queries into latent space and outputs back
    /// ([`kdtree_jit::mla::reference`]). Returns `[n, heads, v]`.
    fn attention(
        &self,
        q: &Self::Tensor,
        cache: &Self::Cache,
        layer: usize,
        batch: &Self::Batch,
        kv_b: &Self::Absorb,
    ) -> Result<Self::Tensor>;
    /// Empty rows of `cols` values.
    fn new_rows(&self, cols: usize) -> Result<Self::Rows>;
    /// Appends the rows of `x`, which must be as wide.
    fn append_rows(&self, rows: &mut Self::Rows, x: &Self::Tensor) -> Result<()>;
    /// Grouped-query attention with no mask of `q` (`[n, heads * head_dim]`) over the keys and values
    /// of `context` (`[keys, values]`, rows of `kv_heads * head_dim`) followed by `block`'s (`n` rows
    /// each), scores scaled by `1 / sqrt(head_dim)`. Returns `[n, heads * head_dim]`.
    fn gqa_attention(
        &self,
        q: &Self::Tensor,
        context: [&Self::Rows; 2],
        block: [&Self::Tensor; 2],
        shape: GqaShape,
    ) -> Result<Self::Tensor>;
    /// Routes every row and returns the sum of its experts' outputs, weighted, added in ascending
    /// expert index: a row's result never depends on which other rows came along.
    fn moe(&self, x: &Self::Tensor, experts: &Self::Experts) -> Result<Self::Tensor>;
    /// Row-wise argmax, ties to the lowest index.
    fn argmax(&self, x: &Self::Tensor) -> Result<Vec<u32>>;
    /// [`Self::argmax`], and how many values of `x` are NaN or infinite, read back together: the
    /// check every forward makes of its logits ([`crate::Model::forward_argmax`]).
    fn argmax_checked(&self, x: &Self::Tensor) -> Result<(Vec<u32>, usize)>;
    /// Each row of logits `x` transformed, log-softmaxed and cut to its best `k` finite entries as
    /// (token, log-prob), best first with ties to the lower token ([`crate::ops::cpu::top_k_log_softmax`]):
    /// only the candidates leave the device.
    fn top_k_log_softmax(&self, x: &Self::Tensor, k: usize, transform: LogitTransform) -> Result<Vec<Vec<(u32, f32)>>>;
    /// The tensor on the host, row-major.
    fn to_host(&self, x: &Self::Tensor) -> Result<Vec<f32>>;
    /// Host rows of `cols` values as a tensor of this backend (what a drafter that computes on the host
    /// hands to the target's LM head).
    fn upload(&self, data: &[f32], cols: usize) -> Result<Self::Tensor>;

    /// One forward from `cache` that ends in [`Self::argmax_checked`] of its logits: `forward` is the
    /// model's, run on the batch of `tokens`. With `taps`, `forward` also writes the hidden states
    /// after the tapped layers into the `[tokens, taps.cols]` tensor it is handed (see
    /// [`crate::Model::forward_argmax_tapped`]), which is returned. A backend may record the work
    /// `forward` enqueues once per batch size and taps and replay it for later forwards of that size
    /// with their inputs (CUDA graphs), without calling `forward`; so `forward` must enqueue the same
    /// work for every batch of one size, and change no host state but what the replay also leaves
    /// (the cache's appended entries, committed by the caller). The caller has checked the inputs.
    fn forward_argmax<F>(
        &self,
        cache: &mut Self::Cache,
        tokens: &[u32],
        positions: &[usize],
        mask: &TreeMask,
        taps: Option<Taps<'_>>,
        forward: F,
    ) -> Result<Argmax<Self::Tensor>>
    where
        F: FnOnce(&mut Self::Cache, &Self::Batch, Option<&mut Self::Tensor>) -> Result<Self::Tensor>,
    {
        eager_forward_argmax(self, cache, tokens, positions, mask, taps, forward)
    }
}

/// The hidden states a forward hands out beside its argmax: those after `layers` (in that order),
/// `cols` values a token in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taps<'a> {
    pub layers: &'a [usize],
    pub cols: usize,
}

/// What [`Backend::forward_argmax`] returns: each row's argmax, how many logits were not finite, and
/// the taps asked for.
pub struct Argmax<T> {
    pub ids: Vec<u32>,
    pub nonfinite: usize,
    pub taps: Option<T>,
}

/// [`Backend::forward_argmax`] run op by op: the batch uploaded, the forward run, its argmax read.
pub(crate) fn eager_forward_argmax<B: Backend, F>(
    b: &B,
    cache: &mut B::Cache,
    tokens: &[u32],
    positions: &[usize],
    mask: &TreeMask,
    taps: Option<Taps<'_>>,
    forward: F,
) -> Result<Argmax<B::Tensor>>
where
    F: FnOnce(&mut B::Cache, &B::Batch, Option<&mut B::Tensor>) -> Result<B::Tensor>,
{
    let batch = b.batch(tokens, positions, mask, cache.len())?;
    let mut taps = taps.map(|t| b.zeros(tokens.len(), t.cols)).transpose()?;
    let logits = forward(cache, &batch, taps.as_mut())?;
    let (ids, nonfinite) = b.argmax_checked(&logits)?;
    Ok(Argmax { ids, nonfinite, taps })
}
