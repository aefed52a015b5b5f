//! Reading and writing quantized weights as compressed-tensors `pack-quantized` tensors in
//! safetensors files: `<name>.weight_packed` (int32 [N, K/8]), `<name>.weight_scale`
//! (f16 or bf16 [N, K/G]) and `<name>.weight_shape` (int64 `[2]` = `[N, K]`; compressed-tensors
//! writes `torch.tensor(weight.shape)`, which is int64).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Metadata, TensorInfo, TensorView};
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::dtype::Dtype;
use crate::error::{QuantError, Result};
use crate::scales::Scales;
use crate::weight::{QuantizedWeight, check_group};
use crate::{header, int4};

/// An owned tensor to be written: dtype, shape and little-endian bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Tensor {
    pub fn new<T: bytemuck::Pod>(dtype: StDtype, shape: Vec<usize>, values: &[T]) -> Self {
        Self { dtype, shape, data: bytemuck::cast_slice(values).to_vec() }
    }

    fn view(&self) -> TensorView<'_> {
        TensorView::new(self.dtype, self.shape.clone(), &self.data)
            .expect("Tensor::new keeps shape and bytes consistent")
    }
}

/// Writes tensors to a safetensors file.
pub fn write_file(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let views = tensors.iter().map(|(name, t)| (name.clone(), t.view()));
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, path)
        .map_err(|e| QuantError::Io { file: path.display().to_string(), source: std::io::Error::other(e.to_string()) })
}

/// A safetensors file mapped into memory, its header parsed and checked once at open. Tensors are
/// read straight from the map, so opening a shard costs its header, not its size; pages of a tensor
/// already taken can be dropped again with [`SafetensorsFile::release`].
pub struct SafetensorsFile {
    path: PathBuf,
    map: memmap2::Mmap,
    /// Where the tensors' data starts: after the 8-byte header length and the header.
    data_start: usize,
    metadata: Metadata,
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| QuantError::Io { file: path.display().to_string(), source };
        let file = crate::open_regular(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; a checkpoint rewritten while it
        // is mapped is outside the engine's contract (as for every reader of mapped files).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let malformed = |e: safetensors::SafeTensorError| QuantError::MalformedFile {
            file: path.display().to_string(),
            reason: e.to_string(),
        };
        // Full validation once (no tensor named twice, offsets contiguous and inside the file), then
        // only the metadata is kept.
        header::check(&map).map_err(|reason| QuantError::MalformedFile { file: path.display().to_string(), reason })?;
        SafeTensors::deserialize(&map).map_err(malformed)?;
        let (header, metadata) = SafeTensors::read_metadata(&map).map_err(malformed)?;
        Ok(Self { path: path.to_owned(), map, data_start: 8 + header, metadata })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }

    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self.metadata.tensors().into_keys().collect();
        names.sort();
        Ok(names)
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.metadata.info(name).ok_or_else(|| QuantError::MissingTensor { tensor: name.into(), file: self.name() })
    }

    /// One tensor, or [`QuantError::MissingTensor`] naming it and the file.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let info = self.info(name)?;
        let (start, end) = info.data_offsets;
        let data = &self.map[self.data_start + start..self.data_start + end];
        TensorView::new(info.dtype, info.shape.clone(), data)
            .map_err(|e| QuantError::MalformedFile { file: self.name(), reason: format!("tensor {name}: {e}") })
    }

    /// Lets the OS drop the pages of tensor `name` from memory (they are read again from the file if
    /// the tensor is taken again): what a loader calls once it has copied a tensor elsewhere.
    pub fn release(&self, name: &str) {
        self.release_part(name, 0..usize::MAX);
    }

    /// [`Self::release`] for bytes `range` of the tensor's data only (clamped to it): a loader copying
    /// a large tensor drops its pages as it goes, so the map never holds much of it at once.
    pub fn release_part(&self, name: &str, range: std::ops::Range<usize>) {
        let Ok(info) = self.info(name) else { return };
        let (start, end) = info.data_offsets;
        let (start, end) = (start + range.start.min(end - start), start + range.end.min(end - start));
        // Whole pages inside the range only: a page shared with a neighbour stays.
        let page = 4096;
        let from = (self.data_start + start).div_ceil(page) * page;
        let to = (self.data_start + end) / page * page;
        if to > from {
            // SAFETY: the map is read-only and file-backed, so dropping its pages loses nothing: a later
            // read faults them in again from the file.
            let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from) };
        }
    }

    /// Reads the quantized weight stored under `prefix` (`<prefix>.weight_packed`, ...).
    /// `group_size`, where the config states one, must agree with the scales' shape;
    /// otherwise it is inferred from them.
    pub fn quantized_weight(&self, prefix: &str, group_size: Option<usize>) -> Result<QuantizedWeight> {
        read_quantized(prefix, group_size, |name| self.tensor(name))
    }
}

/// Reads the quantized weight stored under `prefix` from the tensors `tensor` finds by name, which
/// may come from different files (a checkpoint's index may put a weight's three tensors in different
/// shards). `group_size` as for [`SafetensorsFile::quantized_weight`].
pub fn read_quantized<'a>(
    prefix: &str,
    group_size: Option<usize>,
    tensor: impl Fn(&str) -> Result<TensorView<'a>>,
) -> Result<QuantizedWeight> {
    let (n, k) = weight_shape(prefix, &tensor)?;
    // weight_shape is checked against the stored words first: every later expectation derives from it.
    let packed_name = format!("{prefix}.weight_packed");
    let packed = tensor(&packed_name)?;
    expect_dtype(&packed_name, &packed, StDtype::I32)?;
    let words = [n, k.div_ceil(int4::PER_WORD)];
    if packed.shape() != words {
        return Err(QuantError::WeightShapeMismatch {
            shape_tensor: format!("{prefix}.weight_shape"),
            declared: [n, k],
            packed_tensor: packed_name,
            stored: packed.shape().to_vec(),
            expected: words,
        });
    }
    let scale_name = format!("{prefix}.weight_scale");
    let scale = tensor(&scale_name)?;
    let dtype = Dtype::from_safetensors(scale.dtype()).ok_or_else(|| QuantError::DtypeMismatch {
        tensor: scale_name.clone(),
        expected: "F16 or BF16".into(),
        actual: format!("{:?}", scale.dtype()),
    })?;
    let group_size = match (group_size, scale.shape()) {
        (Some(g), _) => g,
        (None, [_, groups]) if *groups > 0 && k % groups == 0 => k / groups,
        (None, shape) => {
            return Err(QuantError::ShapeMismatch {
                tensor: scale_name,
                expected: vec![n, k / 32],
                actual: shape.to_vec(),
            });
        }
    };
    check_group(prefix, k, group_size)?;
    expect_shape(&scale_name, &scale, &[n, k / group_size])?;

    QuantizedWeight::from_parts(
        prefix,
        n,
        k,
        group_size,
        bytemuck::pod_collect_to_vec(packed.data()),
        Scales { dtype, bits: bytemuck::pod_collect_to_vec(scale.data()) },
    )
}

fn weight_shape<'a>(prefix: &str, tensor: impl Fn(&str) -> Result<TensorView<'a>>) -> Result<(usize, usize)> {
    let name = format!("{prefix}.weight_shape");
    let t = tensor(&name)?;
    let dims: Vec<i64> = match t.dtype() {
        StDtype::I64 => bytemuck::pod_collect_to_vec(t.data()),
        StDtype::I32 => bytemuck::pod_collect_to_vec::<u8, i32>(t.data()).into_iter().map(i64::from).collect(),
        other => {
            return Err(QuantError::DtypeMismatch {
                tensor: name,
                expected: "I64".into(),
                actual: format!("{other:?}"),
            });
        }
    };
    match dims[..] {
        [n, k] if n > 0 && k > 0 => Ok((n as usize, k as usize)),
        [n, k] => Err(QuantError::OutOfRange { tensor: name, value: n.min(k), range: "positive dimensions" }),
        _ => Err(QuantError::ShapeMismatch { tensor: name, expected: vec![2], actual: vec![dims.len()] }),
    }
}

fn expect_shape(name: &str, t: &TensorView<'_>, expected: &[usize]) -> Result<()> {
    if t.shape() == expected {
        Ok(())
    } else {
        Err(QuantError::ShapeMismatch { tensor: name.into(), expected: expected.to_vec(), actual: t.shape().to_vec() })
    }
}

fn expect_dtype(name: &str, t: &TensorView<'_>, expected: StDtype) -> Result<()> {
    if t.dtype() == expected {
        Ok(())
    } else {
        Err(QuantError::DtypeMismatch {
            tensor: name.into(),
            expected: format!("{expected:?}"),
            actual: format!("{:?}", t.dtype()),
        })
    }
}

impl QuantizedWeight {
    /// The three compressed-tensors tensors of this weight under `prefix`.
    pub fn to_tensors(&self, prefix: &str) -> Vec<(String, Tensor)> {
        vec![
            (
                format!("{prefix}.weight_packed"),
                Tensor::new(StDtype::I32, vec![self.n, self.k / int4::PER_WORD], &self.packed),
            ),
            (
                format!("{prefix}.weight_scale"),
                Tensor::new(self.scales.dtype.safetensors(), vec![self.n, self.groups_per_row()], &self.scales.bits),
            ),
            (format!("{prefix}.weight_shape"), Tensor::new(StDtype::I64, vec![2], &[self.n as i64, self.k as i64])),
        ]
    }
}
