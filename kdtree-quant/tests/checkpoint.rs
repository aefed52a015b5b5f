//! compressed-tensors `pack-quantized` tensors in safetensors files.

use kdtree_quant::{Dtype, QuantError, QuantizedWeight, SafetensorsFile, Tensor, write_file};
use proptest::prelude::*;
use safetensors::Dtype as St;

fn sample(n: usize, k: usize, g: usize, dtype: Dtype, seed: u32) -> QuantizedWeight {
    let w: Vec<f32> =
        (0..n * k).map(|i| (((i as u32 ^ seed).wrapping_mul(2654435761) >> 16) as f32 / 65536.0 - 0.5) * 4.0).collect();
    QuantizedWeight::quantize(&w, n, k, g, dtype).unwrap()
}

fn write(dir: &tempfile::TempDir, tensors: &[(String, Tensor)]) -> std::path::PathBuf {
    let path = dir.path().join("model.safetensors");
    write_file(&path, tensors).unwrap();
    path
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn written_then_read_is_identical(n in 1usize..5, groups in 1usize..4, g in prop::sample::select(vec![32usize, 64, 128]),
                                      dtype in prop::sample::select(Dtype::ALL.to_vec()), seed in any::<u32>()) {
        let qw = sample(n, groups * g, g, dtype, seed);
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, &qw.to_tensors("model.layers.0.mlp.experts.0.up_proj"));
        let file = SafetensorsFile::open(&path).unwrap();
        prop_assert_eq!(file.quantized_weight("model.layers.0.mlp.experts.0.up_proj", None).unwrap(), qw.clone());
        prop_assert_eq!(file.quantized_weight("model.layers.0.mlp.experts.0.up_proj", Some(g)).unwrap(), qw);
    }
}

#[test]
fn bytes_follow_the_compressed_tensors_convention() {
    let qw = sample(2, 64, 32, Dtype::Bf16, 7);
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &qw.to_tensors("w"));
    let file = SafetensorsFile::open(&path).unwrap();

    let packed = file.tensor("w.weight_packed").unwrap();
    assert_eq!((packed.dtype(), packed.shape()), (St::I32, &[2usize, 8][..]));
    let q = qw.q();
    for (word_index, bytes) in packed.data().chunks_exact(4).enumerate() {
        // Little-endian int32 words; element j of each run of eight at bits 4j, stored as q + 8.
        let word = i32::from_le_bytes(bytes.try_into().unwrap()) as u32;
        let expect = (0..8).fold(0u32, |acc, j| acc | (((q[word_index * 8 + j] + 8) as u32) << (4 * j)));
        assert_eq!(word, expect, "word {word_index}");
    }
    let scale = file.tensor("w.weight_scale").unwrap();
    assert_eq!((scale.dtype(), scale.shape()), (St::BF16, &[2usize, 2][..]));
    let shape = file.tensor("w.weight_shape").unwrap();
    assert_eq!((shape.dtype(), shape.shape()), (St::I64, &[2usize][..]));
    assert_eq!(shape.data(), [2i64, 64].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
}

fn replace(tensors: &mut [(String, Tensor)], name: &str, t: Tensor) {
    tensors.iter_mut().find(|(n, _)| n == name).unwrap().1 = t;
}

#[test]
fn k_not_a_multiple_of_the_group_size_names_the_tensor() {
    let mut tensors = sample(2, 64, 32, Dtype::F16, 1).to_tensors("blk");
    replace(&mut tensors, "blk.weight_shape", Tensor::new(St::I64, vec![2], &[2i64, 60]));
    let dir = tempfile::tempdir().unwrap();
    let err = SafetensorsFile::open(&write(&dir, &tensors)).unwrap().quantized_weight("blk", Some(32)).unwrap_err();
    assert!(
        matches!(&err, QuantError::KNotMultipleOfGroup { tensor, k: 60, group_size: 32 } if tensor == "blk"),
        "{err}"
    );
}

#[test]
fn shapes_and_dtypes_that_disagree_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let base = sample(2, 64, 32, Dtype::F16, 1).to_tensors("blk");

    let mut t = base.clone();
    replace(&mut t, "blk.weight_packed", Tensor::new(St::I32, vec![2, 7], &[0i32; 14]));
    let err = SafetensorsFile::open(&write(&dir, &t)).unwrap().quantized_weight("blk", None).unwrap_err();
    assert!(
        matches!(&err, QuantError::WeightShapeMismatch { packed_tensor, stored, expected: [2, 8], .. }
            if packed_tensor == "blk.weight_packed" && stored == &[2, 7]),
        "{err}"
    );

    let mut t = base.clone();
    replace(&mut t, "blk.weight_packed", Tensor::new(St::F32, vec![2, 8], &[0f32; 16]));
    let err = SafetensorsFile::open(&write(&dir, &t)).unwrap().quantized_weight("blk", None).unwrap_err();
    assert!(matches!(&err, QuantError::DtypeMismatch { tensor, .. } if tensor == "blk.weight_packed"), "{err}");

    let mut t = base.clone();
    replace(&mut t, "blk.weight_scale", Tensor::new(St::F32, vec![2, 2], &[0f32; 4]));
    let err = SafetensorsFile::open(&write(&dir, &t)).unwrap().quantized_weight("blk", None).unwrap_err();
    assert!(matches!(&err, QuantError::DtypeMismatch { tensor, .. } if tensor == "blk.weight_scale"), "{err}");

    let err = SafetensorsFile::open(&write(&dir, &base)).unwrap().quantized_weight("blk", Some(64)).unwrap_err();
    assert!(
        matches!(&err, QuantError::ShapeMismatch { tensor, expected, .. } if tensor == "blk.weight_scale" && expected == &[2, 1]),
        "{err}"
    );
}

#[test]
fn missing_tensors_name_tensor_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let tensors: Vec<_> =
        sample(2, 64, 32, Dtype::F16, 1).to_tensors("blk").into_iter().filter(|(n, _)| !n.ends_with("scale")).collect();
    let path = write(&dir, &tensors);
    let err = SafetensorsFile::open(&path).unwrap().quantized_weight("blk", None).unwrap_err();
    assert!(matches!(&err, QuantError::MissingTensor { tensor, .. } if tensor == "blk.weight_scale"), "{err}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn truncated_and_garbage_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &sample(2, 64, 32, Dtype::F16, 1).to_tensors("blk"));
    let bytes = std::fs::read(&path).unwrap();
    for cut in [0, 4, 8, 20, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let err = SafetensorsFile::open(&path).err().unwrap_or_else(|| panic!("cut at {cut} accepted"));
        assert!(matches!(err, QuantError::MalformedFile { .. }), "cut at {cut}: {err}");
    }
    std::fs::write(&path, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header").unwrap();
    assert!(matches!(SafetensorsFile::open(&path), Err(QuantError::MalformedFile { .. })));
    let missing = dir.path().join("absent.safetensors");
    assert!(matches!(SafetensorsFile::open(&missing), Err(QuantError::Io { .. })));
}

#[test]
fn an_absurd_weight_shape_is_reported_against_the_stored_words() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = sample(2, 64, 32, Dtype::F16, 1).to_tensors("blk");
    replace(&mut t, "blk.weight_shape", Tensor::new(St::I64, vec![2], &[1i64 << 62, 64]));
    let err = SafetensorsFile::open(&write(&dir, &t)).unwrap().quantized_weight("blk", Some(32)).unwrap_err();
    let message = err.to_string();
    assert_eq!(err.tensor(), Some("blk.weight_shape"));
    assert!(
        message.contains("blk.weight_packed is stored as [2, 8]")
            && message.contains("blk.weight_shape = [4611686018427387904, 64]"),
        "{message}"
    );
    assert!(!message.contains("blk.weight_scale"), "the scales are not to blame: {message}");
}

/// A safetensors file of `header` (JSON) and `data` bytes, written raw.
fn raw(dir: &tempfile::TempDir, header: &str, data: usize) -> std::path::PathBuf {
    let path = dir.path().join("raw.safetensors");
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + data, 0);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn malformed(path: &std::path::Path) -> String {
    match SafetensorsFile::open(path) {
        Err(QuantError::MalformedFile { reason, .. }) => reason,
        Err(other) => panic!("not MalformedFile: {other}"),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn a_tensor_listed_twice_in_the_header_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = r#""a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#;
    let path = raw(&dir, &format!("{{{t},{t}}}"), 4);
    assert!(malformed(&path).contains("tensor `a` is listed twice"));
    // Once is fine.
    assert!(SafetensorsFile::open(&raw(&dir, &format!("{{{t}}}"), 4)).is_ok());
}

#[test]
fn bad_offsets_name_the_tensor_they_are_wrong_for() {
    let dir = tempfile::tempdir().unwrap();
    let entry = |name: &str, start: usize, end: usize| {
        format!(r#""{name}":{{"dtype":"F32","shape":[4],"data_offsets":[{start},{end}]}}"#)
    };
    let header =
        |b: (usize, usize)| format!("{{{},{},{}}}", entry("a", 0, 16), entry("b", b.0, b.1), entry("c", 32, 48));
    // `b` past the data: the crate itself would blame `c`, the next in offset order.
    let reason = malformed(&raw(&dir, &header((100, 116)), 48));
    assert!(reason.contains("tensor `b`") && reason.contains("past the end") && !reason.contains("`c`"), "{reason}");
    let reason = malformed(&raw(&dir, &header((20, 16)), 48));
    assert!(reason.contains("tensor `b`") && reason.contains("end before they start"), "{reason}");
    let reason = malformed(&raw(&dir, &header((16, 28)), 48));
    assert!(
        reason.contains("tensor `b`") && reason.contains("hold 12 bytes") && reason.contains("16 bytes"),
        "{reason}"
    );
    // Overlaps and gaps name both neighbours.
    let reason = malformed(&raw(&dir, &header((8, 24)), 48));
    assert!(reason.contains("`b`") && reason.contains("overlaps tensor `a`"), "{reason}");
    let reason = malformed(&raw(&dir, &format!("{{{},{}}}", entry("a", 0, 16), entry("c", 32, 48)), 48));
    assert!(reason.contains("bytes 16..32 between tensor `a` and tensor `c`"), "{reason}");
    let reason = malformed(&raw(&dir, &header((16, 32)), 50));
    assert!(reason.contains("2 bytes after tensor `c`"), "{reason}");
    assert!(SafetensorsFile::open(&raw(&dir, &header((16, 32)), 48)).is_ok());
}
