// RMSNorm, one block per row: out = x / sqrt(mean(x^2) + eps) * weight, in f32 as the engine's CPU op.
// A row of up to HELD float4s a thread is held in registers between the sum of squares and the
// scaling; a longer one is read twice (the second read hits L1/L2, so HBM sees it once).

// float4 loads need 16-byte alignment of every row: true when cols % 4 == 0 and the buffers are aligned.
__device__ __forceinline__ bool vectorizable(const void* a, const void* b, const void* c, unsigned int cols) {
    return cols % 4 == 0 && ((reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b)
                               | reinterpret_cast<unsigned long long>(c)) & 15) == 0;
}

// Sum over the block; blockDim.x is a multiple of 32, at most 1024.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    // Every warp reduces the per-warp partials, so every thread gets the total.
    const unsigned int lane = threadIdx.x % 32;
    v = lane < blockDim.x / 32 ? partial[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The float4 paths' arithmetic, shared so that a row has the same bits whether it is held in registers
// or read twice.
__device__ __forceinline__ float square_sum(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
__device__ __forceinline__ float4 scaled(float4 v, float inv, float4 w) {
    return make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
}
// 1 / sqrtf rather than rsqrtf: both correctly rounded, as the CPU reference's 1.0 / sqrt.
__device__ __forceinline__ float inverse_rms(float ss, unsigned int cols, float eps) {
    return 1.0f / sqrtf(block_sum(ss) / (float)cols + eps);
}

// float4s a thread keeps in registers between the two passes: a row of up to HELD * 4 * blockDim
// columns (8192 with 256 threads; K2's hidden size is 7168) is read from memory once, all its loads
// in flight together, instead of one dependent load after another.
#define HELD 8

extern "C" __global__ void __launch_bounds__(1024) rmsnorm(
    const float* __restrict__ x, const float* __restrict__ weight, float* __restrict__ out,
    unsigned int rows, unsigned int cols, float eps) {
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* outr = out + (size_t)row * cols;
    const bool vec = vectorizable(xr, weight, outr, cols);
    // Each thread sums its elements in ascending order; both float4 paths give a row the same bits.
    float ss = 0.0f;
    if (vec && cols / 4 <= HELD * blockDim.x) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        const float4* w4 = reinterpret_cast<const float4*>(weight);
        const unsigned int n4 = cols / 4;
        float4 v[HELD];
#pragma unroll
        for (unsigned int j = 0; j < HELD; ++j) {
            const unsigned int i = threadIdx.x + j * blockDim.x;
            if (i < n4) v[j] = x4[i];
        }
#pragma unroll
        for (unsigned int j = 0; j < HELD; ++j) {
            if (threadIdx.x + j * blockDim.x < n4) ss += square_sum(v[j]);
        }
        const float inv = inverse_rms(ss, cols, eps);
#pragma unroll
        for (unsigned int j = 0; j < HELD; ++j) {
            const unsigned int i = threadIdx.x + j * blockDim.x;
            if (i < n4) reinterpret_cast<float4*>(outr)[i] = scaled(v[j], inv, w4[i]);
        }
        return;
    }
    if (vec) {
        for (unsigned int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
            ss += square_sum(reinterpret_cast<const float4*>(xr)[i]);
        }
    } else {
        for (unsigned int i = threadIdx.x; i < cols; i += blockDim.x) ss += xr[i] * xr[i];
    }
    const float inv = inverse_rms(ss, cols, eps);
    if (vec) {
        for (unsigned int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
            const float4 v = reinterpret_cast<const float4*>(xr)[i], w = reinterpret_cast<const float4*>(weight)[i];
            reinterpret_cast<float4*>(outr)[i] = scaled(v, inv, w);
        }
    } else {
        for (unsigned int i = threadIdx.x; i < cols; i += blockDim.x) outr[i] = xr[i] * inv * weight[i];
    }
}
