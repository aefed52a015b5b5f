//! config.json of a tiny model, edited at random (keys removed, values replaced by huge, negative,
//! tiny or wrongly typed ones): reading it, loading the model and generating from it either work or
//! return an error, and never panic or abort.

use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{Config, Model, greedy_generate};
use kdtree_fuzz::mutate::{ByteEdit, Edit, byte_edits, cases, edited, edits};
use proptest::prelude::*;
use proptest::test_runner::{Config as Run, TestRunner};

/// Runs `edit` cases against a tiny model folder of `spec` whose config.json it rewrites.
fn fuzz_config(spec: &TinySpec, strategy: impl Strategy<Value = (Vec<Edit>, Vec<ByteEdit>, bool)>) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), spec).unwrap();
    let path = dir.path().join("config.json");
    let original: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    TestRunner::new(Run { cases: cases(256), failure_persistence: None, ..Run::default() })
        .run(&strategy, |(edits, bytes, raw)| {
            let mut text = serde_json::to_vec(&edited(&original, &edits)).unwrap();
            if raw {
                bytes.iter().for_each(|b| b.apply(&mut text));
            }
            std::fs::write(&path, &text).unwrap();
            // Ok or Err; a panic fails the case.
            if let Ok(model) = Config::load(&path).and_then(|_| Model::load(dir.path())) {
                let _ = greedy_generate(&model, &[1, 2, 3], 3, &[]);
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn edited_configs_of_a_dense_model_never_panic() {
    fuzz_config(&TinySpec::default(), (edits(), byte_edits(), prop::bool::weighted(0.1)));
}

#[test]
fn edited_configs_of_an_int4_model_never_panic() {
    let spec = TinySpec { int4_experts: true, rope_scaling: None, ..TinySpec::default() };
    fuzz_config(&spec, (edits(), byte_edits(), prop::bool::weighted(0.1)));
}
