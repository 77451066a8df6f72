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
// order of every dot product, which an MMA does not. The cost is about 3 d^2 mul+add per key row
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
