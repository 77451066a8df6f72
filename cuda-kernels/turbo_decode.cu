// TurboAttention decode (Kang et al., MLSys 2025, Algorithm 2) over the compressed KV cache, split
// over the KV length as LeanAttention does, and the cache's append and flush (section 3.3).
//
// Work: one *output tile* is (sequence, KV head, group of up to 8 query heads); its iterations
// are the cache tiles of that (sequence, KV head) in token order: every compressed block of 64
// tokens, then the INT8 buffer when it holds tokens (Alg. 2 "for j in 1..N", the buffer last).
// The host lays the tiles' iterations end to end (ferrattn_core::lean::TileSpace with tile_k =
// 64) and cuts the space into the ranges of *units* (ferrattn_core::lean::Schedule: stream-K for
// balance, or one unit per output tile, which replays the emulation's order exactly). A unit is
// one warp (warp w of CTA c is unit 4 c + w): it walks its range alone, with its own staging
// area (a K half and a V half, each refilled by cp.async half a tile ahead), and no CTA barrier.
// It writes one partial (O, m, l) per output tile it touches to its own slot; turbo_combine_*
// merges a tile's slots in slot (= key) order with the same exponential (its rescale factors
// from a parallel max scan), finishes O / l and LSE.
// A tile computed by one unit therefore goes through exactly the emulation's steps: O is
// bit-identical to ferrattn_core::turbo (one unit per tile) or to decode_twin (stream-K).
//
// One iteration (one warp; the query heads of one KV head are rows 0-7 of mma.m16n8k32). A
// compressed tile whose blocks' clamp flags are clear (no code dequantizes past 127, the common
// case) takes the folded path instead of steps 1, 2 and 4 below: raw codes on the MMA, the
// channel scales folded into the query, V's scale and zero point applied per output element
// (see "Compressed tiles without clamping"); the integer sums, hence O, are the same. Otherwise:
//   1. dequantize in registers (Alg. 2 "K_j^q1 = K_j^q2 s^int + z"): four tokens' packed codes
//      are byte-transposed with prmt so that one register holds one channel of four tokens;
//      multiply-adds in 16-bit lanes with a min apply that channel's integer scale, zero point
//      and clamp (dq4<true>). K is transposed back to four channels per token (the
//      B fragment of q K^T), V stays four keys per channel (the B fragment of P V). The bytes
//      hold value + 128 (u8 operands); the dot products subtract 128 x the row sums exactly.
//   2. S = q^q1 K^q1 on mma.m16n8k32 s8 x u8 (the query row quantized once per segment, Alg. 2
//      "s_Q = max(abs(Q))/119");
//   3. per query head (4 lanes a row, 16 keys a lane): S x (s_q s_K softmax_scale), SAS online
//      softmax, s_P = max(P~)/119 of that head's row, P^q, l; branch-free, P^q through the
//      rounded reciprocal of s_P with an exact division where a rounding boundary is near;
//   4. O = O r + s_P s_V (P^q V^q1), P^q straight from the S accumulators (slot order).
// Why MMA at query length 1: the MMA rows hold the GQA group's query heads, so one m16n8k32
// does for every head of the group what would take 8 dp4a per head and key. The dot products
// are small next to unpacking 64 x D codes per tile, which bounds this kernel after memory
// (docs/TURBO_CUDA.md, "Decode: where the time goes").
#include "common.cuh"
#include "turbo_common.cuh"

namespace ferrattn {
namespace turbo {

// Mirrors ferrattn_cuda::turbo::DecodeParams (#[repr(C)]).
struct DecodeParams {
  const u16* q;           // [batch, max_sq, heads_q, D]
  u16* o;                 // [batch, max_sq, heads_q, D]
  float* lse;             // [batch, heads_q, max_sq]
  const int* lens;        // [batch] tokens the cache holds
  const int* q_tok;       // [batch] query token this launch decodes, -1: sequence left alone
  const u32* seq_start;   // [batch + 1] first flat iteration of each sequence's tiles
  const u32* cta_bounds;  // [num_ctas + 1]
  const u32* cta_slot;    // [num_ctas] slot of each CTA's first segment
  const u32* tile_slot;   // [num_tiles + 1] first slot of each output tile's segments
  float* part_o;          // [slots, 16, D] unnormalized O of each segment
  float* part_ml;         // [slots, 16, 2] (m, l) of each segment
  CacheParams cache;
  int batch, max_sq, heads_q, heads_kv, group, qgroups, num_ctas, num_tiles;
  int sas, sas_nr;
  float softmax_scale;
};

// Mirrors ferrattn_cuda::turbo::AppendParams (#[repr(C)]).
struct AppendParams {
  const u16* k;          // [batch, src_len, heads_kv, D]
  const u16* v;          // [batch, src_len, heads_kv, D]
  const int* src_tok;    // [batch] token of k/v to append, -1: nothing for this sequence
  const int* lens;       // [batch] tokens held before the append
  CacheParams cache;
  int batch, src_len, heads_kv;
};

// Mirrors ferrattn_cuda::turbo::FlushParams (#[repr(C)]).
struct FlushParams {
  const int* seqs;    // [count] sequences whose buffer is full
  const int* blocks;  // [count] block index the buffer becomes
  CacheParams cache;
  int count, heads_kv;
};

__device__ __forceinline__ u64 block_bytes(int d, int bits) { return (u64)kBlock * d * bits / 8; }

// ---- Decode units -------------------------------------------------------------------------------
// A *unit* of the schedule is one warp: warp w of CTA c is unit 4 c + w. Each unit walks its range
// of the iteration space alone (no CTA barrier after the SAS LUT is filled), with its own shared
// staging area: K of the next tile loads during this tile's softmax and P V, V of the next tile
// during its q K^T (UnitStage).
constexpr int kCombineThreads = 32;  // turbo_combine_*: one warp a CTA (ferrattn_cuda::turbo::TURBO_COMBINE_THREADS)
constexpr int kUnitRows = 8;   // query heads per output tile (MMA rows 0-7; rows 8-15 stay zero)
constexpr int kUnitsPerCta = kThreads / 32;

// Programmatic dependent launch of the combine (sm_90; the host sets the launch attribute only
// there, per decode launch by ferrattn_cuda::turbo::combine_pdl_policy or as
// FERRATTN_TURBO_COMBINE_PDL=1 / 0 forces; without it both instructions are no-ops).
// Every decode instance lets the combine be scheduled first thing, so that its launch, its CTAs'
// distribution and its SAS table overlap the decode's tail; a combine CTA takes an SM slot only
// once every decode CTA has started (and, at 168 registers a thread, only where a decode CTA has
// left). The combine reads nothing from memory before `pdl_wait`, which returns once the decode
// has completed and its writes (the partials) are visible: the rule the TurboQuant decode
// (turboquant_decode.cu, pdl_wait) arrived at, where L1-cached reads before the wait failed.
// (pdl_wait and pdl_launch_dependents: common.cuh.)

// A unit's staging area: one tile's K half (packed codes, room for 4 bits; K's channel
// parameters, D scales then D zero points; the two f32 block scales and the two blocks' clamp
// flags, CacheView::clamp) and one tile's V half (codes and channel parameters). The halves are
// filled apart (K and V staged apart): K of tile i + 1 loads while tile i's softmax and P V run,
// V of tile i + 1 while tile i + 1's q K^T runs. Against staging both tensors of the next tile
// in a second buffer this halves the shared memory of a unit (8.7 KB at d 128, 35 KB per CTA
// instead of 70 KB), so occupancy is set by registers alone. Rows of codes are stored at
// row_slot(token) so that the lanes of one load hit different banks.
// ferrattn_cuda::turbo::decode_smem_bytes mirrors these sizes.
template <int D>
struct UnitStage {
  static constexpr int kCodes = kBlock * D / 2;
  static constexpr int kK = 0;
  static constexpr int kParK = kCodes;
  static constexpr int kScales = kCodes + 2 * D;
  static constexpr int kV = kScales + 16;
  static constexpr int kParV = kV + kCodes;
  static constexpr int kBytes = kParV + 2 * D;
};
__device__ __forceinline__ int row_slot(int r) { return r ^ ((r >> 1) & 3); }
// row_slot(8 a + b) = 8 a + row_slot(b) for 0 <= b < 8 (the permutation stays inside aligned
// groups of 8): a lane's rows are one lane-dependent base plus compile-time offsets, so the
// loads take immediate offsets instead of a row_slot per row (about 4 instructions a row).

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
// Byte transpose of a 4x4 byte matrix: c[j].byte[i] = r[i].byte[j].
__device__ __forceinline__ void transpose4(u32 r0, u32 r1, u32 r2, u32 r3, u32 (&c)[4]) {
  const u32 t0 = prmt(r0, r1, 0x5140), t1 = prmt(r0, r1, 0x7362);
  const u32 t2 = prmt(r2, r3, 0x5140), t3 = prmt(r2, r3, 0x7362);
  c[0] = prmt(t0, t2, 0x5410);
  c[1] = prmt(t0, t2, 0x7632);
  c[2] = prmt(t1, t3, 0x5410);
  c[3] = prmt(t1, t3, 0x7632);
}
__device__ __forceinline__ u32 vmin_u16x2(u32 a, u32 b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  u32 r;
  asm("min.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  const u32 lo = min(a & 0xffffu, b & 0xffffu), hi = min(a >> 16, b >> 16);
  return lo | (hi << 16);
#endif
}
__device__ __forceinline__ void syncwarp() { asm volatile("bar.warp.sync 0xffffffff;" ::: "memory"); }
__device__ __forceinline__ bool warp_any(bool p) {
  u32 r;
  asm volatile(
      "{\n .reg .pred q, a;\n setp.ne.u32 q, %1, 0;\n vote.sync.any.pred a, q, 0xffffffff;\n selp.u32 %0, 1, 0, a;\n}"
      : "=r"(r)
      : "r"((u32)p));
  return r != 0;
}
__device__ __forceinline__ void cp_async4(void* dst_smem, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst_smem)), "l"(src) : "memory");
}
__device__ __forceinline__ u32 lds32(const u8* p) { return *reinterpret_cast<const u32*>(p); }
__device__ __forceinline__ void cp_async4_s(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
// 16-byte cp.async to a shared-window address (no generic-to-shared conversion per chunk).
__device__ __forceinline__ void cp_async16_s(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
// The same copies predicated in PTX (the BRANCHES instance): a lane-dependent condition as
// `if (on) cp_async...` makes a divergent branch, a convergence point and a fresh block for the
// copy (ptxas then pads it); predicated, the copy is one instruction in the straight-line issue.
__device__ __forceinline__ void cp_async4_s_if(bool on, u32 dst, const void* src) {
  asm volatile("{\n .reg .pred p;\n setp.ne.u32 p, %2, 0;\n @p cp.async.ca.shared.global [%0], [%1], 4;\n}" ::"r"(dst),
               "l"(src), "r"((u32)on)
               : "memory");
}
__device__ __forceinline__ void cp_async16_s_if(bool on, u32 dst, const void* src) {
  asm volatile("{\n .reg .pred p;\n setp.ne.u32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16;\n}" ::"r"(dst),
               "l"(src), "r"((u32)on)
               : "memory");
}

// Four dequantized codes of one channel (ChannelParams::decode, plus 128 so that the byte is the
// u8 operand of the MMA): clamp(code x scale + zero, -127, 127) + 128 per byte, `x` the four codes
// one per byte, `s` the channel scale, `zb4` (zero + 128) in every byte. Without CLAMP the caller
// has checked scale x (2^bits - 1) + zero <= 127 for every channel of the tile: no byte can
// carry, one multiply-add does all four. With CLAMP, two bytes at a time in 16-bit lanes.
template <bool CLAMP>
__device__ __forceinline__ u32 dq4(u32 x, u32 s, u32 zb4) {
  if (!CLAMP) return x * s + zb4;
  const u32 zb2 = zb4 & 0x00ff00ffu;
  u32 e = (x & 0x00ff00ffu) * s + zb2;
  u32 o = ((x >> 8) & 0x00ff00ffu) * s + zb2;
  e = vmin_u16x2(e, 0x00ff00ffu);
  o = vmin_u16x2(o, 0x00ff00ffu);
  return prmt(e, o, 0x6240);
}

// mma.m16n8k32 with rows 8-15 of A zero (the unit's query heads are rows 0-7): C rows 8-15 are
// dropped, d0 d1 are (row g, columns 2t, 2t+1). q K: s8 x u8 (K + 128); P V: u8 x u8 (V + 128).
__device__ __forceinline__ void mma_qk(int& d0, int& d1, u32 a0, u32 a2, u32 b0, u32 b1) {
  int x2, x3;
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%10,%11};"
      : "+r"(d0), "+r"(d1), "=&r"(x2), "=&r"(x3)
      : "r"(a0), "r"(0), "r"(a2), "r"(0), "r"(b0), "r"(b1), "r"(0), "r"(0));
  (void)x2, (void)x3;
}
__device__ __forceinline__ void mma_pv(int& d0, int& d1, u32 a0, u32 a2, u32 b0, u32 b1) {
  int x2, x3;
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%10,%11};"
      : "+r"(d0), "+r"(d1), "=&r"(x2), "=&r"(x3)
      : "r"(a0), "r"(0), "r"(a2), "r"(0), "r"(b0), "r"(b1), "r"(0), "r"(0));
  (void)x2, (void)x3;
}

// Lane (g, t) of a unit (g = lane / 4, t = lane % 4):
// - q K^T: query row g; k-slice ks of the MMA holds channels KCH t + 8 ks + {0, 2, 4, 6} (b0 / a0)
//   and + {1, 3, 5, 7} (b1 / a2), KCH = D / 4 (any channel order works when q and K agree);
//   n-tile j holds tokens 8 j .. 8 j + 7, lane g token 8 j + g.
// - P V: P from the S accumulators in slot order (slot_key); n-tile nt, column g is channel
//   VCH g + nt (VCH = D / 8); b0 / b1 of k-slice kk hold the keys 32 kk + 16 h + 2 t + {0, 1, 8, 9}
//   (h = 0 / 1) of that channel; O of row g, n-tile nt sits at channels VCH 2t + nt (c0) and
//   VCH (2t + 1) + nt (c1).
template <int D>
struct UnitState {
  static constexpr int KS = D / 32;  // k-slices of q K^T
  static constexpr int NT = D / 8;   // n-tiles of P V
  float o[NT][2];                    // unnormalized O of row g (c0, c1 of each n-tile)
  float m, l;                        // running maximum and sum of row g
  u32 qa0[KS], qa2[KS];              // INT8 query row g (A fragments)
  u32 qn[D / 16];                    // INT8 query row g, channels KCH t .. KCH t + KCH - 1 in order
  int qsum;                          // sum of the INT8 query row g (removes K's +128)
  float qs;                          // INT8 scale of query row g
};

// Maximum of a lane's scores as a tree (the order of an exact max does not matter; no NaN
// reaches here).
template <int J>
__device__ __forceinline__ float max_tree(const float (&x)[J][2]) {
  float m[J];
#pragma unroll
  for (int j = 0; j < J; ++j) m[j] = fmaxf(x[j][0], x[j][1]);
#pragma unroll
  for (int w = J / 2; w > 0; w >>= 1)
#pragma unroll
    for (int j = 0; j < w; ++j) m[j] = fmaxf(m[j], m[j + w]);
  return m[0];
}

// rne(x / s) of the division the emulation performs (div.rn, then round half to even) for
// |x / s| < 128, through the correctly rounded reciprocal `rinv` = 1 / s: x * rinv is within
// 2.3e-5 of the rounded quotient, so both round to the same integer unless a half-integer lies
// within 4e-5 of it; `near` is set then, and the caller divides.
__device__ __forceinline__ int rne_quotient(float x, float rinv, bool& near) {
  const float q = mul_rn(x, rinv);
  near |= fabsf(sub_rn(q, floor_f(q)) - 0.5f) < 4.0e-5f;
  return rne_int(q);
}
// The same test on the P codes (0 <= x / s < 128) in one instruction fewer: q - rint(q) is exact
// (q < 128, so the difference is a multiple of q's ulp below 1), and a half-integer within 4e-5
// of q means |q - rint(q)| > 0.5 - 4e-5; the threshold is taken a little lower (0.4999), so that
// `near` is set on a superset of the quotients rne_quotient flags (one more exact division now
// and then, never a missed one).
__device__ __forceinline__ int rne_quotient_p(float x, float rinv, bool& near) {
  const float q = mul_rn(x, rinv);
  float r;
  asm("cvt.rni.f32.f32 %0, %1;" : "=f"(r) : "f"(q));
  near |= fabsf(sub_rn(q, r)) > 0.4999f;
  return rne_int(r);
}
__device__ __forceinline__ int dp4a_u8(u32 a, u32 b, int c) {
  int r;
  asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// The row sum of a tile's P codes: the lane's packed code words (two dp4a a word pair), then the
// lanes that share the row (the quad, and for J = 4 the half-rows lane ^ 16 holds).
template <int J>
__device__ __forceinline__ int row_code_sum(const u32 (&pa0)[2], const u32 (&pa2)[2]) {
  int sum = 0;
#pragma unroll
  for (int kk = 0; kk < J / 4; ++kk) sum = dp4a_u8(pa0[kk], 0x01010101u, dp4a_u8(pa2[kk], 0x01010101u, sum));
  sum += shfl_xor_i(sum, 1);
  sum += shfl_xor_i(sum, 2);
  if (J == 4) sum += shfl_xor_i(sum, 16);
  return sum;
}

// SAS online softmax of one 64-key tile for row g (the emulation's attend_tile, op for op):
// returns P's A fragments, the row sum of P codes, the rescale r and s_P s_V. `s` is the exact
// integer dot product of key 8 j + 2 t + e (every q K^T variant removes its own offsets).
//
// J = 8: each lane scores its row's 16 keys. J = 4, for groups of at most 4 query heads: the
// lanes of rows 4-7 (no query head there) take keys 32..63 of row g - 4 (they hold its query), so that
// the exponentials, the only per-key work with long dependent chains, run on every lane once
// instead of on half of them twice; row maxima and sums reduce over lane ^ 16 too (exact), and
// P's fragments of keys 32..63 come back with one shuffle each. Both halves keep the same (m,
// l) state.
//
// Instruction economy of the per-key work (it is most of the tile's floating-point work): keys
// past `ntok` (only the INT8 buffer tile has any) are masked in a uniform branch, so a full tile
// pays nothing for the mask; the SAS exponential takes its argument as <= 0 (sas_exp_nonpos);
// the P code is rint(x / s_P) without a clamp (the quotient is at most 119 (1 + 2^-22) when s_P
// >= 1e-30: P~ <= max P~ = 119 s_P up to one rounding), the row sum of codes is two dp4a on the
// packed fragments.
template <int D, int J>
__device__ __forceinline__ void unit_softmax(UnitState<D>& st, const int (&s)[8][2], int ntok, float s_k, float s_v,
                                             float scale, const Exp& ex, int lane, u32 (&pa0)[2], u32 (&pa2)[2], int& rs,
                                             float& r, float& c) {
  static_assert(J == 8 || J == 4, "16 or 8 keys per lane");
  const int t = lane & 3;
  const bool upper = J == 4 && lane >= 16;
  // J = 4: the lanes of rows 4-7 hold row g - 4's query (decode_body), hence its scale and its
  // scores of keys 32..63 in their own s[4..7]
  const float alpha = mul_rn(mul_rn(st.qs, s_k), scale);
  int sv[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) sv[j][e] = upper ? s[4 + j][e] : s[j][e];
  const int j0 = upper ? 4 : 0;
  float x[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) x[j][e] = mul_rn(i2f(sv[j][e]), alpha);
  if (ntok < kBlock) {  // uniform: the INT8 buffer tile only
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (8 * (j0 + j) + 2 * t + e >= ntok) x[j][e] = neg_inf();
  }
  float tmax = max_tree<J>(x);
  tmax = fmax2(tmax, shfl_xor(tmax, 1));
  tmax = fmax2(tmax, shfl_xor(tmax, 2));
  if (J == 4) tmax = fmax2(tmax, shfl_xor(tmax, 16));
  const float mn = fmax2(st.m, tmax);  // finite: key 0 is valid
  r = ex.rescale(st.m, mn);
  if (ex.sas) {
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) x[j][e] = ex.sas_exp_nonpos(sub_rn(x[j][e], mn));  // -inf (masked key) gives 0
  } else {
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) x[j][e] = x[j][e] == neg_inf() ? 0.0f : expf(sub_rn(x[j][e], mn));
  }
  float pm = fmaxf(max_tree<J>(x), 0.0f);
  pm = fmax2(pm, shfl_xor(pm, 1));
  pm = fmax2(pm, shfl_xor(pm, 2));
  if (J == 4) pm = fmax2(pm, shfl_xor(pm, 16));
  const float s_p = int8_scale(pm);
  // P codes rne(P~ / s_P) (quotients <= 119) as the emulation rounds them; the rare tiles with
  // a quotient near a rounding boundary, or a tiny s_P, divide every element
  int code[J][2];
  bool exact = false;
  if (s_p != 0.0f) {
    const float rinv = div_rn(1.0f, s_p);
    exact = !(s_p >= 1.0e-30f);
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) code[j][e] = rne_quotient_p(x[j][e], rinv, exact);
  } else {
#pragma unroll
    for (int j = 0; j < J; ++j) code[j][0] = code[j][1] = 0;
  }
  if (warp_any(exact)) {
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) code[j][e] = s_p == 0.0f ? 0 : clampi(rne_int(div_rn(x[j][e], s_p)), 0, 127);
  }
#pragma unroll
  for (int kk = 0; kk < J / 4; ++kk) {
    pa0[kk] = pack4_u8(code[4 * kk][0], code[4 * kk][1], code[4 * kk + 1][0], code[4 * kk + 1][1]);
    pa2[kk] = pack4_u8(code[4 * kk + 2][0], code[4 * kk + 2][1], code[4 * kk + 3][0], code[4 * kk + 3][1]);
  }
  const int sum = row_code_sum<J>(pa0, pa2);
  rs = sum;
  st.l = fma_rn(i2f(sum), s_p, mul_rn(st.l, r));
  st.m = mn;
  c = mul_rn(s_p, s_v);
  if (J == 4) {  // keys 32..63 of row g from lane ^ 16 (rows 4-7 of P are never read back)
    pa0[1] = (u32)shfl_xor_i((int)pa0[0], 16);
    pa2[1] = (u32)shfl_xor_i((int)pa2[0], 16);
  }
}

// ---- The fast numerical contract (turbo_decode_fast_* / turbo_decode_g4_fast_*) ------------------
// Options::fast_turbo_decode. The softmax of a tile in about a third of the instructions of
// unit_softmax, by two departures from the emulation (every integer step, the query's
// quantization, the O and l updates and the combine stay as they are):
// - e^x on the MUFU (ex2.approx.ftz of x log2 e, relative error about 2^-22) instead of SAS's
//   LUT x POLY (which is itself within [-1.03e-3, +2.3e-4] of e^x); SAS's threshold stays:
//   e^x is 0 for x < n_r, for the keys and the rescale, as in the emulation (none with SAS off);
// - P quantized against the tile's largest logit, known before any exponential: with tmax the
//   tile's largest x and m the new running maximum, max P~ = e^(tmax - m), so s_P =
//   e^(tmax - m) / 119 and the codes are rne(119 e^(x - tmax)) = rne(2^(x log2 e + log2 119 -
//   tmax log2 e)): one FFMA, one MUFU and one FADD (rounding by the 1.5 x 2^23 bias) a key,
//   no second maximum, no division by s_P, no boundary test. The code of the largest key is 119
//   up to the rounding of the FFMA's constant (a few ulp of 119, so never 120).
// The largest logit is an integer maximum: x = S alpha with alpha = s_q s_K scale >= 0 is monotone
// in the integer score S, and tmax = float(max S) alpha rounds as the emulation rounds that key's x.
// The bound this contract is held to (tests/gpu_turbo.rs FAST_O_REL / FAST_LSE_ABS,
// docs/TURBO_CUDA.md): O within 2e-2 relative (Frobenius) and LSE within 1e-2 of the emulation
// (or of the CPU twin of a split), O's error against the f64 golden no more than the bit-exact
// kernel's + 10%. The combine is unchanged (its rescale factors stay the configuration's
// exponential).
__device__ __forceinline__ float ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
template <int D, int J>
__device__ __forceinline__ void unit_softmax_fast(UnitState<D>& st, const int (&s)[8][2], int ntok, float s_k,
                                                  float s_v, float scale, const Exp& ex, int lane, u32 (&pa0)[2],
                                                  u32 (&pa2)[2], int& rs, float& r, float& c) {
  static_assert(J == 8 || J == 4, "16 or 8 keys per lane");
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLog2Codes = 6.89481776330794300f;  // log2(119)
  constexpr float kInvCodes = 1.0f / 119.0f;
  const int t = lane & 3;
  const bool upper = J == 4 && lane >= 16;  // as in unit_softmax
  const float alpha = mul_rn(mul_rn(st.qs, s_k), scale);
  int sv[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) sv[j][e] = upper ? s[4 + j][e] : s[j][e];
  const int j0 = upper ? 4 : 0;
  const bool partial = ntok < kBlock;  // uniform: the INT8 buffer tile only
  if (partial) {
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (8 * (j0 + j) + 2 * t + e >= ntok) sv[j][e] = -2147483647 - 1;  // below every score
  }
  int im[J];
#pragma unroll
  for (int j = 0; j < J; ++j) im[j] = max(sv[j][0], sv[j][1]);
#pragma unroll
  for (int w = J / 2; w > 0; w >>= 1)
#pragma unroll
    for (int j = 0; j < w; ++j) im[j] = max(im[j], im[j + w]);
  int imax = im[0];
  imax = max(imax, shfl_xor_i(imax, 1));
  imax = max(imax, shfl_xor_i(imax, 2));
  if (J == 4) imax = max(imax, shfl_xor_i(imax, 16));
  const float fmax_s = i2f(imax);
  const float tmax = mul_rn(fmax_s, alpha);  // finite: key 0 is valid
  const float mn = fmax2(st.m, tmax);
  const float nr = ex.sas ? ex.n_r : neg_inf();
  const float dm = sub_rn(st.m, mn);  // -inf on the first tile: r = 0
  r = dm >= nr ? ex2_approx(dm * kLog2e) : 0.0f;
  const float A = alpha * kLog2e;
  const float B = fmaf(-fmax_s, A, kLog2Codes);
  const float thr = fmaf(sub_rn(mn, tmax) + nr, kLog2e, kLog2Codes);  // x - m >= n_r in the argument's units
  u32 y[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float a = fmaf(i2f(sv[j][e]), A, B);
      a = a >= thr ? a : neg_inf();
      y[j][e] = __float_as_uint(add_rn(ex2_approx(a), kBias));
    }
  if (partial) {  // masked keys give 0 also where alpha = 0
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (8 * (j0 + j) + 2 * t + e >= ntok) y[j][e] = 0u;
  }
#pragma unroll
  for (int kk = 0; kk < J / 4; ++kk) {
    pa0[kk] = pack_low_bytes(y[4 * kk][0], y[4 * kk][1], y[4 * kk + 1][0], y[4 * kk + 1][1]);
    pa2[kk] = pack_low_bytes(y[4 * kk + 2][0], y[4 * kk + 2][1], y[4 * kk + 3][0], y[4 * kk + 3][1]);
  }
  const int sum = row_code_sum<J>(pa0, pa2);
  rs = sum;
  const float s_p = ex2_approx(sub_rn(tmax, mn) * kLog2e) * kInvCodes;
  st.l = fma_rn(i2f(sum), s_p, mul_rn(st.l, r));
  st.m = mn;
  c = mul_rn(s_p, s_v);
  if (J == 4) {
    pa0[1] = (u32)shfl_xor_i((int)pa0[0], 16);
    pa2[1] = (u32)shfl_xor_i((int)pa2[0], 16);
  }
}

// Which O elements a lane keeps in the full-row instance (groups of more than 4 query heads):
// lane (g, t) keeps row g, n-tiles 0 .. D/8 - 1 (o[nt][e]). The half-row instance (groups of at
// most 4) has its own layout, see unit_pv_half.
//
// O = O r + s_P s_V dot, dot = fix(acc, nt, e) the exact integer P V of the element.
template <int D, class Fix>
__device__ __forceinline__ void unit_o_update(UnitState<D>& st, const int (&acc)[D / 8][2], float r, float c,
                                              const Fix& fix) {
  constexpr int NT = D / 8;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) st.o[nt][e] = fma_rn(i2f(fix(acc[nt][e], nt, e)), c, mul_rn(st.o[nt][e], r));
}
// The P V of the dequantizing paths carries V's + 128: dot = acc - 128 rs.
struct PlusOffsetFix {
  int rs;
  __device__ __forceinline__ int operator()(int v, int, int) const { return v - 128 * rs; }
};

// Channel constants of 8 channels: scale as an integer and (zero + 128) in every byte.
__device__ __forceinline__ void channel_consts(const u8* par, int D, int c0, u32 (&s)[8], u32 (&zb)[8]) {
  const uint2 sv = *reinterpret_cast<const uint2*>(par + c0);
  uint2 zv = *reinterpret_cast<const uint2*>(par + D + c0);
  zv.x ^= 0x80808080u;
  zv.y ^= 0x80808080u;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const u32 sw = i < 4 ? sv.x : sv.y, zw = i < 4 ? zv.x : zv.y;
    s[i] = prmt(sw, 0, 0x4440 | (i & 3));
    zb[i] = prmt(zw, 0, (i & 3) * 0x1111);
  }
}

// The 8 channels of one byte-transposed group: ch[c] = the four tokens' codes of channel c.
template <int BITS>
__device__ __forceinline__ void split_codes(const u32 (&x)[4], u32 (&ch)[8]) {
  if (BITS == 4) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      ch[2 * j] = x[j] & 0x0f0f0f0fu;
      ch[2 * j + 1] = (x[j] >> 4) & 0x0f0f0f0fu;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) ch[4 * j + k] = (x[j] >> (2 * k)) & 0x03030303u;
  }
}

// The codes of slice `off` (8 channels) of a lane's part of a staged row: a word (4 bits) or a
// half word (2 bits).
template <int BITS>
__device__ __forceinline__ u32 lds_codes8(const u8* p) {
  return BITS == 4 ? lds32(p) : (u32) * reinterpret_cast<const unsigned short*>(p);
}

// q K^T of a compressed tile staged at `stg` (Alg. 2: dequantize K, S = q^q1 K^q1). The k-slice
// loop is kept rolled (the query fragments rotate through slot 0) to keep the hot loop of the
// kernel small: with every slice unrolled it no longer fits the instruction cache.
template <int D, int BITS, bool CLAMP>
__device__ __forceinline__ void unit_qk_compressed(const UnitState<D>& st, const u8* stg, int g, int t,
                                                   int (&s)[8][2]) {
  using S = UnitStage<D>;
  constexpr int KS = D / 32, KCH = D / 4;
  constexpr int RB = D * BITS / 8;     // bytes of one token row of codes
  constexpr int KLB = KCH * BITS / 8;  // bytes of the lane's K channels in a row
  const u8* rows[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) rows[j] = stg + S::kK + (8 * j + row_slot(g)) * RB + KLB * t;
  u32 qa0[KS], qa2[KS];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) qa0[ks] = st.qa0[ks], qa2[ks] = st.qa2[ks];
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = 0;
#pragma unroll 1
  for (int ks = 0; ks < KS; ++ks) {
    u32 sc[8], zb[8];
    channel_consts(stg + S::kParK, D, KCH * t + 8 * ks, sc, zb);
#pragma unroll
    for (int G = 0; G < 2; ++G) {
      u32 w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = lds_codes8<BITS>(rows[4 * G + k] + BITS * ks);
      u32 x[4], ch[8];
      transpose4(w[0], w[1], w[2], w[3], x);
      split_codes<BITS>(x, ch);
#pragma unroll
      for (int c = 0; c < 8; ++c) ch[c] = dq4<CLAMP>(ch[c], sc[c], zb[c]);
      u32 b0[4], b1[4];
      transpose4(ch[0], ch[2], ch[4], ch[6], b0);
      transpose4(ch[1], ch[3], ch[5], ch[7], b1);
#pragma unroll
      for (int k = 0; k < 4; ++k) mma_qk(s[4 * G + k][0], s[4 * G + k][1], qa0[0], qa2[0], b0[k], b1[k]);
    }
    // the next slice's query fragments to slot 0
#pragma unroll
    for (int i = 0; i + 1 < KS; ++i) {
      const u32 a = qa0[i], b = qa2[i];
      qa0[i] = qa0[i + 1], qa2[i] = qa2[i + 1];
      qa0[i + 1] = a, qa2[i + 1] = b;
    }
  }
  // K's + 128 out of the dot products
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] -= 128 * st.qsum, s[j][1] -= 128 * st.qsum;
}

// P V of a compressed tile and the O update (dequantize V, O = O r + s_P s_V P^q V^q1); the
// k-slice loop rolled as in unit_qk_compressed.
template <int D, int BITS, bool CLAMP>
__device__ __forceinline__ void unit_pv_compressed(UnitState<D>& st, const u8* stg, int g, int t, const u32 (&pa0)[2],
                                                   const u32 (&pa2)[2], int rs, float r, float c) {
  using S = UnitStage<D>;
  constexpr int VCH = D / 8;
  constexpr int RB = D * BITS / 8;
  int acc[D / 8][2];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) acc[nt][0] = acc[nt][1] = 0;
  const u8* vrow = stg + S::kV + (VCH * BITS / 8) * g;
#pragma unroll 1
  for (int kk = 0; kk < 2; ++kk) {
    const u32 a0 = kk ? pa0[1] : pa0[0], a2 = kk ? pa2[1] : pa2[0];
#pragma unroll
    for (int c8 = 0; c8 < VCH / 8; ++c8) {
      u32 sc[8], zb[8];
      channel_consts(stg + S::kParV, D, VCH * g + 8 * c8, sc, zb);
      u32 vb[8][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key0 = 32 * kk + 16 * h + 2 * t;
        u32 w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
          w[k] = lds_codes8<BITS>(vrow + (key0 - 2 * t + 8 * (k >> 1) + row_slot(2 * t + (k & 1))) * RB + c8 * BITS);
        u32 x[4], ch[8];
        transpose4(w[0], w[1], w[2], w[3], x);
        split_codes<BITS>(x, ch);
#pragma unroll
        for (int i = 0; i < 8; ++i) vb[i][h] = dq4<CLAMP>(ch[i], sc[i], zb[i]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) mma_pv(acc[8 * c8 + i][0], acc[8 * c8 + i][1], a0, a2, vb[i][0], vb[i][1]);
    }
  }
  unit_o_update<D>(st, acc, r, c, PlusOffsetFix{rs});
}

// ---- Compressed tiles without clamping: scales and zero points folded, raw codes on the MMA ------
// When no dequantized code can clamp (scale (2^bits - 1) + zero <= 127 for every channel of the
// tile, checked per tile), Alg. 2's dequantization is affine per channel and folds out of the
// element loop exactly, in integers:
//   q . K_t = sum_c q_c (code_tc s_c + z_c) = sum_c (q_c s_c) code_tc + sum_c q_c z_c
//   sum_t P_t V_tc = s_c sum_t P_t code_tc + z_c sum_t P_t
// so the tensor cores read the raw 4-/2-bit codes (a mask and a shift per register, no
// transposes for K, no multiply-add per element), the query carries the channel scales (once per
// tile and lane: 32 products at d 128), and V's scales and zero points apply once per output
// element with P's row sum. Every sum is the emulation's integer dot product exactly, so O stays
// bit-identical to ferrattn_core::turbo.
//
// q_c s_c (|.| <= 127 x 255) does not fit one INT8 operand: it is split as 256 h + l with l, h in
// -128..127 and the two planes ride on the MMA's rows: row g (lanes' a0 / a2) holds l of query
// head g, row g + 8 (a1 / a3) holds h, so c0 + 256 c2 is the head's score in the lane that holds
// both (mma.m16n8k32 C layout). Up to 8 query heads per output tile.
//
// Channel of byte b of B register half (0: b0, 1: b1) of k-slice ks, relative to the lane's first
// channel KCH t (K rows are read as the lane's KCH contiguous channels, KCH BITS / 8 bytes):
//   4 bits: word ks, nibble 2b + half  -> channel 8 ks + 2 b + half
//   2 bits: word ks / 2, crumb 4b + 2 (ks % 2) + half -> channel 16 (ks / 2) + 4 b + 2 (ks % 2) + half
template <int BITS>
__device__ __forceinline__ constexpr int fold_channel(int ks, int half, int b) {
  return BITS == 4 ? 8 * ks + 2 * b + half : 16 * (ks >> 1) + 4 * b + 2 * (ks & 1) + half;
}
// c + the dot product of the four s8 bytes of a and b.
__device__ __forceinline__ int dp4a_s8(u32 a, u32 b, int c) {
  int r;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
// c + the dot product of the four s8 bytes of a and the four u8 bytes of b.
__device__ __forceinline__ int dp4a_s8u8(u32 a, u32 b, int c) {
  int r;
  asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
// Byte `i` of `w` zero- (u8) or sign-extended (s8) to 32 bits (one prmt).
__device__ __forceinline__ int byte_u(u32 w, int i) { return (int)prmt(w, 0, 0x4440 | i); }
__device__ __forceinline__ int byte_s(u32 w, int i) { return (int)prmt(w, 0, 0x8880 | i | (i << 4) | (i << 8) | (i << 12)); }

// The B registers of k-slice ks from the lane's words of one K row: raw codes, one per byte.
template <int BITS>
__device__ __forceinline__ void raw_k_codes(const u32* w, int ks, u32& b0, u32& b1) {
  if (BITS == 4) {
    b0 = w[ks] & 0x0f0f0f0fu;
    b1 = (w[ks] >> 4) & 0x0f0f0f0fu;
  } else {
    const u32 x = w[ks >> 1] >> (4 * (ks & 1));
    b0 = x & 0x03030303u;
    b1 = (x >> 2) & 0x03030303u;
  }
}

// mma.m16n8k32 s8 x u8 with all 16 rows live (rows 8-15: the high planes of rows 0-7).
__device__ __forceinline__ void mma_qk2(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Lane words of KCH channel bytes at `p` (16-byte aligned).
template <int KCH>
__device__ __forceinline__ void lds_lane_bytes(const u8* p, u32 (&w)[KCH / 4]) {
#pragma unroll
  for (int i = 0; i < KCH / 16; ++i) {
    const Vec16 v = ld_shared16(p + 16 * i);
    w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
  }
}

// q K^T of a compressed tile that cannot clamp, scales folded into the query (see above). `s`
// receives the exact integer dot products (no offset to remove).
template <int D, int BITS>
__device__ __forceinline__ void unit_qk_folded(const UnitState<D>& st, const u8* stg, int g, int t, int (&s)[8][2]) {
  using S = UnitStage<D>;
  constexpr int KS = D / 32, KCH = D / 4;
  constexpr int RB = D * BITS / 8;     // bytes of one token row of codes
  constexpr int KLB = KCH * BITS / 8;  // bytes of the lane's channels in a row: 16, 8 or 4
  u32 sw[KCH / 4], zw[KCH / 4];
  lds_lane_bytes<KCH>(stg + S::kParK + KCH * t, sw);
  lds_lane_bytes<KCH>(stg + S::kParK + D + KCH * t, zw);
  // sum_c q_c z_c of query row g, over the four lanes of the row
  int zq = 0;
#pragma unroll
  for (int i = 0; i < KCH / 4; ++i) zq = dp4a_s8(st.qn[i], zw[i], zq);
  zq += shfl_xor_i(zq, 1);
  zq += shfl_xor_i(zq, 2);
  // the folded query q_c s_c + 128 = 256 h + (l + 128): bytes 0 (xor 0x80) and 1 are l and h;
  // one product is a dp4a of the query word with all bytes but channel c's masked off and the
  // scale word (two instructions; two byte extractions and a multiply-add before)
  u32 a[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int u[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int c = fold_channel<BITS>(ks, half, b);
        u[b] = dp4a_s8u8(st.qn[c >> 2] & (0xffu << (8 * (c & 3))), sw[c >> 2], 128);
      }
      const u32 p01 = prmt((u32)u[0], (u32)u[1], 0x5140), p23 = prmt((u32)u[2], (u32)u[3], 0x5140);
      a[ks][2 * half] = prmt(p01, p23, 0x5410) ^ 0x80808080u;  // l: row g
      a[ks][2 * half + 1] = prmt(p01, p23, 0x7632);            // h: row g + 8
    }
  const u8* row0 = stg + S::kK + row_slot(g) * RB + KLB * t;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const u8* row = row0 + 8 * j * RB;  // row_slot(8 j + g)
    u32 w[4];
    if (KLB == 16) {
      const Vec16 v = ld_shared16(row);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if (KLB == 8) {
      const uint2 v = *reinterpret_cast<const uint2*>(row);
      w[0] = v.x, w[1] = v.y;
    } else {
      w[0] = lds32(row);
    }
    int d[4] = {0, 0, 0, 0};
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      u32 b0, b1;
      raw_k_codes<BITS>(w, ks, b0, b1);
      // rows: l of head g (a0, a2), h of head g (a1, a3)
      mma_qk2(d, a[ks][0], a[ks][1], a[ks][2], a[ks][3], b0, b1);
    }
    s[j][0] = d[0] + 256 * d[2] + zq;
    s[j][1] = d[1] + 256 * d[3] + zq;
  }
}

// q K^T of a 4-bit compressed tile that cannot clamp in the half-row instance (groups of at most 4
// query heads), with the high-nibble channels on the MMA rows that hold no query head. In
// unit_qk_folded rows 4-7 / 12-15 carry copies of rows 0-3 / 8-11 (decode_body) and every lane
// folds 8 channels a slice into its query (both nibbles of a K byte), and K's high nibbles are
// shifted down. Here the rows split the channels instead: rows 0-3 / 8-11 (lanes 0-15) hold the
// l / h planes of the low-nibble channels (k 0..15 of the slice, against b0 = w & 0x0f0f0f0f),
// rows 4-7 / 12-15 (lanes 16-31) those of the high-nibble channels (k 16..31, against b1 =
// w & 0xf0f0f0f0 = 16 x the code, still a u8 operand): each lane folds 4 channels a slice and no
// K register is shifted. Row g's score is then the low-nibble sum of lane (g, t) plus 1/16 of the
// high-nibble sum of lane (g + 4, t) (exact: every term of the latter is a multiple of 16), the
// two lanes of a pair hold the same keys (C columns 2t, 2t + 1), and one exchange per score pair
// with lane ^ 16 gives each lane the whole scores of the keys the half-row softmax asks of it
// (keys 0..31 of row g in lanes 0-15, keys 32..63 of row g - 4 in lanes 16-31). The integer
// sums are those of unit_qk_folded, so the scores are bit for bit the same.
// FERRATTN_TURBO_DECODE_HI_ROWS=0 keeps unit_qk_folded for these tiles (a comparison hook).
#ifndef FERRATTN_TURBO_DECODE_HI_ROWS
#define FERRATTN_TURBO_DECODE_HI_ROWS 1
#endif
// (a ^ b) & c in one LOP3 (ptxas keeps the xor apart when its result has two users).
__device__ __forceinline__ u32 xor_and(u32 a, u32 b, u32 c) {
  u32 r;
  asm("lop3.b32 %0, %1, %2, %3, 0x28;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
template <int D>
__device__ __forceinline__ void unit_qk_folded4_hi_rows(const UnitState<D>& st, const u8* stg, int g, int t,
                                                        int (&s)[8][2]) {
  using S = UnitStage<D>;
  constexpr int KS = D / 32, KCH = D / 4;
  constexpr int RB = D / 2;    // bytes of one token row of 4-bit codes
  constexpr int KLB = KCH / 2; // bytes of the lane's channels in a row: 16 (d 128) or 8 (d 64)
  const bool upper = g >= 4;
  u32 sw[KCH / 4], zw[KCH / 4];
  lds_lane_bytes<KCH>(stg + S::kParK + KCH * t, sw);
  lds_lane_bytes<KCH>(stg + S::kParK + D + KCH * t, zw);
  int zq = 0;  // sum_c q_c z_c of the query row (rows g and g + 4 hold the same query)
#pragma unroll
  for (int i = 0; i < KCH / 4; ++i) zq = dp4a_s8(st.qn[i], zw[i], zq);
  zq += shfl_xor_i(zq, 1);
  zq += shfl_xor_i(zq, 2);
  // channel 8 ks + 2 b + nibble of the lane's range: byte 2 (b & 1) + nibble of query word
  // 2 ks + b / 2; the lane's nibble is `upper`
  const u32 m0 = upper ? 0x0000ff00u : 0x000000ffu, m1 = m0 << 16;
  const u32 keep_lo = upper ? 0u : 0xffffffffu;
  u32 a[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    int u[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int wi = 2 * ks + (b >> 1);
      u[b] = dp4a_s8u8(st.qn[wi] & ((b & 1) ? m1 : m0), sw[wi], 128);
    }
    const u32 p01 = prmt((u32)u[0], (u32)u[1], 0x5140), p23 = prmt((u32)u[2], (u32)u[3], 0x5140);
    const u32 l = prmt(p01, p23, 0x5410), h = prmt(p01, p23, 0x7632);  // l + 128 and h bytes
    a[ks][0] = xor_and(l, 0x80808080u, keep_lo);   // row g, k 0..15: the low-nibble channels (rows 0-3)
    a[ks][1] = h & keep_lo;                        // row g + 8
    a[ks][2] = xor_and(l, 0x80808080u, ~keep_lo);  // row g, k 16..31: the high-nibble channels (rows 4-7)
    a[ks][3] = h & ~keep_lo;                       // row g + 8
  }
  const u8* row0 = stg + S::kK + row_slot(g) * RB + KLB * t;
  int own[8][2];  // the lane's partial sums: low-nibble channels (rows 0-3), high ones (rows 4-7)
  const int sh = upper ? 4 : 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const u8* row = row0 + 8 * j * RB;
    u32 w[4];
    if (KLB == 16) {
      const Vec16 v = ld_shared16(row);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(row);
      w[0] = v.x, w[1] = v.y;
    }
    int d[4] = {0, 0, 0, 0};
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      mma_qk2(d, a[ks][0], a[ks][1], a[ks][2], a[ks][3], w[ks] & 0x0f0f0f0fu, w[ks] & 0xf0f0f0f0u);
    own[j][0] = (d[0] + 256 * d[2]) >> sh;  // the high-nibble sums are 16 x theirs, exactly
    own[j][1] = (d[1] + 256 * d[3]) >> sh;
  }
  // lanes 0-15 keep keys 0..31 (n-tiles 0-3) and send 32..63, lanes 16-31 the other way round
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int other = shfl_xor_i(upper ? own[k][e] : own[k + 4][e], 16);
      const int v = (upper ? own[k + 4][e] : own[k][e]) + other + zq;
      s[k][e] = v;
      s[k + 4][e] = v;
    }
}

// The B registers of P V for k-slice kk, key half h (keys 32 kk + 16 h + 2 t + {0, 1, 8, 9} in
// the slot order of P's A fragment), raw codes of the lane's VCH channels: vb[nt] holds channel
// VCH g + nt of the four keys, one per byte.
//
// IN_PLACE: codes stay at their bit position in the byte, channel ch (of the lane's VCH) as
// 16^(ch % 2) x code (4 bits) or 4^(ch % 4) x code (2 bits), at most 240 or 192 (u8 operands):
// one mask instead of a shift and a mask; the caller shifts those sums right by 4 (ch % 2) or
// 2 (ch % 4) (exact: every term is a multiple of that power of two, and 127 x 240 x 64 fits an
// s32).
template <int D, int BITS, bool IN_PLACE = false>
__device__ __forceinline__ void raw_v_codes(const u8* vrow, int kk, int h, int t, u32 (&vb)[D / 8]) {
  constexpr int VCH = D / 8;
  constexpr int RB = D * BITS / 8;
  constexpr int VB = VCH * BITS / 8;  // bytes of the lane's channels in a row: 8, 4 or 2
  constexpr int W = VB >= 4 ? VB / 4 : 1;
  // key 32 kk + 16 h + 8 (k >> 1) + 2 t + (k & 1) sits at row 32 kk + 16 h + 8 (k >> 1) +
  // row_slot(2 t + (k & 1))
  const u8* base[2] = {vrow + row_slot(2 * t) * RB, vrow + row_slot(2 * t + 1) * RB};
  u32 w[4][W];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const u8* p = base[k & 1] + (32 * kk + 16 * h + 8 * (k >> 1)) * RB;
    if (VB == 8) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      w[k][0] = v.x, w[k][W - 1] = v.y;
    } else if (VB == 4) {
      w[k][0] = lds32(p);
    } else {
      w[k][0] = *reinterpret_cast<const unsigned short*>(p);
    }
  }
#pragma unroll
  for (int wi = 0; wi < W; ++wi) {
    u32 x[4];
    transpose4(w[0][wi], w[1][wi], w[2][wi], w[3][wi], x);  // x[j]: byte j of the four keys
    if (BITS == 4) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (8 * wi + 2 * j + 1 >= VCH) break;
        vb[8 * wi + 2 * j] = x[j] & 0x0f0f0f0fu;
        vb[8 * wi + 2 * j + 1] = IN_PLACE ? x[j] & 0xf0f0f0f0u : (x[j] >> 4) & 0x0f0f0f0fu;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (16 * wi + 4 * j + k < VCH)
            vb[16 * wi + 4 * j + k] = IN_PLACE ? x[j] & (0x03030303u << (2 * k)) : (x[j] >> (2 * k)) & 0x03030303u;
        }
    }
  }
}

// P V of a compressed tile that cannot clamp (raw V codes) and the O update with V's scale and
// zero point per output channel: O = O r + s_P s_V (s_c (P code) + z_c rs).
template <int D, int BITS>
__device__ __forceinline__ void unit_pv_folded(UnitState<D>& st, const u8* stg, int g, int t, const u32 (&pa0)[2],
                                               const u32 (&pa2)[2], int rs, float r, float c) {
  using S = UnitStage<D>;
  constexpr int VCH = D / 8;
  int acc[D / 8][2];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) acc[nt][0] = acc[nt][1] = 0;
  const u8* vrow = stg + S::kV + (VCH * BITS / 8) * g;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    u32 vb[2][D / 8];
    raw_v_codes<D, BITS>(vrow, kk, 0, t, vb[0]);
    raw_v_codes<D, BITS>(vrow, kk, 1, t, vb[1]);
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) mma_pv(acc[nt][0], acc[nt][1], pa0[kk], pa2[kk], vb[0][nt], vb[1][nt]);
  }
  // O channels of the lane: c0 of n-tile nt is channel 2 VCH t + nt, c1 is 2 VCH t + VCH + nt
  const u8* ps = stg + S::kParV + 2 * VCH * t;
  struct Fix {
    u32 sw[VCH / 2], zw[VCH / 2];
    int rs;
    __device__ __forceinline__ int operator()(int v, int nt, int e) const {
      const int ch = VCH * e + nt;
      return v * byte_u(sw[ch >> 2], ch & 3) + byte_s(zw[ch >> 2], ch & 3) * rs;
    }
  } fix;
  lds_lane_bytes<2 * VCH>(ps, fix.sw);
  lds_lane_bytes<2 * VCH>(ps + D, fix.zw);
  fix.rs = rs;
  unit_o_update<D>(st, acc, r, c, fix);
}

// q K^T of the INT8 buffer tile (`ntok` tokens, 1..64) straight from global memory.
template <int D>
__device__ __forceinline__ void unit_qk_buffer(const UnitState<D>& st, const i8* kb, int ntok, int g, int t,
                                               int (&s)[8][2]) {
  constexpr int KS = D / 32, KCH = D / 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    s[j][0] = s[j][1] = 0;
    const int tok = 8 * j + g;
    u32 w[KCH / 4];
#pragma unroll
    for (int v = 0; v < KCH / 16; ++v) {
      Vec16 x = {0, 0, 0, 0};
      if (tok < ntok) x = ld_global_nc16(kb + tok * D + KCH * t + 16 * v);
      w[4 * v] = x.x, w[4 * v + 1] = x.y, w[4 * v + 2] = x.z, w[4 * v + 3] = x.w;
    }
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const u32 b0 = prmt(w[2 * ks], w[2 * ks + 1], 0x6420) ^ 0x80808080u;
      const u32 b1 = prmt(w[2 * ks], w[2 * ks + 1], 0x7531) ^ 0x80808080u;
      mma_qk(s[j][0], s[j][1], st.qa0[ks], st.qa2[ks], b0, b1);
    }
    s[j][0] -= 128 * st.qsum;  // the bytes carried K + 128
    s[j][1] -= 128 * st.qsum;
  }
}

// P V of the INT8 buffer tile and the O update.
template <int D>
__device__ __forceinline__ void unit_pv_buffer(UnitState<D>& st, const i8* vbuf, int ntok, int g, int t,
                                               const u32 (&pa0)[2], const u32 (&pa2)[2], int rs, float r, float c) {
  constexpr int VCH = D / 8;
  int acc[D / 8][2];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) acc[nt][0] = acc[nt][1] = 0;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk)
#pragma unroll
    for (int c8 = 0; c8 < VCH / 8; ++c8) {
      u32 vb[8][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key0 = 32 * kk + 16 * h + 2 * t;
        u32 lo[4], hi[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int key = key0 + (k & 1) + 8 * (k >> 1);
          uint2 x = make_uint2(0, 0);
          if (key < ntok) x = *reinterpret_cast<const uint2*>(vbuf + key * D + VCH * g + 8 * c8);
          lo[k] = x.x, hi[k] = x.y;
        }
        u32 xl[4], xh[4];
        transpose4(lo[0], lo[1], lo[2], lo[3], xl);
        transpose4(hi[0], hi[1], hi[2], hi[3], xh);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          vb[i][h] = xl[i] ^ 0x80808080u;
          vb[4 + i][h] = xh[i] ^ 0x80808080u;
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i)
        mma_pv(acc[8 * c8 + i][0], acc[8 * c8 + i][1], pa0[kk], pa2[kk], vb[i][0], vb[i][1]);
    }
  unit_o_update<D>(st, acc, r, c, PlusOffsetFix{rs});
}

// ---- P V of the half-row instance as O^T = V^T P^T ----------------------------------------------
// For GQA groups of at most 4 query heads P has 4 live rows of the MMA's 16: P (A) x V (B) threw
// three quarters of every mma.m16n8k32 away, and ptxas rebuilt the zero rows of A and the zero
// accumulator halves around each one (about 190 register moves per tile in the SASS of 79c02d8,
// for 32 MMAs). Transposed, V^T is the A operand: rows g and g + 8 of m-tile mt are the lane's
// channels VCH g + 2 mt and VCH g + 2 mt + 1, k the 32 keys of a slice in P's slot order; P^T is
// the B operand, and P's A fragment of row g is exactly B's fragment of column g (the same k per
// lane), so the softmax's fragments serve unchanged. D/16 MMAs per key slice instead of D/8, every
// operand and accumulator register live. D of m-tile mt: c0, c1 = channel VCH g + 2 mt, query
// rows 2t, 2t + 1; c2, c3 = channel VCH g + 2 mt + 1, same rows. Rows 4-7 hold no query head
// (lanes t = 2, 3): those lanes take the upper half of the m-tiles of lane t - 2 (one shuffle per
// element), so every lane keeps D/8 O values: query rows 2 (t & 1) + {0, 1}, channels VCH g +
// (VCH / 2)(t >> 1) + 0 .. VCH / 2 - 1; st.o[f / 2][f % 2] with f = 4 m + j holds channel
// offset 2 m + j / 2, row 2 (t & 1) + j % 2. The integer sums and the f32 update of every element
// are those of the other layouts, so O stays bit-exact.
enum PvKind { kPvFolded4, kPvFolded2, kPvClamp4, kPvClamp2, kPvBuffer };

__device__ __forceinline__ void mma_vp(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ int shfl_idx_i(int v, int src) {
  int r;
  asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(src));
  return r;
}
__device__ __forceinline__ float shfl_idx_f(float v, int src) { return __int_as_float(shfl_idx_i(__float_as_int(v), src)); }

// vb[ch]: channel VCH g + ch of the four keys of key half h of slice kk (P's slot order), one per
// byte: raw codes (folded), dequantized + 128 (clamping path), or INT8 + 128 (the buffer).
template <int D, int KIND>
__device__ __forceinline__ void half_v_regs(const u8* stg, const i8* vbuf, int ntok, int g, int t, int kk, int h,
                                            const u32 (&sc)[D / 8], const u32 (&zb)[D / 8], u32 (&vb)[D / 8]) {
  using S = UnitStage<D>;
  constexpr int VCH = D / 8;
  if (KIND == kPvFolded4 || KIND == kPvFolded2) {
    constexpr int BITS = KIND == kPvFolded4 ? 4 : 2;
    raw_v_codes<D, BITS, true>(stg + S::kV + (VCH * BITS / 8) * g, kk, h, t, vb);
  } else if (KIND == kPvClamp4 || KIND == kPvClamp2) {
    constexpr int BITS = KIND == kPvClamp4 ? 4 : 2;
    constexpr int RB = D * BITS / 8;
    const u8* vrow = stg + S::kV + (VCH * BITS / 8) * g;
    const int key0 = 32 * kk + 16 * h + 2 * t;
#pragma unroll
    for (int c8 = 0; c8 < VCH / 8; ++c8) {
      u32 w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        w[k] = lds_codes8<BITS>(vrow + (key0 - 2 * t + 8 * (k >> 1) + row_slot(2 * t + (k & 1))) * RB + c8 * BITS);
      u32 x[4], ch[8];
      transpose4(w[0], w[1], w[2], w[3], x);
      split_codes<BITS>(x, ch);
#pragma unroll
      for (int i = 0; i < 8; ++i) vb[8 * c8 + i] = dq4<true>(ch[i], sc[8 * c8 + i], zb[8 * c8 + i]);
    }
  } else {
    const int key0 = 32 * kk + 16 * h + 2 * t;
#pragma unroll
    for (int c8 = 0; c8 < VCH / 8; ++c8) {
      u32 lo[4], hi[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int key = key0 + (k & 1) + 8 * (k >> 1);
        uint2 x = make_uint2(0, 0);
        if (key < ntok) x = *reinterpret_cast<const uint2*>(vbuf + key * D + VCH * g + 8 * c8);
        lo[k] = x.x, hi[k] = x.y;
      }
      u32 xl[4], xh[4];
      transpose4(lo[0], lo[1], lo[2], lo[3], xl);
      transpose4(hi[0], hi[1], hi[2], hi[3], xh);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        vb[8 * c8 + i] = xl[i] ^ 0x80808080u;
        vb[8 * c8 + 4 + i] = xh[i] ^ 0x80808080u;
      }
    }
  }
}

// P V of one tile and the O update in the transposed layout above (half-row instance only).
template <int D, int KIND>
__device__ __forceinline__ void unit_pv_half(UnitState<D>& st, const u8* stg, const i8* vbuf, int ntok, int g, int t,
                                             const u32 (&pa0)[2], const u32 (&pa2)[2], int rs, float r, float c) {
  using S = UnitStage<D>;
  constexpr int VCH = D / 8, MT = VCH / 2;
  constexpr bool kClamp = KIND == kPvClamp4 || KIND == kPvClamp2;
  u32 sc[VCH], zb[VCH];  // channel constants of the clamping path's dequantization
  if (kClamp) {
#pragma unroll
    for (int c8 = 0; c8 < VCH / 8; ++c8) {
      u32 s8[8], z8[8];
      channel_consts(stg + S::kParV, D, VCH * g + 8 * c8, s8, z8);
#pragma unroll
      for (int i = 0; i < 8; ++i) sc[8 * c8 + i] = s8[i], zb[8 * c8 + i] = z8[i];
    }
  }
  int acc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    u32 vb[2][VCH];
    half_v_regs<D, KIND>(stg, vbuf, ntok, g, t, kk, 0, sc, zb, vb[0]);
    half_v_regs<D, KIND>(stg, vbuf, ntok, g, t, kk, 1, sc, zb, vb[1]);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      mma_vp(acc[mt], vb[0][2 * mt], vb[0][2 * mt + 1], vb[1][2 * mt], vb[1][2 * mt + 1], pa0[kk], pa2[kk]);
  }
  // the factors of query rows 2 (t & 1) and 2 (t & 1) + 1 (row h's live in lane 4 h)
  const int ra = 8 * (t & 1), rb = ra + 4;
  const int rs_a = shfl_idx_i(rs, ra), rs_b = shfl_idx_i(rs, rb);
  const float r_a = shfl_idx_f(r, ra), r_b = shfl_idx_f(r, rb);
  const float c_a = shfl_idx_f(c, ra), c_b = shfl_idx_f(c, rb);
  // V's scale and zero point of the lane's MT channels (folded kinds)
  constexpr int W = MT / 4;
  u32 sw[W], zw[W];
  if (!kClamp && KIND != kPvBuffer) {
    const u8* ps = stg + S::kParV + VCH * g + MT * (t >> 1);
#pragma unroll
    for (int i = 0; i < W; ++i) {
      sw[i] = lds32(ps + 4 * i);
      zw[i] = lds32(ps + D + 4 * i);
    }
  }
  const bool up = t >= 2;
#pragma unroll
  for (int m = 0; m < MT / 2; ++m)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int other = shfl_xor_i(acc[MT / 2 + m][j], 2);
      int v = up ? other : acc[m][j];
      const int chl = 2 * m + (j >> 1);
      // the codes sat in place (half_v_regs): the element's vb index is chl, + MT in lanes
      // t >= 2, and MT (D / 16) is a multiple of 4, so chl has the index's parity and residue mod 4
      if (KIND == kPvFolded4) v >>= 4 * (chl & 1);
      if (KIND == kPvFolded2) v >>= 2 * (chl & 3);
      const int rsj = (j & 1) ? rs_b : rs_a;
      int dot;
      if (kClamp || KIND == kPvBuffer)
        dot = v - 128 * rsj;
      else
        dot = v * byte_u(sw[chl >> 2], chl & 3) + byte_s(zw[chl >> 2], chl & 3) * rsj;
      float& o = st.o[(4 * m + j) >> 1][j & 1];
      o = fma_rn(i2f(dot), (j & 1) ? c_b : c_a, mul_rn(o, (j & 1) ? r_b : r_a));
    }
}

// The INT8 buffer tile out of line (the BRANCHES instance only). A unit runs the buffer tile
// once an output tile, but inlined its q K^T and P V (868 SASS instructions at bf16 d 128, about
// 14 KB) sat among the hot loop's code; at 64 x 4k (one buffer tile in 64) Nsight Compute put the
// mixed instance's loss against 16 x 16k in instruction fetch (decode14). As calls the routines
// leave the loop and take their operands in registers and give the results back the same way:
// the query fragments and q's sum in, the scores out; O in and out of P V. The same arithmetic
// in the same order, so the results are those of the inlined code bit for bit.
#ifndef FERRATTN_TURBO_DECODE_BUFFER_CALL
#define FERRATTN_TURBO_DECODE_BUFFER_CALL 1
#endif
template <int D>
struct BufferQuery {
  u32 qa0[D / 32], qa2[D / 32];
  int qsum;
};
struct BufferScores {
  int s[8][2];
};
template <int D>
struct BufferO {
  float o[D / 8][2];
};
template <int D>
__device__ __noinline__ BufferScores buffer_qk_call(const BufferQuery<D> q, const i8* kb, int ntok, int g, int t) {
  UnitState<D> st;
#pragma unroll
  for (int ks = 0; ks < D / 32; ++ks) st.qa0[ks] = q.qa0[ks], st.qa2[ks] = q.qa2[ks];
  st.qsum = q.qsum;
  BufferScores r;
  unit_qk_buffer<D>(st, kb, ntok, g, t, r.s);
  return r;
}
template <int D>
__device__ __noinline__ BufferO<D> buffer_pv_half_call(const BufferO<D> o, const i8* vbuf, int ntok, int g, int t,
                                                       u32 pa00, u32 pa01, u32 pa20, u32 pa21, int rs, float r,
                                                       float c) {
  UnitState<D> st;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) st.o[i][0] = o.o[i][0], st.o[i][1] = o.o[i][1];
  const u32 pa0[2] = {pa00, pa01}, pa2[2] = {pa20, pa21};
  unit_pv_half<D, kPvBuffer>(st, nullptr, vbuf, ntok, g, t, pa0, pa2, rs, r, c);
  BufferO<D> out;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) out.o[i][0] = st.o[i][0], out.o[i][1] = st.o[i][1];
  return out;
}
template <int D>
__device__ __forceinline__ void unit_qk_buffer_call(const UnitState<D>& st, const i8* kb, int ntok, int g, int t,
                                                    int (&s)[8][2]) {
  BufferQuery<D> q;
#pragma unroll
  for (int ks = 0; ks < D / 32; ++ks) q.qa0[ks] = st.qa0[ks], q.qa2[ks] = st.qa2[ks];
  q.qsum = st.qsum;
  const BufferScores r = buffer_qk_call<D>(q, kb, ntok, g, t);
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = r.s[j][0], s[j][1] = r.s[j][1];
}
template <int D>
__device__ __forceinline__ void unit_pv_half_buffer_call(UnitState<D>& st, const i8* vbuf, int ntok, int g, int t,
                                                         const u32 (&pa0)[2], const u32 (&pa2)[2], int rs, float r,
                                                         float c) {
  BufferO<D> o;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o.o[i][0] = st.o[i][0], o.o[i][1] = st.o[i][1];
  o = buffer_pv_half_call<D>(o, vbuf, ntok, g, t, pa0[0], pa0[1], pa2[0], pa2[1], rs, r, c);
#pragma unroll
  for (int i = 0; i < D / 8; ++i) st.o[i][0] = o.o[i][0], st.o[i][1] = o.o[i][1];
}

// The INT8 codes of a lane's query channels, clamp(rne(x / s), -127, 127) with x / s the
// correctly rounded quotient (div.rn), as ferrattn_core::turbo::quant::quantize_int8, `s` the
// row's scale max|x| / 119 (int8_scale). Without a division per channel: with rinv = 1 / s
// correctly rounded, q = RN(x rinv) is within an ulp of x / s, the remainder x - q s is exact in
// an FMA, and RN(q + (x - q s) rinv) is exactly RN(x / s) (Markstein's theorem; the sequence
// div.rn's own fast path takes after its reciprocal), provided nothing underflows or overflows:
// s in [2^-100, 2^100] (then every quotient of magnitude >= 1/4, the only ones whose code can be
// non-zero, has an exact remainder; smaller ones give code 0 either way) or s = 0 (x = 0: code
// 0, rinv taken as 0). |x| <= max|x| bounds the quotient by 119 (1 + 2^-22), so no code reaches
// the clamp. A warp with a lane outside that range (a query row of subnormal or huge values)
// divides every channel as the emulation does. This replaced a reciprocal product with a
// rounding-boundary test and an exact division of every channel when any of the warp's
// quotients came within 4e-5 of a half-integer, which bf16 queries hit in most segments (the
// ratios of 8-bit mantissas land on n + 1/2: x = max|x| / 2 is one), about 550 of the ~1,060
// instructions a segment spent here (issue 11, docs/TURBO_CUDA.md).
template <int N>
__device__ __forceinline__ void quantize_query_row(const float (&f)[N], float s, int (&q)[N]) {
  const bool in_range = s == 0.0f || (s >= 0x1p-100f && s <= 0x1p100f);
  if (!warp_any(!in_range)) {
    const float rinv = s == 0.0f ? 0.0f : div_rn(1.0f, s);
#pragma unroll
    for (int c = 0; c < N; ++c) {
      const float q0 = mul_rn(f[c], rinv);
      q[c] = rne_int(fma_rn(fma_rn(-q0, s, f[c]), rinv, q0));
    }
  } else {
#pragma unroll
    for (int c = 0; c < N; ++c) q[c] = quantize_int8(f[c], s);
  }
}

// Position of a unit in the iteration space: sequence, output tile of the sequence, cache tile,
// with what the loop needs of them kept up to date as the cursor moves (per-sequence lengths and
// query token, the KV head's bits and code / parameter offsets), so that a step within an output
// tile is a few adds instead of global loads, a division and 64-bit products (the loop head and
// the two cp.async issues took about 400 instructions per tile before: docs/TURBO_CUDA.md).
struct UnitCursor {
  int b;        // sequence
  int hk, qg;   // KV head and query group of the output tile (output tile = hk * qgroups + qg)
  int ti;       // cache tile within the output tile
  int n_it;     // cache tiles of this sequence's output tiles
  int len, qt;  // tokens the cache holds, query token (-1: sequence left alone)
  int bits;     // bits of head hk
  u64 code0;    // byte offset of block 0 of (b, hk) in CacheView::codes
  u64 pb0;      // index of block 0 of (b, hk) in the per-block arrays (bscale, clamp, par / 2D)
};

// HALF: the instance for GQA groups of at most 4 query heads (turbo_decode_g4_*): the softmax on
// half rows (unit_softmax<D, 4>) and P V transposed (unit_pv_half, each lane keeps D/8 O values)
// fixed at compile time, so the O registers of the other layout are never allocated; else the
// instance for larger groups (full rows). ferrattn_cuda::TurboKernels::decode_for picks by the group.
// BRANCHES: the tile's format tested as branches with the folded tiles first (fold, four), so that
// the common tiles' code lies together and the clamping and buffer code after it, the parameter
// and scale copies predicated, the per-segment values out of the tile loop; else a switch on one
// variant number. The same results bit for bit; BRANCHES measured 1.2-2.8% faster on the mixed
// 2/4-bit cache at 1 GB on an H200 but -0.6..+0.5% on INT4 and +0.7% at batch 1 (decode13), so
// only the g4 fast instance for caches with a 2-bit head has it (turbo_decode_g4_fast_mixed_*,
// chosen per launch by ferrattn_cuda::TurboKernels::decode_instance; docs/TURBO_CUDA.md, "Decode:
// the branch-dispatch instance for the mixed cache").
template <class T, int D, bool HALF, bool FAST, bool BRANCHES = false>
__device__ __forceinline__ void decode_body(const DecodeParams& p) {
  using S = UnitStage<D>;
  constexpr int KCH = D / 4, VCH = D / 8, KS = D / 32;
  extern __shared__ __align__(16) u8 dsmem[];
  __shared__ float sLut[17];
  pdl_launch_dependents();  // the combine may be scheduled (it waits for this grid to complete)
  sas_lut_init(sLut);
  __syncthreads();  // the only CTA barrier: units are independent from here on
  const Exp ex{sLut, (float)p.sas_nr, p.sas};
  const CacheParams& cp = p.cache;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int unit = blockIdx.x * kUnitsPerCta + warp;
  if (unit >= p.num_ctas) return;
  u8* stages = dsmem + warp * S::kBytes;
  const u32 begin = p.cta_bounds[unit], end = p.cta_bounds[unit + 1];
  if (begin >= end) return;
  constexpr bool half = HALF;  // unit_softmax<D, 4> and the half-row O layout

  // the cursor's per-sequence and per-(sequence, KV head) fields
  auto enter_seq = [&](UnitCursor& c) {
    c.len = p.lens[c.b];
    c.qt = p.q_tok[c.b];
    c.n_it = max(1, (c.len + kBlock - 1) / kBlock);
  };
  auto enter_head = [&](UnitCursor& c) {
    c.bits = cp.head_bits[c.hk];
    c.code0 = (u64)c.b * cp.seq_code_bytes + cp.head_off[c.hk];
    c.pb0 = ((u64)c.b * p.heads_kv + c.hk) * cp.cap_blocks;
  };
  UnitCursor cur;
  {
    int lo = 0, hi = p.batch;
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (p.seq_start[mid] <= begin) lo = mid; else hi = mid;
    }
    cur.b = lo;
    enter_seq(cur);
    const u32 off = begin - p.seq_start[lo];
    const int rt = (int)(off / (u32)cur.n_it);
    cur.ti = (int)(off % (u32)cur.n_it);
    cur.hk = rt / p.qgroups;
    cur.qg = rt % p.qgroups;
    enter_head(cur);
  }
  auto advance = [&](UnitCursor& c) {
    if (++c.ti == c.n_it) {
      c.ti = 0;
      if (++c.qg == p.qgroups) {
        c.qg = 0;
        if (++c.hk == p.heads_kv) {
          c.hk = 0;
          ++c.b;
          if (c.b < p.batch) enter_seq(c);
        }
        if (c.b < p.batch) enter_head(c);
      }
    }
  };
  // stage one half (K: 0, V: 1) of cache tile `c`, if it is a compressed block of a decoded
  // sequence: the codes in steps of 512 bytes (32 lanes x 16); within a step the lane's chunk
  // lands at the same offset, since row_slot permutes rows inside aligned groups of 8; then the
  // tensor's channel parameters, and with K the block scales and clamp flags of both tensors
  const u32 stage_s = smem_addr(stages);
  // what the issue needs of the lane alone, computed once: where its 16-byte chunk of a step
  // lands for 4 and for 2 bits, and the source of its scale / clamp word (lanes 0-3)
  auto lane_dst = [&](int rb_log) {
    const int cpr_log = rb_log - 4;  // log2 16-byte chunks per row
    return stage_s + (row_slot(lane >> cpr_log) << rb_log) + ((lane & ((1 << cpr_log) - 1)) << 4);
  };
  const u32 dst4 = lane_dst(D == 128 ? 6 : 5), dst2 = lane_dst(D == 128 ? 5 : 4);
  const u32* const scale_src = lane == 0   ? reinterpret_cast<const u32*>(cp.k.bscale)
                               : lane == 1 ? reinterpret_cast<const u32*>(cp.v.bscale)
                               : lane == 2 ? cp.k.clamp
                                           : cp.v.clamp;
  auto issue = [&](const UnitCursor& c, int which) {
    if (c.qt < 0 || c.ti >= (c.len >> 6)) return;  // kBlock = 64
    const bool b4 = c.bits == 4;
    const int rb_log = b4 ? (D == 128 ? 6 : 5) : (D == 128 ? 5 : 4);  // log2 row bytes
    const u64 code_off = c.code0 + (u32)(c.ti << (rb_log + 6));       // 64 rows a block (< 4 GiB a head)
    const u64 pb = c.pb0 + c.ti;
    const CacheView& cv = which ? cp.v : cp.k;
    const u32 dst = (b4 ? dst4 : dst2) + (which ? S::kV : S::kK);
    const u8* src = cv.codes + code_off + 16 * lane;
    constexpr int kMaxSteps = D * 4 / 64;  // 512-byte steps of a 4-bit block
#pragma unroll
    for (int i = 0; i < kMaxSteps; ++i)
      if (b4 || i < kMaxSteps / 2) cp_async16_s(dst + 512 * i, src + 512 * i);
    if constexpr (BRANCHES) {
      // 2 D / 16 chunks of channel parameters
      cp_async16_s_if(lane < D / 8, stage_s + (which ? S::kParV : S::kParK) + 16 * lane, cv.par + pb * 2 * D + 16 * lane);
      if (!which) cp_async4_s_if(lane < 4, stage_s + S::kScales + 4 * lane, scale_src + pb);
    } else {
      if (lane < D / 8)  // 2 D / 16 chunks of channel parameters
        cp_async16_s(stage_s + (which ? S::kParV : S::kParK) + 16 * lane, cv.par + pb * 2 * D + 16 * lane);
      if (!which && lane < 4) cp_async4_s(stage_s + S::kScales + 4 * lane, scale_src + pb);
    }
  };

  UnitState<D> st;
  UnitCursor nxt = cur;
  issue(cur, 0);
  cp_async_commit();
  issue(cur, 1);
  cp_async_commit();
  u32 slot = p.cta_slot[unit];
  for (u32 it = begin; it < end; ++it) {
    // pending cp.async groups here: K of this tile, V of this tile
    cp_async_wait<1>();
    syncwarp();
    const int b = cur.b;
    const int qt = cur.qt;
    const bool seg_first = it == begin || cur.ti == 0;
    const bool seg_last = it + 1 == end || cur.ti + 1 == cur.n_it;
    const int hk = cur.hk, qg = cur.qg;
    // BRANCHES computes rows and h0 where a segment starts and ends, not every tile
    const int rows_tile = BRANCHES ? 0 : min(kUnitRows, p.group - qg * kUnitRows);
    const int h0_tile = BRANCHES ? 0 : hk * p.group + qg * kUnitRows;
    const int len = cur.len;
    const int nblocks = BRANCHES ? len >> 6 : len / kBlock;  // kBlock = 64; len >= 0
    const int ntok_buf = BRANCHES ? len & (kBlock - 1) : len % kBlock;
    const u64 bh = (u64)b * p.heads_kv + hk;
    const bool compressed = cur.ti < nblocks;
    const bool active = qt >= 0 && (compressed || (cur.ti == nblocks && ntok_buf > 0));
    if (qt >= 0) {
      if (seg_first) {
        const int rows = BRANCHES ? min(kUnitRows, p.group - qg * kUnitRows) : rows_tile;
        const int h0 = BRANCHES ? hk * p.group + qg * kUnitRows : h0_tile;
        // query row g to INT8, one scale per query head (Alg. 2 "s_Q = max(abs(Q)) / 119"); in
        // the half-row instance rows 4-7 (no query head) hold copies of rows 0-3, so that the
        // lanes of row g + 4 find row g's scores of keys 32..63 in their own accumulators
        // (unit_softmax<D, 4>)
        const int qrow = half ? (g & 3) : g;
        // the half-row instance: lanes 16-31 (rows 4-7) hold the same rows as lanes 0-15, so
        // each lane of a pair quantizes half of the pair's KS slices (lanes 0-15 the first,
        // 16-31 the second) and the pair swaps the packed words (one shuffle a word)
        constexpr int QS = HALF ? KS / 2 : KS;  // slices this lane quantizes
        const bool second = HALF && lane >= 16;
        const int ks0 = second ? KS / 2 : 0;
        float f[8 * QS];
        float amax = 0.0f;
#pragma unroll
        for (int v = 0; v < QS; ++v) {
          float e8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          if (qrow < rows) unpack8<T>(ld_global_nc16(p.q + ((u64)(b * p.max_sq + qt) * p.heads_q + h0 + qrow) * D + KCH * t + 8 * (ks0 + v)), e8);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            f[8 * v + e] = e8[e];
            amax = fmaxf(amax, fabsf(e8[e]));  // one FMNMX; fmax2's result for every non-NaN x
          }
        }
        amax = fmax2(amax, shfl_xor(amax, 1));
        amax = fmax2(amax, shfl_xor(amax, 2));
        if (HALF) amax = fmax2(amax, shfl_xor(amax, 16));
        st.qs = int8_scale(amax);
        int qi_all[8 * QS];
        quantize_query_row<8 * QS>(f, st.qs, qi_all);
        int qsum = 0;
        u32 wa0[QS], wa2[QS], wn0[QS], wn1[QS];
#pragma unroll
        for (int v = 0; v < QS; ++v) {
          const int* qi = qi_all + 8 * v;  // in -127..127 (quantize_query_row)
          wa0[v] = pack4_u8(qi[0], qi[2], qi[4], qi[6]);
          wa2[v] = pack4_u8(qi[1], qi[3], qi[5], qi[7]);
          wn0[v] = pack4_u8(qi[0], qi[1], qi[2], qi[3]);
          wn1[v] = pack4_u8(qi[4], qi[5], qi[6], qi[7]);
          qsum = dp4a_s8(wn0[v], 0x01010101u, dp4a_s8(wn1[v], 0x01010101u, qsum));
        }
        qsum += shfl_xor_i(qsum, 1);
        qsum += shfl_xor_i(qsum, 2);
        if (HALF) qsum += shfl_xor_i(qsum, 16);
        st.qsum = qsum;
#pragma unroll
        for (int v = 0; v < QS; ++v) {
          if (HALF) {
            const u32 oa0 = (u32)shfl_xor_i((int)wa0[v], 16), oa2 = (u32)shfl_xor_i((int)wa2[v], 16);
            const u32 on0 = (u32)shfl_xor_i((int)wn0[v], 16), on1 = (u32)shfl_xor_i((int)wn1[v], 16);
            st.qa0[v] = second ? oa0 : wa0[v];
            st.qa2[v] = second ? oa2 : wa2[v];
            st.qn[2 * v] = second ? on0 : wn0[v];
            st.qn[2 * v + 1] = second ? on1 : wn1[v];
            st.qa0[QS + v] = second ? wa0[v] : oa0;
            st.qa2[QS + v] = second ? wa2[v] : oa2;
            st.qn[2 * (QS + v)] = second ? wn0[v] : on0;
            st.qn[2 * (QS + v) + 1] = second ? wn1[v] : on1;
          } else {
            st.qa0[v] = wa0[v], st.qa2[v] = wa2[v], st.qn[2 * v] = wn0[v], st.qn[2 * v + 1] = wn1[v];
          }
        }
#pragma unroll
        for (int i = 0; i < D / 8; ++i) st.o[i][0] = st.o[i][1] = 0.0f;
        st.m = neg_inf();
        st.l = 0.0f;
      }
    }
    // one tile of Alg. 2: q K^T (per cache format), the softmax (shared by every format, one
    // copy in the kernel), P V (per format). The tile's format: compressed with 4 or 2 bits,
    // folded unless a block's clamp flag is set, or the INT8 buffer; BRANCHES tests it as
    // branches (`fold`, `four`), else as one variant number (0-3: compressed, 4 / 2 bits,
    // clamping or not; 4: the INT8 buffer)
    int variant = 4;
    int fold = 0, four = 0;
    float s_k = 0.0f, s_v = 0.0f;
    int ntok = kBlock;
    const i8* kbuf = cp.k.buf + bh * kBlock * D;
    const i8* vbuf = cp.v.buf + bh * kBlock * D;
    int s[8][2];
    if constexpr (BRANCHES) {
      if (active) {
        if (compressed) {
          // the blocks' clamp flags (CacheView::clamp, exact, written with the blocks): the
          // folded path unless some code of K or V dequantizes past 127
          const uint4 sc = *reinterpret_cast<const uint4*>(stages + S::kScales);
          fold = (sc.z | sc.w) == 0;
          four = cur.bits == 4;
          s_k = __uint_as_float(sc.x);
          s_v = __uint_as_float(sc.y);
          if (fold) {
            if (!four)
              unit_qk_folded<D, 2>(st, stages, g, t, s);
            else if (half && FERRATTN_TURBO_DECODE_HI_ROWS)
              unit_qk_folded4_hi_rows<D>(st, stages, g, t, s);
            else
              unit_qk_folded<D, 4>(st, stages, g, t, s);
          } else if (four) {
            unit_qk_compressed<D, 4, true>(st, stages, g, t, s);
          } else {
            unit_qk_compressed<D, 2, true>(st, stages, g, t, s);
          }
        } else {
          // the buffer's scales are read here, inside its branch, so that ptxas does not
          // if-convert them into every tile
          s_k = cp.k.buf_scale[bh];
          s_v = cp.v.buf_scale[bh];
          ntok = ntok_buf;
          if (half && FERRATTN_TURBO_DECODE_BUFFER_CALL)
            unit_qk_buffer_call<D>(st, kbuf, ntok, g, t, s);
          else
            unit_qk_buffer<D>(st, kbuf, ntok, g, t, s);
        }
      }
    } else if (active) {
      if (compressed) {
        const int bits = cur.bits;
        // the blocks' clamp flags (CacheView::clamp, exact, written with the blocks): the
        // folded path unless some code of K or V dequantizes past 127
        const uint4 sc = *reinterpret_cast<const uint4*>(stages + S::kScales);
        variant = (bits == 4 ? 0 : 2) + ((sc.z | sc.w) != 0 ? 0 : 1);
        s_k = __uint_as_float(sc.x);
        s_v = __uint_as_float(sc.y);
      } else {
        s_k = cp.k.buf_scale[bh];
        s_v = cp.v.buf_scale[bh];
        ntok = ntok_buf;
      }
      switch (variant) {
        case 0: unit_qk_compressed<D, 4, true>(st, stages, g, t, s); break;
        case 1:
          if (half && FERRATTN_TURBO_DECODE_HI_ROWS)
            unit_qk_folded4_hi_rows<D>(st, stages, g, t, s);
          else
            unit_qk_folded<D, 4>(st, stages, g, t, s);
          break;
        case 2: unit_qk_compressed<D, 2, true>(st, stages, g, t, s); break;
        case 3: unit_qk_folded<D, 2>(st, stages, g, t, s); break;
        default: unit_qk_buffer<D>(st, kbuf, ntok, g, t, s);
      }
    }
    syncwarp();  // every lane is done with the K half before it is refilled
    if (it + 1 < end) {
      advance(nxt);
      issue(nxt, 0);
    }
    cp_async_commit();
    u32 pa0[2], pa2[2];
    int rs = 0;
    float r = 1.0f, c = 0.0f;
    if (active) {
      if (FAST) {
        if (half)
          unit_softmax_fast<D, 4>(st, s, ntok, s_k, s_v, p.softmax_scale, ex, lane, pa0, pa2, rs, r, c);
        else
          unit_softmax_fast<D, 8>(st, s, ntok, s_k, s_v, p.softmax_scale, ex, lane, pa0, pa2, rs, r, c);
      } else if (half) {
        unit_softmax<D, 4>(st, s, ntok, s_k, s_v, p.softmax_scale, ex, lane, pa0, pa2, rs, r, c);
      } else {
        unit_softmax<D, 8>(st, s, ntok, s_k, s_v, p.softmax_scale, ex, lane, pa0, pa2, rs, r, c);
      }
    }
    // pending: V of this tile, K of the next
    cp_async_wait<1>();
    syncwarp();
    if (BRANCHES && active) {
      if (half) {
        if (fold) {
          if (four)
            unit_pv_half<D, kPvFolded4>(st, stages, vbuf, ntok, g, t, pa0, pa2, rs, r, c);
          else
            unit_pv_half<D, kPvFolded2>(st, stages, vbuf, ntok, g, t, pa0, pa2, rs, r, c);
        } else if (compressed) {
          if (four)
            unit_pv_half<D, kPvClamp4>(st, stages, vbuf, ntok, g, t, pa0, pa2, rs, r, c);
          else
            unit_pv_half<D, kPvClamp2>(st, stages, vbuf, ntok, g, t, pa0, pa2, rs, r, c);
        } else if (FERRATTN_TURBO_DECODE_BUFFER_CALL) {
          unit_pv_half_buffer_call<D>(st, vbuf, ntok, g, t, pa0, pa2, rs, r, c);
        } else {
          unit_pv_half<D, kPvBuffer>(st, stages, vbuf, ntok, g, t, pa0, pa2, rs, r, c);
        }
      } else {
        if (fold) {
          if (four)
            unit_pv_folded<D, 4>(st, stages, g, t, pa0, pa2, rs, r, c);
          else
            unit_pv_folded<D, 2>(st, stages, g, t, pa0, pa2, rs, r, c);
        } else if (compressed) {
          if (four)
            unit_pv_compressed<D, 4, true>(st, stages, g, t, pa0, pa2, rs, r, c);
          else
            unit_pv_compressed<D, 2, true>(st, stages, g, t, pa0, pa2, rs, r, c);
        } else {
          unit_pv_buffer<D>(st, vbuf, ntok, g, t, pa0, pa2, rs, r, c);
        }
      }
    } else if (!BRANCHES && active) {
      if (half) {
        switch (variant) {
          case 0: unit_pv_half<D, kPvClamp4>(st, stages, vbuf, ntok, g, t, pa0, pa2, rs, r, c); break;
          case 1: unit_pv_half<D, kPvFolded4>(st, stages, vbuf, ntok, g, t, pa0, pa2, rs, r, c); break;
          case 2: unit_pv_half<D, kPvClamp2>(st, stages, vbuf, ntok, g, t, pa0, pa2, rs, r, c); break;
          case 3: unit_pv_half<D, kPvFolded2>(st, stages, vbuf, ntok, g, t, pa0, pa2, rs, r, c); break;
          default: unit_pv_half<D, kPvBuffer>(st, stages, vbuf, ntok, g, t, pa0, pa2, rs, r, c);
        }
      } else {
        switch (variant) {
          case 0: unit_pv_compressed<D, 4, true>(st, stages, g, t, pa0, pa2, rs, r, c); break;
          case 1: unit_pv_folded<D, 4>(st, stages, g, t, pa0, pa2, rs, r, c); break;
          case 2: unit_pv_compressed<D, 2, true>(st, stages, g, t, pa0, pa2, rs, r, c); break;
          case 3: unit_pv_folded<D, 2>(st, stages, g, t, pa0, pa2, rs, r, c); break;
          default: unit_pv_buffer<D>(st, vbuf, ntok, g, t, pa0, pa2, rs, r, c);
        }
      }
    }
    if (qt >= 0 && seg_last) {
      // the segment's partial
      const int rows = BRANCHES ? min(kUnitRows, p.group - qg * kUnitRows) : rows_tile;
      if (!half) {
        // row g, channels 2 VCH t + VCH e + nt
        if (g < rows) {
          float* po = p.part_o + ((u64)slot * kUnitRows + g) * D + 2 * VCH * t;
#pragma unroll
          for (int i = 0; i < VCH; i += 4) {
            *reinterpret_cast<float4*>(po + i) = make_float4(st.o[i][0], st.o[i + 1][0], st.o[i + 2][0], st.o[i + 3][0]);
            *reinterpret_cast<float4*>(po + VCH + i) =
                make_float4(st.o[i][1], st.o[i + 1][1], st.o[i + 2][1], st.o[i + 3][1]);
          }
        }
      } else {
        // unit_pv_half's layout: rows 2 (t & 1) + e, channels VCH g + MT (t >> 1) + 2 m + j / 2
        constexpr int MT = VCH / 2;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int row = 2 * (t & 1) + e;
          if (row < rows) {
            float* po = p.part_o + ((u64)slot * kUnitRows + row) * D + VCH * g + MT * (t >> 1);
#pragma unroll
            for (int q4 = 0; q4 < MT; q4 += 4) {
              float v[4];
#pragma unroll
              for (int k = 0; k < 4; ++k) {
                const int chl = q4 + k, f = 4 * (chl >> 1) + 2 * (chl & 1) + e;
                v[k] = st.o[f >> 1][f & 1];
              }
              *reinterpret_cast<float4*>(po + q4) = make_float4(v[0], v[1], v[2], v[3]);
            }
          }
        }
      }
      if (t == 0 && g < (half ? 4 : kUnitRows) && g < rows)
        *reinterpret_cast<float2*>(p.part_ml + ((u64)slot * kUnitRows + g) * 2) = make_float2(st.m, st.l);
    }
    if (seg_last) ++slot;
    cur = nxt;  // advanced once, before K of the next tile was issued
    syncwarp();  // every lane is done with the V half before it is refilled
    if (it + 1 < end) issue(nxt, 1);
    cp_async_commit();
  }
  cp_async_wait<0>();
}

// Merges the partials of one row of an output tile (grid: tiles x min(kUnitRows, group), one
// warp a CTA: kCombineThreads) in slot order and writes O and LSE. One partial is finished
// exactly as the emulation finishes a row (RowState::finish).
//
// The merge is the serial fold of decode_twin, `x = fma(x_s, r2_s, x r1_s)` in slot order, but
// only its two dependent operations per slot stay serial: the rescale factors depend on the
// running maximum alone, which is a max scan over the slots (exact in any order: no NaN, and no
// -0 reaches a logit maximum), so r1_s = EXP(M_{s-1} - M_s) and r2_s = EXP(m_s - M_s) are
// computed one slot per lane, 32 slots at a time (the next 32 slots' (m, l) loaded while these
// are folded), and the partials' O columns (D / 32 channels a lane) are loaded eight slots ahead
// of the fold. One warp a row and no CTA barrier after the LUT: the combine is a chain of
// dependent loads per row, and at 64 sequences x 8 KV heads (512 tiles) a 128-thread CTA a row
// took two waves of the GPU and three barriers a chunk (issue 11, docs/TURBO_CUDA.md).
__device__ __forceinline__ float shfl_up_f(float v, int d) {
  float r;
  asm volatile("shfl.sync.up.b32 %0, %1, %2, 0x0, 0xffffffff;" : "=f"(r) : "f"(v), "r"(d));
  return r;
}
template <class T, int D>
__device__ __forceinline__ void combine_body(const DecodeParams& p) {
  static_assert(D % 32 == 0, "D / 32 channels a lane");
  constexpr int CPL = D / 32;
  constexpr int kAhead = 8;  // slots of partial O loaded ahead of the fold
  __shared__ float sLut[17];
  sas_lut_init(sLut);
  __syncthreads();
  pdl_wait();  // the decode's partials: nothing is read from memory before this
  const Exp ex{sLut, (float)p.sas_nr, p.sas};
  const int tile = blockIdx.x;
  const int tiles_per_seq = p.heads_kv * p.qgroups;
  const int b = tile / tiles_per_seq, rt = tile % tiles_per_seq;
  const int qt = p.q_tok[b];
  if (qt < 0) return;  // uniform over the CTA
  const int hk = rt / p.qgroups, qg = rt % p.qgroups;
  const int rows = min(kUnitRows, p.group - qg * kUnitRows);
  const int h0 = hk * p.group + qg * kUnitRows;
  const u32 s0 = p.tile_slot[tile], s1 = p.tile_slot[tile + 1];
  const int r = blockIdx.y;  // one CTA (one warp) per query row of the tile
  if (r >= rows) return;     // uniform over the CTA
  const int lane = threadIdx.x & 31;
  auto load_ml = [&](u32 slot) {
    return slot < s1 ? *reinterpret_cast<const float2*>(p.part_ml + ((u64)slot * kUnitRows + r) * 2)
                     : make_float2(neg_inf(), 0.0f);
  };
  auto part_o = [&](u32 slot) { return p.part_o + ((u64)slot * kUnitRows + r) * D + lane; };
  float m_run = neg_inf();  // maximum over the partials of earlier chunks
  float l = 0.0f, a[CPL];
#pragma unroll
  for (int k = 0; k < CPL; ++k) a[k] = 0.0f;
  float2 ml_next = load_ml(s0 + lane);
  for (u32 base = s0; base < s1; base += 32) {
    const int n = (int)min(32u, s1 - base);
    const float ms = ml_next.x, ls = ml_next.y;  // slot base + lane (-inf past the tile's)
    ml_next = load_ml(base + 32 + lane);
    float v[kAhead][CPL];
#pragma unroll
    for (int j = 0; j < kAhead; ++j)
#pragma unroll
      for (int k = 0; k < CPL; ++k) v[j][k] = j < n ? part_o(base + j)[32 * k] : 0.0f;
    float inc = ms;  // inclusive max scan over the chunk's slots
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = shfl_up_f(inc, o);
      if (lane >= o) inc = fmax2(inc, y);
    }
    float excl = shfl_up_f(inc, 1);
    if (lane == 0) excl = neg_inf();
    const float prev = fmax2(m_run, excl);  // the running maximum before this slot
    const float mn = fmax2(prev, ms);
    // 0: no key (skipped), 1: the first partial (taken as is), 2: merged
    const int kind = ms == neg_inf() ? 0 : (prev == neg_inf() ? 1 : 2);
    const float r1 = kind == 2 ? ex.rescale(prev, mn) : 0.0f;
    const float r2 = kind == 2 ? ex.rescale(ms, mn) : 0.0f;
    m_run = fmax2(m_run, shfl_idx_f(inc, 31));
    for (int i = 0; i < n; i += kAhead) {
      if (i > 0) {
#pragma unroll
        for (int j = 0; j < kAhead; ++j)
#pragma unroll
          for (int k = 0; k < CPL; ++k) v[j][k] = i + j < n ? part_o(base + i + j)[32 * k] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kAhead; ++j) {
        const int src = min(i + j, 31);
        const int kd = shfl_idx_i(kind, src);
        const float sl = shfl_idx_f(ls, src), f1 = shfl_idx_f(r1, src), f2 = shfl_idx_f(r2, src);
        if (i + j < n) {
          if (kd == 1) {
#pragma unroll
            for (int k = 0; k < CPL; ++k) a[k] = v[j][k];
            l = sl;
          } else if (kd == 2) {
            l = fma_rn(sl, f2, mul_rn(l, f1));
#pragma unroll
            for (int k = 0; k < CPL; ++k) a[k] = fma_rn(v[j][k], f2, mul_rn(a[k], f1));
          }
        }
      }
    }
  }
  const float m = m_run;
  const bool empty = m == neg_inf() || l == 0.0f;
  const int h = h0 + r;
  u16* o = p.o + ((u64)(b * p.max_sq + qt) * p.heads_q + h) * D + lane;
#pragma unroll
  for (int k = 0; k < CPL; ++k) o[32 * k] = T::from_f32(empty ? 0.0f : div_rn(a[k], l));
  if (lane == 0) p.lse[((u64)b * p.heads_q + h) * p.max_sq + qt] = empty ? neg_inf() : add_rn(m, logf(l));
}

// One token into the INT8 buffer of every (sequence, KV head) that takes one (section 3.3):
// the universal scale is fixed by the first token with non-zero values, later tokens clamp.
template <class T, int D>
__device__ __forceinline__ void append_body(const AppendParams& p) {
  __shared__ float red[kThreads / 32];
  const int hk = blockIdx.x, b = blockIdx.y;
  const int tok = p.src_tok[b];
  if (tok < 0) return;
  const int slot = p.lens[b] % kBlock;
  const u64 bh = (u64)b * p.heads_kv + hk;
  for (int which = 0; which < 2; ++which) {
    const CacheView& cv = which ? p.cache.v : p.cache.k;
    const u16* src = (which ? p.v : p.k) + ((u64)(b * p.src_len + tok) * p.heads_kv + hk) * D;
    const float x = threadIdx.x < D ? T::to_f32(src[threadIdx.x]) : 0.0f;
    float s = cv.buf_scale[bh];
    if (s == 0.0f) {
      const float fresh = int8_scale(block_max(fabsf(x), red));
      if (fresh > 0.0f) {
        s = fresh;
        if (threadIdx.x == 0) cv.buf_scale[bh] = s;
      }
    }
    if (threadIdx.x < D) cv.buf[(bh * kBlock + slot) * D + threadIdx.x] = (signed char)quantize_int8(x, s);
  }
}

// A full buffer becomes compressed block `blocks[i]` of sequence `seqs[i]`, its INT8 codes
// compressed as they are under the universal scale (no re-quantization, section 3.3).
template <int D>
__device__ __forceinline__ void flush_body(const FlushParams& p) {
  __shared__ alignas(16) i8 sx[kBlock * D];
  __shared__ alignas(16) u8 spar[2 * D];
  const int hk = blockIdx.x, i = blockIdx.y;
  const int b = p.seqs[i], j = p.blocks[i];
  const u64 bh = (u64)b * p.heads_kv + hk;
  const int bits = p.cache.head_bits[hk];
  for (int which = 0; which < 2; ++which) {
    const CacheView& cv = which ? p.cache.v : p.cache.k;
    for (int k = threadIdx.x; k < kBlock * D / 16; k += kThreads)
      reinterpret_cast<Vec16*>(sx)[k] = reinterpret_cast<const Vec16*>(cv.buf + bh * kBlock * D)[k];
    __syncthreads();
    u8* codes = cv.codes + (u64)b * p.cache.seq_code_bytes + p.cache.head_off[hk] + (u64)j * block_bytes(D, bits);
    const u64 pb = bh * p.cache.cap_blocks + j;
    compress_block<D>(sx, spar, bits, codes, cv.par + pb * 2 * D, cv.clamp + pb);
    if (threadIdx.x == 0) cv.bscale[pb] = cv.buf_scale[bh];
    __syncthreads();
  }
}

}  // namespace turbo
}  // namespace ferrattn

// ---- Instances: the closed list of (dtype, head dim) -> kernel (ferrattn_cuda::kernels) --------
// Minimum resident CTAs per SM of the decode instances (the register cap: 65536 / (128 x
// blocks), 168 registers at 3); shared memory (35 KB per CTA at d 128) would allow 6. Measured on
// an H100 at 16 x 16k INT4 through NVRTC (docs/TURBO_CUDA.md, "Decode: combine, staging, g4"):
// g4 at 3 / 4 / 5 blocks 154 / 180 / 238 us (ptxas spills 128 / 520 / 948 bytes), full rows at
// 2 / 3 / 4 blocks 167 / 167 / 218 us: more warps do not pay for the spills. Override with -D
// (FERRATTN_NVRTC_DEFINES for the NVRTC path) to time other values.
#ifndef FERRATTN_TURBO_DECODE_BLOCKS
#define FERRATTN_TURBO_DECODE_BLOCKS 3
#endif
#ifndef FERRATTN_TURBO_DECODE_G4_BLOCKS
#define FERRATTN_TURBO_DECODE_G4_BLOCKS 3
#endif
#define FERRATTN_TURBO_DECODE(TN, T, D)                                                       \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads, FERRATTN_TURBO_DECODE_BLOCKS) \
      turbo_decode_##TN##_d##D(const ferrattn::turbo::DecodeParams p) {                      \
    ferrattn::turbo::decode_body<ferrattn::T, D, false, false>(p);                           \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads, FERRATTN_TURBO_DECODE_G4_BLOCKS) \
      turbo_decode_g4_##TN##_d##D(const ferrattn::turbo::DecodeParams p) {                   \
    ferrattn::turbo::decode_body<ferrattn::T, D, true, false>(p);                            \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads, FERRATTN_TURBO_DECODE_BLOCKS) \
      turbo_decode_fast_##TN##_d##D(const ferrattn::turbo::DecodeParams p) {                 \
    ferrattn::turbo::decode_body<ferrattn::T, D, false, true>(p);                            \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads, FERRATTN_TURBO_DECODE_G4_BLOCKS) \
      turbo_decode_g4_fast_##TN##_d##D(const ferrattn::turbo::DecodeParams p) {              \
    ferrattn::turbo::decode_body<ferrattn::T, D, true, true>(p);                             \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads, FERRATTN_TURBO_DECODE_G4_BLOCKS) \
      turbo_decode_g4_fast_mixed_##TN##_d##D(const ferrattn::turbo::DecodeParams p) {        \
    ferrattn::turbo::decode_body<ferrattn::T, D, true, true, true>(p);                       \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kCombineThreads)                    \
      turbo_combine_##TN##_d##D(const ferrattn::turbo::DecodeParams p) {                     \
    ferrattn::turbo::combine_body<ferrattn::T, D>(p);                                        \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads)                    \
      turbo_append_##TN##_d##D(const ferrattn::turbo::AppendParams p) {                      \
    ferrattn::turbo::append_body<ferrattn::T, D>(p);                                         \
  }

FERRATTN_TURBO_DECODE(f16, F16, 64)
FERRATTN_TURBO_DECODE(f16, F16, 128)
FERRATTN_TURBO_DECODE(bf16, BF16, 64)
FERRATTN_TURBO_DECODE(bf16, BF16, 128)

extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads) turbo_flush_d64(const ferrattn::turbo::FlushParams p) {
  ferrattn::turbo::flush_body<64>(p);
}
extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads) turbo_flush_d128(const ferrattn::turbo::FlushParams p) {
  ferrattn::turbo::flush_body<128>(p);
}
