// Shared device helpers and the target configuration of ferrattn's CUDA kernels.
//
// No CUDA header is included: the same text compiles with nvcc (build.rs, fatbin for sm_90a and
// sm_80) and with NVRTC at run time (which has no system include path). Conversions, copies,
// shuffles and memory-model operations are therefore written as inline PTX (sm_80 or later).
#pragma once

namespace ferrattn {

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// ---- Target constants, in one place (FlashMLA config.h style) --------------------------------
namespace cfg {
constexpr int kWarps = 4;                // warps per CTA
constexpr int kThreads = kWarps * 32;    // threads per CTA
constexpr int kMinCtasPerSm = 2;         // occupancy the Lean plan assumes (DeviceCaps::ctas_per_unit)
constexpr int kKeysPerGroupStage = 8;    // keys one key group handles per pipeline stage
constexpr int kMaxRows = 16;             // = ferrattn_core::lean::MAX_TILE_M
constexpr int kSmemBudget = 110 * 1024;  // per CTA, so that kMinCtasPerSm CTAs share one SM (228 KiB)

// One key is handled by D/8 lanes, each owning 8 consecutive columns (one 16-byte vector).
template <int D> __host__ __device__ constexpr int lanes_per_key() { return D / 8; }
template <int D> __host__ __device__ constexpr int groups_per_warp() { return 32 / (D / 8); }
template <int D> __host__ __device__ constexpr int key_groups() { return kWarps * groups_per_warp<D>(); }
// Keys per pipeline stage: 32 KiB of K plus V in 16-bit types, whatever D is.
template <int D> __host__ __device__ constexpr int stage_keys() { return kKeysPerGroupStage * key_groups<D>(); }
}  // namespace cfg

// ---- Scalars ---------------------------------------------------------------------------------
__device__ __forceinline__ float neg_inf() {
  float f;
  asm("mov.b32 %0, 0xff800000;" : "=f"(f));
  return f;
}
__device__ __forceinline__ float bits_to_f32(u32 u) {
  float f;
  asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));
  return f;
}
__device__ __forceinline__ float fmax2(float a, float b) { return a > b ? a : b; }
// 2^x with the SFU (about 2 ulp); 2^-inf = +0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float shfl_xor(float v, int mask) {
  float r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(mask));
  return r;
}

// ---- 16-bit element types (stored as raw u16; math in f32) -----------------------------------
struct F16 {
  static __device__ __forceinline__ float to_f32(u16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
  }
  static __device__ __forceinline__ u16 from_f32(float x) {
    u16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
  }
  // low and high halves of a packed pair
  static __device__ __forceinline__ void unpack2(u32 w, float& lo, float& hi) {
    lo = to_f32((u16)(w & 0xffffu));
    hi = to_f32((u16)(w >> 16));
  }
};
struct BF16 {
  static __device__ __forceinline__ float to_f32(u16 x) { return bits_to_f32(((u32)x) << 16); }
  static __device__ __forceinline__ u16 from_f32(float x) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
  }
  static __device__ __forceinline__ void unpack2(u32 w, float& lo, float& hi) {
    lo = bits_to_f32(w << 16);
    hi = bits_to_f32(w & 0xffff0000u);
  }
};

struct alignas(16) Vec16 {
  u32 x, y, z, w;
};

// 8 elements (16 bytes) to f32
template <class T>
__device__ __forceinline__ void unpack8(const Vec16& v, float (&f)[8]) {
  T::unpack2(v.x, f[0], f[1]);
  T::unpack2(v.y, f[2], f[3]);
  T::unpack2(v.z, f[4], f[5]);
  T::unpack2(v.w, f[6], f[7]);
}

__device__ __forceinline__ Vec16 ld_shared16(const void* p) {
  return *reinterpret_cast<const Vec16*>(p);
}

// read-only global 16-byte load
__device__ __forceinline__ Vec16 ld_global_nc16(const void* p) {
  Vec16 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// ---- Asynchronous copies (sm_80 cp.async), 16 bytes, zero-filled when !pred ------------------
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u64 a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (u32)a;
}
__device__ __forceinline__ void cp_async16(void* dst_smem, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst_smem)), "l"(src),
               "r"(pred ? 16 : 0)
               : "memory");
}
// The same with the destination as a shared-window address (smem_addr), for callers that keep
// their ring's addresses as 32-bit offsets instead of generic pointers.
__device__ __forceinline__ void cp_async16_s(u32 dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- Tensor cores (sm_80 mma.sync m16n8k16, f32 accumulate) and ldmatrix ---------------------
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"): g = lane / 4, t = lane % 4.
//   A 16x16 row-major: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8 col-major:  b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8.., n = g)
//   C 16x8:            c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
__device__ __forceinline__ void mma16816(F16, float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(BF16, float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// two f32 to a packed pair, `lo` in the low half
__device__ __forceinline__ u32 pack2(F16, float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ u32 pack2(BF16, float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// four 8x8 b16 matrices; lanes 8j..8j+7 give the row addresses of matrix j, as shared-window
// addresses (smem_addr): a caller that keeps them in 32 bits saves the 64-bit generic-pointer
// arithmetic (about five instructions per ldmatrix in the Lean stage loop; docs/DEVICE_PATH.md,
// "Lean, twelfth session")
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}
// the same from generic pointers into shared memory
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* row) { ldmatrix_x4(r, smem_addr(row)); }
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* row) { ldmatrix_x4_trans(r, smem_addr(row)); }
__device__ __forceinline__ u32 ld_global_u32(const void* p) {
  u32 v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// K/V tiles in shared memory are row-major [key][D] with the 16-byte chunks of each row permuted
// by XOR with (key % 8), so that 8 consecutive keys at one column hit 8 different bank groups
// (ldmatrix and the SIMT path both read conflict-free).
template <int D>
__device__ __forceinline__ int swz(int key, int chunk) { return key * D + ((chunk ^ (key & 7)) << 3); }

// ---- Inter-CTA signalling (PTX memory model, gpu scope) ---------------------------------------
__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ void store_release(u32* p, u32 v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u32 load_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ void nanosleep(u32 ns) { asm volatile("nanosleep.u32 %0;" ::"r"(ns)); }
// L2-only load of data another CTA wrote in this launch
__device__ __forceinline__ float ld_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
// (own vector types: NVRTC has no vector_types.h)
struct Flt2 {
  float x, y;
};
struct alignas(16) Flt4 {
  float x, y, z, w;
};
__device__ __forceinline__ Flt2 ld_cg2(const float* p) {
  Flt2 v;
  asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ Flt4 ld_cg4(const float* p) {
  Flt4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

// ---- Programmatic dependent launch (sm_90; no-ops elsewhere) -----------------------------------
// Both are no-ops unless the host launched the kernel with programmatic stream serialization
// (ferrattn_cuda::launch::launch_programmatic). `pdl_wait` returns once the kernel before on the
// stream has completed and its writes are visible. `pdl_launch_dependents` lets the next kernel
// start being scheduled; a CTA of it takes an SM slot only once every CTA of this grid has
// started. What each kernel may read before its wait is said where it waits.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace ferrattn
