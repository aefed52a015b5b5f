use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::kernel;

// grid/block expressions are checked by rustc in the launcher, where the arguments are in scope.
#[kernel(source = r#"extern "C" __global__ void k(const float* x, unsigned int n) {}"#, grid = m, block = 256)]
unsafe fn k(x: &CudaSlice<f32>, n: u32);

fn main() {}
