//! A config.json in the shape Kimi K2-Thinking publishes (INT4 routed experts), through the parser.

use kdtree_engine::Config;
use kdtree_engine::model::{softmax_scale, yarn_mscale};

const K2_THINKING: &str = r#"{
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 163584, "eos_token_id": 163585, "first_k_dense_replace": 1,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
  "kv_lora_rank": 512, "max_position_embeddings": 262144, "model_type": "kimi_k2", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64,
  "num_nextn_predict_layers": 0, "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "use_cache": true, "v_head_dim": 128, "vocab_size": 163840,
  "quantization_config": {
    "config_groups": {"group_0": {"input_activations": null, "output_activations": null, "targets": ["Linear"],
      "weights": {"actorder": null, "block_structure": null, "dynamic": false, "group_size": 32, "num_bits": 4,
                  "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": true, "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": null, "quant_method": "compressed-tensors", "quantization_status": "compressed"
  }
}"#;

#[test]
fn kimi_k2_thinking_config_parses_with_int4_routed_experts_only() {
    let c = Config::parse("config.json", &serde_json::from_str(K2_THINKING).unwrap()).unwrap();
    assert_eq!((c.hidden_size, c.num_hidden_layers, c.n_routed_experts, c.vocab_size), (7168, 61, 384, 163840));
    assert_eq!((c.q_lora_rank, c.qk_head_dim(), c.n_group, c.topk_group), (Some(1536), 192, 1, 1));
    assert!(!c.is_moe_layer(0) && c.is_moe_layer(1) && c.is_moe_layer(60));
    assert_eq!(c.quant_group("model.layers.5.mlp.experts.383.down_proj"), Some(32));
    for dense in [
        "model.layers.5.mlp.shared_experts.down_proj",
        "model.layers.0.mlp.gate_proj",
        "model.layers.5.self_attn.kv_b_proj",
        "lm_head",
    ] {
        assert_eq!(c.quant_group(dense), None, "{dense}");
    }
    // The softmax scale: 192^-1/2 times mscale(64, 1)^2 = (0.1 ln 64 + 1)^2.
    let m = yarn_mscale(64.0, 1.0);
    assert!((softmax_scale(&c) as f64 - m * m / 192f64.sqrt()).abs() < 1e-7);
}

/// The KV arithmetic of the latent cache at K2's sizes: 576 values a token a layer, 1152 bytes in
/// bf16, 71x less than the per-head f32 keys and values it replaced; 128K tokens of 61 layers are
/// 9.2 GB, which fits beside a full-depth model's weights on a 141 GB card.
#[test]
fn k2_latent_kv_takes_1152_bytes_a_token_a_layer() {
    use kdtree_engine::registry::KvDtype;
    let c = Config::parse("config.json", &serde_json::from_str(K2_THINKING).unwrap()).unwrap();
    let h = c.heads(KvDtype::Bf16);
    assert_eq!((h.width(), h.kv_bytes_per_token(1)), (576, 1152));
    assert_eq!(h.kv_bytes_per_token(c.num_hidden_layers), 70_272);
    assert_eq!(c.heads(KvDtype::F32).kv_bytes_per_token(1), 2304);
    // The cache it replaced: per head, keys of nope + rope and values of v, in f32.
    let per_head_f32 = h.mla.heads * (h.mla.nope + h.mla.rope + h.mla.v) * 4;
    assert_eq!(per_head_f32, 81_920);
    assert!(per_head_f32 as f64 / h.kv_bytes_per_token(1) as f64 > 71.0);
    let context_131072 = 131_072 * h.kv_bytes_per_token(c.num_hidden_layers);
    assert_eq!(context_131072, 9_210_691_584);
}
