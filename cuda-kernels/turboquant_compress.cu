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
//   ‖x‖   f64 sums of the (exact) squares: 2-4 threads per row, 4 interleaved partials each,
//         combined in a fixed order, then as the emulation (equal to the emulation's
//         sequential sum unless a partial sum rounds: not seen in any test)
//   y     = (Π x) / ‖x‖ with x exact in f16 and Π as one f16 matrix (SPLIT = false) or as f16
//         hi + lo (SPLIT = true: two MMAs, about f32 accuracy); f32 accumulation
//   idx   = #{boundaries_f32 < y} by a uniform-grid lookup (code_of; exact for the y it is given):
//         equal to the emulation's except where its rotated coordinate
//         lies within τ of a boundary, τ = 2^-11 + 2^-14 (one f16 Π: |δΠ| <= 2^-11 |Π| and
//         Σ_k |Π_ok| |u_k| <= 1) or 2^-14 (split Π; accumulation and the emulation's own f32 sum)
//   γ     = ‖y - c[idx]‖ in the rotated basis (rotation-invariant), f32 sums
//   signs = sign((S Πᵀ) (y - c[idx])): M = S Πᵀ precomputed on the host as one f16 matrix, the
//         residual rounded to f16: one MMA; equal to sign(S r) except where |(S r)_i| is within
//         2^-9 ‖S_i‖ ‖r‖ of zero
// Work: a CTA of D/16 warps, warp w owning rotated coordinates [16w, 16w + 16) with its rows of Π
// (and M) held as A fragments in registers for the whole kernel; the tokens stream through as
// the B operand (the N dimension), 64 token rows per chunk (8 tiles of 8 destination tokens of
// one (sequence, KV head), aligned to 8 so that value token pairs stay in one tile), fed by a
// 3-stage cp.async ring. Codes, signs and norms are assembled in shared memory and written as
// whole rows.
namespace ferrattn {
namespace tqf {

constexpr int kTile = 8;            // destination tokens per tile (one MMA n8)
constexpr int kTilesPerChunk = 8;   // tiles per chunk
constexpr int kRows = kTile * kTilesPerChunk;  // token rows per chunk
constexpr int kStages = 3;

__device__ __forceinline__ u32 shfl_xor_u32(u32 v, int m) {
  u32 r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(m));
  return r;
}
__device__ __forceinline__ double shfl_xor_f64(double v, int m) {
  u32 lo, hi;
  asm("mov.b64 {%0, %1}, %2;" : "=r"(lo), "=r"(hi) : "d"(v));
  lo = shfl_xor_u32(lo, m);
  hi = shfl_xor_u32(hi, m);
  double r;
  asm("mov.b64 %0, {%1, %2};" : "=d"(r) : "r"(lo), "r"(hi));
  return r;
}
__device__ __forceinline__ void red_or_shared(u32* p, u32 v) {
  asm volatile("red.shared.or.b32 [%0], %1;" ::"r"(smem_addr(p)), "r"(v) : "memory");
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
  float lut_lo, lut_hi, lut_scale, lut_off;  // y clamped to [lo, hi], bin = rint(y scale + off)
};

constexpr int kLut = 256;

template <int D>
struct Layout {
  static constexpr int kWarps = D / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStride = D + 8;  // f16 per smem row: 16-byte rows, ldmatrix conflict-free
  static constexpr int kStageHalves = kRows * kStride;
};

__device__ __forceinline__ void tile_coords(const FastParams& p, int item, int& b, int& h, int& first,
                                            int& lo, int& hi) {
  const int x = item % p.groups;
  h = (item / p.groups) % p.heads_kv;
  b = item / (p.groups * p.heads_kv);
  const int d0 = p.dst0[b], cnt = p.count[b];
  first = (d0 / kTile) * kTile + x * kTile;
  lo = max(first, d0);
  hi = min(first + kTile, d0 + cnt);
}

// Source row (element offset) of chunk row r, or -1 (tile outside the work, token outside the
// append): zero-filled.
__device__ __forceinline__ long long src_row(const FastParams& p, int item, int items, int t) {
  if (item >= items) return -1;
  int b, h, first, lo, hi;
  tile_coords(p, item, b, h, first, lo, hi);
  const int j = first + t;
  if (j < lo || j >= hi) return -1;
  return ((long long)b * p.src_len + (j - p.dst0[b])) * p.heads_kv + h;
}

// Each thread copies pieces (16 bytes) of one row: one row lookup per thread and chunk.
template <int D>
__device__ __forceinline__ void load_chunk(const FastParams& p, int chunk, int items, u16* xs) {
  constexpr int S = Layout<D>::kStride, C = D / 8, TPR = Layout<D>::kThreads / kRows;
  const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
  const long long row = src_row(p, chunk * kTilesPerChunk + r / kTile, items, r % kTile);
  const u16* src = row >= 0 ? p.src + row * D : p.src;
#pragma unroll
  for (int c = part; c < C; c += TPR) cp_async16(xs + r * S + c * 8, src + c * 8, row >= 0);
}

// two f16 of a row (col even: 4-byte aligned)
__device__ __forceinline__ u32 ld_pair(const u16* m, int row, int col, int d) {
  return ld_global_u32(m + row * d + col);
}

// A fragments of rows [16w, 16w + 16) of a row-major f16 D x D matrix, one per k16 step
template <int D>
__device__ __forceinline__ void load_a(const u16* m, int w, int lane, u32 (&a)[D / 16][4]) {
  const int g = lane / 4, q = lane % 4, r0 = 16 * w + g;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c0 = 16 * kk + 2 * q;
    a[kk][0] = ld_pair(m, r0, c0, D);
    a[kk][1] = ld_pair(m, r0 + 8, c0, D);
    a[kk][2] = ld_pair(m, r0, c0 + 8, D);
    a[kk][3] = ld_pair(m, r0 + 8, c0 + 8, D);
  }
}

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Tiles computed together by a warp: independent MMA chains and epilogues in flight.
constexpr int kGroup = 4;

// acc[j] = A (16 rows of the warp) x rows [8 (t0 + j), 8 (t0 + j) + 8) of the smem tile (B)
template <int D, bool SPLIT>
__device__ __forceinline__ void tile_products(const u32 (&ah)[D / 16][4], const u32 (&al)[D / 16][4],
                                              const u16* xs, int t0, int lane,
                                              float (&acc)[kGroup][4]) {
  constexpr int S = Layout<D>::kStride;
#pragma unroll
  for (int j = 0; j < kGroup; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  // 32-bit shared addresses: immediate offsets per (tile, k step), no 64-bit pointer math
  const u32 row = smem_addr(xs + (t0 * kTile + (lane & 7)) * S + 8 * (lane >> 3));
#pragma unroll
  for (int kk = 0; kk < D / 16; kk += 2) {
    u32 bf[kGroup][4];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) ldsm_x4(bf[j], row + 2 * (j * kTile * S + 16 * kk));
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
}

// #{bounds < y} and its centroid by a uniform grid over y: bin k = rint(clamp(y) scale + off)
// holds at most one boundary (the host checks), entry k = {first boundary of bin >= k (or +inf),
// #{boundaries of bins < k}, its centroid, the next centroid}; the grid is monotone in y, so
// count + (boundary < y) is the exact count (ferrattn_cuda::turboquant::CodeLut is the twin).
// `lut` is the shared address of the table minus 16 * 0x4B400000 (mod 2^32): entry k of a bin
// whose f32 bits are 0x4B400000 + k.
__device__ __forceinline__ int code_of(u32 lut, const FastParams& p, float y, float& cent) {
  float yc, u, t;
  asm("max.f32 %0, %1, %2;" : "=f"(yc) : "f"(y), "f"(p.lut_lo));
  asm("min.f32 %0, %0, %1;" : "+f"(yc) : "f"(p.lut_hi));
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(u) : "f"(yc), "f"(p.lut_scale), "f"(p.lut_off));
  asm("add.rn.f32 %0, %1, 0f4B400000;" : "=f"(t) : "f"(u));  // + 1.5 2^23: rint into the low bits
  u32 bits;
  asm("mov.b32 %0, %1;" : "=r"(bits) : "f"(t));
  float4 e;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(e.x), "=f"(e.y), "=f"(e.z), "=f"(e.w)
               : "r"(lut + bits * 16u));
  const bool up = e.x < y;
  cent = up ? e.w : e.z;
  u32 c;
  asm("mov.b32 %0, %1;" : "=r"(c) : "f"(e.y));
  return (int)c + (up ? 1 : 0);
}

template <int D, bool KEYS, bool QJL, bool SPLIT>
__device__ __forceinline__ void compress_fast(const FastParams& p) {
  using L = Layout<D>;
  constexpr int S = L::kStride, NT = L::kThreads;
  extern __shared__ float4 smem4[];
  u16* xs = reinterpret_cast<u16*>(smem4);                       // [kStages][kRows][S]
  u16* rrs = xs + kStages * L::kStageHalves;                     // [kRows][S] residual (QJL)
  float* inv_s = reinterpret_cast<float*>(rrs + (QJL ? L::kStageHalves : 0));  // [kRows]
  float* nrm_s = inv_s + kRows;                                  // [kRows]
  float* gam_s = nrm_s + kRows;                                  // [kWarps][kRows] (QJL)
  float* bnd_s = gam_s + L::kWarps * kRows;                      // [16] (unused: the lookup)
  float* cen_s = bnd_s + 16;                                     // [16] (unused)
  u32* sg_s = reinterpret_cast<u32*>(cen_s + 16);                // [kRows][4] (QJL)
  long long* dst_s = reinterpret_cast<long long*>(sg_s + kRows * 4);  // [kRows] cache row or -1
  unsigned char* cd_s = reinterpret_cast<unsigned char*>(dst_s + kRows);  // kRows * D / 2
  float4* lut_s = reinterpret_cast<float4*>(cd_s + kRows * D / 2);        // [kLut]

  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int items = p.batch * p.heads_kv * p.groups;
  const int chunks = (items + kTilesPerChunk - 1) / kTilesPerChunk;
  (void)cen_s;
  for (int i = threadIdx.x; i < kLut; i += NT) lut_s[i] = p.lut[i];
  const u32 lut_a = smem_addr(lut_s) - 16u * 0x4B400000u;
  u32 ah[D / 16][4], al[SPLIT ? D / 16 : 1][4], am[QJL ? D / 16 : 1][4];
  load_a<D>(p.pi_hi, w, lane, ah);
  if (SPLIT) load_a<D>(p.pi_lo, w, lane, reinterpret_cast<u32(&)[D / 16][4]>(al));
  if (QJL) load_a<D>(p.m, w, lane, reinterpret_cast<u32(&)[D / 16][4]>(am));

  // ring: chunks blockIdx.x + k gridDim.x; stage k % kStages
  int c_load = blockIdx.x;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (c_load < chunks) load_chunk<D>(p, c_load, items, xs + s * L::kStageHalves);
    cp_async_commit();
    c_load += gridDim.x;
  }
  int stage = 0;
  for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
    {
      const int ls = (stage + kStages - 1) % kStages;
      if (c_load < chunks) load_chunk<D>(p, c_load, items, xs + ls * L::kStageHalves);
      cp_async_commit();
      c_load += gridDim.x;
    }
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const u16* x = xs + stage * L::kStageHalves;
    const int item0 = c * kTilesPerChunk;

    // ‖x‖: NT / kRows threads per row, each f64 sums over its slice (4 interleaved partials),
    // combined in a fixed order; the squares of f16 values are exact in f64, so this equals the
    // emulation's sequential sum unless a partial sum rounds
    {
      constexpr int TPR = NT / kRows, PER = D / TPR;
      const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
      double a4[4] = {0.0, 0.0, 0.0, 0.0};
      const u16* xr = x + r * S + part * PER;
#pragma unroll
      for (int k = 0; k < PER; k += 8) {
        float f[8];
        unpack8<F16>(ld_shared16(xr + k), f);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          double v = (double)f[e], sq;
          asm("mul.rn.f64 %0, %1, %1;" : "=d"(sq) : "d"(v));
          asm("add.rn.f64 %0, %0, %1;" : "+d"(a4[e % 4]) : "d"(sq));
        }
      }
      double acc = (a4[0] + a4[1]) + (a4[2] + a4[3]);
#pragma unroll
      for (int o = 1; o < TPR; o *= 2) acc = acc + shfl_xor_f64(acc, o);  // a + b == b + a
      if (part == 0) {
        double rt;
        asm("sqrt.rn.f64 %0, %1;" : "=d"(rt) : "d"(acc));
        float n;
        asm("cvt.rn.f32.f64 %0, %1;" : "=f"(n) : "d"(rt));
        nrm_s[r] = n;
        inv_s[r] = n > 0.f ? tq::fdiv_rn(1.f, n) : 0.f;
        // destination cache row of chunk row r
        long long dst = -1;
        const int item = item0 + r / kTile;
        if (item < items) {
          int b, h, first, lo, hi;
          tile_coords(p, item, b, h, first, lo, hi);
          const int j = first + r % kTile;
          if (j >= lo && j < hi) dst = ((long long)b * p.heads_kv + h) * p.cap + j;
        }
        dst_s[r] = dst;
      }
      if (QJL)
        for (int i = threadIdx.x; i < kRows * 4; i += NT) sg_s[i] = 0u;
    }
    __syncthreads();

    // rotation, codes, residual: kGroup tiles of 8 tokens at a time
#pragma unroll 1
    for (int t0 = 0; t0 < kTilesPerChunk; t0 += kGroup) {
      float acc[kGroup][4];
      tile_products<D, SPLIT>(ah, reinterpret_cast<const u32(&)[D / 16][4]>(al), x, t0, lane, acc);
#pragma unroll
      for (int jt = 0; jt < kGroup; ++jt) {
        const int r0 = (t0 + jt) * kTile + 2 * q;  // chunk rows of acc[.][0] / acc[.][1]
        const float2 iv = *reinterpret_cast<const float2*>(inv_s + r0);
        const float y[4] = {tq::fmul_rn(acc[jt][0], iv.x), tq::fmul_rn(acc[jt][1], iv.y),
                            tq::fmul_rn(acc[jt][2], iv.x), tq::fmul_rn(acc[jt][3], iv.y)};
        int idx[4];
        float cen[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) idx[e] = code_of(lut_a, p, y[e], cen[e]);
        if (KEYS) {
          // byte (2w + η) of lane block g/2: low nibble channel with g even, high with g odd
          const u32 mine = idx[0] | (idx[1] << 4) | (idx[2] << 8) | (idx[3] << 12);
          const u32 other = shfl_xor_u32(mine, 4);
          const u32 lo = (g & 1) ? other : mine, hi = (g & 1) ? mine : other;
          const int s = g & 1;  // token 2q + s
          const u32 b0 = ((lo >> (4 * s)) & 15u) | (((hi >> (4 * s)) & 15u) << 4);
          const u32 b1 = ((lo >> (4 * s + 8)) & 15u) | (((hi >> (4 * s + 8)) & 15u) << 4);
          *reinterpret_cast<u16*>(cd_s + (r0 + s) * (D / 2) + (g / 2) * (D / 8) + 2 * w) =
              (u16)(b0 | (b1 << 8));
        } else {
          // pair row r0 / 2: byte g (D/8) + 2w + η, even token low nibble
          const u32 b0 = idx[0] | (idx[1] << 4), b1 = idx[2] | (idx[3] << 4);
          *reinterpret_cast<u16*>(cd_s + (r0 / 2) * D + g * (D / 8) + 2 * w) = (u16)(b0 | (b1 << 8));
        }
        if (QJL) {
          float rr[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) rr[e] = y[e] - cen[e];
          float s0 = rr[0] * rr[0] + rr[2] * rr[2], s1 = rr[1] * rr[1] + rr[3] * rr[3];
#pragma unroll
          for (int o = 4; o < 32; o *= 2) {
            s0 += shfl_xor(s0, o);
            s1 += shfl_xor(s1, o);
          }
          if (g == 0) *reinterpret_cast<float2*>(gam_s + w * kRows + r0) = make_float2(s0, s1);
          const int o0 = 16 * w + g;
          rrs[r0 * S + o0] = F16::from_f32(rr[0]);
          rrs[(r0 + 1) * S + o0] = F16::from_f32(rr[1]);
          rrs[r0 * S + o0 + 8] = F16::from_f32(rr[2]);
          rrs[(r0 + 1) * S + o0 + 8] = F16::from_f32(rr[3]);
        }
      }
    }
    if (QJL) {
      __syncthreads();
#pragma unroll 1
      for (int t0 = 0; t0 < kTilesPerChunk; t0 += kGroup) {
        float acc[kGroup][4];
        tile_products<D, false>(reinterpret_cast<const u32(&)[D / 16][4]>(am),
                                reinterpret_cast<const u32(&)[D / 16][4]>(am), rrs, t0, lane, acc);
#pragma unroll
        for (int jt = 0; jt < kGroup; ++jt) {
          // channel 16w + g (+8): lane block g/2, bit 2w (+1) + (g % 2) D/8
          const int e = (g & 1) * (D / 8);
          const u32 m0 = ((acc[jt][0] >= 0.f ? 1u : 0u) << (2 * w + e)) |
                         ((acc[jt][2] >= 0.f ? 1u : 0u) << (2 * w + 1 + e));
          const u32 m1 = ((acc[jt][1] >= 0.f ? 1u : 0u) << (2 * w + e)) |
                         ((acc[jt][3] >= 0.f ? 1u : 0u) << (2 * w + 1 + e));
          const u32 o0 = shfl_xor_u32(m0, 4), o1 = shfl_xor_u32(m1, 4);
          const int r0 = (t0 + jt) * kTile + 2 * q;
          // even g: token 2q, odd g: token 2q + 1
          if ((g & 1) == 0) red_or_shared(&sg_s[r0 * 4 + g / 2], m0 | o0);
          else red_or_shared(&sg_s[(r0 + 1) * 4 + g / 2], m1 | o1);
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
            ld_shared16(cd_s + r * (D / 2) + 16 * piece);
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
        const unsigned char* src = cd_s + pr * D + 16 * piece;
        if (ev && od) {
          *reinterpret_cast<Vec16*>(dst) = ld_shared16(src);
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
  FERRATTN_TQF_ONE(turboquant_fast_keys_mse_d##D, D, true, false, false, 2)                       \
  FERRATTN_TQF_ONE(turboquant_fast_values_d##D, D, false, false, false, 2)                        \
  FERRATTN_TQF_ONE(turboquant_split_keys_qjl_d##D, D, true, true, true, 1)                        \
  FERRATTN_TQF_ONE(turboquant_split_keys_mse_d##D, D, true, false, true, 2)                       \
  FERRATTN_TQF_ONE(turboquant_split_values_d##D, D, false, false, true, 2)

FERRATTN_TQF(64)
FERRATTN_TQF(128)
