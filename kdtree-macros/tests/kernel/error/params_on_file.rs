use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::kernel;

#[kernel(file = "cuda/k.cu", params(BLOCK = 256), grid = 1, block = 1)]
unsafe fn k(x: &CudaSlice<f32>);

fn main() {}
