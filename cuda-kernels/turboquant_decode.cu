// Fused TurboQuant decode over the compressed KV cache (the fused kernel of
// shared/papers/turboquant-fused-attention-kernels.txt, "Fused Attention Kernel"; contract:
// ferrattn_core::turboquant::attention), split over the KV length with LeanAttention's stream-K
// schedule (ferrattn_core::lean) and merged by a second kernel.
//
// Three launches per step:
//   1. turboquant_prepare_q_*: every query row rotated (Π q) and projected (S q) once, scaled by
//      softmax_scale · log2 e (and √(π/2)/m for S q), rounded to f16 and written straight in the
//      A-fragment order of mma.m16n8k16: the units load their query tile with 16-byte loads.
//   2. turboquant_decode_*: one warp per *unit* of the stream-K schedule. An output tile is the
//      16 MMA rows of one (sequence, KV head): the GQA group's query heads times the query
//      tokens (rows r = head_in_group · max_sq + i), so every K/V byte is read once for all of
//      them. Per 16 tokens:
//        S  = (Π q) · c[idx]ᵀ           mma.m16n8k16, K as the B operand (centroids, f16)
//        T  = (S q) · signsᵀ            mma.m16n8k16, signs as ±1 f16 (QJL keys only)
//        s  = ‖k‖ S + ‖r‖ T             (base 2: the scales were folded into the queries)
//        online softmax in base 2 (exp2 of s - m, running max and sum per row)
//        O_rot += (p ‖v‖) · c[idx_v]    mma.m16n8k16, P from the S accumulators, V as B
//      O is accumulated in the rotated basis: Π_vᵀ Σ_j p_j ‖v_j‖ c[idx_j] = Σ_j p_j v̂_j, so Πᵀ is
//      applied once per output row (in the merge) instead of once per value tile.
//      Codes are unpacked in registers, never through shared memory: one nibble per coordinate,
//      laid out so that one lane's bytes are exactly its B fragments (see turboquant_compress.cu);
//      `prmt` with the nibbles as selectors looks four centroids up in byte tables held in
//      registers (low bytes and high bytes of the f16 centroids) and two more `prmt` interleave
//      them into two f16x2 operands. Sign bits become ±1 f16 pairs with one shift and one LOP3.
//   3. turboquant_combine_*: per output tile and row, the unit partials (O_rot, m, l) in key order
//      (Lean's reduction), O = Πᵀ (O_rot / l), LSE = (m + log2 l) ln 2.
// Launches 1 and 3 are persistent CTAs with Πᵀ, Sᵀ (resp. Π) staged in shared memory once.
#include "common.cuh"

namespace ferrattn {
namespace tq {

constexpr int kUnitWarps = 4;  // warps (units) per CTA of the decode kernel
constexpr int kRows = 16;      // MMA rows of an output tile
constexpr int kTileK = 16;     // tokens per iteration

// Mirrors ferrattn_cuda::turboquant::DecodeParams (#[repr(C)]).
struct DecodeParams {
  const u32* qf;                  // [tiles][32][D/16][4] f16x2: Π q · scale log2 e, rounded
  const u32* qf_lo;               // the same layout: what the rounding left (q = hi + lo)
  const u32* pf;                  // [tiles][32][D/16][4] f16x2: S q · scale log2 e √(π/2)/m
  const unsigned char* kcodes;    // [B][Hk][cap][D/2]
  const unsigned char* ksigns;    // [B][Hk][cap][D/8]
  const u32* knorms;              // [B][Hk][cap] f16x2 {‖k‖, ‖r‖}
  const unsigned char* vcodes;    // [B][Hk][cap/2][D]
  const u16* vnorms;              // [B][Hk][cap] f16
  const int* segs;                // [segments][4]: tile, first token, end token, 0
  const int* unit_segs;           // [units + 1] first segment of each unit
  float* part_o;                  // [segments][16][D]
  float* part_ml;                 // [segments][16][2] (m, l), m in log2 units
  const int* seqlens_q;           // [B]
  const int* seqlens_k;           // [B]
  int units, heads_kv, cap, qgroups, group, max_sq, causal, pad;
  u32 ktab[8];                    // σ_k x key centroids (f16): low bytes of entries 0-15, then high
                                  // bytes; 1 / σ_k is folded into the query scale
  u32 vtab[8];                    // σ_v x value centroids, same; 1 / σ_v is applied in the merge
};

// Mirrors ferrattn_cuda::turboquant::PrepareParams.
struct PrepareParams {
  const u16* q;         // [B, max_sq, Hq, D]
  const float* pit;     // [D][D] Πᵀ
  const float* st;      // [D][D] Sᵀ (m = D)
  u32* qf;
  u32* qf_lo;
  u32* pf;
  const int* seqlens_q;
  int heads_kv, group, max_sq, qgroups, heads_q, qjl, batch_tiles;
  float qscale, pscale;
};

// Mirrors ferrattn_cuda::turboquant::CombineParams.
struct CombineParams {
  const float* part_o;
  const float* part_ml;
  const int* tile_segs;  // [tiles + 1] first segment of each output tile
  const float* pi;       // [D][D] Π
  u16* o;                // [B, max_sq, Hq, D] f16
  float* lse;            // [B, Hq, max_sq]
  const int* seqlens_q;
  int heads_kv, group, max_sq, qgroups, heads_q, tiles;
  float oscale;  // 1 / σ_v: the value table holds σ_v c (ferrattn_cuda::turboquant::f16_friendly_scale)
};

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Four nibble codes (w's low 16 bits, first code lowest) -> two f16x2: (c[n0], c[n1]), (c[n2], c[n3]).
// Tables of up to 8 entries: one prmt for four low bytes, one for four high bytes (selector
// nibbles < 8 never trigger prmt's sign-replicate mode). 16 entries: both halves of the table
// looked up, then bit 3 of each code picks a half (a third prmt, selector k + 4 · bit3).
template <bool WIDE>
__device__ __forceinline__ void lookup4(u32 w, const u32 (&t)[8], u32& a, u32& b) {
  u32 lo, hi;
  if (!WIDE) {
    lo = prmt(t[0], t[1], w);
    hi = prmt(t[4], t[5], w);
  } else {
    const u32 sel = w & 0x7777u;
    const u32 pick = ((w >> 1) & 0x4444u) | 0x3210u;
    lo = prmt(prmt(t[0], t[1], sel), prmt(t[2], t[3], sel), pick);
    hi = prmt(prmt(t[4], t[5], sel), prmt(t[6], t[7], sel), pick);
  }
  a = prmt(lo, hi, 0x5140u);
  b = prmt(lo, hi, 0x7362u);
}

// ±1 f16 pair from sign bits jj and jj + 16 of w (stored 1 = +1, as QjlSketch::signs_into)
__device__ __forceinline__ u32 signs2(u32 w, int jj) {
  return ((w << (15 - jj)) & 0x80008000u) ^ 0xBC00BC00u;
}

__device__ __forceinline__ uint4 ldg16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldg8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ u32 ldg4(const void* p) {
  u32 v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ u32 ldg2(const void* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// A lane's words of one token row (keys) or one token pair (values): D/32 words.
template <int D>
struct Words {
  u32 w[D / 32];
};
template <int D>
__device__ __forceinline__ Words<D> ld_words(const unsigned char* p) {
  Words<D> r;
  if constexpr (D == 128) {
    const uint4 v = ldg16(p);
    r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
  } else {
    const uint2 v = ldg8(p);
    r.w[0] = v.x, r.w[1] = v.y;
  }
  return r;
}
// a lane's sign bits of one token, pair jj's bits at jj and jj + 16
template <int D>
__device__ __forceinline__ u32 ld_signs(const unsigned char* p) {
  if constexpr (D == 128) {
    return ldg4(p);
  } else {
    const u32 h = ldg2(p);
    return (h & 0xffu) | ((h & 0xff00u) << 8);
  }
}

// Everything a lane loads for one 16-token iteration.
template <int D>
struct Stage {
  Words<D> k0, k1;  // K codes of tokens g and g + 8 (lane block q)
  Words<D> v0, v1;  // V codes of token pairs q and q + 4 (lane block g)
  u32 s0, s1;       // sign bits of tokens g and g + 8
  uint2 kn0, kn1;   // {‖k‖, ‖r‖} of tokens 2q, 2q + 1 and 2q + 8, 2q + 9
  u32 vn0, vn1;     // ‖v‖ of the same tokens
};

template <int D, bool QJL>
__device__ __forceinline__ void load_stage(const DecodeParams& p, size_t row0, int start, int g, int q,
                                           Stage<D>& st) {
  st.k0 = ld_words<D>(p.kcodes + (row0 + start + g) * (D / 2) + q * (D / 8));
  st.k1 = ld_words<D>(p.kcodes + (row0 + start + g + 8) * (D / 2) + q * (D / 8));
  st.v0 = ld_words<D>(p.vcodes + (row0 / 2 + start / 2 + q) * D + g * (D / 8));
  st.v1 = ld_words<D>(p.vcodes + (row0 / 2 + start / 2 + q + 4) * D + g * (D / 8));
  if (QJL) {
    st.s0 = ld_signs<D>(p.ksigns + (row0 + start + g) * (D / 8) + q * (D / 32));
    st.s1 = ld_signs<D>(p.ksigns + (row0 + start + g + 8) * (D / 8) + q * (D / 32));
  }
  st.kn0 = ldg8(p.knorms + row0 + start + 2 * q);
  st.kn1 = ldg8(p.knorms + row0 + start + 2 * q + 8);
  st.vn0 = ldg4(p.vnorms + row0 + start + 2 * q);
  st.vn1 = ldg4(p.vnorms + row0 + start + 2 * q + 8);
}

__device__ __forceinline__ float half_lo(u32 w) { return F16::to_f32((u16)(w & 0xffffu)); }
__device__ __forceinline__ float half_hi(u32 w) { return F16::to_f32((u16)(w >> 16)); }

// Visible keys of MMA row r of tile (b, qg): causal bottom-right as AttentionProblem::visible_keys,
// 0 for padding rows.
__device__ __forceinline__ int row_end(const DecodeParams& p, int qg, int r, int sq, int sk) {
  const int R = qg * kRows + r, hl = R / p.max_sq, i = R % p.max_sq;
  if (hl >= p.group || i >= sq) return 0;
  if (!p.causal) return sk;
  return min(max(i + sk - sq + 1, 0), sk);
}

template <int D, bool QJL, bool KWIDE, bool VWIDE, bool R16>
__device__ __forceinline__ void decode_unit(const DecodeParams& p) {
  constexpr int CH = D / 16;  // k16 chunks of the head dim
  constexpr int NB = D / 8;   // n8 blocks of the output
  const int lane = threadIdx.x & 31;
  const int unit = blockIdx.x * kUnitWarps + (threadIdx.x >> 5);
  if (unit >= p.units) return;
  const int g = lane >> 2, q = lane & 3;
  u32 ktab[8], vtab[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) ktab[i] = p.ktab[i], vtab[i] = p.vtab[i];

  const int seg_end = p.unit_segs[unit + 1];
  for (int sgi = p.unit_segs[unit]; sgi < seg_end; ++sgi) {
    const int tile = p.segs[4 * sgi], tok0 = p.segs[4 * sgi + 1], tok1 = p.segs[4 * sgi + 2];
    const int qg = tile % p.qgroups, h = (tile / p.qgroups) % p.heads_kv, b = tile / (p.qgroups * p.heads_kv);
    const int sq = p.seqlens_q[b], sk = p.seqlens_k[b];
    const int lim0 = min(tok1, row_end(p, qg, g, sq, sk));
    const int lim1 = min(tok1, row_end(p, qg, g + 8, sq, sk));
    u32 qa[CH][4], pa[CH][4];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const uint4 v = ldg16(p.qf + ((size_t)(tile * 32 + lane) * CH + c) * 4);
      qa[c][0] = v.x, qa[c][1] = R16 ? v.y : 0u, qa[c][2] = v.z, qa[c][3] = R16 ? v.w : 0u;
      if (QJL) {
        const uint4 w = ldg16(p.pf + ((size_t)(tile * 32 + lane) * CH + c) * 4);
        pa[c][0] = w.x, pa[c][1] = R16 ? w.y : 0u, pa[c][2] = w.z, pa[c][3] = R16 ? w.w : 0u;
      }
    }
    float o[NB][4];
#pragma unroll
    for (int n = 0; n < NB; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = neg_inf(), m1 = neg_inf(), l0 = 0.f, l1 = 0.f;
    const size_t row0 = ((size_t)b * p.heads_kv + h) * p.cap;
    // the loop bound must be the same in every lane (mma.sync and shfl.sync need the whole
    // warp): the segment's end, not a row's visible end (rows differ per lane; masked below)
    const int last = tok1;

    Stage<D> cur;
    if (tok0 < last) load_stage<D, QJL>(p, row0, tok0, g, q, cur);
    for (int start = tok0; start < last; start += kTileK) {
      Stage<D> nxt;
      const bool more = start + kTileK < last;
      if (more) load_stage<D, QJL>(p, row0, start + kTileK, g, q, nxt);

      // ---- S = (Π q) · c[idx]ᵀ and T = (S q) · signsᵀ, tokens 0-7 (s0) and 8-15 (s1)
      float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
      float t0[4] = {0.f, 0.f, 0.f, 0.f}, t1[4] = {0.f, 0.f, 0.f, 0.f};
      // q = hi + lo in two f16 MMAs: the scores then carry the rounding of the centroids only
      // (the low halves come from L1: the registers hold the high halves and O)
      const u32* lo_base = p.qf_lo + (size_t)(tile * 32 + lane) * CH * 4;
#pragma unroll
      for (int w = 0; w < D / 32; ++w) {
        u32 b00, b01, b10, b11, c00, c01, c10, c11;
        lookup4<KWIDE>(cur.k0.w[w], ktab, b00, b01);
        lookup4<KWIDE>(cur.k0.w[w] >> 16, ktab, b10, b11);
        lookup4<KWIDE>(cur.k1.w[w], ktab, c00, c01);
        lookup4<KWIDE>(cur.k1.w[w] >> 16, ktab, c10, c11);
        u32 lo0[4], lo1[4];
        {
          const uint4 a = ldg16(lo_base + 8 * w), b = ldg16(lo_base + 8 * w + 4);
          lo0[0] = a.x, lo0[1] = R16 ? a.y : 0u, lo0[2] = a.z, lo0[3] = R16 ? a.w : 0u;
          lo1[0] = b.x, lo1[1] = R16 ? b.y : 0u, lo1[2] = b.z, lo1[3] = R16 ? b.w : 0u;
        }
        mma16816(F16{}, s0, qa[2 * w], b00, b01);
        mma16816(F16{}, s0, qa[2 * w + 1], b10, b11);
        mma16816(F16{}, s1, qa[2 * w], c00, c01);
        mma16816(F16{}, s1, qa[2 * w + 1], c10, c11);
        mma16816(F16{}, s0, lo0, b00, b01);
        mma16816(F16{}, s0, lo1, b10, b11);
        mma16816(F16{}, s1, lo0, c00, c01);
        mma16816(F16{}, s1, lo1, c10, c11);
      }
      if (QJL) {
#pragma unroll
        for (int c = 0; c < CH; ++c) {
          mma16816(F16{}, t0, pa[c], signs2(cur.s0, 2 * c), signs2(cur.s0, 2 * c + 1));
          mma16816(F16{}, t1, pa[c], signs2(cur.s1, 2 * c), signs2(cur.s1, 2 * c + 1));
        }
      }

      // ---- scores, masking, online softmax (base 2) for rows g (e = 0, 1) and g + 8 (e = 2, 3)
      const int j0 = start + 2 * q;  // token of s0[0] (s0[1] is j0 + 1, s1[*] are + 8)
      const float kA = half_lo(cur.kn0.x), rA = half_hi(cur.kn0.x);  // token j0
      const float kB = half_lo(cur.kn0.y), rB = half_hi(cur.kn0.y);  // j0 + 1
      const float kC = half_lo(cur.kn1.x), rC = half_hi(cur.kn1.x);  // j0 + 8
      const float kD = half_lo(cur.kn1.y), rD = half_hi(cur.kn1.y);  // j0 + 9
      float sc[8];
      sc[0] = kA * s0[0] + (QJL ? rA * t0[0] : 0.f);
      sc[1] = kB * s0[1] + (QJL ? rB * t0[1] : 0.f);
      sc[2] = kC * s1[0] + (QJL ? rC * t1[0] : 0.f);
      sc[3] = kD * s1[1] + (QJL ? rD * t1[1] : 0.f);
      sc[4] = kA * s0[2] + (QJL ? rA * t0[2] : 0.f);
      sc[5] = kB * s0[3] + (QJL ? rB * t0[3] : 0.f);
      sc[6] = kC * s1[2] + (QJL ? rC * t1[2] : 0.f);
      sc[7] = kD * s1[3] + (QJL ? rD * t1[3] : 0.f);
      const int tok[4] = {j0, j0 + 1, j0 + 8, j0 + 9};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (tok[e] >= lim0) sc[e] = neg_inf();
        if (tok[e] >= lim1) sc[4 + e] = neg_inf();
      }
      float mx0 = fmax2(fmax2(sc[0], sc[1]), fmax2(sc[2], sc[3]));
      float mx1 = fmax2(fmax2(sc[4], sc[5]), fmax2(sc[6], sc[7]));
      mx0 = fmax2(mx0, shfl_xor(mx0, 1));
      mx0 = fmax2(mx0, shfl_xor(mx0, 2));
      mx1 = fmax2(mx1, shfl_xor(mx1, 1));
      mx1 = fmax2(mx1, shfl_xor(mx1, 2));
      const float mn0 = fmax2(m0, mx0), mn1 = fmax2(m1, mx1);
      // a row with no visible key yet keeps m = -inf; subtract 0 instead so that exp2 gives 0
      const float mu0 = mn0 == neg_inf() ? 0.f : mn0, mu1 = mn1 == neg_inf() ? 0.f : mn1;
      const float al0 = exp2_approx(m0 - mu0), al1 = exp2_approx(m1 - mu1);
      m0 = mn0, m1 = mn1;
      float pr[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pr[e] = exp2_approx(sc[e] - mu0);
        pr[4 + e] = exp2_approx(sc[4 + e] - mu1);
      }
      l0 = l0 * al0 + ((pr[0] + pr[1]) + (pr[2] + pr[3]));
      l1 = l1 * al1 + ((pr[4] + pr[5]) + (pr[6] + pr[7]));
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        o[n][0] *= al0, o[n][1] *= al0, o[n][2] *= al1, o[n][3] *= al1;
      }
      // P ‖v‖ as the A operand (p = 0 for masked tokens; the select keeps a garbage norm out)
      const float vA = half_lo(cur.vn0), vB = half_hi(cur.vn0), vC = half_lo(cur.vn1), vD = half_hi(cur.vn1);
      const float vn[4] = {vA, vB, vC, vD};
      float pv[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pv[e] = pr[e] == 0.f ? 0.f : pr[e] * vn[e];
        pv[4 + e] = pr[4 + e] == 0.f ? 0.f : pr[4 + e] * vn[e];
      }
      const u32 pa_[4] = {pack2(F16{}, pv[0], pv[1]), pack2(F16{}, pv[4], pv[5]), pack2(F16{}, pv[2], pv[3]),
                          pack2(F16{}, pv[6], pv[7])};

      // ---- O_rot += P' · c[idx_v]: n-block ν = channels 8ν..8ν+7
#pragma unroll
      for (int w = 0; w < D / 32; ++w) {
        u32 a0, a1, a2, a3, b0, b1, b2, b3;
        lookup4<VWIDE>(cur.v0.w[w], vtab, a0, a1);        // ν = 4w, 4w + 1; tokens 2q, 2q + 1
        lookup4<VWIDE>(cur.v0.w[w] >> 16, vtab, a2, a3);  // ν = 4w + 2, 4w + 3
        lookup4<VWIDE>(cur.v1.w[w], vtab, b0, b1);        // tokens 2q + 8, 2q + 9
        lookup4<VWIDE>(cur.v1.w[w] >> 16, vtab, b2, b3);
        mma16816(F16{}, o[4 * w], pa_, a0, b0);
        mma16816(F16{}, o[4 * w + 1], pa_, a1, b1);
        mma16816(F16{}, o[4 * w + 2], pa_, a2, b2);
        mma16816(F16{}, o[4 * w + 3], pa_, a3, b3);
      }
      if (more) cur = nxt;
    }

    // ---- the segment's partial: (m, l) per row and the unnormalized O_rot
    l0 += shfl_xor(l0, 1);
    l0 += shfl_xor(l0, 2);
    l1 += shfl_xor(l1, 1);
    l1 += shfl_xor(l1, 2);
    float* po = p.part_o + (size_t)sgi * kRows * D;
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      *reinterpret_cast<float2*>(po + g * D + 8 * n + 2 * q) = make_float2(o[n][0], o[n][1]);
      if (R16) *reinterpret_cast<float2*>(po + (g + 8) * D + 8 * n + 2 * q) = make_float2(o[n][2], o[n][3]);
    }
    if (q == 0) {
      float* ml = p.part_ml + (size_t)sgi * kRows * 2;
      ml[2 * g] = m0, ml[2 * g + 1] = l0;
      if (R16) ml[2 * (g + 8)] = m1, ml[2 * (g + 8) + 1] = l1;
    }
  }
}

// Persistent: Πᵀ and Sᵀ are staged in shared memory once per CTA (128 KiB at D = 128), then the
// CTA walks output tiles; each thread owns one output coordinate of every valid row of a tile.
template <int D>
__device__ __forceinline__ void prepare_q(const PrepareParams& p) {
  extern __shared__ float4 smem4[];
  float* pit_s = reinterpret_cast<float*>(smem4);  // [D][D] Πᵀ
  float* st_s = pit_s + D * D;                      // [D][D] Sᵀ (QJL keys)
  float* q_s = st_s + (p.qjl ? D * D : 0);          // [16][D]
  const int o = threadIdx.x;
  for (int i = o; i < D * D; i += D) {
    pit_s[i] = p.pit[i];
    if (p.qjl) st_s[i] = p.st[i];
  }
  const int tiles = p.batch_tiles;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int qg = tile % p.qgroups, h = (tile / p.qgroups) % p.heads_kv, b = tile / (p.qgroups * p.heads_kv);
    const int sq = p.seqlens_q[b];
    u32 valid = 0;
    __syncthreads();  // staging done / the previous tile's rows consumed
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int R = qg * kRows + r, hl = R / p.max_sq, i = R % p.max_sq;
      const bool ok = hl < p.group && i < sq;
      valid |= (u32)ok << r;
      q_s[r * D + o] = ok ? F16::to_f32(p.q[(((size_t)b * p.max_sq + i) * p.heads_q + h * p.group + hl) * D + o]) : 0.f;
    }
    __syncthreads();
    float rot[kRows], proj[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) rot[r] = 0.f, proj[r] = 0.f;
    for (int k = 0; k < D; ++k) {
      const float a = pit_s[k * D + o];
      const float c = p.qjl ? st_s[k * D + o] : 0.f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (valid >> r & 1u) {
          const float x = q_s[r * D + k];
          rot[r] = fmaf(a, x, rot[r]);
          proj[r] = fmaf(c, x, proj[r]);
        }
      }
    }
    // A fragment position of (row r, column o) in mma.m16n8k16 (common.cuh)
    const int c = o / 16, cc = o % 16, eta = cc / 8, e = cc % 2, t = (cc % 8) / 2;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int lane = (r % 8) * 4 + t, reg = r / 8 + 2 * eta;
      const size_t at = ((((size_t)tile * 32 + lane) * (D / 16) + c) * 4 + reg) * 2 + e;
      const float x = rot[r] * p.qscale;
      const u16 hi = F16::from_f32(x);
      reinterpret_cast<u16*>(p.qf)[at] = hi;
      reinterpret_cast<u16*>(p.qf_lo)[at] = F16::from_f32(x - F16::to_f32(hi));
      if (p.qjl) reinterpret_cast<u16*>(p.pf)[at] = F16::from_f32(proj[r] * p.pscale);
    }
  }
}

// Persistent as prepare_q, with Π in shared memory: per output tile, each row's partials are
// merged in segment (= key) order, then O = Πᵀ O_rot for every row of the tile at once.
template <int D>
__device__ __forceinline__ void combine(const CombineParams& p) {
  extern __shared__ float4 smem4[];
  float* pi_s = reinterpret_cast<float*>(smem4);  // [D][D] Π
  float* orot = pi_s + D * D;                      // [16][D]
  __shared__ float ms[kRows], ls[kRows];
  const int o = threadIdx.x;
  for (int i = o; i < D * D; i += D) pi_s[i] = p.pi[i];
  for (int tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
    const int qg = tile % p.qgroups, h = (tile / p.qgroups) % p.heads_kv, b = tile / (p.qgroups * p.heads_kv);
    const int s0 = p.tile_segs[tile], s1 = p.tile_segs[tile + 1];
    const int sq = p.seqlens_q[b];
    __syncthreads();  // staging done / the previous tile's rows consumed
    for (int r = 0; r < kRows; ++r) {
      const int R = qg * kRows + r, hl = R / p.max_sq, i = R % p.max_sq;
      float m = neg_inf(), l = 0.f, acc = 0.f;
      if (hl < p.group && i < sq) {
        for (int s = s0; s < s1; ++s) m = fmax2(m, p.part_ml[((size_t)s * kRows + r) * 2]);
        if (m != neg_inf()) {
          for (int s = s0; s < s1; ++s) {
            const float f = exp2_approx(p.part_ml[((size_t)s * kRows + r) * 2] - m);
            l += p.part_ml[((size_t)s * kRows + r) * 2 + 1] * f;
            acc += p.part_o[((size_t)s * kRows + r) * D + o] * f;
          }
        }
      }
      orot[r * D + o] = l > 0.f ? acc / l * p.oscale : 0.f;
      if (o == 0) ms[r] = m, ls[r] = l;
    }
    __syncthreads();
    float y[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) y[r] = 0.f;
    for (int k = 0; k < D; ++k) {
      const float a = pi_s[k * D + o];
#pragma unroll
      for (int r = 0; r < kRows; ++r) y[r] = fmaf(a, orot[r * D + k], y[r]);  // (Πᵀ O_rot)_o
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int R = qg * kRows + r, hl = R / p.max_sq, i = R % p.max_sq;
      if (hl >= p.group) continue;  // padding rows of the last tile
      const int head = h * p.group + hl;
      // padded query rows and rows with no visible key: O = 0 and LSE = -inf, as the emulation
      const float l = ls[r];
      p.o[(((size_t)b * p.max_sq + i) * p.heads_q + head) * D + o] = F16::from_f32(i < sq && l > 0.f ? y[r] : 0.f);
      if (o == 0)
        p.lse[((size_t)b * p.heads_q + head) * p.max_sq + i] =
            i < sq && l > 0.f ? (ms[r] + log2_approx(l)) * 0.6931471805599453f : neg_inf();
    }
  }
}

}  // namespace tq
}  // namespace ferrattn

// Closed list (ferrattn_cuda::turboquant::kernel_names): D in {64, 128}; keys with QJL and a 1-3
// bit codebook (8-entry tables), or without QJL with 2-3 bits (n8) or 4 bits (n16); values with
// 2-3 bits (v8) or 4 bits (v16); 8 or 16 MMA rows in use.
#define FERRATTN_TQ_DECODE(D, KN, QJL, KW, VN, VW, RN, R16)                                     \
  extern "C" __global__ void __launch_bounds__(ferrattn::tq::kUnitWarps * 32)                  \
      turboquant_decode_d##D##_##KN##_##VN##_##RN(const ferrattn::tq::DecodeParams p) {          \
    ferrattn::tq::decode_unit<D, QJL, KW, VW, R16>(p);                                          \
  }
#define FERRATTN_TQ_DECODE_R(D, KN, QJL, KW, VN, VW)    \
  FERRATTN_TQ_DECODE(D, KN, QJL, KW, VN, VW, r8, false) \
  FERRATTN_TQ_DECODE(D, KN, QJL, KW, VN, VW, r16, true)
#define FERRATTN_TQ_DECODE_V(D, KN, QJL, KW)         \
  FERRATTN_TQ_DECODE_R(D, KN, QJL, KW, v8, false)    \
  FERRATTN_TQ_DECODE_R(D, KN, QJL, KW, v16, true)
#define FERRATTN_TQ_DIM(D)                                                                      \
  FERRATTN_TQ_DECODE_V(D, kqjl, true, false)                                                    \
  FERRATTN_TQ_DECODE_V(D, kn8, false, false)                                                    \
  FERRATTN_TQ_DECODE_V(D, kn16, false, true)                                                    \
  extern "C" __global__ void __launch_bounds__(D) turboquant_prepare_q_d##D(                    \
      const ferrattn::tq::PrepareParams p) {                                                    \
    ferrattn::tq::prepare_q<D>(p);                                                              \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(D) turboquant_combine_d##D(                      \
      const ferrattn::tq::CombineParams p) {                                                    \
    ferrattn::tq::combine<D>(p);                                                                \
  }

FERRATTN_TQ_DIM(64)
FERRATTN_TQ_DIM(128)
