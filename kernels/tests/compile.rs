//! Without a GPU: every kernel of this crate is registered and compiles under NVRTC for Hopper (sm_90)
//! and consumer Blackwell (sm_120).

use kdtree_jit::Arch;
use kdtree_jit::kernel::registered;

#[test]
fn every_kernel_is_registered_and_compiles_for_sm90_and_sm120() {
    let ours = kdtree_kernels::launch::all();
    let names: Vec<&str> = ours.iter().map(|d| d.name).collect();
    assert_eq!(
        names,
        [
            "rmsnorm",
            "silu_mul",
            "rope_interleaved",
            "softmax",
            "argmax_partial",
            "argmax_finish",
            "embedding",
            "embedding_bf16",
            "f32_to_bf16",
            "f32_to_f16",
            "bf16_to_f32",
            "f16_to_f32",
            "add_assign",
            "copy_cols",
            "gather_rows_u16",
            "gather_rows_f32",
            "scatter_rows_bf16_to_f32",
            "silu_mul_halves_f32",
            "silu_mul_halves_bf16",
            "rope_strided",
            "kv_append",
            "attention_tree",
            "route_noaux_tc",
            "moe_combine",
            "moe_align",
            "count_nonfinite",
        ]
    );
    let all = registered();
    for def in ours {
        assert!(all.iter().any(|d| std::ptr::eq(*d, def)), "{} is not registered", def.path);
        for arch in [Arch(90), Arch(120)] {
            let compiled = def.compile(arch, None).unwrap_or_else(|e| panic!("{} for {arch}: {e}", def.path));
            assert!(!compiled.cubin.is_empty() && compiled.name == def.name, "{} for {arch}", def.path);
        }
    }
}
