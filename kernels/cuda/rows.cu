// Row copies of the forward: column ranges between buffers of different widths, rows gathered to the experts that use them
// and scattered back. One block per row, threads over its columns, 16-byte accesses when the row's
// start and length allow them. Device-side row indices cannot be checked on the host: an index past
// the source gives a row of NaN (a gather), past the destination nothing (a scatter), never a read or
// write outside the buffers.

#define QUIET_NAN __int_as_float(0x7fffffff)  // NVRTC has no <math.h> NAN
#define NAN_BITS 0xffffu                      // a NaN in both bf16 and f16

__device__ __forceinline__ bool aligned16(const void* a, const void* b) {
    return ((reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b)) & 15) == 0;
}

// out[r, out_offset + c] = x[r, x_offset + c] for c < cols: a column range of one buffer's rows into a
// column range of another's (x has rows of `x_stride`, out rows of `out_stride`).
extern "C" __global__ void copy_cols(const float* __restrict__ x, float* __restrict__ out, unsigned int rows,
                                     unsigned int x_stride, unsigned int x_offset, unsigned int out_stride,
                                     unsigned int out_offset, unsigned int cols) {
    const unsigned int r = blockIdx.x;
    if (r >= rows) return;
    const float* src = x + (size_t)r * x_stride + x_offset;
    float* dst = out + (size_t)r * out_stride + out_offset;
    if (cols % 4 == 0 && aligned16(src, dst)) {
        for (unsigned int c = threadIdx.x; c < cols / 4; c += blockDim.x)
            reinterpret_cast<float4*>(dst)[c] = reinterpret_cast<const float4*>(src)[c];
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
    }
}

// out[i] = src[idx[i]] for i < m, rows of `cols` 16-bit values (bf16 or f16 bits: only copied).
extern "C" __global__ void gather_rows_u16(const unsigned short* __restrict__ src, const unsigned int* __restrict__ idx,
                                           unsigned short* __restrict__ out, unsigned int m, unsigned int src_rows,
                                           unsigned int cols) {
    const unsigned int i = blockIdx.x;
    if (i >= m) return;
    const unsigned int row = idx[i];
    unsigned short* dst = out + (size_t)i * cols;
    if (row >= src_rows) {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = NAN_BITS;
        return;
    }
    const unsigned short* s = src + (size_t)row * cols;
    if (cols % 8 == 0 && aligned16(s, dst)) {
        for (unsigned int c = threadIdx.x; c < cols / 8; c += blockDim.x)
            reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(s)[c];
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = s[c];
    }
}

// out[i] = src[idx[i]] for i < m, rows of `cols` f32.
extern "C" __global__ void gather_rows_f32(const float* __restrict__ src, const unsigned int* __restrict__ idx,
                                           float* __restrict__ out, unsigned int m, unsigned int src_rows,
                                           unsigned int cols) {
    const unsigned int i = blockIdx.x;
    if (i >= m) return;
    const unsigned int row = idx[i];
    float* dst = out + (size_t)i * cols;
    if (row >= src_rows) {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = QUIET_NAN;
        return;
    }
    const float* s = src + (size_t)row * cols;
    if (cols % 4 == 0 && aligned16(s, dst)) {
        for (unsigned int c = threadIdx.x; c < cols / 4; c += blockDim.x)
            reinterpret_cast<float4*>(dst)[c] = reinterpret_cast<const float4*>(s)[c];
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = s[c];
    }
}

// bf16 bits -> f32, exact, NaN made quiet: cast.cu's from_bf16 (NVRTC has no include path).
__device__ __forceinline__ float from_bf16(unsigned int x) {
    return __uint_as_float(((x & 0x7fffu) > 0x7f80u ? x | 0x40u : x) << 16);
}

// dst[idx[i]] = f32(src[i]) for i < m: src [m, cols] bf16 bits, dst [dst_rows, cols]. The caller makes
// the destinations of one launch distinct; two blocks writing one row would race.
extern "C" __global__ void scatter_rows_bf16_to_f32(const unsigned short* __restrict__ src,
                                                    const unsigned int* __restrict__ idx, float* __restrict__ dst,
                                                    unsigned int m, unsigned int dst_rows, unsigned int cols) {
    const unsigned int i = blockIdx.x;
    if (i >= m) return;
    const unsigned int row = idx[i];
    if (row >= dst_rows) return;
    const unsigned short* s = src + (size_t)i * cols;
    float* d = dst + (size_t)row * cols;
    // 4 values per thread: an 8-byte load of bf16 bits, a 16-byte store of f32.
    const bool vec = cols % 4 == 0 && ((reinterpret_cast<unsigned long long>(s) & 7) |
                                       (reinterpret_cast<unsigned long long>(d) & 15)) == 0;
    if (vec) {
        for (unsigned int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
            const uint2 v = reinterpret_cast<const uint2*>(s)[c];
            reinterpret_cast<float4*>(d)[c] = make_float4(from_bf16(v.x & 0xffffu), from_bf16(v.x >> 16),
                                                          from_bf16(v.y & 0xffffu), from_bf16(v.y >> 16));
        }
    } else {
        for (unsigned int c = threadIdx.x; c < cols; c += blockDim.x) d[c] = from_bf16(s[c]);
    }
}
