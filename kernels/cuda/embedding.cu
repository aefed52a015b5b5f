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
