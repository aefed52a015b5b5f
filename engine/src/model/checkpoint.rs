//! The safetensors shards of a model folder, found through `model.safetensors.index.json` when
//! there is one, otherwise every `*.safetensors` file of the folder. Each tensor is in one shard:
//! the same name in two is refused, index or not. Tensors are asked for by the text model's names
//! ([`Layout`]): a multimodal checkpoint's others are counted from the headers and never read.

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use kdtree_quant::{Dtype, QuantError, SafetensorsFile};
use safetensors::Dtype as StDtype;

use super::layout::{Layout, Skipped};
use crate::error::{EngineError, Result};
use crate::registry::{ComputeDtype, DenseValues, DenseWeight, HostLinear};

/// Bytes of a tensor copied out of the map before its pages are dropped.
const COPY_BLOCK: usize = 8 << 20;

/// The most bytes a `model.safetensors.index.json` may have. An INT4 Kimi K2 lists about 210 000
/// tensors (three for each of 61 x 384 x 3 expert projections) at about 100 bytes an entry, some
/// 21 MB; ten times that leaves room for larger models without reading an endless file.
pub(crate) const MAX_INDEX_BYTES: u64 = 256 << 20;

pub(crate) struct Checkpoint {
    files: Vec<SafetensorsFile>,
    /// The text model's tensor name -> index into `files`.
    by_name: HashMap<String, usize>,
    /// What the shards put before a text-model name.
    prefix: &'static str,
    skipped: Skipped,
    /// What dense weights are converted to as they are read; `None` keeps each one's dtype.
    compute: Option<ComputeDtype>,
}

/// Where the index says each tensor is, when there is an index.
type WeightMap = HashMap<String, String>;

impl Checkpoint {
    /// The shards of `dir`, whose text-model tensors are named as `layout` says.
    pub fn open(dir: &Path, layout: Layout) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let index: Option<WeightMap> = index_path.exists().then(|| read_index(&index_path)).transpose()?;
        let shard_names: Vec<String> = if let Some(map) = &index {
            if map.is_empty() {
                return Err(EngineError::Config {
                    file: index_path.display().to_string(),
                    key: "weight_map".into(),
                    reason: "is empty: it maps no tensor to a shard".into(),
                });
            }
            let mut names: Vec<String> = map.values().cloned().collect();
            names.sort();
            names.dedup();
            names
        } else {
            let entries = std::fs::read_dir(dir).map_err(|source| io(dir, source))?;
            let mut names = Vec::new();
            for entry in entries {
                let name = entry.map_err(|source| io(dir, source))?.file_name().to_string_lossy().into_owned();
                if name.ends_with(".safetensors") {
                    names.push(name);
                }
            }
            names.sort();
            names
        };
        if shard_names.is_empty() {
            return Err(EngineError::MissingTensor {
                tensor: "model.embed_tokens.weight".into(),
                file: format!("{} (no *.safetensors file)", dir.display()),
            });
        }
        let mut files: Vec<SafetensorsFile> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        let mut skipped = Skipped::default();
        // Every tensor of the shards, the text model's or not -> index into `files`.
        let mut owner: HashMap<String, usize> = HashMap::new();
        for name in &shard_names {
            let path = super::shard_path::shard_path(dir, name)?;
            let file = SafetensorsFile::open(&path).map_err(|e| shard_error(e, &path))?;
            for tensor in file.names().map_err(|e| shard_error(e, file.path()))? {
                // Two copies would leave which one loads to the order of the shards: refused.
                if let Some(&first) = owner.get(&tensor) {
                    let first = files[first].path().display().to_string();
                    return Err(EngineError::DuplicateTensor { tensor, first, second: path.display().to_string() });
                }
                match layout.text_name(&tensor) {
                    Some(text) => {
                        by_name.insert(text.to_owned(), files.len());
                    }
                    None => {
                        // The header's offsets give the size; the data stays unread.
                        let t = file.tensor(&tensor).map_err(|e| shard_error(e, file.path()))?;
                        skipped.tensors += 1;
                        skipped.bytes += t.data().len() as u64;
                    }
                }
                owner.insert(tensor, files.len());
            }
            files.push(file);
        }
        // An index that names the wrong shard for a tensor is a broken checkpoint, not a detail.
        for (tensor, shard) in index.iter().flatten() {
            match owner.get(tensor).map(|&i| &shard_names[i]) {
                Some(actual) if actual == shard => {}
                found => {
                    return Err(EngineError::Config {
                        file: index_path.display().to_string(),
                        key: format!("weight_map.{tensor}"),
                        reason: match found {
                            Some(actual) => format!("says {shard}, but the tensor is in {actual}"),
                            None => format!("says {shard}, which does not hold it"),
                        },
                    });
                }
            }
        }
        Ok(Self { files, by_name, prefix: layout.text_prefix(), skipped, compute: None })
    }

    /// The tensors outside the text model, which loading skips.
    pub fn skipped(&self) -> Skipped {
        self.skipped
    }

    /// The shards' name of the text model's tensor `name`.
    fn stored(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Refuses a 16-bit float tensor of the other 16-bit type than its kind's in this checkpoint: bf16
    /// bits relabelled F16 in a header (or the reverse) would load as other numbers, with no other
    /// error. Weights hold to the type `torch_dtype` names (config.json's, `config` naming the file),
    /// or else to the first 16-bit weight's; INT4 scales (`*.weight_scale`), which a quantizer may
    /// keep in another type than the model's, hold to the first scale's. f32 tensors are accepted
    /// beside either: DeepSeek-V3 stores its router biases in f32.
    pub(crate) fn check_float_dtypes(&self, config: &str, torch_dtype: Option<&str>) -> Result<()> {
        // Per kind (weights, scales): the expected type and why it is expected.
        let declared = torch_dtype.and_then(|name| Some((half_type(name)?, name)));
        let mut weights = declared.map(|(dtype, name)| (dtype, format!("{config} declares torch_dtype {name}")));
        let mut scales = None;
        for file in &self.files {
            for tensor in file.names().map_err(|e| shard_error(e, file.path()))? {
                // A multimodal checkpoint's other tensors are never loaded: their types are theirs.
                if !tensor.strip_prefix(self.prefix).is_some_and(|text| self.by_name.contains_key(text)) {
                    continue;
                }
                let dtype = file.tensor(&tensor).map_err(|e| shard_error(e, file.path()))?.dtype();
                if !matches!(dtype, StDtype::BF16 | StDtype::F16) {
                    continue;
                }
                let expected = if tensor.ends_with(".weight_scale") { &mut scales } else { &mut weights };
                match expected {
                    None => *expected = Some((dtype, format!("{tensor} in {} is {dtype:?}", file.path().display()))),
                    Some((first, _)) if *first == dtype => {}
                    Some((first, why)) => {
                        return Err(EngineError::MixedFloatDtypes {
                            file: file.path().display().to_string(),
                            tensor,
                            dtype: format!("{dtype:?}"),
                            expected: format!("{first:?}"),
                            why: why.clone(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Every text-model tensor name of the checkpoint.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    fn file(&self, name: &str) -> Result<&SafetensorsFile> {
        match self.by_name.get(name) {
            Some(&i) => Ok(&self.files[i]),
            None => Err(EngineError::MissingTensor { tensor: self.stored(name), file: self.file_list() }),
        }
    }

    fn file_list(&self) -> String {
        let names: Vec<String> = self.files.iter().map(|f| f.path().display().to_string()).collect();
        names.join(", ")
    }

    /// The float dtype tensor `name` is stored in (from its header; `None` when absent or not a float).
    pub(crate) fn float_dtype(&self, name: &str) -> Option<ComputeDtype> {
        match self.file(name).ok()?.tensor(&self.stored(name)).ok()?.dtype() {
            StDtype::F32 => Some(ComputeDtype::F32),
            StDtype::BF16 => Some(ComputeDtype::Bf16),
            StDtype::F16 => Some(ComputeDtype::F16),
            _ => None,
        }
    }

    /// Converts every dense weight read from now on ([`Self::dense`], [`Self::linear`]) to `dtype`.
    pub(crate) fn set_compute(&mut self, dtype: ComputeDtype) {
        self.compute = Some(dtype);
    }

    /// A dense tensor of the given shape, bf16/f16/f32 on disk, converted to f32.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.values(name, shape)?.widen(0..shape.iter().product()))
    }

    /// A dense `[n, k]` weight, in the compute dtype when one is set ([`Self::set_compute`]), else
    /// in its dtype on disk.
    pub fn dense(&self, name: &str, n: usize, k: usize) -> Result<DenseWeight> {
        let values = self.values(name, &[n, k])?;
        DenseWeight::new(
            n,
            k,
            match self.compute {
                Some(dtype) => values.into_dtype(dtype),
                None => values,
            },
        )
    }

    fn values(&self, name: &str, shape: &[usize]) -> Result<DenseValues> {
        let file = self.file(name)?;
        let path = file.path().display().to_string();
        let name = &self.stored(name);
        let t = file.tensor(name).map_err(|e| shard_error(e, file.path()))?;
        if t.shape() != shape {
            return Err(EngineError::ShapeMismatch {
                file: path,
                tensor: name.clone(),
                expected: shape.to_vec(),
                actual: t.shape().to_vec(),
            });
        }
        let data = t.data();
        // Copied a block at a time, each block's mapped pages dropped once copied: the map never holds
        // more than a block of the tensor beside its copy.
        let blocks = |width: usize| {
            data.chunks(COPY_BLOCK).enumerate().flat_map(move |(i, block)| {
                file.release_part(name, 0..i * COPY_BLOCK);
                block.chunks_exact(width)
            })
        };
        let values = match t.dtype() {
            StDtype::BF16 => DenseValues::Bf16(blocks(2).map(|b| bf16::from_le_bytes([b[0], b[1]])).collect()),
            StDtype::F16 => DenseValues::F16(blocks(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect()),
            StDtype::F32 => DenseValues::F32(blocks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()),
            other => {
                return Err(EngineError::UnsupportedDtype {
                    file: path,
                    tensor: name.clone(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        file.release(name);
        Ok(values)
    }

    /// Drops the mapped pages of tensor `name` once it has been copied out (see
    /// [`SafetensorsFile::release`]): loading then holds about one tensor of the map at a time.
    fn release(&self, name: &str) {
        if let Ok(file) = self.file(name) {
            file.release(&self.stored(name));
        }
    }

    /// The `[n, k]`, group size and scale dtype of INT4 module `module`, from the headers alone:
    /// `None` when the checkpoint holds it dense or the config says it is not quantized (cases
    /// [`Self::linear`] loads or refuses).
    pub(crate) fn int4_header(
        &self,
        module: &str,
        group_size: Option<usize>,
    ) -> Result<Option<(usize, usize, usize, Dtype)>> {
        let packed = format!("{module}.weight_packed");
        let (Some(g), true) = (group_size, self.contains(&packed)) else { return Ok(None) };
        let header = |name: &str| {
            let file = self.file(name)?;
            let t = file.tensor(&self.stored(name)).map_err(|e| shard_error(e, file.path()))?;
            Ok::<_, EngineError>((file.path().display().to_string(), t.dtype(), t.shape().to_vec()))
        };
        let scale = format!("{module}.weight_scale");
        let (file, scale_dtype, _) = header(&scale)?;
        let dtype = Dtype::from_safetensors(scale_dtype).ok_or_else(|| EngineError::UnsupportedDtype {
            file,
            tensor: scale,
            dtype: format!("{scale_dtype:?}"),
        })?;
        match header(&packed)? {
            // Eight nibbles per int32 word along K (`weight_shape` holds the same, but in data).
            (_, _, shape) if shape.len() == 2 => Ok(Some((shape[0], 8 * shape[1], g, dtype))),
            (file, _, shape) => {
                Err(EngineError::MalformedTensor { file, tensor: packed, shape, expected: "[N, K / 8]" })
            }
        }
    }

    /// The `[n, k]` linear layer `module`: INT4 when the checkpoint holds `module.weight_packed`,
    /// dense when it holds `module.weight`. `group_size` is the config's for a module it says is
    /// quantized (`None`: dense); the checkpoint must agree.
    pub fn linear(&self, module: &str, n: usize, k: usize, group_size: Option<usize>) -> Result<HostLinear> {
        let packed = format!("{module}.weight_packed");
        let dense = format!("{module}.weight");
        let mismatch = |tensor: String, stored, expected| {
            let file = self.file(&tensor).map(|f| f.path().display().to_string()).unwrap_or_default();
            EngineError::QuantizationMismatch { file, tensor: self.stored(&tensor), stored, expected }
        };
        match (self.contains(&packed), group_size) {
            (true, Some(g)) => {
                // The three tensors may sit in different shards: each is found through the index.
                let tensor = |name: &str| {
                    let file = self
                        .file(name)
                        .map_err(|_| QuantError::MissingTensor { tensor: self.stored(name), file: self.file_list() })?;
                    file.tensor(&self.stored(name))
                };
                let file = self.file(&packed)?;
                let q =
                    kdtree_quant::read_quantized(module, Some(g), tensor).map_err(|e| shard_error(e, file.path()))?;
                for part in ["weight_packed", "weight_scale", "weight_shape"] {
                    self.release(&format!("{module}.{part}"));
                }
                if (q.n, q.k) != (n, k) {
                    return Err(EngineError::ShapeMismatch {
                        file: file.path().display().to_string(),
                        tensor: format!("{module}.weight_shape"),
                        expected: vec![n, k],
                        actual: vec![q.n, q.k],
                    });
                }
                Ok(HostLinear::Int4(q))
            }
            (true, None) => Err(mismatch(packed, "INT4", "dense")),
            (false, Some(_)) if self.contains(&dense) => Err(mismatch(dense, "dense", "INT4")),
            (false, Some(_)) => Err(EngineError::MissingTensor { tensor: packed, file: self.file_list() }),
            (false, None) => Ok(HostLinear::Dense(self.dense(&dense, n, k)?)),
        }
    }
}

fn read_index(path: &Path) -> Result<HashMap<String, String>> {
    let file = path.display().to_string();
    let text = super::json::read_capped(path, "a model.safetensors.index.json", MAX_INDEX_BYTES)?;
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: HashMap<String, String>,
    }
    serde_json::from_str::<Index>(&text).map(|i| i.weight_map).map_err(|e| EngineError::Config {
        file,
        key: "weight_map".into(),
        reason: e.to_string(),
    })
}

/// The 16-bit float type of a `torch_dtype` (`bfloat16`, `torch.float16`, ...); `None` for others
/// (float32, `auto`), which leave the checkpoint's 16-bit type to its first such tensor.
fn half_type(torch_dtype: &str) -> Option<StDtype> {
    match torch_dtype.strip_prefix("torch.").unwrap_or(torch_dtype) {
        "bfloat16" => Some(StDtype::BF16),
        "float16" | "half" => Some(StDtype::F16),
        _ => None,
    }
}

fn io(path: &Path, source: std::io::Error) -> EngineError {
    EngineError::Io { file: path.display().to_string(), source }
}

/// Names the file in every error of kdtree-quant's reader.
fn shard_error(e: QuantError, path: &Path) -> EngineError {
    let file = path.display().to_string();
    match e {
        QuantError::MalformedFile { reason, .. } => EngineError::TruncatedShard { file, reason },
        QuantError::MissingTensor { tensor, .. } => EngineError::MissingTensor { tensor, file },
        QuantError::ShapeMismatch { tensor, expected, actual } => {
            EngineError::ShapeMismatch { file, tensor, expected, actual }
        }
        QuantError::Io { source, .. } => EngineError::Io { file, source },
        other => {
            EngineError::Quant { file, tensor: other.tensor().unwrap_or_default().to_owned(), source: Box::new(other) }
        }
    }
}
