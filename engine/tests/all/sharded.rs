//! The simulated tensor/expert/vocabulary-parallel backend against the single-rank CPU backend: the
//! same logits bit for bit, the same greedy tokens, DDTree equal to greedy, for rank counts that
//! divide every dimension, that do not (uneven blocks), and that exceed some (idle ranks).

use std::sync::Arc;

use kdtree_engine::cpu::CpuBackend;
use kdtree_engine::registry::Backend;
use kdtree_engine::sharded::{CollectiveLog, ShardedCpu, Traffic};
use kdtree_engine::spec::{LookupDrafter, TreeLimits, ddtree_generate};
use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{EngineError, Model, TreeMask, greedy_generate};

/// Rank counts that divide the tiny model's dimensions (1, 2, 4, 8: 8 ranks over 4 heads leaves
/// four idle), that do not (3, 5, 6: uneven blocks), and that exceed most of them (16).
const RANKS: [usize; 7] = [1, 2, 4, 8, 3, 5, 16];

/// The tiny model (bf16, or with INT4 routed experts) on one rank and on `ranks` simulated ranks.
fn models(int4_experts: bool, seed: u64, ranks: usize) -> (Model<CpuBackend>, Model<ShardedCpu>) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &TinySpec { seed, int4_experts, ..TinySpec::default() }).unwrap();
    let one = Model::load(dir.path()).unwrap();
    let many = Model::load_on(dir.path(), Arc::new(ShardedCpu::new(ranks).unwrap())).unwrap();
    (one, many)
}

/// Prompts of a few lengths from a fixed xorshift stream.
fn prompts(vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % vocab as u64) as u32
    };
    [1, 2, 5, 9].iter().map(|&n| (0..n).map(|_| next()).collect()).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A prefill, then a tree forward over it: the logits of both, as bits.
fn forwards<B: Backend>(model: &Model<B>, prompt: &[u32]) -> Vec<Vec<u32>> {
    let mut cache = model.new_cache();
    let n = prompt.len();
    let prefill = model.forward(&mut cache, prompt, &(0..n).collect::<Vec<_>>(), None).unwrap();
    let mask = TreeMask::from_parents(&[None, Some(0), Some(0), Some(2)]);
    let tree = model.forward(&mut cache, &[3, 1, 4, 1], &[n, n + 1, n + 1, n + 2], Some(&mask)).unwrap();
    vec![bits(&prefill), bits(&tree)]
}

#[test]
fn sharded_logits_are_the_single_rank_logits_bit_for_bit() {
    for int4 in [false, true] {
        for ranks in RANKS {
            let (one, many) = models(int4, 7, ranks);
            for prompt in prompts(one.config.vocab_size, 11 + ranks as u64) {
                assert_eq!(forwards(&many, &prompt), forwards(&one, &prompt), "{ranks} ranks, int4 {int4}, {prompt:?}");
            }
        }
    }
}

#[test]
fn sharded_greedy_and_ddtree_equal_single_rank_greedy() {
    let limits = TreeLimits { budget: 16, draft_len: 4 };
    for int4 in [false, true] {
        for ranks in [2, 4, 8, 3] {
            let (one, many) = models(int4, 3, ranks);
            let vocab = one.config.vocab_size;
            for prompt in [vec![5, 6, 7, 5, 6], vec![1, 2, 3, 1, 2, 3, 1]] {
                let greedy = greedy_generate(&one, &prompt, 16, &[]).unwrap();
                assert_eq!(greedy_generate(&many, &prompt, 16, &[]).unwrap(), greedy, "{ranks} ranks, int4 {int4}");
                let mut drafter = LookupDrafter::new(3, vocab);
                let (tokens, _) = ddtree_generate(&many, &mut drafter, &prompt, 16, limits, &[]).unwrap();
                assert_eq!(tokens, greedy, "DDTree on {ranks} ranks, int4 {int4}");
            }
        }
    }
}

#[test]
fn the_log_counts_one_forwards_collectives() {
    let (one, many) = models(false, 1, 2);
    let c = &one.config;
    let (t, h) = (3, c.hidden_size);
    let mut cache = many.new_cache();
    let _ = many.backend().take_log();
    many.forward_argmax(&mut cache, &[1, 2, 3], &[0, 1, 2], None).unwrap();
    let log = many.backend().take_log();

    // Output features of every linear of a layer's attention ([q_a; kv_a] stacked, both reading the
    // layer's input; q_b; o_proj), of a dense MLP and of the shared experts (gate_up, down).
    let heads = c.num_attention_heads;
    // kv_b_proj is no linear of its own: absorbed attention applies it inside the attention op.
    let attn = [c.q_lora_rank.unwrap() + c.kv_lora_rank + c.qk_rope_head_dim, heads * c.qk_head_dim(), h];
    let moe_layers = (0..c.num_hidden_layers).filter(|&i| c.is_moe_layer(i)).count();
    let dense_layers = c.num_hidden_layers - moe_layers;
    let mlp = |inter: usize| [2 * inter, h];
    let shared = mlp(c.moe_intermediate_size * c.n_shared_experts);
    let features: usize = c.num_hidden_layers * attn.iter().sum::<usize>()
        + dense_layers * mlp(c.intermediate_size).iter().sum::<usize>()
        + moe_layers * shared.iter().sum::<usize>()
        + c.vocab_size;
    let linears = c.num_hidden_layers * attn.len() + 2 * dense_layers + 2 * moe_layers + 1;
    let expected = CollectiveLog {
        embedding: Traffic { count: 1, bytes: 4 * t * h },
        linear: Traffic { count: linears, bytes: 4 * t * features },
        moe: Traffic { count: moe_layers, bytes: 4 * t * c.num_experts_per_tok * h * moe_layers },
        attention: Traffic { count: c.num_hidden_layers, bytes: 4 * t * heads * c.v_head_dim * c.num_hidden_layers },
        argmax: Traffic { count: 1, bytes: 8 * t * 2 },
    };
    assert_eq!(log, expected);
    assert_eq!(log.total().count, 1 + linears + moe_layers + c.num_hidden_layers + 1);
    assert_eq!(many.backend().take_log(), CollectiveLog::default(), "taking the log empties it");

    // One rank communicates nothing.
    let (_, single) = models(false, 1, 1);
    single.forward_argmax(&mut single.new_cache(), &[1, 2, 3], &[0, 1, 2], None).unwrap();
    assert_eq!(single.backend().take_log(), CollectiveLog::default());
}

#[test]
fn zero_ranks_is_an_error() {
    assert!(matches!(ShardedCpu::new(0), Err(EngineError::ArgumentOutOfRange { value: 0, .. })));
}

#[test]
fn the_distributed_argmax_is_the_first_maximum_of_the_row() {
    use kdtree_engine::cpu::CpuTensor;
    let nan = f32::NAN;
    let rows: [&[f32]; 6] = [
        &[1.0, 3.0, 2.0, 3.0, 0.0, 3.0, -1.0],
        &[nan, nan, nan, nan, nan, nan, nan],
        &[nan, nan, nan, nan, nan, -5.0, nan],
        &[0.0, -0.0, 0.0, -0.0, 0.0, 0.0, 0.0],
        &[-1.0, -1.0, -2.0, f32::INFINITY, nan, f32::INFINITY, 1.0],
        &[f32::NEG_INFINITY; 7],
    ];
    let x = CpuTensor { data: rows.concat(), cols: 7 };
    let expected = CpuBackend.argmax(&x).unwrap();
    for ranks in 1..=9 {
        assert_eq!(ShardedCpu::new(ranks).unwrap().argmax(&x).unwrap(), expected, "{ranks} ranks");
    }
}
