use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::kernel;

#[kernel(grid = 1, block = 1)]
unsafe fn k(x: &CudaSlice<f32>);

fn main() {}
