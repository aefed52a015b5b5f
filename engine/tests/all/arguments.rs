//! Bad arguments to the library's API: each refused with the variant of its cause, whose fields hold
//! what was wrong (the value, the bound, the option) and whose message says what is accepted.

use clap::Parser;
use kdtree_engine::cpu::CpuBackend;
use kdtree_engine::registry::Backend;
use kdtree_engine::spec::{CostModel, NoisyOracle, SpecArgs};
use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{EngineError, Model, greedy_generate};

fn tiny() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &TinySpec::default()).unwrap();
    let model = Model::load(dir.path()).unwrap();
    (dir, model)
}

#[test]
fn values_out_of_range_hold_the_value_and_say_the_bound() {
    let (_dir, mut model) = tiny();
    let e = model.set_prefill_chunk(0).unwrap_err();
    assert!(matches!(&e, EngineError::ArgumentOutOfRange { value: 0, .. }), "{e}");
    assert_eq!(e.to_string(), "the prefill chunk is 0: it must hold at least 1 token");

    let e = NoisyOracle::new(vec![1, 2], 1.5, 1, 10).unwrap_err();
    assert!(matches!(e, EngineError::NotAProbability { value: 1.5, .. }), "{e}");
    assert_eq!(e.to_string(), "the noisy oracle's p is 1.5, not a probability in [0, 1]");
    let e = NoisyOracle::new(vec![0], 0.5, 1, 1).unwrap_err();
    assert!(matches!(e, EngineError::ArgumentOutOfRange { value: 1, .. }), "{e}");
    assert!(e.to_string().contains("2 tokens or more"), "{e}");
}

#[test]
fn an_empty_prompt_is_refused_naming_the_op_that_got_it() {
    let (_dir, model) = tiny();
    let e = greedy_generate(&model, &[], 3, &[]).unwrap_err();
    assert!(matches!(e, EngineError::EmptyPrompt { op: "greedy_generate" }), "{e}");
    assert_eq!(e.to_string(), "greedy_generate: the prompt is empty");
}

#[test]
fn a_cost_model_names_its_file_when_it_has_one() {
    let e = CostModel::new("gpu".into(), "model".into(), vec![]).unwrap_err();
    assert!(matches!(&e, EngineError::CostModel { file: None, reason } if reason == "no points"), "{e}");
    assert_eq!(e.to_string(), "cost model: no points");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cost.json");
    let file = path.display().to_string();
    std::fs::write(&path, r#"{"device": "gpu", "model": "m", "points": [[2, 10.0], [1, 9.0]]}"#).unwrap();
    let e = CostModel::load(&path).unwrap_err();
    assert!(matches!(&e, EngineError::CostModel { file: Some(f), .. } if *f == file), "{e}");
    assert_eq!(e.to_string(), format!("{file} is not a usable cost model: T must ascend"));
    std::fs::write(&path, "[1, 2]").unwrap();
    let e = CostModel::load(&path).unwrap_err();
    assert!(e.to_string().starts_with(&format!("{file} is not a usable cost model: invalid type")), "{e}");
}

/// [`SpecArgs`] on a command line of its own.
#[derive(Parser)]
struct Spec {
    #[command(flatten)]
    spec: SpecArgs,
}

#[test]
fn spec_options_that_do_not_go_together_name_the_option() {
    let args = Spec::try_parse_from(["spec", "--spec", "chain", "--cost-model", "cost.json"]).unwrap().spec;
    let e = args.method().unwrap_err();
    assert!(matches!(&e, EngineError::SpecOption { option, .. } if option == "--cost-model"), "{e}");
    assert_eq!(e.to_string(), "--cost-model sizes DDTree's trees, not a chain: drop it or pass --spec ddtree");
}

/// A norm weight of another width than the rows is refused, and the residual add does not happen:
/// here 6 rows of 64 against a weight of 96, whose length divides the tensor's (4 rows of 96), so a
/// check of lengths alone would pass. Expanded per backend (the CUDA one in `cuda_ops`).
pub fn a_norm_of_another_width_is_refused_and_changes_nothing<B: Backend>(b: &B) {
    let values: Vec<f32> = (0..6 * 64).map(|i| i as f32 * 0.01).collect();
    let (mut x, y) = (b.upload(&values, 64).unwrap(), b.upload(&values, 64).unwrap());
    let wide = b.vector(&[1.0; 96]).unwrap();
    let e = b.rmsnorm(&x, &wide, 1e-6).err().expect("rmsnorm takes a 96-wide weight for 64-wide rows");
    assert!(matches!(e, EngineError::Shape { op: "rmsnorm", .. }), "{e}");
    assert!(e.to_string().contains("rows of 64 against a weight of 96"), "{e}");
    let e = b.add_rmsnorm(&mut x, &y, &wide, 1e-6).err().expect("add_rmsnorm takes a 96-wide weight");
    assert!(matches!(e, EngineError::Shape { op: "add_rmsnorm", .. }), "{e}");
    assert_eq!(b.to_host(&x).unwrap(), values, "the refused add_rmsnorm changed x");
}

#[test]
fn a_norm_of_another_width_is_refused_on_the_cpu() {
    a_norm_of_another_width_is_refused_and_changes_nothing(&CpuBackend);
}
