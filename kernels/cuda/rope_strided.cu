// Rotary embedding of part of each head, in place: columns [offset, offset + dim) of every head of x
// ([rows, heads, head_stride]), row r by the angles of table row positions[r] (cos and sin are
// [max_pos, dim / 2]). DeepSeek-V3 rotates only the last 64 columns of each q head and the k_rope row,
// which sit inside wider buffers; this rotates them where they are. One thread per rotated pair.
//
// half_split picks the pairs: false rotates adjacent pairs (x[2i], x[2i+1]) (rope_interleaved), true
// rotates (x[i], x[i + dim/2]) (the rotate_half layout), as the engine's CPU rope_interleaved and
// rope_half_split. The products and the sum are rounded separately (__fmul_rn, __fadd_rn: never fused
// into an FMA), so that the result is the CPU op's bits.
//
// A position past the table cannot be checked on the host (the positions are on the device): its pairs
// become NaN rather than reading past the table.

extern "C" __global__ void rope_strided(float* __restrict__ x, const unsigned int* __restrict__ positions,
                                        const float* __restrict__ cos, const float* __restrict__ sin,
                                        unsigned int rows, unsigned int heads, unsigned int head_stride,
                                        unsigned int offset, unsigned int dim, unsigned int max_pos, bool half_split) {
    const unsigned int half = dim / 2;
    const unsigned long long pair = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (pair >= (unsigned long long)rows * heads * half) return;
    const unsigned int i = pair % half;
    const unsigned long long head = pair / half;
    const unsigned int row = head / heads;
    float* h = x + head * head_stride + offset;
    const unsigned int a = half_split ? i : 2 * i, b = half_split ? i + half : 2 * i + 1;
    const unsigned int p = positions[row];
    if (p >= max_pos) {
        h[a] = h[b] = __int_as_float(0x7fffffff);
        return;
    }
    const size_t t = (size_t)p * half + i;
    const float xa = h[a], xb = h[b], c = cos[t], s = sin[t];
    h[a] = __fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s));
    h[b] = __fadd_rn(__fmul_rn(xa, s), __fmul_rn(xb, c));
}
