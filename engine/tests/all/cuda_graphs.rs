//! On a GPU: forwards recorded as CUDA graphs and replayed give the ids the same forwards give op by
//! op, through cache growth (which drops the graphs), tree masks and DDTree; forwards that cannot be
//! recorded (the per-expert MoE path) run op by op. Run on a GPU machine:
//! `cargo test --release -p kdtree-engine --test cuda_graphs -- --ignored --nocapture`.

use std::path::Path;
use std::sync::Arc;

use crate::ddtree_common::{Script, Scripted, assert_exact, greedy_text};
use kdtree_engine::cuda::{CudaBackend, CudaKv, CudaOptions, CudaTensor, MoeKernels};
use kdtree_engine::registry::{Backend, KvStore};
use kdtree_engine::spec::TreeLimits;
use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{Model, TreeMask, greedy_generate};

fn load(dir: &Path, options: CudaOptions) -> Model<CudaBackend> {
    Model::load_on(dir, Arc::new(CudaBackend::open(&options).expect("a GPU"))).expect("loads on CUDA")
}

/// The tiny INT4 model with graphs and without.
fn pair(dir: &Path) -> (Model<CudaBackend>, Model<CudaBackend>) {
    write_tiny_model(dir, &TinySpec { int4_experts: true, seed: 21, ..TinySpec::default() }).unwrap();
    let on = crate::gpu_common::options();
    (load(dir, on.clone()), load(dir, CudaOptions { graphs: false, ..on }))
}

/// [`pair`]'s models, and a cache of each after the same 9-token prompt, whose ids agree.
fn prefilled(dir: &Path) -> (Model<CudaBackend>, Model<CudaBackend>, CudaKv, CudaKv) {
    let (graphed, eager) = pair(dir);
    let vocab = graphed.config.vocab_size as u32;
    let (mut a, mut b) = (graphed.new_cache(), eager.new_cache());
    let prompt: Vec<u32> = (0..9).map(|i| (i * 31 + 7) % vocab).collect();
    let positions: Vec<usize> = (0..prompt.len()).collect();
    assert_eq!(
        graphed.forward_argmax(&mut a, &prompt, &positions, None).unwrap(),
        eager.forward_argmax(&mut b, &prompt, &positions, None).unwrap()
    );
    (graphed, eager, a, b)
}

#[test]
#[ignore = "needs a GPU"]
fn replayed_forwards_give_the_ids_of_forwards_run_op_by_op() {
    let dir = tempfile::tempdir().unwrap();
    let (graphed, eager, mut a, mut b) = prefilled(dir.path());
    let vocab = graphed.config.vocab_size as u32;
    // Trees of 6 nodes, step after step: the first runs op by op, the second is recorded, the rest
    // replay it with their own tokens, positions and cache length.
    let parents = [None, Some(0), Some(0), Some(1), Some(1), Some(2)];
    let mask = TreeMask::from_parents(&parents);
    for step in 0..5u32 {
        let past = a.len();
        let tokens: Vec<u32> = (0..6).map(|i| (step * 101 + i * 13 + 5) % vocab).collect();
        let positions = [past, past + 1, past + 1, past + 2, past + 2, past + 2];
        let got = graphed.forward_argmax(&mut a, &tokens, &positions, Some(&mask)).unwrap();
        let want = eager.forward_argmax(&mut b, &tokens, &positions, Some(&mask)).unwrap();
        assert_eq!(got, want, "step {step}");
        assert_eq!(a.len(), b.len());
        // Keep the first path only, as verification would.
        a.compact(past, &[0, 1, 3]).unwrap();
        b.compact(past, &[0, 1, 3]).unwrap();
        assert_eq!(a.recorded_graphs(), usize::from(step >= 1), "step {step}");
    }
    assert_eq!(b.recorded_graphs(), 0, "graphs off records nothing");
}

/// A forward that hands out hidden states to a drafter (DFlash's taps) is recorded too, keyed by its
/// layers beside its size: replays give the taps and ids of the same forward run op by op, bit for bit.
#[test]
#[ignore = "needs a GPU"]
fn replayed_tapped_forwards_give_the_taps_of_forwards_run_op_by_op() {
    let dir = tempfile::tempdir().unwrap();
    let (graphed, eager, mut a, mut b) = prefilled(dir.path());
    let vocab = graphed.config.vocab_size as u32;
    let host = |m: &Model<CudaBackend>, t: Option<CudaTensor>| m.backend().to_host(&t.expect("taps")).unwrap();
    let mask = TreeMask::from_parents(&[None, Some(0), Some(0), Some(1)]);
    for (step, layers) in [[1, 0], [1, 0], [1, 0], [0, 1], [0, 1], [1, 0]].iter().enumerate() {
        let past = a.len();
        let tokens: Vec<u32> = (0..4).map(|i| (step as u32 * 57 + i * 11 + 3) % vocab).collect();
        let positions = [past, past + 1, past + 1, past + 2];
        let (got, got_taps) = graphed.forward_argmax_tapped(&mut a, &tokens, &positions, Some(&mask), layers).unwrap();
        let (want, want_taps) = eager.forward_argmax_tapped(&mut b, &tokens, &positions, Some(&mask), layers).unwrap();
        assert_eq!(got, want, "step {step}");
        let (got_taps, want_taps) = (host(&graphed, got_taps), host(&eager, want_taps));
        assert_eq!(got_taps.len(), 4 * 2 * graphed.config.hidden_size);
        assert!(got_taps.iter().zip(&want_taps).all(|(x, y)| x.to_bits() == y.to_bits()), "step {step}: taps differ");
        a.compact(past, &[0, 1, 3]).unwrap();
        b.compact(past, &[0, 1, 3]).unwrap();
    }
    // [1, 0] recorded at its second run, [0, 1] at its second: two graphs of one size.
    assert_eq!(a.recorded_graphs(), 2);
}

#[test]
#[ignore = "needs a GPU"]
fn graphed_greedy_decoding_survives_the_cache_growing() {
    let dir = tempfile::tempdir().unwrap();
    let (graphed, eager) = pair(dir.path());
    // The cache starts at 256 entries: 300 tokens after a prompt of 8 grow it once, mid-decode, which
    // moves its layers and drops the graph recorded from them.
    let prompt = [5u32, 6, 7, 8, 9, 5, 6, 7];
    let got = greedy_generate(&graphed, &prompt, 300, &[]).unwrap();
    let want = greedy_generate(&eager, &prompt, 300, &[]).unwrap();
    assert_eq!(got, want);
}

#[test]
#[ignore = "needs a GPU"]
fn graphed_ddtree_equals_greedy_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let (graphed, _) = pair(dir.path());
    let vocab = graphed.config.vocab_size;
    let prompt = [2u32, 7, 1, 8, 2, 8];
    let text = greedy_text(&graphed, &prompt, 48);
    // The oracle's trees have one size a round, the random drafter's many: each size is recorded on
    // its second round and replayed after.
    for (script, budget) in [(Script::Oracle, 4), (Script::Random { seed: 3 }, 16), (Script::Random { seed: 4 }, 6)] {
        let mut drafter = Scripted::new(text.clone(), vocab, script);
        assert_exact(&graphed, &mut drafter, &prompt, 48, TreeLimits { budget, draft_len: 6 }, None);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn per_expert_moe_runs_op_by_op_with_graphs_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let (graphed, _) = pair(dir.path());
    let per_expert = load(dir.path(), CudaOptions { moe: MoeKernels::PerExpert, ..crate::gpu_common::options() });
    let prompt = [3u32, 1, 4, 1, 5];
    let want = greedy_generate(&graphed, &prompt, 12, &[]).unwrap();
    assert_eq!(greedy_generate(&per_expert, &prompt, 12, &[]).unwrap(), want);
    let mut cache = per_expert.new_cache();
    for position in 0..4 {
        per_expert.forward_argmax(&mut cache, &[7], &[position], None).unwrap();
    }
    assert_eq!(cache.recorded_graphs(), 0, "a forward that reads its routing back cannot be recorded");
}
