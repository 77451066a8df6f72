// Fused TurboQuant decode over the compressed KV cache (the fused kernel of
// shared/papers/turboquant-fused-attention-kernels.txt, "Fused Attention Kernel"; contract:
// ferrattn_core::turboquant::attention), split over the KV length with LeanAttention's stream-K
// schedule (ferrattn_core::lean) and merged by a second kernel.
//
// Three launches per step (graph-capturable: no host work between them). On sm_90 the decode
// and the merge are launched with programmatic stream serialization (see pdl_wait): their CTAs
// become resident under the kernel before and wait on the device, so the launch gaps overlap.
//   1. turboquant_prepare_q_*: every query row rotated (Π q) and projected (S q) once, scaled by
//      softmax_scale · log2 e (and √(π/2)/m for S q), rounded to f16 and written straight in the
//      A-fragment order of mma.m16n8k16: the units load their query tile with 16-byte loads
//      (with <= 8 rows once per CTA and tile into shared slots, see decode_unit).
//      Two kernels with bit-identical outputs (ferrattn_cuda::turboquant::PrepareKernel): up to
//      8 output tiles the spread one, one CTA per (output tile, 8 output columns); above, v1,
//      one CTA per (output tile, 32 output columns). Both split the head dim in four k-quarters
//      reduced through shared memory in the same order, Πᵀ and Sᵀ read from L2 (no staging of
//      the whole matrix: at batch 1 the 8 tiles would otherwise serialise on 128 KiB each).
//   2. turboquant_decode_*: one warp per *unit* of the stream-K schedule. An output tile is the
//      16 MMA rows of one (sequence, KV head): the GQA group's query heads times the query
//      tokens (rows r = head_in_group · max_sq + i), so every K/V byte is read once for all of
//      them. Per 16 tokens:
//        S  = (Π q) · c[idx]ᵀ           mma.m16n8k16, K as the B operand (centroids, f16)
//        T  = (S q) · signsᵀ            mma.m16n8k16, signs as ±1 f16 (QJL keys only); with at
//                                       most 8 rows, two k-chunks of S q stacked on MMA rows
//                                       0-7 and 8-15 (two chains, summed in the softmax)
//        s  = ‖k‖ S + ‖r‖ T             (base 2: the scales were folded into the queries)
//        online softmax in base 2 (exp2 of s - m, running max and sum per row)
//        O_rot += (p ‖v‖) · c[idx_v]    mma.m16n8k16, P from the S accumulators, V as B; with at
//                                       most 8 rows in use transposed, O_rotᵀ += Vᵀ · Pᵀ (V as A,
//                                       the rows as N: half the MMAs, no MMA row wasted)
//      O is accumulated in the rotated basis: Π_vᵀ Σ_j p_j ‖v_j‖ c[idx_j] = Σ_j p_j v̂_j, so Πᵀ is
//      applied once per output row (in the merge) instead of once per value tile.
//      Software-pipelined: a loop iteration runs the score MMAs of stage t + 1 beside the P·V
//      MMAs of stage t (two independent chains per warp), then the softmax of stage t + 1; at
//      D = 128 with crumb values the P·V sits beside that softmax instead (kLateV).
//      Bytes in flight: each warp streams its 16-token stages through a private ring of
//      kStages stages in shared memory filled by cp.async (the whole ring issued at the
//      segment's start, at D = 128 the first segment's before the wait on the prepare; a
//      stage's slot refilled once its P·V has read its codes). Every lane copies its own code
//      bytes (its B fragments); a stage's signs and norms are copied as whole 16-byte chunks by
//      the first lanes (one cp.async each), so every cp.async.wait_group is followed by a
//      __syncwarp.
//      Codes are unpacked in registers, never looked up in shared memory: one nibble per
//      coordinate, laid out so that one lane's bytes are exactly its B fragments (see
//      turboquant_compress.cu); `prmt` with the nibbles as selectors looks four centroids up in
//      byte tables held in registers (low bytes and high bytes of the f16 centroids) and two more
//      `prmt` interleave them into two f16x2 operands. Sign bits enter the T MMA as mantissa
//      bits of 1.0 (one LOP3 a pair, one shift per 4 pairs; S q pre-scaled and T started at a
//      per-row constant: see signs2m). Stages below every live row's end skip the masking.
//      Codes of at most 2 bits are stored as crumbs (4 a byte; KC, VC): a crumb word is two
//      nibble words folded (crumb_at unfolds them with two LOP3 and a shift), then as above.
//      The _r8f kernels (opt-in: ferrattn_cuda::turboquant::TurboQuantCuda::fused_merge_for)
//      run step 3 themselves (fused_merge): the CTA that completes a tile merges it, bit for bit
//      as the merge kernel would, and no merge kernel is launched. Measured 2.5x slower at
//      batch 1 (one CTA of 7 warps merges what the merge kernel spreads over 64 warps).
//   3. turboquant_combine_* (8 warps; turboquant_combine_w16_* with 16 at small batch): per
//      output row, the unit partials (O_rot, m, l) merged in two
//      passes (the row's max over every partial, then independent weighted sums over the CTA's
//      warps, several partials in flight per warp: Lean's reduction, in a different
//      association), O = Πᵀ (O_rot / l), LSE = (m + log2 l) ln 2. At small batch a tile's rows
//      go to separate CTAs (row_split), so that batch 1 is not 8 CTAs walking ~100 partials each.
#include "common.cuh"

namespace ferrattn {
namespace tq {

constexpr int kUnitWarps16 = 4;   // warps (units) per CTA of the decode kernels with 16 rows; with
                                  // <= 8 rows the launch's (blockDim.x / 32, at most kMaxUnitWarps8:
                                  // ferrattn_cuda::turboquant::unit_warps)
constexpr int kMaxUnitWarps8 = 7;
constexpr int kMaxRegs8 = 144;    // registers of the <= 8-row kernels: 7-warp CTAs fit 2 per SM
                                  // (128, 4 CTAs of 4 warps per SM, measured slower:
                                  // issue-10-decode6 call 1)
static_assert(2 * kMaxUnitWarps8 * 32 * kMaxRegs8 <= 65536, "two 7-warp CTAs per SM (registers)");
constexpr int kRows = 16;         // MMA rows of an output tile
constexpr int kTileK = 16;        // tokens per iteration
constexpr int kStages = 3;        // cp.async ring of each warp: stages in flight + the one computed
constexpr int kSlots = 4;         // 16-byte code slots per lane and stage (see Stage)
constexpr int kSmallBytes = 512;  // a stage's sign and norm bytes after its code slots (<= 352 used)
constexpr int kStageBytes = kSlots * 32 * 16 + kSmallBytes;  // 2560
constexpr int kStageU4 = kStageBytes / 16;
constexpr int kCombineWarps = 8;  // warps of a merge CTA (turboquant_combine_d*; the _w16 ones: 16)

// Mirrors ferrattn_cuda::turboquant::DecodeParams (#[repr(C)]).
struct DecodeParams {
  const u32* qf;                  // [tiles][32][D/16][4] f16x2: Π q · scale log2 e, rounded
  const u32* qf_lo;               // the same layout: what the rounding left (q = hi + lo)
  const u32* pf;                  // [tiles][32][D/16][4] f16x2: S q · scale log2 e √(π/2)/m
  const unsigned char* kcodes;    // [B][Hk][cap][D/2] (crumbs, KC: [D/4])
  const unsigned char* ksigns;    // [B][Hk][cap][D/8]
  const u32* knorms;              // [B][Hk][cap] f16x2 {‖k‖, ‖r‖}
  const unsigned char* vcodes;    // [B][Hk][cap/2][D] (crumbs, VC: [D/2])
  const u16* vnorms;              // [B][Hk][cap] f16
  const int* segs;                // [segments][4]: tile, first token, end token, 0
  const int* unit_segs;           // [units + 1] first segment of each unit
  float* part_o;                  // [segments][16][D]
  float* part_ml;                 // [segments][16][2] (m, l), m in log2 units
  const int* seqlens_q;           // [B]
  const int* seqlens_k;           // [B]
  int units, heads_kv, cap, qgroups, group, max_sq, causal;
  int diag;                       // diagnostic switches: bit 0, the first segment's ring after
                                  // pdl_wait (FERRATTN_TQ_EARLY=0); bit 1, <= 8 rows: every warp
                                  // loads its query fragments per segment (FERRATTN_TQ_SHARE_Q=0);
                                  // bit 2, <= 8 rows: the partial as scalar stores, not through
                                  // the ring (FERRATTN_TQ_RING_O=0)
  u32 ktab[8];                    // σ_k x key centroids (f16): low bytes of entries 0-15, then high
                                  // bytes; 1 / σ_k is folded into the query scale
  u32 vtab[8];                    // σ_v x value centroids, same; 1 / σ_v is applied in the merge
  // The merge fused into the decode (the turboquant_decode_*_r8f kernels only, see fused_merge):
  // the CTA that writes a tile's last segments merges the tile as turboquant_combine_* would,
  // and no merge kernel is launched.  Read by nothing else.
  const int* tile_segs;           // [tiles + 1] first segment of each output tile
  int* counts;                    // [tiles] segments of the tile written so far: zero between
                                  // launches (uploaded as zeros; the merging CTA resets its tile's)
  const float* pi;                // [D][D] Π
  u16* o;                         // [B, max_sq, Hq, D] f16
  float* lse;                     // [B, Hq, max_sq]
  int heads_q;
  int merge_warps;                // the association of the merge kernel it replaces (8 or 16 warps)
  float oscale;                   // 1 / σ_v
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
  int row_split;  // CTAs per output tile: CTA part takes rows part, part + row_split, ...
  float oscale;  // 1 / σ_v: the value table holds σ_v c (ferrattn_cuda::turboquant::f16_friendly_scale)
};

// Programmatic dependent launch (sm_90; the host sets the launch attribute only there, and
// without it both instructions are no-ops). The prepare, the decode and the merge are launched so
// that their CTAs may become resident while the kernel before them runs (its launch latency and
// theirs overlap). `pdl_wait` returns once the kernel before has completed and its writes are
// visible. The prepare (issue-10-decode4; FERRATTN_TQ_PREPARE_PDL=0: plain stream order) follows
// an unknown kernel (the caller's, an append, the previous step's merge): before its wait it reads
// only Πᵀ / Sᵀ (the engine's, through L2), and it lets the decode be scheduled only after its
// wait, so that everything before the prepare is complete when the decode's CTAs start (the
// decode reads the cache and the tables before its own wait, below).
// In the first GPU call of PDL (2026-11-26, issue-10-decode) the decode issued its schedule-table
// reads and first ring copies (cp.async.ca of norms and signs, through L1) before the wait, and
// gpu_turboquant and the device API tests failed intermittently (wrong O and LSE; the sanitizer
// grid was clean). Consistent with L1 lines left by earlier kernels being read before the wait
// (the cause was not isolated). The rule since issue-10-decode3: before the wait, only data older
// than the kernel before (the prepare signals the decode after its own wait, so the cache, the
// host's tables and Π are complete when the decode and the merge start), and only through L2
// (ld.global.cg, cp.async.cg): never an L1-cached load. The prepare's and the decode's outputs
// are read after the wait.
// (pdl_wait and pdl_launch_dependents: common.cuh.)

constexpr int INT_MAX_ = 0x7fffffff;
// max of two floats in one instruction (max.f32; fmax2's compare and select take two). They
// differ only where an operand is NaN (max.f32 returns the other); the scores are finite or -inf.
__device__ __forceinline__ float fmax1(float a, float b) {
  float r;
  asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// the least v over the warp (uniform result)
__device__ __forceinline__ int warp_min(int v) {
  int r;
  asm volatile("redux.sync.min.s32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
  return r;
}
template <bool B>
struct MaskTag {
  static constexpr bool value = B;
};
using Masked = MaskTag<true>;
using Unmasked = MaskTag<false>;

// v of lane `src` (whole warp)
__device__ __forceinline__ float shfl_idx(float v, int src) {
  float r;
  asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(src));
  return r;
}

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

// QJL sign pairs as f16 mantissas (issue-10-decode5). A ±1 pair costs a shift and a LOP3 per
// pair (jj and jj + 16 moved to bits 15 and 31, then xor -1); here the pair jj's bits stay ±1
// only in the algebra: B = 1 + b · 2^(p - 10) with b ∈ {0, 1} the stored sign bit (1 = +1) masked
// into mantissa bit p of 1.0 (f16 0x3C00), one LOP3 `(w & m) | 0x3C003C00`, and the 4 pairs of
// a k32 group (jj = 4G .. 4G + 3, the pairs of MMA chunks 2G and 2G + 1) share one shift that
// puts them at mantissa bits 6-9 (p = 6 + jj % 4; 22-25 in the high half). With the A entry of
// coordinate i scaled by M_i = 2^(11 - p_i) (32, 16, 8, 4: exact in f16 barring overflow, see
// qjl_scale), Σ_i a_i B_i = Σ_i M_i Sq_i + 2 Σ_i Sq_i b_i, so
//   T = Σ_i Sq_i (2 b_i - 1) = Σ_i a_i B_i - C,  C = Σ_i Sq_i (1 + M_i)  (per MMA row),
// and the T accumulators start at -C (computed once per segment from the same f16 Sq_i).
// Per 16 tokens and lane: 8 shifts + 32 LOP3 for the 32 pairs instead of 64 instructions.
// The host twin (turboquant::twin::decode) computes T this way too.
// `one` is 0x3C003C00 held in a register (kOnePair: a variable, never written, so that the
// compiler cannot fold it back into an immediate: with one immediate mask, one LOP3 does it).
__device__ u32 kOnePair = 0x3C003C00u;
// the sign word moved so that pair 4G's bits (4G, 4G + 16) sit at mantissa bits 6 and 22
template <int G>
__device__ __forceinline__ u32 sign_group(u32 w) {
  if constexpr (4 * G <= 6) {
    return w << (6 - 4 * G);
  } else {
    return w >> (4 * G - 6);
  }
}
__device__ __forceinline__ u32 sign_group_rt(u32 w, int G) {
  return G == 0 ? sign_group<0>(w) : G == 1 ? sign_group<1>(w) : G == 2 ? sign_group<2>(w) : sign_group<3>(w);
}
// pair 4G + k of a sign_group word: f16x2 (1 + b_lo 2^(k - 4), 1 + b_hi 2^(k - 4))
__device__ __forceinline__ u32 signs2m(u32 sh, int k, u32 one) { return (sh & (0x00400040u << k)) | one; }
// The A-fragment scale of chunk c's registers 0, 1 (k = 2q, 2q + 1: pair 2c, p = 6 + 2 (c & 1))
// and 2, 3 (k = 2q + 8, ..: pair 2c + 1): M = 2^(11 - p) as an f16x2 multiplier.
__device__ __forceinline__ u32 qjl_scale(int c, int reg) {
  const int e = 5 - 2 * (c & 1) - (reg >> 1);  // log2 M
  const u32 h = (u32)(15 + e) << 10;           // f16 2^e
  return h | (h << 16);
}
// d = A B + c (f16 inputs, f32 accumulators) with c a separate operand: a loop-invariant start
// value costs no moves into the accumulators
__device__ __forceinline__ void mma16816_c(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1, const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
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
// Through L2 only (never L1): for what is read before pdl_wait (see there)
__device__ __forceinline__ int ldcg_s32(const int* p) {
  int v;
  asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ int4 ldcg_s32x4(const int* p) {
  int4 v;
  asm volatile("ld.global.cg.v4.s32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ float ldcg_f32(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 ldcg_f32x4(const float* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ u32 ldg2(const void* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// cp.async of N bytes (4, 8 or 16) to a shared-window address, through L1 for the small ones
// (.cg takes 16 bytes only). The ring's destinations are 32-bit shared addresses, not generic
// pointers: with generic ones each copy cost a 64-bit cvta and its carries (the refill of a stage
// was 122 SASS instructions for its 10 copies).
template <int N>
__device__ __forceinline__ void cp_async_n(u32 dst, const void* src) {
  if constexpr (N == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(src), "n"(N) : "memory");
  }
}

// A lane's words of one token row (keys) or one token pair (values): D/32 words.
template <int D>
struct Words {
  u32 w[D / 32];
};

// One stage of a warp's ring in shared memory (kStageBytes): kSlots x 32 lanes x 16 bytes of
// codes, slot-major so that the 32 lanes' 16-byte reads of one slot are one conflict-free
// wavefront set, then the stage's small bytes, copied as whole 16-byte chunks by the first
// NCH lanes (one cp.async per lane instead of six 4-8 byte ones):
//   slot 0, 1: K codes of tokens g and g + 8 (lane block q; D/8 bytes)
//   slot 2, 3: V codes of token pairs q and q + 4 (lane block g; D/8 bytes)
//   small:     [16 tokens][D/8] sign bytes (QJL keys only), [16] {‖k‖, ‖r‖}, [16] ‖v‖ — the
//              global rows of the 16 tokens as they are (Small<D, QJL> gives the offsets)
// The small bytes a lane reads were copied by other lanes: a __syncwarp follows every wait.
// Everything a lane loads for one 16-token iteration, read back from its stage.
template <int D>
struct Stage {
  Words<D> k0, k1;  // K codes of tokens g and g + 8 (lane block q)
  Words<D> v0, v1;  // V codes of token pairs q and q + 4 (lane block g)
  u32 s0, s1;       // sign bits of tokens g and g + 8, pair jj's bits at jj and jj + 16
  uint2 kn0, kn1;   // {‖k‖, ‖r‖} of tokens 2q, 2q + 1 and 2q + 8, 2q + 9
  u32 vn0, vn1;     // ‖v‖ of the same tokens
};

// Byte offsets of a stage's small area and the lanes that copy it (16 bytes each).
template <int D, bool QJL>
struct Small {
  static constexpr int kSigns = QJL ? 16 * (D / 8) : 0;  // sign bytes (256 at D = 128)
  static constexpr int kKn = kSigns;                     // 16 x 4 bytes of {‖k‖, ‖r‖}
  static constexpr int kVn = kKn + 64;                   // 16 x 2 bytes of ‖v‖
  static constexpr int kChunks = (kVn + 32) / 16;        // 22 (D = 128, QJL) .. 6 (no QJL)
  static_assert(kVn + 32 <= kSmallBytes && kSmallBytes == 32 * 16, "small area: a chunk per lane");
};

// A lane's source addresses at token 0 of its (sequence, KV head) row: computed once per segment,
// so that a stage costs one offset per stream instead of the whole 64-bit index arithmetic.
struct Bases {
  const unsigned char* kc;  // K codes of token g, lane block q
  const unsigned char* vc;  // V codes of token pair q, lane block g
  const unsigned char* sm;  // this lane's 16-byte chunk of the small bytes at token 0
  u32 sm_stride;            // bytes per token of that chunk's array
};

template <typename T>
__device__ __forceinline__ void opaque(const T*& ptr) {
  asm volatile("" : "+l"(ptr));
}

// KC, VC: key / value codes as crumbs (2 bits a code; ferrattn_cuda::turboquant::layout). A
// stage's crumb codes are one contiguous block (16 key rows of D/4 bytes, 8 value pairs of D/2:
// 4D bytes each), copied as D/8 bytes a lane (lane l's chunk of the block into its entry of the
// slot: one 16-byte cp.async.cg at D = 128) and read back by crumb_at.
template <int D, bool QJL, bool KC, bool VC>
__device__ __forceinline__ Bases bases_of(const DecodeParams& p, size_t row0, int g, int q, int lane) {
  using S = Small<D, QJL>;
  constexpr int NS = S::kSigns / 16;  // sign chunks
  Bases r;
  r.kc = KC ? p.kcodes + row0 * (D / 4) + lane * (D / 8) : p.kcodes + (row0 + g) * (D / 2) + q * (D / 8);
  r.vc = VC ? p.vcodes + (row0 / 2) * (D / 2) + lane * (D / 8) : p.vcodes + (row0 / 2 + q) * D + g * (D / 8);
  // chunk `lane` of the small area: the 16 tokens' signs, then norms (every array's row starts at
  // a multiple of 16 tokens: cap is a multiple of 16, so each chunk is 16-byte aligned). Lanes
  // past the last chunk copy the first {‖k‖, ‖r‖} chunk again, into the unused rest of the area
  // (same addresses as lane NS in the same instruction: no extra traffic, and no branch).
  if (lane < NS) {
    r.sm = p.ksigns + row0 * (D / 8) + 16 * lane, r.sm_stride = D / 8;
  } else if (lane < NS + 4 || lane >= NS + 6) {
    r.sm = reinterpret_cast<const unsigned char*>(p.knorms + row0) + (lane < NS + 4 ? 16 * (lane - NS) : 0);
    r.sm_stride = 4;
  } else {
    r.sm = reinterpret_cast<const unsigned char*>(p.vnorms + row0) + 16 * (lane - NS - 4), r.sm_stride = 2;
  }
  // opaque to the compiler: otherwise it folds the stage's token offset into the whole index
  // expression and recomputes every base (64-bit products and carries) at every refill
  opaque(r.kc), opaque(r.vc), opaque(r.sm);
  return r;
}

// Moves the bases by `tok` tokens (a multiple of 16; value rows hold token pairs)
template <int D, bool KC, bool VC>
__device__ __forceinline__ void advance(Bases& a, int tok) {
  a.kc += tok * (KC ? D / 4 : D / 2), a.vc += (tok / 2) * (VC ? D / 2 : D), a.sm += tok * a.sm_stride;
}

// Issues the copies of the 16 tokens at the bases (a running cursor: a stage costs three pointer
// increments, not its token's index arithmetic) into the stage whose lane-`lane` entry of slot 0
// is at shared address `st` (slot s of that lane at st + 512 s, its chunk of the small area at
// st + 512 kSlots), then moves the bases to the next 16 tokens. At D = 128 every copy is a
// 16-byte cp.async.cg (L2 only).
template <int D, bool QJL, bool KC, bool VC>
__device__ __forceinline__ void issue_stage(Bases& a, u32 st) {
  constexpr int W = D / 8;  // bytes of a lane's words (nibbles), of a lane's chunk (crumbs)
  constexpr u32 kSlot = 32 * 16;
  cp_async_n<W>(st + 0 * kSlot, a.kc);
  if (!KC) cp_async_n<W>(st + 1 * kSlot, a.kc + 8 * (D / 2));
  cp_async_n<W>(st + 2 * kSlot, a.vc);
  if (!VC) cp_async_n<W>(st + 3 * kSlot, a.vc + 4 * D);
  cp_async_n<16>(st + kSlots * kSlot, a.sm);
  advance<D, KC, VC>(a, kTileK);
}

template <int D>
__device__ __forceinline__ Words<D> words_of(uint4 v) {
  Words<D> r;
  if constexpr (D == 128) {
    r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
  } else {
    r.w[0] = v.x, r.w[1] = v.y;
  }
  return r;
}

// Crumb words (D/64 of them: D/16 bytes at byte b of a slot's contiguous crumb block, as
// issue_stage copied it: chunk b / (D/8) at 16 bytes a lane) as the D/32 nibble words the nibble
// path reads: crumb word j holds nibble word 2j in bits 0-1 of every nibble, 2j + 1 in bits 2-3
// (one LOP3, one shift and one LOP3 a crumb word; layout.rs: nibble_words_of_crumb_word).
template <int D>
__device__ __forceinline__ Words<D> crumb_at(const unsigned char* slot, int b) {
  const unsigned char* at = slot + 16 * (b / (D / 8)) + b % (D / 8);
  Words<D> r;
  if constexpr (D == 128) {
    const uint2 x = *reinterpret_cast<const uint2*>(at);
    r.w[0] = x.x & 0x33333333u, r.w[1] = (x.x >> 2) & 0x33333333u;
    r.w[2] = x.y & 0x33333333u, r.w[3] = (x.y >> 2) & 0x33333333u;
  } else {
    const u32 x = *reinterpret_cast<const u32*>(at);
    r.w[0] = x & 0x33333333u, r.w[1] = (x >> 2) & 0x33333333u;
  }
  return r;
}

// D = 64: the lane's two sign bytes out of the aligned word, spread to bits 0-7 and 16-23
template <int D>
__device__ __forceinline__ u32 signs_of(u32 w, int q) {
  if constexpr (D == 128) {
    return w;
  } else {
    const u32 h = (w >> (16 * (q & 1))) & 0xffffu;
    return (h & 0xffu) | ((h & 0xff00u) << 8);
  }
}

// The key half of a stage (K codes, signs, both norms) and its value half (V codes). `st` is
// the stage's first uint4; the small bytes were copied by other lanes (see Stage).
template <int D, bool QJL, bool KC>
__device__ __forceinline__ void read_keys(const uint4* st, int lane, int q, Stage<D>& r) {
  using S = Small<D, QJL>;
  if constexpr (KC) {
    // token g's lane block q (rows of D/4 bytes), token g + 8's
    const unsigned char* s0 = reinterpret_cast<const unsigned char*>(st);
    r.k0 = crumb_at<D>(s0, (lane >> 2) * (D / 4) + q * (D / 16));
    r.k1 = crumb_at<D>(s0, ((lane >> 2) + 8) * (D / 4) + q * (D / 16));
  } else {
    r.k0 = words_of<D>(st[0 * 32 + lane]);
    r.k1 = words_of<D>(st[1 * 32 + lane]);
  }
  const unsigned char* sb = reinterpret_cast<const unsigned char*>(st + kSlots * 32);
  if (QJL) {
    // D = 128: the word of lane block q of tokens g, g + 8 (16 bytes a token): 4 lane, 128 + 4 lane;
    // D = 64: the aligned word holding the lane's 2 bytes (8 bytes a token)
    const int at = D == 128 ? 4 * lane : (lane >> 2) * 8 + ((lane & 3) >> 1) * 4;
    r.s0 = signs_of<D>(*reinterpret_cast<const u32*>(sb + at), q);
    r.s1 = signs_of<D>(*reinterpret_cast<const u32*>(sb + 8 * (D / 8) + at), q);
  }
  r.kn0 = *reinterpret_cast<const uint2*>(sb + S::kKn + 8 * q);
  r.kn1 = *reinterpret_cast<const uint2*>(sb + S::kKn + 32 + 8 * q);
  r.vn0 = *reinterpret_cast<const u32*>(sb + S::kVn + 4 * q);
  r.vn1 = *reinterpret_cast<const u32*>(sb + S::kVn + 16 + 4 * q);
}
template <int D, bool VC>
__device__ __forceinline__ void read_values(const uint4* st, int lane, Stage<D>& r) {
  if constexpr (VC) {
    // pair q's lane block g (records of D/2 bytes), pair q + 4's
    const unsigned char* s2 = reinterpret_cast<const unsigned char*>(st + 2 * 32);
    const int g = lane >> 2, q = lane & 3;
    r.v0 = crumb_at<D>(s2, q * (D / 2) + g * (D / 16));
    r.v1 = crumb_at<D>(s2, (q + 4) * (D / 2) + g * (D / 16));
  } else {
    r.v0 = words_of<D>(st[2 * 32 + lane]);
    r.v1 = words_of<D>(st[3 * 32 + lane]);
  }
}

__device__ __forceinline__ float half_lo(u32 w) { return F16::to_f32((u16)(w & 0xffffu)); }
__device__ __forceinline__ float half_hi(u32 w) { return F16::to_f32((u16)(w >> 16)); }
// Σ over the f16x2 pair w of x (1 + M), M = 2^e, in f32 (every product is exact: 11 + 6 bits)
__device__ __forceinline__ float qjl_const2(u32 w, int e) {
  const float f = 1.f + (float)(1 << e);
  return half_lo(w) * f + half_hi(w) * f;
}

// Visible keys of MMA row r of tile (b, qg): causal bottom-right as AttentionProblem::visible_keys,
// 0 for padding rows.
__device__ __forceinline__ int row_end(const DecodeParams& p, int qg, int r, int sq, int sk) {
  const int R = qg * kRows + r, hl = R / p.max_sq, i = R % p.max_sq;
  if (hl >= p.group || i >= sq) return 0;
  if (!p.causal) return sk;
  return min(max(i + sk - sq + 1, 0), sk);
}

template <int N>
struct IntTag {
  static constexpr int value = N;
};
constexpr int kMergeRows8 = 8;      // rows of an <= 8-row tile's partials (MMA rows 0-7)
constexpr int kMaxMergeWarps = 16;  // the merge kernels' most warps (turboquant_combine_w16_*)

__device__ __forceinline__ float2 ldcg_f32x2(const float* p) {
  float2 v;
  asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}
// *a += v at GPU scope, acquire-release; returns the old value
__device__ __forceinline__ int atom_add_acq_rel(int* a, int v) {
  int r;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(r) : "l"(a), "r"(v) : "memory");
  return r;
}

// The merge fused into the decode (the turboquant_decode_*_r8f kernels: <= 8 rows, 7-warp CTAs
// sized one per SM, ferrattn_cuda::turboquant::small_work_smem_bytes; opt-in). After every warp
// of the CTA has written its segments' partials (a CTA barrier), thread 0 adds, per tile the CTA
// touched, its number of that tile's segments to the tile's counter in the workspace (one
// acq_rel atomic add: release for the CTA's partials, acquire for the others'); the CTA whose add
// completes the tile's count merges the tile, reading every partial through L2, and sets the
// counter back to zero (so the next launch over the workspace, a layer or a
// graph replay, starts from zero; the counters are uploaded as zeros with the step's tables).
// No CTA waits on another: the last one to finish does the work, so nothing depends on which
// CTAs are co-resident.
// Numerics: the merge kernel's (combine<D, W> with W = p.merge_warps, the kernel the host would
// launch for this step) in the same association, so O and LSE are bit-identical to the unfused
// step: pass 2 runs W *virtual* warps (real warp w takes virtual warps w, w + nw, ...), each
// summing segments s0 + v + k W in increasing k with the same fmaf chain, their sums added in
// order v = 0 .. W-1; the un-rotation sums W·32 / (D/4) k-slices of D / KS coordinates each, in
// order. The CTA's shared memory (the rings, free once every warp is past its loop) holds Π
// (copied by cp.async while the two passes run), the virtual warps' sums and O_rot.
template <int D>
__device__ __forceinline__ void fused_merge(const DecodeParams& p, uint4* smem) {
  constexpr int R8 = kMergeRows8;
  constexpr int PER = D / 32;  // coordinates of a partial row per lane
  // the indices read again (volatile): shared with the decode's, they would be held in registers
  // over its loop (measured: 11 more SASS instructions in the loop of d128_kqjl_v8_r8)
  int t, nt, cta;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  asm volatile("mov.u32 %0, %%ntid.x;" : "=r"(nt));
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
  const int nw = nt >> 5, warp = t >> 5, lane = t & 31;
  float* pis = reinterpret_cast<float*>(smem);    // [D][D] Π
  float* wsum = pis + D * D;                      // [W][R8][D] virtual warps' O_rot sums
  float* orot = wsum + kMaxMergeWarps * R8 * D;   // [R8][D]
  float* wl = orot + R8 * D;                      // [W][R8] virtual warps' l sums
  float* ms = wl + kMaxMergeWarps * R8;           // [R8] M per row
  float* ls = ms + R8;                            // [R8] l per row
  int* flag = reinterpret_cast<int*>(ls + R8);
  // every warp has written its partials and is done with its ring. No fence per thread: the
  // barrier orders the CTA's writes before thread 0's acq_rel add, whose release is cumulative
  // (the pattern of a cooperative grid sync). A __threadfence (fence.sc.gpu) in every thread
  // instead: ~9.5 µs more a step at batch 1 (H200, issue-10-decode7 calls 1 and 2, the second
  // with the un-rotation unrolled too).
  __syncthreads();
  const int u0 = cta * nw;
  if (u0 >= p.units) return;  // uniform
  const int sa = ldcg_s32(p.unit_segs + u0), sb = ldcg_s32(p.unit_segs + min(u0 + nw, p.units));
  if (sa >= sb) return;
  const int W = p.merge_warps;
  const int tile_end = ldcg_s32(p.segs + 4 * (sb - 1)) + 1;
  for (int tile = ldcg_s32(p.segs + 4 * sa); tile < tile_end; ++tile) {
    const int s0 = ldcg_s32(p.tile_segs + tile), s1 = ldcg_s32(p.tile_segs + tile + 1);
    __syncthreads();  // the previous tile's merge is done with the shared memory and the flag
    if (t == 0) {
      const int mine = min(sb, s1) - max(sa, s0);
      int last = 0;
      if (mine > 0) last = atom_add_acq_rel(p.counts + tile, mine) + mine == s1 - s0;
      // every other CTA of the tile has added its share: back to zero for the next launch
      if (last) p.counts[tile] = 0;
      *flag = last;
    }
    __syncthreads();  // thread 0's add acquired the other CTAs' partials; the barrier passes
                      // that on (they are read through L2 below)
    if (!*flag) continue;
    const int qg = tile % p.qgroups, h = (tile / p.qgroups) % p.heads_kv;
    const int b = tile / (p.qgroups * p.heads_kv);
    const int sq = ldcg_s32(p.seqlens_q + b);
    const int nr = min(R8, p.group * p.max_sq - qg * kRows);  // rows in use (hl < group)
    // Π into shared memory (the engine's, never rewritten: through L2), in flight meanwhile
    const u32 pis_s = smem_addr(pis);
    for (int x = t; x < D * D / 4; x += nt) cp_async_n<16>(pis_s + 16 * x, p.pi + 4 * x);
    cp_async_commit();
    // ---- pass 1: M = max_s m_s per row (warp w: rows w, w + nw, ...; -inf for padded queries)
    for (int r = warp; r < nr; r += nw) {
      float m = neg_inf();
      if ((qg * kRows + r) % p.max_sq < sq) {
        for (int sb0 = s0; sb0 < s1; sb0 += 32 * 8) {
          float v[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const int s = sb0 + 32 * u + lane;
            v[u] = s < s1 ? ldcg_f32(p.part_ml + ((size_t)s * kRows + r) * 2) : neg_inf();
          }
#pragma unroll
          for (int u = 0; u < 8; ++u) m = fmax2(m, v[u]);
        }
      }
#pragma unroll
      for (int x = 16; x >= 1; x >>= 1) m = fmax2(m, shfl_xor(m, x));
      if (lane == 0) ms[r] = m;
    }
    // virtual warps without a segment of a row add zeros, as a merge warp past the tile's end
    for (int x = t; x < W * R8 * D; x += nt) wsum[x] = 0.f;
    for (int x = t; x < W * R8; x += nt) wl[x] = 0.f;
    __syncthreads();
    // ---- pass 2: chains (v, r) of this warp in order (v = warp, warp + nw, .. < W; rows r < nr
    // with a visible key), segments s0 + v + k W each; kItems loads in flight across chains
    {
      constexpr int kItems = 16;
      int v = warp, r = 0, s = s0 + warp;  // the next item (uniform over the warp)
      auto settle = [&]() {                // onto an item of a live chain, or v >= W
        while (v < W) {
          if (r >= nr) {
            v += nw, r = 0, s = s0 + v;
            continue;
          }
          if (s < s1 && ms[r] != neg_inf()) break;
          ++r, s = s0 + v;
        }
      };
      settle();
      float acc[PER], l = 0.f;
#pragma unroll
      for (int j = 0; j < PER; ++j) acc[j] = 0.f;
      int key = -1;  // chain being summed: v · R8 + r
      auto flush = [&]() {
#pragma unroll
        for (int j = 0; j < PER; ++j) wsum[key * D + lane * PER + j] = acc[j];
        if (lane == 0) wl[key] = l;
      };
      while (v < W) {
        float ov[kItems][PER];
        float2 ml[kItems];
        int ky[kItems];
#pragma unroll
        for (int u = 0; u < kItems; ++u) {
          ky[u] = -1;
          if (v < W) {
            ky[u] = v * R8 + r;
            const size_t row = (size_t)s * kRows + r;
            ml[u] = ldcg_f32x2(p.part_ml + row * 2);
            const float* po = p.part_o + row * D + lane * PER;
            if constexpr (PER == 4) {
              const float4 x = ldcg_f32x4(po);
              ov[u][0] = x.x, ov[u][1] = x.y, ov[u][2] = x.z, ov[u][3] = x.w;
            } else {
              const float2 x = ldcg_f32x2(po);
              ov[u][0] = x.x, ov[u][1] = x.y;
            }
            s += W;
            settle();
          }
        }
#pragma unroll
        for (int u = 0; u < kItems; ++u) {
          if (ky[u] < 0) break;
          if (ky[u] != key) {
            if (key >= 0) flush();
            key = ky[u], l = 0.f;
#pragma unroll
            for (int j = 0; j < PER; ++j) acc[j] = 0.f;
          }
          if (ml[u].x == neg_inf()) continue;  // no visible key of this row in the segment
          const float f = exp2_approx(ml[u].x - ms[key % R8]);
          l = fmaf(ml[u].y, f, l);
#pragma unroll
          for (int j = 0; j < PER; ++j) acc[j] = fmaf(ov[u][j], f, acc[j]);
        }
      }
      if (key >= 0) flush();
    }
    __syncthreads();
    // the virtual warps' sums in order, O_rot / l (combine's wacc / wl step)
    for (int x = t; x < nr * D; x += nt) {
      const int r = x / D, c = x % D;
      float L = 0.f, A = 0.f;
      for (int w = 0; w < W; ++w) L += wl[w * R8 + r], A += wsum[(w * R8 + r) * D + c];
      orot[r * D + c] = L > 0.f ? A / L * p.oscale : 0.f;
      if (c == 0) ls[r] = L;
    }
    cp_async_wait<0>();  // this thread's copies of Π
    __syncthreads();     // every thread's, and O_rot
    // O = Πᵀ O_rot in combine's k-slices (KS of KL coordinates, each an fmaf chain from 0, the
    // slices added in order; unrolled for the merge's warp count), then O and LSE written
    auto unrotate = [&](auto wtag) {
      constexpr int KS = decltype(wtag)::value * 32 / (D / 4), KL = D / KS;
      for (int x = t; x < nr * D; x += nt) {
        const int r = x / D, oc = x % D;
        const float* orow = orot + r * D;
        float y = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
          float ys = 0.f;
          if constexpr (KL % 4 == 0) {
#pragma unroll
            for (int kk = 0; kk < KL; kk += 4) {
              const int k = ks * KL + kk;
              const float4 ov = *reinterpret_cast<const float4*>(orow + k);  // one broadcast LDS
              ys = fmaf(pis[k * D + oc], ov.x, ys);
              ys = fmaf(pis[(k + 1) * D + oc], ov.y, ys);
              ys = fmaf(pis[(k + 2) * D + oc], ov.z, ys);
              ys = fmaf(pis[(k + 3) * D + oc], ov.w, ys);
            }
          } else {
#pragma unroll
            for (int kk = 0; kk < KL; ++kk) ys = fmaf(pis[(ks * KL + kk) * D + oc], orow[ks * KL + kk], ys);
          }
          y += ys;
        }
        const int R = qg * kRows + r, hl = R / p.max_sq, i = R % p.max_sq, head = h * p.group + hl;
        const float L = ls[r];
        p.o[(((size_t)b * p.max_sq + i) * p.heads_q + head) * D + oc] = F16::from_f32(i < sq && L > 0.f ? y : 0.f);
        if (oc == 0)
          p.lse[((size_t)b * p.heads_q + head) * p.max_sq + i] =
              i < sq && L > 0.f ? (ms[r] + log2_approx(L)) * 0.6931471805599453f : neg_inf();
      }
    };
    if (W == kMaxMergeWarps) {
      unrotate(IntTag<kMaxMergeWarps>{});
    } else {
      unrotate(IntTag<8>{});  // ferrattn_cuda::turboquant::COMBINE_WARPS (merge_warps: 8 or 16)
    }
  }
}

template <int D, bool QJL, bool KWIDE, bool VWIDE, bool R16, bool FUSED, bool KC, bool VC>
__device__ __forceinline__ void decode_unit(const DecodeParams& p) {
  constexpr int CH = D / 16;  // k16 chunks of the head dim
  constexpr int NB = D / 8;   // n8 blocks of the output
  extern __shared__ uint4 ring_all[];
  pdl_launch_dependents();  // the merge may be scheduled now; it waits for this grid's end
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kUnitWarps = R16 ? kUnitWarps16 : (int)(blockDim.x >> 5);
  const int unit = blockIdx.x * kUnitWarps + warp;
  // <= 8 rows (and FUSED): every warp reaches the CTA barriers (the shared query fragments',
  // fused_merge's; a warp past the last unit walks no segment); 16 rows: there is no CTA
  // barrier below and a warp may leave
  if (R16 && unit >= p.units) return;
  uint4* ring = ring_all + (size_t)warp * kStages * kStageU4;
  const u32 ring_s = smem_addr(ring) + 16 * lane;  // shared address of this lane's slot 0, stage 0
  // query A fragments, [2][CH][32 lanes] uint4 per warp after the rings, read with one 16-byte
  // load per MMA (whole register quads: no per-iteration moves to build them, and out of the
  // register budget: 3 CTAs per SM). Array 0: 8 rows in use, {hi, lo, hi, lo} of Π q (the low
  // halves stacked on MMA rows 8-15, so one MMA gives both products); 16 rows, the low halves
  // (the high ones stay in registers). Array 1: S q; with 8 rows [CH/2][32 lanes] quads, chunks
  // 2w and 2w + 1 stacked on MMA rows 0-7 and 8-15 of one A fragment (see qjl_word; was one quad
  // a chunk with rows 8-15 zero): 13.5 KiB a warp at D = 128 (4 CTAs of 4 warps per SM at 128
  // registers measured slower: issue-10-decode6 call 1).
  // <= 8 rows (issue-10-decode11): the fragments of a tile are loaded once per CTA, not once per
  // warp and segment. The kUnitWarps areas are tile slots: when the CTA's segments span at most
  // kUnitWarps tiles (a contiguous range: the stream-K units of a CTA are consecutive), warp w
  // loads tile tile0 + w into slot w once, after pdl_wait, and every warp reads the slot of its
  // segment's tile (a CTA barrier between). At batch 1 a 7-warp CTA spans 1-2 tiles: 24 LDG.128
  // a lane per segment (every warp read its tile's 12 KiB from L2) become 24 per tile and CTA.
  // Otherwise (short sequences: many tiles per CTA) slot w is warp w's own, reloaded per
  // segment as before. cgs (after the slots): [kUnitWarps][32] the lanes' QJL row constants C
  // of their slot's tile (quad sums), which the loading lane computed.
  constexpr int kQWarpU4 = R16 ? 2 * CH * 32 : CH * 32 + CH * 16;
  uint4* const qslots = ring_all + (size_t)kUnitWarps * kStages * kStageU4;
  float* const cgs = reinterpret_cast<float*>(qslots + (size_t)kUnitWarps * kQWarpU4);
  const int g = lane >> 2, q = lane & 3;
  u32 ktab[8], vtab[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) ktab[i] = p.ktab[i], vtab[i] = p.vtab[i];
  const u32 one = kOnePair;  // loaded once: a register for signs2m

  // A segment's header: its tile, token range, rows' visible ends and the lane's source bases.
  // The tables are the host's (uploaded before the prepare kernel, which is launched in plain
  // stream order) and the cache is written before the prepare too: both are read through L2
  // (ld.global.cg), never L1, so that they may be read before pdl_wait (see below).
  struct Head {
    int tile, tok0, tok1, lim0, lim1, iters;
    Bases src;
  };
  auto head_of = [&](int sgi) {
    Head hd;
    const int4 sg = ldcg_s32x4(p.segs + 4 * sgi);  // 16-byte rows (the workspace's tables are aligned)
    hd.tile = sg.x, hd.tok0 = sg.y, hd.tok1 = sg.z;
    const int qg = hd.tile % p.qgroups, h = (hd.tile / p.qgroups) % p.heads_kv;
    const int b = hd.tile / (p.qgroups * p.heads_kv);
    const int sq = ldcg_s32(p.seqlens_q + b), sk = ldcg_s32(p.seqlens_k + b);
    hd.lim0 = min(hd.tok1, row_end(p, qg, g, sq, sk));
    hd.lim1 = min(hd.tok1, row_end(p, qg, g + 8, sq, sk));
    const size_t row0 = ((size_t)b * p.heads_kv + h) * p.cap;
    hd.src = bases_of<D, QJL, KC, VC>(p, row0, g, q, lane);
    // the loop bound must be the same in every lane (mma.sync and shfl.sync need the whole
    // warp): the segment's iterations, not a row's visible end (rows differ per lane; masked)
    hd.iters = hd.tok1 > hd.tok0 ? (hd.tok1 - hd.tok0 + kTileK - 1) / kTileK : 0;
    return hd;
  };
  // the whole ring (kStages stages) of a segment; hd.src is left at the first stage not issued
  auto issue_ring = [&](Head& hd) {
    advance<D, KC, VC>(hd.src, hd.tok0);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      if (s < hd.iters) issue_stage<D, QJL, KC, VC>(hd.src, ring_s + s * kStageBytes);
      cp_async_commit();
    }
  };

  const bool has_unit = unit < p.units;  // (16 rows: the others returned above)
  const int seg_begin = has_unit ? ldcg_s32(p.unit_segs + unit) : 0;
  const int seg_end = has_unit ? ldcg_s32(p.unit_segs + unit + 1) : 0;
  // kEarly (D = 128: every ring copy is a 16-byte cp.async.cg): the first segment's ring goes
  // out before pdl_wait, so that its DRAM round trip overlaps the prepare kernel's tail. Only
  // the query fragments are the prepare's output; the cache and the tables are older and read
  // through L2 only. (At D = 64 the code copies are 8-byte cp.async.ca, through L1: after the
  // wait, as before; see pdl_wait for why nothing goes through L1 before it.)
  constexpr bool kEarly = D == 128;
  const bool early = kEarly && !(p.diag & 1);
  Head hd{};
  if (early && seg_begin < seg_end) {
    hd = head_of(seg_begin);
    issue_ring(hd);
  }
  // The CTA's tiles (<= 8 rows): the first and last segments of its units (uniform over the CTA)
  int q_tile0 = 0, q_tiles = 0;  // q_tiles > 0: tiles q_tile0 .. + q_tiles - 1 in the slots
  if constexpr (!R16) {
    const int u0 = blockIdx.x * kUnitWarps, u1 = min(u0 + kUnitWarps, p.units);
    if (u0 < u1) {
      const int sa = ldcg_s32(p.unit_segs + u0), sb = ldcg_s32(p.unit_segs + u1);
      if (sa < sb) {
        q_tile0 = ldcg_s32(p.segs + 4 * sa);
        const int n = ldcg_s32(p.segs + 4 * (sb - 1)) - q_tile0 + 1;
        q_tiles = n <= kUnitWarps && !(p.diag & 2) ? n : 0;
      }
    }
  }
  pdl_wait();  // the query fragments (the prepare's output) are read below

  // A tile's query fragments into slot qs (this lane's entries), as the units' MMAs read them:
  // Π q as hi + lo (two f16 products: the scores then carry the rounding of the centroids only);
  // 16 rows: the high halves into qa (registers). S q scaled by the mantissa weights of its
  // sign pairs (see signs2m), and the rows' constants C (cg: rows g, cg8: rows g + 8; summed
  // over the quad).
  auto load_q = [&](int tile, uint4* qs, u32 (&qa)[R16 ? CH : 1][4], float& cg, float& cg8) {
    cg = 0.f, cg8 = 0.f;
    u32 ev_x = 0u, ev_z = 0u;  // 8 rows: S q of the even chunk, stored with the odd one
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const size_t at = ((size_t)(tile * 32 + lane) * CH + c) * 4;
      const uint4 v = ldg16(p.qf + at), l = ldg16(p.qf_lo + at);
      if constexpr (R16) {
        qa[c][0] = v.x, qa[c][1] = v.y, qa[c][2] = v.z, qa[c][3] = v.w;
        qs[c * 32 + lane] = l;
      } else {
        qs[c * 32 + lane] = make_uint4(v.x, l.x, v.z, l.z);
      }
      if (QJL) {
        // (this lane's share of C; rows g: registers 0, 2, rows g + 8: 1, 3)
        const uint4 w = ldg16(p.pf + at);
        const int e01 = 5 - 2 * (c & 1), e23 = e01 - 1;
        cg += qjl_const2(w.x, e01), cg += qjl_const2(w.z, e23);
        if (R16) cg8 += qjl_const2(w.y, e01), cg8 += qjl_const2(w.w, e23);
        const u32 m01 = qjl_scale(c, 0), m23 = qjl_scale(c, 2);
        if (R16) {
          qs[(CH + c) * 32 + lane] = make_uint4(hmul2(w.x, m01), hmul2(w.y, m01), hmul2(w.z, m23), hmul2(w.w, m23));
        } else if (c % 2 == 0) {  // rows g of chunk c (w.y, w.w: rows 8-15, zero)
          ev_x = hmul2(w.x, m01), ev_z = hmul2(w.z, m23);
        } else {  // chunk c - 1 on rows 0-7, chunk c on rows 8-15
          qs[(CH + c / 2) * 32 + lane] = make_uint4(ev_x, hmul2(w.x, m01), ev_z, hmul2(w.z, m23));
        }
      }
    }
    // the row sums over the 4 lanes of a quad (lanes 4g .. 4g + 3 hold row g's 16-column pieces)
    cg += shfl_xor(cg, 1), cg8 += shfl_xor(cg8, 1);
    cg += shfl_xor(cg, 2), cg8 += shfl_xor(cg8, 2);
  };
  if constexpr (!R16) {
    if (q_tiles > 0) {  // uniform over the CTA
      if (warp < q_tiles) {
        u32 qa_[1][4];
        float c0, c1;
        load_q(q_tile0 + warp, qslots + (size_t)warp * kQWarpU4, qa_, c0, c1);
        cgs[warp * 32 + lane] = c0;
      }
      __syncthreads();  // every slot written before any warp reads one
    }
  }

  for (int sgi = seg_begin; sgi < seg_end; ++sgi) {
    if (!early || sgi != seg_begin) {
      hd = head_of(sgi);
      // every lane's reads of the previous segment's small bytes are done before they are
      // overwritten (the ring is refilled from the start)
      __syncwarp();
      issue_ring(hd);
    }
    const int tile = hd.tile, tok0 = hd.tok0, lim0 = hd.lim0, lim1 = hd.lim1, iters = hd.iters;
    // live rows see a token of the segment (padding rows, and rows whose visible keys end before
    // it, are dead: their partial is written as empty); live_lim: the warp's least live end
    const bool dead0 = lim0 <= tok0, dead1 = !R16 || lim1 <= tok0;
    const int live_lim = warp_min(min(dead0 ? INT_MAX_ : lim0, dead1 ? INT_MAX_ : lim1));
    Bases src = hd.src;  // at stage kStages (when the segment has that many)
    // the tile's query fragments: its CTA slot (loaded above), or this warp's own slot loaded now
    // (in which every lane reads only the entries it wrote, so no barrier; its reads of the
    // previous segment are done: program order)
    u32 qa[R16 ? CH : 1][4];
    float cg, cg8;  // C of rows g and g + 8 (signs2m)
    const uint4* qsm;
    if (!R16 && q_tiles > 0) {
      const int slot = tile - q_tile0;
      qsm = qslots + (size_t)slot * kQWarpU4;
      cg = QJL ? cgs[slot * 32 + lane] : 0.f, cg8 = 0.f;
    } else {
      uint4* own = qslots + (size_t)warp * kQWarpU4;
      load_q(tile, own, qa, cg, cg8);
      qsm = own;
    }
    // the T accumulators' start (loop-invariant: the first MMA of each chain reads it as its C)
    const float tc[4] = {-cg, -cg, -cg8, -cg8};
    // A fragment of array arr, chunk c, from qsm
    auto qfrag = [&](int arr, int c, u32 (&f)[4]) {
      const uint4 v = qsm[(arr * CH + c) * 32 + lane];
      f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
    };
    // R16: O_rot in the C layout of P · V (o[ν]: rows g and g + 8, channels 8ν + 2q, + 1).
    // 8 rows: O_rotᵀ = Vᵀ · Pᵀ, channels as the MMA's M and the 8 rows in use as its N, so no
    // MMA row is wasted: o[μ] holds channels 16μ + g (entries 0, 1) and 16μ + 8 + g (2, 3) of
    // rows 2q, 2q + 1 (half the P·V MMAs of the 16-row form, and no dropped rows to zero).
    // (untransposed at 8 rows, with the dropped rows zeroed per iteration, measured 1.8-4.8%
    // slower, H200, issue-10-decode4 call 2)
    constexpr bool T = !R16;
    constexpr int NO = T ? NB / 2 : NB;
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = neg_inf(), m1 = neg_inf(), l0 = 0.f, l1 = 0.f;

    // Software pipeline over the 16-token stages: one loop iteration runs the score MMAs of
    // stage it + 1 and the P·V MMAs of stage it (independent: two dependency chains in flight
    // per warp instead of one), then the softmax of stage it + 1 (kLateV: the P·V beside that
    // softmax instead). `pa_` carries stage it's P ‖v‖ (the A operand of its P·V) from the
    // iteration before.
    u32 pa_[4] = {0u, 0u, 0u, 0u};
    float s0[4], s1[4], t0[4], t1[4], z0[4], z1[4];
    float u0[R16 ? 1 : 4], u1[R16 ? 1 : 4];  // 8 rows: T of the odd chunks, on rows 8-15

    // ---- S = (Π q) · c[idx]ᵀ of K word w (tokens 0-7: s0, 8-15: s1), q = hi + lo in two f16
    // MMAs (the scores then carry the rounding of the centroids only; the low halves come from
    // shared memory: the registers hold the high halves and O). R16: hi and lo products in
    // separate accumulators (two dependency chains per token half); 8 rows: rows 0-7 hi · c,
    // rows 8-15 lo · c, summed in `softmax`.
    auto score_word = [&](const Stage<D>& kc, int w) {
      u32 b00, b01, b10, b11, c00, c01, c10, c11;
      lookup4<KWIDE>(kc.k0.w[w], ktab, b00, b01);
      lookup4<KWIDE>(kc.k0.w[w] >> 16, ktab, b10, b11);
      lookup4<KWIDE>(kc.k1.w[w], ktab, c00, c01);
      lookup4<KWIDE>(kc.k1.w[w] >> 16, ktab, c10, c11);
      u32 f0[4], f1[4];
      qfrag(0, 2 * w, f0);
      qfrag(0, 2 * w + 1, f1);
      if constexpr (R16) {
        mma16816(F16{}, s0, qa[2 * w], b00, b01);
        mma16816(F16{}, s0, qa[2 * w + 1], b10, b11);
        mma16816(F16{}, s1, qa[2 * w], c00, c01);
        mma16816(F16{}, s1, qa[2 * w + 1], c10, c11);
        mma16816(F16{}, z0, f0, b00, b01);
        mma16816(F16{}, z0, f1, b10, b11);
        mma16816(F16{}, z1, f0, c00, c01);
        mma16816(F16{}, z1, f1, c10, c11);
      } else {
        // two accumulators per token half (even and odd words): chains of D/64 MMAs, not D/32
        float(&x0)[4] = (w & 1) ? z0 : s0;
        float(&x1)[4] = (w & 1) ? z1 : s1;
        mma16816(F16{}, x0, f0, b00, b01);
        mma16816(F16{}, x0, f1, b10, b11);
        mma16816(F16{}, x1, f0, c00, c01);
        mma16816(F16{}, x1, f1, c10, c11);
      }
    };
    // T = (S q) · signsᵀ, chunks 2w and 2w + 1
    auto qjl_word = [&](const Stage<D>& kc, int w) {
      if (QJL) {
        // pairs 4w .. 4w + 3: chunk 2w's b0, b1, chunk 2w + 1's b0, b1 (one shift per token row)
        const u32 h0 = sign_group_rt(kc.s0, w), h1 = sign_group_rt(kc.s1, w);
        if constexpr (!R16) {
          // 8 rows: S q of chunk 2w on MMA rows 0-7 and of chunk 2w + 1 on rows 8-15 (one A
          // fragment). An MMA's output row depends on its A row only, so chunk 2w's signs give
          // rows 0-7 of t (rows 8-15: unused products) and chunk 2w + 1's rows 8-15 of u; the
          // softmax takes T = t[0..1] + u[2..3]: t starts at tc (-C of row g), u at 0
          // (zero_scores; rows 8-15 of tc are 0 at 8 rows).
          u32 pa[4];
          qfrag(1, w, pa);
          if (w == 0) {
            mma16816_c(t0, pa, signs2m(h0, 0, one), signs2m(h0, 1, one), tc);
            mma16816_c(t1, pa, signs2m(h1, 0, one), signs2m(h1, 1, one), tc);
          } else {
            mma16816(F16{}, t0, pa, signs2m(h0, 0, one), signs2m(h0, 1, one));
            mma16816(F16{}, t1, pa, signs2m(h1, 0, one), signs2m(h1, 1, one));
          }
          mma16816(F16{}, u0, pa, signs2m(h0, 2, one), signs2m(h0, 3, one));
          mma16816(F16{}, u1, pa, signs2m(h1, 2, one), signs2m(h1, 3, one));
        } else {
#pragma unroll
          for (int c = 2 * w; c < 2 * w + 2; ++c) {
            u32 pa[4];
            qfrag(1, c, pa);
            const int k = 2 * (c & 1);
            if (c == 0) {  // the chains' first MMAs: C = -C_row (tc), not the accumulators
              mma16816_c(t0, pa, signs2m(h0, k, one), signs2m(h0, k + 1, one), tc);
              mma16816_c(t1, pa, signs2m(h1, k, one), signs2m(h1, k + 1, one), tc);
            } else {
              mma16816(F16{}, t0, pa, signs2m(h0, k, one), signs2m(h0, k + 1, one));
              mma16816(F16{}, t1, pa, signs2m(h1, k, one), signs2m(h1, k + 1, one));
            }
          }
        }
      }
    };
    auto zero_scores = [&]() {
#pragma unroll
      for (int e = 0; e < 4; ++e) s0[e] = s1[e] = z0[e] = z1[e] = 0.f;  // t0, t1: from tc (qjl_word)
      if constexpr (!R16) {
#pragma unroll
        for (int e = 0; e < 4; ++e) u0[e] = u1[e] = 0.f;
      }
    };
    // ---- O_rot += P' · c[idx_v] of V word w: n-blocks ν = 4w .. 4w + 3 (channels 8ν..8ν+7);
    // pop: the stage's P ‖v‖ (the A operand; at 8 rows Pᵀ's B fragment is its row-g halves)
    auto pv_word = [&](const Stage<D>& vc, int w, const u32 (&pop)[4]) {
      u32 a0, a1, a2, a3, b0, b1, b2, b3;
      lookup4<VWIDE>(vc.v0.w[w], vtab, a0, a1);        // ν = 4w, 4w + 1; tokens 2q, 2q + 1
      lookup4<VWIDE>(vc.v0.w[w] >> 16, vtab, a2, a3);  // ν = 4w + 2, 4w + 3
      lookup4<VWIDE>(vc.v1.w[w], vtab, b0, b1);        // tokens 2q + 8, 2q + 9
      lookup4<VWIDE>(vc.v1.w[w] >> 16, vtab, b2, b3);
      if constexpr (!T) {
        mma16816(F16{}, o[4 * w], pop, a0, b0);
        mma16816(F16{}, o[4 * w + 1], pop, a1, b1);
        mma16816(F16{}, o[4 * w + 2], pop, a2, b2);
        mma16816(F16{}, o[4 * w + 3], pop, a3, b3);
      } else {
        // Vᵀ as the A operand: the B fragments of n-blocks 4w, 4w + 1 (channels 8ν + g, tokens
        // 2q.. and 2q + 8..) are exactly the A fragment of channels 32w .. 32w + 15 (rows g,
        // g + 8; k = tokens), and Pᵀ's B fragment is pop's row-g halves (tokens 2q.., 2q + 8..)
        const u32 va0[4] = {a0, a1, b0, b1}, va1[4] = {a2, a3, b2, b3};
        mma16816(F16{}, o[2 * w], va0, pop[0], pop[2]);
        mma16816(F16{}, o[2 * w + 1], va1, pop[0], pop[2]);
      }
    };
    // ---- scores, masking, online softmax (base 2) of the stage at token `start` for rows g
    // (e = 0, 1) and g + 8 (e = 2, 3): m, l updated, pa_ = its P ‖v‖, al = O's rescale factors
    // `mask` (Masked / Unmasked): an Unmasked stage lies below every live row's end (live_lim),
    // so neither the token mask nor the p = 0 select of P ‖v‖ is needed (every norm in it is a
    // written token's); dead rows then score finite garbage, dropped at the partial's write
    auto softmax = [&](auto mask, const Stage<D>& kc, int start, float& al0, float& al1) {
      constexpr bool kMask = decltype(mask)::value;
      if constexpr (R16) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s0[e] += z0[e], s1[e] += z1[e];
      } else {
        s0[0] += z0[0], s0[1] += z0[1], s0[2] += z0[2], s0[3] += z0[3];
        s1[0] += z1[0], s1[1] += z1[1], s1[2] += z1[2], s1[3] += z1[3];
        s0[0] += s0[2], s0[1] += s0[3], s1[0] += s1[2], s1[1] += s1[3];
      }
      const int j0 = start + 2 * q;  // token of s0[0] (s0[1] is j0 + 1, s1[*] are + 8)
      const float kA = half_lo(kc.kn0.x), rA = half_hi(kc.kn0.x);  // token j0
      const float kB = half_lo(kc.kn0.y), rB = half_hi(kc.kn0.y);  // j0 + 1
      const float kC = half_lo(kc.kn1.x), rC = half_hi(kc.kn1.x);  // j0 + 8
      const float kD = half_lo(kc.kn1.y), rD = half_hi(kc.kn1.y);  // j0 + 9
      float sc[8];
      if constexpr (QJL && !R16) {  // the odd chunks' T, rows 8-15 of u (qjl_word)
        t0[0] += u0[2], t0[1] += u0[3], t1[0] += u1[2], t1[1] += u1[3];
      }
      sc[0] = kA * s0[0] + (QJL ? rA * t0[0] : 0.f);
      sc[1] = kB * s0[1] + (QJL ? rB * t0[1] : 0.f);
      sc[2] = kC * s1[0] + (QJL ? rC * t1[0] : 0.f);
      sc[3] = kD * s1[1] + (QJL ? rD * t1[1] : 0.f);
      if constexpr (R16) {
        sc[4] = kA * s0[2] + (QJL ? rA * t0[2] : 0.f);
        sc[5] = kB * s0[3] + (QJL ? rB * t0[3] : 0.f);
        sc[6] = kC * s1[2] + (QJL ? rC * t1[2] : 0.f);
        sc[7] = kD * s1[3] + (QJL ? rD * t1[3] : 0.f);
      } else {
        sc[4] = sc[5] = sc[6] = sc[7] = neg_inf();  // rows 8-15 are not in use
      }
      if constexpr (kMask) {
        const int tok[4] = {j0, j0 + 1, j0 + 8, j0 + 9};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (tok[e] >= lim0) sc[e] = neg_inf();
          if (tok[e] >= lim1) sc[4 + e] = neg_inf();
        }
      }
      float mx0 = fmax1(fmax1(sc[0], sc[1]), fmax1(sc[2], sc[3]));
      float mx1 = fmax1(fmax1(sc[4], sc[5]), fmax1(sc[6], sc[7]));
      mx0 = fmax1(mx0, shfl_xor(mx0, 1));
      mx0 = fmax1(mx0, shfl_xor(mx0, 2));
      if (R16) {
        mx1 = fmax1(mx1, shfl_xor(mx1, 1));
        mx1 = fmax1(mx1, shfl_xor(mx1, 2));
      }
      const float mn0 = fmax1(m0, mx0), mn1 = fmax1(m1, mx1);
      // a row with no visible key yet keeps m = -inf; subtract 0 instead so that exp2 gives 0
      const float mu0 = mn0 == neg_inf() ? 0.f : mn0, mu1 = mn1 == neg_inf() ? 0.f : mn1;
      al0 = exp2_approx(m0 - mu0), al1 = R16 ? exp2_approx(m1 - mu1) : 1.f;
      m0 = mn0, m1 = mn1;
      float pr[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pr[e] = exp2_approx(sc[e] - mu0);
        pr[4 + e] = R16 ? exp2_approx(sc[4 + e] - mu1) : 0.f;
      }
      l0 = l0 * al0 + ((pr[0] + pr[1]) + (pr[2] + pr[3]));
      l1 = l1 * al1 + ((pr[4] + pr[5]) + (pr[6] + pr[7]));
      // P ‖v‖ as the A operand (p = 0 for masked tokens; the select keeps a garbage norm out)
      const float vA = half_lo(kc.vn0), vB = half_hi(kc.vn0), vC = half_lo(kc.vn1), vD = half_hi(kc.vn1);
      const float vn[4] = {vA, vB, vC, vD};
      float pv[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pv[e] = kMask && pr[e] == 0.f ? 0.f : pr[e] * vn[e];
        pv[4 + e] = kMask && pr[4 + e] == 0.f ? 0.f : pr[4 + e] * vn[e];
      }
      pa_[0] = pack2(F16{}, pv[0], pv[1]), pa_[1] = pack2(F16{}, pv[4], pv[5]);
      pa_[2] = pack2(F16{}, pv[2], pv[3]), pa_[3] = pack2(F16{}, pv[6], pv[7]);
    };

    if (iters > 0) {
      // prologue: stage 0's scores and softmax (O is zero: no rescale)
      cp_async_wait<kStages - 1>();  // this lane's copies of stage 0 have landed
      __syncwarp();                  // and every other lane's (the small bytes)
      Stage<D> kc;
      read_keys<D, QJL, KC>(ring, lane, q, kc);
      zero_scores();
#pragma unroll
      for (int w = 0; w < D / 32; ++w) score_word(kc, w), qjl_word(kc, w);
      float al0, al1;
      softmax(Masked{}, kc, tok0, al0, al1);
    }

    // byte offsets in the ring of stage it's slot (its values are read, then it is refilled) and
    // of stage it + 1's (its keys are read): rotated, not recomputed as it % kStages
    u32 so_v = 0, so_k = kStageBytes;
    const unsigned char* ring_b = reinterpret_cast<const unsigned char*>(ring);
#pragma unroll 1
    for (int it = 0; it + 1 < iters; ++it) {
      // stage it + 1 has landed (kStages + it groups committed, the first it + 2 complete)
      cp_async_wait<kStages - 2>();
      // every lane's: the small bytes; also orders the reads of stage it's small bytes (in the
      // iteration before) before this iteration's refill of its slot
      __syncwarp();
      Stage<D> kc, vc;
      read_keys<D, QJL, KC>(reinterpret_cast<const uint4*>(ring_b + so_k), lane, q, kc);
      read_values<D, VC>(reinterpret_cast<const uint4*>(ring_b + so_v), lane, vc);
      zero_scores();
      // kLateV: stage it + 1's scores, then its softmax beside stage it's P·V. The P·V (its value
      // lookups, 64 PRMT of the loop's ~190-230 ALU instructions, and its MMAs) depends on
      // neither, so it is placed after the softmax in program order and in the same basic block
      // (one copy per softmax branch), where ptxas interleaves it with the softmax's dependent
      // chain (max, shuffles, exp2, pack: almost no ALU work) instead of issuing every lookup
      // before it (the loop is bound by each warp's ALU work in series with that chain).
      // Its P operand is stage it's, held in pp while the softmax writes stage it + 1's into
      // pa_; O receives the same MMAs in the same order and the rescale still follows them.
      // Only at D = 128 with crumb values (VC: k2-v2, k3-v2, k3q-v2 measured faster at every
      // shape); D = 64 and nibble values (k4q-v3: 0.2% slower at 16 x 16k) keep the P·V beside
      // the scores (issue-10-decode21).
      constexpr bool kLateV = D == 128 && VC;
#pragma unroll
      for (int w = 0; w < D / 32; ++w) {
        score_word(kc, w);
        if (!kLateV) pv_word(vc, w, pa_);
        qjl_word(kc, w);
      }
      const u32 pp[4] = {pa_[0], pa_[1], pa_[2], pa_[3]};
      float al0, al1;
      const int start = tok0 + (it + 1) * kTileK;
      if (start + kTileK <= live_lim) {  // uniform
        softmax(Unmasked{}, kc, start, al0, al1);
#pragma unroll
        for (int w = 0; w < D / 32 && kLateV; ++w) pv_word(vc, w, pp);
      } else {
        softmax(Masked{}, kc, start, al0, al1);
#pragma unroll
        for (int w = 0; w < D / 32 && kLateV; ++w) pv_word(vc, w, pp);
      }
      // rescale O (stage it's P·V included) only when some row's running max moved (rare after
      // the first tokens; the vote keeps the branch uniform over the warp)
      if (__any_sync(0xffffffffu, al0 != 1.f || (R16 && al1 != 1.f))) {
        if constexpr (!T) {
#pragma unroll
          for (int n = 0; n < NB; ++n) o[n][0] *= al0, o[n][1] *= al0, o[n][2] *= al1, o[n][3] *= al1;
        } else {
          // Oᵀ: this lane's columns are rows 2q and 2q + 1, whose factors the lanes 8q and
          // 8q + 4 computed (row g = lane / 4)
          const float a0 = shfl_idx(al0, 8 * q), a1 = shfl_idx(al0, 8 * q + 4);
#pragma unroll
          for (int n = 0; n < NO; ++n) o[n][0] *= a0, o[n][1] *= a1, o[n][2] *= a0, o[n][3] *= a1;
        }
      }
      // refill stage it's slot (this lane read it above and its values went into the MMAs)
      if (it + kStages < iters) issue_stage<D, QJL, KC, VC>(src, ring_s + so_v);
      cp_async_commit();
      so_v = so_k;
      so_k = so_k == (kStages - 1) * kStageBytes ? 0u : so_k + kStageBytes;
    }

    if (iters > 0) {
      // epilogue: the last stage's P·V (its copies landed before its scores were read; so_v is
      // its slot)
      Stage<D> vc;
      read_values<D, VC>(reinterpret_cast<const uint4*>(ring_b + so_v), lane, vc);
#pragma unroll
      for (int w = 0; w < D / 32; ++w) pv_word(vc, w, pa_);
    }

    // ---- the segment's partial: (m, l) per row and the unnormalized O_rot
    l0 += shfl_xor(l0, 1);
    l0 += shfl_xor(l0, 2);
    l1 += shfl_xor(l1, 1);
    l1 += shfl_xor(l1, 2);
    // dead rows: the empty partial (m = -inf, l = 0, O = 0), as the masked softmax gives them
    if (dead0) m0 = neg_inf(), l0 = 0.f;
    if (dead1) m1 = neg_inf(), l1 = 0.f;
    if constexpr (!T) {
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        if (dead0) o[n][0] = o[n][1] = 0.f;
        if (dead1) o[n][2] = o[n][3] = 0.f;
      }
    } else {
      // Oᵀ: this lane's columns are rows 2q and 2q + 1 (lanes 8q and 8q + 4 hold their lims)
      const bool da = shfl_idx(dead0 ? 1.f : 0.f, 8 * q) != 0.f;
      const bool db = shfl_idx(dead0 ? 1.f : 0.f, 8 * q + 4) != 0.f;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        if (da) o[n][0] = o[n][2] = 0.f;
        if (db) o[n][1] = o[n][3] = 0.f;
      }
    }
    float* po = p.part_o + (size_t)sgi * kRows * D;
    if constexpr (!T) {
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        *reinterpret_cast<float2*>(po + g * D + 8 * n + 2 * q) = make_float2(o[n][0], o[n][1]);
        *reinterpret_cast<float2*>(po + (g + 8) * D + 8 * n + 2 * q) = make_float2(o[n][2], o[n][3]);
      }
    } else if (p.diag & 4) {  // uniform
      // Oᵀ: rows 2q, 2q + 1, channels 16μ + g and 16μ + 8 + g (32-byte runs per row over g)
      float* pr = po + (2 * q) * D + g;  // one address; every store below at a constant offset
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        pr[16 * n] = o[n][0];
        pr[D + 16 * n] = o[n][1];
        pr[16 * n + 8] = o[n][2];
        pr[D + 16 * n + 8] = o[n][3];
      }
    } else {
      // Oᵀ (rows 2q, 2q + 1, channels 16μ + g and 16μ + 8 + g) transposed through the warp's
      // ring, then written as 16-byte rows: 8 rows x D / 128 STG.128 a lane instead of D / 4
      // scalar STG. The ring is free: every copy into it has landed (each lane waited for its
      // last stage) and the __syncwarp below orders every lane's reads of it first; the next
      // segment's ring is issued after a __syncwarp (above).
      constexpr int kPS = D + 4;  // floats a row: 2 kPS = 8 (mod 32) banks, so one store's 32
                                  // lanes (rows 2q or 2q + 1, channels 16μ + g) hit 32 banks
      float* ps = reinterpret_cast<float*>(ring);
      __syncwarp();
      float* pw = ps + (2 * q) * kPS + g;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        pw[16 * n] = o[n][0];
        pw[kPS + 16 * n] = o[n][1];
        pw[16 * n + 8] = o[n][2];
        pw[kPS + 16 * n + 8] = o[n][3];
      }
      __syncwarp();
      constexpr int C4 = D / 4;  // float4 of a row
#pragma unroll
      for (int k = 0; k < kMergeRows8 * C4 / 32; ++k) {
        const int x = k * 32 + lane, r = x / C4, c = x % C4;
        *reinterpret_cast<float4*>(po + r * D + 4 * c) = *reinterpret_cast<const float4*>(ps + r * kPS + 4 * c);
      }
    }
    if (q == 0) {
      float2* ml = reinterpret_cast<float2*>(p.part_ml + (size_t)sgi * kRows * 2);
      ml[g] = make_float2(m0, l0);
      if (R16) ml[g + 8] = make_float2(m1, l1);
    }
  }
  if constexpr (FUSED) fused_merge<D>(p, ring_all);
}

// A fragment position of (row r, column o) in mma.m16n8k16 (common.cuh), as a u16 index into the
// tile's [32][D/16][4] f16x2 fragments
template <int D>
__device__ __forceinline__ size_t frag_at(int tile, int r, int o) {
  const int c = o / 16, cc = o % 16, eta = cc / 8, e = cc % 2, t = (cc % 8) / 2;
  const int lane = (r % 8) * 4 + t, reg = r / 8 + 2 * eta;
  return ((((size_t)tile * 32 + lane) * (D / 16) + c) * 4 + reg) * 2 + e;
}

// Output element (row r, column o = chunk columns + c2) of both prepare kernels from the four
// k-quarters' partial sums in red (matrix 0: Π q, 1: S q), summed in one fixed order:
// Π q scaled, split into f16 hi + lo, and S q scaled when the keys carry QJL.
template <int D, int W>
__device__ __forceinline__ void write_q_element(const PrepareParams& p, const float (&red)[2][4][kRows][W], int tile,
                                                int r, int c2, int o) {
  const float xr = ((red[0][0][r][c2] + red[0][1][r][c2]) + (red[0][2][r][c2] + red[0][3][r][c2])) * p.qscale;
  const size_t at = frag_at<D>(tile, r, o);
  const u16 hi = F16::from_f32(xr);
  reinterpret_cast<u16*>(p.qf)[at] = hi;
  reinterpret_cast<u16*>(p.qf_lo)[at] = F16::from_f32(xr - F16::to_f32(hi));
  if (p.qjl) {
    const float xp = (red[1][0][r][c2] + red[1][1][r][c2]) + (red[1][2][r][c2] + red[1][3][r][c2]);
    reinterpret_cast<u16*>(p.pf)[at] = F16::from_f32(xp * p.pscale);
  }
}

// This thread's quarter of column col of Πᵀ (a) and Sᵀ (c; zeros without QJL), loaded with
// every load issued before the first FMA: one L2 round trip per thread instead of KQ / 8 (the
// kernel is a latency chain at small batch, not a bandwidth one). Πᵀ / Sᵀ are the engine's
// (uploaded before the launch, never rewritten) and read through L2 only, so the v1 kernel
// issues these loads before its wait on the kernel before (see pdl_wait).
template <int D>
__device__ __forceinline__ void load_quarter(const PrepareParams& p, int quarter, int col, float (&a)[D / 4],
                                             float (&c)[D / 4]) {
  constexpr int KQ = D / 4;
  const float* pit = p.pit + (size_t)quarter * KQ * D + col;
  const float* st = p.st + (size_t)quarter * KQ * D + col;
#pragma unroll
  for (int kk = 0; kk < KQ; ++kk) {
    a[kk] = ldcg_f32(pit + (size_t)kk * D);
    c[kk] = p.qjl ? ldcg_f32(st + (size_t)kk * D) : 0.f;
  }
}

// Rows 0 .. N-1 of q_s times a quarter of Πᵀ (and Sᵀ) at one column (a, c: load_quarter): rows
// past the last valid one are skipped by picking N >= that row at run time (invalid rows in
// between hold zeros).
template <int D, int N>
__device__ __forceinline__ void project_rows(const float (*q_s)[D], const float (&a)[D / 4], const float (&c)[D / 4],
                                             int quarter, float (&rot)[kRows], float (&proj)[kRows]) {
  constexpr int KQ = D / 4;
#pragma unroll
  for (int kk = 0; kk < KQ; ++kk) {
    const int k = quarter * KQ + kk;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const float x = q_s[r][k];
      rot[r] = fmaf(a[kk], x, rot[r]);
      proj[r] = fmaf(c[kk], x, proj[r]);
    }
  }
}

// The prepare before issue 10's prepare pass, launched above 8 output tiles (at 128+ it measured
// faster than the spread one below: ~3x fewer instructions in all), at every batch with
// FERRATTN_TQ_PREPARE=v1, and the reference of the bit-identity test. CTA (tile, chunk) of 128
// threads: output columns chunk·32 .. +32 of the tile's 16 rows; thread (quarter, column) sums
// a quarter of the head dim for both Π q and S q, Πᵀ / Sᵀ read from L2 with coalesced loads
// (D / 32 CTAs per tile).
template <int D>
__device__ __forceinline__ void prepare_q_v1(const PrepareParams& p) {
  __shared__ float q_s[kRows][D];
  __shared__ float red[2][4][kRows][33];
  __shared__ long long src_s[kRows];  // element offset of row r's query in q, -1: padding row
  const int tile = blockIdx.x / (D / 32), chunk = blockIdx.x % (D / 32);
  if (tile >= p.batch_tiles) return;
  const int t = threadIdx.x, cl = t & 31, quarter = t >> 5, col = chunk * 32 + cl;
  // Πᵀ / Sᵀ before the wait (issue-10-decode19): their L2 round trip overlaps this CTA's query
  // loads and, under PDL, the kernel before's tail, instead of following both (H200, 16 x 16k:
  // 12.2 -> 9.9-10.6 µs under ncu, the graph step 2.1-3.4 µs shorter)
  float a[D / 4], c[D / 4];
  load_quarter<D>(p, quarter, col, a, c);
  pdl_wait();               // the kernel before may write q, and the decode before it read qf
  pdl_launch_dependents();  // after the wait: see pdl_wait (the decode reads the cache early)
  const int qg = tile % p.qgroups, h = (tile / p.qgroups) % p.heads_kv, b = tile / (p.qgroups * p.heads_kv);
  if (t < kRows) {  // one thread per row: the integer divisions once per row, not per element
    const int R = qg * kRows + t, hl = R / p.max_sq, i = R % p.max_sq;
    src_s[t] = hl < p.group && i < p.seqlens_q[b]
                   ? (((long long)b * p.max_sq + i) * p.heads_q + h * p.group + hl) * D
                   : -1;
  }
  __syncthreads();
  int last = 0;  // rows 0 .. last-1 hold every valid row
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const long long src = src_s[r];
    if (src >= 0) last = r + 1;
    for (int k = t; k < D; k += 128) q_s[r][k] = src >= 0 ? F16::to_f32(p.q[src + k]) : 0.f;
  }
  __syncthreads();
  float rot[kRows], proj[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rot[r] = 0.f, proj[r] = 0.f;
  if (last <= 4) {
    project_rows<D, 4>(q_s, a, c, quarter, rot, proj);
  } else if (last <= 8) {
    project_rows<D, 8>(q_s, a, c, quarter, rot, proj);
  } else {
    project_rows<D, kRows>(q_s, a, c, quarter, rot, proj);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) red[0][quarter][r][cl] = rot[r], red[1][quarter][r][cl] = proj[r];
  __syncthreads();
  for (int x = t; x < kRows * 32; x += 128) {
    const int r = x / 32, c2 = x % 32;
    write_q_element<D>(p, red, tile, r, c2, chunk * 32 + c2);
  }
}

// Rows r0 .. r0+N-1 of q_s times one quarter of one matrix (Πᵀ or Sᵀ, already in registers) at
// one column: the FMA chain of every output element is the v1 kernel's (project_rows), k in
// increasing order from 0.f, so the outputs are bit-identical to it.
template <int D, int N>
__device__ __forceinline__ void project_half(const float (*q_s)[D], const float (&a)[D / 4], int quarter, int r0,
                                             float (&acc)[kRows / 2]) {
  constexpr int KQ = D / 4;
#pragma unroll
  for (int kk = 0; kk < KQ; ++kk) {
    const int k = quarter * KQ + kk;
#pragma unroll
    for (int r = 0; r < N; ++r) acc[r] = fmaf(a[kk], q_s[r0 + r][k], acc[r]);
  }
}

// CTA (tile, chunk) of 128 threads: output columns chunk·8 .. +8 of the tile's 16 rows (D / 8
// CTAs per tile: 128 at batch 1 with 8 KV heads at D = 128, where v1 had 32 with one warp per
// scheduler and ~1216 instructions per warp on the critical path). Thread t: column t % 8,
// k-quarter (t / 8) % 4, matrix (t / 32) % 2 (0: Πᵀ, 1: Sᵀ), row half t / 64 (rows 0-7, 8-15).
// Each thread loads its 32 (D = 128) elements of one matrix column first thing, before the
// query (their L2 round trip overlaps the query's), and runs at most 8 rows of one matrix: a
// quarter of v1's FMAs and half its loads. The quarters are summed in v1's order, so every
// output element is bit-identical to v1's (tested: gpu_turboquant, gpu_decode_matches_the_emulation).
// Launched up to 8 output tiles only: every CTA loads all 16 query rows and its idle warps still
// run the fill and the output, so in all it executes ~3x v1's instructions (480k against 156k at
// batch 1, 32k, ncu): faster at batch 1 (latency), slower at 128+ tiles (throughput).
template <int D>
__device__ __forceinline__ void prepare_q(const PrepareParams& p) {
  constexpr int KQ = D / 4, CH = D / 8, RH = kRows / 2;
  __shared__ float q_s[kRows][D];
  __shared__ float red[2][4][kRows][8];
  __shared__ long long src_s[kRows];  // element offset of row r's query in q, -1: padding head
  __shared__ int pos_s[kRows];
  const int tile = blockIdx.x / CH, chunk = blockIdx.x % CH;
  if (tile >= p.batch_tiles) return;
  const int t = threadIdx.x, cl = t & 7, quarter = (t >> 3) & 3, mat = (t >> 5) & 1, half = t >> 6;
  const int col = chunk * 8 + cl;
  // this thread's quarter of one matrix column: Πᵀ and Sᵀ are the engine's (uploaded before
  // the launch, never rewritten), so they are loaded before anything else, before the wait on
  // the kernel before (through L2 only: see pdl_wait)
  float a[KQ];
  {
    const float* m = (mat ? p.st : p.pit) + (size_t)quarter * KQ * D + col;
    const bool live = mat == 0 || p.qjl;
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) a[kk] = live ? ldcg_f32(m + (size_t)kk * D) : 0.f;
  }
  pdl_wait();               // the kernel before may write q, and the decode before it read qf
  pdl_launch_dependents();  // after the wait: see pdl_wait (the decode reads the cache early)
  const int qg = tile % p.qgroups, h = (tile / p.qgroups) % p.heads_kv, b = tile / (p.qgroups * p.heads_kv);
  if (t < kRows) {  // one thread per row: the integer divisions once per row, not per element
    const int R = qg * kRows + t, hl = R / p.max_sq, i = R % p.max_sq;
    // the row's place in q whether or not i < seqlens_q[b] (in bounds: i < max_sq), so that
    // the query's loads below do not wait for the length's; pos_s: the row's query index
    src_s[t] = hl < p.group ? (((long long)b * p.max_sq + i) * p.heads_q + h * p.group + hl) * D : -1;
    pos_s[t] = i;
  }
  __syncthreads();
  // every element of the tile's rows loaded at once (row x / D of element x = i·128 + t), the
  // sequence's length beside them: one round trip; rows past the length become zeros as in v1
  constexpr int kLoads = kRows * D / 128;
  const int len = p.seqlens_q[b];
  u16 qv[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int x = i * 128 + t;
    const long long src = src_s[x / D];
    qv[i] = src >= 0 ? p.q[src + x % D] : u16(0);
  }
  int last = 0;  // rows 0 .. last-1 hold every valid row
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (src_s[r] >= 0 && pos_s[r] < len) last = r + 1;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int x = i * 128 + t, r = x / D;
    q_s[r][x % D] = src_s[r] >= 0 && pos_s[r] < len ? F16::to_f32(qv[i]) : 0.f;
  }
  __syncthreads();
  float acc[RH];
#pragma unroll
  for (int r = 0; r < RH; ++r) acc[r] = 0.f;
  // rows this half runs: v1 ran rows 0 .. N-1 with N in {4, 8, 16} >= last; rows past N stay
  // 0.f there and here, rows in between hold zero queries in both
  const int n = last - half * RH;
  if (n > 4) {
    project_half<D, 8>(q_s, a, quarter, half * RH, acc);
  } else if (n > 0) {
    project_half<D, 4>(q_s, a, quarter, half * RH, acc);
  }
#pragma unroll
  for (int r = 0; r < RH; ++r) red[mat][quarter][half * RH + r][cl] = acc[r];
  __syncthreads();
  // one output element (row t / 8, column t % 8) per thread
  write_q_element<D>(p, red, tile, t >> 3, t & 7, chunk * 8 + (t & 7));
}

// CTA (tile, part) of kCombineWarps warps merges rows part, part + row_split, ... of its tile.
// The _w16 kernels (16 warps, small batch: one CTA per row in use, see
// ferrattn_cuda::turboquant::merge_warps) give each warp half as many partials (at batch 1, 32k a
// row has ~200: ~2 batches of kBatch loads in a row instead of ~4) and load each warp's first
// batch before pass 1 (it does not depend on M, so its round trip overlaps pass 1's).
// Per row, two passes over the unit partials so that no step waits on the one before (the old
// online merge was a chain of ~S/8 dependent rescales per warp, S = the tile's segments: ~130 at
// batch 1, 32k):
//   1. the row's maximum M over every segment's m (one load per thread, a CTA max);
//   2. each warp takes every kCombineWarps-th segment, kBatch loads in flight, and sums
//      2^(m_s - M) l_s and 2^(m_s - M) O_s (lane: D/32 coordinates of O_rot); the warps' sums
//      are added through shared memory.
// The result is Lean's reduction in another association (exact up to f32 rounding).
// Then O = Πᵀ (O_rot / l) for the CTA's rows, kRowBlock rows at a time: thread (k-slice ks,
// column quad c4) holds its KL rows of Π as float4 (loaded first thing, in flight during the
// merge), the slices are summed through shared memory in a fixed order (deterministic).
template <int D, int kCombineWarps>
__device__ __forceinline__ void combine(const CombineParams& p) {
  constexpr int PER = D / 32;
  constexpr int NT = kCombineWarps * 32;
  constexpr int C4 = D / 4;      // float4 column quads of the un-rotation
  constexpr int KS = NT / C4;    // k-slices (8 at D = 128, 16 at D = 64)
  constexpr int KL = D / KS;     // k per slice (16, 4)
  constexpr int kRowBlock = kCombineWarps > 8 ? 2 : 4;  // rows un-rotated at once (static smem < 48 KiB)
  constexpr bool kPrefetch = kCombineWarps > 8;          // first batch loaded before pass 1 (_w16)
  constexpr int kBatch = 8;      // segments in flight per warp
  __shared__ float wm[kCombineWarps], wl[kCombineWarps];
  __shared__ float wacc[kCombineWarps][D];
  __shared__ __align__(16) float orot[kRows][D];
  __shared__ __align__(16) float ypart[KS][kRowBlock][D];
  __shared__ float ms[kRows], ls[kRows];
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const int c4 = t % C4, ks = t / C4;
  // the next step's prepare may be scheduled now: it reads nothing this kernel writes and writes
  // its query fragments only after its wait (this grid's end, so the decode's too)
  pdl_launch_dependents();
  // this thread's rows of Π for the un-rotation, first thing: they arrive while the decode
  // finishes and the partials are merged. Π is the engine's (uploaded once, never rewritten) and
  // read through L2 only, so before the wait (see pdl_wait)
  float4 a[KL];
#pragma unroll
  for (int kk = 0; kk < KL; ++kk) a[kk] = ldcg_f32x4(p.pi + (size_t)(ks * KL + kk) * D + 4 * c4);
  // the partials are the decode's output (launched with programmatic serialization after it);
  // nothing else global is read before the wait
  pdl_wait();
  const int tile = blockIdx.x / p.row_split, part = blockIdx.x % p.row_split;
  if (tile >= p.tiles) return;
  const int qg = tile % p.qgroups, h = (tile / p.qgroups) % p.heads_kv, b = tile / (p.qgroups * p.heads_kv);
  const int s0 = p.tile_segs[tile], s1 = p.tile_segs[tile + 1];
  const int sq = p.seqlens_q[b];
  int nr = 0;  // rows of this CTA so far (uniform)
  for (int r = part; r < kRows; r += p.row_split) {
    const int R = qg * kRows + r, hl = R / p.max_sq, i = R % p.max_sq;
    if (hl >= p.group) break;  // padding rows of the last tile: every later row is padding too
    // (M, l, O_rot sums) of the row
    float M, l = 0.f, acc[PER];
    // a batch of kBatch partials of this warp (segments sb, sb + kCombineWarps, ...)
    float2 ml[kBatch];
    float ov[kBatch][PER];
    auto load_batch = [&](int sb) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int s = sb + u * kCombineWarps;
        ml[u] = make_float2(neg_inf(), 0.f);
        if (s < s1) {
          ml[u] = *reinterpret_cast<const float2*>(p.part_ml + ((size_t)s * kRows + r) * 2);
          const float* po = p.part_o + ((size_t)s * kRows + r) * D + lane * PER;
          if constexpr (PER == 4) {
            const float4 v = *reinterpret_cast<const float4*>(po);
            ov[u][0] = v.x, ov[u][1] = v.y, ov[u][2] = v.z, ov[u][3] = v.w;
          } else {
            const float2 v = *reinterpret_cast<const float2*>(po);
            ov[u][0] = v.x, ov[u][1] = v.y;
          }
        }
      }
    };
    // _w16: the warp's first batch before pass 1: it does not depend on M, so its round trip
    // overlaps pass 1's (one fewer on the merge's latency chain at small batch)
    if constexpr (kPrefetch) load_batch(s0 + warp);
    // ---- pass 1: M = max_s m_s (a padded query row has no partial worth reading: M = -inf)
    float m = neg_inf();
    if (i < sq)
      for (int s = s0 + t; s < s1; s += NT) m = fmax2(m, p.part_ml[((size_t)s * kRows + r) * 2]);
#pragma unroll
    for (int x = 16; x >= 1; x >>= 1) m = fmax2(m, shfl_xor(m, x));
    if (lane == 0) wm[warp] = m;
    __syncthreads();
    M = neg_inf();
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) M = fmax2(M, wm[w]);
    // ---- pass 2: independent weighted sums (M = -inf: no visible key in any segment)
#pragma unroll
    for (int j = 0; j < PER; ++j) acc[j] = 0.f;
    if (M != neg_inf()) {
      for (int sb = s0 + warp; sb < s1; sb += kBatch * kCombineWarps) {
        if (!kPrefetch || sb != s0 + warp) load_batch(sb);
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (ml[u].x == neg_inf()) continue;  // past the tile's end, or no visible key of this row
          const float f = exp2_approx(ml[u].x - M);
          l = fmaf(ml[u].y, f, l);
#pragma unroll
          for (int j = 0; j < PER; ++j) acc[j] = fmaf(ov[u][j], f, acc[j]);
        }
      }
    }
    if (lane == 0) wl[warp] = l;
#pragma unroll
    for (int j = 0; j < PER; ++j) wacc[warp][lane * PER + j] = acc[j];
    __syncthreads();
    if (t < D) {
      float L = 0.f, A = 0.f;
#pragma unroll
      for (int w = 0; w < kCombineWarps; ++w) L += wl[w], A += wacc[w][t];
      orot[nr][t] = L > 0.f ? A / L * p.oscale : 0.f;
      if (t == 0) ms[nr] = M, ls[nr] = L;
    }
    __syncthreads();  // wm / wl / wacc are rewritten by the next row; orot is read below
    ++nr;
  }
  if (nr == 0) return;
  // rows past nr of the last block are zero (read by the un-rotation, never written out)
  const int nr_pad = (nr + kRowBlock - 1) / kRowBlock * kRowBlock;
  for (int x = nr * D + t; x < nr_pad * D; x += NT) orot[x / D][x % D] = 0.f;
  __syncthreads();
  for (int j0 = 0; j0 < nr; j0 += kRowBlock) {
    float y[kRowBlock][4];
#pragma unroll
    for (int j = 0; j < kRowBlock; ++j) y[j][0] = y[j][1] = y[j][2] = y[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KL; ++kk) {
      const int k = ks * KL + kk;
#pragma unroll
      for (int j = 0; j < kRowBlock; ++j) {
        const float x = orot[j0 + j][k];
        y[j][0] = fmaf(a[kk].x, x, y[j][0]);
        y[j][1] = fmaf(a[kk].y, x, y[j][1]);
        y[j][2] = fmaf(a[kk].z, x, y[j][2]);
        y[j][3] = fmaf(a[kk].w, x, y[j][3]);
      }
    }
#pragma unroll
    for (int j = 0; j < kRowBlock; ++j)
      *reinterpret_cast<float4*>(&ypart[ks][j][4 * c4]) = make_float4(y[j][0], y[j][1], y[j][2], y[j][3]);
    __syncthreads();
    // thread (row j, column o) of the block's rows: sum the k-slices, write O and LSE
    const int nb = min(kRowBlock, nr - j0);
    for (int x = t; x < nb * D; x += NT) {
      const int jj = x / D, oc = x % D, j = j0 + jj;
      const int r = part + j * p.row_split;
      const int R = qg * kRows + r, hl = R / p.max_sq, i = R % p.max_sq;
      const int head = h * p.group + hl;
      float yj = 0.f;
#pragma unroll
      for (int k2 = 0; k2 < KS; ++k2) yj += ypart[k2][jj][oc];
      // padded query rows and rows with no visible key: O = 0 and LSE = -inf, as the emulation
      const float l = ls[j];
      p.o[(((size_t)b * p.max_sq + i) * p.heads_q + head) * D + oc] = F16::from_f32(i < sq && l > 0.f ? yj : 0.f);
      if (oc == 0)
        p.lse[((size_t)b * p.heads_q + head) * p.max_sq + i] =
            i < sq && l > 0.f ? (ms[j] + log2_approx(l)) * 0.6931471805599453f : neg_inf();
    }
    __syncthreads();  // ypart is rewritten by the next block
  }
}

}  // namespace tq
}  // namespace ferrattn

// Closed list (ferrattn_cuda::turboquant::kernel_names): D in {64, 128}; keys with QJL and a 1-2
// bit codebook as crumbs (kqjlc) or a 3-bit one as nibbles (kqjl, 8-entry tables), or without
// QJL with 2 bits as crumbs (knc), 3 (kn8) or 4 bits (kn16); values with 2 bits as crumbs (vc),
// 3 (v8) or 4 bits (v16); 8 or 16 MMA rows in use.
// ATTR: the <= 8-row kernels are launched with 4 to kMaxUnitWarps8 warps per CTA (the host's
// choice), so a register cap rather than launch bounds; the 16-row ones with 4 warps, 2 per SM.
#define FERRATTN_TQ_DECODE(D, KN, QJL, KW, KC, VN, VW, VC, RN, R16, FUSED, ATTR)                \
  extern "C" __global__ void ATTR turboquant_decode_d##D##_##KN##_##VN##_##RN(                 \
      const ferrattn::tq::DecodeParams p) {                                                     \
    ferrattn::tq::decode_unit<D, QJL, KW, VW, R16, FUSED, KC, VC>(p);                           \
  }
// r8f: the 8-row kernel with the merge fused (fused_merge; opt-in, 7-warp CTAs one per SM)
#define FERRATTN_TQ_DECODE_R(D, KN, QJL, KW, KC, VN, VW, VC)                                                         \
  FERRATTN_TQ_DECODE(D, KN, QJL, KW, KC, VN, VW, VC, r8, false, false, __maxnreg__(ferrattn::tq::kMaxRegs8))        \
  FERRATTN_TQ_DECODE(D, KN, QJL, KW, KC, VN, VW, VC, r8f, false, true, __maxnreg__(ferrattn::tq::kMaxRegs8))        \
  FERRATTN_TQ_DECODE(D, KN, QJL, KW, KC, VN, VW, VC, r16, true, false,                                               \
                     __launch_bounds__(ferrattn::tq::kUnitWarps16 * 32, 2))
#define FERRATTN_TQ_DECODE_V(D, KN, QJL, KW, KC)         \
  FERRATTN_TQ_DECODE_R(D, KN, QJL, KW, KC, vc, false, true)    \
  FERRATTN_TQ_DECODE_R(D, KN, QJL, KW, KC, v8, false, false)   \
  FERRATTN_TQ_DECODE_R(D, KN, QJL, KW, KC, v16, true, false)
#define FERRATTN_TQ_DIM(D)                                                                      \
  FERRATTN_TQ_DECODE_V(D, kqjlc, true, false, true)                                             \
  FERRATTN_TQ_DECODE_V(D, kqjl, true, false, false)                                             \
  FERRATTN_TQ_DECODE_V(D, knc, false, false, true)                                              \
  FERRATTN_TQ_DECODE_V(D, kn8, false, false, false)                                             \
  FERRATTN_TQ_DECODE_V(D, kn16, false, true, false)                                             \
  extern "C" __global__ void __launch_bounds__(128) turboquant_prepare_q_d##D(                  \
      const ferrattn::tq::PrepareParams p) {                                                    \
    ferrattn::tq::prepare_q<D>(p);                                                              \
  }                                                                                             \
  /* 4 CTAs an SM (<= 128 registers): with its Πᵀ / Sᵀ quarter held across the wait, ptxas \
     took 148 otherwise (3 a SM, 1.3 waves of 512 CTAs at 16 x 8 KV heads) */                  \
  extern "C" __global__ void __launch_bounds__(128, 4) turboquant_prepare_q_v1_d##D(            \
      const ferrattn::tq::PrepareParams p) {                                                    \
    ferrattn::tq::prepare_q_v1<D>(p);                                                           \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(ferrattn::tq::kCombineWarps * 32, 2)            \
      turboquant_combine_d##D(const ferrattn::tq::CombineParams p) {                            \
    ferrattn::tq::combine<D, ferrattn::tq::kCombineWarps>(p);                                   \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(16 * 32, 1)                                      \
      turboquant_combine_w16_d##D(const ferrattn::tq::CombineParams p) {                        \
    ferrattn::tq::combine<D, 16>(p);                                                            \
  }

FERRATTN_TQ_DIM(64)
FERRATTN_TQ_DIM(128)
