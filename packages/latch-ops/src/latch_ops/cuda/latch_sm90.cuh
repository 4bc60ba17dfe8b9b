// Hopper (sm_90a) primitives shared by the megakernel's worker and the op bodies: mbarriers, the
// bulk tensor copy engine (TMA), wgmma descriptors and fences, named barriers, the register split.
//
// Each is one PTX instruction (or a short fixed sequence) with the reason it is there; nothing here
// knows about tasks. References: the PTX ISA sections on mbarrier, cp.async.bulk.tensor, wgmma and
// setmaxnreg. Read the SASS of a body that uses them (HGMMA, UTMALDG, SYNCS, USETMAXREG).
#pragma once

#include <stdint.h>

namespace latch {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// ---- mbarriers (64-bit, in shared memory) ---------------------------------------------------------
// A phase completes when ``count`` arrivals and every expected transaction byte have landed; waiters
// test the parity of the phase they wait for (0 for the first, then alternating).

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Makes initialised mbarriers visible to the other threads and to the async proxy (TMA); follow it
// with a block-wide barrier.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Arrive and announce ``bytes`` of transactions (the TMA loads that complete this phase).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// True once the phase of parity ``parity`` has completed (acquire at CTA scope). The instruction
// itself suspends the thread for a while before it gives up, so a loop over it is a cheap wait.
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(ok)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}

// ---- the bulk tensor copy engine ------------------------------------------------------------------
// One 2-D box of the tensor map ``map`` (a CUtensorMap in global memory, 64-byte aligned) at element
// coordinates (c0 innermost, c1) into shared memory at ``dst`` (aligned to the swizzle atom, 1024
// bytes for 128-byte swizzling); completion is counted in bytes on ``bar``. Elements outside the
// tensor read as zero.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
      ::"r"(smem_addr(dst)), "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// One 3-D box of ``map`` at element coordinates (c0 innermost, c1, c2), as tma_load_2d (the
// cross-entropy backward views a row of logits as (W, V / W) so that one box is a contiguous piece
// of one row; latch_xent.cuh).
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
      ::"r"(smem_addr(dst)), "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// The other direction: the 2-D box at shared-memory ``src`` (aligned to the swizzle atom, laid out
// as the map's swizzle says) into the tensor at element coordinates (c0 innermost, c1). Elements
// of the box outside the tensor are not written. The copy runs in the async proxy: the writers of
// ``src`` must fence.proxy.async.shared::cta first; completion is tracked in the issuing thread's
// bulk async-groups (bulk_commit, then bulk_wait_read before ``src`` is written again and
// bulk_wait before anything else may read the destination).
__device__ __forceinline__ void tma_store_2d(const void* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               ::"l"(map), "r"(smem_addr(src)), "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// At most N of this thread's committed bulk groups still pending: completely (their writes are
// performed) or, with ``_read``, only still reading their shared-memory source.
template <int N> __device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// Orders this thread's generic-proxy global accesses with async-proxy (TMA) accesses: a tile a body
// stored with ordinary instructions may next be read by a TMA load (on this SM or, after a release/
// acquire, on another).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- wgmma ------------------------------------------------------------------------------------------
// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address, leading and
// stride byte offsets (all >> 4) and the swizzle mode (1 = 128-byte). Our tiles are always 128-byte
// swizzled rows of 64 16-bit elements, written by TMA with a 1024-byte aligned base:
// - K-major (rows are M or N, 64 K elements per row): SBO = 1024 (8 rows), LBO unused;
//   the k-th 16-element step starts 32 bytes further.
// - MN-major (rows are K, 64 M or N elements per row, further 64-wide blocks ``lbo`` bytes apart):
//   SBO = 1024 (8 K rows), LBO = the block stride; the k-th step starts 2048 bytes (16 rows) further.
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint64_t a = smem_addr(smem);
  return ((a & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) | ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) |
         (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// ---- registers and named barriers -------------------------------------------------------------------
template <int R> __device__ __forceinline__ void regs_grow() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R)); }
template <int R> __device__ __forceinline__ void regs_shrink() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R)); }

// Named barrier ``id`` among ``threads`` threads (a multiple of 32). Barrier 0 is __syncthreads'.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Named barrier that also ORs a predicate over the participating threads (every thread gets the OR).
__device__ __forceinline__ bool named_sync_or(int id, int threads, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\t"
      "setp.ne.u32 p, %3, 0;\n\t"
      "bar.red.or.pred q, %1, %2, p;\n\t"
      "selp.u32 %0, 1, 0, q;\n\t}"
      : "=r"(r)
      : "r"(id), "r"(threads), "r"((uint32_t)pred)
      : "memory");
  return r != 0;
}

__device__ __forceinline__ uint32_t ld_acquire_shared(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];" : "=r"(v) : "r"(smem_addr(p)) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_shared(uint32_t* p, uint32_t v) {
  asm volatile("st.release.cta.shared::cta.u32 [%0], %1;" ::"r"(smem_addr(p)), "r"(v) : "memory");
}

}  // namespace sm90
}  // namespace latch
