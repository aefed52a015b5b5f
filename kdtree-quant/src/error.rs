use thiserror::Error;

/// Everything that can be wrong with a quantized weight, its shape or its file.
#[derive(Debug, Error)]
pub enum QuantError {
    #[error("unsupported group size {group_size}: supported are 32, 64 and 128")]
    UnsupportedGroupSize { group_size: usize },

    #[error("{tensor}: K = {k} is not a multiple of the group size {group_size}")]
    KNotMultipleOfGroup { tensor: String, k: usize, group_size: usize },

    #[error("{tensor}: shape {actual:?} disagrees with the expected {expected:?}")]
    ShapeMismatch { tensor: String, expected: Vec<usize>, actual: Vec<usize> },

    #[error(
        "{packed_tensor} is stored as {stored:?} int32 words, but {shape_tensor} = {declared:?} (N, K) implies [N, K / 8] = {expected:?}"
    )]
    WeightShapeMismatch {
        shape_tensor: String,
        declared: [usize; 2],
        packed_tensor: String,
        stored: Vec<usize>,
        expected: [usize; 2],
    },

    #[error("{tensor}: dtype {actual} where {expected} was expected")]
    DtypeMismatch { tensor: String, expected: String, actual: String },

    #[error("{tensor}: holds {actual} values, {expected} expected for its shape")]
    LengthMismatch { tensor: String, expected: usize, actual: usize },

    #[error("{tensor}: value {value} is outside the valid range {range}")]
    OutOfRange { tensor: String, value: i64, range: &'static str },

    #[error("tensor {tensor} is missing from {file}")]
    MissingTensor { tensor: String, file: String },

    #[error("{file}: not a valid safetensors file: {reason}")]
    MalformedFile { file: String, reason: String },

    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

impl QuantError {
    /// The tensor the error is about, where it names one.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            QuantError::KNotMultipleOfGroup { tensor, .. }
            | QuantError::ShapeMismatch { tensor, .. }
            | QuantError::DtypeMismatch { tensor, .. }
            | QuantError::LengthMismatch { tensor, .. }
            | QuantError::OutOfRange { tensor, .. }
            | QuantError::MissingTensor { tensor, .. } => Some(tensor),
            QuantError::WeightShapeMismatch { shape_tensor, .. } => Some(shape_tensor),
            QuantError::UnsupportedGroupSize { .. } | QuantError::MalformedFile { .. } | QuantError::Io { .. } => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, QuantError>;
