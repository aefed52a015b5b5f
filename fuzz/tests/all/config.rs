//! config.json of a tiny model, edited at random (keys removed, values replaced by huge, negative,
//! tiny or wrongly typed ones): reading it, loading the model and generating from it either work or
//! return an error that names an edited key, and never panic or abort. Keys the engine does not read,
//! whatever their values, change nothing.

use std::collections::BTreeSet;
use std::path::Path;

use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{Config, EngineError, Model, greedy_generate};
use kdtree_fuzz::mutate::{ByteEdit, Edit, byte_edits, cases, edited_keys, edits, hostile_value};
use proptest::prelude::*;
use proptest::test_runner::{Config as Run, TestCaseError, TestRunner};
use serde_json::Value;

const PROMPT: [u32; 3] = [1, 2, 3];

/// A tiny model folder of `spec`, its config.json's path and contents, and the tokens it generates.
struct Tiny {
    dir: tempfile::TempDir,
    config: Value,
    tokens: Vec<u32>,
}

impl Tiny {
    fn new(spec: &TinySpec) -> Tiny {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_model(dir.path(), spec).unwrap();
        let config = serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
        // The unedited config is accepted: a loader that refused everything would pass the rest.
        let tokens = generate(dir.path()).unwrap_or_else(|e| panic!("the unedited config is refused: {e}"));
        Tiny { dir, config, tokens }
    }

    fn write_config(&self, text: &[u8]) {
        std::fs::write(self.dir.path().join("config.json"), text).unwrap();
    }
}

/// Loads the model of `dir` and generates three tokens from it.
fn generate(dir: &Path) -> kdtree_engine::Result<Vec<u32>> {
    Config::load(&dir.join("config.json"))?;
    greedy_generate(&Model::load(dir)?, &PROMPT, 3, &[])
}

/// Whether `e`, the refusal of a config edited at `keys`, says what is wrong: an error of a key names
/// one of them (a check across keys names both: `n_group` "must divide n_routed_experts"), an
/// unsupported quantization format is the quantization config's, and a tensor that the edited config
/// implies is named where the checkpoint lacks it or holds it otherwise. Values within their limits
/// may still overflow a forward (a YaRN `mscale` of 1e26): that is caught as it runs, naming the op
/// and pointing at config.json.
fn names_an_edit(e: &EngineError, keys: &BTreeSet<String>) -> bool {
    match e {
        EngineError::UnknownQuantization { .. } => keys.contains("quantization_config"),
        EngineError::ShapeMismatch { .. }
        | EngineError::MissingTensor { .. }
        | EngineError::QuantizationMismatch { .. }
        | EngineError::NonFinite { .. } => true,
        e => keys.iter().any(|k| e.to_string().contains(k.as_str())),
    }
}

/// Runs edit cases against a tiny model of `spec` whose config.json they rewrite; with `raw` a case's
/// byte edits damage the JSON text too, and then only a panic fails it.
fn fuzz_config(spec: &TinySpec, strategy: impl Strategy<Value = (Vec<Edit>, Vec<ByteEdit>, bool)>) {
    let tiny = Tiny::new(spec);
    TestRunner::new(Run { cases: cases(256), failure_persistence: None, ..Run::default() })
        .run(&strategy, |(edits, bytes, raw)| {
            let (config, keys) = edited_keys(&tiny.config, &edits);
            let mut text = serde_json::to_vec(&config).unwrap();
            if raw {
                bytes.iter().for_each(|b| b.apply(&mut text));
            }
            tiny.write_config(&text);
            match generate(tiny.dir.path()) {
                Err(e) if !raw && !names_an_edit(&e, &keys) => {
                    Err(TestCaseError::fail(format!("the refusal of an edit of {keys:?} names none of them: {e}")))
                }
                _ => Ok(()),
            }
        })
        .unwrap();
}

#[test]
fn edited_configs_of_a_dense_model_are_refused_naming_the_edit_and_never_panic() {
    fuzz_config(&TinySpec::default(), (edits(), byte_edits(), prop::bool::weighted(0.1)));
}

#[test]
fn edited_configs_of_an_int4_model_are_refused_naming_the_edit_and_never_panic() {
    let spec = TinySpec { int4_experts: true, rope_scaling: None, ..TinySpec::default() };
    fuzz_config(&spec, (edits(), byte_edits(), prop::bool::weighted(0.1)));
}

/// Keys that real configs carry and the engine does not read, and made-up ones.
fn unread_key() -> impl Strategy<Value = String> {
    let real =
        vec!["architectures", "auto_map", "transformers_version", "use_cache", "initializer_range", "pad_token_id"];
    prop_oneof![prop::sample::select(real).prop_map(str::to_owned), "[a-z_]{1,12}x[0-9]"]
}

#[test]
fn keys_the_engine_does_not_read_are_accepted_and_change_nothing() {
    let tiny = Tiny::new(&TinySpec::default());
    let added = prop::collection::btree_map(unread_key(), hostile_value(), 1..=4);
    TestRunner::new(Run { cases: cases(64), failure_persistence: None, ..Run::default() })
        .run(&added, |added| {
            let mut config = tiny.config.clone();
            config.as_object_mut().unwrap().extend(added);
            tiny.write_config(&serde_json::to_vec(&config).unwrap());
            let tokens = generate(tiny.dir.path()).map_err(|e| TestCaseError::fail(format!("refused: {e}")))?;
            prop_assert_eq!(tokens, tiny.tokens.clone());
            Ok(())
        })
        .unwrap();
}
