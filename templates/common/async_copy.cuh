// The shared-memory operand path every tensor-core family uses: cp.async into shared memory and
// ldmatrix out of it, as inline PTX (no CUDA headers: NVRTC needs no include directory). sm_80+.

// Shared-memory address of a generic pointer, as ldmatrix / cp.async want it.
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, bypassing L1 (.cg: each family reads its operands once per block).
// valid == false reads nothing and zero-fills the destination (src-size 0): that masks rows and
// entries past the end. Deliberately no L2 cache-hint policy: those trapped on the H200 with some
// toolchains (GPU notes).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// Four 8x8 b16 matrices; lane l addresses row l % 8 of matrix l / 8. For the A fragment of
// m16n8k16: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
__device__ __forceinline__ void ldmatrix_x4(u32 (&a)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr));
}
