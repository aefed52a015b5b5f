// Rotary embedding of adjacent pairs (x[2i], x[2i+1]) by the angle of table row positions[row], in place,
// as DeepSeek-V3 rotates q and k. x is [rows, heads, head_dim]; cos and sin are [max_pos, head_dim / 2].
// One thread per pair.
extern "C" __global__ void rope_interleaved(float* __restrict__ x, const unsigned int* __restrict__ positions,
                                            const float* __restrict__ cos, const float* __restrict__ sin,
                                            unsigned int rows, unsigned int heads, unsigned int head_dim) {
    const unsigned int half = head_dim / 2;
    const unsigned long long pair = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (pair >= (unsigned long long)rows * heads * half) return;
    const unsigned int i = pair % half;
    const unsigned long long head = pair / half;
    const unsigned int row = head / heads;
    const size_t t = (size_t)positions[row] * half + i;
    float* h = x + head * head_dim;
    const float a = h[2 * i], b = h[2 * i + 1], c = cos[t], s = sin[t];
    h[2 * i] = a * c - b * s;
    h[2 * i + 1] = a * s + b * c;
}
