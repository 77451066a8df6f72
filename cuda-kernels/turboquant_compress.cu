// TurboQuant compression (Zandieh et al., arXiv 2504.19874): keys with TurboQuant_prod
// (Algorithm 2: norm, rotation by Π, (b-1)-bit Lloyd-Max index per coordinate, residual norm,
// QJL signs of S r) or, without QJL, TurboQuant_mse with all b bits; values with TurboQuant_mse
// (Algorithm 1: norm, rotation, b-bit index). The contract is ferrattn_core::turboquant, and codes
// and norms are bit-exact with it: every f32 and f64 step below is the emulation's operation, in
// its order, as one IEEE-rounded PTX instruction (the __*_rn intrinsics' PTX twins: mul.rn and
// add.rn are never contracted into an FMA):
//   ‖x‖   = f32(sqrt(Σ_k f64(x_k) f64(x_k)))             sequential over k   (quant.rs `l2`)
//   u     = x * (1 / ‖x‖)                                 f32 div.rn, mul.rn
//   Π u   : rot_o = Σ_k Π[o][k] u_k                      sequential over k, mul.rn + add.rn
//   idx_o = #{boundaries_f32 < rot_o}                     (Codebook::index, partition_point)
//   r     = Πᵀ (rot - c[idx]) : r_o = Σ_i (rr_i != 0) rr_i Π[i][o], sequential over i (apply_t)
//   γ     = l2(r), signs_i = (Σ_k S[i][k] r_k >= 0), ‖r‖ = f16(‖x‖ γ)   (ProdQuantizer::quantize)
// Norms are rounded to f16 with cvt.rn, as DType::F16.round.
//
// Work item: 16 consecutive destination tokens of one (sequence, KV head); one CTA of D threads
// (thread o owns rotated coordinate o) loops over work items, so Π (and S) are staged into shared
// memory once per CTA. The same kernel writes a prefill's K/V and a decode step's new tokens
// (destination `dst0[b] + j` for source token j < count[b]).
//
// Why CUDA cores and not tensor cores: bit-exactness with the f32 emulation fixes the summation
// order of every dot product, which an MMA does not (the tensor-core kernels at the end of this
// file trade that for a stated contract: `tqf`). The cost is about 3 d^2 mul+add per key row
// (Π u, Πᵀ rr, S r) and d^2 per value row, so these kernels are bound by FP32 issue, not memory
// (docs/BENCHMARKS.md, "TurboQuant on CUDA").
//
// Output layout (the operand layout of turboquant_decode.cu; ferrattn_cuda::turboquant::layout
// is the host twin):
//   keys   codes [B][Hk][cap][D/2]  one nibble per coordinate, lane-blocked for the B fragment
//                                   of mma.m16n8k16 (byte β of lane block q holds channels
//                                   16κ + 8η + 2q + {0, 1}, κ = β/2, η = β%2, low nibble first)
//          signs [B][Hk][cap][D/8]  lane block q of D/32 bytes: bit j (j < D/8) is channel
//                                   16(j/2) + 8(j%2) + 2q, bit j + D/8 the channel after it
//          norms [B][Hk][cap]       f16x2 {‖k‖, ‖r‖}
//   values codes [B][Hk][cap/2][D]  token pairs (2p, 2p+1): lane block g of D/8 bytes, byte ν
//                                   holds channel 8ν + g, token 2p low nibble, 2p+1 high
//          norms [B][Hk][cap]       f16 ‖v‖
// Codes of at most 2 bits (n_bounds <= 3: a 1-2 bit key codebook, 2-bit values) are stored as
// crumbs, 4 a byte: key rows D/4 bytes, value pair records D/2 bytes; per lane block (D/8 nibble
// bytes -> D/16) crumb word j holds nibble words 2j (bits 0-1 of each nibble) and 2j + 1 (bits
// 2-3). ferrattn_cuda::turboquant::layout::crumbs_of_nibbles is the host twin.
#include "common.cuh"
#include "sm90.cuh"

namespace ferrattn {
namespace tq {

constexpr int kTokens = 16;  // destination tokens per work item

// Mirrors ferrattn_cuda::turboquant::CompressParams (#[repr(C)]).
struct CompressParams {
  const u16* src;     // f16 [batch, src_len, heads_kv, D]
  const int* dst0;    // [batch] first destination token
  const int* count;   // [batch] tokens to compress
  const float* pi;    // [D][D] row-major Π
  const float* s;     // [D][D] row-major S (keys with QJL only)
  unsigned char* codes;
  unsigned char* signs;
  void* norms;        // keys: u32 f16x2 {‖k‖, ‖r‖}; values: u16
  int batch, src_len, heads_kv, cap;
  int groups;         // work items per (sequence, KV head)
  int n_bounds;       // 2^bits - 1
  float bounds[15];   // Lloyd-Max cell boundaries, ascending (f32 as the emulation compares)
  float cents[16];    // centroids (f32)
};

__device__ __forceinline__ float fmul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fadd_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fsub_rn(float a, float b) {
  float r;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fdiv_rn(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// f32(sqrt(Σ f64(x_k)^2)) over a row of shared memory, in order (quant.rs `l2`)
__device__ __forceinline__ float l2_f64(const float* x, int n) {
  double acc = 0.0;
  for (int k = 0; k < n; ++k) {
    double v = (double)x[k], sq;
    asm("mul.rn.f64 %0, %1, %1;" : "=d"(sq) : "d"(v));
    asm("add.rn.f64 %0, %0, %1;" : "+d"(acc) : "d"(sq));
  }
  double r;
  asm("sqrt.rn.f64 %0, %1;" : "=d"(r) : "d"(acc));
  float f;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(f) : "d"(r));
  return f;
}

template <int D>
struct Smem {
  static constexpr int kStride = D + 4;  // 16-byte rows; float4 column reads are conflict-free
};

// One rotation-like product for kTokens rows: acc[t] = Σ_k M[o][k] x[t][k] in order (mul.rn, add.rn)
template <int D>
__device__ __forceinline__ void rows_times_matrix(const float* m_s, const float* x_s, int o, int nt,
                                                  float (&acc)[kTokens]) {
  constexpr int S = Smem<D>::kStride;
#pragma unroll
  for (int t = 0; t < kTokens; ++t) acc[t] = 0.f;
  const float4* mrow = reinterpret_cast<const float4*>(m_s + o * S);
#pragma unroll 2
  for (int k4 = 0; k4 < D / 4; ++k4) {
    const float4 mv = mrow[k4];
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      if (t < nt) {
        const float4 xv = reinterpret_cast<const float4*>(x_s + t * S)[k4];
        acc[t] = fadd_rn(acc[t], fmul_rn(mv.x, xv.x));
        acc[t] = fadd_rn(acc[t], fmul_rn(mv.y, xv.y));
        acc[t] = fadd_rn(acc[t], fmul_rn(mv.z, xv.z));
        acc[t] = fadd_rn(acc[t], fmul_rn(mv.w, xv.w));
      }
    }
  }
}

template <int D, bool KEYS, bool QJL>
__device__ __forceinline__ void compress(const CompressParams& p) {
  constexpr int S = Smem<D>::kStride;
  extern __shared__ float4 smem4[];
  float* pi_s = reinterpret_cast<float*>(smem4);         // [D][S] Π
  float* s_s = pi_s + D * S;                              // [D][S] S (keys with QJL)
  float* x_s = s_s + (KEYS && QJL ? D * S : 0);           // [kTokens][S] x, then r
  float* u_s = x_s + kTokens * S;                         // [kTokens][S] u, then rot - c[idx]
  float* nrm_s = u_s + kTokens * S;                       // [kTokens] ‖x‖
  float* gam_s = nrm_s + kTokens;                         // [kTokens] γ
  unsigned char* idx_s = reinterpret_cast<unsigned char*>(gam_s + kTokens);  // [kTokens][D]
  unsigned char* sgn_s = idx_s + kTokens * D;                                 // [kTokens][D]
  const int o = threadIdx.x;

  for (int i = o; i < D * D; i += D) {
    pi_s[(i / D) * S + i % D] = p.pi[i];
    if (KEYS && QJL) s_s[(i / D) * S + i % D] = p.s[i];
  }

  const int items = p.batch * p.heads_kv * p.groups;
  for (int w = blockIdx.x; w < items; w += gridDim.x) {
    const int x = w % p.groups, h = (w / p.groups) % p.heads_kv, b = w / (p.groups * p.heads_kv);
    const int d0 = p.dst0[b], cnt = p.count[b];
    // destination tokens [first, first + kTokens), aligned to kTokens so value pairs stay together
    const int first = (d0 / kTokens) * kTokens + x * kTokens;
    const int lo = max(first, d0), hi = min(first + kTokens, d0 + cnt);
    __syncthreads();  // Π staged / the previous item's shared rows consumed
    if (lo >= hi) continue;
    const int nt = hi - first;  // rows 0..nt-1 of the item are computed; rows before lo are skipped
    for (int t = 0; t < kTokens; ++t) {
      const int j = first + t;
      float v = 0.f;
      if (j >= lo && j < hi) {
        const int src_tok = j - d0;
        v = F16::to_f32(p.src[(((size_t)b * p.src_len + src_tok) * p.heads_kv + h) * D + o]);
      }
      x_s[t * S + o] = v;
    }
    __syncthreads();
    if (o < kTokens) nrm_s[o] = l2_f64(x_s + o * S, D);
    __syncthreads();
    for (int t = 0; t < kTokens; ++t) {
      const float n = nrm_s[t];
      // quantize_into: u = x * (1 / ‖x‖), or a zero rotation for the zero vector
      u_s[t * S + o] = n > 0.f ? fmul_rn(x_s[t * S + o], fdiv_rn(1.f, n)) : 0.f;
    }
    __syncthreads();
    float acc[kTokens];
    rows_times_matrix<D>(pi_s, u_s, o, nt, acc);
    int idx[kTokens];
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      const float rot = nrm_s[t] > 0.f ? acc[t] : 0.f;
      int c = 0;
      for (int i = 0; i < p.n_bounds; ++i) c += p.bounds[i] < rot ? 1 : 0;
      idx[t] = c;
      idx_s[t * D + o] = (unsigned char)c;
      acc[t] = fsub_rn(rot, p.cents[c]);  // rotated residual of the unit vector
    }
    if (KEYS && QJL) {
      __syncthreads();  // u_s readers done
#pragma unroll
      for (int t = 0; t < kTokens; ++t) u_s[t * S + o] = acc[t];
      __syncthreads();
      // r = Πᵀ rr: r_o = Σ_i rr_i Π[i][o], zero rr_i skipped as Rotation::apply_t does
      float r[kTokens];
#pragma unroll
      for (int t = 0; t < kTokens; ++t) r[t] = 0.f;
      for (int i = 0; i < D; ++i) {
        const float pv = pi_s[i * S + o];
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          if (t < nt) {
            const float y = u_s[t * S + i];
            if (y != 0.f) r[t] = fadd_rn(r[t], fmul_rn(y, pv));
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kTokens; ++t) x_s[t * S + o] = r[t];
      __syncthreads();
      if (o < kTokens) gam_s[o] = l2_f64(x_s + o * S, D);
      // signs of S r (m = D rows; thread o owns row o)
      float v[kTokens];
      rows_times_matrix<D>(s_s, x_s, o, nt, v);
#pragma unroll
      for (int t = 0; t < kTokens; ++t) sgn_s[t * D + o] = v[t] >= 0.f ? 1 : 0;
    }
    (void)idx;
    __syncthreads();

    // ---- packed writes in the decode kernel's operand layout (codes of at most 2 bits as
    // crumbs, 4 a byte: n_bounds = 2^bits - 1 <= 3; ferrattn_cuda::turboquant::layout)
    const bool crumb = p.n_bounds <= 3;
    const size_t row0 = ((size_t)b * p.heads_kv + h) * p.cap;  // token 0 of (b, h)
    if (KEYS) {
      for (int t = 0; t < kTokens; ++t) {
        const int j = first + t;
        if (j < lo || j >= hi) continue;
        // nibble byte beta of the row (lane block q = beta / (D/8))
        auto kbyte = [&](int beta) -> u32 {
          const int q = beta / (D / 8), bl = beta % (D / 8), kap = bl / 2, eta = bl % 2;
          const int c0 = 16 * kap + 8 * eta + 2 * q;
          return idx_s[t * D + c0] | (idx_s[t * D + c0 + 1] << 4);
        };
        if (!crumb) {
          if (o < D / 2) p.codes[(row0 + j) * (D / 2) + o] = (unsigned char)kbyte(o);
        } else if (o < D / 4) {
          // crumb byte gm of lane block q: nibble bytes 8(gm/4) + gm%4 and the one 4 after it
          const int q = o / (D / 16), gm = o % (D / 16), b1 = q * (D / 8) + 8 * (gm / 4) + gm % 4;
          p.codes[(row0 + j) * (D / 4) + o] = (unsigned char)((kbyte(b1) & 0x33u) | ((kbyte(b1 + 4) & 0x33u) << 2));
        }
        if (QJL && o < 4) {
          // lane block q = o: D/8 pairs, bit jj = first channel of pair jj, bit jj + D/8 the second
          u32 word = 0;
          for (int jj = 0; jj < D / 8; ++jj) {
            const int c0 = 16 * (jj / 2) + 8 * (jj % 2) + 2 * o;
            word |= (u32)sgn_s[t * D + c0] << jj;
            word |= (u32)sgn_s[t * D + c0 + 1] << (jj + D / 8);
          }
          unsigned char* dst = p.signs + (row0 + j) * (D / 8) + o * (D / 32);
#pragma unroll
          for (int by = 0; by < D / 32; ++by) dst[by] = (unsigned char)(word >> (8 * by));
        }
        if (o == 0) {
          const float n = nrm_s[t];
          const u32 nk = F16::from_f32(n);
          const u32 nr = QJL ? F16::from_f32(fmul_rn(n, gam_s[t])) : 0u;
          reinterpret_cast<u32*>(p.norms)[row0 + j] = nk | (nr << 16);
        }
      }
    } else {
      // token pairs (2pp, 2pp+1) inside the item (first is even)
      for (int t = 0; t < kTokens; t += 2) {
        const int j = first + t;
        const bool ev = j >= lo && j < hi, od = j + 1 >= lo && j + 1 < hi;
        if (!ev && !od) continue;
        // nibble byte beta of the pair record: channel 8ν + g, even token low, odd token high
        auto vbyte = [&](int beta) -> u32 {
          const int g = beta / (D / 8), nu = beta % (D / 8), c = 8 * nu + g;
          return idx_s[t * D + c] | (idx_s[(t + 1) * D + c] << 4);
        };
        if (crumb && o >= D / 2) continue;
        // crumbs: byte o of lane block g = o / (D/16) from nibble bytes b1 and b1 + 4 (layout.rs)
        const int b1 = (o / (D / 16)) * (D / 8) + 8 * ((o % (D / 16)) / 4) + o % 4;
        const u32 full = crumb ? (vbyte(b1) & 0x33u) | ((vbyte(b1 + 4) & 0x33u) << 2) : vbyte(o);
        unsigned char* dst = p.codes + (row0 / 2 + j / 2) * (crumb ? D / 2 : D) + o;
        // the even token's codes are the low nibble of every byte (both layouts): an odd token
        // alone keeps its even partner's, an even token alone clears the high nibble for the
        // partner that a later append writes
        *dst = (unsigned char)(ev && od ? full : ev ? (full & 0x0fu) : ((*dst & 0x0fu) | (full & 0xf0u)));
      }
      if (o < kTokens) {
        const int j = first + o;
        if (j >= lo && j < hi) reinterpret_cast<u16*>(p.norms)[row0 + j] = F16::from_f32(nrm_s[o]);
      }
    }
  }
}

}  // namespace tq
}  // namespace ferrattn

// Closed list: D in {64, 128}; keys with or without QJL (m = D), values. The codebook (and so
// the bit width) is a parameter: the arithmetic does not depend on it.
#define FERRATTN_TQ_COMPRESS(D)                                                                  \
  extern "C" __global__ void __launch_bounds__(D) turboquant_compress_keys_qjl_d##D(            \
      const ferrattn::tq::CompressParams p) {                                                    \
    ferrattn::tq::compress<D, true, true>(p);                                                    \
  }                                                                                              \
  extern "C" __global__ void __launch_bounds__(D) turboquant_compress_keys_mse_d##D(            \
      const ferrattn::tq::CompressParams p) {                                                    \
    ferrattn::tq::compress<D, true, false>(p);                                                   \
  }                                                                                              \
  extern "C" __global__ void __launch_bounds__(D) turboquant_compress_values_d##D(              \
      const ferrattn::tq::CompressParams p) {                                                    \
    ferrattn::tq::compress<D, false, false>(p);                                                  \
  }

FERRATTN_TQ_COMPRESS(64)
FERRATTN_TQ_COMPRESS(128)

// ================================================================================================
// ================================================================================================
// Fast compression on tensor cores (the fast contract of docs/TURBOQUANT_CUDA.md, "Compression on
// tensor cores"). Same inputs, same outputs and layout as above; the rotation is one MMA product
// per token block instead of d^2 IEEE mul/add per row:
//   ‖x‖   an f32 FMA sum of the (exact) squares over the 4 threads of a row, within 2^-21 of the
//         exact norm; where that bound cannot decide the f16 rounding of the stored norm, f64
//         sums as the emulation (4 interleaved partials per thread, combined in a fixed order:
//         equal to the emulation's sequential sum unless a partial sum rounds, not seen in any
//         test). Stored f16 norms are the emulation's bit for bit; the f32 norm that scales y is
//         within 2^-20 of the emulation's (inside the 2^-14 of τ below)
//   y     = (Π x) / ‖x‖ with x exact in f16 and Π as one f16 matrix (SPLIT = false) or as f16
//         hi + lo (SPLIT = true: two MMAs, about f32 accuracy); f32 accumulation
//   idx   = #{boundaries_f32 < y} by a uniform-grid lookup with the norm folded into the grid's
//         scale and the comparison (code_scaled: exact for y = (Π x)_o / ‖x‖ in real arithmetic
//         unless a boundary lies within 2^-22 |y| of it): equal to the emulation's except where
//         its rotated coordinate
//         lies within τ of a boundary, τ = 2^-11 + 2^-14 (one f16 Π: |δΠ| <= 2^-11 |Π| and
//         Σ_k |Π_ok| |u_k| <= 1) or 2^-14 (split Π; accumulation, the f32 norm and the
//         emulation's own f32 sum)
//   γ     = ‖y - c[idx]‖ in the rotated basis (rotation-invariant), f32 sums
//   signs = sign((S Πᵀ) (y - c[idx])): M = S Πᵀ precomputed on the host as one f16 matrix, the
//         residual rounded to f16: one MMA; equal to sign(S r) except where |(S r)_i| is within
//         2^-9 ‖S_i‖ ‖r‖ of zero
// Work (fourth compression pass): a CTA is one warpgroup; it takes chunks of 64 token rows (8
// tiles of 8 destination tokens of one (sequence, KV head), aligned to 8 so that value token
// pairs stay in one tile) and each thread loads its two token rows (a value pair: chunk rows
// 16w + 2g and 16w + 2g + 1 of warp w, g = lane / 4) straight from global memory into registers,
// with 16-byte loads, in the layout of the A operand of wgmma.m64nDk16: the tokens are the M
// dimension, the input channels K, the output channels N. K is permuted so that each thread's
// A elements are whole 16-byte pieces of its rows (a permutation of the summation index changes
// no product); Π (B, N x K, K-major) is staged once per CTA into 128-byte-swizzled shared memory
// with its columns permuted the same way. No token tile goes through shared memory: the row
// norm comes from the same registers (4 threads per row, two quad shuffles) while the tensor
// cores run, the next chunk's loads are issued into the same registers once the product has
// completed, and the epilogue works on the accumulator (thread (g, q) holds channels 8j + 2q and
// 8j + 2q + 1 of its two rows, j < D/8: one lane block of the key layout per row, two lane
// blocks of the value pair layout) and writes codes with 16-byte stores from registers. QJL keys
// feed the f16 residual to a second wgmma as its A operand straight from the accumulator
// registers (the m64nNk16 accumulator of columns [16kk, 16kk + 16) is the A fragment of k step
// kk), with M = S Πᵀ as B in shared memory; the signs come out of its accumulator as the lane
// blocks of the sign layout (one funnel shift per bit). Codes come from a count byte per grid bin
// and a boundary table indexed by that count (code_scaled). The compute_80 PTX runs the same dataflow
// on mma.sync with B through ldmatrix.
namespace ferrattn {
namespace tqf {

constexpr int kTile = 8;                       // destination tokens per tile
constexpr int kTilesPerChunk = 8;              // tiles per chunk
constexpr int kRows = kTile * kTilesPerChunk;  // token rows per chunk: the M of one warpgroup
static_assert(kRows == 64, "a chunk is the M of one wgmma");
constexpr int kThreads = 128;                  // one warpgroup per CTA

__device__ __forceinline__ u32 shfl_xor_u32(u32 v, int m) {
  u32 r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(m));
  return r;
}
// within the TPR lanes of one row (the lanes that took a divergent branch together)
__device__ __forceinline__ double shfl_xor_f64_in(double v, int m, int tpr) {
  const u32 lane = threadIdx.x % 32;
  const u32 group = ((1u << tpr) - 1u) << (lane & ~(u32)(tpr - 1));
  u32 lo, hi;
  asm("mov.b64 {%0, %1}, %2;" : "=r"(lo), "=r"(hi) : "d"(v));
  asm volatile("shfl.sync.bfly.b32 %0, %0, %1, 0x1f, %2;" : "+r"(lo) : "r"(m), "r"(group));
  asm volatile("shfl.sync.bfly.b32 %0, %0, %1, 0x1f, %2;" : "+r"(hi) : "r"(m), "r"(group));
  double r;
  asm("mov.b64 %0, {%1, %2};" : "=d"(r) : "r"(lo), "r"(hi));
  return r;
}

// Mirrors ferrattn_cuda::turboquant::FastCompressParams (#[repr(C)]).
struct FastParams {
  const u16* src;      // f16 [batch, src_len, heads_kv, D]
  const int* dst0;     // [batch] first destination token
  const int* count;    // [batch] tokens to compress
  const u16* pi_hi;    // [D][D] f16 Π (row-major)
  const u16* pi_lo;    // [D][D] f16 Π - Π_hi (SPLIT only)
  const u16* m;        // [D][D] f16 S Πᵀ (keys with QJL only)
  const float4* lut;   // [kLut] code lookup (ferrattn_cuda::turboquant::CodeLut)
  unsigned char* codes;
  unsigned char* signs;
  void* norms;
  int batch, src_len, heads_kv, cap;
  int groups;          // 8-token destination tiles per (sequence, KV head)
  int n_bounds;
  float bounds[15];
  float cents[16];
  float lut_lo, lut_hi;       // the range of y the bins cover (host only)
  float lut_scale, lut_off;   // bin = rint(255 sat(y scale + off))
  u32 groups_mul, groups_shr; // item / groups = umulhi(item, mul) >> shr (mul = 0: groups = 1)
  u32 heads_mul, heads_shr;   // likewise / heads_kv (ferrattn_cuda::turboquant::FastDiv)
};

// n / d for 0 <= n < 2^31 by the host's round-up reciprocal (FastDiv): no integer division
__device__ __forceinline__ int fast_div(int n, u32 mul, u32 shr) {
  return mul ? (int)(__umulhi((u32)n, mul) >> shr) : n;
}

constexpr int kLut = 256;


// #{bounds < y} by a uniform grid over y: bin k = rint(255 sat(y scale + off)) (two FMAs: the
// saturation clamps) holds at most one boundary (the host checks), so with count_k =
// #{boundaries of bins < k} and bound_k = the first boundary of a bin >= k (+inf if none; that is
// boundary count_k), count_k + (bound_k < y) is the exact count for every real y of bin k: the
// grid is monotone in y (ferrattn_cuda::turboquant::CodeLut is the twin and holds these per bin).
// In shared memory the kernel keeps count_k as one byte per bin (256 bytes: a warp's 32 lookups
// touch at most 2 words per bank) and the boundaries and centroids as 16- and 32-entry f32
// tables indexed by the count (at most 16 distinct words: conflict-free). `cnt` is the shared
// address of the byte table minus 0x4B000000 (mod 2^32): fma(u, 255, 2^23) has the f32 bits
// 0x4B000000 + k, so the byte's address is one add.
// The lookup from the product's accumulator `acc` = ‖x‖ y and the row's scale s = fl(fl(1/n) scale)
// (n > 0; a zero row passes n = 1, s = scale and acc = ±0): the norm folded into the grid's
// scale (the bin by one FMA from acc) and into the comparison, bound n < acc exactly as the sign
// of fma(bound, n, -acc) (its exact value rounded once: zero only for equal values, +0 then).
// The result is #{b : b n < acc} = #{b < acc / n} (real division) unless a boundary lies
// between acc / n and the y' whose bin acc s selects, y' = (acc / n)(1 + δ), |δ| <= 2^-23
// (the two roundings of s): a near tie far inside the contract's τ (CodeLut::code_scaled is
// the twin, host test code_scaled_lookup_is_exact_outside_2e_22_of_a_boundary).
__device__ __forceinline__ u32 code_scaled(u32 cnt, u32 bnd, const FastParams& p, float acc, float s, float n) {
  float u, t;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(u) : "f"(acc), "f"(s), "f"(p.lut_off));
  asm("fma.rn.f32 %0, %1, 0f437F0000, 0f4B000000;" : "=f"(t) : "f"(u));  // 255 u + 2^23
  u32 c;
  float b;
  asm volatile("ld.shared.u8 %0, [%1];" : "=r"(c) : "r"(cnt + __float_as_uint(t)));
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(b) : "r"(bnd + 4u * c));
  float dlt;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(dlt) : "f"(b), "f"(n), "f"(-acc));
  return c + (__float_as_uint(dlt) >> 31);
}


// A D x D f16 matrix (rows n: the N dimension of a product, K contiguous) in shared memory as the
// K-major B operand of wgmma with the 128-byte swizzle: channels [64a, 64a + 64) of every row
// form block a of D 128-byte rows (8-row atoms of 1024 bytes, aligned to 1024), and the 16-byte
// piece c of row n sits at piece c ^ (n % 8) of its 128 bytes.
template <int D>
struct Layout {
  static constexpr int kBlockBytes = D * 128;  // one 64-channel block of a matrix
  static constexpr int kMatBytes = D * D * 2;
  static constexpr int kPieces = D / 32;       // 16-byte pieces of a row per thread (4 per row)
  static constexpr int kAcc = D / 2;           // accumulators per thread: 2 rows x D/4 channels
};
template <int D>
__device__ __forceinline__ u32 mat_byte(int n, int k) {
  return (u32)((k >> 6) * Layout<D>::kBlockBytes + n * 128 + ((((k >> 3) & 7) ^ (n & 7)) << 4) + (k & 7) * 2);
}

__device__ __forceinline__ void st_shared_v4(u32 a, u32 x, u32 y, u32 z, u32 w) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
__device__ __forceinline__ void st_global_v4(void* p, u32 x, u32 y, u32 z, u32 w) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
__device__ __forceinline__ void st_global_v2(void* p, u32 x, u32 y) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(x), "r"(y) : "memory");
}

// A matrix's pieces of this thread, every load issued before any is used: the prologue waits
// for one round trip to L2 per matrix, not one per loop iteration (issue 10, eleventh
// compression pass: the serial prologue held 11% of the stall samples)
template <int D>
__device__ __forceinline__ void stage_load(const u16* g, Vec16 (&v)[D * D / 32 / kThreads][4]) {
  static_assert(D * D / 32 % kThreads == 0, "whole iterations");
#pragma unroll
  for (int it = 0; it < D * D / 32 / kThreads; ++it) {
    const int i = threadIdx.x + it * kThreads, n = i / (D / 32), m = i % (D / 32);
#pragma unroll
    for (int c = 0; c < 4; ++c) v[it][c] = ld_global_nc16(g + n * D + 32 * m + 8 * c);
  }
}
// The K permutation of the first product. Thread q of a row holds the 16-byte pieces 4m + q
// (m < D/32) of the row, words i = 0..3 of a piece being physical channels 32m + 8q + 2i, +1;
// k step kk = 2m + s takes a0 = word 2s and a2 = word 2s + 1, so logical column 16kk + 8h + 2q
// + e (h: a0 / a2, e: the half) is physical channel 32m + 8q + 4s + 2h + e. Staging Π, word i
// of the global piece 4m + q of a row (physical 32m + 8q + 2i) is word q of the logical piece
// 4m + i: a 4 x 4 transpose of words among the 4 pieces of a group m, done in registers.
template <int D, bool PERM>
__device__ __forceinline__ void stage_store(const Vec16 (&v)[D * D / 32 / kThreads][4], u32 dst) {
#pragma unroll
  for (int it = 0; it < D * D / 32 / kThreads; ++it) {
    const int i = threadIdx.x + it * kThreads, n = i / (D / 32), m = i % (D / 32);
    if (PERM) {
      st_shared_v4(dst + mat_byte<D>(n, 32 * m + 0), v[it][0].x, v[it][1].x, v[it][2].x, v[it][3].x);
      st_shared_v4(dst + mat_byte<D>(n, 32 * m + 8), v[it][0].y, v[it][1].y, v[it][2].y, v[it][3].y);
      st_shared_v4(dst + mat_byte<D>(n, 32 * m + 16), v[it][0].z, v[it][1].z, v[it][2].z, v[it][3].z);
      st_shared_v4(dst + mat_byte<D>(n, 32 * m + 24), v[it][0].w, v[it][1].w, v[it][2].w, v[it][3].w);
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c) st_shared_v4(dst + mat_byte<D>(n, 32 * m + 8 * c), v[it][c].x, v[it][c].y, v[it][c].z, v[it][c].w);
    }
  }
}
template <int D, bool PERM>
__device__ __forceinline__ void stage_matrix(const u16* g, u32 dst) {
  Vec16 v[D * D / 32 / kThreads][4];
  stage_load<D>(g, v);
  stage_store<D, PERM>(v, dst);
}

// The A fragments of k step kk from a thread's two rows (x[r][m]: piece 4m + q of row r)
template <int D>
__device__ __forceinline__ void a_frag(const Vec16 (&x)[2][Layout<D>::kPieces], int kk, u32 (&a)[4]) {
  const Vec16& p0 = x[0][kk >> 1];
  const Vec16& p1 = x[1][kk >> 1];
  a[0] = (kk & 1) ? p0.z : p0.x;
  a[2] = (kk & 1) ? p0.w : p0.y;
  a[1] = (kk & 1) ? p1.z : p1.x;
  a[3] = (kk & 1) ? p1.w : p1.y;
}

#if defined(FERRATTN_SM90A)
// D (64 x N, f32) (+)= A (64 x 16 f16, registers) x B (N x 16 f16, K-major in shared memory):
// warp w of the warpgroup owns rows 16w..16w+15; d[4j], d[4j+1] (g, 8j+2q, +1), d[4j+2],
// d[4j+3] (g+8, the same columns) (PTX ISA "Register fragments ... wgmma .m64nNk16")
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const u32 (&a)[4], u64 desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,"
      "%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const u32 (&a)[4], u64 desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
#endif

// orders this thread's generic-proxy shared-memory writes before wgmma's reads (async proxy)
__device__ __forceinline__ void wgmma_proxy_fence() {
#if defined(FERRATTN_SM90A)
  sm90::fence_proxy_async();
#endif
}

template <int N>
__device__ __forceinline__ void fence_f(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int D>
__device__ __forceinline__ void fence_x(Vec16 (&x)[2][Layout<D>::kPieces]) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int m = 0; m < Layout<D>::kPieces; ++m)
      asm volatile("" : "+r"(x[r][m].x), "+r"(x[r][m].y), "+r"(x[r][m].z), "+r"(x[r][m].w)::"memory");
}

// acc = A (the warpgroup's 64 rows; `frag(kk, a)` gives the A fragment of k step kk) x Bᵀ, B the
// swizzled matrix at `b` (and + `b2`'s, SPLIT). sm_90a: D/16 (2 D/16) wgmma issued and committed,
// not waited for (product_wait); elsewhere mma.sync with B through ldmatrix, done on return.
template <int D, bool TWO, class Frag>
__device__ __forceinline__ void product_issue(Frag frag, u32 b, u32 b2, float (&acc)[Layout<D>::kAcc]) {
#if defined(FERRATTN_SM90A)
  (void)b2;
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    u32 a[4];
    frag(kk, a);
    const u32 off = (kk >> 2) * Layout<D>::kBlockBytes + (kk & 3) * 32;
    wgmma_rs(acc, a, sm90::smem_desc(b + off, 1024, sm90::kSw128), kk > 0);
    if (TWO) wgmma_rs(acc, a, sm90::smem_desc(b2 + off, 1024, sm90::kSw128), 1);
  }
  sm90::wgmma_commit();
#else
  const int lane = threadIdx.x % 32, mi = lane >> 3;
#pragma unroll
  for (int i = 0; i < Layout<D>::kAcc; ++i) acc[i] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    u32 a[4];
    frag(kk, a);
#pragma unroll
    for (int j = 0; j < D / 8; j += 2) {
      const int n = 8 * (j + (mi >> 1)) + (lane & 7), k = 16 * kk + 8 * (mi & 1);
      u32 bf[4];
      ldmatrix_x4(bf, b + mat_byte<D>(n, k));
      mma16816(F16{}, *reinterpret_cast<float(*)[4]>(&acc[4 * j]), a, bf[0], bf[1]);
      mma16816(F16{}, *reinterpret_cast<float(*)[4]>(&acc[4 * j + 4]), a, bf[2], bf[3]);
      if (TWO) {
        ldmatrix_x4(bf, b2 + mat_byte<D>(n, k));
        mma16816(F16{}, *reinterpret_cast<float(*)[4]>(&acc[4 * j]), a, bf[0], bf[1]);
        mma16816(F16{}, *reinterpret_cast<float(*)[4]>(&acc[4 * j + 4]), a, bf[2], bf[3]);
      }
    }
  }
#endif
}
template <int D>
__device__ __forceinline__ void product_wait(float (&acc)[Layout<D>::kAcc]) {
#if defined(FERRATTN_SM90A)
  sm90::wgmma_wait<0>();
#endif
  fence_f(acc);
}

// A chunk's rows of this thread: its tile (chunk row 16w + 2g is tile 2w + g / 4) and token pair
// (2 (g % 4), + 1 in the tile); `row` the cache row of the even token (both tokens of a tile
// are one (sequence, KV head)), `ev` / `od` whether each token is in the append.
struct Rows {
  long long row;     // destination cache row of the even token
  long long src;     // source row (of [batch, src_len, heads_kv]) of the even token
  bool ev, od;
};
__device__ __forceinline__ Rows chunk_rows(const FastParams& p, int chunk, int items, int tile_in_chunk, int pair) {
  Rows r{0, 0, false, false};
  const int item = chunk * kTilesPerChunk + tile_in_chunk;
  if (item < items) {
    const int bh = fast_div(item, p.groups_mul, p.groups_shr);
    const int x = item - bh * p.groups;
    const int b = fast_div(bh, p.heads_mul, p.heads_shr);
    const int h = bh - b * p.heads_kv;
    const int d0 = p.dst0[b], cnt = p.count[b];
    const int first = (d0 & ~(kTile - 1)) + x * kTile;  // d0 >= 0
    const int lo = max(first, d0), hi = min(first + kTile, d0 + cnt);
    const int j = first + 2 * pair;
    r.ev = j >= lo && j < hi;
    r.od = j + 1 >= lo && j + 1 < hi;
    r.row = ((long long)b * p.heads_kv + h) * p.cap + j;
    r.src = ((long long)b * p.src_len + (j - d0)) * p.heads_kv + h;  // may be -1 row for j < d0 (not read)
  }
  return r;
}
// the thread's pieces 4m + q of its two rows. A token outside the append (or past the last
// item) loads row 0 of the source instead: its codes and norms are never stored, and an
// unconditional load lands in the registers the product reads (a conditional zero would move
// every loaded register, waiting on the load at the prefetch)
template <int D>
__device__ __forceinline__ void load_rows(const FastParams& p, const Rows& r, int q, Vec16 (&x)[2][Layout<D>::kPieces]) {
  const u16* s0 = p.src + (r.ev ? r.src * D : 0) + 8 * q;
  const u16* s1 = p.src + (r.od ? (r.src + p.heads_kv) * D : 0) + 8 * q;  // the next token, same head
#pragma unroll
  for (int m = 0; m < Layout<D>::kPieces; ++m) {
    x[0][m] = ld_global_nc16(s0 + 32 * m);
    x[1][m] = ld_global_nc16(s1 + 32 * m);
  }
}

// the thread's share of a chunk's rows into L2 (no registers held): the quad's 4 threads cover
// the 2 rows x D/64 128-byte lines of its token pair, one line each (D 128; D 64: threads 0, 1)
template <int D>
__device__ __forceinline__ void prefetch_rows(const FastParams& p, const Rows& r, int q) {
  constexpr int kLines = D / 64;  // 128-byte lines per row
  const int t = q / kLines, l = q % kLines;
  if (t < 2 && (t ? r.od : r.ev)) {
    const u16* a = p.src + (r.src + (t ? p.heads_kv : 0)) * D + 64 * l;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
  }
}

// ‖x‖ of the thread's two rows (the quad's 4 threads hold the 4 parts of each row). First an f32
// sum of the (exact) squares in 4 FMA chains of D/16 terms, a fixed tree over them and a butterfly
// over the quad (a + b == b + a: every thread ends with one value): at most D/16 - 1 + 2 + 2 <=
// 11 roundings on any path of a sum of positive terms, so the sum is within (1 + 2^-24)^11 - 1
// < 11.01 2^-24 < 2^-20 and n = sqrt.rn of it within 11.01 / 2 + 1 < 6.6 2^-24 of the exact ‖x‖
// (relative; the emulation's ‖x‖ is within 2^-24 of it, so n and it differ by < 7.7 2^-24).
// The stored f16 norm must be the emulation's bit for bit: where n (1 - 2^-20) and
// n (1 + 2^-20) (each within 2^-24 of its product: a window of more than 15 2^-24 either side,
// twice the 7.7 needed) round to one f16, so does the emulation's ‖x‖, and n serves (it scales y
// within 2^-20 of the emulation's, inside the code margin's 2^-14 for f32 sums; ‖r‖ = f16(n γ)
// within one f16 step). Otherwise (2 2^-20 / 2^-10: about 0.2% of rows, 3% of a warp's 16-row
// chunks; the window was 2^-17 before issue 10's eleventh compression pass, 1.6% of rows, and
// the f64 branch then held 7.5% of the stall samples and made a warp late at the warpgroup's
// next wgmma) the row is summed again as the emulation does, in f64 (4 interleaved partials per
// thread, combined in a fixed order: equal to the emulation's sequential sum unless a partial
// sum rounds), and that ‖x‖ is used.
template <int D>
__device__ __forceinline__ float row_norm(const Vec16 (&xr)[Layout<D>::kPieces]) {
  float s4[4] = {0.f, 0.f, 0.f, 0.f};  // 4 independent FMA chains (latency), a fixed tree after
#pragma unroll
  for (int m = 0; m < Layout<D>::kPieces; ++m) {
    float f[8];
    unpack8<F16>(xr[m], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) s4[e % 4] = fmaf(f[e], f[e], s4[e % 4]);
  }
  float s32 = (s4[0] + s4[1]) + (s4[2] + s4[3]);
  s32 = s32 + shfl_xor(s32, 1);
  s32 = s32 + shfl_xor(s32, 2);
  float n;
  asm("sqrt.rn.f32 %0, %1;" : "=f"(n) : "f"(s32));
  if (F16::from_f32(tq::fmul_rn(n, 1.f - 0x1p-20f)) != F16::from_f32(tq::fmul_rn(n, 1.f + 0x1p-20f))) {
    // |x| to f64 without a 64-bit conversion (16 per clock per SM): its f32 bits b (exact for
    // every f16, subnormals included) give the f64's high word (b >> 3) + (1023 - 127) << 20
    // and a zero low word (an f16's 10 mantissa bits fit the high word); fma(v, v, acc) is
    // add(acc, v v) since v v is exact. A zero maps to 2^-127: its square 2^-254 is absorbed,
    // unrounded, by the first nonzero square (each >= 2^-48) of its partial or by any nonzero
    // partial, and an all-zero row sums below 2^-200, which is cleared.
    double a4[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll
    for (int m = 0; m < Layout<D>::kPieces; ++m) {
      Vec16 v = xr[m];
      v.x &= 0x7fff7fffu;
      v.y &= 0x7fff7fffu;
      v.z &= 0x7fff7fffu;
      v.w &= 0x7fff7fffu;
      float f[8];
      unpack8<F16>(v, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const u32 hi = (__float_as_uint(f[e]) >> 3) + 0x38000000u;
        double dv;
        asm("mov.b64 %0, {%1, %2};" : "=d"(dv) : "r"(0u), "r"(hi));
        asm("fma.rn.f64 %0, %1, %1, %0;" : "+d"(a4[e % 4]) : "d"(dv));
      }
    }
    double acc = (a4[0] + a4[1]) + (a4[2] + a4[3]);
    // the quad's 4 threads all take this branch (they hold one n), so the shuffle is full
    acc = acc + shfl_xor_f64_in(acc, 1, 4);
    acc = acc + shfl_xor_f64_in(acc, 2, 4);
    if (acc < 0x1p-200) acc = 0.0;
    double rt;
    asm("sqrt.rn.f64 %0, %1;" : "=d"(rt) : "d"(acc));
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(n) : "d"(rt));
  }
  return n;
}

// two nibble words of codes < 4 as one crumb word (layout.rs: crumbs_of_nibbles)
__device__ __forceinline__ u32 crumb_word(u32 w0, u32 w1) { return (w0 & 0x33333333u) | ((w1 & 0x33333333u) << 2); }

template <int D, bool KEYS, bool QJL, bool SPLIT>
__device__ __forceinline__ void compress_fast(const FastParams& p) {
  using L = Layout<D>;
  constexpr int NA = L::kAcc, NP = L::kPieces;
  extern __shared__ float4 smem4[];
  // the swizzled matrices start at a 1024-byte boundary (the host adds 1024 bytes of slack)
  unsigned char* base = reinterpret_cast<unsigned char*>(smem4);
  base += (1024u - (smem_addr(base) & 1023u)) & 1023u;
  const u32 pih_a = smem_addr(base);                                    // Π (f16, K permuted)
  const u32 pil_a = pih_a + L::kMatBytes;                               // Π - Π_hi (SPLIT)
  const u32 m_a = pil_a + (SPLIT ? L::kMatBytes : 0);                   // S Πᵀ (QJL)
  unsigned char* cnt_s = base + (m_a - pih_a) + (QJL ? L::kMatBytes : 0);  // [kLut] count bytes
  float* bnd_t = reinterpret_cast<float*>(cnt_s + kLut);               // [16] boundaries
  float* cen_t = bnd_t + 16;                                           // [32] centroids

  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int items = p.batch * p.heads_kv * p.groups;
  const int chunks = (items + kTilesPerChunk - 1) / kTilesPerChunk;
  const int tile = 2 * w + (g >> 2), pair = g & 3;

  // the prologue's global loads before its first wait: Π, the count bytes and the first chunk's
  // dst0 / count (one round trip to L2; split: Π's low half too), then, after `pdl_wait`, the
  // rows (the second), whose wait comes after the tables and the barrier (the rows are loaded
  // after Π is stored: both in registers at once spill at d 128). The eleventh compression pass
  // found six round trips in turn here (8-12% of the stall samples at 16 x 4k).
  //
  // Under a programmatic dependent launch (the host's `programmatic` switch) this kernel may
  // start while the kernel before it on the stream runs: where that grid fills the GPU (a
  // persistent compression) this grid's CTAs take SM slots as its CTAs exit and run their
  // prologue under its tail. Everything before `pdl_wait` reads only what no kernel writes (Π
  // and its low half, the code lookup: the engine's constants; dst0 / count: the append's
  // tables, which the host uploads by a copy); the rows (in an engine the K/V projection's
  // output) and S Πᵀ are loaded after it, and every store to the cache comes after it.
  //
  // Where the next kernel may launch: once every CTA is past its prologue (below), so that at
  // most two launches overlap (signalled first thing, appends of 64 sequences, one chunk per
  // CTA, ran 1.3-2.7% slower than plain stream order: chains of launches three deep on each
  // SM). Fast QJL keys at d 128 signal first thing: with the signal anywhere else ptxas gives
  // a centroid lookup of that loop a scoreboard of the next rows' loads, 12 instructions after
  // them (tools/rowwait.py; measured 2.6-3.5% slower), the thirteenth compression pass
  constexpr bool kSignalFirst = D == 128 && QJL && !SPLIT;
  if constexpr (kSignalFirst) pdl_launch_dependents();
  int c = blockIdx.x;
  Rows cur = chunk_rows(p, c, items, tile, pair);
  Vec16 piv[D * D / 32 / kThreads][4];
  stage_load<D>(p.pi_hi, piv);
  static_assert(kLut % kThreads == 0, "whole iterations");
  float lutv[kLut / kThreads];
#pragma unroll
  for (int i = 0; i < kLut / kThreads; ++i) lutv[i] = p.lut[threadIdx.x + i * kThreads].y;
  Vec16 x[2][NP];
  stage_store<D, true>(piv, pih_a);
  // Π's low half (split) is loaded before the wait and stored after the
  // rows are issued: with the launch overlapped it has arrived by then; without it its round
  // trip and the rows' overlap, as before
  Vec16 mv[D * D / 32 / kThreads][4];  // unused (and not allocated) but for split
  if constexpr (SPLIT) stage_load<D>(p.pi_lo, mv);
  pdl_wait();  // the kernel before on the stream (the rows' writer) has completed
  if (c < chunks) load_rows<D>(p, cur, q, x);
  // QJL keys stage S Πᵀ after the rows, as before this pass (an L2 round trip under the rows'):
  // loaded before the rows, ptxas put a wait on a row load 9-16 instructions after it in the
  // d 128 loop (tools/rowwait.py of the thirteenth compression pass)
  if constexpr (QJL) stage_matrix<D, false>(p.m, m_a);

#pragma unroll
  for (int i = 0; i < kLut / kThreads; ++i) cnt_s[threadIdx.x + i * kThreads] = (unsigned char)__float_as_uint(lutv[i]);
  if (threadIdx.x < 16) {
    // boundary c of the table = CodeLut's boundary of the bins whose count is c (+ 0: no -0)
    const int cc = threadIdx.x;
    bnd_t[cc] = cc < p.n_bounds ? tq::fadd_rn(p.bounds[cc], 0.f) : __int_as_float(0x7f800000);
  }
  if (threadIdx.x < 32) cen_t[threadIdx.x] = p.cents[min((int)threadIdx.x, p.n_bounds)];
  // the byte table's biased address through shared memory: ptxas cannot split it into a uniform
  // base and a constant added to every lookup's address (one add per lookup, not two ops)
  __shared__ u32 cnt_base_s;
  if (threadIdx.x == 0) cnt_base_s = smem_addr(cnt_s) - 0x4B000000u;
  if constexpr (SPLIT) stage_store<D, true>(mv, pil_a);
  wgmma_proxy_fence();  // the staged matrices are read by wgmma (async proxy)
  __syncthreads();
  const u32 cnt_a = *reinterpret_cast<volatile u32*>(&cnt_base_s);
  const u32 bnd_a = smem_addr(bnd_t), cen_a = smem_addr(cen_t);
  if constexpr (!kSignalFirst) pdl_launch_dependents();

  for (; c < chunks; c += gridDim.x) {
    float acc[NA];
    product_issue<D, SPLIT>([&](int kk, u32(&a)[4]) { a_frag<D>(x, kk, a); }, pih_a, pil_a, acc);
    // the row norms on the CUDA cores while the tensor cores run
    const float n0 = row_norm<D>(x[0]), n1 = row_norm<D>(x[1]);
    // the next chunk's rows before the wait: their dst0 / count loads return under it
    const Rows nx = chunk_rows(p, c + gridDim.x, items, tile, pair);
    const float i0 = n0 > 0.f ? tq::fdiv_rn(1.f, n0) : 0.f, i1 = n1 > 0.f ? tq::fdiv_rn(1.f, n1) : 0.f;
    // the norm folded into the lookup (code_scaled): the grid's scale per row, n (1 for a zero row)
    const float s0 = n0 > 0.f ? tq::fmul_rn(i0, p.lut_scale) : p.lut_scale;
    const float s1 = n1 > 0.f ? tq::fmul_rn(i1, p.lut_scale) : p.lut_scale;
    const float m0 = n0 > 0.f ? n0 : 1.f, m1 = n1 > 0.f ? n1 : 1.f;
    product_wait<D>(acc);
    fence_x<D>(x);  // x is wgmma's operand until here
    const Rows r = cur;
    cur = nx;
    // unconditional: past the last chunk `cur` holds no token and row 0 is loaded, never used.
    // Inside `if` the loads ended a basic block of their own, where ptxas put the moves that
    // form the A fragments (two rows per register quad) right after them, waiting there for
    // the loads (the largest stall, issue 10's fifth compression pass); now the loads and moves
    // are scheduled with the epilogue
    load_rows<D>(p, cur, q, x);

    // codes: thread (g, q) holds channels 8j + 2q + e (e = 0, 1) of its rows 0 (acc[4j + e]) and
    // 1 (acc[4j + 2 + e]), j < D/8; packed into words as they come. Keys, row t: byte j of lane
    // block q holds channels 8j + 2q (low nibble) and 8j + 2q + 1. Values, the pair row: byte j
    // of lane block 2q + e holds channel 8j + 2q + e, the even token's code in the low nibble.
    u32 wd[2][D / 32];
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
      u32 nb[2][4];  // the bytes j = 4i + b of the two words, one code pair each
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int j = 4 * i + b;
        u32 cd[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float a = acc[4 * j + e];
          cd[e] = code_scaled(cnt_a, bnd_a, p, a, e < 2 ? s0 : s1, e < 2 ? m0 : m1);
          if (QJL) {
            float cen;
            asm volatile("ld.shared.f32 %0, [%1];" : "=f"(cen) : "r"(cen_a + 4u * cd[e]));
            acc[4 * j + e] = fmaf(a, e < 2 ? i0 : i1, -cen);  // the rotated residual y - c[idx]
          }
        }
        nb[0][b] = cd[0] + (cd[KEYS ? 1 : 2] << 4);
        nb[1][b] = cd[KEYS ? 2 : 1] + (cd[3] << 4);
      }
      // bytes to words with byte permutes (3 per word, not a shift and an or per byte)
#pragma unroll
      for (int t = 0; t < 2; ++t)
        wd[t][i] = __byte_perm(__byte_perm(nb[t][0], nb[t][1], 0x0040), __byte_perm(nb[t][2], nb[t][3], 0x0040), 0x5410);
    }
    // codes of at most 2 bits (n_bounds <= 3) as crumbs: crumb word j of a lane block holds its
    // nibble words 2j (bits 0-1 of every nibble) and 2j + 1 (bits 2-3); ferrattn_cuda::turboquant::layout
    const bool crumb = p.n_bounds <= 3;
    if (KEYS) {
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        if (!(t ? r.od : r.ev)) continue;
        if (crumb) {
          unsigned char* dst = p.codes + (r.row + t) * (D / 4) + q * (D / 16);
          const u32 c0 = crumb_word(wd[t][0], wd[t][1]);
          if constexpr (D == 128) st_global_v2(dst, c0, crumb_word(wd[t][2], wd[t][3]));
          else *reinterpret_cast<u32*>(dst) = c0;
          continue;
        }
        unsigned char* dst = p.codes + (r.row + t) * (D / 2) + q * (D / 8);
        if constexpr (D == 128) st_global_v4(dst, wd[t][0], wd[t][1], wd[t][2], wd[t][3]);
        else st_global_v2(dst, wd[t][0], wd[t][1]);
      }
    } else if (crumb) {
      if (r.ev || r.od) {
        // lane blocks 2q, 2q + 1 of the pair record (D/2 bytes), D/16 bytes each
        unsigned char* dst = p.codes + (r.row >> 1) * (D / 2) + q * (D / 8);
        u32 v[D / 32];
#pragma unroll
        for (int i = 0; i < D / 32; ++i) v[i] = crumb_word(wd[(2 * i) / (D / 32)][(2 * i) % (D / 32)], wd[(2 * i) / (D / 32)][(2 * i) % (D / 32) + 1]);
        if (!(r.ev && r.od)) {
#pragma unroll
          for (int i = 0; i < D / 32; ++i) {
            const u32 old = r.ev ? 0u : reinterpret_cast<const u32*>(dst)[i];
            v[i] = r.ev ? (v[i] & 0x0f0f0f0fu) : ((old & 0x0f0f0f0fu) | (v[i] & 0xf0f0f0f0u));
          }
        }
        if constexpr (D == 128) st_global_v4(dst, v[0], v[1], v[2], v[3]);
        else st_global_v2(dst, v[0], v[1]);
      }
      if (q == 0) {
        if (r.ev) reinterpret_cast<u16*>(p.norms)[r.row] = F16::from_f32(n0);
        if (r.od) reinterpret_cast<u16*>(p.norms)[r.row + 1] = F16::from_f32(n1);
      }
    } else {
      if (r.ev || r.od) {
        // the pair's index is (row of the even token) / 2
        unsigned char* dst = p.codes + (r.row >> 1) * D + q * (D / 4);
        u32 v[D / 16];
#pragma unroll
        for (int i = 0; i < D / 16; ++i) v[i] = wd[i / (D / 32)][i % (D / 32)];
        if (!(r.ev && r.od)) {
          // as the exact kernel: an even token alone clears the high nibble, an odd one keeps
          // its partner's low nibble
#pragma unroll
          for (int i = 0; i < D / 16; ++i) {
            const u32 old = r.ev ? 0u : reinterpret_cast<const u32*>(dst)[i];
            v[i] = r.ev ? (v[i] & 0x0f0f0f0fu) : ((old & 0x0f0f0f0fu) | (v[i] & 0xf0f0f0f0u));
          }
        }
        if constexpr (D == 128) {
          st_global_v4(dst, v[0], v[1], v[2], v[3]);
          st_global_v4(dst + 16, v[4], v[5], v[6], v[7]);
        } else {
          st_global_v4(dst, v[0], v[1], v[2], v[3]);
        }
      }
      if (q == 0) {
        if (r.ev) reinterpret_cast<u16*>(p.norms)[r.row] = F16::from_f32(n0);
        if (r.od) reinterpret_cast<u16*>(p.norms)[r.row + 1] = F16::from_f32(n1);
      }
    }

    if (KEYS) {
      u32 nr0 = 0u, nr1 = 0u;
      if (QJL) {
        // γ² of each row over the quad (f32 sums; the contract allows one f16 step in ‖r‖)
        float g0 = 0.f, g1 = 0.f;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          g0 += acc[4 * j] * acc[4 * j] + acc[4 * j + 1] * acc[4 * j + 1];
          g1 += acc[4 * j + 2] * acc[4 * j + 2] + acc[4 * j + 3] * acc[4 * j + 3];
        }
        g0 += shfl_xor(g0, 1);
        g1 += shfl_xor(g1, 1);
        g0 += shfl_xor(g0, 2);
        g1 += shfl_xor(g1, 2);
        float ga0, ga1;
        asm("sqrt.rn.f32 %0, %1;" : "=f"(ga0) : "f"(g0));
        asm("sqrt.rn.f32 %0, %1;" : "=f"(ga1) : "f"(g1));
        nr0 = F16::from_f32(tq::fmul_rn(n0, ga0));
        nr1 = F16::from_f32(tq::fmul_rn(n1, ga1));
        // the residual as f16 A fragments: columns [16kk, 16kk + 16) of the accumulator
        u32 am[D / 16][4];
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          am[kk][0] = pack2(F16{}, acc[8 * kk + 0], acc[8 * kk + 1]);
          am[kk][1] = pack2(F16{}, acc[8 * kk + 2], acc[8 * kk + 3]);
          am[kk][2] = pack2(F16{}, acc[8 * kk + 4], acc[8 * kk + 5]);
          am[kk][3] = pack2(F16{}, acc[8 * kk + 6], acc[8 * kk + 7]);
        }
        product_issue<D, false>(
            [&](int kk, u32(&a)[4]) {
              a[0] = am[kk][0];
              a[1] = am[kk][1];
              a[2] = am[kk][2];
              a[3] = am[kk][3];
            },
            m_a, m_a, acc);
        product_wait<D>(acc);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)  // am is wgmma's operand until here
          asm volatile("" : "+r"(am[kk][0]), "+r"(am[kk][1]), "+r"(am[kk][2]), "+r"(am[kk][3])::"memory");
        // signs: bit j of lane block q is channel 8j + 2q (acc[4j (+2)]), bit j + D/8 the channel
        // after it (acc[4j + 1 (+2)]); one funnel shift per bit takes the sign bit, set for a
        // negative product (a -0 product, if any, is a tie the contract allows: |(S r)_i| = 0)
        u32 s0 = 0u, s1 = 0u;
#pragma unroll
        for (int e = 1; e >= 0; --e)
#pragma unroll
          for (int j = D / 8 - 1; j >= 0; --j) {
            s0 = __funnelshift_l(__float_as_uint(acc[4 * j + e]), s0, 1);
            s1 = __funnelshift_l(__float_as_uint(acc[4 * j + 2 + e]), s1, 1);
          }
        s0 = ~s0;
        s1 = ~s1;
        if constexpr (D == 128) {
          if (r.ev) reinterpret_cast<u32*>(p.signs + r.row * (D / 8))[q] = s0;
          if (r.od) reinterpret_cast<u32*>(p.signs + (r.row + 1) * (D / 8))[q] = s1;
        } else {
          if (r.ev) reinterpret_cast<u16*>(p.signs + r.row * (D / 8))[q] = (u16)s0;
          if (r.od) reinterpret_cast<u16*>(p.signs + (r.row + 1) * (D / 8))[q] = (u16)s1;
        }
      }
      if (q == 0) {
        if (r.ev) reinterpret_cast<u32*>(p.norms)[r.row] = (u32)F16::from_f32(n0) | (nr0 << 16);
        if (r.od) reinterpret_cast<u32*>(p.norms)[r.row + 1] = (u32)F16::from_f32(n1) | (nr1 << 16);
      }
    }
  }
}

}  // namespace tqf
}  // namespace ferrattn
// Closed list of the fast path: D in {64, 128}; keys with or without QJL, values; Π as one f16
// matrix (`_fast_`) or split into f16 hi + lo (`_split_`). One warpgroup per CTA.
#define FERRATTN_TQF_ONE(NAME, D, KEYS, QJL, SPLIT, MINB)                                           \
  extern "C" __global__ void __launch_bounds__(128, MINB) NAME(const ferrattn::tqf::FastParams p) { \
    ferrattn::tqf::compress_fast<D, KEYS, QJL, SPLIT>(p);                                         \
  }
#define FERRATTN_TQF(D)                                                                           \
  FERRATTN_TQF_ONE(turboquant_fast_keys_qjl_d##D, D, true, true, false, (D == 64 ? 5 : 3))       \
  FERRATTN_TQF_ONE(turboquant_fast_keys_mse_d##D, D, true, false, false, (D == 64 ? 6 : 4))       \
  FERRATTN_TQF_ONE(turboquant_fast_values_d##D, D, false, false, false, (D == 64 ? 6 : 4))        \
  FERRATTN_TQF_ONE(turboquant_split_keys_qjl_d##D, D, true, true, true, 2)                        \
  FERRATTN_TQF_ONE(turboquant_split_keys_mse_d##D, D, true, false, true, 3)                       \
  FERRATTN_TQF_ONE(turboquant_split_values_d##D, D, false, false, true, 3)

FERRATTN_TQF(64)
FERRATTN_TQF(128)
