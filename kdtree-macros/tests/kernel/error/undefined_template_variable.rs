use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::kernel;

#[kernel(
    source = r#"extern "C" __global__ void __launch_bounds__({{ BLOCK }}) k(const float* x) { int u = {{ UNROLL }}; }"#,
    params(BLOCK = 256),
    grid = 1,
    block = 256,
)]
unsafe fn k(x: &CudaSlice<f32>);

fn main() {}
