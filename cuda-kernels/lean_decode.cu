// LeanAttention stream-K decode (Sanovar et al., appendix E, Algorithm 2) and the fixed-split
// FlashDecoding baseline, from one kernel body.
//
// The host side (ferrattn_core::lean) flattens every output tile's KV iterations into one
// iteration space and uploads two small tables: `seq_start` (where each sequence's tiles begin)
// and `cta_bounds` (CTA g owns iterations [cta_bounds[g], cta_bounds[g+1])). A CTA walks its range
// as a stream of K/V stages in a cp.async shared-memory pipeline that runs across tile
// boundaries. Output tile = (sequence, KV head, query-tile group): up to 16 query rows (the query
// heads of one KV head times the query tokens) share each K/V load (GQA).
//
// Inside a CTA: 4 warps; a key is handled by D/8 lanes (16 bytes each), so a warp covers
// 32*8/D keys at once and the CTA has `key_groups<D>()` independent online-softmax states
// (LeanTile, Alg. 1, in base-2 logits), merged at the end of each segment by warp shuffles and
// then, in a fixed order, through shared memory: results are bitwise reproducible.
//
// Stream-K roles (Alg. 2 lines 17-39): the CTA whose segment starts a tile is its host. A
// non-host CTA stores (O, m, l) into its partial slot and releases flags[g] = epoch; a host that
// does not finish the tile acquires the flags of CTAs g+1..last and merges their partials in that
// order, then writes O / l and LSE = (m + log2 l) ln 2. The host only waits on CTAs after it whose
// first segment is this tile's continuation, which they compute first: with a grid no larger than
// what is co-resident (checked by the launcher with the occupancy API) there is no deadlock.
// Fixed split (merge_in_kernel = 0): every segment that is not a whole tile writes a partial and
// lean_combine_* merges them in a second launch, as FlashDecoding does.
#include "common.cuh"

namespace ferrattn {

// Mirrors ferrattn_cuda::launch::LeanParams (#[repr(C)]); all tensors contiguous, 16-bit.
struct LeanParams {
  const u16* q;           // [batch, max_sq, heads_q, D]
  const u16* k;           // [batch, max_sk, heads_kv, D]
  const u16* v;           // [batch, max_sk, heads_kv, D]
  u16* o;                 // [batch, max_sq, heads_q, D]
  float* lse;             // [batch, heads_q, max_sq], natural log
  const int* seqlens_q;   // [batch]
  const int* seqlens_k;   // [batch]
  const u32* seq_start;   // [batch + 1] first flat iteration of each sequence's tiles
  const u32* cta_bounds;  // [num_ctas + 1]
  float* part_o;          // [num_ctas, R, D] unnormalised partial O (base-2 max m)
  float* part_ml;         // [num_ctas, R, 2] partial (m in log2 units, l)
  u32* flags;             // [num_ctas] = epoch once the CTA's partial is visible
  u32 epoch;              // this launch's flag value (never 0)
  int num_ctas;
  int batch, max_sq, max_sk, heads_q, heads_kv, group;
  int tile_m;             // query rows per tile (<= R)
  int query_groups;       // tiles per (sequence, KV head)
  int tile_k;             // keys per LeanTile iteration (multiple of stage_keys<D>)
  int causal;             // bottom-right causal mask
  int merge_in_kernel;    // 1: stream-K host merge via flags; 0: partials for lean_combine
  float scale_log2;       // softmax_scale * log2(e)
};

struct TileInfo {
  int tile, b, hk, qg;
  u32 start, end;  // flat iteration range of the tile
  int len_k, len_q;
};

__device__ __forceinline__ TileInfo tile_of_iter(const LeanParams& p, u32 it) {
  int lo = 0, hi = p.batch;  // last b with seq_start[b] <= it
  while (hi - lo > 1) {
    int mid = (lo + hi) >> 1;
    if (p.seq_start[mid] <= it) lo = mid; else hi = mid;
  }
  TileInfo t;
  t.b = lo;
  t.len_k = p.seqlens_k[lo];
  t.len_q = p.seqlens_q[lo];
  u32 n = (u32)((t.len_k + p.tile_k - 1) / p.tile_k);
  n = n < 1u ? 1u : n;
  u32 r = (it - p.seq_start[lo]) / n;
  t.start = p.seq_start[lo] + r * n;
  t.end = t.start + n;
  t.hk = (int)r / p.query_groups;
  t.qg = (int)r % p.query_groups;
  t.tile = lo * p.heads_kv * p.query_groups + (int)r;
  return t;
}

__device__ __forceinline__ TileInfo tile_by_index(const LeanParams& p, int tile) {
  int tps = p.heads_kv * p.query_groups;
  int b = tile / tps, r = tile % tps;
  u32 n = (u32)((p.seqlens_k[b] + p.tile_k - 1) / p.tile_k);
  n = n < 1u ? 1u : n;
  return tile_of_iter(p, p.seq_start[b] + (u32)r * n);
}

// Last CTA whose range holds iteration `it`.
__device__ __forceinline__ int cta_of_iter(const LeanParams& p, u32 it) {
  int lo = 0, hi = p.num_ctas;
  while (hi - lo > 1) {
    int mid = (lo + hi) >> 1;
    if (p.cta_bounds[mid] <= it) lo = mid; else hi = mid;
  }
  return lo;
}

template <int D, int R>
struct Smem {
  static constexpr int kSk = cfg::stage_keys<D>();
  static constexpr bool kQInSmem = R >= 16;  // 16 rows of q would not fit in registers beside O
  static constexpr int kMergeBytes = (cfg::kMergeBatch + 1) * R * 4;
  static constexpr int bytes_for(int stages) {
    return stages * 2 * kSk * D * 2 + R * D * 4 + (cfg::kWarps + 1) * R * 2 * 4 + (kQInSmem ? R * D * 4 : 0) + kMergeBytes;
  }
  static constexpr int kStages = bytes_for(3) <= cfg::kSmemBudget ? 3 : 2;
  static constexpr int kBytes = bytes_for(kStages);
  static constexpr int kKvBytes = kStages * 2 * kSk * D * 2;
};

// Merges the partials in slots first..=last into (obuf, fin) in place (Alg. 2 lines 29-35), in
// batches of cfg::kMergeBatch whose loads are all in flight at once: one pass computes each
// row's new max and the scale of every partial, the next rescales and sums the O elements. The
// order of the sum is fixed, so results are reproducible. `sc` holds (kMergeBatch + 1) * R floats.
template <int D, int R>
__device__ __forceinline__ void merge_partials(const LeanParams& p, int first, int last, float* obuf, float* fin, float* sc) {
  for (int c0 = first; c0 <= last; c0 += cfg::kMergeBatch) {
    const int n = (last - c0 + 1) < cfg::kMergeBatch ? (last - c0 + 1) : cfg::kMergeBatch;
    if (threadIdx.x < R) {  // row pass; only thread r touches fin[2r..2r+1] while merging
      const int r = threadIdx.x;
      const float m0 = fin[2 * r], l0 = fin[2 * r + 1];
      float mm = m0;
#pragma unroll 8
      for (int i = 0; i < n; ++i) mm = fmax2(mm, ld_cg(p.part_ml + ((u64)(c0 + i) * R + r) * 2));
      const float a0 = m0 == neg_inf() ? 0.f : exp2_approx(m0 - mm);
      float ll = l0 * a0;
#pragma unroll 8
      for (int i = 0; i < n; ++i) {
        const float mi = ld_cg(p.part_ml + ((u64)(c0 + i) * R + r) * 2);
        const float li = ld_cg(p.part_ml + ((u64)(c0 + i) * R + r) * 2 + 1);
        const float si = mi == neg_inf() ? 0.f : exp2_approx(mi - mm);
        sc[(i + 1) * R + r] = si;
        ll += li * si;
      }
      sc[r] = a0;
      fin[2 * r] = mm;
      fin[2 * r + 1] = ll;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < R * D; idx += cfg::kThreads) {
      const int r = idx / D;
      float acc = obuf[idx] * sc[r];
#pragma unroll 8
      for (int i = 0; i < n; ++i) acc += ld_cg(p.part_o + (u64)(c0 + i) * R * D + idx) * sc[(i + 1) * R + r];
      obuf[idx] = acc;
    }
    __syncthreads();
  }
}

// Writes O = obuf / l and LSE for every row of the tile, padding rows included (zeros, -inf).
template <class T, int D, int R>
__device__ __forceinline__ void write_output(const LeanParams& p, const TileInfo& t, const float* obuf, const float* fin) {
  const int rows_total = p.group * p.max_sq;
  for (int idx = threadIdx.x; idx < R * D; idx += cfg::kThreads) {
    int r = idx / D, c = idx % D;
    int row = t.qg * p.tile_m + r;
    if (r >= p.tile_m || row >= rows_total) continue;
    int i = row / p.group, h = t.hk * p.group + row % p.group;
    float l = fin[2 * r + 1];
    float val = l > 0.f ? obuf[idx] / l : 0.f;
    p.o[(((u64)t.b * p.max_sq + i) * p.heads_q + h) * D + c] = T::from_f32(val);
  }
  if (threadIdx.x < R) {
    int r = threadIdx.x;
    int row = t.qg * p.tile_m + r;
    if (r < p.tile_m && row < rows_total) {
      int i = row / p.group, h = t.hk * p.group + row % p.group;
      float m = fin[2 * r], l = fin[2 * r + 1];
      float lse = (l > 0.f && m != neg_inf()) ? (m + log2_approx(l)) * 0.69314718055994531f : neg_inf();
      p.lse[((u64)t.b * p.heads_q + h) * p.max_sq + i] = lse;
    }
  }
}

template <class T, int D, int R>
__device__ __forceinline__ void lean_decode_body(const LeanParams& p) {
  using S = Smem<D, R>;
  constexpr int L = cfg::lanes_per_key<D>();
  constexpr int G = cfg::groups_per_warp<D>();
  constexpr int SK = cfg::stage_keys<D>();
  constexpr int ST = S::kStages;
  constexpr int KPG = cfg::kKeysPerGroupStage;
  constexpr int SC = R >= 16 ? 1 : (R >= 8 ? 4 : 8);  // keys per online-softmax update (bounded by registers)
  static_assert(KPG % SC == 0, "chunk must divide the keys of a group");

  extern __shared__ Vec16 smem_v16[];  // 16-byte aligned dynamic shared memory
  unsigned char* smem_raw = reinterpret_cast<unsigned char*>(smem_v16);
  u16* kv_s = reinterpret_cast<u16*>(smem_raw);                       // [ST][2][SK][D]
  float* obuf = reinterpret_cast<float*>(smem_raw + S::kKvBytes);     // [R][D]
  float* wml = obuf + R * D;                                          // [kWarps][R][2]
  float* fin = wml + cfg::kWarps * R * 2;                             // [R][2]
  float* sc = fin + R * 2;                                            // [kMergeBatch + 1][R]
  float* q_s = sc + (cfg::kMergeBatch + 1) * R;                       // [R][D] when kQInSmem

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int grp = warp * G + lane / L;  // key group
  const int gl = lane % L;              // columns gl*8 .. gl*8+7
  const int cta = blockIdx.x;
  const u32 cs = p.cta_bounds[cta], ce = p.cta_bounds[cta + 1];
  const int sub = p.tile_k / SK;
  const u32 units = (ce - cs) * (u32)sub;
  const u64 kv_row = (u64)p.heads_kv * D;

  // ---- producer: stage loads of the whole CTA range, across tiles ----
  TileInfo pt = tile_of_iter(p, cs);
  auto load_unit = [&](u32 u) {
    u32 it = cs + u / (u32)sub;
    if (it >= pt.end) pt = tile_of_iter(p, it);
    int key0 = (int)(it - pt.start) * p.tile_k + (int)(u % (u32)sub) * SK;
    u16* ks = kv_s + (u64)(u % ST) * 2 * SK * D;
    u16* vs = ks + SK * D;
    const u64 base = ((u64)pt.b * p.max_sk * p.heads_kv + pt.hk) * D;
#pragma unroll 4
    for (int c = tid; c < SK * D / 8; c += cfg::kThreads) {
      int key = c / (D / 8), col = (c % (D / 8)) * 8;
      int j = key0 + key;
      bool ok = j < pt.len_k;
      u64 off = base + (u64)(ok ? j : 0) * kv_row + col;
      cp_async16(ks + key * D + col, p.k + off, ok);
      cp_async16(vs + key * D + col, p.v + off, ok);
    }
  };
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if ((u32)s < units) load_unit((u32)s);
    cp_async_commit();
  }

  // ---- consumer state ----
  TileInfo ct;
  ct.end = 0;
  u32 seg_begin = 0;
  float q[Smem<D, R>::kQInSmem ? 1 : R][8];
  float o[R][8], m[R], l[R];
  int vis[R];

  for (u32 u = 0; u < units; ++u) {
    cp_async_wait<ST - 2>();
    __syncthreads();
    if (u + ST - 1 < units) load_unit(u + ST - 1);
    cp_async_commit();

    const u32 it = cs + u / (u32)sub;
    if (u == 0 || it >= ct.end) {  // a new segment (Alg. 2 lines 11-16)
      ct = tile_of_iter(p, it);
      seg_begin = it;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        int row = ct.qg * p.tile_m + r;
        int i = row / p.group, h = ct.hk * p.group + row % p.group;
        bool valid = r < p.tile_m && row < p.group * p.max_sq && i < ct.len_q;
        int v_end = ct.len_k;
        if (p.causal) {
          v_end = i + ct.len_k - ct.len_q + 1;
          v_end = v_end < 0 ? 0 : (v_end > ct.len_k ? ct.len_k : v_end);
        }
        vis[r] = valid ? v_end : 0;
        m[r] = neg_inf();
        l[r] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[r][e] = 0.f;
        if constexpr (!S::kQInSmem) {
          const u16* qrow = p.q + (((u64)ct.b * p.max_sq + (valid ? i : 0)) * p.heads_q + (valid ? h : 0)) * D;
          float f[8];
          unpack8<T>(ld_global_nc16(qrow + gl * 8), f);
#pragma unroll
          for (int e = 0; e < 8; ++e) q[r][e] = valid ? f[e] : 0.f;
        }
      }
      if constexpr (S::kQInSmem) {  // one 16-byte vector per thread and pass
        for (int c = tid; c < R * D / 8; c += cfg::kThreads) {
          const int r = c / (D / 8), col = (c % (D / 8)) * 8;
          const int row = ct.qg * p.tile_m + r;
          const int i = row / p.group, h = ct.hk * p.group + row % p.group;
          const bool valid = r < p.tile_m && row < p.group * p.max_sq && i < ct.len_q;
          float f[8];
          unpack8<T>(ld_global_nc16(p.q + (((u64)ct.b * p.max_sq + (valid ? i : 0)) * p.heads_q + (valid ? h : 0)) * D + col), f);
#pragma unroll
          for (int e = 0; e < 8; ++e) q_s[r * D + col + e] = valid ? f[e] : 0.f;
        }
        __syncthreads();
      }
    }

    // ---- LeanTile on this stage (Alg. 1 lines 20-25), keys grp*8 .. grp*8+7 of the stage ----
    const int key0 = (int)(it - ct.start) * p.tile_k + (int)(u % (u32)sub) * SK;
    const u16* ks = kv_s + (u64)(u % ST) * 2 * SK * D;
    const u16* vs = ks + SK * D;
#pragma unroll
    for (int c0 = 0; c0 < KPG; c0 += SC) {
      float s[R][SC];
#pragma unroll
      for (int kk = 0; kk < SC; ++kk) {
        const int key = grp * KPG + c0 + kk;
        float kf[8];
        unpack8<T>(ld_shared16(ks + key * D + gl * 8), kf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float acc = 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            float qv;
            if constexpr (S::kQInSmem) qv = q_s[r * D + gl * 8 + e]; else qv = q[r][e];
            acc = qv * kf[e] + acc;
          }
          s[r][kk] = acc;
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int kk = 0; kk < SC; ++kk)
#pragma unroll
          for (int off = 1; off < L; off <<= 1) s[r][kk] += shfl_xor(s[r][kk], off);
      float alpha[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float mx = m[r];
#pragma unroll
        for (int kk = 0; kk < SC; ++kk) {
          const int j = key0 + grp * KPG + c0 + kk;
          s[r][kk] = j < vis[r] ? s[r][kk] * p.scale_log2 : neg_inf();
          mx = fmax2(mx, s[r][kk]);
        }
        if (mx == neg_inf()) {
          alpha[r] = 1.f;
#pragma unroll
          for (int kk = 0; kk < SC; ++kk) s[r][kk] = 0.f;
        } else {
          alpha[r] = exp2_approx(m[r] - mx);  // 0 when m was -inf
          float sum = 0.f;
#pragma unroll
          for (int kk = 0; kk < SC; ++kk) {
            s[r][kk] = exp2_approx(s[r][kk] - mx);
            sum += s[r][kk];
          }
          l[r] = l[r] * alpha[r] + sum;
          m[r] = mx;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) o[r][e] *= alpha[r];
      }
#pragma unroll
      for (int kk = 0; kk < SC; ++kk) {
        const int key = grp * KPG + c0 + kk;
        float vf[8];
        unpack8<T>(ld_shared16(vs + key * D + gl * 8), vf);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) o[r][e] = s[r][kk] * vf[e] + o[r][e];
      }
    }

    // ---- end of a segment: reduce the key groups, then act by role ----
    const bool seg_end = (u + 1 == units) || (cs + (u + 1) / (u32)sub >= ct.end);
    if (!seg_end) continue;

    // key groups of a warp: butterfly over lane bits >= L (identical result in every lane)
#pragma unroll
    for (int off = L; off < 32; off <<= 1) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float m1 = shfl_xor(m[r], off), l1 = shfl_xor(l[r], off);
        float mm = fmax2(m[r], m1);
        float a = m[r] == neg_inf() ? 0.f : exp2_approx(m[r] - mm);
        float b = m1 == neg_inf() ? 0.f : exp2_approx(m1 - mm);
        l[r] = l[r] * a + l1 * b;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          float o1 = shfl_xor(o[r][e], off);
          o[r][e] = o[r][e] * a + o1 * b;
        }
        m[r] = mm;
      }
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wml[(warp * R + r) * 2] = m[r];
        wml[(warp * R + r) * 2 + 1] = l[r];
      }
    }
    __syncthreads();
    float my_scale[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float mm = neg_inf();
#pragma unroll
      for (int w = 0; w < cfg::kWarps; ++w) mm = fmax2(mm, wml[(w * R + r) * 2]);
      float lsum = 0.f;
#pragma unroll
      for (int w = 0; w < cfg::kWarps; ++w) {
        float mw = wml[(w * R + r) * 2];
        float sw = mw == neg_inf() ? 0.f : exp2_approx(mw - mm);
        lsum += wml[(w * R + r) * 2 + 1] * sw;
        if (w == warp) my_scale[r] = sw;
      }
      if (tid == 0) {
        fin[2 * r] = mm;
        fin[2 * r + 1] = lsum;
      }
    }
    // warps add their O into obuf in a fixed order
#pragma unroll
    for (int w = 0; w < cfg::kWarps; ++w) {
      if (warp == w && lane < L) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            float* dst = obuf + r * D + gl * 8 + e;
            *dst = (w == 0 ? 0.f : *dst) + o[r][e] * my_scale[r];
          }
      }
      __syncthreads();
    }

    const bool host = seg_begin == ct.start;     // Alg. 2 line 17
    const bool finishing = ce >= ct.end;         // line 18
    if (!host || (!p.merge_in_kernel && !finishing)) {
      // lines 19-23: StorePartials + Signal
      float* po = p.part_o + (u64)cta * R * D;
      for (int idx = tid; idx < R * D; idx += cfg::kThreads) po[idx] = obuf[idx];
      if (tid < 2 * R) p.part_ml[(u64)cta * R * 2 + tid] = fin[tid];
      __syncthreads();
      if (p.merge_in_kernel && tid == 0) {
        fence_gpu();
        store_release(p.flags + cta, p.epoch);
      }
    } else {
      if (!finishing) {  // lines 25-36: wait for and merge the CTAs that continue this tile
        const int last = cta_of_iter(p, ct.end - 1);
        for (int c = cta + 1 + tid; c <= last; c += cfg::kThreads) {  // all flags in parallel
          while (load_acquire(p.flags + c) != p.epoch) nanosleep(32);
        }
        fence_gpu();
        __syncthreads();
        merge_partials<D, R>(p, cta + 1, last, obuf, fin, sc);
      }
      write_output<T, D, R>(p, ct, obuf, fin);  // lines 38-39
      __syncthreads();
    }
  }
  cp_async_wait<0>();
}

// Second pass of the fixed-split variant: one CTA per tile merges its chunks in CTA order.
template <class T, int D, int R>
__device__ __forceinline__ void lean_combine_body(const LeanParams& p) {
  extern __shared__ Vec16 smem_v16[];  // 16-byte aligned dynamic shared memory
  unsigned char* smem_raw = reinterpret_cast<unsigned char*>(smem_v16);
  float* obuf = reinterpret_cast<float*>(smem_raw);  // [R][D]
  float* fin = obuf + R * D;                         // [R][2]
  float* sc = fin + 2 * R;                           // [kMergeBatch + 1][R]
  const TileInfo t = tile_by_index(p, blockIdx.x);
  const int first = cta_of_iter(p, t.start), last = cta_of_iter(p, t.end - 1);
  if (first == last) return;  // one chunk: the main kernel wrote the tile
  for (int idx = threadIdx.x; idx < R * D; idx += cfg::kThreads) obuf[idx] = p.part_o[(u64)first * R * D + idx];
  if (threadIdx.x < 2 * R) fin[threadIdx.x] = p.part_ml[(u64)first * R * 2 + threadIdx.x];
  __syncthreads();
  merge_partials<D, R>(p, first + 1, last, obuf, fin, sc);
  write_output<T, D, R>(p, t, obuf, fin);
}

}  // namespace ferrattn

// ---- Instances: the closed list of (dtype, head dim, rows) -> kernel ---------------------------
#define FERRATTN_LEAN(TN, T, D, R)                                                                   \
  extern "C" __global__ void __launch_bounds__(ferrattn::cfg::kThreads, ferrattn::cfg::kMinCtasPerSm) \
      lean_decode_##TN##_d##D##_r##R(const ferrattn::LeanParams p) {                                 \
    ferrattn::lean_decode_body<ferrattn::T, D, R>(p);                                                \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(ferrattn::cfg::kThreads)                              \
      lean_combine_##TN##_d##D##_r##R(const ferrattn::LeanParams p) {                                \
    ferrattn::lean_combine_body<ferrattn::T, D, R>(p);                                               \
  }                                                                                                  \
  extern "C" __global__ void lean_smem_##TN##_d##D##_r##R(int* out) {                                \
    out[0] = ferrattn::Smem<D, R>::kBytes;                                                           \
    out[1] = ferrattn::Smem<D, R>::kStages;                                                          \
  }
#define FERRATTN_LEAN_ROWS(TN, T, D) \
  FERRATTN_LEAN(TN, T, D, 1)         \
  FERRATTN_LEAN(TN, T, D, 2)         \
  FERRATTN_LEAN(TN, T, D, 4)         \
  FERRATTN_LEAN(TN, T, D, 8)         \
  FERRATTN_LEAN(TN, T, D, 16)
#define FERRATTN_LEAN_DIMS(TN, T) \
  FERRATTN_LEAN_ROWS(TN, T, 64)   \
  FERRATTN_LEAN_ROWS(TN, T, 128)  \
  FERRATTN_LEAN_ROWS(TN, T, 256)

FERRATTN_LEAN_DIMS(f16, F16)
FERRATTN_LEAN_DIMS(bf16, BF16)

// Device-side fill for tests and benchmarks: uniform values in [-scale, scale) from a hash of
// (seed, index), so multi-gigabyte inputs need no host upload.
extern "C" __global__ void fill_uniform_f16(ferrattn::u16* x, unsigned long long n, unsigned int seed, float scale) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    unsigned int h = (unsigned int)i * 0x9E3779B1u ^ seed ^ (unsigned int)(i >> 32) * 0x85EBCA77u;
    h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
    float u = (float)(h >> 8) * (1.0f / 16777216.0f);
    x[i] = ferrattn::F16::from_f32((2.f * u - 1.f) * scale);
  }
}
extern "C" __global__ void fill_uniform_bf16(ferrattn::u16* x, unsigned long long n, unsigned int seed, float scale) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    unsigned int h = (unsigned int)i * 0x9E3779B1u ^ seed ^ (unsigned int)(i >> 32) * 0x85EBCA77u;
    h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
    float u = (float)(h >> 8) * (1.0f / 16777216.0f);
    x[i] = ferrattn::BF16::from_f32((2.f * u - 1.f) * scale);
  }
}
