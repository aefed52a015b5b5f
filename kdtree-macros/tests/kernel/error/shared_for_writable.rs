use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::kernel;

// out and x swapped: the writable parameter gets the shared buffer.
#[kernel(source = r#"extern "C" __global__ void k(float* out, const float* x) {}"#, grid = 1, block = 1)]
unsafe fn k(x: &CudaSlice<f32>, out: &mut CudaSlice<f32>);

fn main() {}
