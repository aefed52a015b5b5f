//! The model on tiny generated checkpoints: prefill against one-token decoding, tree forwards
//! against sequential ones, and greedy generation.

use kdtree_engine::registry::KvStore;
use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{Model, TreeMask, greedy_generate};

fn load(spec: &TinySpec) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), spec).unwrap();
    let model = Model::load(dir.path()).unwrap();
    (dir, model)
}

const PROMPT: [u32; 7] = [3, 141, 59, 26, 5, 35, 89];

/// Logits of `tokens` fed one at a time through the cache.
fn sequential(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    let mut out = Vec::new();
    for (p, &t) in tokens.iter().enumerate() {
        out.extend(model.forward(&mut cache, &[t], &[p], None).unwrap());
    }
    out
}

/// Holds bitwise: every op is row-independent and attention sums the same keys in the same order.
#[test]
fn prefill_equals_token_by_token_decoding_bitwise() {
    for spec in
        [TinySpec::default(), TinySpec { int4_experts: true, q_lora_rank: None, seed: 7, ..TinySpec::default() }]
    {
        let (_dir, model) = load(&spec);
        let mut cache = model.new_cache();
        let positions: Vec<usize> = (0..PROMPT.len()).collect();
        let prefill = model.forward(&mut cache, &PROMPT, &positions, None).unwrap();
        assert_eq!(cache.len(), PROMPT.len());
        assert_eq!(prefill.len(), PROMPT.len() * model.config.vocab_size);
        assert!(prefill.iter().all(|v| v.is_finite()));
        assert_eq!(prefill, sequential(&model, &PROMPT));
    }
}

#[test]
fn tree_forward_logits_equal_the_sequential_forward_at_every_node_bitwise() {
    let (_dir, model) = load(&TinySpec { seed: 3, ..TinySpec::default() });
    let vocab = model.config.vocab_size;
    let context = &PROMPT[..4];
    // root 0 -> {1, 2}; 1 -> {3, 4}; 2 -> 5; 4 -> 6
    let parents = [None, Some(0), Some(0), Some(1), Some(1), Some(2), Some(4)];
    let tokens = [200u32, 17, 99, 4, 250, 17, 63];
    let depth = |mut i: usize| {
        let mut d = 0;
        while let Some(p) = parents[i] {
            i = p;
            d += 1;
        }
        d
    };
    let mut cache = model.new_cache();
    let positions: Vec<usize> = (0..context.len()).collect();
    model.forward(&mut cache, context, &positions, None).unwrap();
    let tree_positions: Vec<usize> = (0..tokens.len()).map(|i| context.len() + depth(i)).collect();
    let mask = TreeMask::from_parents(&parents);
    let tree = model.forward(&mut cache, &tokens, &tree_positions, Some(&mask)).unwrap();
    for node in 0..tokens.len() {
        let mut path = vec![node];
        while let Some(p) = parents[*path.last().unwrap()] {
            path.push(p);
        }
        let seq: Vec<u32> = context.iter().copied().chain(path.iter().rev().map(|&i| tokens[i])).collect();
        let expect = sequential(&model, &seq);
        assert_eq!(tree[node * vocab..][..vocab], expect[(seq.len() - 1) * vocab..], "node {node}");
    }
}

#[test]
fn compacting_the_accepted_path_leaves_the_cache_of_the_path_alone() {
    let (_dir, model) = load(&TinySpec::default());
    let vocab = model.config.vocab_size;
    let parents = [None, Some(0), Some(0), Some(2)];
    let tokens = [10u32, 20, 30, 40];
    let mut cache = model.new_cache();
    model.forward(&mut cache, &PROMPT[..3], &[0, 1, 2], None).unwrap();
    model.forward(&mut cache, &tokens, &[3, 4, 4, 5], Some(&TreeMask::from_parents(&parents))).unwrap();
    cache.compact(3, &[0, 2, 3]).unwrap();
    assert_eq!(cache.len(), 6);
    let next = model.forward(&mut cache, &[50], &[6], None).unwrap();
    let expect = sequential(&model, &[PROMPT[0], PROMPT[1], PROMPT[2], 10, 30, 40, 50]);
    assert_eq!(next, expect[6 * vocab..]);
}

#[test]
fn greedy_generation_is_the_argmax_chain_and_stops_at_the_stop_token() {
    let (_dir, model) = load(&TinySpec { seed: 11, ..TinySpec::default() });
    let vocab = model.config.vocab_size;
    let out = greedy_generate(&model, &PROMPT, 6, &[]).unwrap();
    assert_eq!(out.len(), 6);
    let mut seq = PROMPT.to_vec();
    for &t in &out {
        let logits = sequential(&model, &seq);
        assert_eq!(kdtree_engine::ops::cpu::argmax(&logits[(seq.len() - 1) * vocab..], vocab)[0], t);
        seq.push(t);
    }
    let stopped = greedy_generate(&model, &PROMPT, 6, &[out[2]]).unwrap();
    let first = out.iter().position(|&t| t == out[2]).unwrap();
    assert_eq!(stopped, out[..=first]);
}

/// Prompts longer than any one forward's limit (8192 tokens once) run in causal chunks, and the
/// chunking changes no bits: the first token and the next step's logits are equal for two chunk sizes.
#[test]
fn a_9000_token_prompt_prefills_in_chunks_with_the_same_bits_for_any_chunk_size() {
    let spec = TinySpec { num_hidden_layers: 2, max_position_embeddings: 16384, seed: 5, ..TinySpec::default() };
    let (_dir, mut model) = load(&spec);
    let prompt: Vec<u32> = (0..9000u32).map(|i| (i * 7919 + 13) % 256).collect();
    let mut run = |chunk: usize| {
        model.set_prefill_chunk(chunk).unwrap();
        let mut cache = model.new_cache();
        let first = model.prefill(&mut cache, &prompt).unwrap();
        assert_eq!(cache.len(), prompt.len());
        let next = model.forward(&mut cache, &[first], &[prompt.len()], None).unwrap();
        (first, next)
    };
    let (first, next) = run(4096);
    assert!(next.iter().all(|v| v.is_finite()));
    assert_eq!((first, next), run(1000));
    assert!(model.set_prefill_chunk(0).is_err());
}

/// DeepSeek-V3's MoE without shared experts (`n_shared_experts: 0`) is the routed experts alone:
/// it loads, and its tree-free forwards agree with token-by-token decoding.
#[test]
fn a_moe_without_shared_experts_loads_and_decodes() {
    let (_dir, model) = load(&TinySpec { n_shared_experts: 0, ..TinySpec::default() });
    assert_eq!(model.config.n_shared_experts, 0);
    let mut cache = model.new_cache();
    let positions: Vec<usize> = (0..PROMPT.len()).collect();
    let prefill = model.forward(&mut cache, &PROMPT, &positions, None).unwrap();
    assert_eq!(prefill, sequential(&model, &PROMPT));
    let (_with_dir, with_shared) = load(&TinySpec::default());
    let mut cache = with_shared.new_cache();
    assert_ne!(prefill, with_shared.forward(&mut cache, &PROMPT, &positions, None).unwrap());
}

/// A Kimi K2.5-layout checkpoint (multimodal config, `language_model.` tensors, a vision tower and
/// projector) made by the engine's own generator loads its text model, skips the rest unread, and
/// decodes as the causal-LM layout of the same weights does, INT4 experts and all.
#[test]
fn a_kimi_k25_layout_loads_its_text_model_and_decodes_as_the_causal_lm() {
    use kdtree_engine::model::Layout;
    let text = TinySpec { int4_experts: true, seed: 3, ..TinySpec::default() };
    let (dir, k25) = load(&TinySpec { layout: Layout::KimiK25, ..text.clone() });
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "kimi_k25");
    assert!(config["text_config"]["hidden_size"].is_number() && config["quantization_config"].is_object());
    assert_eq!(k25.config.layout, Layout::KimiK25);
    let index = std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap();
    assert!(index.contains("\"language_model.model.layers.1.mlp.experts.0.up_proj.weight_packed\""));
    assert!(index.contains("\"language_model.lm_head.weight\"") && index.contains("\"vision_tower."));
    let skipped = k25.skipped();
    assert_eq!(skipped.tensors, 5);
    assert!(skipped.bytes > 0 && skipped.to_string().contains("vision tower"), "{skipped}");
    let (_text_dir, causal) = load(&text);
    assert_eq!(causal.skipped().tensors, 0);
    assert_eq!(k25.weight_bytes(), causal.weight_bytes());
    assert_eq!(greedy_generate(&k25, &PROMPT, 8, &[]).unwrap(), greedy_generate(&causal, &PROMPT, 8, &[]).unwrap());
}
