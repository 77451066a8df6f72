// TurboAttention prefill (Kang et al., MLSys 2025, Algorithm 1) on INT8 tensor cores, and the
// compressed KV cache it leaves behind (section 3.1 BPQ, section 3.3 buffer).
//
// Three launches, in stream order (ferrattn_cuda::turbo::CudaTurbo::prefill):
// 1. turbo_quant_kv_*: one CTA per (64-token block and tensor, KV head, sequence): K of block j in
//    CTA 2 j, V in CTA 2 j + 1 (grid.x = 2 nblk). BPQ stage 1 of Alg. 1
//    ("s_K_j = max(abs(K_j))/119, K_j^q1 = round(K_j / s_K_j)", same for V) on chip; writes the
//    INT8 tiles the attention streams (K row-major [64][D], V transposed [D][64] with the keys of
//    each 16-key group in `slot_key` order; with `image`, each 16-byte chunk at its swizzled
//    place for turbo_prefill_wg_*) and the block scales, and, when a cache is attached,
//    BPQ stage 2 of every full block straight from shared memory (Alg. 1 "write K_j^q2 ... to
//    HBM"). Doing this once per KV block instead of once per (query block, query head) keeps
//    the quantization off the attention's critical path and halves the bytes it streams.
// 2. turbo_buffer_tail_*: per (KV head, sequence): the universal scale (max of the block scales:
//    division by 119 is monotone, so it equals max|x| / 119 over all tokens) and the INT8 buffer
//    of the tokens after the last full block (ferrattn_core::turbo::cache module docs).
// 2b. turbo_quant_q_* (before turbo_prefill_wgf_* only): the same stage 1 for the 64-row query
//    blocks ("s_Q_i = max(abs(Q_i))/119"), into INT8 tiles in the K-tile image layout and one
//    scale per (block, query head, sequence), so that the fast kernel's consumers start on a
//    bulk-copied Q block instead of quantizing it (issue 11, round 6).
// 3. turbo_prefill_*: one CTA per (64-row query block, query head, sequence), 4 warps of 16 rows.
//    Q block quantized on chip ("s_Q_i = max(abs(Q_i))/119"), then for each visible K/V tile in
//    ascending order (double-buffered cp.async): S = Q^q1 K^q1 on mma.m16n8k32 s8 (exact s32),
//    S x (s_Q s_K softmax_scale), online softmax with SAS, P~ quantized with s_P = max(P~)/119
//    over the whole 64x64 tile (one cross-warp reduction), l += s_P rowsum(P^q) and
//    O = O r + s_P s_V (P^q V^q1) with P^q V^q1 on the same INT8 MMA, then O / l and LSE.
// Every f32 step is the one ferrattn_core::turbo::attention::attend_tile performs, in its order:
// O is bit-identical to the CPU emulation; LSE differs only by logf's last bit.
#include "common.cuh"
#include "turbo_common.cuh"
#include "sm90.cuh"

namespace ferrattn {
namespace turbo {

// Mirrors ferrattn_cuda::turbo::QuantParams (#[repr(C)]).
struct QuantParams {
  const u16* k;     // [batch, max_s, heads_kv, D]
  const u16* v;     // [batch, max_s, heads_kv, D]
  const int* lens;  // [batch] tokens of each sequence to quantize
  i8* kq;           // [batch, heads_kv, nblk, 64, D] INT8 K tiles, or null
  i8* vt;           // [batch, heads_kv, nblk, D, 64] INT8 V^T tiles in slot order, or null
  float* ks;        // [batch, heads_kv, nblk] block scales of K
  float* vs;        // [batch, heads_kv, nblk] block scales of V
  CacheParams cache;  // cache.k.codes == null: no cache is written
  int batch, max_s, heads_kv, nblk;
  int image;  // 1: kq / vt tiles in the swizzled wgmma image layout (turbo_prefill_wg_*)
};

// Mirrors ferrattn_cuda::turbo::PrefillParams (#[repr(C)]).
struct PrefillParams {
  const u16* q;            // [batch, max_sq, heads_q, D]
  u16* o;                  // [batch, max_sq, heads_q, D]
  float* lse;              // [batch, heads_q, max_sq], natural log
  const int* seqlens_q;    // [batch]
  const int* seqlens_k;    // [batch]
  const i8* kq;            // as QuantParams
  const i8* vt;
  const float* ks;
  const float* vs;
  int batch, max_sq, heads_q, heads_kv, group, nblk;
  int causal;              // bottom-right causal mask
  int sas;                 // 1: SAS exponentials, 0: expf
  int sas_nr;              // SAS threshold n_r
  float softmax_scale;
  int order;               // turbo_prefill_wgf_*: 0 the KV head's CTAs together, 1 trip-major (wgf_cta)
  u64* trace;              // turbo_prefill_wgf_*: null, or kTraceWords per CTA (wgf_trace_slot)
  // turbo_prefill_wgf_*: the Q blocks turbo_quant_q_* wrote (the K-tile image layout, codes and
  // scales those of the on-chip prologue of turbo_prefill_wg_*, bit for bit)
  const i8* qq;            // [batch, heads_q, ceil(max_sq / 64), 64, D] INT8 Q tiles
  const float* qs;         // [batch, heads_q, ceil(max_sq / 64)] block scales s_Q
};

// kTensors 2: K and V (turbo_quant_kv_*); 1: K alone, which turbo_quant_q_* uses for the query
// blocks of the fast prefill (k = q, heads_kv = heads_q, max_s = max_sq, lens = seqlens_q,
// nblk = ceil(max_sq / 64), kq / ks = PrefillParams::qq / qs, image 1, no cache): the same
// "s_Q_i = max(abs(Q_i))/119, Q_i^q1 = round(Q_i / s_Q_i)" as the wg kernels' prologue, whose
// amax (a max, order-free), int8_scale and quantize_int8 it shares; rows past the sequence are 0
// there and here, and a block with no row is not written (no warpgroup reads it).
//
// Round 21: each thread loads its 16-channel chunks of the block once into registers; amax is a
// max of the elements' magnitude bits (a 16-bit float's order is its bits' order; a NaN or an inf
// sorts above every finite value); where the block's s is normal and amax finite (every block of
// finite inputs but the tiniest), the codes come from the registers through int8_code_bits (no
// division an element) and a K / Q chunk is stored straight to its tile as 16 bytes; any other
// block takes main's loop (global reads, quantize_int8, main's NaN order), so every code and
// scale is main's, bit for bit.
template <class T, int D, int kTensors = 2>
__device__ __forceinline__ void quant_kv_body(const QuantParams& p) {
  constexpr int V8 = D / 8;                         // 16-byte vectors per row
  constexpr int V16 = D / 16;                       // 16-channel chunks per row
  constexpr int kPer = kBlock * V16 / kThreads;     // chunks per thread and tensor
  static_assert(kPer * kThreads == kBlock * V16, "whole chunks per thread");
  __shared__ alignas(16) i8 sx[kBlock * D];
  __shared__ alignas(16) u8 spar[2 * D];
  __shared__ float red[kThreads / 32];
  // kTensors 2: K of block j in CTA 2 j, V in CTA 2 j + 1 (round 21: one tensor a CTA, as the Q
  // pass: ptxas keeps one tensor's loads in registers, 61 at bf16 d 128, 8 CTAs an SM)
  const int which = kTensors == 2 ? (int)(blockIdx.x & 1) : 0;
  const int j = kTensors == 2 ? (int)(blockIdx.x >> 1) : (int)blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int n = clampi(p.lens[b] - j * kBlock, 0, kBlock);
  if (n == 0) return;
  const u64 blk = ((u64)b * p.heads_kv + hk) * p.nblk + j;
  const u16* src = which ? p.v : p.k;
  auto row_ptr = [&](int t) { return src + ((u64)(b * p.max_s + j * kBlock + t) * p.heads_kv + hk) * D; };
  // chunk i = threadIdx.x + kThreads k: row i / V16, channels 16 (i % V16) .. + 15; rows past n are 0
  Vec16 x[kPer][2];
  u32 mag_hi = 0, mag_lo = 0;  // max magnitude bits of the high / low halves of the words
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = threadIdx.x + kThreads * k, t = i / V16, c = i % V16;
    x[k][0] = x[k][1] = Vec16{0u, 0u, 0u, 0u};
    if (t < n) {
      x[k][0] = ld_global_nc16(row_ptr(t) + 16 * c);
      x[k][1] = ld_global_nc16(row_ptr(t) + 16 * c + 8);
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32 w[4] = {x[k][h].x, x[k][h].y, x[k][h].z, x[k][h].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        mag_hi = max(mag_hi, w[e] & 0x7fff0000u);
        mag_lo = max(mag_lo, w[e] & 0x7fffu);
      }
    }
  const float amax = T::to_f32((u16)block_max_u32(max(mag_hi >> 16, mag_lo), red));
  float s = int8_scale(amax);
  // block-uniform: amax is the same in every thread
  const bool fast = amax <= kFloatMax && s >= kFloatMinNormal;
  const bool direct = which == 0 && p.cache.k.codes == nullptr;  // K / Q codes feed only their tile
  if (fast) {
    const float r = div_rn(1.0f, s);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = threadIdx.x + kThreads * k, t = i / V16, c = i % V16;
      u32 code[4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float f[8];
        unpack8<T>(x[k][h], f);
        code[2 * h] = pack_low_bytes(int8_code_bits(f[0], s, r), int8_code_bits(f[1], s, r),
                                     int8_code_bits(f[2], s, r), int8_code_bits(f[3], s, r));
        code[2 * h + 1] = pack_low_bytes(int8_code_bits(f[4], s, r), int8_code_bits(f[5], s, r),
                                         int8_code_bits(f[6], s, r), int8_code_bits(f[7], s, r));
      }
      const Vec16 v{code[0], code[1], code[2], code[3]};
      if (!direct) {
        *reinterpret_cast<Vec16*>(sx + t * D + 16 * c) = v;
      } else if (p.kq != nullptr) {
        i8* dst = p.kq + blk * (kBlock * D);
        *reinterpret_cast<Vec16*>(dst + (p.image ? swz<V16>(t, c) : 16 * i)) = v;
      }
    }
  } else {
    // main's loop: a NaN or an inf in the block, or a subnormal (or zero) s
    float am = 0.0f;
    for (int i = threadIdx.x; i < n * V8; i += kThreads) {
      float f[8];
      unpack8<T>(ld_global_nc16(row_ptr(i / V8) + (i % V8) * 8), f);
      for (int e = 0; e < 8; ++e) am = fmax2(am, fabsf(f[e]));
    }
    s = int8_scale(block_max(am, red));
    for (int i = threadIdx.x; i < kBlock * V8; i += kThreads) {
      const int t = i / V8, c8 = i % V8;
      u32 lo = 0, hi = 0;
      if (t < n) {
        float f[8];
        unpack8<T>(ld_global_nc16(row_ptr(t) + c8 * 8), f);
        lo = pack4_u8(quantize_int8(f[0], s), quantize_int8(f[1], s), quantize_int8(f[2], s), quantize_int8(f[3], s));
        hi = pack4_u8(quantize_int8(f[4], s), quantize_int8(f[5], s), quantize_int8(f[6], s), quantize_int8(f[7], s));
      }
      reinterpret_cast<u32*>(sx + t * D + c8 * 8)[0] = lo;
      reinterpret_cast<u32*>(sx + t * D + c8 * 8)[1] = hi;
    }
  }
  if (!(fast && direct)) __syncthreads();  // sx written (block-uniform)
  if (threadIdx.x == 0) (which ? p.vs : p.ks)[blk] = s;
  if (which == 0 && p.kq != nullptr && !(fast && direct)) {
    i8* dst = p.kq + blk * (kBlock * D);
    for (int i = threadIdx.x; i < kBlock * D / 16; i += kThreads) {
      const int row = i / (D / 16), ch = i % (D / 16);
      const int at = p.image ? swz<D / 16>(row, ch) : 16 * i;
      *reinterpret_cast<Vec16*>(dst + at) = reinterpret_cast<const Vec16*>(sx)[i];
    }
  }
  if (which == 1 && p.vt != nullptr) {
    // V^T: row c holds channel c of the 64 keys in slot order, 16 slots per 16-byte chunk.
    // Item i: channels 4 c4 .. + 3 (lane c4: one bank each) of the 16 slots of quarter q; per 4
    // slots, one 32-bit word of each of their keys, transposed as 4 x 4 bytes by 8 PRMT.
    u8* dst = reinterpret_cast<u8*>(p.vt + blk * (D * kBlock));
    const u32* sx32 = reinterpret_cast<const u32*>(sx);
    for (int i = threadIdx.x; i < D; i += kThreads) {
      const int c4 = i % (D / 4), q = i / (D / 4);
      u32 w[4][4];  // [channel 4 c4 + e][group k of 4 slots]
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        u32 x[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) x[m] = sx32[slot_key(16 * q + 4 * k + m) * (D / 4) + c4];
        const u32 t0 = __byte_perm(x[0], x[1], 0x5140), t1 = __byte_perm(x[0], x[1], 0x7362);
        const u32 t2 = __byte_perm(x[2], x[3], 0x5140), t3 = __byte_perm(x[2], x[3], 0x7362);
        w[0][k] = __byte_perm(t0, t2, 0x5410);
        w[1][k] = __byte_perm(t0, t2, 0x7632);
        w[2][k] = __byte_perm(t1, t3, 0x5410);
        w[3][k] = __byte_perm(t1, t3, 0x7632);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 4 * c4 + e;
        const int at = p.image ? swz<4>(c, q) : c * kBlock + q * 16;
        reinterpret_cast<Vec16*>(dst + at)[0] = Vec16{w[e][0], w[e][1], w[e][2], w[e][3]};
      }
    }
  }
  if (p.cache.k.codes != nullptr && n == kBlock) {
    const CacheView& cv = which ? p.cache.v : p.cache.k;
    const int bits = p.cache.head_bits[hk];
    u8* codes = cv.codes + (u64)b * p.cache.seq_code_bytes + p.cache.head_off[hk] + (u64)j * (kBlock * D * bits / 8);
    const u64 pb = ((u64)b * p.heads_kv + hk) * p.cache.cap_blocks + j;
    compress_block<D>(sx, spar, bits, codes, cv.par + pb * 2 * D, cv.clamp + pb);
    if (threadIdx.x == 0) cv.bscale[pb] = s;
  }
}

template <class T, int D>
__device__ __forceinline__ void buffer_tail_body(const QuantParams& p) {
  __shared__ float red[kThreads / 32];
  const int hk = blockIdx.x, b = blockIdx.y;
  const int len = p.lens[b];
  const int full = len / kBlock, ntail = len % kBlock, nb = (len + kBlock - 1) / kBlock;
  for (int which = 0; which < 2; ++which) {
    const float* scales = (which ? p.vs : p.ks) + ((u64)b * p.heads_kv + hk) * p.nblk;
    float u = 0.0f;
    for (int j = threadIdx.x; j < nb; j += kThreads) u = fmax2(u, scales[j]);
    u = block_max(u, red);
    const CacheView& cv = which ? p.cache.v : p.cache.k;
    if (threadIdx.x == 0) cv.buf_scale[(u64)b * p.heads_kv + hk] = u;
    const u16* src = which ? p.v : p.k;
    for (int i = threadIdx.x; i < ntail * D; i += kThreads) {
      const int t = i / D, c = i % D;
      const float x = T::to_f32(src[((u64)(b * p.max_s + full * kBlock + t) * p.heads_kv + hk) * D + c]);
      cv.buf[(((u64)b * p.heads_kv + hk) * kBlock + t) * D + c] = (i8)quantize_int8(x, u);
    }
  }
}

// O = acc / l rounded to T and LSE = m + ln l for a thread's two rows (row_a, row_a + 8) of the
// mma / wgmma accumulator layout; a row that saw no key gets 0 and -inf. kExact: one IEEE
// division per element (the emulation's bits); else one reciprocal per row.
template <class T, int D, bool kExact>
__device__ __forceinline__ void store_rows(const PrefillParams& p, int b, int h, int t4, int row_a, float m_a,
                                           float l_a, float m_b, float l_b, const float (&o)[D / 8][4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_a + 8 * half;
    if (row >= p.max_sq) continue;
    const float m = half ? m_b : m_a, l = half ? l_b : l_a;
    const bool empty = m == neg_inf() || l == 0.0f;
    const float inv_l = empty || kExact ? 0.0f : div_rn(1.0f, l);
    auto out = [&](float x) { return empty ? 0.0f : kExact ? div_rn(x, l) : __fmul_rn(x, inv_l); };
    u16* dst = p.o + ((u64)(b * p.max_sq + row) * p.heads_q + h) * D + 2 * t4;
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      *reinterpret_cast<u32*>(dst + i * 8) = pack2(T(), out(o[i][2 * half]), out(o[i][2 * half + 1]));
    if (t4 == 0) p.lse[((u64)b * p.heads_q + h) * p.max_sq + row] = empty ? neg_inf() : add_rn(m, logf(l));
  }
}

// store_rows<T, D, false>'s values (the same bits), stored as 16-byte vectors (turbo_prefill_wgf_*,
// round 11): a quad's four threads hold channels 8 i + 2 t4, + 1 of a row (i < D / 8); a 4 x 4
// transpose of 32-bit words within the quad per 32 channels (two shuffle stages) gives thread t4
// the 16 bytes of channels 8 (4 k + t4) .. + 7, so a row takes D / 32 16-byte stores per thread
// instead of D / 8 4-byte ones, and a warp's store touches 8 rows x 64 bytes instead of 8 x 16.
// (Round 11's per-CTA timeline at 4 x 4096 on an H200: from the loop's end to the rows stored
// 2.0-2.1 us per CTA with store_rows' 32 STG.32 per consumer thread, 1.3-1.4 us with these.)
// Every lane runs the shuffles; rows past max_sq store nothing.
template <class T, int D>
__device__ __forceinline__ void store_rows_v4(const PrefillParams& p, int b, int h, int t4, int row_a, float m_a,
                                              float l_a, float m_b, float l_b, const float (&o)[D / 8][4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_a + 8 * half;
    const float m = half ? m_b : m_a, l = half ? l_b : l_a;
    const bool empty = m == neg_inf() || l == 0.0f;
    const float inv_l = empty ? 0.0f : div_rn(1.0f, l);
    auto out = [&](float x) { return empty ? 0.0f : __fmul_rn(x, inv_l); };
    u32 w[D / 8];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) w[i] = pack2(T(), out(o[i][2 * half]), out(o[i][2 * half + 1]));
    // after the stages, w[4 k + j] holds channels 8 (4 k + t4) + 2 j, + 1
#pragma unroll
    for (int k = 0; k < D / 32; ++k)
#pragma unroll
      for (int m2 = 1; m2 <= 2; m2 <<= 1) {
        const bool bit = (t4 & m2) != 0;
#pragma unroll
        for (int lo = 0; lo < 4; ++lo) {
          if (lo & m2) continue;
          u32& vl = w[4 * k + lo];
          u32& vh = w[4 * k + (lo | m2)];
          const u32 r = __shfl_xor_sync(0xffffffffu, bit ? vl : vh, m2);
          if (bit) vl = r; else vh = r;
        }
      }
    if (row < p.max_sq) {
      u16* dst = p.o + ((u64)(b * p.max_sq + row) * p.heads_q + h) * D;
#pragma unroll
      for (int k = 0; k < D / 32; ++k)
        *reinterpret_cast<uint4*>(dst + 8 * (4 * k + t4)) =
            make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
      if (t4 == 0) p.lse[((u64)b * p.heads_q + h) * p.max_sq + row] = empty ? neg_inf() : add_rn(m, logf(l));
    }
  }
}

template <class T, int D>
__device__ __forceinline__ void prefill_body(const PrefillParams& p) {
  constexpr int KC = D / 16;  // 16-byte chunks per Q / K row
  constexpr int KS = D / 32;  // k32 slices of Q K^T
  constexpr int NTO = D / 8;  // n8 tiles of O
  constexpr int NQV = kBlock * D / 8 / kThreads;  // Q vectors per thread
  __shared__ alignas(128) i8 sK[2][kBlock * D];
  __shared__ alignas(128) i8 sV[2][D * kBlock];
  __shared__ alignas(128) i8 sQ[kBlock * D];
  __shared__ float sLut[17];
  __shared__ float sRed[2][kThreads / 32];
  __shared__ float sAmax[kThreads / 32];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int qb = gridDim.x - 1 - blockIdx.x;  // the longest causal query blocks start first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const int sq = p.seqlens_q[b], sk = p.seqlens_k[b];
  const int r0 = qb * kBlock;
  const int nq = clampi(sq - r0, 0, kBlock);
  sas_lut_init(sLut);

  // ---- Q block to INT8 with one scale ----------------------------------------------------------
  Vec16 qv[NQV];
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < NQV; ++k) {
    const int i = tid + k * kThreads, row = i / (D / 8), c8 = i % (D / 8);
    qv[k] = Vec16{0, 0, 0, 0};
    if (row < nq) {
      qv[k] = ld_global_nc16(p.q + ((u64)(b * p.max_sq + r0 + row) * p.heads_q + h) * D + c8 * 8);
      float f[8];
      unpack8<T>(qv[k], f);
      for (int e = 0; e < 8; ++e) amax = fmax2(amax, fabsf(f[e]));
    }
  }
  const float s_q = int8_scale(block_max(amax, sAmax));
#pragma unroll
  for (int k = 0; k < NQV; ++k) {
    const int i = tid + k * kThreads, row = i / (D / 8), c8 = i % (D / 8);
    float f[8];
    unpack8<T>(qv[k], f);
    u32* dst = reinterpret_cast<u32*>(sQ + swz<KC>(row, c8 >> 1) + (c8 & 1) * 8);
    dst[0] = pack4_u8(quantize_int8(f[0], s_q), quantize_int8(f[1], s_q), quantize_int8(f[2], s_q), quantize_int8(f[3], s_q));
    dst[1] = pack4_u8(quantize_int8(f[4], s_q), quantize_int8(f[5], s_q), quantize_int8(f[6], s_q), quantize_int8(f[7], s_q));
  }

  // ---- visibility (bottom-right causal) -------------------------------------------------------
  auto visible = [&](int row) -> int {
    if (row >= sq) return 0;
    if (!p.causal) return sk;
    return clampi(row + sk - sq + 1, 0, sk);
  };
  const int row_a = r0 + warp * 16 + g, row_b = row_a + 8;
  const int vis_a = visible(row_a), vis_b = visible(row_b);
  const int reach = nq == 0 ? 0 : visible(r0 + nq - 1);  // the last valid row sees the most keys
  const int ntiles = (reach + kBlock - 1) / kBlock;
  const u64 kv_base = ((u64)b * p.heads_kv + hk) * p.nblk;

  auto load_tile = [&](int j, int st) {
    const i8* gk = p.kq + (kv_base + j) * (kBlock * D);
    const i8* gv = p.vt + (kv_base + j) * (D * kBlock);
    for (int i = tid; i < kBlock * KC; i += kThreads) {
      const int row = i / KC, ch = i % KC;
      cp_async16(&sK[st][swz<KC>(row, ch)], gk + row * D + ch * 16, true);
    }
    for (int i = tid; i < D * 4; i += kThreads) {
      const int row = i >> 2, ch = i & 3;
      cp_async16(&sV[st][swz<4>(row, ch)], gv + row * kBlock + ch * 16, true);
    }
  };
  if (ntiles > 0) {
    load_tile(0, 0);
    cp_async_commit();
  }
  __syncthreads();  // sQ and the LUT are visible

  u32 qa[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    const int mi = lane >> 3;
    ldmatrix_x4(qa[ks], &sQ[swz<KC>(warp * 16 + (lane & 7) + 8 * (mi & 1), 2 * ks + (mi >> 1))]);
  }

  float o[NTO][4];
#pragma unroll
  for (int nt = 0; nt < NTO; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m_a = neg_inf(), m_b = neg_inf(), l_a = 0.0f, l_b = 0.0f;
  const Exp ex{sLut, (float)p.sas_nr, p.sas};

  for (int j = 0; j < ntiles; ++j) {
    const int st = j & 1;
    cp_async_wait<0>();
    __syncthreads();  // tile j landed; every warp is done with tile j - 1
    if (j + 1 < ntiles) {
      load_tile(j + 1, st ^ 1);
      cp_async_commit();
    }

    // S = Q^q1 K^q1 (exact s32)
    int s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0;
#pragma unroll
      for (int kk = 0; kk < KS / 2; ++kk) {
        u32 kb[4];
        ldmatrix_x4(kb, &sK[st][swz<KC>(nt * 8 + (lane & 7), 4 * kk + (lane >> 3))]);
        mma_s8(s[nt], qa[2 * kk], kb[0], kb[1]);
        mma_s8(s[nt], qa[2 * kk + 1], kb[2], kb[3]);
      }
    }

    // scaled logits, masked, and the row maxima of this tile
    const float alpha = mul_rn(mul_rn(s_q, p.ks[kv_base + j]), p.softmax_scale);
    const int key0 = j * kBlock;
    float pf[8][4];
    float tmax_a = neg_inf(), tmax_b = neg_inf();
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + nt * 8 + 2 * t4 + (e & 1);
        const bool v = key < (e < 2 ? vis_a : vis_b);
        pf[nt][e] = v ? mul_rn(i2f(s[nt][e]), alpha) : neg_inf();
      }
      tmax_a = fmax2(tmax_a, fmax2(pf[nt][0], pf[nt][1]));
      tmax_b = fmax2(tmax_b, fmax2(pf[nt][2], pf[nt][3]));
    }
    tmax_a = fmax2(tmax_a, shfl_xor(tmax_a, 1));
    tmax_a = fmax2(tmax_a, shfl_xor(tmax_a, 2));
    tmax_b = fmax2(tmax_b, shfl_xor(tmax_b, 1));
    tmax_b = fmax2(tmax_b, shfl_xor(tmax_b, 2));
    // a row with no visible key in this tile keeps its state (m_new = m, r = 1, no update)
    const bool any_a = key0 < vis_a, any_b = key0 < vis_b;
    const float mn_a = fmax2(m_a, tmax_a), mn_b = fmax2(m_b, tmax_b);
    const float r_a = ex.rescale(m_a, mn_a), r_b = ex.rescale(m_b, mn_b);
    float pm = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = pf[nt][e];
        pf[nt][e] = x == neg_inf() ? 0.0f : ex(sub_rn(x, e < 2 ? mn_a : mn_b));
        pm = fmax2(pm, pf[nt][e]);
      }
    }
    // s_P = max(P~) / 119 over the whole 64 x 64 tile (every row of the query block)
    pm = warp_max(pm);
    if (lane == 0) sRed[st][warp] = pm;
    __syncthreads();
    float pmax = sRed[st][0];
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) pmax = fmax2(pmax, sRed[st][w]);
    const float s_p = int8_scale(pmax);

    int code[8][4];
    int rs_a = 0, rs_b = 0;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = s_p == 0.0f ? 0 : clampi(rne_int(div_rn(pf[nt][e], s_p)), 0, 127);
        code[nt][e] = c;
        if (e < 2) rs_a += c; else rs_b += c;
      }
    }
    rs_a += shfl_xor_i(rs_a, 1);
    rs_a += shfl_xor_i(rs_a, 2);
    rs_b += shfl_xor_i(rs_b, 1);
    rs_b += shfl_xor_i(rs_b, 2);
    if (any_a) l_a = fma_rn(i2f(rs_a), s_p, mul_rn(l_a, r_a));
    if (any_b) l_b = fma_rn(i2f(rs_b), s_p, mul_rn(l_b, r_b));
    m_a = mn_a;
    m_b = mn_b;

    // P^q straight from the accumulator layout into A registers (keys in slot order)
    u32 pa[2][4];
#pragma unroll
    for (int k2 = 0; k2 < 2; ++k2) {
      const int n0 = 4 * k2;
      pa[k2][0] = pack4_u8(code[n0][0], code[n0][1], code[n0 + 1][0], code[n0 + 1][1]);
      pa[k2][1] = pack4_u8(code[n0][2], code[n0][3], code[n0 + 1][2], code[n0 + 1][3]);
      pa[k2][2] = pack4_u8(code[n0 + 2][0], code[n0 + 2][1], code[n0 + 3][0], code[n0 + 3][1]);
      pa[k2][3] = pack4_u8(code[n0 + 2][2], code[n0 + 2][3], code[n0 + 3][2], code[n0 + 3][3]);
    }
    const float c_pv = mul_rn(s_p, p.vs[kv_base + j]);
#pragma unroll
    for (int nt = 0; nt < NTO; ++nt) {
      u32 vb[4];
      ldmatrix_x4(vb, &sV[st][swz<4>(nt * 8 + (lane & 7), lane >> 3)]);
      int acc[4] = {0, 0, 0, 0};
      mma_s8(acc, pa[0], vb[0], vb[1]);
      mma_s8(acc, pa[1], vb[2], vb[3]);
      if (any_a) {
        o[nt][0] = fma_rn(i2f(acc[0]), c_pv, mul_rn(o[nt][0], r_a));
        o[nt][1] = fma_rn(i2f(acc[1]), c_pv, mul_rn(o[nt][1], r_a));
      }
      if (any_b) {
        o[nt][2] = fma_rn(i2f(acc[2]), c_pv, mul_rn(o[nt][2], r_b));
        o[nt][3] = fma_rn(i2f(acc[3]), c_pv, mul_rn(o[nt][3], r_b));
      }
    }
  }

  store_rows<T, D, true>(p, b, h, t4, row_a, m_a, l_a, m_b, l_b, o);
}


// ---- turbo_prefill_wg_*: the same Alg. 1 on Hopper warpgroup MMA (sm_90a) --------------------
// One CTA = three consumer warpgroups (one 64-row Q block each, same head) and a producer
// warpgroup (one thread issues the copies; setmaxnreg gives the consumers 160 registers). The
// producer streams the INT8 K and V^T tiles turbo_quant_kv_* wrote in the "image" layout (the
// exact bytes the wgmma shared-memory descriptors read: K rows of D bytes with the 128- or
// 64-byte swizzle, V^T rows of 64 keys with the 64-byte swizzle) into a kWgStages-deep ring, one
// bulk copy per tile, completion counted on transaction mbarriers. Each warpgroup quantizes its
// Q block into shared memory in the K-tile layout (wgf: the producer copies the block
// turbo_quant_q_* quantized, before the first K/V tiles); per 64-key tile it issues S = Q^q1 K^q1 as
// D / 32 wgmma.m64n64k32.s8 (both operands in shared memory), runs the SAS online softmax on the
// accumulator registers, packs P^q into A registers (keys in slot order, which the V^T image
// shares) and issues P^q V^q1 in passes of 64 channels (two wgmma.m64n64k32.s8 each, P from
// registers), folding each pass into O.
//
// Numerics: the steps of attend_tile (see prefill_body), with exact rewrites (floor and
// round-half-even through the 1.5 x 2^23 bias: identical bits, but on the FMA pipe; integer ->
// f32 stays cvt.rn, which sm_90 runs as I2FP at full rate) and two departures:
// Q(P~) = rne(P~ x (1 / s_P)) instead of rne(P~ / s_P), which moves a code by one where
// P~ / s_P lies within an ulp or two of a half-integer, and x == n_r exactly gives 0 (ex_sas).
// O matches the emulation to well under 1e-3 relative, no longer bit for bit
// (backends/cuda/tests/gpu_turbo.rs measures both); the mma.sync kernel above stays the
// bit-exact path.
constexpr int kWgStages = 4;           // K/V tiles in flight per CTA
constexpr int kWgConsumers = 3;        // consumer warpgroups (Q blocks) per CTA
constexpr int kWgThreads = kWgConsumers * 128 + 128;  // + the producer warpgroup
// registers per thread after setmaxnreg: 128 x (24 + 3 x 160) <= 64 Ki
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 160;
// turbo_prefill_wgf_* (issue 11, round 4): three consumer warpgroups of 160 registers, each
// with one pair of S buffers (the S of a chunk of two 64-key tiles); eight K/V tiles in flight.
// Mirrored by ferrattn_cuda::turbo::WGF_SHAPE. (Two warpgroups of 240 registers with two pairs of
// buffers, the next chunk's S in flight behind the P V passes, measured 0.83-0.88x this shape:
// docs/TURBO_CUDA.md, "Prefill: chunks of two tiles, one O fold per chunk"; source at d2b3482.)
constexpr int kWgfStages = 8;
constexpr int kWgfConsumers = 3;
constexpr int kWgfThreads = kWgfConsumers * 128 + 128;
constexpr int kWgfConsumerRegs = 160;

__device__ __forceinline__ int byte_sum(u32 w, int acc) {
  int r;
  asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(0x01010101u), "r"(acc));
  return r;
}


// turbo_prefill_wgf_*, the INT32 path: one tile's constants (round 9; 16 bytes, one LDS.128)
struct alignas(16) TileConsts {
  float c2;   // ((s_Q s_K) softmax_scale) log2(e)
  float w;    // w' = (s_u / s_V) 2^-n, in [1, 2) (round 10: the mantissa of s_u / s_V)
  float off;  // -log2(w')
  int unit;   // round 10: byte 0 dn = n_prev - n (the unit's move at this tile, two's
              // complement), byte 1 gk = 149 - (n - n_min) (the guard's exponent bound),
              // bits 16.. n = floor(log2(s_u / s_V)) in 0..6
};

struct True {
  static constexpr bool value = true;
};
struct False {
  static constexpr bool value = false;
};

// The CTA of turbo_prefill_wgf_* (issue 11, round 5): a CTA's three consumer warpgroups take
// consecutive items of its KV head's list of (query block qb, query head of the group hg),
// qb-major (item = qb x group + hg), so its three Q blocks may belong to different query heads
// of the group; they share the K/V stream. At 4 x 4096 with 32 / 8 heads this is 2,752 CTAs (21
// waves of 132) where one query head per CTA gave 2,816 (22 waves, the last a third full), and
// a causal CTA's three blocks see tile counts at most one apart (two before). The grid holds
// ceil(group x nqb / 3) trips, KV heads and sequences; the CTA's items are 3 trip .. 3 trip + 2,
// and trip counts down as the hardware's dispatch order (the linear block index) counts up: the
// longest causal blocks first. order 0: grid (trips, KV heads, batch), the CTAs of one KV head
// consecutive; order 1: grid (KV heads, batch, trips), trip-major: the longest blocks of every
// head and sequence first (a better fill of the last wave for causal prefill). The special
// registers are read through asm volatile, so that a second call (before the store) recomputes
// the coordinates instead of keeping them live across the tile loop.
struct WgfCta {
  int trip, hk, b;
};
__device__ __forceinline__ WgfCta wgf_cta(int order) {
  int bx, by, bz, n;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(bx));
  asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(by));
  asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(bz));
  if (order) {
    asm volatile("mov.u32 %0, %%nctaid.z;" : "=r"(n));
    return WgfCta{n - 1 - bz, bx, by};
  }
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(n));
  return WgfCta{n - 1 - bx, by, bz};
}

// A diagnostic of turbo_prefill_wgf_* (ferrattn_cuda's FERRATTN_WGF_TRACE; null otherwise):
// per CTA, at its linear block index (the dispatch order), kTraceWords words: 0 globaltimer at
// entry, 1 clock64 at entry, 2 clock64 once warpgroup 0's Q block is in shared memory, 3 once
// its tile loop is done, 4 once its rows are stored (after the tiles only the other warpgroups
// need), 5 globaltimer then, 6 the latest globaltimer at which a consumer warpgroup stored its
// rows (a max over the three), 7 SM id | the CTA's tiles << 32, 8 clock64 once the producer
// thread starts issuing copies, 9 clock64 once warpgroup 0's tile 0 has landed (its first S
// issued). Read by docs/TURBO_CUDA.md's profiles of rounds 5 and 6
// (docs/results/turbo-prefill6-h200-2026-11-26/trace_summary.py).
//
// Round 11: word 8 is taken before the sequence-length loads that words 0, 1 and 7 wait for (the
// producer now starts its copies first), so it may precede word 1. Round 11's timeline
// (FERRATTN_WGF_TIMELINE defined at compile time: an nvcc wrapper,
// docs/results/turbo-prefill11-h200-2026-11-26/nvcc_timeline.sh, or FERRATTN_NVRTC_DEFINES with
// Options::force_nvrtc; off in the shipped kernels, whose code it does not change apart from
// this trace's stride): per consumer warpgroup w (0..2), clock64 at 10 + w its Q block in shared
// memory, 13 + w its tile 0's S issued, 16 + w its first P V issued, 19 + 8 w + k the start of
// its step of tile 8 k (k < 8; INT32 path only), 43 + w its loop done, 46 + w its rows stored;
// 49 clock64 once the producer has issued its last copy, 50 + w warpgroup w's tile count.
// Read by docs/results/turbo-prefill11-h200-2026-11-26/timeline.py.
#ifndef FERRATTN_WGF_TIMELINE
#define FERRATTN_WGF_TIMELINE 0
#endif
// Round 14's diagnostics of the INT32 path's exact rescale (docs/TURBO_CUDA.md, "Prefill: the
// exact rescale's shifts ..."), both 0 in the shipped kernels and defined only by an nvcc wrapper
// (docs/results/turbo-prefill14-2026-11-27/nvcc_diag.sh) for timing: FERRATTN_WGF_NO_SHIFT=1
// drops the shift of oi (and its votes) when a row's m or the unit moves, so the outputs are
// wrong; FERRATTN_WGF_HEADROOM=h > 0 moves a row's m past its first tile to ceil(t) + h instead
// of ceil(t) (fewer moves, codes below 255 2^-h), which the CPU twin does not follow.
#ifndef FERRATTN_WGF_NO_SHIFT
#define FERRATTN_WGF_NO_SHIFT 0
#endif
#ifndef FERRATTN_WGF_HEADROOM
#define FERRATTN_WGF_HEADROOM 0
#endif
constexpr int kTraceWords = 64;
// one timeline word (no code unless FERRATTN_WGF_TIMELINE)
#if FERRATTN_WGF_TIMELINE
#define WGF_TL(p, cond, word, value)                                   \
  do {                                                                 \
    if ((p).trace != nullptr && (cond)) wgf_trace_slot(p)[word] = (value); \
  } while (0)
#else
#define WGF_TL(p, cond, word, value) \
  do {                               \
  } while (0)
#endif
__device__ __forceinline__ u64* wgf_trace_slot(const PrefillParams& p) {
  const u32 lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  return p.trace + (u64)lin * kTraceWords;
}
__device__ __forceinline__ u64 global_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ u64 sm_clock() {
  u64 t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
  return t;
}

template <class T, int D, bool kFast>
__device__ __forceinline__ void prefill_wg_body(const PrefillParams& p) {
#ifdef FERRATTN_SM90A
  using namespace sm90;
  // the fast kernel's shape (kWgf*) hides the namespace's (kWg*) in this body
  constexpr int kWgStages = kFast ? kWgfStages : turbo::kWgStages;
  constexpr int kWgConsumers = kFast ? kWgfConsumers : turbo::kWgConsumers;
  constexpr int kConsumerRegs = kFast ? kWgfConsumerRegs : turbo::kConsumerRegs;
  constexpr int KS = D / 32;        // k32 slices of Q K^T
  constexpr int TILE = kBlock * D;  // bytes of one INT8 K (or V^T) tile
  constexpr int NTO = D / 8;        // n8 column groups of O
  constexpr Swizzle kSwK = D == 128 ? kSw128 : kSw64;
  extern __shared__ u8 dyn_smem[];
  __shared__ alignas(8) u64 bar_full[kWgStages];
  __shared__ alignas(8) u64 bar_empty[kWgStages];
  __shared__ alignas(8) u64 bar_q[kWgConsumers];  // wgf: consumer w's Q block has landed
  __shared__ float sLut[17];
  __shared__ float sRed[kWgConsumers][2][4];
  // wgf, the INT32 path (round 9): per consumer warp, c2, s_u / s_V and -log2 of it of 32 tiles
  __shared__ TileConsts sTab[kFast ? 4 * kWgConsumers : 1][32];

  // The warpgroup index through a lane-0 broadcast: the compiler then treats it, and every
  // loop bound derived from it, as warp-uniform. Without this, ptxas sees the wgmma calls in
  // possibly divergent code and serializes them (C7518).
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  // wg: one CTA per (three Q blocks of one query head, query head, sequence), the longest
  // causal query blocks of each head first. wgf: see wgf_cta; (qb_of(w), h_of(w)) is the
  // query block and head of consumer warpgroup w.
  const int nqb = (p.max_sq + kBlock - 1) / kBlock;
  int trip, hk, b;
  if constexpr (kFast) {
    const WgfCta c = wgf_cta(p.order);
    trip = c.trip;
    hk = c.hk;
    b = c.b;
  } else {
    trip = gridDim.x - 1 - blockIdx.x;
    b = blockIdx.z;
    hk = blockIdx.y / p.group;
  }
  // wgf: item 3 trip + w = qb x group + hg, one division for the first (the others by carries
  // in `item`); wg: the items are the query blocks of blockIdx.y
  int qb0 = kWgConsumers * trip, hg0 = 0;
  if constexpr (kFast) {
    qb0 = kWgConsumers * trip / p.group;
    hg0 = kWgConsumers * trip - qb0 * p.group;
  }
  auto item = [&](int w, int& q, int& hg) {  // w < 3: at most two carries
    hg = hg0 + w;
    const int carry = (hg >= p.group) + (hg >= 2 * p.group);
    q = qb0 + carry;
    hg -= carry * p.group;
  };
  auto qb_of = [&](int w) -> int {
    if constexpr (kFast) {
      int q, hg;
      item(w, q, hg);
      return q < nqb ? q : nqb;  // items past the list: no rows
    }
    return qb0 + w;
  };
  auto h_of = [&](int w) -> int {
    if constexpr (kFast) {
      int q, hg;
      item(w, q, hg);
      return hk * p.group + hg;
    }
    return (int)blockIdx.y;
  };
  // the K/V ring, then one INT8 Q block per consumer (swizzle patterns repeat every 1 KiB)
  const u32 ring = (smem_addr(dyn_smem) + 1023) & ~1023u;
  const u32 q_tile = ring + kWgStages * 2 * TILE + wg * TILE;
  const u64 kv_base = ((u64)b * p.heads_kv + hk) * p.nblk;
  // wgf (round 11): the producer thread sets up the barriers and starts the copies that need no
  // sequence length before the CTA's first load of one: the Q blocks of its items in the list
  // (qb < nqb: written by turbo_quant_q_* when the block has rows, in the buffer either way) and
  // the first kWgStages K/V tiles (tiles < nblk exist for every sequence). Copies no consumer
  // waits for (a block without rows, tiles past the CTA's count) are waited for by the producer
  // before it exits, so that none is in flight at the CTA's end.
  const int early = kFast ? min(kWgStages, p.nblk) : 0;
  if (kFast && tid == kWgConsumers * 128) {
    for (int s = 0; s < kWgStages; ++s) {
      mbar_init(smem_addr(&bar_full[s]), 1);
      mbar_init(smem_addr(&bar_empty[s]), kWgConsumers * 128);
    }
    for (int w = 0; w < kWgConsumers; ++w) mbar_init(smem_addr(&bar_q[w]), 1);
    fence_mbar_init();
    if (p.trace != nullptr) wgf_trace_slot(p)[8] = sm_clock();
    for (int w = 0; w < kWgConsumers; ++w) {
      int q, hg;
      item(w, q, hg);
      if (q >= nqb) continue;
      const u32 bq = smem_addr(&bar_q[w]);
      mbar_arrive_expect_tx(bq, TILE);
      bulk_g2s(ring + kWgStages * 2 * TILE + w * TILE,
               p.qq + (((u64)b * p.heads_q + hk * p.group + hg) * nqb + q) * TILE, TILE, bq);
    }
    for (int j = 0; j < early; ++j) {
      const u32 full = smem_addr(&bar_full[j]);
      mbar_arrive_expect_tx(full, 2 * TILE);
      bulk_g2s(ring + j * 2 * TILE, p.kq + (kv_base + j) * TILE, TILE, full);
      bulk_g2s(ring + j * 2 * TILE + TILE, p.vt + (kv_base + j) * TILE, TILE, full);
    }
  }
  // wgf (round 11): a consumer's scale loads, issued before the first use of a sequence length
  // so that they do not wait for it (round 10's prologue chained seqlens -> these -> Q's wait):
  // s_Q of its block and the block scales of tiles 0..63 that exist (< nblk); the uses below
  // take those of tiles < nt only, as before
  float pre_sq = 0.0f, pre_ks[2] = {0.0f, 0.0f}, pre_vs[2] = {0.0f, 0.0f};
  float pre_ksl = 0.0f, pre_vsl[2] = {0.0f, 0.0f};
  if (kFast && wg < kWgConsumers) {
    const int qbw = qb_of(wg);
    if (qbw < nqb) pre_sq = p.qs[((u64)b * p.heads_q + h_of(wg)) * nqb + qbw];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (i < p.nblk) {
        pre_ks[i] = p.ks[kv_base + i];
        pre_vs[i] = p.vs[kv_base + i];
      }
    if (lane < p.nblk) {
      pre_ksl = p.ks[kv_base + lane];
      pre_vsl[0] = p.vs[kv_base + lane];
    }
    if (lane + 32 < p.nblk) pre_vsl[1] = p.vs[kv_base + lane + 32];
  }
  const int sq = p.seqlens_q[b], sk = p.seqlens_k[b];
  auto visible = [&](int row) -> int {
    if (row >= sq) return 0;
    if (!p.causal) return sk;
    return clampi(row + sk - sq + 1, 0, sk);
  };
  auto tiles_of = [&](int qb) {
    const int nq = clampi(sq - qb * kBlock, 0, kBlock);
    return nq == 0 ? 0 : (visible(qb * kBlock + nq - 1) + kBlock - 1) / kBlock;
  };
  int nt_cta = 0;
  for (int w = 0; w < kWgConsumers; ++w) nt_cta = max(nt_cta, tiles_of(qb_of(w)));

  if (kFast && p.trace != nullptr && tid == 0) {
    u64* t = wgf_trace_slot(p);
    t[0] = global_ns();
    t[1] = sm_clock();
    u32 smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    t[7] = smid | (u64)nt_cta << 32;
  }
  if (!kFast && tid == 0) {  // (wgf: the producer thread did, above)
    for (int s = 0; s < kWgStages; ++s) {
      mbar_init(smem_addr(&bar_full[s]), 1);
      mbar_init(smem_addr(&bar_empty[s]), kWgConsumers * 128);
    }
    fence_mbar_init();
  }
  // LUT[n] = e^-n for n < -n_r and 0 from n = -n_r on: with t clamped to 16 this is Eq. 14's
  // threshold without a compare and select per element (see ex_sas)
  if (tid < 17) sLut[tid] = tid < -p.sas_nr ? bits_to_f32(sas_lut_bits(tid)) : 0.0f;
  __syncthreads();  // the last CTA-wide barrier: from here the warpgroups use named barriers

  if (wg == kWgConsumers) {  // ---- producer warpgroup: one thread streams the tiles --------------
    setmaxnreg_dec<kProducerRegs>();
    if (tid == kWgConsumers * 128) {
      for (int j = early; j < nt_cta; ++j) {
        const int s = j % kWgStages;
        if (j >= kWgStages) mbar_wait(smem_addr(&bar_empty[s]), ((j / kWgStages) + 1) & 1);
        const u32 full = smem_addr(&bar_full[s]);
        mbar_arrive_expect_tx(full, 2 * TILE);
        bulk_g2s(ring + s * 2 * TILE, p.kq + (kv_base + j) * TILE, TILE, full);
        bulk_g2s(ring + s * 2 * TILE + TILE, p.vt + (kv_base + j) * TILE, TILE, full);
      }
      WGF_TL(p, kFast, 49, sm_clock());
      if constexpr (kFast) {
        // the early copies no consumer waits for (phase 0 of their barriers)
        for (int w = 0; w < kWgConsumers; ++w) {
          int q, hg;
          item(w, q, hg);
          if (q < nqb && tiles_of(q) == 0) mbar_wait(smem_addr(&bar_q[w]), 0);
        }
        for (int j = nt_cta; j < early; ++j) mbar_wait(smem_addr(&bar_full[j]), 0);
      }
    }
    return;
  }

  // ---- consumer warpgroup: Q block qb -----------------------------------------------------------
  setmaxnreg_inc<kConsumerRegs>();
  const int qb = qb_of(wg), h = h_of(wg), r0 = qb * kBlock;
  const int nt = tiles_of(qb);
  const int row_a = r0 + warp * 16 + g, row_b = row_a + 8;
  const int vis_a = visible(row_a), vis_b = visible(row_b);
  // the fewest keys a row of the block sees: valid rows see growing prefixes, rows past the
  // sequence none
  const int vis_min = min(visible(r0), visible(r0 + kBlock - 1));

  // Q block to INT8 with one scale (max over the whole block), into the warpgroup's shared
  // tile in the layout of a K tile (the wgmma A operand). wgf: turbo_quant_q_* did it in the
  // pre-pass (the same codes and scale); the producer's bulk copy brings the block.
  float s_q;
  // wgf: the block scales of the first chunk's tiles, loaded before the wait for Q
  float ks0 = 0.0f, vs0 = 0.0f, ks1 = 0.0f, vs1 = 0.0f;
  // wgf: tile lane's block scales (the INT32 path's table of tiles 0..31, and its choice)
  float ks_l = 0.0f, vs_l = 0.0f;
  if constexpr (kFast) {
    s_q = 0.0f;
    if (nt > 0) {
      s_q = pre_sq;
      ks0 = pre_ks[0];
      vs0 = pre_vs[0];
      if (nt > 1) {
        ks1 = pre_ks[1];
        vs1 = pre_vs[1];
      }
      if (lane < nt) {
        ks_l = pre_ksl;
        vs_l = pre_vsl[0];
      }
      mbar_wait(smem_addr(&bar_q[wg]), 0);
    }
  } else {
    u32 raw[KS][4][2];  // the 4 16-bit values of each A register
    float amax = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = (r & 1) ? row_b : row_a, col = 32 * ks + 16 * (r >> 1) + 4 * t4;
        raw[ks][r][0] = raw[ks][r][1] = 0;
        if (row < sq) {
          const u32* src = reinterpret_cast<const u32*>(p.q + ((u64)(b * p.max_sq + row) * p.heads_q + h) * D + col);
          raw[ks][r][0] = src[0];
          raw[ks][r][1] = src[1];
          float f0, f1, f2, f3;
          T::unpack2(raw[ks][r][0], f0, f1);
          T::unpack2(raw[ks][r][1], f2, f3);
          amax = fmax2(amax, fmax2(fmax2(fabsf(f0), fabsf(f1)), fmax2(fabsf(f2), fabsf(f3))));
        }
      }
    amax = warp_max(amax);
    if (lane == 0) sRed[wg][1][warp] = amax;
    named_sync(1 + wg, 128);
    amax = fmax2(fmax2(sRed[wg][1][0], sRed[wg][1][1]), fmax2(sRed[wg][1][2], sRed[wg][1][3]));
    s_q = int8_scale(amax);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float f0, f1, f2, f3;
        T::unpack2(raw[ks][r][0], f0, f1);
        T::unpack2(raw[ks][r][1], f2, f3);
        const int row = warp * 16 + g + 8 * (r & 1), col = 32 * ks + 16 * (r >> 1) + 4 * t4;
        const u32 at = q_tile + swz<D / 16>(row, col >> 4) + (col & 15);
        const u32 w = pack4_u8(quantize_int8(f0, s_q), quantize_int8(f1, s_q), quantize_int8(f2, s_q),
                               quantize_int8(f3, s_q));
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(w) : "memory");
      }
    fence_proxy_async();  // the generic-proxy stores are visible to wgmma (async proxy)
    named_sync(1 + wg, 128);
  }
  if (kFast && p.trace != nullptr && tid == 0) wgf_trace_slot(p)[2] = sm_clock();
  WGF_TL(p, kFast && (tid & 127) == 0, 10 + wg, sm_clock());
  WGF_TL(p, kFast && (tid & 127) == 0, 50 + wg, (u64)nt);

  // e^x of the configuration for x = s - m_new <= 0: Exp::operator() without branches (every
  // element runs the same instructions, so the 32 per thread pipeline), floor through the bias.
  // The threshold of Eq. 14 sits in the LUT: x < n_r means t > -n_r, so floor(t) >= -n_r (or
  // t was clamped to 16 >= -n_r: also -inf and NaN, rows that saw no key), whose entries are 0.
  // One departure from the emulation, at a single point: x == n_r exactly gives 0 here and
  // e^n_r POLY(0) there.
  const bool sas_on = p.sas != 0;
  const u32 lut_at = smem_addr(sLut) - 4u * (u32)kBiasBits;  // LUT[n] at lut_at + 4 bits(n + kBias)
  auto ex_sas = [&](float x) -> float {
    const float t = fminf(-x, 16.0f);
    const float nb = __fadd_rd(t, kBias);  // floor(t) in the low bits
    const float f = __fsub_rn(t, __fsub_rn(nb, kBias));
    float q = __fmaf_rn(bits_to_f32(0xbdd1eb85u), f, bits_to_f32(0x3eecd9e8u));
    q = __fmaf_rn(q, f, bits_to_f32(0xbf7e00d2u));
    q = __fmaf_rn(q, f, bits_to_f32(0x3f7fe5c9u));
    float lut;
    asm("ld.shared.f32 %0, [%1];" : "=f"(lut) : "r"(lut_at + 4u * (u32)__float_as_int(nb)));
    return __fmul_rn(lut, q);
  };
  auto ex_exp = [&](float x) -> float {
    return x > neg_inf() ? exp2_approx(__fmul_rn(x, 1.4426950408889634f)) : 0.0f;
  };

  // (fmaxf: one instruction; no operand is NaN, so it is the emulation's f32::max)
  float o[NTO][4];
  if constexpr (!kFast) {  // the fast path zeroes it where its chunk loop needs it
#pragma unroll
    for (int i = 0; i < NTO; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  }
  float m_a = neg_inf(), m_b = neg_inf(), l_a = 0.0f, l_b = 0.0f;
  int sacc[32];
  int oacc[32];  // P V of 64 channels: D / 64 passes per tile (160 registers per thread)
  float ks_next = nt > 0 ? p.ks[kv_base] : 0.0f, vs_next = nt > 0 ? p.vs[kv_base] : 0.0f;

  // ---- the fast path (kFast; turbo_prefill_wgf_*): P quantized against a bound known before
  // the chunk. With m the running row maximum (log2 units here), p = 2^(x - m) lies in [0, 1], so
  // P^q = rne(255 p) as u8 (s_P = 1/255 fixed) needs no tile maximum, no cross-warp reduction, no
  // barrier and no division. Per score element: integer row max (IMNMX), I2FP, one FFMA for the
  // scaled and shifted logit in log2 units, one MUFU.EX2, then per pair of keys one F2FP (the two
  // probabilities to f16x2), one HFMA2 (p x 255 + 1024: the code in the low byte of each half)
  // and half a PRMT (four codes into the A register); row sums by DP4A on the packed codes. l and O stay
  // in code units (the 1/255 cancels in O / l; LSE subtracts ln 255).
  // SAS is replaced by ex2.approx (relative error ~2^-22, then p rounded to f16: 2^-12, both far
  // below SAS's ~1e-3); its threshold: codes below 1/2 round to 0, i.e. x < ln(1/510) = -6.23
  // gives 0, so n_r <= -6 is the u8 rounding's cut; n_r >= -5 is applied as p >= e^n_r on the
  // f16 probabilities.
  //
  // Chunks of two tiles (round 4): the softmax, P V and the O fold run per chunk of two 64-key
  // tiles j, j + 1 (128 keys) where the two V block scales are within a factor 2 (and both > 0)
  // and no SAS threshold applies, else per tile; the chunks are taken greedily from tile 0
  // (ferrattn_core::turbo::attention::fixed_p_chunks). One row maximum per chunk, so P V of the
  // 128 keys accumulates in INT32 and O is folded once per chunk (the fold, 2 instructions per O
  // element, was about 30% of the tile's instructions). The two tiles' V scales differ: the
  // codes of tile h are taken against s_ref = max(s_V_j, s_V_j+1) through the exponent (x gets
  // log2(s_V_h / s_ref) <= 0 added, free in the FFMA: p_h' = p s_V_h / s_ref), O is folded with
  // s_ref, and l adds each tile's code sum times s_ref / s_V_h (>= 1, at most 2). A one-tile
  // chunk is exactly round 3's tile (offset 0, weight 1).
  if constexpr (kFast) {
    const float c_log2e = 1.4426950408889634f;
    const bool thresh = sas_on && p.sas_nr >= -5;
    const u32 thr2 = [&] {
      const float t = exp2_approx((float)p.sas_nr * c_log2e);  // e^n_r
      u32 h;
      asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(h) : "f"(t));
      return h;
    }();
    const u64 dq0 = smem_desc(q_tile, 8 * D, kSwK), dk_ring = smem_desc(ring, 8 * D, kSwK);
    const u64 dv_ring = smem_desc(ring + TILE, 512, kSw64);
    const u32 full0 = smem_addr(&bar_full[0]), empty0 = smem_addr(&bar_empty[0]);
    constexpr int kNone = (int)0x80000000;  // below every score (|S| <= 127^2 D < 2^22)
    // S = Q^q1 K^q1 of tile j (exact s32) into acc (no commit); waits for the tile to land
    auto issue_s = [&](int j, int (&acc)[32]) {
      const int st = j % kWgStages;
      mbar_wait(full0 + 8 * st, (j / kWgStages) & 1);
      wgmma_fence();
      // descriptors as additions to ones built before the loop (the address field is bits
      // 0-13 in 16-byte units: +2 per 32-byte k slice, + 2 TILE / 16 per ring stage)
      const u64 dk = dk_ring + (u64)(st * (2 * TILE >> 4));
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) wgmma_m64n64k32_s8_ss(acc, dq0 + 2 * ks, dk + 2 * ks, ks);
    };
    // whether tiles j and j + 1 form one chunk (the same for every thread: the lane-0 broadcast
    // tells ptxas so, as for wg)
    auto pairable = [&](int j, float vs0, float vs1) -> bool {
      const float lo = fminf(vs0, vs1), hi = fmaxf(vs0, vs1);
      const int ok = j + 1 < nt && !thresh && lo > 0.0f && __fmul_rn(2.0f, lo) >= hi;
      return __shfl_sync(0xffffffffu, ok, 0) != 0;
    };
    auto mask_scores = [&](int (&s)[32], int k0) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int key = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
        if (key >= ((i & 2) ? vis_b : vis_a)) s[i] = kNone;
      }
    };
    // the u8 codes of one tile's scores into two A register pairs (keys in slot order)
    auto codes = [&](const int (&s)[32], float c2, float nb_a, float nb_b, u32 (&pa0)[4], u32 (&pa1)[4], auto mask,
                     auto thr) {
      // per group of four words (two codes each: 0x6400 + code in each f16 half) the two A
      // registers they make, so that few words are live at once
#pragma unroll
      for (int g4 = 0; g4 < 4; ++g4) {
        u32 cw[4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const int i = 2 * (4 * g4 + kk);
          const float nb = (i & 2) ? nb_b : nb_a;
          float x0 = __fmaf_rn(i2f(s[i]), c2, nb), x1 = __fmaf_rn(i2f(s[i + 1]), c2, nb);
          if (decltype(mask)::value) {
            x0 = s[i] == kNone ? neg_inf() : x0;
            x1 = s[i + 1] == kNone ? neg_inf() : x1;
          }
          // MUFU.EX2 on f32 (ex2.approx.f16x2 is two MUFU.F16 and a PRMT on sm_90), the pair
          // of probabilities then packed to f16x2 for the quantization
          u32 e;
          asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(e) : "f"(exp2_approx(x1)), "f"(exp2_approx(x0)));
          if (decltype(thr)::value) {
            u32 keep;  // 1.0 or 0.0 per half: p >= e^n_r, i.e. x >= n_r
            asm("set.ge.f16x2.f16x2 %0, %1, %2;" : "=r"(keep) : "r"(e), "r"(thr2));
            asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(e) : "r"(e), "r"(keep));
          }
          asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(cw[kk]) : "r"(e), "r"(0x5bf85bf8u), "r"(0x64006400u));
        }
        // words 8 k2 + 4 q + {0, 1, 2, 3} (g4 = 2 k2 + q) make registers r = 2 q and 2 q + 1
        const int k2 = g4 >> 1, q = g4 & 1;
        u32(&dst)[4] = k2 == 0 ? pa0 : pa1;
        asm("prmt.b32 %0, %1, %2, 0x6420;" : "=r"(dst[2 * q]) : "r"(cw[0]), "r"(cw[2]));
        asm("prmt.b32 %0, %1, %2, 0x6420;" : "=r"(dst[2 * q + 1]) : "r"(cw[1]), "r"(cw[3]));
      }
    };

    // the current chunk: tiles j (and j + 1 when pair), their scales; the next chunk's are
    // loaded at the start of each chunk
    int j = 0;
    bool pair = pairable(0, vs0, vs1);
    // S of the current chunk in (c0, c1); its P V passes go to c0 and c1 (free once the codes
    // exist), and the next chunk's S into them again once each pass is folded
    auto chunk = [&](int (&c0)[32], int (&c1)[32]) {
      WGF_TL(p, (tid & 127) == 0 && (j & 7) == 0 && j < 64, 19 + 8 * wg + (j >> 3), sm_clock());
      const int jn = j + (pair ? 2 : 1);
      const float ksn0 = jn < nt ? p.ks[kv_base + jn] : 0.0f, vsn0 = jn < nt ? p.vs[kv_base + jn] : 0.0f;
      const float ksn1 = jn + 1 < nt ? p.ks[kv_base + jn + 1] : 0.0f;
      const float vsn1 = jn + 1 < nt ? p.vs[kv_base + jn + 1] : 0.0f;
      // s_ref, and for the tile whose scale is below it: log2(s_V / s_ref) and s_ref / s_V
      const float s_ref = pair ? fmaxf(vs0, vs1) : vs0;
      const float w_lo = pair && vs0 != vs1 ? div_rn(s_ref, fminf(vs0, vs1)) : 1.0f;
      const float off_lo = w_lo == 1.0f ? 0.0f : -log2_approx(w_lo);
      const bool lo0 = pair && vs0 < vs1;  // tile j has the smaller scale
      const float off0 = lo0 ? off_lo : 0.0f, off1 = lo0 ? 0.0f : off_lo;
      const float w0 = lo0 ? w_lo : 1.0f, w1 = lo0 ? 1.0f : w_lo;
      const float c2_0 = __fmul_rn(mul_rn(mul_rn(s_q, ks0), p.softmax_scale), c_log2e);
      const float c2_1 = __fmul_rn(mul_rn(mul_rn(s_q, ks1), p.softmax_scale), c_log2e);
      const int st0 = j % kWgStages, st1 = (j + 1) % kWgStages;

      wgmma_wait<0>();
      fence_regs(c0);
      fence_regs(c1);
      const int key0 = j * kBlock;
      const bool masked0 = key0 + kBlock > vis_min, masked1 = pair && key0 + 2 * kBlock > vis_min;
      if (masked0) mask_scores(c0, key0);
      if (masked1) mask_scores(c1, key0 + kBlock);
      int ia = kNone, ib = kNone;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        if (i & 2) ib = max(ib, c0[i]); else ia = max(ia, c0[i]);
      }
      // c2 >= 0: the largest integer score is the largest logit
      float ta = ia == kNone ? neg_inf() : __fmul_rn(i2f(ia), c2_0);
      float tb = ib == kNone ? neg_inf() : __fmul_rn(i2f(ib), c2_0);
      if (pair) {
        ia = kNone;
        ib = kNone;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          if (i & 2) ib = max(ib, c1[i]); else ia = max(ia, c1[i]);
        }
        ta = fmaxf(ta, ia == kNone ? neg_inf() : __fmul_rn(i2f(ia), c2_1));
        tb = fmaxf(tb, ib == kNone ? neg_inf() : __fmul_rn(i2f(ib), c2_1));
      }
      ta = fmaxf(ta, shfl_xor(ta, 1));
      ta = fmaxf(ta, shfl_xor(ta, 2));
      tb = fmaxf(tb, shfl_xor(tb, 1));
      tb = fmaxf(tb, shfl_xor(tb, 2));
      const float mn_a = fmaxf(m_a, ta), mn_b = fmaxf(m_b, tb);
      const float r_a = m_a == mn_a ? 1.0f : exp2_approx(__fsub_rn(m_a, mn_a));
      const float r_b = m_b == mn_b ? 1.0f : exp2_approx(__fsub_rn(m_b, mn_b));
      u32 pa[4][4];
      // the branches on the mask and the threshold are taken once per tile, not per element
      {
        const float nb_a = __fsub_rn(off0, mn_a), nb_b = __fsub_rn(off0, mn_b);
        if (thresh) {
          if (masked0) codes(c0, c2_0, nb_a, nb_b, pa[0], pa[1], True{}, True{});
          else codes(c0, c2_0, nb_a, nb_b, pa[0], pa[1], False{}, True{});
        } else {
          if (masked0) codes(c0, c2_0, nb_a, nb_b, pa[0], pa[1], True{}, False{});
          else codes(c0, c2_0, nb_a, nb_b, pa[0], pa[1], False{}, False{});
        }
      }
      if (pair) {  // no threshold on chunks of two tiles
        const float nb_a = __fsub_rn(off1, mn_a), nb_b = __fsub_rn(off1, mn_b);
        if (masked1) codes(c1, c2_1, nb_a, nb_b, pa[2], pa[3], True{}, False{});
        else codes(c1, c2_1, nb_a, nb_b, pa[2], pa[3], False{}, False{});
      }
      // P^q V^q1 (exact s32) of the chunk's keys, 64 channels (64 rows of V^T, 4 KiB) per pass,
      // one commit group each
      // (the second pass needs no fence of its own: nothing touches its registers between the
      // first pass's fence and it)
      auto issue_pv = [&](int half, int (&acc)[32]) {
        if (half == 0) wgmma_fence();
        const u64 dv = dv_ring + (u64)(st0 * (2 * TILE >> 4) + (4096 >> 4) * half);
        wgmma_m64n64k32_u8s8(acc, pa[0], dv, 0);
        wgmma_m64n64k32_u8s8(acc, pa[1], dv + 2, 1);
        if (pair) {
          const u64 dv1 = dv_ring + (u64)(st1 * (2 * TILE >> 4) + (4096 >> 4) * half);
          wgmma_m64n64k32_u8s8(acc, pa[2], dv1, 1);
          wgmma_m64n64k32_u8s8(acc, pa[3], dv1 + 2, 1);
        }
        wgmma_commit();
      };
      issue_pv(0, c0);
      if constexpr (D == 128) issue_pv(1, c1);
      WGF_TL(p, (tid & 127) == 0 && j == 0, 16 + wg, sm_clock());
      const bool pair_n = pairable(jn, vsn0, vsn1);
      const bool more = jn < nt;
      // row sums (the two tiles' in the low and high 16 bits: at most 64 x 255 each), l and the
      // rescale vote while the passes compute
      int ra0 = 0, rb0 = 0, ra1 = 0, rb1 = 0;
#pragma unroll
      for (int k2 = 0; k2 < 2; ++k2)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if (r & 1) rb0 = byte_sum(pa[k2][r], rb0); else ra0 = byte_sum(pa[k2][r], ra0);
        }
      if (pair) {
#pragma unroll
        for (int k2 = 2; k2 < 4; ++k2)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            if (r & 1) rb1 = byte_sum(pa[k2][r], rb1); else ra1 = byte_sum(pa[k2][r], ra1);
          }
      }
      int rs_a = ra0 + (ra1 << 16), rs_b = rb0 + (rb1 << 16);
      rs_a += shfl_xor_i(rs_a, 1);
      rs_a += shfl_xor_i(rs_a, 2);
      rs_b += shfl_xor_i(rs_b, 1);
      rs_b += shfl_xor_i(rs_b, 2);
      const float lt_a = __fmaf_rn(i2f(rs_a >> 16), w1, __fmul_rn(i2f(rs_a & 0xffff), w0));
      const float lt_b = __fmaf_rn(i2f(rs_b >> 16), w1, __fmul_rn(i2f(rs_b & 0xffff), w0));
      l_a = __fmaf_rn(l_a, r_a, lt_a);
      l_b = __fmaf_rn(l_b, r_b, lt_b);
      m_a = mn_a;
      m_b = mn_b;
      const bool rescale = __any_sync(0xffffffffu, r_a != 1.0f || r_b != 1.0f);
      auto fold = [&](int half, int (&acc)[32]) {
        if (rescale) {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            float (&oi)[4] = o[8 * half + i];
            oi[0] = __fmaf_rn(i2f(acc[4 * i]), s_ref, __fmul_rn(oi[0], r_a));
            oi[1] = __fmaf_rn(i2f(acc[4 * i + 1]), s_ref, __fmul_rn(oi[1], r_a));
            oi[2] = __fmaf_rn(i2f(acc[4 * i + 2]), s_ref, __fmul_rn(oi[2], r_b));
            oi[3] = __fmaf_rn(i2f(acc[4 * i + 3]), s_ref, __fmul_rn(oi[3], r_b));
          }
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[8 * half + i][e] = __fmaf_rn(i2f(acc[4 * i + e]), s_ref, o[8 * half + i][e]);
        }
      };
      auto release = [&] {  // the chunk's stages fully read
        mbar_arrive(empty0 + 8 * st0);
        if (pair) mbar_arrive(empty0 + 8 * st1);
      };
      if constexpr (D == 128) {
        // one pair of buffers: the next chunk's first S goes into c0 once pass 0 is folded and
        // runs during the fold of pass 1; its second S into c1 after that fold
        wgmma_wait<1>();  // pass 0 done
        fence_regs(c0);
        fold(0, c0);
        fence_regs(c0);
        if (more) {
          issue_s(jn, c0);
          wgmma_commit();
          wgmma_wait<1>();  // pass 1 done
        } else {
          wgmma_wait<0>();
        }
        fence_regs(c1);
        release();
        fold(1, c1);
        fence_regs(c1);
        if (more && pair_n) {
          issue_s(jn + 1, c1);
          wgmma_commit();
        }
      } else {
        // d 64: c1 is free once the codes exist, c0 once its pass is folded
        if (more && pair_n) {
          issue_s(jn + 1, c1);
          wgmma_commit();
          wgmma_wait<1>();
        } else {
          wgmma_wait<0>();
        }
        fence_regs(c0);
        release();
        fold(0, c0);
        fence_regs(c0);
        if (more) {
          issue_s(jn, c0);
          wgmma_commit();
        }
      }
      fence_regs(c0);  // the folds' reads stay before the buffers take S again
      fence_regs(c1);
      j = jn;
      ks0 = ksn0;
      vs0 = vsn0;
      ks1 = ksn1;
      vs1 = vsn1;
      pair = pair_n;
    };

    // Rounds 7 and 10: whether every V block this warpgroup visits has a scale in [2^-64, 2^64]
    // within a factor 128 of the largest, s_u (round 7 asked a factor 2), with no threshold, and
    // it visits at least kIntMinTiles blocks. If so, P V accumulates in INT32 over the whole row: no
    // O fold per chunk. (Short rows keep the chunks: the INT32 path's integer reference costs up
    // to one bit of a row's largest code, and a row's LSE moves by 1 / l when a code moves by
    // one, ex2.approx against the twin's exp2; l is smallest where a row sees few keys.)
    constexpr int kIntMinTiles = 4;  // ferrattn_core::turbo::attention::FIXED_P_INT_MIN_TILES
    float s_u = 0.0f;
    bool uni = false;
    if (!thresh && nt >= kIntMinTiles) {
      float lo = lane < nt ? vs_l : 3.0e38f, hi = lane < nt ? vs_l : 0.0f;
      if (lane + 32 < nt) {  // (loaded in the prologue)
        lo = fminf(lo, pre_vsl[1]);
        hi = fmaxf(hi, pre_vsl[1]);
      }
      for (int t = lane + 64; t < nt; t += 32) {
        const float v = p.vs[kv_base + t];
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
      }
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) {
        lo = fminf(lo, shfl_xor(lo, s));
        hi = fmaxf(hi, shfl_xor(hi, s));
      }
      s_u = hi;
      // round 10: V scales in [2^-64, 2^64] within a factor 128 (the f32 quotient; round 7: 2)
      const float spread = __fdiv_rn(hi, lo);
      uni = __shfl_sync(0xffffffffu, lo >= 0x1p-64f && hi <= 0x1p64f && spread < 128.0f, 0) != 0;
    }
    int sa0[32], sa1[32];
    // the first chunk's S (issued after each path has set up its accumulators: ptxas serializes
    // every wgmma of the kernel if registers are initialized while one is in flight)
    auto first_s = [&] {
      if (nt > 0) {
        issue_s(0, sa0);
        if (p.trace != nullptr && tid == 0) wgf_trace_slot(p)[9] = sm_clock();
        WGF_TL(p, (tid & 127) == 0, 13 + wg, sm_clock());
        if (pair) issue_s(1, sa1);
        wgmma_commit();
      }
    };
    if (!uni) {
#pragma unroll
      for (int i = 0; i < NTO; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
      first_s();
      while (j < nt) chunk(sa0, sa1);
    } else {
      // ---- INT32 O over the row (ferrattn_core::turbo::attention::attend_tile_fixed_p_int),
      // one 64-key tile per step. The codes of tile j are taken against the unit s_u 2^-n_j,
      // n_j = floor(log2(s_u / s_V_j)) in 0..6 (the exponent field of w_j = s_u / s_V_j),
      // through the exponent (off_j = -log2(w'_j) in (-1, 0], w'_j = w_j 2^-n_j the mantissa,
      // free in the FFMA), and l adds its code sum times w'_j, so one INT32 accumulator oi holds
      // sum code . V^q1 in units of s_u 2^-n (shifted exactly by dn_j = n_(j-1) - n_j where the
      // unit changes; rounds 8 and 10) and P V is never folded into f32 until the end. The row
      // reference m (log2 units) is an integer, m = max(m, ceil(t)) with t the tile's largest
      // logit: p = 2^(x - m) <= 1 still, and a move of m by k is an arithmetic shift of oi by k
      // (floor) and l x 2^-k, both exact. Overflow: |oi| <= 127 2^d l (d = n_j less the
      // smallest n so far), so a row whose l reached 2^(23 - d) moves its m up first by the
      // fewest steps that bring l below (oi and l halve each): |oi| < 127 (2^23 + 2^d 65280) <
      // 2^31 for d <= 6. Round 10: n_j, dn_j and the guard's bound 149 - d_j are tile data in the
      // table below, so a tile pays a byte extract and a vote term for them, not arithmetic.
      // One tile per step rather than a chunk of two: oi (64 registers at d 128) stays live, so
      // the S of only one tile fits beside it in 160 registers.
      constexpr int kNoRef = -(1 << 24);  // m of a row that has seen no key
      constexpr int NH = D / 64;          // 64-channel passes of P V
      // (not zeroed: the first tile's first wgmma of each pass overwrites it; registers set
      // while a wgmma is in flight make ptxas serialize every wgmma of the kernel, C7515)
      int oi[NH][32];
      int mi_a = kNoRef, mi_b = kNoRef;
      auto ceil_i = [](float x) {
        int r;
        asm("cvt.rpi.s32.f32 %0, %1;" : "=r"(r) : "f"(x));  // -inf: INT_MIN
        return r;
      };
      auto shift_pair = [](int x, u32 amount) {  // low word of (x:0) >> amount, amount in 26..63
        int r;
        asm("{\n\t.reg .b64 t;\n\tmov.b64 t, {%2, %1};\n\tshr.s64 t, t, %3;\n\tcvt.u32.u64 %0, t;\n\t}"
            : "=r"(r)
            : "r"(x), "r"(0), "r"(amount));
        return r;
      };
      auto pow2_neg = [](int k) {  // 2^-k for k in [0, 127]; 0 from k = 127 on
        return k >= 127 ? 0.0f : __int_as_float((127 - k) << 23);
      };
      // s_u / s_V for s_V in (s_u / 128, s_u], both in [2^-64, 2^64]: the division's fast path
      // (the compiler's div.rn without its range check, which these operands never need: the
      // same correctly rounded quotient); -log2 of its mantissa by lg2.approx.ftz (no
      // subnormal here); 1 and 0 where s_V = s_u (a select: each lane computes its own tile's)
      auto w_of = [&](float vs) {
        float r, e, q, rem;
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(vs));
        e = __fmaf_rn(-vs, r, 1.0f);
        r = __fmaf_rn(r, e, r);
        q = __fmaf_rn(s_u, r, 0.0f);
        rem = __fmaf_rn(-vs, q, s_u);
        q = __fmaf_rn(r, rem, q);
        return vs == s_u ? 1.0f : q;
      };
      auto off_of = [](float w) {
        float y;
        asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(w));
        return w == 1.0f ? 0.0f : -y;
      };
      // Round 9: the per-tile constants of 32 tiles at a time, lane l computing tile 32 i + l's
      // into the warp's table in shared memory (no register held across the loop); tile j reads
      // entry j mod 32 (one broadcast LDS.128). The block scales of the next 32 tiles are loaded
      // in the step that needs them (j = 32, 64, ...); tiles 0..31 use the scales the prologue
      // loaded before the wait for Q. Round 10: w = s_u / s_V split into n (exponent field) and
      // w' (mantissa), off = -log2(w'); n_min over the tiles so far by a warp scan (and the
      // previous table's last entry), dn = n_prev - n by a shuffle (tile 0: 0, never read).
      TileConsts* const tab = sTab[kFast ? 4 * wg + warp : 0];
      auto table = [&](float ks, float vs, int base) {  // this lane's tile (past nt: ks 0, vs s_u)
        const float w_full = w_of(vs);
        const int n = (__float_as_int(w_full) >> 23) - 127;  // w >= 1: floor(log2 w)
        const float w = __int_as_float((__float_as_int(w_full) & 0x007fffff) | 0x3f800000);
        int n_prev = 0, n_min_prev = 127;  // tile base - 1's n and n_min (none for base 0)
        if (base > 0) {
          const int u = tab[31].unit;
          n_prev = u >> 16;
          n_min_prev = n_prev - (149 - ((u >> 8) & 0xff));
        }
        int n_min = n;  // inclusive prefix minimum over the lanes
#pragma unroll
        for (int s = 1; s < 32; s <<= 1) {
          const int o = __shfl_up_sync(0xffffffffu, n_min, s);
          if (lane >= s) n_min = min(n_min, o);
        }
        n_min = min(n_min, n_min_prev);
        int n_up = __shfl_up_sync(0xffffffffu, n, 1);
        if (lane == 0) n_up = n_prev;
        const int dn = base + lane == 0 ? 0 : n_up - n;
        const int unit = (n << 16) | ((149 - (n - n_min)) << 8) | (dn & 0xff);
        __syncwarp();  // every lane has read the entries it overwrites
        const float c2 = __fmul_rn(mul_rn(mul_rn(s_q, ks), p.softmax_scale), c_log2e);
        tab[lane] = TileConsts{c2, w, off_of(w), unit};
        __syncwarp();
      };
      table(lane < nt ? ks_l : 0.0f, lane < nt ? vs_l : s_u, 0);
      // P's codes, double-buffered, and FA3's order within the warpgroup. Step j issues tile
      // j's S, then tile j - 1's P V (registers pa[(j - 1) & 1]), each its own commit group;
      // waits for the S only and runs tile j's softmax into the other pair of code registers
      // while that P V runs; then waits for the P V, adds tile j - 1's code sums to l, releases
      // tile j - 1's stage and shifts oi if a row's m moved at tile j. Nothing is in flight
      // across the loop's back edge (ptxas cannot count commit groups across it and would
      // serialize every wgmma, C7514/C7515). Tiles 0 and 1 are peeled (round 9): tile 0 has no
      // P V before it (no empty commit group, no dummy wgmma, no test of j > 0 in the loop) and
      // tile 1's step issues the P V of tile 0, which sets oi (nt >= kIntMinTiles > 2).
      u32 pa_e[2][4], pa_o[2][4];
      auto fence_codes = [](u32(&pa)[2][4]) {
#pragma unroll
        for (int i = 0; i < 8; ++i) asm volatile("" : "+r"(pa[i >> 2][i & 3])::"memory");
      };
      int k_pa = 0, k_pb = 0;  // the previous tile's moves of m (for l)
      float w_p = 1.0f;        // the previous tile's w' (s_u / s_V over 2^n)
      // Ring stages by additions (round 9): the loop runs (even, odd) pairs of steps, and with an
      // even kWgStages an odd tile's stage is the even tile's before it plus one, its phase the
      // same; each step's P V and release use the previous step's stage.
      static_assert(kWgStages % 2 == 0, "the odd step's stage is the even step's plus one");
      u32 st_l = 0, ph_l = 0;  // ring stage and phase parity of the last step's tile
      auto issue_s_at = [&](u32 st, u32 ph, int (&acc)[32]) {  // issue_s with the stage given
        mbar_wait(full0 + 8 * st, ph);
        wgmma_fence();
        const u64 dk = dk_ring + (u64)(st * (2 * TILE >> 4));
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) wgmma_m64n64k32_s8_ss(acc, dq0 + 2 * ks, dk + 2 * ks, ks);
      };
      // P V of the tile in stage st into oi. One wgmma.fence before the first pass only: every
      // register its passes read (pa) or write (oi) was last touched by other instructions before
      // it, and a step's S is issued after a fence of its own with nothing between them (the
      // PTX rule: a fence between a register access and a wgmma that accesses the register).
      auto pv = [&](u32 st, u32(&pa)[2][4], auto init, auto fence) {
        if (decltype(fence)::value) wgmma_fence();
#pragma unroll
        for (int h2 = 0; h2 < NH; ++h2) {
          const u64 dv = dv_ring + (u64)(st * (2 * TILE >> 4) + (4096 >> 4) * h2);
          wgmma_m64n64k32_u8s8(oi[h2], pa[0], dv, decltype(init)::value ? 0 : 1);
          wgmma_m64n64k32_u8s8(oi[h2], pa[1], dv + 2, 1);
        }
      };
      auto add_l = [&](const u32(&pa)[2][4]) {  // the previous tile's code sums times w into l
        int rs_a = 0, rs_b = 0;
#pragma unroll
        for (int k2 = 0; k2 < 2; ++k2)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            if (r & 1) rs_b = byte_sum(pa[k2][r], rs_b); else rs_a = byte_sum(pa[k2][r], rs_a);
          }
        rs_a += shfl_xor_i(rs_a, 1);
        rs_a += shfl_xor_i(rs_a, 2);
        rs_b += shfl_xor_i(rs_b, 1);
        rs_b += shfl_xor_i(rs_b, 2);
        l_a = __fmaf_rn(l_a, pow2_neg(k_pa), __fmul_rn(i2f(rs_a), w_p));
        l_b = __fmaf_rn(l_b, pow2_neg(k_pb), __fmul_rn(i2f(rs_b), w_p));
      };
      // odd: the code registers (pa_o / pa_e); first: tile 0; init: tile 1 (its P V of tile 0
      // sets oi)
      auto step = [&](auto odd, auto first, auto init) {
        constexpr bool kOdd = decltype(odd)::value, kFirst = decltype(first)::value;
        constexpr bool kInit = decltype(init)::value;
        u32(&pa)[2][4] = kOdd ? pa_o : pa_e;
        u32(&pa_prev)[2][4] = kOdd ? pa_e : pa_o;
        WGF_TL(p, (tid & 127) == 0 && (j & 7) == 0 && j < 64, 19 + 8 * wg + (j >> 3), sm_clock());
        u32 st, ph;
        if constexpr (kFirst) {
          st = 0;
          ph = 0;
        } else if constexpr (kOdd) {  // after an even step (or tile 0)
          st = st_l + 1;
          ph = ph_l;
        } else {
          st = (u32)j % kWgStages;
          ph = ((u32)j / kWgStages) & 1;
        }
        issue_s_at(st, ph, sa0);
        if (kFirst && p.trace != nullptr && tid == 0) wgf_trace_slot(p)[9] = sm_clock();
        WGF_TL(p, kFirst && (tid & 127) == 0, 13 + wg, sm_clock());
        wgmma_commit();
        if constexpr (!kFirst) {
          pv(st_l, pa_prev, init, False{});  // (issue_s_at's fence covers it)
          wgmma_commit();
          WGF_TL(p, kInit && (tid & 127) == 0, 16 + wg, sm_clock());
        }
        // the next 32 tiles' constants (even steps of the loop: j = 32, 64, ...), while S and
        // the P V run (one branch, not predicated loads in every step)
        if (!kOdd && !kFirst && !kInit && (j & 31) == 0) {
          const int t = j + lane;
          table(t < nt ? p.ks[kv_base + t] : 0.0f, t < nt ? p.vs[kv_base + t] : s_u, j);
        }
        const TileConsts cw = tab[j & 31];
        const float c2_0 = cw.c2, w0 = cw.w, off0 = cw.off;
        const int unit0 = cw.unit;
        if constexpr (kFirst) {
          wgmma_wait<0>();  // tile 0's S
        } else {
          wgmma_wait<1>();  // tile j's S
        }
        fence_regs(sa0);
        const int key0 = j * kBlock;
        const bool masked0 = key0 + kBlock > vis_min;
        if (masked0) mask_scores(sa0, key0);
        int ia = kNone, ib = kNone;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          if (i & 2) ib = max(ib, sa0[i]); else ia = max(ia, sa0[i]);
        }
        float ta = ia == kNone ? neg_inf() : __fmul_rn(i2f(ia), c2_0);
        float tb = ib == kNone ? neg_inf() : __fmul_rn(i2f(ib), c2_0);
        ta = fmaxf(ta, shfl_xor(ta, 1));
        ta = fmaxf(ta, shfl_xor(ta, 2));
        tb = fmaxf(tb, shfl_xor(tb, 1));
        tb = fmaxf(tb, shfl_xor(tb, 2));
        // m_new = max(m, ceil(t), m + e(l) - 22 + d): l below 2^(23 - d) (the exponent field of
        // l >= 0 against gk = 149 - d, byte 1 of the tile's unit word)
        const int gk = __byte_perm(unit0, 0, 0x4441);
#if FERRATTN_WGF_HEADROOM > 0
        int c_a = min(ceil_i(ta), 1 << 24), c_b = min(ceil_i(tb), 1 << 24);
        if (mi_a != kNoRef && c_a > mi_a) c_a += FERRATTN_WGF_HEADROOM;
        if (mi_b != kNoRef && c_b > mi_b) c_b += FERRATTN_WGF_HEADROOM;
        const int mn_a = max(max(mi_a, c_a), mi_a + ((__float_as_int(l_a) >> 23) - gk));
        const int mn_b = max(max(mi_b, c_b), mi_b + ((__float_as_int(l_b) >> 23) - gk));
#else
        const int mn_a = max(max(mi_a, min(ceil_i(ta), 1 << 24)), mi_a + ((__float_as_int(l_a) >> 23) - gk));
        const int mn_b = max(max(mi_b, min(ceil_i(tb), 1 << 24)), mi_b + ((__float_as_int(l_b) >> 23) - gk));
#endif
        {
          const float nb_a = __fsub_rn(off0, i2f(mn_a)), nb_b = __fsub_rn(off0, i2f(mn_b));
          if (masked0) codes(sa0, c2_0, nb_a, nb_b, pa[0], pa[1], True{}, False{});
          else codes(sa0, c2_0, nb_a, nb_b, pa[0], pa[1], False{}, False{});
        }
        fence_regs(sa0);  // the codes' reads stay before sa0 takes the next S
        fence_codes(pa);  // and the codes before the wait for tile j - 1's P V
        // tile j - 1's code sums into l after the wait for its P V, so that its code registers
        // stay live to there: ptxas then gives tile j's softmax and codes other registers
        // instead of waiting for that P V before the softmax. (The guard above saw l through
        // tile j - 2.)
        const int kn_a = min(mn_a - mi_a, 127), kn_b = min(mn_b - mi_b, 127);  // this tile's moves
        if constexpr (!kFirst) {
          wgmma_wait<0>();  // tile j - 1's P V
          add_l(pa_prev);   // (with tile j - 1's moves, k_pa / k_pb)
#pragma unroll
          for (int h2 = 0; h2 < NH; ++h2) fence_regs(oi[h2]);
          mbar_arrive(empty0 + 8 * st_l);  // tile j - 1 fully read
          // (votes: a branch ptxas sees as divergent serializes every wgmma, C7518)
          if (!FERRATTN_WGF_NO_SHIFT &&
              __any_sync(0xffffffffu, kn_a != 0 || kn_b != 0 || (unit0 & 0xff) != 0)) {
            // Round 14: one shift for both moves, s = k + dn in [-6, 31] (k clamped to 31): the low
            // word of (oi:0) >> (32 + s), an arithmetic shift of the 64-bit pair (one SHF.R.S64 a
            // register), is oi >> s (floor) for s >= 0 and oi << -s (exact, |oi| < 2^31 after it)
            // for s < 0: the values of round 10's two paths (a right and a left shift where the
            // unit moved, a right shift where it did not), in one block of code.
            const int dn = (unit0 << 24) >> 24;  // the unit's move, warpgroup-uniform
            const u32 s_a = (u32)(min(kn_a + dn, 31) + 32), s_b = (u32)(min(kn_b + dn, 31) + 32);
#pragma unroll
            for (int h2 = 0; h2 < NH; ++h2)
#pragma unroll
              for (int i = 0; i < 32; ++i) oi[h2][i] = shift_pair(oi[h2][i], (i & 2) ? s_b : s_a);
          }
#pragma unroll
          for (int h2 = 0; h2 < NH; ++h2) fence_regs(oi[h2]);
        }
        k_pa = kn_a;
        k_pb = kn_b;
        st_l = st;
        ph_l = ph;
        mi_a = mn_a;
        mi_b = mn_b;
        w_p = w0;
        ++j;
      };
      auto last = [&](u32(&pa)[2][4]) {  // the last tile's P V and l
        pv(st_l, pa, False{}, True{});
        wgmma_commit();
        add_l(pa);
        wgmma_wait<0>();
#pragma unroll
        for (int h2 = 0; h2 < NH; ++h2) fence_regs(oi[h2]);
        mbar_arrive(empty0 + 8 * st_l);
      };
      static_assert(kIntMinTiles > 2, "tiles 0 and 1 are peeled");
      step(False{}, True{}, False{});  // tile 0
      step(True{}, False{}, True{});   // tile 1 (and tile 0's P V)
      while (true) {
        if (j >= nt) {
          last(pa_o);
          break;
        }
        step(False{}, False{}, False{});
        if (j >= nt) {
          last(pa_e);
          break;
        }
        step(True{}, False{}, False{});
      }
      // O = f32(oi) (s_u 2^-n) (then / l in store_rows), n the last tile's (its table entry is
      // still there); m back to f32 (a row with no key: l == 0)
      const float s_o = __fmul_rn(s_u, pow2_neg(tab[(nt - 1) & 31].unit >> 16));
#pragma unroll
      for (int h2 = 0; h2 < NH; ++h2)
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[8 * h2 + i][e] = __fmul_rn(i2f(oi[h2][4 * i + e]), s_o);
      m_a = mi_a == kNoRef ? neg_inf() : i2f(mi_a);
      m_b = mi_b == kNoRef ? neg_inf() : i2f(mi_b);
    }
  }
  for (int j = 0; j < (kFast ? 0 : nt); ++j) {
    const int st = j % kWgStages;
    const u32 k_tile = ring + st * 2 * TILE, v_tile = k_tile + TILE;
    // the block scales of tile j were loaded during tile j - 1; load those of j + 1 now
    const float ks_j = ks_next, vs_j = vs_next;
    if (j + 1 < nt) {
      ks_next = p.ks[kv_base + j + 1];
      vs_next = p.vs[kv_base + j + 1];
    }
    mbar_wait(smem_addr(&bar_full[st]), (j / kWgStages) & 1);
    // S = Q^q1 K^q1 (exact s32)
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      wgmma_m64n64k32_s8_ss(sacc, smem_desc(q_tile + 32 * ks, 8 * D, kSwK), smem_desc(k_tile + 32 * ks, 8 * D, kSwK), ks);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(sacc);
    int (&cur)[32] = sacc;
    const float alpha = mul_rn(mul_rn(s_q, ks_j), p.softmax_scale);
    const int key0 = j * kBlock;
    float pf[32];
    float tmax_a = neg_inf(), tmax_b = neg_inf();
    // scaled logits and row maxima; keys a row cannot see are -inf (only on tiles where some
    // row of the block cannot see every key: the code is instantiated with and without)
    auto logits = [&](auto mask) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        float x = __fmul_rn(i2f(cur[i]), alpha);
        if (decltype(mask)::value) {
          const int key = key0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
          if (key >= ((i & 2) ? vis_b : vis_a)) x = neg_inf();
        }
        pf[i] = x;
        if (i & 2) tmax_b = fmaxf(tmax_b, x); else tmax_a = fmaxf(tmax_a, x);
      }
    };
    if (key0 + kBlock > vis_min) logits(True{}); else logits(False{});
    tmax_a = fmaxf(tmax_a, shfl_xor(tmax_a, 1));
    tmax_a = fmaxf(tmax_a, shfl_xor(tmax_a, 2));
    tmax_b = fmaxf(tmax_b, shfl_xor(tmax_b, 1));
    tmax_b = fmaxf(tmax_b, shfl_xor(tmax_b, 2));
    // A row with no visible key in this tile keeps its state without a test: m_new = m,
    // r = 1, its codes are 0, so l = fma(0, s_P, l x 1) = l and O = fma(0, c, O x 1) = O.
    const float mn_a = fmaxf(m_a, tmax_a), mn_b = fmaxf(m_b, tmax_b);
    float r_a, r_b, pm = 0.0f;
    auto probs = [&](auto ex) {
      r_a = m_a == mn_a ? 1.0f : ex(__fsub_rn(m_a, mn_a));
      r_b = m_b == mn_b ? 1.0f : ex(__fsub_rn(m_b, mn_b));
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        pf[i] = ex(__fsub_rn(pf[i], (i & 2) ? mn_b : mn_a));
        pm = fmaxf(pm, pf[i]);
      }
    };
    if (sas_on) probs(ex_sas); else probs(ex_exp);
    // s_P = max(P~) / 119 over the whole 64 x 64 tile: the four warps of the warpgroup
    pm = warp_max(pm);
    if (lane == 0) sRed[wg][j & 1][warp] = pm;
    named_sync(1 + wg, 128);
    const float pmax = fmaxf(fmaxf(sRed[wg][j & 1][0], sRed[wg][j & 1][1]),
                             fmaxf(sRed[wg][j & 1][2], sRed[wg][j & 1][3]));
    const float s_p = int8_scale(pmax);
    const float inv_p = s_p == 0.0f ? 0.0f : div_rn(1.0f, s_p);

    // P^q straight from the accumulator layout into A registers (keys in slot order)
    u32 pa[2][4];
    int rs_a = 0, rs_b = 0;
    auto code = [&](int i) { return (u32)__float_as_int(__fadd_rn(__fmul_rn(pf[i], inv_p), kBias)); };
#pragma unroll
    for (int k2 = 0; k2 < 2; ++k2)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int n0 = 4 * k2 + 2 * (r >> 1), e = 2 * (r & 1);
        pa[k2][r] = pack_low_bytes(code(4 * n0 + e), code(4 * n0 + e + 1), code(4 * n0 + 4 + e), code(4 * n0 + 5 + e));
        if (r & 1) rs_b = byte_sum(pa[k2][r], rs_b); else rs_a = byte_sum(pa[k2][r], rs_a);
      }
    rs_a += shfl_xor_i(rs_a, 1);
    rs_a += shfl_xor_i(rs_a, 2);
    rs_b += shfl_xor_i(rs_b, 1);
    rs_b += shfl_xor_i(rs_b, 2);

    l_a = fma_rn(i2f(rs_a), s_p, mul_rn(l_a, r_a));
    l_b = fma_rn(i2f(rs_b), s_p, mul_rn(l_b, r_b));
    m_a = mn_a;
    m_b = mn_b;
    const float c_pv = mul_rn(s_p, vs_j);
    // most tiles move no row maximum of the warp: then O x r is O
    const bool rescale = __any_sync(0xffffffffu, r_a != 1.0f || r_b != 1.0f);
    // P^q V^q1 (exact s32), 64 channels (64 rows of V^T, 4 KiB) per pass
#pragma unroll
    for (int half = 0; half < D / 64; ++half) {
      wgmma_fence();
      wgmma_m64n64k32_s8(oacc, pa[0], smem_desc(v_tile + 4096 * half, 512, kSw64), 0);
      wgmma_m64n64k32_s8(oacc, pa[1], smem_desc(v_tile + 4096 * half + 32, 512, kSw64), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(oacc);
      if (half == D / 64 - 1) mbar_arrive(smem_addr(&bar_empty[st]));  // stage st fully read
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float (&oi)[4] = o[8 * half + i];
        if (rescale) {
          oi[0] = __fmaf_rn(i2f(oacc[4 * i]), c_pv, __fmul_rn(oi[0], r_a));
          oi[1] = __fmaf_rn(i2f(oacc[4 * i + 1]), c_pv, __fmul_rn(oi[1], r_a));
          oi[2] = __fmaf_rn(i2f(oacc[4 * i + 2]), c_pv, __fmul_rn(oi[2], r_b));
          oi[3] = __fmaf_rn(i2f(oacc[4 * i + 3]), c_pv, __fmul_rn(oi[3], r_b));
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) oi[e] = __fmaf_rn(i2f(oacc[4 * i + e]), c_pv, oi[e]);
        }
      }
    }
  }
  if (kFast && p.trace != nullptr && tid == 0) wgf_trace_slot(p)[3] = sm_clock();
  WGF_TL(p, kFast && (tid & 127) == 0, 43 + wg, sm_clock());
  // tiles only the other warpgroup needs: release them as they land
  for (int j = nt; j < nt_cta; ++j) {
    const int st = j % kWgStages;
    mbar_wait(smem_addr(&bar_full[st]), (j / kWgStages) & 1);
    mbar_arrive(smem_addr(&bar_empty[st]));
  }

  if constexpr (kFast) {
    // m is in log2 units and l in codes (255 per unit of probability): LSE = m ln 2 + ln(l / 255)
    const float ln2 = 0.6931471805599453f, ln255 = 5.541263545158426f;
    m_a = m_a == neg_inf() ? m_a : __fsub_rn(__fmul_rn(m_a, ln2), ln255);
    m_b = m_b == neg_inf() ? m_b : __fsub_rn(__fmul_rn(m_b, ln2), ln255);
  }
  if constexpr (kFast) {
    const WgfCta c = wgf_cta(p.order);  // recomputed: nothing of it stays live across the loop
    const int hs = c.hk * p.group + (kWgConsumers * c.trip + wg) % p.group;
    store_rows_v4<T, D>(p, c.b, hs, t4, row_a, m_a, l_a, m_b, l_b, o);
    if (p.trace != nullptr && (tid & 127) == 0) {
      u64* t = wgf_trace_slot(p);
      const u64 now = global_ns();
      if (tid == 0) {
        t[4] = sm_clock();
        t[5] = now;
      }
      asm volatile("red.global.max.u64 [%0], %1;" ::"l"(t + 6), "l"(now) : "memory");
    }
    WGF_TL(p, (tid & 127) == 0, 46 + wg, sm_clock());
  } else {
    store_rows<T, D, false>(p, b, h, t4, row_a, m_a, l_a, m_b, l_b, o);
  }
#else
  asm volatile("trap;");  // built for another architecture: the host only launches this on sm_90
#endif
}

// turbo_quant_kv_*'s CTAs an SM that ptxas must leave room for (round 21: 8 at 128 threads, 64
// registers; bf16 d 128 takes 62 without spills, 81 when left free, as many CTAs an SM as the Q pass)
constexpr int kQuantKvMinBlocks = 8;

}  // namespace turbo
}  // namespace ferrattn

// ---- Instances: the closed list of (dtype, head dim) -> kernel (ferrattn_cuda::kernels) --------
#define FERRATTN_TURBO_PREFILL(TN, T, D)                                                        \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads,                      \
                                                  ferrattn::turbo::kQuantKvMinBlocks)          \
      turbo_quant_kv_##TN##_d##D(const ferrattn::turbo::QuantParams p) {                       \
    ferrattn::turbo::quant_kv_body<ferrattn::T, D>(p);                                         \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads)                      \
      turbo_quant_q_##TN##_d##D(const ferrattn::turbo::QuantParams p) {                        \
    ferrattn::turbo::quant_kv_body<ferrattn::T, D, 1>(p);                                      \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads)                      \
      turbo_buffer_tail_##TN##_d##D(const ferrattn::turbo::QuantParams p) {                    \
    ferrattn::turbo::buffer_tail_body<ferrattn::T, D>(p);                                      \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads)                      \
      turbo_prefill_##TN##_d##D(const ferrattn::turbo::PrefillParams p) {                      \
    ferrattn::turbo::prefill_body<ferrattn::T, D>(p);                                          \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kWgThreads, 1)                 \
      turbo_prefill_wg_##TN##_d##D(const ferrattn::turbo::PrefillParams p) {                   \
    ferrattn::turbo::prefill_wg_body<ferrattn::T, D, false>(p);                                \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kWgfThreads, 1)                \
      turbo_prefill_wgf_##TN##_d##D(const ferrattn::turbo::PrefillParams p) {                  \
    ferrattn::turbo::prefill_wg_body<ferrattn::T, D, true>(p);                                 \
  }

FERRATTN_TURBO_PREFILL(f16, F16, 64)
FERRATTN_TURBO_PREFILL(f16, F16, 128)
FERRATTN_TURBO_PREFILL(bf16, BF16, 64)
FERRATTN_TURBO_PREFILL(bf16, BF16, 128)
