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

    // ---- packed writes in the decode kernel's operand layout
    const size_t row0 = ((size_t)b * p.heads_kv + h) * p.cap;  // token 0 of (b, h)
    if (KEYS) {
      for (int t = 0; t < kTokens; ++t) {
        const int j = first + t;
        if (j < lo || j >= hi) continue;
        if (o < D / 2) {
          const int q = o / (D / 8), bl = o % (D / 8), kap = bl / 2, eta = bl % 2;
          const int c0 = 16 * kap + 8 * eta + 2 * q;
          p.codes[(row0 + j) * (D / 2) + o] =
              (unsigned char)(idx_s[t * D + c0] | (idx_s[t * D + c0 + 1] << 4));
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
        const int g = o / (D / 8), nu = o % (D / 8), c = 8 * nu + g;
        unsigned char* dst = p.codes + (row0 / 2 + j / 2) * D + o;
        const u32 ce = idx_s[t * D + c], co = idx_s[(t + 1) * D + c];
        // an odd token alone keeps its even partner's low nibble; an even token alone clears
        // the high nibble for the partner that a later append writes
        *dst = (unsigned char)(ev && od ? (ce | (co << 4)) : ev ? ce : ((*dst & 0x0fu) | (co << 4)));
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
// Fast compression on tensor cores (the fast contract of docs/TURBOQUANT_CUDA.md, "Compression on
// tensor cores"). Same inputs, same outputs and layout as above; the rotation is one MMA product
// per token block instead of d^2 IEEE mul/add per row:
//   ‖x‖   an f32 FMA sum of the (exact) squares over 2-4 threads per row, within 2^-18 of the
//         exact norm; where that bound cannot decide the f16 rounding of the stored norm, f64
//         sums as the emulation (4 interleaved partials per thread, combined in a fixed order:
//         equal to the emulation's sequential sum unless a partial sum rounds, not seen in any
//         test). Stored f16 norms are the emulation's bit for bit; the f32 norm that scales y is
//         within 2^-18 of the emulation's (inside the 2^-14 of τ below)
//   y     = (Π x) / ‖x‖ with x exact in f16 and Π as one f16 matrix (SPLIT = false) or as f16
//         hi + lo (SPLIT = true: two MMAs, about f32 accuracy); f32 accumulation
//   idx   = #{boundaries_f32 < y} by a uniform-grid lookup (code_of; exact for the y it is given):
//         equal to the emulation's except where its rotated coordinate
//         lies within τ of a boundary, τ = 2^-11 + 2^-14 (one f16 Π: |δΠ| <= 2^-11 |Π| and
//         Σ_k |Π_ok| |u_k| <= 1) or 2^-14 (split Π; accumulation, the f32 norm and the
//         emulation's own f32 sum)
//   γ     = ‖y - c[idx]‖ in the rotated basis (rotation-invariant), f32 sums
//   signs = sign((S Πᵀ) (y - c[idx])): M = S Πᵀ precomputed on the host as one f16 matrix, the
//         residual rounded to f16: one MMA; equal to sign(S r) except where |(S r)_i| is within
//         2^-9 ‖S_i‖ ‖r‖ of zero
// Work: a CTA of D/16 warps, warp w owning rotated coordinates [16w, 16w + 16) with its rows of Π
// (and M) held as A fragments in registers for the whole kernel; the tokens stream through as
// the B operand (the N dimension), 64 token rows per chunk (8 tiles of 8 destination tokens of
// one (sequence, KV head), aligned to 8 so that value token pairs stay in one tile), fed by a
// 3-stage cp.async ring into 128-byte-swizzled shared tiles. On sm_90a each warpgroup (4 warps,
// 64 output channels) multiplies 32 token rows at a time with wgmma.m64n32k16 (A from registers,
// B through a shared-memory descriptor): the tile is read once per warpgroup, not once per warp
// (ldmatrix + mma.sync, the compute_80 PTX's path). Codes come from a count byte per grid bin and
// a boundary table indexed by that count (code_of). Codes, signs and norms are assembled in
// shared memory and written as whole rows.
namespace ferrattn {
namespace tqf {

constexpr int kTile = 8;            // destination tokens per tile (one MMA n8)
constexpr int kTilesPerChunk = 8;   // tiles per chunk
constexpr int kRows = kTile * kTilesPerChunk;  // token rows per chunk
constexpr int kStages = 3;
constexpr int kDstSlots = 4;  // destination-row ring (kStages + 1: see compress_fast)

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
__device__ __forceinline__ void red_or_shared_a(u32 a, u32 v) {
  asm volatile("red.shared.or.b32 [%0], %1;" ::"r"(a), "r"(v) : "memory");
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

// A token tile (kRows rows of D f16) in shared memory is the K-major B operand of wgmma with the
// 128-byte swizzle: channels [64a, 64a + 64) of every row form block a of kRows 128-byte rows
// (8-row atoms of 1024 bytes, aligned to 1024), and the 16-byte chunk c of row r sits at chunk
// c ^ (r % 8) of its 128 bytes. No padding: wgmma reads each row once per warpgroup, and
// 16-byte accesses of 8 consecutive rows at one chunk fall in 8 different bank groups.
template <int D>
struct Layout {
  static constexpr int kWarps = D / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockBytes = kRows * 128;  // one 64-channel block of a tile
  static constexpr int kTileBytes = kRows * D * 2;
};
// byte offset of channel `ch` (a multiple of 2) of row `r` in a swizzled tile
template <int D>
__device__ __forceinline__ u32 sw_byte(int r, int ch) {
  return (u32)((ch >> 6) * Layout<D>::kBlockBytes + r * 128 + ((((ch >> 3) & 7) ^ (r & 7)) << 4) + (ch & 7) * 2);
}

__device__ __forceinline__ void tile_coords(const FastParams& p, int item, int& b, int& h, int& first,
                                            int& lo, int& hi) {
  const int bh = fast_div(item, p.groups_mul, p.groups_shr);
  const int x = item - bh * p.groups;
  b = fast_div(bh, p.heads_mul, p.heads_shr);
  h = bh - b * p.heads_kv;
  const int d0 = p.dst0[b], cnt = p.count[b];
  first = (d0 & ~(kTile - 1)) + x * kTile;  // d0 >= 0
  lo = max(first, d0);
  hi = min(first + kTile, d0 + cnt);
}

// Each thread copies pieces (16 bytes) of one row (zero-filled for a tile outside the work or a
// token outside the append): one row lookup per thread and chunk, 32-bit shared addresses. The
// row's first thread also records its destination cache row (or -1) in `dst` (a slot of the
// destination ring, read when the chunk is processed).
template <int D>
__device__ __forceinline__ void load_chunk(const FastParams& p, int chunk, int items, u32 xs_a,
                                           long long* dst) {
  constexpr int C = D / 8, TPR = Layout<D>::kThreads / kRows;
  const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
  const int item = chunk * kTilesPerChunk + r / kTile;
  long long src_row = -1, dst_row = -1;
  if (item < items) {
    int b, h, first, lo, hi;
    tile_coords(p, item, b, h, first, lo, hi);
    const int j = first + r % kTile;
    if (j >= lo && j < hi) {
      src_row = ((long long)b * p.src_len + (j - p.dst0[b])) * p.heads_kv + h;
      dst_row = ((long long)b * p.heads_kv + h) * p.cap + j;
    }
  }
  if (part == 0) dst[r] = dst_row;
  const u16* src = p.src + (src_row >= 0 ? src_row * D : 0) + part * 8;
#pragma unroll
  for (int c = 0; c < C / TPR; ++c)
    cp_async16_s(xs_a + sw_byte<D>(r, 8 * (part + TPR * c)), src + 8 * TPR * c, src_row >= 0);
}

// two f16 of a row (col even: 4-byte aligned)
__device__ __forceinline__ u32 ld_pair(const u16* m, int row, int col, int d) {
  return ld_global_u32(m + row * d + col);
}

// A fragments of rows [16w, 16w + 16) of a row-major f16 D x D matrix, one per k16 step. MMA
// row g (< 8) is matrix row 16w + g and MMA row g + 8 is 16w + g + 8, or, with PAIRS, 16w + 2g
// and 16w + 2g + 1: then each lane's accumulators hold a channel pair (2g, 2g + 1), whose codes
// share a byte of the key layout and whose residuals share a 32-bit word.
template <int D, bool PAIRS = false>
__device__ __forceinline__ void load_a(const u16* m, int w, int lane, u32 (&a)[D / 16][4]) {
  const int g = lane / 4, q = lane % 4;
  const int r0 = PAIRS ? 16 * w + 2 * g : 16 * w + g, r1 = PAIRS ? r0 + 1 : r0 + 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c0 = 16 * kk + 2 * q;
    a[kk][0] = ld_pair(m, r0, c0, D);
    a[kk][1] = ld_pair(m, r1, c0, D);
    a[kk][2] = ld_pair(m, r0, c0 + 8, D);
    a[kk][3] = ld_pair(m, r1, c0 + 8, D);
  }
}

// Tiles computed together by a warp: independent MMA chains and epilogues in flight.
constexpr int kGroup = 4;

#if defined(FERRATTN_SM90A)
// D (64 x 32, f32) (+)= A (64 x 16 f16, registers) x B (32 x 16 f16, K-major in shared memory).
// The A fragment of warp w % 4 of the warpgroup is the mma.m16n8k16 A fragment of its 16 rows, and
// d[4j .. 4j + 3] is the m16n8 C fragment of columns [8j, 8j + 8) (PTX ISA "Register fragments
// ... wgmma .m64nNk16"), so the callers keep the mma.sync layouts.
__device__ __forceinline__ void wgmma_m64n32k16_f16_rs(float (&d)[kGroup][4], const u32 (&a)[4], u64 desc_b,
                                                       int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
      "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_proxy_fence() { sm90::fence_proxy_async(); }
__device__ __forceinline__ void fence_acc(float (&d)[kGroup][4]) {
#pragma unroll
  for (int j = 0; j < kGroup; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
#else
__device__ __forceinline__ void wgmma_proxy_fence() {}  // ldmatrix reads through the generic proxy
#endif

// acc[j] = A (16 rows of the warp) x rows [8 (t0 + j), 8 (t0 + j) + 8) of the swizzled tile at
// shared address `xs_a` (B). sm_90a: one wgmma.m64n32k16 per k16 step per warpgroup (the
// warpgroup's 4 warps own 64 output channels and read the 32 token rows once); elsewhere
// (the compute_80 PTX) ldmatrix + mma.sync per warp.
template <int D, bool SPLIT>
__device__ __forceinline__ void tile_products(const u32 (&ah)[D / 16][4], const u32 (&al)[D / 16][4], u32 xs_a,
                                              int t0, int lane, float (&acc)[kGroup][4]) {
#if defined(FERRATTN_SM90A)
  (void)lane;
  // k step kk: block kk / 4, 32 bytes kk % 4 into the 128-byte rows; rows from 8 t0 (1024-aligned)
  const u64 desc0 = sm90::smem_desc(xs_a + t0 * kTile * 128, 1024, sm90::kSw128);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const u64 dk = desc0 + (u64)(((kk >> 2) * Layout<D>::kBlockBytes + (kk & 3) * 32) >> 4);
    wgmma_m64n32k16_f16_rs(acc, ah[kk], dk, kk > 0);
    if (SPLIT) wgmma_m64n32k16_f16_rs(acc, al[kk], dk, 1);
  }
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  fence_acc(acc);
#else
#pragma unroll
  for (int j = 0; j < kGroup; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int rr = t0 * kTile + (lane & 7);
#pragma unroll
  for (int kk = 0; kk < D / 16; kk += 2) {
    u32 bf[kGroup][4];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) ldmatrix_x4(bf[j], xs_a + sw_byte<D>(rr + j * kTile, 16 * kk + 8 * (lane >> 3)));
#pragma unroll
    for (int j = 0; j < kGroup; ++j) mma16816(F16{}, acc[j], ah[kk], bf[j][0], bf[j][1]);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) mma16816(F16{}, acc[j], ah[kk + 1], bf[j][2], bf[j][3]);
    if (SPLIT) {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) mma16816(F16{}, acc[j], al[kk], bf[j][0], bf[j][1]);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) mma16816(F16{}, acc[j], al[kk + 1], bf[j][2], bf[j][3]);
    }
  }
#endif
}

// #{bounds < y} and its centroid by a uniform grid over y: bin k = rint(255 sat(y scale + off))
// (two FMAs: the saturation clamps) holds at most one boundary (the host checks), so with
// count_k = #{boundaries of bins < k} and bound_k = the first boundary of a bin >= k (+inf if none;
// that is boundary count_k), count_k + (bound_k < y) is the exact count: the grid is monotone in y
// (ferrattn_cuda::turboquant::CodeLut is the twin and holds these per bin). In shared memory the
// kernel keeps count_k as one byte per bin (256 bytes: a warp's 32 lookups touch at most 2 words
// per bank) and the boundaries and centroids as 16- and 32-entry f32 tables indexed by the count
// (at most 16 distinct words: conflict-free), not a random 8- or 16-byte entry per coordinate
// (5-7 wavefronts per warp lookup measured). `cnt` is the shared address of the byte table minus
// 0x4B000000 (mod 2^32): fma(u, 255, 2^23) has the f32 bits 0x4B000000 + k, so the byte's
// address is one add.
__device__ __forceinline__ u32 code_bits(const FastParams& p, float y) {
  float u, t;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(u) : "f"(y), "f"(p.lut_scale), "f"(p.lut_off));
  asm("fma.rn.f32 %0, %1, 0f437F0000, 0f4B000000;" : "=f"(t) : "f"(u));  // 255 u + 2^23
  u32 bits;
  asm("mov.b32 %0, %1;" : "=r"(bits) : "f"(t));
  return bits;
}
// bound < y exactly when bound - y < 0 (IEEE subtraction of unequal values never gives zero, and
// equal ones give +0; the tables hold no -0 boundary and +inf past the last): the sign bit of
// the difference is the comparison, so count + (sign >> 31) is one LEA.HI
__device__ __forceinline__ u32 below_bit(float bound, float y) {
  return __float_as_uint(tq::fsub_rn(bound, y)) >> 31;
}
__device__ __forceinline__ u32 code_of(u32 cnt, u32 bnd, const FastParams& p, float y) {
  u32 c;
  float b;
  asm volatile("ld.shared.u8 %0, [%1];" : "=r"(c) : "r"(cnt + code_bits(p, y)));
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(b) : "r"(bnd + 4u * c));
  return c + below_bit(b, y);
}
// the same and the centroid of the code (`cen`: the centroid table's shared address)
__device__ __forceinline__ u32 code_cent_of(u32 cnt, u32 bnd, u32 cen, const FastParams& p, float y,
                                            float& cent) {
  const u32 c = code_of(cnt, bnd, p, y);
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(cent) : "r"(cen + 4u * c));
  return c;
}

template <int D, bool KEYS, bool QJL, bool SPLIT>
__device__ __forceinline__ void compress_fast(const FastParams& p) {
  using L = Layout<D>;
  constexpr int NT = L::kThreads;
  extern __shared__ float4 smem4[];
  // the swizzled tiles start at a 1024-byte boundary (the host adds 1024 bytes of slack)
  unsigned char* base = reinterpret_cast<unsigned char*>(smem4);
  base += (1024u - (smem_addr(base) & 1023u)) & 1023u;
  u16* xs = reinterpret_cast<u16*>(base);                        // [kStages] swizzled tiles
  u16* rrs = xs + kStages * L::kTileBytes / 2;                   // swizzled residual tile (QJL)
  float* inv_s = reinterpret_cast<float*>(rrs + (QJL ? L::kTileBytes / 2 : 0));  // [kRows]
  float* nrm_s = inv_s + kRows;                                  // [kRows]
  float* gam_s = nrm_s + kRows;                                  // [kWarps][kRows] (QJL)
  float* bnd_s = gam_s + L::kWarps * kRows;                      // [16] (unused: the lookup)
  float* cen_s = bnd_s + 16;                                     // [16] (unused)
  u32* sg_s = reinterpret_cast<u32*>(cen_s + 16);                // [kRows][4] (QJL)
  // [kDstSlots][kRows] cache row or -1 of each chunk row, written by the chunk's loads: slot
  // kc % 4 for the kc-th chunk of this CTA (the loads of chunk kc + 2 run while chunk kc is
  // processed; slot (kc + 2) % 4 was last read by chunk kc - 2, before the barriers of chunk
  // kc - 1)
  long long* dst_ring = reinterpret_cast<long long*>(sg_s + kRows * 4);
  // key code rows of D/2 + 16 bytes (the byte stores of the 4 token rows a store instruction
  // touches fall in different banks); value pair rows of D + 4 bytes (a store instruction's 4
  // pair rows x 8 lane blocks fall in 32 different banks; D bytes: 4-way), read back by words
  constexpr int kCd = D / 2 + 16, kCv = D + 4;
  static_assert((kRows / 2) * kCv <= kRows * kCd, "value pair rows fit the key code rows");
  unsigned char* cd_s = reinterpret_cast<unsigned char*>(dst_ring + kDstSlots * kRows);  // kRows * kCd
  // the code lookup: [kLut] counts (bytes), [16] boundaries (+inf from n_bounds on), [32]
  // centroids (the last one repeated)
  unsigned char* cnt_s = cd_s + kRows * kCd;
  float* bnd_t = reinterpret_cast<float*>(cnt_s + kLut);
  float* cen_t = bnd_t + 16;

  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int items = p.batch * p.heads_kv * p.groups;
  const int chunks = (items + kTilesPerChunk - 1) / kTilesPerChunk;
  (void)cen_s;
  for (int i = threadIdx.x; i < kLut; i += NT) cnt_s[i] = (unsigned char)__float_as_uint(p.lut[i].y);
  if (threadIdx.x < 16) {
    // boundary c of the table = CodeLut's boundary of the bins whose count is c (+ 0: no -0)
    const int c = threadIdx.x;
    bnd_t[c] = c < p.n_bounds ? tq::fadd_rn(p.bounds[c], 0.f) : __int_as_float(0x7f800000);
  }
  if (threadIdx.x < 32) cen_t[threadIdx.x] = p.cents[min((int)threadIdx.x, p.n_bounds)];
  // the byte table's biased address through shared memory: ptxas cannot split it into a uniform
  // base and a constant added to every lookup's address (one add per lookup, not two ops)
  __shared__ u32 cnt_base_s;
  if (threadIdx.x == 0) cnt_base_s = smem_addr(cnt_s) - 0x4B000000u;
  __syncthreads();
  const u32 cnt_a = *reinterpret_cast<volatile u32*>(&cnt_base_s);
  const u32 bnd_a = smem_addr(bnd_t), cen_a = smem_addr(cen_t);
  u32 ah[D / 16][4], al[SPLIT ? D / 16 : 1][4], am[QJL ? D / 16 : 1][4];
  load_a<D, KEYS>(p.pi_hi, w, lane, ah);
  if (SPLIT) load_a<D, KEYS>(p.pi_lo, w, lane, reinterpret_cast<u32(&)[D / 16][4]>(al));
  if (QJL) load_a<D>(p.m, w, lane, reinterpret_cast<u32(&)[D / 16][4]>(am));

  // ring: chunks blockIdx.x + k gridDim.x; stage k % kStages
  const u32 xs_a = smem_addr(xs);
  int c_load = blockIdx.x;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (c_load < chunks)
      load_chunk<D>(p, c_load, items, xs_a + s * L::kTileBytes, dst_ring + s * kRows);
    cp_async_commit();
    c_load += gridDim.x;
  }
  int stage = 0, kc = 0;  // kc: this CTA's chunk count
  for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
    {
      const int ls = (stage + kStages - 1) % kStages;
      if (c_load < chunks)
        load_chunk<D>(p, c_load, items, xs_a + ls * L::kTileBytes,
                      dst_ring + ((kc + kStages - 1) % kDstSlots) * kRows);
      cp_async_commit();
      c_load += gridDim.x;
    }
    cp_async_wait<kStages - 1>();
    wgmma_proxy_fence();  // this thread's cp.async rows are read by wgmma (async proxy)
    __syncthreads();
    const u32 x_a = xs_a + stage * L::kTileBytes;
    const unsigned char* x = reinterpret_cast<const unsigned char*>(xs) + stage * L::kTileBytes;
    const long long* dst_s = dst_ring + (kc % kDstSlots) * kRows;

    // ‖x‖: NT / kRows threads per row. First an f32 sum of the (exact) squares, FMA by FMA, and
    // a butterfly over the row's threads (a + b == b + a: every thread ends with one value): at
    // most PER - 1 + log2 TPR <= 33 roundings of a sum of positive terms, so the sum is within
    // 33 2^-24 < 2^-18 and n = sqrt.rn of it within 2^-19 of the exact ‖x‖ (relative; the
    // emulation's f32 ‖x‖ is within 2^-24 of it). The stored f16 norm
    // must be the emulation's bit for bit: where n (1 - 2^-17) and n (1 + 2^-17) round to one
    // f16, so does the emulation's ‖x‖, and n serves (it scales y within 2^-18 of the
    // emulation's, inside the code margin's 2^-14 for f32 sums; ‖r‖ = f16(n γ) within one f16
    // step). Otherwise (about 1-2% of rows) the row is summed again as the emulation does, in f64
    // (4 interleaved partials per thread, combined in a fixed order: equal to the emulation's
    // sequential sum unless a partial sum rounds), and that ‖x‖ is used.
    {
      constexpr int TPR = NT / kRows, PER = D / TPR;
      const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
      // chunk k / 8 of the row's part: swizzled 16-byte pieces
      auto xr = [&](int k) { return reinterpret_cast<const u16*>(x + sw_byte<D>(r, part * PER + k)); };
      float s32 = 0.f;
#pragma unroll
      for (int k = 0; k < PER; k += 8) {
        float f[8];
        unpack8<F16>(ld_shared16(xr(k)), f);
#pragma unroll
        for (int e = 0; e < 8; ++e) s32 = fmaf(f[e], f[e], s32);
      }
#pragma unroll
      for (int o = 1; o < TPR; o *= 2) s32 = s32 + shfl_xor(s32, o);
      float n;
      asm("sqrt.rn.f32 %0, %1;" : "=f"(n) : "f"(s32));
      if (F16::from_f32(tq::fmul_rn(n, 1.f - 0x1p-17f)) != F16::from_f32(tq::fmul_rn(n, 1.f + 0x1p-17f))) {
        // |x| to f64 without a 64-bit conversion (16 per clock per SM): its f32 bits b (exact
        // for every f16, subnormals included) give the f64's high word (b >> 3) + (1023 - 127)
        // << 20 and a zero low word (an f16's 10 mantissa bits fit the high word); fma(v, v,
        // acc) is add(acc, v v) since v v is exact. A zero maps to 2^-127: its square 2^-254
        // is absorbed, unrounded, by the first nonzero square (each >= 2^-48) of its partial or
        // by any nonzero partial, and an all-zero row sums below 2^-200, which is cleared.
        double a4[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll
        for (int k = 0; k < PER; k += 8) {
          Vec16 v = ld_shared16(xr(k));
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
        // the row's TPR threads all take this branch (they hold one n), so the shuffle is full
#pragma unroll
        for (int o = 1; o < TPR; o *= 2) acc = acc + shfl_xor_f64_in(acc, o, TPR);
        if (acc < 0x1p-200) acc = 0.0;
        double rt;
        asm("sqrt.rn.f64 %0, %1;" : "=d"(rt) : "d"(acc));
        asm("cvt.rn.f32.f64 %0, %1;" : "=f"(n) : "d"(rt));
      }
      if (part == 0) {
        nrm_s[r] = n;
        inv_s[r] = n > 0.f ? tq::fdiv_rn(1.f, n) : 0.f;
      }
      if (QJL)
        for (int i = threadIdx.x; i < kRows * 4; i += NT) sg_s[i] = 0u;
    }
    __syncthreads();

    // rotation, codes, residual: kGroup tiles of 8 tokens at a time
#pragma unroll 1
    for (int t0 = 0; t0 < kTilesPerChunk; t0 += kGroup) {
      float acc[kGroup][4];
      float gs[2 * kGroup];  // QJL: this lane's part of γ² of its 2 kGroup token rows
      tile_products<D, SPLIT>(ah, reinterpret_cast<const u32(&)[D / 16][4]>(al), x_a, t0, lane, acc);
#pragma unroll
      for (int jt = 0; jt < kGroup; ++jt) {
        const int r0 = (t0 + jt) * kTile + 2 * q;  // chunk rows of acc[.][0] / acc[.][1]
        const float2 iv = *reinterpret_cast<const float2*>(inv_s + r0);
        const float y[4] = {tq::fmul_rn(acc[jt][0], iv.x), tq::fmul_rn(acc[jt][1], iv.y),
                            tq::fmul_rn(acc[jt][2], iv.x), tq::fmul_rn(acc[jt][3], iv.y)};
        u32 idx[4];
        float cen[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (QJL) idx[e] = code_cent_of(cnt_a, bnd_a, cen_a, p, y[e], cen[e]);
          else idx[e] = code_of(cnt_a, bnd_a, p, y[e]);
        }
        if (KEYS) {
          // channel pairs (load_a<D, true>): acc[.][0] / [2] are channels c = 16w + 2g and c + 1
          // of token 2q, [1] / [3] of token 2q + 1; c = 16κ + 8η + 2q' with κ = w, η = g / 4,
          // q' = g % 4: byte 2w + g / 4 of lane block g % 4, c in the low nibble
          unsigned char* cb = cd_s + r0 * kCd + (g & 3) * (D / 8) + 2 * w + (g >> 2);
          cb[0] = (unsigned char)(idx[0] | (idx[2] << 4));
          cb[kCd] = (unsigned char)(idx[1] | (idx[3] << 4));
        } else {
          // pair row r0 / 2: byte g (D/8) + 2w + η, even token low nibble
          const u32 b0 = idx[0] | (idx[1] << 4), b1 = idx[2] | (idx[3] << 4);
          *reinterpret_cast<u16*>(cd_s + (r0 / 2) * kCv + g * (D / 8) + 2 * w) = (u16)(b0 | (b1 << 8));
        }
        if (QJL) {
          float rr[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) rr[e] = y[e] - cen[e];
          gs[2 * jt] = rr[0] * rr[0] + rr[2] * rr[2];      // token r0
          gs[2 * jt + 1] = rr[1] * rr[1] + rr[3] * rr[3];  // token r0 + 1
          // channels (o0, o0 + 1) of tokens r0, r0 + 1 as packed f16 pairs
          const int o0 = 16 * w + 2 * g;
          u32 p0, p1;
          asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(p0) : "f"(rr[2]), "f"(rr[0]));
          asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(p1) : "f"(rr[3]), "f"(rr[1]));
          unsigned char* rb = reinterpret_cast<unsigned char*>(rrs);
          *reinterpret_cast<u32*>(rb + sw_byte<D>(r0, o0)) = p0;
          *reinterpret_cast<u32*>(rb + sw_byte<D>(r0 + 1, o0)) = p1;
        }
      }
      if (QJL) {
        // γ² of the warp's 16 channels: the 8 values of the lanes g = 0..7 summed by a transposed
        // butterfly (each round halves the values a lane keeps), so that lane g ends with value
        // g = 2 jt + τ: token row 8 (t0 + jt) + 2q + τ
        static_assert(kGroup == 4, "the butterfly reduces 2 kGroup = 8 values over 8 lanes");
#pragma unroll
        for (int half = 4, m = 16; half >= 1; half /= 2, m /= 2) {
          const bool up = (lane & m) != 0;
#pragma unroll
          for (int i = 0; i < half; ++i) {
            const float keep = up ? gs[i + half] : gs[i], send = up ? gs[i] : gs[i + half];
            gs[i] = keep + shfl_xor(send, m);
          }
        }
        gam_s[w * kRows + (t0 + (g >> 1)) * kTile + 2 * q + (g & 1)] = gs[0];
      }
    }
    if (QJL) {
      wgmma_proxy_fence();  // the residual stores are read by wgmma (async proxy)
      __syncthreads();
      const int e = 2 * w + (g & 1) * (D / 8);
      // word g/2 of token row 2q + g % 2 of a tile
      const u32 sg_a = smem_addr(sg_s) + 16u * (2 * q + (g & 1)) + 4u * (g >> 1);
#pragma unroll 1
      for (int t0 = 0; t0 < kTilesPerChunk; t0 += kGroup) {
        float acc[kGroup][4];
        tile_products<D, false>(reinterpret_cast<const u32(&)[D / 16][4]>(am),
                                reinterpret_cast<const u32(&)[D / 16][4]>(am), smem_addr(rrs), t0, lane, acc);
#pragma unroll
        for (int jt = 0; jt < kGroup; ++jt) {
          // channel 16w + g (+8): lane block g/2, bit e (+1), e = 2w + (g % 2) D/8; the sign
          // bit of the product is the comparison (a -0 product, if any, is a tie the contract
          // allows: |(S r)_i| = 0)
          const u32 m0 = (~__float_as_uint(acc[jt][0]) >> 31 << e) |
                         (~__float_as_uint(acc[jt][2]) >> 31 << (e + 1));
          const u32 m1 = (~__float_as_uint(acc[jt][1]) >> 31 << e) |
                         (~__float_as_uint(acc[jt][3]) >> 31 << (e + 1));
          // even g keeps token 2q and sends 2q + 1 to its odd partner, which keeps 2q + 1
          const u32 keep = (g & 1) ? m1 : m0, send = (g & 1) ? m0 : m1;
          red_or_shared_a(sg_a + 16u * kTile * (t0 + jt), keep | shfl_xor_u32(send, 4));
        }
      }
    }
    __syncthreads();

    // ---- writes: whole rows from shared memory
    if (KEYS) {
      for (int i = threadIdx.x; i < kRows * (D / 32); i += NT) {  // D/2 bytes = D/32 pieces per row
        const int r = i / (D / 32), piece = i % (D / 32);
        const long long row = dst_s[r];
        if (row < 0) continue;
        *reinterpret_cast<Vec16*>(p.codes + row * (D / 2) + 16 * piece) =
            ld_shared16(cd_s + r * kCd + 16 * piece);
      }
    } else {
      for (int i = threadIdx.x; i < (kRows / 2) * (D / 16); i += NT) {  // D bytes per token pair
        const int pr = i / (D / 16), piece = i % (D / 16);
        const long long re = dst_s[2 * pr], ro = dst_s[2 * pr + 1];
        const bool ev = re >= 0, od = ro >= 0;
        if (!ev && !od) continue;
        // the even row is token j (even), the odd one j + 1: the pair's index is (row of j) / 2
        const long long pair = ev ? re / 2 : (ro - 1) / 2;
        unsigned char* dst = p.codes + pair * D + 16 * piece;
        const unsigned char* src = cd_s + pr * kCv + 16 * piece;
        if (ev && od) {
          const u32* sw = reinterpret_cast<const u32*>(src);  // 4-byte aligned only
          *reinterpret_cast<Vec16*>(dst) = Vec16{sw[0], sw[1], sw[2], sw[3]};
        } else {
          // as the exact kernel: an even token alone clears the high nibble, an odd one keeps
          // its partner's low nibble
          for (int k = 0; k < 16; ++k)
            dst[k] = ev ? (unsigned char)(src[k] & 0x0fu) : (unsigned char)((dst[k] & 0x0fu) | (src[k] & 0xf0u));
        }
      }
    }
    if (threadIdx.x < kRows) {
      const int r = threadIdx.x;
      const long long row = dst_s[r];
      if (row >= 0) {
        const float n = nrm_s[r];
        if (KEYS) {
          u32 nr = 0u;
          if (QJL) {
            float s = 0.f;
#pragma unroll
            for (int ww = 0; ww < L::kWarps; ++ww) s += gam_s[ww * kRows + r];
            float gam;
            asm("sqrt.rn.f32 %0, %1;" : "=f"(gam) : "f"(s));
            nr = F16::from_f32(tq::fmul_rn(n, gam));
            const u32* sw = sg_s + r * 4;
            if (D == 128) {
              Vec16 v{sw[0], sw[1], sw[2], sw[3]};
              *reinterpret_cast<Vec16*>(p.signs + row * (D / 8)) = v;
            } else {
              u32* dst = reinterpret_cast<u32*>(p.signs + row * (D / 8));
              dst[0] = sw[0] | (sw[1] << 16);
              dst[1] = sw[2] | (sw[3] << 16);
            }
          }
          reinterpret_cast<u32*>(p.norms)[row] = (u32)F16::from_f32(n) | (nr << 16);
        } else {
          reinterpret_cast<u16*>(p.norms)[row] = F16::from_f32(n);
        }
      }
    }
    stage = (stage + 1) % kStages;
    ++kc;
  }
  cp_async_wait<0>();
}

}  // namespace tqf
}  // namespace ferrattn
// Closed list of the fast path: D in {64, 128}; keys with or without QJL, values; Π as one f16
// matrix (`_fast_`) or split into f16 hi + lo (`_split_`).
#define FERRATTN_TQF_ONE(NAME, D, KEYS, QJL, SPLIT, MINB)                                           \
  extern "C" __global__ void __launch_bounds__(D * 2, MINB) NAME(const ferrattn::tqf::FastParams p) { \
    ferrattn::tqf::compress_fast<D, KEYS, QJL, SPLIT>(p);                                         \
  }
#define FERRATTN_TQF(D)                                                                           \
  FERRATTN_TQF_ONE(turboquant_fast_keys_qjl_d##D, D, true, true, false, 2)                        \
  FERRATTN_TQF_ONE(turboquant_fast_keys_mse_d##D, D, true, false, false, 3)                       \
  FERRATTN_TQF_ONE(turboquant_fast_values_d##D, D, false, false, false, 3)                        \
  FERRATTN_TQF_ONE(turboquant_split_keys_qjl_d##D, D, true, true, true, 1)                        \
  FERRATTN_TQF_ONE(turboquant_split_keys_mse_d##D, D, true, false, true, 2)                       \
  FERRATTN_TQF_ONE(turboquant_split_values_d##D, D, false, false, true, 2)

FERRATTN_TQF(64)
FERRATTN_TQF(128)
