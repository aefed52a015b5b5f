use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::kernel;

#[kernel(file = "cuda/no_such_kernel.cu", grid = 1, block = 1)]
unsafe fn k(x: &CudaSlice<f32>);

fn main() {}
