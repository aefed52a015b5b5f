//! Safetensors shards of a tiny INT4 model with their JSON headers edited at random: opening one,
//! reading its tensors and INT4 weights, and loading the model either work or are errors, and never
//! panic.

use std::path::Path;

use kdtree_engine::Model;
use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_fuzz::mutate::{byte_edits, cases, edited, edits};
use kdtree_quant::SafetensorsFile;
use proptest::prelude::*;
use proptest::test_runner::{Config as Run, TestRunner};

const SHARD: &str = "model-00002-of-00002.safetensors";

/// The header JSON and the data bytes of a safetensors file.
fn split(file: &[u8]) -> (serde_json::Value, Vec<u8>) {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&file[8..8 + n]).unwrap(), file[8 + n..].to_vec())
}

fn join(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.extend_from_slice(data);
    file
}

fn read_everything(path: &Path) {
    let Ok(file) = SafetensorsFile::open(path) else { return };
    for name in file.names().unwrap_or_default() {
        let _ = file.tensor(&name);
        if let Some(prefix) = name.strip_suffix(".weight_packed") {
            let _ = file.quantized_weight(prefix, None);
            let _ = file.quantized_weight(prefix, Some(32));
        }
    }
}

#[test]
fn edited_shard_headers_are_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &TinySpec { int4_experts: true, ..TinySpec::default() }).unwrap();
    let path = dir.path().join(SHARD);
    let (header, data) = split(&std::fs::read(&path).unwrap());
    let strategy = (edits(), byte_edits(), prop::bool::weighted(0.2));
    TestRunner::new(Run { cases: cases(256), failure_persistence: None, ..Run::default() })
        .run(&strategy, |(edits, bytes, raw)| {
            let mut header = serde_json::to_vec(&edited(&header, &edits)).unwrap();
            if raw {
                bytes.iter().for_each(|b| b.apply(&mut header));
            }
            std::fs::write(&path, join(&header, &data)).unwrap();
            read_everything(&path);
            let _ = Model::load(dir.path());
            Ok(())
        })
        .unwrap();
}
