// Instruction budget of a TurboQuant decode iteration with 2-bit codes as bit planes on INT8 MMAs
// (issue 10, branch issue-10-planes20; docs/TURBOQUANT_CUDA.md, "Decode: 2-bit codes as bit
// planes, the CPU half"). NOT a kernel of the runtime: a standalone file to count SASS, compiled
// with `nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --cubin` (count.sh). It has no
// tests and was never run; its arithmetic follows core::turboquant::planes (INT8_QUERY_HILO).
//
// One warp, k2-v2 (2-bit keys without QJL, 2-bit values), D = 128, at most 8 query rows (the
// decode's `_r8` kernels), one 16-token stage per loop iteration, as main's decode loop:
//   S  = q8 · Kᵀ over two key planes: mma.m16n8k32.s8, q8 as A (rows 0-7: hi, 8-15: lo, loop
//        invariant), each plane's B registers from one 32-bit word a (token, lane) per plane
//        (bit 8j + x holds k-chunk x / 2, register x % 2, byte j of the lane's fragment):
//        `(W << (7 - x)) & 0x80808080`, s8 -128 per set bit; 2 planes x 2 token halves x 4
//        k-chunks = 16 MMAs (main: 16 HMMA m16n8k16)
//   fold: s = ‖k‖ (c0 + A_sh S_hi + A_sl S_lo + A_mh M_hi + A_ml M_lo), the s32 sums turned into
//        f32 by the magic number (IMAD x · 1 + 0x4B400000 on the FMA pipe, the offset folded into
//        c0), with `one` opaque so that ptxas keeps the IMAD instead of an IADD3 (ALU pipe)
//   softmax as main's (base 2, quad max by shuffles, exp2), then p ‖v‖ per row quantized to s8
//        (row max over the quad, 127 / max, round to nearest by the magic FFMA, 3 PRMT pack):
//        Pᵀ as the B operand (rows as N), its 4 tokens a lane {2t, 2t + 1, 2t + 8, 2t + 9} in
//        the k order the value planes were written in
//   O_rotᵀ += Vᵀ · Pᵀ over two value planes: mma.m16n8k16.s8, Vᵀ planes as A (coords g, g + 8
//        of 8 blocks of 16, 4 tokens a register from the lane's words as for keys); 8 blocks x
//        2 planes = 16 MMAs, + 1 with A = 1 for Σ p8 per row (main: 8 HMMA); each stage's s32
//        sums folded into the f32 O: per element 2 magic IMAD and 3 FP32 (no s32 accumulation
//        across stages: P's scale changes each stage)
//   FOLD_TILE (-DFOLD_TILE): P at one scale a 64-token tile (max ‖v‖ of the tile / 127, written
//        by compression beside the norms; planes.rs Operand::Int8TileNorm), no quad max of p ‖v‖
//        and no scale shuffles; the P·V sums stay in s32 accumulators across the tile's 4 stages
//        and are folded into O once a tile (every 4th iteration) and before a rescale.
// PLANE_SHIFT_ALU (-DPLANE_SHIFT_ALU): the B registers' shifts as SHF (ALU) instead of IMAD.
#include <cstdint>
typedef uint32_t u32;

__device__ u32 kOne = 1u;  // read once: opaque to ptxas, so x * one + c stays an IMAD

__device__ __forceinline__ void imma16832(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void imma16816(int (&d)[4], u32 a0, u32 a1, u32 b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
}
// s32 (|x| < 2^22) -> f32 + 12582912 (the offset is folded into the constants)
__device__ __forceinline__ float magic(int x, u32 one) {
  u32 r;
  asm("mad.lo.u32 %0, %1, %2, 0x4B400000;" : "=r"(r) : "r"((u32)x), "r"(one));
  return __uint_as_float(r);
}
// a plane word's register x (0..7): bit 8j + x of W to bit 8j + 7 (s8 -128 per set bit).
// PLANE_SHIFT_ALU: `w << (7 - x)` (ptxas emits SHF.L, ALU pipe); else `w * 2^(7 - x)` with the
// power of two in a loop-invariant register loaded from memory (IMAD, FMA pipe).
#ifdef PLANE_SHIFT_ALU
template <int X>
__device__ __forceinline__ u32 plane_reg(u32 w, const u32 (&)[7]) {
  return (w << (7 - X)) & 0x80808080u;
}
#else
template <int X>
__device__ __forceinline__ u32 plane_reg(u32 w, const u32 (&pw)[7]) {
  if constexpr (X == 7) {
    return w & 0x80808080u;
  } else {
    u32 r;
    asm("mad.lo.u32 %0, %1, %2, 0;" : "=r"(r) : "r"(w), "r"(pw[X]));
    return r & 0x80808080u;
  }
}
#endif
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float half_lo(u32 w) { return __half2float(__ushort_as_half((unsigned short)(w & 0xffffu))); }
__device__ __forceinline__ float half_hi(u32 w) { return __half2float(__ushort_as_half((unsigned short)(w >> 16))); }

// Per stage in shared memory (a ring of 2): [32 lanes] uint4 of key plane words (token g: s, m;
// token g + 8: s, m), [32 lanes] uint4 of value plane words (s: blocks 0-3, 4-7; m: 0-3, 4-7),
// then ‖k‖ and ‖v‖ of the 16 tokens (f16).
constexpr int kStageU4 = 64 + 4;

extern "C" __global__ void __launch_bounds__(128) planes_k2v2_d128(const uint4* __restrict__ src,
                                                                   const u32* __restrict__ qsrc,
                                                                   const float* __restrict__ csrc,
                                                                   float* __restrict__ out, int iters) {
  __shared__ uint4 ring[4][2 * kStageU4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint4* my = ring[warp];
  for (int i = lane; i < 2 * kStageU4; i += 32) my[i] = src[i];
  __syncwarp();
  const u32 one = kOne;
  u32 pw[7];  // 2^(7 - x), x = 0..6, loaded: a computed power of two is strength-reduced to SHF
#pragma unroll
  for (int x = 0; x < 7; ++x) pw[x] = __float_as_uint(csrc[48 + x]);
  // loop invariants: q8 hi/lo fragments (4 k-chunks), the fold constants of row g
  u32 qa[4][4];
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int r = 0; r < 4; ++r) qa[c][r] = qsrc[(c * 4 + r) * 32 + lane];
  const float c0 = csrc[g], ash = csrc[8 + g], asl = csrc[16 + g], amh = csrc[24 + g], aml = csrc[32 + g];
  const float vsign = csrc[40], vmag = csrc[41], vbase = csrc[42];
  float o[8][4];
#pragma unroll
  for (int u = 0; u < 8; ++u) o[u][0] = o[u][1] = o[u][2] = o[u][3] = 0.f;
  float m0 = -INFINITY, l0 = 0.f;
#ifdef FOLD_TILE
  int dacc[8][2][4] = {}, psum[4] = {};
  float inv_tile = 127.f * rcp_approx(reinterpret_cast<const float*>(my + 64 + 4)[0]);
  // O += σ (c0 Σp8 + c_s D_s + c_m D_m) for the tile's s32 sums, which are then reset
  auto fold = [&]() {
    const float sp = 1.f / inv_tile;
    const float k0 = sp * (vbase * (magic(psum[0], one) - 12582912.f) - 12582912.f * (vsign + vmag));
    const float k1 = sp * (vbase * (magic(psum[1], one) - 12582912.f) - 12582912.f * (vsign + vmag));
    const float cs = sp * vsign, cm = sp * vmag;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      o[u][0] = fmaf(cm, magic(dacc[u][1][0], one), fmaf(cs, magic(dacc[u][0][0], one), o[u][0] + k0));
      o[u][1] = fmaf(cm, magic(dacc[u][1][1], one), fmaf(cs, magic(dacc[u][0][1], one), o[u][1] + k1));
      o[u][2] = fmaf(cm, magic(dacc[u][1][2], one), fmaf(cs, magic(dacc[u][0][2], one), o[u][2] + k0));
      o[u][3] = fmaf(cm, magic(dacc[u][1][3], one), fmaf(cs, magic(dacc[u][0][3], one), o[u][3] + k1));
#pragma unroll
      for (int e = 0; e < 4; ++e) dacc[u][0][e] = dacc[u][1][e] = 0;
    }
    psum[0] = psum[1] = psum[2] = psum[3] = 0;
  };
#endif

#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    const uint4* st = my + (it & 1) * kStageU4;
    const uint4 kw = st[lane];       // key planes: token g (s, m), token g + 8 (s, m)
    const uint4 vw = st[32 + lane];  // value planes: s (blocks 0-3, 4-7), m (0-3, 4-7)
    const uint2 kn = reinterpret_cast<const uint2*>(st + 64)[t];      // ‖k‖ of tokens 2t, 2t+1 | 2t+8, 2t+9
    const uint2 vn = reinterpret_cast<const uint2*>(st + 64 + 2)[t];  // ‖v‖ of the same tokens

    // ---- scores: 2 planes x 2 token halves, chains of 4 k-chunks
    int ss[2][4] = {}, sm[2][4] = {};
    const u32 ws[2] = {kw.x, kw.z}, wm[2] = {kw.y, kw.w};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      imma16832(ss[n], qa[0], plane_reg<0>(ws[n], pw), plane_reg<1>(ws[n], pw));
      imma16832(sm[n], qa[0], plane_reg<0>(wm[n], pw), plane_reg<1>(wm[n], pw));
      imma16832(ss[n], qa[1], plane_reg<2>(ws[n], pw), plane_reg<3>(ws[n], pw));
      imma16832(sm[n], qa[1], plane_reg<2>(wm[n], pw), plane_reg<3>(wm[n], pw));
      imma16832(ss[n], qa[2], plane_reg<4>(ws[n], pw), plane_reg<5>(ws[n], pw));
      imma16832(sm[n], qa[2], plane_reg<4>(wm[n], pw), plane_reg<5>(wm[n], pw));
      imma16832(ss[n], qa[3], plane_reg<6>(ws[n], pw), plane_reg<7>(ws[n], pw));
      imma16832(sm[n], qa[3], plane_reg<6>(wm[n], pw), plane_reg<7>(wm[n], pw));
    }
    // ---- fold: rows g (hi, entries 0-1) + g + 8 (lo, entries 2-3) of each accumulator
    const float knv[4] = {half_lo(kn.x), half_hi(kn.x), half_lo(kn.y), half_hi(kn.y)};
    float sc[4];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = fmaf(ash, magic(ss[n][e], one), c0);
        x = fmaf(asl, magic(ss[n][2 + e], one), x);
        x = fmaf(amh, magic(sm[n][e], one), x);
        x = fmaf(aml, magic(sm[n][2 + e], one), x);
        sc[2 * n + e] = knv[2 * n + e] * x;
      }
    // ---- online softmax (base 2), row g
    float mx = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
    mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 2));
    const float mn = fmaxf(m0, mx);
    const float al = exp2_approx(m0 - mn);
    m0 = mn;
    float pr[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) pr[e] = exp2_approx(sc[e] - mn);
    l0 = l0 * al + ((pr[0] + pr[1]) + (pr[2] + pr[3]));
    if (__any_sync(~0u, al != 1.f)) {  // rescale O (rows 2t, 2t + 1): not the typical path
#ifdef FOLD_TILE
      fold();  // the tile's stages so far, at the old max
#endif
      const float a0 = __shfl_sync(~0u, al, 8 * t), a1 = __shfl_sync(~0u, al, 8 * t + 4);
#pragma unroll
      for (int u = 0; u < 8; ++u) o[u][0] *= a0, o[u][1] *= a1, o[u][2] *= a0, o[u][3] *= a1;
    }
    // ---- p ‖v‖ to s8, packed as Pᵀ's B register
    const float vnv[4] = {half_lo(vn.x), half_hi(vn.x), half_lo(vn.y), half_hi(vn.y)};
    float pv[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) pv[e] = pr[e] * vnv[e];
#ifdef FOLD_TILE
    const float inv = inv_tile;  // 127 / max ‖v‖ of the tile (p <= 1)
#else
    // the row's scale: max over the quad
    float pm = fmaxf(fmaxf(pv[0], pv[1]), fmaxf(pv[2], pv[3]));
    pm = fmaxf(pm, __shfl_xor_sync(~0u, pm, 1));
    pm = fmaxf(pm, __shfl_xor_sync(~0u, pm, 2));
    const float inv = 127.f * rcp_approx(pm);
#endif
    u32 b8[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) b8[e] = __float_as_uint(fmaf(pv[e], inv, 12582912.f));  // round to nearest
    const u32 pb = __byte_perm(__byte_perm(b8[0], b8[1], 0x0040), __byte_perm(b8[2], b8[3], 0x0040), 0x5410);
    const u32 vs[2] = {vw.x, vw.y}, vm[2] = {vw.z, vw.w};
#ifdef FOLD_TILE
    // ---- P·V into the tile's s32 accumulators; folded once a tile
    imma16816(psum, 0x01010101u, 0x01010101u, pb);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      imma16816(dacc[4 * h + 0][0], plane_reg<0>(vs[h], pw), plane_reg<1>(vs[h], pw), pb);
      imma16816(dacc[4 * h + 0][1], plane_reg<0>(vm[h], pw), plane_reg<1>(vm[h], pw), pb);
      imma16816(dacc[4 * h + 1][0], plane_reg<2>(vs[h], pw), plane_reg<3>(vs[h], pw), pb);
      imma16816(dacc[4 * h + 1][1], plane_reg<2>(vm[h], pw), plane_reg<3>(vm[h], pw), pb);
      imma16816(dacc[4 * h + 2][0], plane_reg<4>(vs[h], pw), plane_reg<5>(vs[h], pw), pb);
      imma16816(dacc[4 * h + 2][1], plane_reg<4>(vm[h], pw), plane_reg<5>(vm[h], pw), pb);
      imma16816(dacc[4 * h + 3][0], plane_reg<6>(vs[h], pw), plane_reg<7>(vs[h], pw), pb);
      imma16816(dacc[4 * h + 3][1], plane_reg<6>(vm[h], pw), plane_reg<7>(vm[h], pw), pb);
    }
    if ((it & 3) == 3) {
      fold();
      inv_tile = 127.f * rcp_approx(reinterpret_cast<const float*>(st + 64 + 4)[0]);  // next tile's
    }
#else
    // the scales of rows 2t, 2t + 1 (the transposed C layout's rows)
    const float sp = pm * (1.f / 127.f);
    const float sp0 = __shfl_sync(~0u, sp, 8 * t), sp1 = __shfl_sync(~0u, sp, 8 * t + 4);

    // ---- P·V: 8 blocks of 16 coordinates x 2 planes, + Σ p8 per row
    int psum[4] = {};
    imma16816(psum, 0x01010101u, 0x01010101u, pb);
    // per row: Σ p8 · base and the magic offsets of the two planes, folded into one constant
    const float k0 = sp0 * (vbase * (magic(psum[0], one) - 12582912.f) - 12582912.f * (vsign + vmag));
    const float k1 = sp1 * (vbase * (magic(psum[1], one) - 12582912.f) - 12582912.f * (vsign + vmag));
    const float cs0 = sp0 * vsign, cs1 = sp1 * vsign, cm0 = sp0 * vmag, cm1 = sp1 * vmag;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#define PV_BLOCK(U, XA, XB)                                                                \
  {                                                                                        \
    int ds[4] = {}, dm[4] = {};                                                            \
    imma16816(ds, plane_reg<XA>(vs[h], pw), plane_reg<XB>(vs[h], pw), pb);                 \
    imma16816(dm, plane_reg<XA>(vm[h], pw), plane_reg<XB>(vm[h], pw), pb);                 \
    float(&ou)[4] = o[4 * h + U];                                                          \
    ou[0] = fmaf(cm0, magic(dm[0], one), fmaf(cs0, magic(ds[0], one), ou[0] + k0));        \
    ou[1] = fmaf(cm1, magic(dm[1], one), fmaf(cs1, magic(ds[1], one), ou[1] + k1));        \
    ou[2] = fmaf(cm0, magic(dm[2], one), fmaf(cs0, magic(ds[2], one), ou[2] + k0));        \
    ou[3] = fmaf(cm1, magic(dm[3], one), fmaf(cs1, magic(ds[3], one), ou[3] + k1));        \
  }
      PV_BLOCK(0, 0, 1)
      PV_BLOCK(1, 2, 3)
      PV_BLOCK(2, 4, 5)
      PV_BLOCK(3, 6, 7)
#undef PV_BLOCK
    }
#endif
  }
  float acc = l0;
#pragma unroll
  for (int u = 0; u < 8; ++u) acc += o[u][0] + o[u][1] + o[u][2] + o[u][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
