// TurboAttention decode (Kang et al., MLSys 2025, Algorithm 2) over the compressed KV cache, split
// over the KV length as LeanAttention does, and the cache's append and flush (section 3.3).
//
// Work: one *output tile* is (sequence, KV head, group of up to 16 query heads); its iterations
// are the cache tiles of that (sequence, KV head) in token order: every compressed block of 64
// tokens, then the INT8 buffer when it holds tokens (Alg. 2 "for j in 1..N", the buffer last).
// The host lays the tiles' iterations end to end (ferrattn_core::lean::TileSpace with tile_k =
// 64) and cuts the space into CTA ranges (ferrattn_core::lean::Schedule: stream-K for balance,
// or one CTA per output tile, which replays the emulation's order exactly). Each CTA computes one
// partial (O, m, l) per output tile it touches and writes it to its own slot; turbo_combine_*
// merges a tile's slots in slot (= key) order with the same exponential, finishes O / l and LSE.
// A tile computed by one CTA therefore goes through exactly the emulation's steps.
//
// One iteration (a CTA of 4 warps, query heads of one KV head as the MMA's 16 rows):
//   1. dequantize on chip (Alg. 2 "K_j^q1 = K_j^q2 s^int + z"): packed INT4/INT2 codes and the
//      per-channel integer scale / zero point (staged by cp.async one iteration ahead) become
//      INT8 K [64][D] and V^T [D][64] (slot order) in shared memory; the buffer tile is INT8;
//   2. S = q^q1 K^q1 on mma.m16n8k32 s8 (the query row quantized once per tile, Alg. 2
//      "s_Q = max(abs(Q))/119");
//   3. per query head (8 threads a row): S x (s_q s_K softmax_scale), SAS online softmax,
//      s_P = max(P~)/119 of that head's row, P^q, l;
//   4. O = O r + s_P s_V (P^q V^q1), P^q V^q1 on the INT8 MMA.
// Why MMA at query length 1: the 16 MMA rows hold the GQA group's query heads, so one
// m16n8k32 does for every head of the group what would take 8 dp4a per head and key; with a
// group of 1 it still issues 32x fewer instructions than dp4a for the dot products. Either way
// the dot products are small next to unpacking 64 x D codes per tile, which is what bounds this
// kernel after memory.
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

// Bytes of one shared staging buffer: the 4-bit codes of K and V (the larger case) and both
// tensors' channel parameters.
template <int D>
struct DecodeSmem {
  static constexpr int kCodes = kBlock * D / 2;
  static constexpr int kStage = 2 * kCodes + 4 * D;
};

// Eight INT8 codes of channels 8 c8 .. 8 c8 + 7 of one token of a compressed block.
template <int D>
__device__ __forceinline__ uint2 dequant8(const u8* codes, const u8* par, int bits, int tok, int c8) {
  const uint2 sc = *reinterpret_cast<const uint2*>(par + 8 * c8);
  const uint2 zr = *reinterpret_cast<const uint2*>(par + D + 8 * c8);
  u32 w;
  if (bits == 4) {
    w = *reinterpret_cast<const u32*>(codes + tok * (D / 2) + 4 * c8);
  } else {
    w = *reinterpret_cast<const unsigned short*>(codes + tok * (D / 4) + 2 * c8);
  }
  const u32 mask = (1u << bits) - 1;
  int x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int code = (int)((w >> (i * bits)) & mask);
    const int s = (int)(((i < 4 ? sc.x : sc.y) >> (8 * (i & 3))) & 0xff);
    const int z = (int)(signed char)(((i < 4 ? zr.x : zr.y) >> (8 * (i & 3))) & 0xff);
    // ChannelParams::decode: clamp(code x scale + zero, -127, 127); the low end never binds
    x[i] = clampi(code * s + z, -127, 127);
  }
  return make_uint2(pack4_u8(x[0], x[1], x[2], x[3]), pack4_u8(x[4], x[5], x[6], x[7]));
}

// byte `i` of a little-endian pair of words
__device__ __forceinline__ u32 byte_of(const uint2& w, int i) { return ((i < 4 ? w.x : w.y) >> (8 * (i & 3))) & 0xffu; }

template <class T, int D>
__device__ __forceinline__ void decode_body(const DecodeParams& p) {
  constexpr int KC = D / 16;        // chunks per K / q row
  constexpr int KS = D / 32;        // k32 slices of q K^T
  constexpr int NTW = D / 32;       // O n8 tiles per warp (each warp owns D / 4 channels)
  constexpr int UNITS = kBlock * D / 32;  // 4 tokens x 8 channels per dequantization unit
  constexpr int R = kDecodeRows;
  __shared__ alignas(128) u8 sStage[2][DecodeSmem<D>::kStage];
  __shared__ alignas(128) i8 sK[kBlock * D];
  __shared__ alignas(128) i8 sV[D * kBlock];
  __shared__ alignas(128) i8 sQ[R * D];
  __shared__ alignas(128) i8 sP[R * kBlock];
  __shared__ alignas(16) int sS[R][kBlock];  // q K^T of each row, keys in slot order
  __shared__ float sR[R], sC[R], sQs[R], sLut[17];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int row = tid >> 3, j8 = tid & 7;  // softmax role: 8 threads per query row
  sas_lut_init(sLut);
  const Exp ex{sLut, (float)p.sas_nr, p.sas};
  const CacheParams& cp = p.cache;

  u32 it = p.cta_bounds[blockIdx.x];
  const u32 end = p.cta_bounds[blockIdx.x + 1];
  u32 slot = p.cta_slot[blockIdx.x];
  for (; it < end; ++slot) {
    // the output tile holding iteration `it` (ferrattn_core::lean::TileSpace::tile_of)
    int lo = 0, hi = p.batch;
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (p.seq_start[mid] <= it) lo = mid; else hi = mid;
    }
    const int b = lo;
    const int len = p.lens[b];
    const u32 n_it = (u32)max(1, (len + kBlock - 1) / kBlock);
    const u32 r_tile = (it - p.seq_start[b]) / n_it;
    const u32 tile_start = p.seq_start[b] + r_tile * n_it;
    const u32 seg_end = min(end, tile_start + n_it);
    const int t_begin = (int)(it - tile_start), t_end = (int)(seg_end - tile_start);
    it = seg_end;
    const int qt = p.q_tok[b];
    if (qt < 0) continue;  // not decoded by this launch; the combine skips it too
    const int hk = (int)r_tile / p.qgroups, qg = (int)r_tile % p.qgroups;
    const int rows = min(R, p.group - qg * R);
    const int h0 = hk * p.group + qg * R;
    const int nblocks = len / kBlock, ntok_buf = len % kBlock;
    const int bits = cp.head_bits[hk];
    const u64 bh = (u64)b * p.heads_kv + hk;

    // ---- query rows to INT8, one scale per row (per query head) -------------------------------
    {
      constexpr int PER = D / 8;  // channels per thread
      float f[PER];
      float amax = 0.0f;
      if (row < rows) {
        const u16* src = p.q + ((u64)(b * p.max_sq + qt) * p.heads_q + h0 + row) * D + j8 * PER;
#pragma unroll
        for (int v = 0; v < PER / 8; ++v) {
          float e8[8];
          unpack8<T>(ld_global_nc16(src + 8 * v), e8);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            f[8 * v + e] = e8[e];
            amax = fmax2(amax, fabsf(e8[e]));
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < PER; ++e) f[e] = 0.0f;
      }
      amax = fmax2(amax, shfl_xor(amax, 1));
      amax = fmax2(amax, shfl_xor(amax, 2));
      amax = fmax2(amax, shfl_xor(amax, 4));
      const float s = int8_scale(amax);
      if (j8 == 0) sQs[row] = s;
#pragma unroll
      for (int v = 0; v < PER / 8; ++v) {
        const int c = j8 * PER + 8 * v;  // first channel of this 8-channel group
        u32* dst = reinterpret_cast<u32*>(sQ + swz<KC>(row, c >> 4) + (c & 15));
        dst[0] = pack4_u8(quantize_int8(f[8 * v], s), quantize_int8(f[8 * v + 1], s), quantize_int8(f[8 * v + 2], s),
                          quantize_int8(f[8 * v + 3], s));
        dst[1] = pack4_u8(quantize_int8(f[8 * v + 4], s), quantize_int8(f[8 * v + 5], s),
                          quantize_int8(f[8 * v + 6], s), quantize_int8(f[8 * v + 7], s));
      }
    }

    auto stage_tile = [&](int ti, int st) {
      // packed codes of K and V, then their channel parameters
      const u64 cb = block_bytes(D, bits);
      const u64 code_off = (u64)b * cp.seq_code_bytes + cp.head_off[hk] + (u64)ti * cb;
      const u64 par_off = (bh * cp.cap_blocks + ti) * 2 * D;
      const int nc = (int)(cb / 16);
      for (int i = tid; i < 2 * nc + D / 4; i += kThreads) {
        const u8* src;
        int dst;
        if (i < nc) {
          src = cp.k.codes + code_off + 16 * i;
          dst = 16 * i;
        } else if (i < 2 * nc) {
          src = cp.v.codes + code_off + 16 * (i - nc);
          dst = 16 * i;
        } else {
          const int k = i - 2 * nc;  // 2D / 16 chunks per tensor
          src = (k < D / 8 ? cp.k.par + par_off + 16 * k : cp.v.par + par_off + 16 * (k - D / 8));
          dst = 2 * (int)cb + 16 * k;
        }
        cp_async16(&sStage[st][dst], src, true);
      }
    };

    if (t_begin < nblocks) {
      stage_tile(t_begin, 0);
      cp_async_commit();
    }
    __syncthreads();  // sQ, sQs (and the LUT) are visible
    u32 qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int mi = lane >> 3;
      ldmatrix_x4(qa[ks], &sQ[swz<KC>((lane & 7) + 8 * (mi & 1), 2 * ks + (mi >> 1))]);
    }
    float o[NTW][4];
#pragma unroll
    for (int i = 0; i < NTW; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m = neg_inf(), l = 0.0f;  // state of query row `row` (replicated over its 8 threads)

    for (int ti = t_begin; ti < t_end; ++ti) {
      const bool compressed = ti < nblocks;
      const int ntok = compressed ? kBlock : (ti == nblocks ? ntok_buf : 0);
      if (ntok == 0) continue;  // an empty cache: nothing to attend to (uniform over the CTA)
      const int st = (ti - t_begin) & 1;
      cp_async_wait<0>();
      __syncthreads();  // staged codes landed; the previous iteration is done with sK, sV, sP
      if (ti + 1 < t_end && ti + 1 < nblocks) {
        stage_tile(ti + 1, st ^ 1);
        cp_async_commit();
      }

      // ---- 1. INT8 K [64][D] and V^T [D][64] in shared memory ----------------------------------
      float s_k, s_v;
      if (compressed) {
        const u64 pb = bh * cp.cap_blocks + ti;
        s_k = cp.k.bscale[pb];
        s_v = cp.v.bscale[pb];
        const u8* stg = sStage[st];
        const int cb = (int)block_bytes(D, bits);
        for (int u = tid; u < UNITS; u += kThreads) {
          const int grp = u & 15, c8 = u >> 4;
          // K: tokens 4 grp .. 4 grp + 3, row-major
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int tok = 4 * grp + k;
            const uint2 w = dequant8<D>(stg, stg + 2 * cb, bits, tok, c8);
            *reinterpret_cast<uint2*>(sK + swz<KC>(tok, c8 >> 1) + (c8 & 1) * 8) = w;
          }
          // V: the keys of slots 4 grp .. 4 grp + 3, transposed
          uint2 w[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) w[k] = dequant8<D>(stg + cb, stg + 2 * cb + 2 * D, bits, slot_key(4 * grp + k), c8);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int c = 8 * c8 + i, s0 = 4 * grp;
            *reinterpret_cast<u32*>(sV + swz<4>(c, s0 >> 4) + (s0 & 15)) =
                byte_of(w[0], i) | (byte_of(w[1], i) << 8) | (byte_of(w[2], i) << 16) | (byte_of(w[3], i) << 24);
          }
        }
      } else {
        s_k = cp.k.buf_scale[bh];
        s_v = cp.v.buf_scale[bh];
        const i8* kb = cp.k.buf + bh * kBlock * D;
        const i8* vb = cp.v.buf + bh * kBlock * D;
        for (int u = tid; u < UNITS; u += kThreads) {
          const int grp = u & 15, c8 = u >> 4;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int tok = 4 * grp + k;
            uint2 w = make_uint2(0, 0);
            if (tok < ntok) w = *reinterpret_cast<const uint2*>(kb + tok * D + 8 * c8);
            *reinterpret_cast<uint2*>(sK + swz<KC>(tok, c8 >> 1) + (c8 & 1) * 8) = w;
          }
          uint2 w[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int tok = slot_key(4 * grp + k);
            w[k] = make_uint2(0, 0);
            if (tok < ntok) w[k] = *reinterpret_cast<const uint2*>(vb + tok * D + 8 * c8);
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int c = 8 * c8 + i, s0 = 4 * grp;
            *reinterpret_cast<u32*>(sV + swz<4>(c, s0 >> 4) + (s0 & 15)) =
                byte_of(w[0], i) | (byte_of(w[1], i) << 8) | (byte_of(w[2], i) << 16) | (byte_of(w[3], i) << 24);
          }
        }
      }
      __syncthreads();

      // ---- 2. q K^T: warp w takes keys 16 w .. 16 w + 15 ---------------------------------------
      {
        int s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const int nt = 2 * warp + n;
#pragma unroll
          for (int kk = 0; kk < KS / 2; ++kk) {
            u32 kb[4];
            ldmatrix_x4(kb, &sK[swz<KC>(nt * 8 + (lane & 7), 4 * kk + (lane >> 3))]);
            mma_s8(s[n], qa[2 * kk], kb[0], kb[1]);
            mma_s8(s[n], qa[2 * kk + 1], kb[2], kb[3]);
          }
        }
        // key 16 w + 8 n + 2 t4 + e sits at slot 16 w + 4 t4 + 2 n + e
        *reinterpret_cast<int4*>(&sS[g][16 * warp + 4 * t4]) = make_int4(s[0][0], s[0][1], s[1][0], s[1][1]);
        *reinterpret_cast<int4*>(&sS[g + 8][16 * warp + 4 * t4]) = make_int4(s[0][2], s[0][3], s[1][2], s[1][3]);
      }
      __syncthreads();

      // ---- 3. softmax of row `row` over slots 8 j8 .. 8 j8 + 7 ---------------------------------
      // Rows past the group run the same steps on their zero query (finite, never written out),
      // so that every lane takes part in every shuffle.
      {
        const int4 a = *reinterpret_cast<const int4*>(&sS[row][8 * j8]);
        const int4 c = *reinterpret_cast<const int4*>(&sS[row][8 * j8 + 4]);
        const int dots[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        const float alpha = mul_rn(mul_rn(sQs[row], s_k), p.softmax_scale);
        float x[8];
        float tmax = neg_inf();
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const bool v = slot_key(8 * j8 + q) < ntok;
          x[q] = v ? mul_rn(i2f(dots[q]), alpha) : neg_inf();
          tmax = fmax2(tmax, x[q]);
        }
        tmax = fmax2(tmax, shfl_xor(tmax, 1));
        tmax = fmax2(tmax, shfl_xor(tmax, 2));
        tmax = fmax2(tmax, shfl_xor(tmax, 4));
        const float mn = fmax2(m, tmax);  // finite: key 0 is always valid
        const float r = ex.rescale(m, mn);
        float pm = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          x[q] = x[q] == neg_inf() ? 0.0f : ex(sub_rn(x[q], mn));
          pm = fmax2(pm, x[q]);
        }
        pm = fmax2(pm, shfl_xor(pm, 1));
        pm = fmax2(pm, shfl_xor(pm, 2));
        pm = fmax2(pm, shfl_xor(pm, 4));
        const float s_p = int8_scale(pm);  // one row: s_P of this query head's tile
        int code[8];
        int rs = 0;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          code[q] = s_p == 0.0f ? 0 : clampi(rne_int(div_rn(x[q], s_p)), 0, 127);
          rs += code[q];
        }
        rs += shfl_xor_i(rs, 1);
        rs += shfl_xor_i(rs, 2);
        rs += shfl_xor_i(rs, 4);
        l = fma_rn(i2f(rs), s_p, mul_rn(l, r));
        m = mn;
        if (j8 == 0) {
          sR[row] = r;
          sC[row] = mul_rn(s_p, s_v);
        }
        *reinterpret_cast<uint2*>(sP + swz<4>(row, j8 >> 1) + (j8 & 1) * 8) =
            make_uint2(pack4_u8(code[0], code[1], code[2], code[3]), pack4_u8(code[4], code[5], code[6], code[7]));
      }
      __syncthreads();

      // ---- 4. O = O r + s_P s_V (P^q V^q1): warp w owns channels w D/4 .. (w+1) D/4 -----------
      {
        u32 pa[2][4];
#pragma unroll
        for (int k2 = 0; k2 < 2; ++k2) {
          const int mi = lane >> 3;
          ldmatrix_x4(pa[k2], &sP[swz<4>((lane & 7) + 8 * (mi & 1), 2 * k2 + (mi >> 1))]);
        }
        const float r_a = sR[g], r_b = sR[g + 8], c_a = sC[g], c_b = sC[g + 8];
#pragma unroll
        for (int i = 0; i < NTW; ++i) {
          const int nt = warp * NTW + i;
          u32 vb[4];
          ldmatrix_x4(vb, &sV[swz<4>(nt * 8 + (lane & 7), lane >> 3)]);
          int acc[4] = {0, 0, 0, 0};
          mma_s8(acc, pa[0], vb[0], vb[1]);
          mma_s8(acc, pa[1], vb[2], vb[3]);
          o[i][0] = fma_rn(i2f(acc[0]), c_a, mul_rn(o[i][0], r_a));
          o[i][1] = fma_rn(i2f(acc[1]), c_a, mul_rn(o[i][1], r_a));
          o[i][2] = fma_rn(i2f(acc[2]), c_b, mul_rn(o[i][2], r_b));
          o[i][3] = fma_rn(i2f(acc[3]), c_b, mul_rn(o[i][3], r_b));
        }
      }
    }

    // ---- the segment's partial ----------------------------------------------------------------
    float* po = p.part_o + (u64)slot * R * D;
#pragma unroll
    for (int i = 0; i < NTW; ++i) {
      const int c = (warp * NTW + i) * 8 + 2 * t4;
      if (g < rows) *reinterpret_cast<float2*>(po + g * D + c) = make_float2(o[i][0], o[i][1]);
      if (g + 8 < rows) *reinterpret_cast<float2*>(po + (g + 8) * D + c) = make_float2(o[i][2], o[i][3]);
    }
    if (j8 == 0 && row < rows) *reinterpret_cast<float2*>(p.part_ml + ((u64)slot * R + row) * 2) = make_float2(m, l);
    __syncthreads();  // sQ, sQs and the stages are reused by the next segment
  }
}

// Merges the partials of one output tile in slot order and writes O and LSE. One partial is
// finished exactly as the emulation finishes a row (RowState::finish).
template <class T, int D>
__device__ __forceinline__ void combine_body(const DecodeParams& p) {
  __shared__ float sLut[17];
  sas_lut_init(sLut);
  __syncthreads();
  const Exp ex{sLut, (float)p.sas_nr, p.sas};
  const int tile = blockIdx.x;
  const int tiles_per_seq = p.heads_kv * p.qgroups;
  const int b = tile / tiles_per_seq, rt = tile % tiles_per_seq;
  const int qt = p.q_tok[b];
  if (qt < 0) return;
  const int hk = rt / p.qgroups, qg = rt % p.qgroups;
  const int rows = min(kDecodeRows, p.group - qg * kDecodeRows);
  const int h0 = hk * p.group + qg * kDecodeRows;
  const u32 s0 = p.tile_slot[tile], s1 = p.tile_slot[tile + 1];
  for (int idx = threadIdx.x; idx < rows * D; idx += kThreads) {
    const int r = idx / D, c = idx % D;
    float m = neg_inf(), l = 0.0f, a = 0.0f;
    for (u32 s = s0; s < s1; ++s) {
      const float2 ml = *reinterpret_cast<const float2*>(p.part_ml + ((u64)s * kDecodeRows + r) * 2);
      if (ml.x == neg_inf()) continue;  // a segment that saw no key
      const float as = p.part_o[((u64)s * kDecodeRows + r) * D + c];
      if (m == neg_inf()) {
        m = ml.x;
        l = ml.y;
        a = as;
        continue;
      }
      const float mn = fmax2(m, ml.x);
      const float r1 = ex.rescale(m, mn), r2 = ex.rescale(ml.x, mn);
      l = fma_rn(ml.y, r2, mul_rn(l, r1));
      a = fma_rn(as, r2, mul_rn(a, r1));
      m = mn;
    }
    const bool empty = m == neg_inf() || l == 0.0f;
    const int h = h0 + r;
    p.o[((u64)(b * p.max_sq + qt) * p.heads_q + h) * D + c] = T::from_f32(empty ? 0.0f : div_rn(a, l));
    if (c == 0) p.lse[((u64)b * p.heads_q + h) * p.max_sq + qt] = empty ? neg_inf() : add_rn(m, logf(l));
  }
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
    compress_block<D>(sx, spar, bits, codes, cv.par + pb * 2 * D);
    if (threadIdx.x == 0) cv.bscale[pb] = cv.buf_scale[bh];
    __syncthreads();
  }
}

}  // namespace turbo
}  // namespace ferrattn

// ---- Instances: the closed list of (dtype, head dim) -> kernel (ferrattn_cuda::kernels) --------
#define FERRATTN_TURBO_DECODE(TN, T, D)                                                       \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads)                    \
      turbo_decode_##TN##_d##D(const ferrattn::turbo::DecodeParams p) {                      \
    ferrattn::turbo::decode_body<ferrattn::T, D>(p);                                         \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(ferrattn::turbo::kThreads)                    \
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
