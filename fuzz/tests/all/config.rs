//! config.json of a tiny model, edited at random (keys removed, values replaced by huge, negative,
//! tiny or wrongly typed ones): reading it, loading the model and generating from it either work or
//! return an error that names an edited key or is one an edited key can cause, and never panic or
//! abort. Some edits keep the config valid, and those are accepted. Keys the engine does not read,
//! whatever their values, change nothing.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

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

/// Keys that set the tensors' shapes: a checkpoint written for other values holds tensors of other
/// shapes (the INT4 group size, in the quantization config, sets the scales').
const SHAPE_KEYS: [&str; 13] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "n_routed_experts",
    "n_shared_experts",
    "quantization_config",
];

/// Keys that set which tensors there are: layers, experts, the dense/MoE split, the low-rank q (a
/// `q_lora_rank` of null reads `q_proj`), a tied `lm_head`, and which modules are INT4.
const TENSOR_KEYS: [&str; 8] = [
    "num_hidden_layers",
    "n_routed_experts",
    "n_shared_experts",
    "first_k_dense_replace",
    "moe_layer_freq",
    "q_lora_rank",
    "tie_word_embeddings",
    "quantization_config",
];

/// Values a forward computes with, whose edits within their limits may still overflow it.
const NUMERIC_KEYS: [&str; 4] = ["rope_scaling", "rope_theta", "rms_norm_eps", "routed_scaling_factor"];

/// Whether `e`, the refusal of a config edited at `keys`, says what is wrong: an error of a key names
/// one of them (a check across keys names both: `n_group` "must divide n_routed_experts"); the
/// errors that name a tensor or an op instead come from an edited key that can cause them: a tensor
/// that the edited config implies is named where the checkpoint lacks it (an edit of which tensors
/// there are) or holds it otherwise (of their shapes, or of the quantization config); values within
/// their limits may still overflow a forward (a YaRN `mscale` of 1e26): that is caught as it runs,
/// naming the op and pointing at config.json.
fn names_an_edit(e: &EngineError, keys: &BTreeSet<String>) -> bool {
    let edited = |of: &[&str]| of.iter().any(|k| keys.contains(*k));
    match e {
        EngineError::UnknownQuantization { .. } | EngineError::QuantizationMismatch { .. } => {
            edited(&["quantization_config"])
        }
        EngineError::ShapeMismatch { .. } => edited(&SHAPE_KEYS),
        EngineError::MissingTensor { .. } => edited(&TENSOR_KEYS),
        EngineError::NonFinite { .. } => edited(&NUMERIC_KEYS),
        e => keys.iter().any(|k| e.to_string().contains(k.as_str())),
    }
}

#[test]
fn only_a_key_that_can_cause_an_error_of_a_tensor_or_an_op_accounts_for_it() {
    let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>();
    let shape = EngineError::ShapeMismatch {
        file: "model.safetensors".into(),
        tensor: "model.embed_tokens.weight".into(),
        expected: vec![64, 32],
        actual: vec![63, 32],
    };
    assert!(names_an_edit(&shape, &keys(&["vocab_size"])));
    assert!(!names_an_edit(&shape, &keys(&["rope_theta", "architectures"])));
    let missing =
        EngineError::MissingTensor { tensor: "model.layers.9.input_layernorm.weight".into(), file: "x".into() };
    assert!(names_an_edit(&missing, &keys(&["num_hidden_layers"])));
    assert!(!names_an_edit(&missing, &keys(&["rms_norm_eps"])));
    let overflow = EngineError::NonFinite { op: "layer 0 attention".into(), count: 3, total: 8 };
    assert!(names_an_edit(&overflow, &keys(&["rope_scaling", "mscale"])));
    assert!(!names_an_edit(&overflow, &keys(&["torch_dtype"])));
}

/// Runs edit cases against a tiny model of `spec` whose config.json they rewrite; with `raw` a case's
/// byte edits damage the JSON text too, and then only a panic fails it.
fn fuzz_config(spec: &TinySpec, strategy: impl Strategy<Value = (Vec<Edit>, Vec<ByteEdit>, bool)>) {
    let tiny = Tiny::new(spec);
    let (runs, accepted) = (cases(256), AtomicU32::new(0));
    TestRunner::new(Run { cases: runs, failure_persistence: None, ..Run::default() })
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
                Ok(_) if !raw => {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
                _ => Ok(()),
            }
        })
        .unwrap();
    // A loader that refused every edit would pass the cases above. Edits that keep the config valid
    // (a value within its limits, an unread key removed) are 6 to 9 in 100 of these cases: over the
    // 256 that CI runs, none accepted is a chance below 1e-5.
    if runs >= 256 {
        assert!(accepted.into_inner() > 0, "none of {runs} edited configs was accepted");
    }
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
