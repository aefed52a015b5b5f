// x += y over n elements, 4 per thread: the residual adds of a forward.
extern "C" __global__ void add_assign(float* __restrict__ x, const float* __restrict__ y, unsigned int n) {
    const unsigned long long i = 4ull * ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x);
    const bool aligned = ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y)) & 15) == 0;
    if (i + 4 <= n && aligned) {
        float4 a = reinterpret_cast<float4*>(x)[i / 4];
        const float4 b = reinterpret_cast<const float4*>(y)[i / 4];
        a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
        reinterpret_cast<float4*>(x)[i / 4] = a;
    } else {
        for (unsigned long long j = i; j < i + 4 && j < n; ++j) x[j] += y[j];
    }
}
