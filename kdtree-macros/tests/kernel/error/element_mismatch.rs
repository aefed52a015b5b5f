use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::kernel;

#[kernel(source = r#"extern "C" __global__ void k(const __half* x, float* out) {}"#, grid = 1, block = 1)]
unsafe fn k(x: &CudaSlice<f32>, out: &mut CudaSlice<f32>);

fn main() {}
