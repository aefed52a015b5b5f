use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use kdtree_jit::kernel::{Kernels, kernel};

/// Scales `x` into `out`.
#[kernel(
    source = r#"
        // A comment mentioning extern "C" __global__ void scale(int) must not confuse the check.
        extern "C" __global__ void __launch_bounds__(256) scale(
            const float* __restrict__ x, float* __restrict__ out, unsigned int n, float k) {
            unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) out[i] = k * x[i];
        }"#,
    grid = n.div_ceil(256),
    block = 256,
)]
pub unsafe fn scale(x: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: u32, k: f32);

/// Views work as buffers; a 2-D grid and dynamic shared memory come from the arguments.
#[kernel(
    source = r#"extern "C" __global__ void add_rows(const __nv_bfloat16* a, unsigned short* out, int rows, size_t cols) {}"#,
    grid = (rows as u32, 4),
    block = (32, 8),
    shared = 1024,
)]
pub unsafe fn add_rows(a: &CudaView<half::bf16>, out: &mut CudaViewMut<u16>, rows: i32, cols: usize);

fn main() {
    // The launchers have exactly the declared argument types, after the `&Kernels` the macro adds.
    let _: unsafe fn(&Kernels, &CudaSlice<f32>, &mut CudaSlice<f32>, u32, f32) -> kdtree_jit::Result<()> = scale;
    let _: unsafe fn(&Kernels, &CudaView<half::bf16>, &mut CudaViewMut<u16>, i32, usize) -> kdtree_jit::Result<()> =
        add_rows;
}
