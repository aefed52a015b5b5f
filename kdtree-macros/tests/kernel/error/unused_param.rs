use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::kernel;

#[kernel(
    source = r#"extern "C" __global__ void __launch_bounds__({{ BLOCK }}) k(const float* x) {}"#,
    params(BLOCK = 256, UNROLL = 4),
    grid = 1,
    block = 256,
)]
unsafe fn k(x: &CudaSlice<f32>);

fn main() {}
