// Embedding lookup: row i of out is row ids[i] of table ([vocab, dim]); one block per id.
// The safe wrapper rejects ids out of range before launching; the kernel still writes zeros for one,
// rather than reading past the table, should a raw launch pass it.
extern "C" __global__ void embedding(const float* __restrict__ table, const unsigned int* __restrict__ ids,
                                     float* __restrict__ out, unsigned int n_ids, unsigned int vocab,
                                     unsigned int dim) {
    const unsigned int i = blockIdx.x;
    if (i >= n_ids) return;
    const unsigned int id = ids[i];
    float* o = out + (size_t)i * dim;
    const float* row = table + (size_t)id * dim;
    for (unsigned int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = id < vocab ? row[j] : 0.0f;
}

#define QUIET_NAN __int_as_float(0x7fffffff)  // NVRTC has no <math.h> NAN

// bf16 bits -> f32, exact, NaN made quiet: cast.cu's from_bf16 (NVRTC has no include path).
__device__ __forceinline__ float from_bf16(unsigned int x) {
    return __uint_as_float(((x & 0x7fffu) > 0x7f80u ? x | 0x40u : x) << 16);
}

// The same lookup in a bf16 table, into f32 rows, with the ids already on the device: the host cannot
// check them, so an id past the table gives a row of NaN, which spreads into everything computed from
// that token instead of passing for another token's row. (The engine checks token ids on the host before
// uploading them.) 4 values per thread when dim allows.
extern "C" __global__ void embedding_bf16(const unsigned short* __restrict__ table, const unsigned int* __restrict__ ids,
                                          float* __restrict__ out, unsigned int n_ids, unsigned int vocab,
                                          unsigned int dim) {
    const unsigned int i = blockIdx.x;
    if (i >= n_ids) return;
    const unsigned int id = ids[i];
    float* o = out + (size_t)i * dim;
    if (id >= vocab) {
        for (unsigned int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = QUIET_NAN;
        return;
    }
    const unsigned short* row = table + (size_t)id * dim;
    const bool vec = dim % 4 == 0 && ((reinterpret_cast<unsigned long long>(row) & 7) |
                                      (reinterpret_cast<unsigned long long>(o) & 15)) == 0;
    if (vec) {
        for (unsigned int j = threadIdx.x; j < dim / 4; j += blockDim.x) {
            const uint2 v = reinterpret_cast<const uint2*>(row)[j];
            reinterpret_cast<float4*>(o)[j] = make_float4(from_bf16(v.x & 0xffffu), from_bf16(v.x >> 16),
                                                          from_bf16(v.y & 0xffffu), from_bf16(v.y >> 16));
        }
    } else {
        for (unsigned int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = from_bf16(row[j]);
    }
}
