// Read by the expansion tests in src/kernel/mod.rs as a `file` source.
extern "C" __global__ void scale(const float* x, float* out, unsigned int n, float k) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = k * x[i];
}
