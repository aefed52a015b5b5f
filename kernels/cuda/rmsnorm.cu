// RMSNorm, one block per row: out = x / sqrt(mean(x^2) + eps) * weight, in f32 as the engine's CPU op.
// A row of up to HELD float4s a thread is held in registers between the sum of squares and the
// scaling; a longer one is read twice (the second read hits L1/L2, so HBM sees it once).
//
// Two fusions save a forward's launches without changing a bit: the add_rmsnorm kernels first add
// the residual branch y into x in place (add_assign's f32 add) and normalise the sum; the _bf16 kernels
// also write out rounded to bf16 bits (the cast's rounding), what the next GEMM reads.

// f32 -> bf16 bits, round to nearest even, NaN kept and made quiet: cast.cu's to_bf16 (NVRTC has no
// include path; tests/compile.rs checks the copies agree).
__device__ __forceinline__ unsigned short to_bf16(float f) {
    const unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    const unsigned int round = 0x8000u;
    return (unsigned short)((x >> 16) + ((x & round) && (x & (3 * round - 1)) ? 1u : 0u));
}

// float4 loads need 16-byte alignment of every row: true when cols % 4 == 0 and the buffers are
// aligned (the bf16 bits, written 4 at a time, 8-byte aligned).
__device__ __forceinline__ bool vectorizable(const void* a, const void* b, const void* c, const void* d,
                                             const void* bits, unsigned int cols) {
    const unsigned long long any16 = reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b) |
                                     reinterpret_cast<unsigned long long>(c) | reinterpret_cast<unsigned long long>(d);
    return cols % 4 == 0 && (any16 & 15) == 0 && (reinterpret_cast<unsigned long long>(bits) & 7) == 0;
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

// The arithmetic of every path, shared so that a row has the same bits whether it is held in
// registers, read twice, or read element by element (unaligned).
__device__ __forceinline__ float square_sum(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
__device__ __forceinline__ float4 scaled(float4 v, float inv, float4 w) {
    return make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
}
// add_assign's sum, component by component.
__device__ __forceinline__ float4 added(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
__device__ __forceinline__ uint2 bf16_quad(float4 v) {
    return make_uint2((unsigned int)to_bf16(v.x) | ((unsigned int)to_bf16(v.y) << 16),
                      (unsigned int)to_bf16(v.z) | ((unsigned int)to_bf16(v.w) << 16));
}
// 1 / sqrtf rather than rsqrtf: both correctly rounded, as the CPU reference's 1.0 / sqrt.
__device__ __forceinline__ float inverse_rms(float ss, unsigned int cols, float eps) {
    return 1.0f / sqrtf(block_sum(ss) / (float)cols + eps);
}

// float4s a thread keeps in registers between the two passes: a row of up to HELD * 4 * blockDim
// columns (8192 with 256 threads; K2's hidden size is 7168) is read from memory once, all its loads
// in flight together, instead of one dependent load after another.
#define HELD 8

// One row; x's rows are x_stride apart (the columns of a wider row). ADD: x += y first (x written
// back), then the norm of the sum. bits (ROUND): out as bf16.
template <bool ADD, bool ROUND>
__device__ __forceinline__ void norm_row(float* __restrict__ x, const float* __restrict__ y,
                                         const float* __restrict__ weight, float* __restrict__ out,
                                         unsigned short* __restrict__ bits, unsigned int rows, unsigned int cols,
                                         unsigned int x_stride, float eps) {
    const unsigned int row = blockIdx.x;
    if (row >= rows) return;
    float* xr = x + (size_t)row * x_stride;
    const float* yr = ADD ? y + (size_t)row * cols : xr;
    float* outr = out + (size_t)row * cols;
    unsigned short* br = ROUND ? bits + (size_t)row * cols : nullptr;
    const bool vec = vectorizable(xr, yr, weight, outr, br, cols);
    float4* x4 = reinterpret_cast<float4*>(xr);
    const float4* y4 = reinterpret_cast<const float4*>(yr);
    const float4* w4 = reinterpret_cast<const float4*>(weight);
    const unsigned int n4 = cols / 4;
    // Each thread sums its quads (4 columns) in ascending order, the same on every path.
    float ss = 0.0f;
    if (vec && n4 <= HELD * blockDim.x) {
        float4 v[HELD];
#pragma unroll
        for (unsigned int j = 0; j < HELD; ++j) {
            const unsigned int i = threadIdx.x + j * blockDim.x;
            if (i < n4) v[j] = ADD ? added(x4[i], y4[i]) : x4[i];
        }
#pragma unroll
        for (unsigned int j = 0; j < HELD; ++j) {
            const unsigned int i = threadIdx.x + j * blockDim.x;
            if (i < n4) {
                if (ADD) x4[i] = v[j];
                ss += square_sum(v[j]);
            }
        }
        const float inv = inverse_rms(ss, cols, eps);
#pragma unroll
        for (unsigned int j = 0; j < HELD; ++j) {
            const unsigned int i = threadIdx.x + j * blockDim.x;
            if (i < n4) {
                const float4 o = scaled(v[j], inv, w4[i]);
                reinterpret_cast<float4*>(outr)[i] = o;
                if (ROUND) reinterpret_cast<uint2*>(br)[i] = bf16_quad(o);
            }
        }
        return;
    }
    // Longer or unaligned rows: the first pass writes the sum back, the second reads it (each thread
    // its own quads, so no barrier is needed between them).
    if (vec) {
        for (unsigned int i = threadIdx.x; i < n4; i += blockDim.x) {
            const float4 v = ADD ? added(x4[i], y4[i]) : x4[i];
            if (ADD) x4[i] = v;
            ss += square_sum(v);
        }
    } else {
        // Element by element, in the quads the float4 paths take (a short last quad padded with
        // zeros, which add nothing): a row's bits do not depend on its alignment, so columns read
        // in place (rmsnorm_columns) equal the same columns copied out.
        for (unsigned int q = threadIdx.x; q < (cols + 3) / 4; q += blockDim.x) {
            float e[4];
#pragma unroll
            for (unsigned int c = 0; c < 4; ++c) {
                const unsigned int i = 4 * q + c;
                e[c] = 0.0f;
                if (i < cols) {
                    if (ADD) xr[i] += yr[i];
                    e[c] = xr[i];
                }
            }
            ss += square_sum(make_float4(e[0], e[1], e[2], e[3]));
        }
    }
    const float inv = inverse_rms(ss, cols, eps);
    if (vec) {
        for (unsigned int i = threadIdx.x; i < n4; i += blockDim.x) {
            const float4 o = scaled(x4[i], inv, w4[i]);
            reinterpret_cast<float4*>(outr)[i] = o;
            if (ROUND) reinterpret_cast<uint2*>(br)[i] = bf16_quad(o);
        }
    } else {
        // The same quads: a thread reads back only the sums it wrote.
        for (unsigned int q = threadIdx.x; q < (cols + 3) / 4; q += blockDim.x) {
            for (unsigned int i = 4 * q; i < 4 * q + 4 && i < cols; ++i) {
                outr[i] = xr[i] * inv * weight[i];
                if (ROUND) br[i] = to_bf16(outr[i]);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024) rmsnorm(
    const float* __restrict__ x, const float* __restrict__ weight, float* __restrict__ out,
    unsigned int rows, unsigned int cols, unsigned int x_stride, float eps) {
    norm_row<false, false>(const_cast<float*>(x), nullptr, weight, out, nullptr, rows, cols, x_stride, eps);
}

extern "C" __global__ void __launch_bounds__(1024) rmsnorm_bf16(
    const float* __restrict__ x, const float* __restrict__ weight, float* __restrict__ out,
    unsigned short* __restrict__ bits, unsigned int rows, unsigned int cols, unsigned int x_stride, float eps) {
    norm_row<false, true>(const_cast<float*>(x), nullptr, weight, out, bits, rows, cols, x_stride, eps);
}

extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm(
    float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ weight, float* __restrict__ out,
    unsigned int rows, unsigned int cols, float eps) {
    norm_row<true, false>(x, y, weight, out, nullptr, rows, cols, cols, eps);
}

extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm_bf16(
    float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ weight, float* __restrict__ out,
    unsigned short* __restrict__ bits, unsigned int rows, unsigned int cols, float eps) {
    norm_row<true, true>(x, y, weight, out, bits, rows, cols, cols, eps);
}
