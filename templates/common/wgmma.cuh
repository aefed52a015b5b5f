// Hopper's warpgroup MMA (sm_90a) as inline PTX: the fences and waits around `wgmma.mma_async`, and
// the shared-memory matrix descriptors of the 128-byte swizzle. Needs u32 and u64.

// Pins a register's value at this point of the program: the compiler may not move its definition
// below, or its uses above, the wgmma fences and waits (it does not know wgmma reads and writes
// registers asynchronously).
__device__ __forceinline__ void pin(u32& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Orders this thread's register writes before the wgmmas that read them (A fragments, sums).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup's wgmmas are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

// Makes this thread's shared-memory writes (cp.async and stores: the generic proxy) visible to
// wgmma's operand reads (the async proxy); a block barrier after it makes everyone's visible.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Matrix descriptor of a K-major operand in the 128-byte swizzle: start address >> 4 (bits 0-13),
// leading-dimension byte offset >> 4 (bits 16-29; unused when a k16 step, 32 bytes, lies within the
// 128-byte swizzle span: 16 by convention), stride byte offset >> 4 (bits 32-45: 1024 bytes from one
// 8-row atom to the next), base offset 0 (bits 49-51: atoms are 1024-aligned), swizzle mode 1 =
// 128 bytes (bits 62-63). The k16 step j of a 64-wide slab starts 32 j bytes in: the hardware applies
// the swizzle to the address it computes, so stepping the start address inside an atom is right.
__device__ __forceinline__ u64 desc_sw128(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | (u64)(16 >> 4) << 16 | (u64)(1024 >> 4) << 32 | 1ull << 62;
}

// The same swizzle read MN-major (the instruction's transpose flag): each 128-byte line holds 64
// consecutive M or N values of one k, 8 lines an atom. In that layout the leading byte offset is the
// step from one 64-value group of M/N to the next (`mn_step`) and the stride byte offset the step
// from one 8-k atom to the next (1024 bytes).
__device__ __forceinline__ u64 desc_sw128_mn(u32 addr, u32 mn_step) {
    return (u64)((addr & 0x3FFFF) >> 4) | (u64)(mn_step >> 4) << 16 | (u64)(1024 >> 4) << 32 | 1ull << 62;
}
