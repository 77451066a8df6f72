// Device helpers shared by the TurboAttention kernels (turbo_prefill.cu, turbo_decode.cu).
//
// Include after common.cuh (this header does not include it: build.rs inlines each header once
// for NVRTC, which has no include path). Everything here is the numeric contract of
// ferrattn_core::turbo written in PTX-level operations, so that a kernel doing the same steps
// reproduces the CPU emulation bit for bit:
// - every f32 product, sum, quotient is its own correctly rounded instruction (mul.rn, add.rn,
//   sub.rn, div.rn; never contracted), FMAs only where the contract writes one (fma.rn);
// - round half to even is cvt.rni (the emulation's `round_ties_even`);
// - SAS (TurboAttention section 4, Eq. 13-15) = LUT[n] x POLY(f) with the LUT bits of
//   ferrattn_core::turbo::sas::LUT_BITS and POLY in Horner form with three fma.rn.
#pragma once

namespace ferrattn {
namespace turbo {

typedef signed char i8;
typedef unsigned char u8;

// ---- Configuration (the closed list the Rust side maps to) ------------------------------------
constexpr int kBlock = 64;        // B_r = B_c = n_b: query rows and keys per tile, tokens per block
constexpr int kThreads = 128;     // 4 warps per CTA in every TurboAttention kernel
constexpr int kDecodeRows = 16;   // query heads of one KV head one decode CTA handles (MMA M)
constexpr float kInt8Divisor = 119.0f;  // s = max|x| / 119 (Alg. 1)

// ---- The compressed KV cache on the device (ferrattn_cuda::turbo::DeviceTurboCache) -----------
// One tensor (K or V). Sequence b, KV head h, block j of 64 tokens:
//   codes  + b * seq_code_bytes + head_off[h] + j * (64 * D * bits[h] / 8): packed INT4/INT2 codes
//   par    + ((b * Hk + h) * cap_blocks + j) * 2 * D: D u8 channel scales, then D i8 zero points
//   bscale [(b * Hk + h) * cap_blocks + j]: the block's f32 INT8 scale
//   buf    + ((b * Hk + h) * 64 + t) * D: INT8 codes of buffer token t (the tokens after the last block)
//   buf_scale [b * Hk + h]: the buffer's universal scale, 0 until non-zero data fixed it
//   clamp [(b * Hk + h) * cap_blocks + j]: 1 when some code of block j dequantizes past 127
//     (ChannelParams::decode clamps it), else 0; written with the block (compress_block) so
//     that the decode knows per tile, exactly, whether the folded path (turbo_decode.cu) holds
struct CacheView {
  u8* codes;
  u8* par;
  float* bscale;
  signed char* buf;
  float* buf_scale;
  u32* clamp;
};
// Mirrors ferrattn_cuda::turbo::CacheParams (#[repr(C)]).
struct CacheParams {
  CacheView k, v;
  const int* head_bits;       // [Hk] 4 or 2
  const u64* head_off;        // [Hk] byte offset of head h's codes within one sequence
  u64 seq_code_bytes;         // bytes of codes per sequence (all heads)
  int cap_blocks;             // blocks each (sequence, head) can hold
  int heads_kv;
};

// ---- Explicitly rounded f32 arithmetic ---------------------------------------------------------
__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float sub_rn(float a, float b) {
  float r;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}
// IEEE division, correctly rounded, subnormals kept (Rust's `/` on f32).
__device__ __forceinline__ float div_rn(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// Round half to even to an integer (saturating; NaN gives 0).
__device__ __forceinline__ int rne_int(float x) {
  int r;
  asm("cvt.rni.s32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
// Exact for |x| < 2^24, which every integer dot here is (|dot| <= 127^2 x 128).
__device__ __forceinline__ float i2f(int x) {
  float r;
  asm("cvt.rn.f32.s32 %0, %1;" : "=f"(r) : "r"(x));
  return r;
}
__device__ __forceinline__ float floor_f(float x) {
  float r;
  asm("cvt.rmi.f32.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ int clampi(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }

// INT8 scale of a block: max|x| / 119 (one IEEE division).
__device__ __forceinline__ float int8_scale(float amax) { return div_rn(amax, kInt8Divisor); }
// INT8 code: clamp(rne(x / s), -127, 127); 0 when s == 0 (ferrattn_core::turbo::quant::quantize_int8).
__device__ __forceinline__ int quantize_int8(float x, float s) {
  return s == 0.0f ? 0 : clampi(rne_int(div_rn(x, s)), -127, 127);
}

// quantize_int8 without a division (the pre-passes, issue 11 round 21), for a block whose scale
// s = int8_scale(amax) is normal and |x| <= amax finite, given r = div_rn(1, s): q0 = RN(x r),
// the residual x - s q0 (exact in one FFMA), q = RN(q0 + (x - s q0) r) is RN(x / s) (Markstein's
// correction with a correctly rounded reciprocal), and RN(q + 1.5 2^23) holds rne(q) in its low
// bits, so the result's low byte is the code (|q| <= 119 < 2^22; no clamp is reached). Every
// operation is one IEEE f32 FMUL / FFMA / FADD: the host test `int8_code_bits_is_quantize_int8`
// (ferrattn-cuda, turbo.rs) runs the same steps for every amax and x of bf16 and f16 against
// ferrattn_core's quantize_int8. main's per element code: MUFU.RCP, FCHK and a branch, 5 FFMA,
// F2I and a clamp.
constexpr float kFloatMax = 3.40282347e38f;
constexpr float kFloatMinNormal = 1.17549435e-38f;  // 2^-126
constexpr float kBias = 12582912.0f;   // 1.5 x 2^23: for 0 <= x < 2^22, x + kBias keeps rne(x) in its low bits
constexpr int kBiasBits = 0x4b400000;  // bits of kBias
__device__ __forceinline__ u32 int8_code_bits(float x, float s, float r) {
  const float q0 = __fmul_rn(x, r);
  const float q = __fmaf_rn(__fmaf_rn(-s, q0, x), r, q0);
  return __float_as_uint(__fadd_rn(q, kBias));
}
// byte 0 of a, b, c, d -> one word, a's in the low byte (the codes int8_code_bits and the
// kBias-rounded softmax leave in their low bytes)
__device__ __forceinline__ u32 pack_low_bytes(u32 a, u32 b, u32 c, u32 d) {
  u32 lo, hi, r;
  asm("prmt.b32 %0, %1, %2, 0x0040;" : "=r"(lo) : "r"(a), "r"(b));
  asm("prmt.b32 %0, %1, %2, 0x0040;" : "=r"(hi) : "r"(c), "r"(d));
  asm("prmt.b32 %0, %1, %2, 0x5410;" : "=r"(r) : "r"(lo), "r"(hi));
  return r;
}

// ---- SAS (TurboAttention section 4) -----------------------------------------------------------
// LUT[n] = e^-n rounded to f32, n = 0..16 (ferrattn_core::turbo::sas::LUT_BITS); kept in shared
// memory by each kernel (17 distinct banks: lanes with different n never conflict).
__device__ __forceinline__ u32 sas_lut_bits(int n) {
  switch (n) {
    case 0: return 0x3f800000u;
    case 1: return 0x3ebc5ab2u;
    case 2: return 0x3e0a9555u;
    case 3: return 0x3d4bed86u;
    case 4: return 0x3c960aaeu;
    case 5: return 0x3bdcc9ffu;
    case 6: return 0x3b227290u;
    case 7: return 0x3a6f0b5du;
    case 8: return 0x39afe108u;
    case 9: return 0x39016791u;
    case 10: return 0x383e6bceu;
    case 11: return 0x378c1aa1u;
    case 12: return 0x36ce2a62u;
    case 13: return 0x3617b02au;
    case 14: return 0x355f3638u;
    case 15: return 0x34a43ae5u;
    default: return 0x33f1aadeu;
  }
}
// Fills the shared LUT (call with all threads, then barrier).
__device__ __forceinline__ void sas_lut_init(float* lut) {
  if (threadIdx.x < 17) lut[threadIdx.x] = bits_to_f32(sas_lut_bits(threadIdx.x));
}

// The exponential of the configuration: SAS with threshold n_r (sas != 0) or expf.
struct Exp {
  const float* lut;  // shared LUT
  float n_r;         // threshold as f32 (an integer in -16..-1)
  int sas;
  // e^x for x <= 0; x < n_r (and NaN, -inf) gives 0 under SAS (Eq. 14).
  __device__ __forceinline__ float operator()(float x) const { return sas ? sas_exp(x) : expf(x); }
  // SAS (Eq. 13-15) without branches: every operation runs and the threshold test is a final
  // select, so that the exponentials of a thread overlap instead of running one divergent
  // region after another.
  __device__ __forceinline__ float sas_exp(float x) const {
    float t = -x;
    t = t > 0.0f ? t : 0.0f;
    const float n = floor_f(t);
    const float f = sub_rn(t, n);
    // POLY(f) = -0.1025 f^3 + 0.4626 f^2 - 0.9922 f + 0.9996 (Eq. 15), the f32 constants of
    // ferrattn_core::turbo::sas::{C3, C2, C1, C0}
    float p = fma_rn(bits_to_f32(0xbdd1eb85u), f, bits_to_f32(0x3eecd9e8u));
    p = fma_rn(p, f, bits_to_f32(0xbf7e00d2u));
    p = fma_rn(p, f, bits_to_f32(0x3f7fe5c9u));
    const int idx = (int)(n < 16.0f ? n : 16.0f);  // n > 16 only where the select below gives 0
    const float v = mul_rn(lut[idx], p);
    return x >= n_r ? v : 0.0f;  // x < n_r, NaN and -inf give 0 (Eq. 14)
  }
  // sas_exp for x <= 0 (or -inf, NaN): the clamp of -x at 0 is dropped; with x <= 0, -x >= 0
  // already, and where x is -0 the +-0 argument gives the same floor, fraction, index and value.
  __device__ __forceinline__ float sas_exp_nonpos(float x) const {
    const float t = -x;
    const float n = floor_f(t);
    const float f = sub_rn(t, n);
    float p = fma_rn(bits_to_f32(0xbdd1eb85u), f, bits_to_f32(0x3eecd9e8u));
    p = fma_rn(p, f, bits_to_f32(0xbf7e00d2u));
    p = fma_rn(p, f, bits_to_f32(0x3f7fe5c9u));
    const int idx = (int)(n < 16.0f ? n : 16.0f);
    const float v = mul_rn(lut[idx], p);
    return x >= n_r ? v : 0.0f;
  }
  // The online-softmax rescale of an old state: 1 when the maximum did not move (module docs,
  // "departs from the listings"), else EXP(m_old - m_new).
  __device__ __forceinline__ float rescale(float m_old, float m_new) const {
    return m_old == m_new ? 1.0f : (*this)(sub_rn(m_old, m_new));
  }
};

// ---- INT8 tensor cores -------------------------------------------------------------------------
// mma.m16n8k32 s8 x s8 -> s32 (PTX ISA "Matrix fragments for mma.m16n8k32", integer types),
// g = lane / 4, t = lane % 4, each register four s8 with the lower k in the lower byte:
//   A 16x32 row: a0 (g, 4t..4t+3), a1 (g+8, 4t..), a2 (g, 16+4t..), a3 (g+8, 16+4t..)
//   B 32x8 col:  b0 (k = 4t..4t+3, n = g), b1 (k = 16+4t.., n = g)
//   C 16x8:      c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
// ldmatrix (b16, non-transposed) of an 8x16-byte matrix hands lane (g, t) the bytes 4t..4t+3
// of row g: exactly an A or B register of this shape, so int8 tiles load with ldmatrix_x4.
__device__ __forceinline__ void mma_s8(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a shared tile of C chunks per row, with
// the chunks permuted so that the 8 rows one ldmatrix phase reads fall in 8 different 16-byte
// bank groups: XOR with row % 8 for rows of >= 8 chunks, with (row / 2) % 4 for 4-chunk rows.
template <int C>
__device__ __forceinline__ int swz(int row, int chunk) {
  static_assert(C == 4 || C % 8 == 0, "4 or a multiple of 8 chunks per row");
  const int x = C == 4 ? ((row >> 1) & 3) : (row & 7);
  return row * C * 16 + ((chunk ^ x) << 4);
}

// P V with the keys of each 16-key group stored in the order the S accumulator hands them out:
// slot 4t + i of a group holds key 2t + (i & 1) + 8 (i >> 1). The INT8 codes of P then pack
// straight from the QK^T accumulator registers into A registers (no shuffle), provided V^T
// rows are stored in slot order (integer sums do not care about the order of keys).
__host__ __device__ __forceinline__ int slot_key(int slot) {
  const int s = slot & 15;
  return (slot & ~15) + 2 * (s >> 2) + (s & 1) + 8 * ((s >> 1) & 1);
}

__device__ __forceinline__ u32 pack4_u8(int a, int b, int c, int d) {
  return (u32)(a & 0xff) | ((u32)(b & 0xff) << 8) | ((u32)(c & 0xff) << 16) | ((u32)(d & 0xff) << 24);
}

// ---- Warp and block reductions -----------------------------------------------------------------
__device__ __forceinline__ int shfl_xor_i(int v, int mask) {
  int r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(mask));
  return r;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int m = 16; m > 0; m >>= 1) v = fmax2(v, shfl_xor(v, m));
  return v;
}
// Max over the CTA; `red` holds kThreads / 32 floats; every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* red) {
  v = warp_max(v);
  __syncthreads();  // red may still be read by a previous call
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kThreads / 32; ++w) r = fmax2(r, red[w]);
  return r;
}

// Unsigned max over the CTA, as block_max.
__device__ __forceinline__ u32 block_max_u32(u32 v, float* red) {
  for (int m = 16; m > 0; m >>= 1) v = max(v, (u32)shfl_xor_i((int)v, m));
  __syncthreads();  // red may still be read by a previous call
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = __uint_as_float(v);
  __syncthreads();
  u32 r = __float_as_uint(red[0]);
  for (int w = 1; w < kThreads / 32; ++w) r = max(r, __float_as_uint(red[w]));
  return r;
}

// ---- BPQ stage 2 (section 3.1, Eq. 10): INT8 block -> INT4/INT2 channelwise -------------------
// ferrattn_core::turbo::quant::{ChannelParams, PackedBlock}: per channel c with lo, hi its min and
// max code over the 64 tokens, scale = max(1, ceil((hi - lo) / (2^b - 1))), zero = lo,
// code = floor((2 (x - lo) + scale) / (2 scale)) clamped to [0, 2^b - 1]; packed token-major,
// 8 / b codes per byte, first code in the low bits.
//
// `x`: shared [64][D] INT8 codes (row-major, unswizzled); `par`: shared 2 * D bytes (scales, then
// zero points) this call fills; `codes_out`: global, 64 * D * bits / 8 bytes; `par_out`: global
// 2 * D bytes; `clamp_out`: the block's clamp flag (CacheView::clamp). All threads of the CTA
// call it.
template <int D>
__device__ __forceinline__ void compress_block(const i8* x, u8* par, int bits, u8* codes_out, u8* par_out,
                                               u32* clamp_out) {
  const int levels = (1 << bits) - 1;
  int clamps = 0;
  for (int c = threadIdx.x; c < D; c += kThreads) {
    int lo = 127, hi = -127;
    for (int t = 0; t < kBlock; ++t) {
      const int v = x[t * D + c];
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
    int s = (hi - lo + levels - 1) / levels;
    s = s < 1 ? 1 : s;
    par[c] = (u8)s;
    par[D + c] = (u8)(i8)lo;
    // codes are monotone in x: the channel's largest code is hi's, decoded past 127 or not
    const int top = clampi((2 * (hi - lo) + s) / (2 * s), 0, levels);
    clamps |= top * s + lo > 127;
  }
  clamps = __syncthreads_or(clamps);
  if (threadIdx.x == 0) *clamp_out = clamps ? 1u : 0u;
  for (int i = threadIdx.x; i < 2 * D / 16; i += kThreads)
    reinterpret_cast<Vec16*>(par_out)[i] = reinterpret_cast<const Vec16*>(par)[i];
  // one 32-bit word of packed codes per step: 32 / bits consecutive codes of one token row
  const int per_word = 32 / bits;
  const int words = kBlock * D / per_word;
  for (int w = threadIdx.x; w < words; w += kThreads) {
    const int first = w * per_word;  // flat token-major index of the word's first code
    const int t = first / D, c0 = first % D;
    u32 word = 0;
    for (int i = 0; i < per_word; ++i) {
      const int c = c0 + i;
      const int s = par[c], z = (i8)par[D + c];
      const int num = 2 * (x[t * D + c] - z) + s;  // >= s > 0 for every code of the block
      const int code = clampi(num / (2 * s), 0, levels);
      word |= (u32)code << (i * bits);
    }
    reinterpret_cast<u32*>(codes_out)[w] = word;
  }
}

}  // namespace turbo
}  // namespace ferrattn
