// Appends n new tokens to MLA's expanded KV cache. kv is kv_b_proj's output, [n, heads, nope + vd] (each
// head's no-rope key part, then its value); k_rope ([n, rope], already rotated) is shared by every head.
// Cache row start + t becomes, per head, [nope | rope] in k_cache ([capacity, heads, nope + rope]) and
// [vd] in v_cache ([capacity, heads, vd]): the layout attention_tree reads. One block per (token, head),
// threads over the head's nope + rope + vd values; every read and write is coalesced.
//
// `start` is read from device memory, so that a recorded CUDA graph appends at the cache's length of the
// forward it replays; rows past the capacity are never written.

extern "C" __global__ void kv_append(const float* __restrict__ kv, const float* __restrict__ k_rope,
                                     float* __restrict__ k_cache, float* __restrict__ v_cache, unsigned int n,
                                     unsigned int heads, unsigned int nope, unsigned int rope, unsigned int vd,
                                     const unsigned int* __restrict__ start_at, unsigned int capacity) {
    const unsigned int t = blockIdx.x, h = blockIdx.y, start = *start_at;
    if (t >= n || h >= heads || start >= capacity || t >= capacity - start) return;
    const unsigned int qk = nope + rope;
    const float* src = kv + ((size_t)t * heads + h) * (nope + vd);
    const float* shared_rope = k_rope + (size_t)t * rope;
    float* k = k_cache + ((size_t)(start + t) * heads + h) * qk;
    float* v = v_cache + ((size_t)(start + t) * heads + h) * vd;
    for (unsigned int j = threadIdx.x; j < qk; j += blockDim.x) k[j] = j < nope ? src[j] : shared_rope[j - nope];
    for (unsigned int j = threadIdx.x; j < vd; j += blockDim.x) v[j] = src[nope + j];
}
