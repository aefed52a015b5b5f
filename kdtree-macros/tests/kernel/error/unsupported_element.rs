use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::kernel;

#[kernel(source = r#"extern "C" __global__ void k(const float* x) {}"#, grid = 1, block = 1)]
unsafe fn k(x: &CudaSlice<(f32, f32)>);

fn main() {}
