use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::{KernelDef, LaunchConfig, kernel, registered};

/// With params, an inline source is a tera template rendered at compile time.
#[kernel(
    source = r#"extern "C" __global__ void __launch_bounds__({{ BLOCK }}) fill(float* out, unsigned int n) {
        for (unsigned int i = threadIdx.x; i < n; i += {{ BLOCK }}) out[i] = {{ VALUE }};
    }"#,
    params(BLOCK = 128, VALUE = 1.5),
)]
pub unsafe fn fill(out: &mut CudaSlice<f32>, config: LaunchConfig, n: u32);

fn main() {
    let _: unsafe fn(&kdtree_jit::kernel::Kernels, &mut CudaSlice<f32>, LaunchConfig, u32) -> kdtree_jit::Result<()> =
        fill;
    let def: &KernelDef = registered().into_iter().find(|d| d.name == "fill").expect("fill registers itself");
    assert!(def.source.contains("__launch_bounds__(128)") && def.source.contains("out[i] = 1.5;"), "{}", def.source);
    assert_eq!(def.params, [("BLOCK", "128"), ("VALUE", "1.5")]);
    assert_eq!(def.origin, "inline template");
}
