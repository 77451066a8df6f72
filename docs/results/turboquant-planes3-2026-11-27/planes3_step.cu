// Instruction count of the unpack + lookup of 3-bit codes stored at 3 bits (issue 10, branch
// issue-10-planes3; docs/TURBOQUANT_CUDA.md, "Decode bytes: 3-bit codes in bit planes, the design
// and its count"). NOT a kernel of the runtime: a standalone file to count SASS, compiled with
// `nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --cubin -DLAYOUT=n` (count.sh). It has
// no tests and was never run.
//
// One warp, D = 128, at most 8 query rows (main's `_r8` kernels), one 16-token stage per loop
// iteration, as main's decode loop (cuda-kernels/turboquant_decode.cu, decode_unit) with everything
// but the codes' path left out (no softmax, no signs, no refill): per stage a lane reads its code
// words from shared memory, turns them into main's nibble selector words, looks 64 key and 64 value
// codes up with main's `lookup4` (8-entry tables in registers) and feeds main's 16 score MMAs
// (keys as B, the query's hi/lo fragments from shared memory as A) and 8 P·V MMAs (Vᵀ as A at 8
// rows, Pᵀ as B). Only the code path differs between the layouts, so the difference of two
// counts is what a layout adds to main's loop.
//
// LAYOUT (per lane block of 32 codes = main's 4 nibble words w0..w3, nibble k of w_i at bits
// 4k..4k+3, codes 0..7 so bit 3 is 0):
//   0  NIB    main: 4 words (16 bytes) read as they are; the high half of each word by a shift
//   1  N3H    3 words A, B, C (12 bytes): A = w0 in bits 0-2 of every nibble, B = w1, C = w2, and
//             w3 spread over their spare bits 3, encoded so that
//               w0 = A & M, w1 = B & M, w2 = C & M,   M = 0x77777777
//               w3 = ((A >> 3) + (B >> 2) + (C >> 1)) & M      (u32 arithmetic, mod 2^32)
//             the three right shifts as IMAD.HI x · 2^(32-s) (FMA pipe; the powers of two in
//             registers loaded from memory, so that ptxas cannot turn them back into shifts; with
//             an addend, IMAD.HI takes a 64-bit register pair and ptxas builds it with two moves,
//             so the sum is one IADD3)
//   2  N3L    the same layout, the decode written as plain C (ptxas: SHF / LEA.HI, ALU pipe)
//   3  P21    a crumb plane and a bit plane: per 32 codes two crumb words (pack2's fold: x0 holds
//             w0's low two bits in bits 0-1 of every nibble and w1's in bits 2-3; x1 w2 and w3)
//             and one bit word Y with the third bits pre-positioned: w0's at nibble bit 2, w1's
//             at bit 3, w2's at bit 0, w3's at bit 1
//   4  SGN    symmetric codebook: the third bit is the sign. Crumb plane of magnitudes (4-entry
//             table, main's lookup4) and a sign plane applied after the lookup: operand j's two
//             sign bits moved to bits 15 and 31 and xor-ed in (a shift and a LOP3 an operand)
// HI_IMAD (-DHI_IMAD, any layout): the high-half selectors `w >> 16` as IMAD.HI w · 2^16 (FMA pipe,
// no addend) instead of SHF: a change main could make without any new layout (counted, not measured).
#include <cstdint>
typedef uint32_t u32;

#ifndef LAYOUT
#define LAYOUT 0
#endif

__device__ u32 kPow[4] = {0x20000000u, 0x40000000u, 0x80000000u, 0x10000u};  // 2^29..2^31 (LAYOUT 1),
                                                                               // 2^16 (HI_IMAD): opaque to ptxas
// 0, loaded once: the tables made per-lane values (`| kZero & lane`), as crumb17 found for main:
// otherwise ptxas holds them in uniform registers and copies them before every prmt
__device__ u32 kZero = 0u;

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
// main's lookup4<false>: four selector nibbles (w's low 16 bits) -> two f16x2
__device__ __forceinline__ void lookup4(u32 w, const u32 (&t)[8], u32& a, u32& b) {
  const u32 lo = prmt(t[0], t[1], w), hi = prmt(t[4], t[5], w);
  a = prmt(lo, hi, 0x5140u);
  b = prmt(lo, hi, 0x7362u);
}
// x >> (32 - log2 p) on the FMA pipe: the high word of x · p
__device__ __forceinline__ u32 hi_mul(u32 x, u32 p) {
  u32 r;
  asm("mul.hi.u32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(p));
  return r;
}
__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 pack_f16x2(float a, float b) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(a), "f"(b));
  return r;
}

struct Words {
  u32 w[4];  // main's nibble words of one lane block (32 codes)
};

constexpr u32 M3 = 0x77777777u;

// A stage in shared memory. NIB: main's 4 slots of [32 lanes] 16 bytes (key rows g, g + 8, value
// pairs q, q + 4). The 3-bit layouts: a lane's 24 key bytes (its groups of token g, then g + 8)
// and 24 value bytes (pair q, then q + 4), each as a 16-byte chunk at 16 lane and an 8-byte tail at
// 512 + 8 lane of the side's 768-byte block (two 16-byte cp.async.cg a side, the tail one by lanes
// 0-15 only: as many copies as main's, every one 16 bytes through L2, so the early ring stays), read
// back with one LDS.128 and one LDS.64 a side (conflict-free): as many shared loads as main's.
// (both rings strided 2048 bytes a stage, as main's slots, so that the loop's address arithmetic
// differs only by what the layouts read)
constexpr int kStageU4 = 4 * 32;

// The 4 lane blocks of a lane's stage (key rows g, g + 8; value pairs q, q + 4) from the stage `st`.
__device__ __forceinline__ void unpack(const uint4* st, int lane, const unsigned char* tail, Words (&r)[4],
                                       const u32 (&pw)[3], u32 (&sg)[4]) {
#if LAYOUT == 0
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const uint4 c = st[b * 32 + lane];
    r[b].w[0] = c.x, r[b].w[1] = c.y, r[b].w[2] = c.z, r[b].w[3] = c.w;
  }
  (void)pw, (void)sg, (void)tail;
#else
  // `tail`: this lane's 8-byte tail of the stage's key side (stage base + 512 + 8 lane, advanced
  // with the ring like `st`: a second running address, one add an iteration)
  const uint4 k = st[lane], v = st[48 + lane];
  const uint2 kt = *reinterpret_cast<const uint2*>(tail), vt = *reinterpret_cast<const uint2*>(tail + 768);
  const u32 s[12] = {k.x, k.y, k.z, k.w, kt.x, kt.y, v.x, v.y, v.z, v.w, vt.x, vt.y};
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const u32 A = s[3 * b], B = s[3 * b + 1], C = s[3 * b + 2];
#if LAYOUT == 1
    r[b].w[0] = A & M3, r[b].w[1] = B & M3, r[b].w[2] = C & M3;
    r[b].w[3] = (hi_mul(A, pw[0]) + hi_mul(B, pw[1]) + hi_mul(C, pw[2])) & M3;
    (void)sg;
#elif LAYOUT == 2
    r[b].w[0] = A & M3, r[b].w[1] = B & M3, r[b].w[2] = C & M3;
    r[b].w[3] = ((A >> 3) + (B >> 2) + (C >> 1)) & M3;
    (void)pw, (void)sg;
#elif LAYOUT == 3
    // A, B: crumb words x0, x1; C: the bit word Y
    const u32 x0 = A, x1 = B, Y = C;
    r[b].w[0] = (x0 & 0x33333333u) | (Y & 0x44444444u);
    r[b].w[1] = ((x0 >> 2) & 0x33333333u) | ((Y >> 1) & 0x44444444u);
    r[b].w[2] = (x1 & 0x33333333u) | ((Y << 2) & 0x44444444u);
    r[b].w[3] = ((x1 >> 2) & 0x33333333u) | ((Y << 1) & 0x44444444u);
    (void)pw, (void)sg, (void)tail;
#else
    // A, B: crumb words of magnitudes; C: the sign word (applied after the lookup)
    r[b].w[0] = A & 0x33333333u, r[b].w[1] = (A >> 2) & 0x33333333u;
    r[b].w[2] = B & 0x33333333u, r[b].w[3] = (B >> 2) & 0x33333333u;
    sg[b] = C;
    (void)pw;
#endif
  }
#endif
}

#ifdef HI_IMAD
#define HI16(w) hi_mul((w), p16)
#else
#define HI16(w) ((w) >> 16)
#endif

#if LAYOUT == 4
// operand j (0..15) of a lane block: its two signs at bits 15 and 31 of (s << j)
#define SIGNED(v, s, j) ((v) ^ (((s) << (j)) & 0x80008000u))
#else
#define SIGNED(v, s, j) (v)
#endif

extern "C" __global__ void __launch_bounds__(128) planes3_step(const uint4* __restrict__ src, const u32* __restrict__ tabs,
                                                               float* __restrict__ out, int iters) {
  __shared__ uint4 ring[4][2 * kStageU4 + 8 * 32];  // per warp: a ring of 2 stages, then the query fragments
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint4* my = ring[warp];
  for (int i = lane; i < 2 * kStageU4 + 8 * 32; i += 32) my[i] = src[i];
  __syncwarp();
  const uint4* qsm = my + 2 * kStageU4;  // [8 chunks][32 lanes] {hi, lo, hi, lo} of Π q
  u32 ktab[8], vtab[8];
  const u32 zl = kZero & (u32)lane;
#pragma unroll
  for (int i = 0; i < 8; ++i) ktab[i] = tabs[i] | zl, vtab[i] = tabs[8 + i] | zl;
  const u32 pw[3] = {kPow[0], kPow[1], kPow[2]};
  const u32 p16 = kPow[3];
  (void)p16;
  float s0[4] = {}, s1[4] = {}, z0[4] = {}, z1[4] = {};
  float o[8][4] = {};
  u32 pop0 = 0x3c003c00u, pop2 = 0x3c003c00u;
  const int tail_off = 512 + 8 * lane;  // loop-invariant

#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    const uint4* st = my + (it & 1) * kStageU4;
    const unsigned char* tail = reinterpret_cast<const unsigned char*>(st) + tail_off;
    Words r[4];  // 0: key row g, 1: key row g + 8, 2: value pair q, 3: value pair q + 4
    u32 sg[4] = {};
    unpack(st, lane, tail, r, pw, sg);
    // ---- scores (main's score_word at 8 rows: two accumulators per token half)
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      u32 b00, b01, b10, b11, c00, c01, c10, c11;
      lookup4(r[0].w[w], ktab, b00, b01);
      lookup4(HI16(r[0].w[w]), ktab, b10, b11);
      lookup4(r[1].w[w], ktab, c00, c01);
      lookup4(HI16(r[1].w[w]), ktab, c10, c11);
      b00 = SIGNED(b00, sg[0], 4 * w), b01 = SIGNED(b01, sg[0], 4 * w + 1);
      b10 = SIGNED(b10, sg[0], 4 * w + 2), b11 = SIGNED(b11, sg[0], 4 * w + 3);
      c00 = SIGNED(c00, sg[1], 4 * w), c01 = SIGNED(c01, sg[1], 4 * w + 1);
      c10 = SIGNED(c10, sg[1], 4 * w + 2), c11 = SIGNED(c11, sg[1], 4 * w + 3);
      const uint4 q0 = qsm[(2 * w) * 32 + lane], q1 = qsm[(2 * w + 1) * 32 + lane];
      const u32 f0[4] = {q0.x, q0.y, q0.z, q0.w}, f1[4] = {q1.x, q1.y, q1.z, q1.w};
      float(&x0)[4] = (w & 1) ? z0 : s0;
      float(&x1)[4] = (w & 1) ? z1 : s1;
      mma16816(x0, f0, b00, b01);
      mma16816(x0, f1, b10, b11);
      mma16816(x1, f0, c00, c01);
      mma16816(x1, f1, c10, c11);
    }
    // ---- P·V (main's pv_word at 8 rows: Vᵀ as A, Pᵀ as B) with the previous stage's P
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      u32 a0, a1, a2, a3, b0, b1, b2, b3;
      lookup4(r[2].w[w], vtab, a0, a1);
      lookup4(HI16(r[2].w[w]), vtab, a2, a3);
      lookup4(r[3].w[w], vtab, b0, b1);
      lookup4(HI16(r[3].w[w]), vtab, b2, b3);
      a0 = SIGNED(a0, sg[2], 4 * w), a1 = SIGNED(a1, sg[2], 4 * w + 1);
      a2 = SIGNED(a2, sg[2], 4 * w + 2), a3 = SIGNED(a3, sg[2], 4 * w + 3);
      b0 = SIGNED(b0, sg[3], 4 * w), b1 = SIGNED(b1, sg[3], 4 * w + 1);
      b2 = SIGNED(b2, sg[3], 4 * w + 2), b3 = SIGNED(b3, sg[3], 4 * w + 3);
      const u32 va0[4] = {a0, a1, b0, b1}, va1[4] = {a2, a3, b2, b3};
      mma16816(o[2 * w], va0, pop0, pop2);
      mma16816(o[2 * w + 1], va1, pop0, pop2);
    }
    // the next stage's P from this stage's scores (a stand-in for the softmax: keeps the score
    // MMAs live; the same in every layout)
    pop0 = pack_f16x2(s0[0] + z0[0], s0[1] + z0[1]);
    pop2 = pack_f16x2(s1[0] + z1[0], s1[1] + z1[1]);
  }
  float acc = s0[2] + s1[3] + z0[2] + z1[3];
#pragma unroll
  for (int u = 0; u < 8; ++u) acc += o[u][0] + o[u][1] + o[u][2] + o[u][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
