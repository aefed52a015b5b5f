// How many of n floats are not finite (NaN or +-inf): the engine's check of a forward's logits, launched
// beside argmax so that the count comes back with the ids. A float is not finite when its exponent bits
// are all ones; the test is on the bits, so no fast-math option can fold it away. Each thread counts a
// grid-stride share (16-byte loads when x is aligned), a block sums its threads' counts, and one
// atomicAdd per block adds that to *count, which must be zero before the launch (the safe op zeroes it).

// 1 when the float with these bits is NaN or infinite.
__device__ __forceinline__ unsigned int not_finite(unsigned int bits) {
    return (bits & 0x7f800000u) == 0x7f800000u;
}

extern "C" __global__ void count_nonfinite(const float* __restrict__ x, unsigned int* __restrict__ count,
                                           unsigned int n) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool aligned = (reinterpret_cast<unsigned long long>(x) & 15) == 0;
    // The float4 part, then the tail (all of x when it is not aligned).
    const unsigned long long n4 = aligned ? n / 4 : 0;
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    unsigned int c = 0;
    for (unsigned long long i = t; i < n4; i += stride) {
        const uint4 v = x4[i];
        c += not_finite(v.x) + not_finite(v.y) + not_finite(v.z) + not_finite(v.w);
    }
    for (unsigned long long i = 4 * n4 + t; i < n; i += stride) c += not_finite(__float_as_uint(x[i]));
    // The block's sum: within each warp, then over the warps (at most 32 of them).
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    __shared__ unsigned int warps[32];
    const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = (blockDim.x + 31) / 32;
    if (lane == 0) warps[warp] = c;
    __syncthreads();
    if (warp != 0) return;
    c = lane < n_warps ? warps[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if (lane == 0 && c != 0) atomicAdd(count, c);
}
