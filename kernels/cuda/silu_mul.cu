// SwiGLU's gate: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); one thread per element.
extern "C" __global__ void silu_mul(const float* __restrict__ gate, const float* __restrict__ up,
                                    float* __restrict__ out, unsigned int n) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    // expf, not __expf: the CPU reference uses the accurate exponential.
    out[i] = g / (1.0f + expf(-g)) * up[i];
}
