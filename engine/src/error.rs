use thiserror::Error;

use crate::registry::{ComputeDtype, KvDtype};

/// Everything the engine can report: bad model folders, bad inputs, the quant format's and the GPU's
/// own errors, and forwards whose logits are not numbers.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("tensor {tensor} is missing from {file}")]
    MissingTensor { tensor: String, file: String },

    #[error("tensor {tensor} is in both {first} and {second}: a checkpoint holds each tensor once")]
    DuplicateTensor { tensor: String, first: String, second: String },

    #[error("{file}: tensor {tensor} has shape {actual:?}, the config implies {expected:?}")]
    ShapeMismatch { file: String, tensor: String, expected: Vec<usize>, actual: Vec<usize> },

    #[error(
        "{file}: tensor {tensor} is {dtype}, but {expected} is expected ({why}): a checkpoint keeps its \
         16-bit weights in one type (and its INT4 scales in one), and the bits of one type read as the other are \
         other numbers"
    )]
    MixedFloatDtypes { file: String, tensor: String, dtype: String, expected: String, why: String },

    #[error("{file}: tensor {tensor} has dtype {dtype}, which the engine cannot load")]
    UnsupportedDtype { file: String, tensor: String, dtype: String },

    #[error(
        "{file}: unknown model_type `{model_type}`: expected deepseek_v3 or kimi_k2 (a text model), or kimi_k25 (Kimi \
         K2.5/K2.6, a multimodal checkpoint whose text model the engine runs)"
    )]
    UnknownModelType { file: String, model_type: String },

    #[error(
        "{file}: FP8 weights (`quant_method: fp8`, e4m3 with block scales, as DeepSeek-V3/R1 and Kimi-K2-Instruct \
         ship them) are not supported yet: use a bf16 checkpoint or a compressed-tensors INT4 one (Kimi K2-Thinking, \
         K2.5, K2.6)"
    )]
    Fp8Weights { file: String },

    #[error("{file}: unknown quantization format `{format}`: {expected}")]
    UnknownQuantization { file: String, format: String, expected: &'static str },

    #[error("{file}: truncated or malformed safetensors shard: {reason}")]
    TruncatedShard { file: String, reason: String },

    #[error("{file}: tensor {tensor} is stored {stored}, but the quantization config says it is {expected}")]
    QuantizationMismatch { file: String, tensor: String, stored: &'static str, expected: &'static str },

    #[error("{file}: tokenizer: {reason}")]
    Tokenizer { file: String, reason: String },

    #[error("{file}: chat template: {reason}")]
    ChatTemplate { file: String, reason: String },

    #[error("{file}: `{key}`: {reason}")]
    Config { file: String, key: String, reason: String },

    #[error("{index}: shard `{shard}` {reason}: shards must be files inside the model folder")]
    ShardOutsideModel { index: String, shard: String, reason: &'static str },

    #[error("{file}: tensor {tensor}: {source}")]
    Quant {
        file: String,
        tensor: String,
        #[source]
        source: Box<kdtree_quant::QuantError>,
    },

    #[error("{file} is larger than {limit} bytes, more than {what} may be: not read")]
    FileTooLarge { file: String, what: &'static str, limit: u64 },

    #[error("{path} exists and is not a folder: a model is written as a folder of config.json and safetensors shards")]
    NotAFolder { path: String },

    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },

    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },

    #[error("position {position} is beyond the rotary table of {max} positions")]
    PositionOutOfRange { position: usize, max: usize },

    #[error(
        "the KV cache cannot hold {tokens} tokens: at {bytes_per_token} bytes a token (every layer's latent entry), \
         its budget of {budget} bytes holds at most {max} (raise the budget, or shorten the context)"
    )]
    KvCacheFull { tokens: usize, max: usize, bytes_per_token: usize, budget: usize },

    #[error("{prompt} prompt tokens and {max_new} new tokens do not fit the context of {context} positions: {limit}")]
    ContextExceeded { prompt: usize, max_new: usize, context: usize, limit: String },

    /// A count, size or index outside what is accepted: what it is, its value, and the bound.
    #[error("{what} is {value}: {limit}")]
    ArgumentOutOfRange { what: String, value: u64, limit: String },

    /// A probability outside [0, 1].
    #[error("{what} is {value}, not a probability in [0, 1]")]
    NotAProbability { what: &'static str, value: f64 },

    /// A model or drafter spec whose sizes would make more than the writer takes: what they make, the
    /// bound, and a real model's figure to compare with.
    #[error("{spec}: {sizes} make more than {max} {unit} ({real}): {remedy}")]
    SpecTooLarge {
        spec: &'static str,
        sizes: String,
        max: u64,
        unit: &'static str,
        real: &'static str,
        remedy: &'static str,
    },

    /// An op or a run given no prompt tokens.
    #[error("{op}: the prompt is empty")]
    EmptyPrompt { op: &'static str },

    /// An op given an input of a kind it does not take (a dtype, a weight format): what it takes.
    #[error("{op}: not for {input}: it takes {accepted}")]
    UnsupportedInput { op: &'static str, input: String, accepted: String },

    /// Speculative-decoding options that do not go together, or that need another: the option, and
    /// what is wrong with it and what to do.
    #[error("{option} {problem}")]
    SpecOption { option: String, problem: String },

    /// A cost model's points or drafter time are unusable, or its file is not one: the file, if it
    /// came from one, and why.
    #[error("{}: {reason}", cost_model(.file))]
    CostModel { file: Option<String>, reason: String },

    /// A checkpoint tensor whose rank or layout is not its format's.
    #[error("{file}: tensor {tensor} has shape {shape:?}, not {expected}")]
    MalformedTensor { file: String, tensor: String, shape: Vec<usize>, expected: &'static str },

    /// A tensor the checkpoint holds in a non-float dtype where a float one is needed.
    #[error("tensor {tensor} is not a float tensor (bf16, f16 or f32)")]
    NotFloat { tensor: String },

    /// A weight cut or stacked in memory that the quant format refuses: the op and its error.
    #[error("{op}: {source}")]
    QuantParts {
        op: &'static str,
        #[source]
        source: Box<kdtree_quant::QuantError>,
    },

    /// An op run before what it reads was loaded or uploaded (a kernel, a weight layout, a model's
    /// attention kernels): a misuse of the API, not of a checkpoint.
    #[error("{op}: not loaded first: {what}")]
    NotLoaded { op: &'static str, what: String },

    /// A CUDA graph capture of a forward recorded no work.
    #[error("the captured forward enqueued nothing")]
    EmptyGraph,

    /// A MoE router chose experts past the layer's: its logits were not finite.
    #[error("the router chose {count} experts past the layer's {experts}: its logits are not finite")]
    RoutedPastExperts { count: usize, experts: usize },

    /// A plot that could not be drawn or written.
    #[error("plotting {file}: {reason}")]
    Plot { file: String, reason: String },

    /// A safetensors shard header that could not be written.
    #[error("shard {shard}: its safetensors header: {reason}")]
    ShardHeader { shard: String, reason: String },

    /// A backend cannot compute dense weights in `dtype`; `reason` says what it computes in instead.
    #[error("{backend} cannot compute in {dtype}: {reason}")]
    ComputeDtype { backend: String, dtype: ComputeDtype, reason: String },

    /// A backend cannot keep the KV cache of a model computed in `compute` in `kv`; `reason` says why,
    /// and which cache dtypes it keeps.
    #[error("{backend} cannot store the KV cache of a model computed in {compute} in {}: {reason}", .kv.name())]
    KvDtype { backend: String, compute: ComputeDtype, kv: KvDtype, reason: String },

    #[error(transparent)]
    Gpu(#[from] kdtree_jit::Error),

    #[error(transparent)]
    Kernel(#[from] kdtree_kernels::Error),

    #[error(transparent)]
    Tuning(#[from] kdtree_jit::tune::error::TuneError),

    /// An op's operands do not fit together (rows, widths, indices): the op and what was wrong.
    #[error("{op}: {reason}")]
    Shape { op: &'static str, reason: String },

    #[error("no W4A16 kernel for the {shape} weights: {reason}")]
    NoKernel { shape: String, reason: String },

    #[error("the CUDA backend cannot run here: {reason}")]
    BackendUnavailable { reason: String },

    /// A forward's logits held NaN or infinite values. `op` is the first op of that forward whose
    /// output did ("embedding", "layer 2 moe", "lm_head"), found by running the forward again with every
    /// op's output checked; `count` of its `total` output values were not finite.
    #[error(
        "{op}: {count} of {total} values are not finite (NaN or infinite), the first op of the forward whose \
         output is not: check the weights it reads and the config.json values it uses"
    )]
    NonFinite { op: String, count: usize, total: usize },

    /// A simulated rank ([`crate::sharded::ShardedCpu`]) panicked; the op stopped with the others' results dropped.
    #[error("rank {rank} of {ranks} failed in {op}; the other ranks stopped")]
    RankFailed { rank: usize, ranks: usize, op: &'static str },
}

/// The driver's and cuBLAS's errors have one variant each, kdtree-jit's ([`kdtree_jit::Error::Driver`],
/// [`kdtree_jit::Error::Cublas`]), reached through [`EngineError::Gpu`]: one cause, one variant.
impl From<cudarc::driver::DriverError> for EngineError {
    fn from(e: cudarc::driver::DriverError) -> EngineError {
        EngineError::Gpu(e.into())
    }
}

impl From<cudarc::cublas::result::CublasError> for EngineError {
    fn from(e: cudarc::cublas::result::CublasError) -> EngineError {
        EngineError::Gpu(e.into())
    }
}

impl EngineError {
    /// [`EngineError::Shape`] of `op`.
    pub(crate) fn shape(op: &'static str, reason: String) -> EngineError {
        EngineError::Shape { op, reason }
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;

/// What [`EngineError::CostModel`] is about: a file that is not a usable cost model, or one made in code.
fn cost_model(file: &Option<String>) -> String {
    match file {
        Some(file) => format!("{file} is not a usable cost model"),
        None => "cost model".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::cublas::{result::CublasError, sys::cublasStatus_t};
    use cudarc::driver::{DriverError, sys::CUresult};

    #[test]
    fn driver_and_cublas_errors_have_one_variant_each_kdtree_jits() {
        // Matched, not displayed: their messages come from the CUDA libraries, absent here.
        let driver = EngineError::from(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(matches!(
            driver,
            EngineError::Gpu(kdtree_jit::Error::Driver(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY)))
        ));
        let blas = EngineError::from(CublasError(cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED));
        assert!(matches!(blas, EngineError::Gpu(kdtree_jit::Error::Cublas(_))));
    }
}
