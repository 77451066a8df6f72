// Context-parallel decode: merging the partial attention states of several ranks.
//
// Each rank's decode over its slice of the keys leaves, per query row, O_r (normalised, 16-bit)
// and LSE_r (f32, natural log; -inf when the slice is empty). (m = LSE_r, l = 1, acc = O_r) is
// that row's softmax state, so the ranks merge with the rescaling of LeanAttention appendix D
// (ferrattn_core::SoftmaxState::merge; CPU twin ferrattn_core::cp::merge_partials):
//
//   m' = max(m, m_r),  l' = l e^(m - m') + e^(m_r - m'),  acc' = acc e^(m - m') + O_r e^(m_r - m')
//   O = acc / l,  LSE = m + ln l;  a state with m = -inf contributes nothing.
//
// cp_merge_*:   all-gather path: every rank's (O_r, LSE_r) block is here; fold them in a given
//               rank order (the same on every rank, so every rank computes the same bits).
// cp_scale_*:   reduce-scatter path, before the sum: with M = max_r LSE_r (all-reduced), write
//               (e^(LSE_r - M) O_r, e^(LSE_r - M)) in f32, head-major so that a reduce-scatter
//               hands each rank whole heads.
// cp_finish_*:  after the sum: O = num / den, LSE = M + ln den.
//
// One warp per query row; rows are tiny next to the K/V the decode read, so plain loads suffice.
#include "common.cuh"

namespace ferrattn {

constexpr int kCpMaxRanks = 64;  // = ferrattn_core::cp::MAX_RANKS
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.69314718055994531f;

struct CpMergeParams {
  const unsigned char* part_o;    // rank r's O [B, Sq, Hq, D] at part_o + r * o_stride (bytes)
  const unsigned char* part_lse;  // rank r's LSE [B, Hq, Sq] f32 at part_lse + r * lse_stride
  u16* o;                         // [B, Sq, nh, D]
  float* lse;                     // [B, nh, Sq]
  u64 o_stride;
  u64 lse_stride;
  int ranks, batch, sq, hq, d, h0, nh, reserved;
  int order[kCpMaxRanks];
};

struct CpScaleParams {
  const unsigned char* part;  // this rank's block (layout as above)
  const float* gmax;          // [B, Hq, Sq]: max over ranks of LSE
  float* scaled;              // [Hq][B][Sq][D + 1]
  u64 lse_offset;
  int batch, sq, hq, d;
};

struct CpFinishParams {
  const float* summed;  // [nh][B][Sq][D + 1], heads h0 .. h0 + nh
  const float* gmax;    // [B, Hq, Sq]
  u16* o;               // [B, Sq, nh, D]
  float* lse;           // [B, nh, Sq]
  int batch, sq, hq, d, h0, nh;
};

__device__ __forceinline__ float exp_e(float x) { return exp2_approx(x * kLog2e); }

template <class T>
__device__ void merge_body(const CpMergeParams& p) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int rows = p.batch * p.sq * p.nh;
  if (warp >= rows) return;
  // row = ((b * sq) + s) * nh + hl
  const int hl = warp % p.nh;
  const int s = (warp / p.nh) % p.sq;
  const int b = warp / (p.nh * p.sq);
  const int h = p.h0 + hl;
  const u64 orow = ((u64)(b * p.sq + s) * p.hq + h) * p.d;
  const u64 lrow = ((u64)b * p.hq + h) * p.sq + s;
  float m = neg_inf(), l = 0.f;
  float acc[8];  // d <= 256: at most 8 columns per lane
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  for (int k = 0; k < p.ranks; ++k) {
    const u64 r = (u64)p.order[k];
    const float mr = reinterpret_cast<const float*>(p.part_lse + r * p.lse_stride)[lrow];
    if (mr == neg_inf()) continue;  // an empty slice merges to nothing
    const u16* orr = reinterpret_cast<const u16*>(p.part_o + r * p.o_stride) + orow;
    const float mm = fmax2(m, mr);
    const float a = m == neg_inf() ? 0.f : exp_e(m - mm);
    const float c = exp_e(mr - mm);
    l = l * a + c;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int col = lane + 32 * i;
      if (col < p.d) acc[i] = acc[i] * a + T::to_f32(orr[col]) * c;
    }
    m = mm;
  }
  const bool empty = l == 0.f || m == neg_inf();
  const float inv = empty ? 0.f : 1.f / l;
  u16* out = p.o + ((u64)(b * p.sq + s) * p.nh + hl) * p.d;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int col = lane + 32 * i;
    if (col < p.d) out[col] = T::from_f32(acc[i] * inv);
  }
  if (lane == 0) p.lse[((u64)b * p.nh + hl) * p.sq + s] = empty ? neg_inf() : m + log2_approx(l) * kLn2;
}

template <class T>
__device__ void scale_body(const CpScaleParams& p) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int rows = p.batch * p.sq * p.hq;
  if (warp >= rows) return;
  // head-major row = ((h * batch) + b) * sq + s
  const int s = warp % p.sq;
  const int b = (warp / p.sq) % p.batch;
  const int h = warp / (p.sq * p.batch);
  const u64 lrow = ((u64)b * p.hq + h) * p.sq + s;
  const float lr = reinterpret_cast<const float*>(p.part + p.lse_offset)[lrow];
  const float gm = p.gmax[lrow];
  const float w = (lr == neg_inf() || gm == neg_inf()) ? 0.f : exp_e(lr - gm);
  const u16* orr = reinterpret_cast<const u16*>(p.part) + ((u64)(b * p.sq + s) * p.hq + h) * p.d;
  float* dst = p.scaled + (u64)warp * (p.d + 1);
  for (int col = lane; col < p.d; col += 32) dst[col] = w == 0.f ? 0.f : T::to_f32(orr[col]) * w;
  if (lane == 0) dst[p.d] = w;
}

template <class T>
__device__ void finish_body(const CpFinishParams& p) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int rows = p.batch * p.sq * p.nh;
  if (warp >= rows) return;
  // head-major local row = ((hl * batch) + b) * sq + s
  const int s = warp % p.sq;
  const int b = (warp / p.sq) % p.batch;
  const int hl = warp / (p.sq * p.batch);
  const float* src = p.summed + (u64)warp * (p.d + 1);
  const float den = src[p.d];
  const float gm = p.gmax[((u64)b * p.hq + p.h0 + hl) * p.sq + s];
  const bool empty = den == 0.f || gm == neg_inf();
  const float inv = empty ? 0.f : 1.f / den;
  u16* out = p.o + ((u64)(b * p.sq + s) * p.nh + hl) * p.d;
  for (int col = lane; col < p.d; col += 32) out[col] = T::from_f32(src[col] * inv);
  if (lane == 0) p.lse[((u64)b * p.nh + hl) * p.sq + s] = empty ? neg_inf() : gm + log2_approx(den) * kLn2;
}

}  // namespace ferrattn

extern "C" __global__ void cp_merge_f16(const ferrattn::CpMergeParams p) { ferrattn::merge_body<ferrattn::F16>(p); }
extern "C" __global__ void cp_merge_bf16(const ferrattn::CpMergeParams p) { ferrattn::merge_body<ferrattn::BF16>(p); }
extern "C" __global__ void cp_scale_f16(const ferrattn::CpScaleParams p) { ferrattn::scale_body<ferrattn::F16>(p); }
extern "C" __global__ void cp_scale_bf16(const ferrattn::CpScaleParams p) { ferrattn::scale_body<ferrattn::BF16>(p); }
extern "C" __global__ void cp_finish_f16(const ferrattn::CpFinishParams p) { ferrattn::finish_body<ferrattn::F16>(p); }
extern "C" __global__ void cp_finish_bf16(const ferrattn::CpFinishParams p) { ferrattn::finish_body<ferrattn::BF16>(p); }
