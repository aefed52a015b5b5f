//! Without a GPU: every kernel of this crate is registered and compiles under NVRTC for Hopper (sm_90)
//! and consumer Blackwell (sm_120); the SiLU gate that kdtree-jit's grouped kernel fuses is this crate's.

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
            "rmsnorm_bf16",
            "add_rmsnorm",
            "add_rmsnorm_bf16",
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
            "route_noaux_tc",
            "moe_combine",
            "moe_combine_sorted_bf16",
            "moe_align",
            "count_nonfinite",
            "gqa_attention_partial",
            "gqa_attention_combine",
            "top_k_max_sum",
            "top_k_chunk",
            "top_k_merge",
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

/// kdtree-jit's `templates/w4a16/silu.cuh` is `cuda/silu_mul.cu`'s gate, copied (no include path joins
/// the two crates): the grouped gate-up kernel's fused epilogue gives `silu_mul_halves_bf16`'s bits only
/// while the copy is verbatim.
#[test]
fn the_grouped_kernels_silu_gate_is_silu_mul_halves_bf16s() {
    let (_, header) = kdtree_jit::render::templates()
        .iter()
        .find(|(name, _)| *name == "w4a16/silu.cuh")
        .expect("the grouped template's SiLU header");
    // The header's own comment, then the functions.
    let (_, functions) = header.split_once("\n\n").expect("a comment, then code");
    assert!(functions.contains("float silu_times(") && functions.contains("unsigned short to_bf16("));
    let source = kdtree_kernels::launch::silu_mul_halves_bf16::KERNEL.source;
    assert!(source.contains(functions.trim_end()), "silu.cuh differs from cuda/silu_mul.cu:\n{functions}");
}
