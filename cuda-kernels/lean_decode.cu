// LeanAttention stream-K decode (Sanovar et al., appendix E, Algorithm 2) and the fixed-split
// FlashDecoding baseline, from one kernel body.
//
// The host side (ferrattn_core::lean) flattens every output tile's KV iterations into one
// iteration space and uploads three small tables: `seq_start` (where each sequence's tiles
// begin), `cta_bounds` (CTA g owns iterations [cta_bounds[g], cta_bounds[g+1])) and `cta_info`
// (per CTA: its range, its first tile with that tile's range and lengths, and the last CTA its
// host tile waits for), so no CTA searches a table.
// A CTA walks its range as a stream of K/V stages in a cp.async shared-memory pipeline that runs
// across tile boundaries. Output tile = (sequence, KV head, query-tile group): up to 16 query
// rows (the query heads of one KV head times the query tokens) share each K/V load (GQA).
//
// Inside a CTA: 4 warps share each K/V stage. For head dims 64 and 128 each warp takes a quarter
// of the stage's keys and computes S = Q K^T and O += P V on tensor cores (mma.sync m16n8k16,
// f32 accumulate; the tile's <= 16 query rows fill the MMA's M = 16), with the online softmax
// (LeanTile, Alg. 1, in base-2 logits) on the accumulator fragments. For head dim 256 (8 keys per
// warp per stage, too few for a 16-key MMA step) a key is handled by D/8 lanes on CUDA cores. At
// the end of each segment the warps' states are merged through shared memory in a fixed order,
// so results are bitwise reproducible.
//
// Stream-K roles (Alg. 2 lines 17-39): the CTA whose segment starts a tile is its host. A
// non-host CTA stores (O, m, l) into its partial slot and releases flags[g] = 1; a host that
// does not finish the tile acquires the flags of CTAs g+1..last and merges their partials in that
// order (all loads of a batch of partials in flight at once), then writes O / l and
// LSE = (m + log2 l) ln 2, and re-arms the flags it consumed. The host only waits on CTAs after it whose
// first segment is this tile's continuation, which they compute first: with a grid no larger than
// what is co-resident (checked by the launcher with the occupancy API) there is no deadlock.
// Fixed split (merge_in_kernel = 0): every segment that is not a whole tile writes a partial and
// lean_combine_* merges them in a second launch, as FlashDecoding does.
#include "common.cuh"

// Tuning knobs for sweeps through FERRATTN_NVRTC_DEFINES (0: the built-in choice): the ring's
// stage count and the CTAs per SM the register allocation is bounded for.
#ifndef FERRATTN_LEAN_STAGES
#define FERRATTN_LEAN_STAGES 0
#endif
#ifndef FERRATTN_LEAN_MIN_CTAS
#define FERRATTN_LEAN_MIN_CTAS 0
#endif
// Diagnostic build (never shipped; docs/DEVICE_PATH.md "Lean paged, nineteenth session"): 1 makes
// thread 0 of every CTA stamp %clock64 (and %globaltimer at entry and exit) at the steps of a CTA
// (lean_stamp below) into `ferrattn_lean_stamps`, read back by `LeanKernels::read_stamps`; the
// build then instantiates only the f16 d128 r4 kernels (Llama's rows) and the f16 d64 r1 ones with
// the deep ring (Lean-paper's rows), to keep its compile short.
// 0 (the default) compiles every stamp away.
#ifndef FERRATTN_LEAN_STAMPS
#define FERRATTN_LEAN_STAMPS 0
#endif

#if FERRATTN_LEAN_STAMPS
// [CTA % 1024][16] of the last launch: see ferrattn::StampSlot
__device__ unsigned long long ferrattn_lean_stamps[1024 * 16];
#endif

namespace ferrattn {

// Mirrors ferrattn_cuda::launch::LeanParams (#[repr(C)]); all tensors contiguous, 16-bit.
struct LeanParams {
  const u16* q;           // [batch, max_sq, heads_q, D]
  const u16* k;           // [batch, max_sk, heads_kv, D], or paged: [num_pages, page_size, heads_kv, D]
  const u16* v;           // as k
  u16* o;                 // [batch, max_sq, heads_q, D]
  float* lse;             // [batch, heads_q, max_sq], natural log
  const int* seqlens_q;   // [batch]
  const int* seqlens_k;   // [batch]
  const u32* seq_start;   // [batch + 1] first flat iteration of each sequence's tiles
  const u32* cta_bounds;  // [num_ctas + 1]
  const u32* cta_info;    // [num_ctas, 8]: range, first tile, last CTA waited for, first tile's range and lengths
  float* part_o;          // [num_ctas, R, D] unnormalised partial O (base-2 max m)
  float* part_ml;         // [num_ctas, R, 2] partial (m in log2 units, l)
  u32* flags;             // [num_ctas]: 1 once the CTA's partial is visible; its host resets it to 0
  u32 tile_per_cta;       // 1: CTA g computes exactly tile g (no per-CTA tables in the workspace)
  int num_ctas;
  int batch, max_sq, max_sk, heads_q, heads_kv, group;
  int tile_m;             // query rows per tile (<= R)
  int query_groups;       // tiles per (sequence, KV head)
  int tile_k;             // keys per LeanTile iteration (multiple of stage_keys<D>)
  int causal;             // bottom-right causal mask
  int merge_in_kernel;    // 1: stream-K host merge via flags; 0: partials for lean_combine
  float scale_log2;       // softmax_scale * log2(e)
  const int* page_table;  // paged kernels: [batch, max_pages] pool page of each logical page
  int max_pages;          // page-table row length
  int page_shift;         // log2(page size)
  // REGS paged kernels under a stream-K table (tile_per_cta == 0): per CTA, the page words of its
  // first kFirstUnits K/V stages, NW = SK / 16 words each ([num_ctas, kFirstUnits, NW]), so that
  // its first copies wait for one round of reads (this and cta_info, together), not for cta_info
  // and then the page table (launch.rs, LeanStepPlan::cta_words)
  const u32* cta_words;
};

// Stages whose page words a CTA's record holds (launch.rs LEAN_FIRST_UNITS).
constexpr int kFirstUnits = 3;

// Diagnostic stamps (FERRATTN_LEAN_STAMPS): slot of each step in a CTA's 16 words.
enum StampSlot : int {
  kStGlobalEntry = 0,  // %globaltimer at entry (ns)
  kStSmUnits = 1,      // SM id | K/V stages of the CTA << 32
  kStEntry = 2,        // %clock64 at entry; the rest are %clock64 too
  kStRecord = 3,       // the CTA's record (cta_info) in hand
  kStWords = 4,        // paged REGS: the prologue's page words in hand (after its wait and barrier)
  kStFirstCopy = 5,    // thread 0's copies of the first stage issued
  kStPrologue = 6,     // the prologue's copies all issued
  kStFirstLanded = 7,  // stage 0 waited for (after the loop's first wait and barrier)
  kStLastLanded = 8,   // the last stage waited for
  kStLastDone = 9,     // the last stage's softmax done (the segment's end reached)
  kStReduced = 10,     // the last segment's warps merged in shared memory
  kStFlags = 11,       // host with continuations: their flags acquired (else = kStReduced)
  kStEnd = 12,         // partial stored or output written (the last barrier passed)
  kStGlobalEnd = 13,   // %globaltimer at the end (ns)
  kStWaitSum = 14,     // cycles spent in the loop's waits and barriers, every stage
  kStDep = 15,         // scratch: the value a stamp waits for
};

// Thread 0 stores %clock64 into slot `slot` of its CTA, after `dep` has arrived (a load whose
// arrival is the step: the store of dep waits for it, and the clock is read after that store).
__device__ __forceinline__ void lean_stamp(int slot, u32 dep) {
#if FERRATTN_LEAN_STAMPS
  if (threadIdx.x == 0) {
    unsigned long long* s = ferrattn_lean_stamps + (blockIdx.x & 1023u) * 16u;
    *reinterpret_cast<volatile unsigned long long*>(s + kStDep) = dep;
    unsigned long long c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
    *reinterpret_cast<volatile unsigned long long*>(s + slot) = c;
  }
#else
  (void)slot;
  (void)dep;
#endif
}
__device__ __forceinline__ void lean_stamp_value(int slot, unsigned long long v) {
#if FERRATTN_LEAN_STAMPS
  if (threadIdx.x == 0)
    *reinterpret_cast<volatile unsigned long long*>(ferrattn_lean_stamps + (blockIdx.x & 1023u) * 16u + slot) = v;
#else
  (void)slot;
  (void)v;
#endif
}
__device__ __forceinline__ unsigned long long lean_clock() {
#if FERRATTN_LEAN_STAMPS
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  return c;
#else
  return 0;
#endif
}
__device__ __forceinline__ unsigned long long lean_globaltimer() {
#if FERRATTN_LEAN_STAMPS
  unsigned long long c;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(c)::"memory");
  return c;
#else
  return 0;
#endif
}

// Row of the K/V buffer that holds key j of sequence b (NHD: a row is heads_kv * D values).
// Contiguous: sequence b's own rows. Paged (vLLM / FlashInfer layout): the page table maps the
// logical page j / page_size to a page of the pool. Only called for j < seqlens_k[b], whose pages
// the host validated against the pool before uploading the table.
// The page-table word that maps key j of sequence b to its pool page (paged kernels).
__device__ __forceinline__ const int* page_word_of(const LeanParams& p, int b, int j) {
  return p.page_table + (u64)b * p.max_pages + (j >> p.page_shift);
}

template <bool PAGED>
__device__ __forceinline__ u64 kv_row_of(const LeanParams& p, int b, int j) {
  if constexpr (PAGED) {
    // read-only for the whole launch (uploaded before it): the non-coherent path
    const int page = __ldg(page_word_of(p, b, j));
    return ((u64)page << p.page_shift) + (u64)(j & ((1 << p.page_shift) - 1));
  } else {
    return (u64)b * p.max_sk + j;
  }
}

struct TileInfo {
  int tile, b, hk, qg;
  u32 start, end;  // flat iteration range of the tile
  int len_k, len_q;
};

// Coordinates of tile `tile` (no memory read).
__device__ __forceinline__ TileInfo tile_coords(const LeanParams& p, int tile) {
  const int tps = p.heads_kv * p.query_groups;
  TileInfo t;
  t.tile = tile;
  t.b = tile / tps;
  const int r = tile % tps;
  t.hk = r / p.query_groups;
  t.qg = r % p.query_groups;
  return t;
}

// Tile `tile` without a search (the host uploads each CTA's first tile; later tiles follow in order).
__device__ __forceinline__ TileInfo tile_by_index(const LeanParams& p, int tile) {
  const int tps = p.heads_kv * p.query_groups;
  TileInfo t = tile_coords(p, tile);
  const int r = tile % tps;
  t.len_k = p.seqlens_k[t.b];
  t.len_q = p.seqlens_q[t.b];
  u32 n = (u32)((t.len_k + p.tile_k - 1) / p.tile_k);
  n = n < 1u ? 1u : n;
  t.start = p.seq_start[t.b] + (u32)r * n;
  t.end = t.start + n;
  return t;
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

// T when B, else F (NVRTC builds this file without the standard library).
template <bool B, class T, class F>
struct Pick {
  using type = T;
};
template <class T, class F>
struct Pick<false, T, F> {
  using type = F;
};

// Stages of the deep paged instances (`lean_decode_paged_deep_*`: REGS with a longer ring, for
// grids of one CTA per SM, where a 32 KB stage's third slot leaves 64 KB of copies in flight per
// SM; shuffled 16-key pages are scattered 2-4 KB chunks, whose longer latency that did not hide).
// At most 4: REGS keeps the words of units u .. u + 2 ST - 2 in a ring of 8 slots.
constexpr int kDeepStages = 4;
// Largest head dim with a deep instance (ferrattn_cuda::kernels::LEAN_DEEP_MAX_HEAD_DIM).
constexpr int kDeepMaxHeadDim = 64;

// Shared-memory layout of an instance; STG > 0 fixes the ring's stage count (the deep instances).
template <int D, int R, int STG = 0>
struct Smem {
  static constexpr int kSk = cfg::stage_keys<D>();
  // Tensor cores (mma.sync m16n8k16) for Q K^T and P V when D <= 128; CUDA cores for D = 256,
  // whose stage holds only 8 keys per warp.
  static constexpr bool kMma = D <= 128;
  // SIMT with 16 rows: q would not fit in registers beside O
  static constexpr bool kQInSmem = R >= 16 && !kMma;
  // Paged kernels that read a stage ahead: the pool rows of the next unit's keys, double-buffered
  // (lean_decode_body), last. Only those instances reserve it (kBytesAhead): a kilobyte more per
  // CTA slowed the contiguous one-CTA-per-tile rows (Lean-paper B=16 ctx 1k, 64.8-66.6 -> 69.6-70.9
  // us on an H200) by moving two CTAs per SM into a larger shared-memory carveout (less L1).
  static constexpr int kRowsBytes = 2 * kSk * 4 + 4 * kSk * 4;  // rows_s [2][SK], words_s [4][SK]
  static constexpr int bytes_for(int stages) {
    return stages * 2 * kSk * D * 2 + R * D * 4 + (cfg::kWarps + 1) * R * 2 * 4 + (kQInSmem ? R * D * 4 : 0);
  }
  // the same stage count with or without the rows (decided with them)
  static constexpr int kStages = STG > 0 ? STG
                                 : FERRATTN_LEAN_STAGES > 0 ? FERRATTN_LEAN_STAGES
                                 : (bytes_for(3) + kRowsBytes <= cfg::kSmemBudget ? 3 : 2);
  static constexpr int kBytes = bytes_for(kStages);
  static constexpr int kBytesAhead = kBytes + kRowsBytes;
  // Paged kernels that keep the page words in registers (REGS in lean_decode_body): a ring of 8
  // slots of 16 words (a unit's page words, then its packed KV head, keys and page offset).
  static constexpr int kRegsOffset = (kBytes + 15) / 16 * 16;  // 16-byte loads of a slot
  static constexpr int kBytesRegs = kRegsOffset + 8 * 16 * 4;
  static constexpr int kKvBytes = kStages * 2 * kSk * D * 2;
};

// Merges the partials in slots first..=last into (obuf, fin) in place (Alg. 2 lines 29-35, the
// associative rescaling of appendix D). The partials were written by other CTAs moments ago, so
// each read is an L2 round trip: every thread owns whole 16-byte vectors of the tile and issues the
// loads of a chunk of partials (their O vectors and (m, l) of the vector's row) together before it
// uses any, so a chunk costs one round trip (the earlier row pass, then an O pass whose loop waited
// for each element's loads, cost 1 + R * D / kThreads of them: 5 for Llama's 4 rows of d128,
// before its first partial arrived). Each thread rescales its vectors online across chunks;
// threads of one row compute the same (m, l) in the same order, and the order of the sum is
// fixed, so results are reproducible. The thread owning a row's first vector writes fin.
template <int D, int R>
__device__ __forceinline__ void merge_partials(const LeanParams& p, int first, int last, float* obuf, float* fin) {
  constexpr int NV = R * D / 4;                                 // 16-byte vectors of a tile
  constexpr int VPT = (NV + cfg::kThreads - 1) / cfg::kThreads;  // vectors per thread (1..8)
  // partials per round trip: 8 vectors (and as many (m, l) pairs) in flight per thread, fewer
  // for head dim 256, whose SIMT main loop leaves no registers to spare (spills measured with
  // nvcc -Xptxas -v)
  constexpr int CH = D > 128 ? 1 : (VPT >= 8 ? 1 : (VPT >= 4 ? 2 : (VPT >= 2 ? 4 : 8)));
  Flt4 acc[VPT];
  float mr[VPT], lr[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int v = threadIdx.x + j * cfg::kThreads;
    if (v < NV) {
      const int r = 4 * v / D;
      acc[j] = *reinterpret_cast<const Flt4*>(obuf + 4 * v);
      mr[j] = fin[2 * r];
      lr[j] = fin[2 * r + 1];
    }
  }
  for (int c0 = first; c0 <= last; c0 += CH) {
    const int n = (last - c0 + 1) < CH ? (last - c0 + 1) : CH;
    Flt2 ml[CH][VPT];
    Flt4 po[CH][VPT];
#pragma unroll
    for (int i = 0; i < CH; ++i)
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        const int v = threadIdx.x + j * cfg::kThreads;
        if (i < n && v < NV) {
          const int r = 4 * v / D;
          ml[i][j] = ld_cg2(p.part_ml + ((u64)(c0 + i) * R + r) * 2);
          po[i][j] = ld_cg4(p.part_o + (u64)(c0 + i) * R * D + 4 * v);
        }
      }
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int v = threadIdx.x + j * cfg::kThreads;
      if (v >= NV) continue;
      float mm = mr[j];
#pragma unroll
      for (int i = 0; i < CH; ++i)
        if (i < n) mm = fmax2(mm, ml[i][j].x);
      const float a0 = mr[j] == neg_inf() ? 0.f : exp2_approx(mr[j] - mm);
      Flt4 o = {acc[j].x * a0, acc[j].y * a0, acc[j].z * a0, acc[j].w * a0};
      float ll = lr[j] * a0;
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        if (i < n) {
          const float si = ml[i][j].x == neg_inf() ? 0.f : exp2_approx(ml[i][j].x - mm);
          ll += ml[i][j].y * si;
          o.x += po[i][j].x * si;
          o.y += po[i][j].y * si;
          o.z += po[i][j].z * si;
          o.w += po[i][j].w * si;
        }
      }
      acc[j] = o;
      mr[j] = mm;
      lr[j] = ll;
    }
  }
  __syncthreads();  // every thread has read fin before any row's new (m, l) replaces it
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int v = threadIdx.x + j * cfg::kThreads;
    if (v < NV) {
      *reinterpret_cast<Flt4*>(obuf + 4 * v) = acc[j];
      if ((4 * v) % D == 0) {
        const int r = 4 * v / D;
        fin[2 * r] = mr[j];
        fin[2 * r + 1] = lr[j];
      }
    }
  }
  __syncthreads();
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

// A compile-time int (NVRTC builds this file without the standard library).
template <int N>
struct IntC {
  static constexpr int value = N;
};

// STG > 0: the ring's stage count (the deep REGS instances), else the built-in choice.
template <class T, int D, int R, bool PAGED, bool AHEAD = false, bool REGS = false, int STG = 0>
__device__ __forceinline__ void lean_decode_body(const LeanParams& p) {
  using S = Smem<D, R, STG>;
  constexpr int L = cfg::lanes_per_key<D>();
  constexpr int G = cfg::groups_per_warp<D>();
  constexpr int SK = cfg::stage_keys<D>();
  constexpr int ST = S::kStages;
  constexpr int KPG = cfg::kKeysPerGroupStage;
  constexpr int SC = R >= 16 ? 1 : (R >= 8 ? 4 : 8);  // keys per online-softmax update (bounded by registers)
  static_assert(KPG % SC == 0, "chunk must divide the keys of a group");
  constexpr bool kMma = S::kMma;
  constexpr int KW = SK / cfg::kWarps;  // MMA path: keys per warp per stage (16 or 32)
  constexpr int NT = KW / 8;            // score n-tiles per warp
  constexpr int KS = D / 16;            // k-steps of Q K^T
  constexpr int RS = kMma ? 1 : R;      // SIMT per-row state (size 1 when unused)
  // MMA path: a thread's score fragments hold rows g and g + 8 of the 16 MMA rows. With at most 8
  // rows (every GQA group up to 8 and MHA's single row) rows 8-15 are padding: their softmax and
  // O rescale are skipped and their P fragments are zero, which leaves rows 0-7 bit for bit as
  // before. At d64 with one row (Lean-paper shape) the kernel issued about twice cuDNN's
  // instructions (ncu, H200, 2026-11-24: 0.51 against 0.27 issued warps per scheduler).
  constexpr int HALVES = R > 8 ? 2 : 1;
  static_assert(!kMma || (KW % 16 == 0), "MMA path needs 16-key steps per warp");

  extern __shared__ Vec16 smem_v16[];  // 16-byte aligned dynamic shared memory
  unsigned char* smem_raw = reinterpret_cast<unsigned char*>(smem_v16);
  u16* kv_s = reinterpret_cast<u16*>(smem_raw);                       // [ST][2][SK][D]
  float* obuf = reinterpret_cast<float*>(smem_raw + S::kKvBytes);     // [R][D]
  float* wml = obuf + R * D;                                          // [kWarps][R][2]
  float* fin = wml + cfg::kWarps * R * 2;                             // [R][2]
  float* q_s = fin + R * 2;                                           // [R][D] when kQInSmem

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int grp = warp * G + lane / L;  // key group
  const int gl = lane % L;              // columns gl*8 .. gl*8+7
  const int cta = blockIdx.x;
  lean_stamp_value(kStGlobalEntry, lean_globaltimer());
  lean_stamp(kStEntry, 0);
  constexpr bool regs = PAGED && REGS;
  // REGS: units u .. u + 2 ST - 2 have words in the 8-slot ring at once (the prologue writes them
  // with no barrier between), so a deeper ring needs more slots
  static_assert(!regs || 2 * ST - 2 < 8, "the REGS word ring holds 8 units");
  static_assert(STG == 0 || regs, "only the REGS instances take a stage count");
  constexpr int NW = SK / 16;  // page words a unit can touch (pages of 16): 8, 4, 2 for d 64, 128, 256
  static_assert(SK % 16 == 0 && NW <= 8, "a stage holds whole pages of 16");
  // REGS: the page words of the first stages, copied before anything is read, from addresses that
  // depend on no load: the CTA's record (stream-K) or, one CTA per tile, the first entries of its
  // sequence's page-table row (its first stage is the tile's first keys). The contiguous kernel's
  // first copies wait for one round of reads (cta_info); read from the page table at the
  // producer's cursor they waited for a second, dependent one (Llama B=1 ctx 8k, 8 stages a CTA).
  if constexpr (regs) {
    constexpr int KF = ST < kFirstUnits ? ST : kFirstUnits;
    if (tid < KF * NW) {
      const int s = tid / NW, w = tid % NW;
      const u32* src;
      bool ok = true;
      if (p.tile_per_cta) {
        const int b = cta / (p.heads_kv * p.query_groups);
        const int pg = ((s * SK) >> p.page_shift) + w;
        ok = (w << p.page_shift) < SK || w == 0;  // pages of the stage (one for pages of 64 at SK <= 64)
        ok = ok && pg < p.max_pages;               // any entry of the row may be read (its value is used
                                                   // only for keys in the sequence)
        src = reinterpret_cast<const u32*>(p.page_table) + (u64)b * p.max_pages + (ok ? pg : 0);
      } else {
        src = p.cta_words + ((u64)cta * kFirstUnits + s) * NW + w;
      }
      const u32 dst = smem_addr(smem_raw + S::kRegsOffset) + (u32)(s * 16 + w) * 4;  // wring[s][w]
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src),
                   "r"(ok ? 4 : 0)
                   : "memory");
    }
  }
  // The CTA's record (launch.rs, cta_info): everything the first K/V stage's addresses depend on,
  // in one 32-byte read, so the first copies wait for one round trip instead of two dependent ones
  // (range and first tile, then the sequence's lengths) on a latency-bound small problem.
  // One CTA per tile (a grid larger than the co-resident slots, launched plainly): the tile is
  // the CTA's index and its range that tile's, one round of reads too.
  u32 cs, ce;
  int host_last;  // the CTA holding the last iteration of the tile this CTA hosts
  TileInfo first;
  if (p.tile_per_cta) {
    first = tile_by_index(p, cta);
    cs = first.start;
    ce = first.end;
    host_last = cta;
  } else {
    const Vec16 info0 = ld_global_nc16(p.cta_info + 8 * (u64)cta);
    const Vec16 info1 = ld_global_nc16(p.cta_info + 8 * (u64)cta + 4);
    cs = info0.x;
    ce = info0.y;
    host_last = (int)info0.w;
    first = tile_coords(p, (int)info0.z);
    first.start = info1.x;
    first.end = info1.y;
    first.len_k = (int)info1.z;
    first.len_q = (int)info1.w;
  }
  lean_stamp(kStRecord, cs ^ ce ^ (u32)first.len_k);
  const int sub = p.tile_k / SK;
  const u32 units = (ce - cs) * (u32)sub;
#if FERRATTN_LEAN_STAMPS
  {
    u32 smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    lean_stamp_value(kStSmUnits, (unsigned long long)smid | ((unsigned long long)units << 32));
  }
#endif
  const u64 kv_row = (u64)p.heads_kv * D;

  // ---- producer: stage loads of the whole CTA range, across tiles ----
  TileInfo pt = first;
  auto prefetch_q = [&](const LeanParams& pp, const TileInfo& t) {
    // one 128-byte line per thread into L2: the tile's query rows are contiguous per token
    const int rows = pp.group * pp.max_sq - t.qg * pp.tile_m < pp.tile_m ? pp.group * pp.max_sq - t.qg * pp.tile_m : pp.tile_m;
    const int lines = rows * D * 2 / 128;
    if (tid < lines) {
      const int row = t.qg * pp.tile_m + (tid * 64) / D;
      const int i = row / pp.group, h = t.hk * pp.group + row % pp.group;
      prefetch_l2(pp.q + (((u64)t.b * pp.max_sq + i) * pp.heads_q + h) * D + (tid * 64) % D);
    }
  };
  // The first key of the producer's next unit, and pt its tile. The producer asks for units 0, 1,
  // 2, ... in order, so a cursor (iteration, sub-stage) replaces a division per stage.
  u32 p_it = cs;
  int p_sub = 0;
  auto next_unit_key0 = [&]() -> int {
    if (p_it >= pt.end) {
      pt = tile_by_index(p, pt.tile + 1);
      prefetch_q(p, pt);  // the consumer reaches this tile a few stages later
    }
    const int key0 = (int)(p_it - pt.start) * p.tile_k + p_sub * SK;
    if (++p_sub == sub) {
      p_sub = 0;
      ++p_it;
    }
    return key0;
  };
  constexpr int CH = SK * D / 8 / cfg::kThreads;  // 16-byte chunks per thread per stage
  static_assert(CH * cfg::kThreads == SK * D / 8, "a stage splits evenly over the threads");
  // A thread's chunks of a stage: chunk i is columns cc*8.. of stage key key_t + i*KPC. Their
  // swizzled places are two bases plus compile-time offsets: swz's XOR takes key & 7, and KPC
  // (16, 8 or 4) moves it by 0 or, for D = 256, by 4 on odd i. So the copies of a stage take
  // immediate shared-memory offsets instead of a swizzle and a division each (the issue of a d64
  // stage was about 300 instructions a thread for its 16 copies, more than its Q K^T, softmax and
  // P V together; SASS of 83c53c5).
  constexpr int KPC = cfg::kThreads / (D / 8);
  static_assert(KPC % 4 == 0 && KPC * (D / 8) == cfg::kThreads, "chunk keys");
  const int key_t = tid / (D / 8), cc = tid % (D / 8);
  // byte offsets in a K (or V) stage, from the shared window's base of the ring
  const u32 dst0 = 2 * swz<D>(key_t, cc), dst1 = 2 * swz<D>(key_t + KPC, cc);
  auto dst_of = [&](int i) { return ((i & 1) ? dst1 : dst0) + (u32)((i & ~1) * KPC * D * 2); };
  const u32 ring = smem_addr(kv_s);
  auto slot_of = [&](u32 u) { return ring + (u % ST) * (u32)(2 * SK * D * 2); };
  // Copies of one unit into its ring slot from the rows of its keys; keys past the sequence are
  // zero-filled (src-size 0) from row 0, an always-valid address.
  auto copy_unit = [&](u32 u, int hk, const u64 (&rows)[CH], const bool (&ok)[CH]) {
    const u32 ks = slot_of(u), vs = ks + SK * D * 2;
    const u64 base = (u64)hk * D + cc * 8;
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      const u64 off = base + rows[i] * kv_row;
      cp_async16_s(ks + dst_of(i), p.k + off, ok[i]);
      cp_async16_s(vs + dst_of(i), p.v + off, ok[i]);
    }
  };
  // A contiguous cache: a thread's chunks are KPC rows apart, one pointer step each.
  const u64 row_step = (u64)KPC * kv_row;
  auto copy_contiguous = [&](u32 u, int key0, const TileInfo& t) {
    const u32 ks = slot_of(u), vs = ks + SK * D * 2;
    const int rem = t.len_k - key0 - key_t;  // chunk i holds a key of the sequence iff i * KPC < rem
    const u64 off = ((u64)t.b * p.max_sk + (u64)(key0 + key_t)) * kv_row + (u64)t.hk * D + cc * 8;
    const u16* gk = p.k + off;
    const u16* gv = p.v + off;
    if (key0 + SK <= t.len_k) {  // a whole stage of keys (uniform): no predicates, no selects
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        cp_async16_s(ks + dst_of(i), gk + i * row_step, true);
        cp_async16_s(vs + dst_of(i), gv + i * row_step, true);
      }
    } else {
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const bool ok = i * KPC < rem;
        cp_async16_s(ks + dst_of(i), ok ? gk + i * row_step : p.k, ok);
        cp_async16_s(vs + dst_of(i), ok ? gv + i * row_step : p.v, ok);
      }
    }
  };
  // Rows computed where the copy is issued: arithmetic for a contiguous cache, a page-table read
  // for a paged one that does not read a stage ahead.
  auto load_unit = [&](u32 u) {
    const int key0 = next_unit_key0();
    if constexpr (!PAGED) {
      copy_contiguous(u, key0, pt);
    } else {
      u64 rows[CH];
      bool ok[CH];
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const int j = key0 + key_t + i * KPC;
        ok[i] = j < pt.len_k;
        rows[i] = ok[i] ? kv_row_of<PAGED>(p, pt.b, j) : (u64)0;
      }
      copy_unit(u, pt.hk, rows, ok);
    }
  };
  // Paged caches: a key's row is a page-table read, a global load whose result the copy's address
  // needs. Read in the same step as the copies, every stage would wait one L2 round trip before its
  // copies are issued, and with one CTA per SM nothing else hides it (H200, 54f6dab: Llama B=1 and
  // B=8 ctx 8k and B=1 ctx 32k at 128 CTAs 12-34% behind contiguous, at 264 CTAs 0-4%). So the ahead
  // instances read the page words of unit u + 2 right after unit u's copies are issued (thread
  // k < SK copies key k's word into words_s with cp.async, in the same commit group), and just
  // before the barrier of the iteration that copies unit u + 2 the same thread, past the wait that
  // completed that group, turns its word into its pool row in rows_s (two slots).
  // The words never pass through registers: a loaded word carried from one iteration to the next
  // was moved between registers (the loop cannot rename them without unrolling), and the move
  // waited for the load; with one CTA per SM and a full ring in front of it that stalled every
  // stage (Lean-paper B=1 ctx 64k on 112 CTAs, pages of 16: 1.34x contiguous before, 1.05x after;
  // H200, 2026-11-26, docs/DEVICE_PATH.md "Lean paged, eleventh session").
  // A key's place is its pool row (page * page_size + offset, a u32: below 2^32 for any pool the
  // host accepts); a copy's address is one IMAD.WIDE.U32 (row * row bytes + the unit's K or V
  // base). The per-unit state the ring carries is two words (the rotation of a four-field struct
  // cost about 20 moves and byte permutes a stage; ncu, H200, 2026-11-26).
  constexpr u32 kNoRow = 0xffffffffu;
  u32* rows_s = reinterpret_cast<u32*>(smem_raw + S::kBytes);  // [2][SK], ahead instances only
  constexpr bool ahead = PAGED && AHEAD;
  constexpr u32 kFull = 0x80000000u;
  struct Fetched {
    u32 off;   // this thread's key's offset in its page, or kNoRow past the sequence (tid < SK)
    u32 unit;  // the KV head of the unit's tile (pt runs ahead of the copies) | kFull when every
               // key of the unit is in the sequence (uniform over the CTA)
  };
  struct NoFetched {};
  // the next unit to copy (fa) and the one after (fb); ahead instances only
  typename Pick<ahead, Fetched, NoFetched>::type fa{}, fb{};
  // page words of units u (slot u % 4): written two units ahead of their copies, read one unit
  // ahead (store_fetched); slot u is rewritten for unit u + 4 two iterations after it was read
  u32* words_s = rows_s + 2 * SK;
  u32 w_next = 0;  // the unit whose words fetch_rows reads next
  const u32 row_bytes = (u32)p.heads_kv * D * 2;
  // the words of the producer's next unit; pt is that unit's tile afterwards
  auto fetch_rows = [&]() -> Fetched {
    const int key0 = next_unit_key0();
    Fetched f{kNoRow, (u32)pt.hk | (key0 + SK <= pt.len_k ? kFull : 0u)};
    if (tid < SK) {
      const int j = key0 + tid;
      const bool ok = j < pt.len_k;
      if (ok) f.off = (u32)j & ((1u << p.page_shift) - 1);
      const int* w = ok ? page_word_of(p, pt.b, j) : p.page_table;  // src-size 0: not read
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(words_s + (w_next & 3) * SK + tid)),
                   "l"(w), "r"(ok ? 4 : 0)
                   : "memory");
    }
    ++w_next;
    return f;
  };
  auto store_fetched = [&](u32 u, const Fetched& f) {
    if (tid < SK) rows_s[(u & 1) * SK + tid] = f.off != kNoRow ? (words_s[(u & 3) * SK + tid] << p.page_shift) + f.off : kNoRow;
  };
  auto copy_fetched = [&](u32 u, u32 unit) {
    const u32* rs = rows_s + (u & 1) * SK;
    const u32 ks = slot_of(u), vs = ks + SK * D * 2;
    const u64 col = ((u64)(unit & ~kFull) * D + cc * 8) * 2;
    const u64 kb = reinterpret_cast<u64>(p.k) + col, dv = reinterpret_cast<u64>(p.v) - reinterpret_cast<u64>(p.k);
    // K's address as one IMAD.WIDE.U32 (row * row_bytes + base) and V's as K's plus the distance
    // of the pools (written as C, the shared product was split off and each address took about
    // six instructions)
    auto at = [&](u32 row) {
      u64 a;
      asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(a) : "r"(row), "r"(row_bytes), "l"(kb));
      return a;
    };
    // all rows first: each copy's asm is a memory clobber, so a shared read placed after one
    // would wait for it and then for its own latency, chunk by chunk
    u32 r[CH];
#pragma unroll
    for (int i = 0; i < CH; ++i) r[i] = rs[key_t + i * KPC];
    if (unit & kFull) {  // every key in the sequence (nearly every unit): no predicates, no selects
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const u64 a = at(r[i]);
        cp_async16_s(ks + dst_of(i), reinterpret_cast<const char*>(a), true);
        cp_async16_s(vs + dst_of(i), reinterpret_cast<const char*>(a + dv), true);
      }
    } else {
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const bool ok = r[i] != kNoRow;
        const u64 a = ok ? at(r[i]) : reinterpret_cast<u64>(p.k);
        cp_async16_s(ks + dst_of(i), reinterpret_cast<const char*>(a), ok);
        cp_async16_s(vs + dst_of(i), reinterpret_cast<const char*>(a + dv), ok);
      }
    }
  };
  // ---- REGS: the page words in registers (H200 ncu, thirteenth session: the ahead instance's
  // stage waited on shared loads of rows_s before its first copy and on a shared round trip
  // (words_s -> rows_s) before each barrier; docs/DEVICE_PATH.md "Lean paged, fourteenth session").
  // Chunk i of every thread holds a key of block i of the stage (keys i*KPC .. i*KPC + KPC - 1),
  // and a page (16 or 64 keys) holds whole blocks, so every thread of the CTA needs the same page
  // words, at most SK / 16 per unit. Every warp runs the producer's cursor (as the contiguous
  // kernel's do, so the warps reach each barrier together); for unit U, warp U % 4 copies the
  // unit's words (cp.async, 4 bytes each, lanes < NW) and stores a packed record (KV head, keys in
  // the sequence, offset of the stage in its page) into slot U % 8 of `wring`, in the commit group
  // of unit U - ST's copies. The wait that completes that group and the barrier
  // after it make the slot visible one iteration before unit U's copies are issued: every thread
  // loads it into registers (wr, wmeta) after issuing the previous unit's copies, so the load has
  // a stage of compute to arrive and the next stage's copies start from registers after the
  // barrier (one IMAD.WIDE.U32 per page and K or V, as many as the contiguous copies take).
  u32* wring = reinterpret_cast<u32*>(smem_raw + S::kRegsOffset);  // [8][16], REGS instances only
  u32 wr[NW];
  u32 wmeta = 0, whkv = 0;  // the packed record; heads_kv again (V's multiplicand, below)
  // `words`: false for the first KF units, whose words were copied at the CTA's start
  auto fetch_words = [&](u32 uu, bool words) {  // every thread, units in order; warp uu % 4 writes the slot
    const int key0 = next_unit_key0();
    if (warp != (int)(uu & 3)) return;
    const int nw = (SK >> p.page_shift) > 0 ? (SK >> p.page_shift) : 1;
    const int pg = (key0 >> p.page_shift) + lane;
    u32* slot = wring + (uu & 7) * 16;
    if (words && lane < NW) {
      // a page with no key in the sequence is not read (its table entry may be anything)
      const bool ok = lane < nw && (pg << p.page_shift) < pt.len_k;
      const int* w = ok ? p.page_table + (u64)pt.b * p.max_pages + pg : p.page_table;
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(slot + lane)), "l"(w),
                   "r"(ok ? 4 : 0)
                   : "memory");
    }
    if (lane == 0) {
      const int rem = pt.len_k - key0;  // keys of the unit in the sequence, 0 .. SK
      const u32 in_seq = (u32)(rem < SK ? (rem < 0 ? 0 : rem) : SK);
      slot[8] = (u32)pt.hk | (in_seq << 16) | ((u32)(key0 & ((1 << p.page_shift) - 1)) << 24);
      slot[9] = (u32)p.heads_kv;
    }
  };
  auto load_words = [&](u32 uu) {  // every thread, after the barrier that made slot uu % 8 visible
    const u32* slot = wring + (uu & 7) * 16;
    if constexpr (NW >= 4) {
#pragma unroll
      for (int k = 0; k < NW; k += 4) {
        const Vec16 v = ld_shared16(slot + k);
        wr[k] = v.x;
        wr[k + 1] = v.y;
        wr[k + 2] = v.z;
        wr[k + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < NW; ++j) wr[j] = slot[j];
    }
    wmeta = slot[8];
    whkv = slot[9];
  };
  // Unit uu's copies from wr / wmeta, pages of PS keys. A chunk's address is its page's
  // (word * page bytes + this thread's offset, one IMAD.WIDE.U32) plus, for the chunks after the
  // first of a page, its block's offset (block * KPC rows, another IMAD.WIDE.U32 with an
  // immediate). V's products take `whkv`, heads_kv loaded from shared memory: the
  // compiler otherwise shares the product of K's and V's address and adds both bases to it,
  // three instructions per address instead of one (SASS, 2026-11-26).
  auto copy_regs = [&](u32 uu, auto ps_tag) {
    constexpr int PS = decltype(ps_tag)::value;
    static_assert(PS % KPC == 0, "a page holds whole blocks");
    constexpr int BPP = PS / KPC;  // blocks of a page
    const u32 ks = slot_of(uu), vs = ks + SK * D * 2;
    const u32 hk = wmeta & 0xffffu, in_seq = (wmeta >> 16) & 0xffu, koff = wmeta >> 24;
    // this thread's byte offset in a page: its key's row (stage offset in the page + key_t),
    // the KV head, its columns (below page_bytes < 2^32 for any pool the host accepts)
    const u32 toff = (koff + (u32)key_t) * row_bytes + hk * (u32)(D * 2) + (u32)cc * 16;
    const u64 kb = reinterpret_cast<u64>(p.k) + toff, vb = reinterpret_cast<u64>(p.v) + toff;
    const u32 hkv = (u32)p.heads_kv;
    const u32 pbk = row_bytes * (u32)PS, pbv = whkv * (u32)(PS * D * 2);
    // plain C: ptxas fuses it into IMAD.WIDE.U32 with the addend; written as PTX mad.wide.u32
    // it became a product, then a 64-bit add (three instructions)
    auto mad = [](u32 a, u32 b, u64 c) { return (u64)a * b + c; };
    if (in_seq == (u32)SK) {  // every key in the sequence (nearly every unit): no predicates
      u64 ak[CH], av[CH];
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const int pi = (i * KPC) / PS, j = i % BPP;
        const u32 w = wr[pi < NW ? pi : 0];
        if (j == 0) {
          ak[i] = mad(w, pbk, kb);
          av[i] = mad(w, pbv, vb);
        } else {
          // heads_kv times a constant (the block's rows times D * 2): IMAD.WIDE.U32 with an
          // immediate, where a multiple of the row bytes became a chain of 64-bit adds
          ak[i] = mad(hkv, (u32)(j * KPC * D * 2), ak[i - j]);
          av[i] = mad(whkv, (u32)(j * KPC * D * 2), av[i - j]);
        }
      }
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        cp_async16_s(ks + dst_of(i), reinterpret_cast<const char*>(ak[i]), true);
        cp_async16_s(vs + dst_of(i), reinterpret_cast<const char*>(av[i]), true);
      }
    } else {  // the last unit of a sequence: a rolled loop (little code for a rare path)
#pragma unroll 1
      for (int i = 0; i < CH; ++i) {
        const bool ok = (u32)(key_t + i * KPC) < in_seq;
        const int pi = (i * KPC) / PS, j = i % BPP;
        u32 w = wr[0];
#pragma unroll
        for (int k = 1; k < NW; ++k)
          if (pi == k) w = wr[k];
        const u64 a = mad(hkv, (u32)(j * KPC * D * 2), mad(w, pbk, kb));
        const u64 b2 = mad(whkv, (u32)(j * KPC * D * 2), mad(w, pbv, vb));
        cp_async16_s(ks + dst_of(i), reinterpret_cast<const char*>(ok ? a : reinterpret_cast<u64>(p.k)), ok);
        cp_async16_s(vs + dst_of(i), reinterpret_cast<const char*>(ok ? b2 : reinterpret_cast<u64>(p.v)), ok);
      }
    }
  };
  // Issues unit u's copies (its rows stored and visible after a barrier, for a paged cache), and
  // for a paged cache reads the words of unit u + 2.
  // Which of the two is faster depends on the grid (the host picks the instance, launch.rs
  // `paged_rows_ahead`): ahead wins with one CTA per SM and with pages of 64; with pages of 16 at
  // two CTAs per SM it lost 5-9% against reading in place (H200, 2026-11-23, docs/DEVICE_PATH.md).
  // A template parameter, not a launch parameter: a run-time switch between the two cost 2-5% on
  // both (the same H200 measurements).
  auto issue_unit = [&](u32 u) {
    if constexpr (regs) {
      // the host allows pages of 16 and 64 only
      if (p.page_shift == 4) copy_regs(u, IntC<16>{}); else copy_regs(u, IntC<64>{});
      if (u + ST < units) fetch_words(u + ST, true);
    } else if constexpr (ahead) {
      copy_fetched(u, fa.unit);
      fa = fb;
      if (u + 2 < units) fb = fetch_rows();  // unit u + 2's
    } else {
      load_unit(u);
    }
  };
  // The prologue reads the words of units 0, 1 and 2 together (one commit group, waited for at
  // once): the second stage's copies then wait for one page-table round trip, not two in series.
  if constexpr (regs) {
    // the words of units 0 .. KF - 1 are on their way (the kernel's first copies); the others of
    // units .. ST - 1 in one round trip; units ST .. 2 ST - 2 go to other slots
#pragma unroll
    for (int s = 0; s < ST; ++s)
      if ((u32)s < units) fetch_words((u32)s, s >= kFirstUnits);  // KF = min(ST, kFirstUnits)
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    lean_stamp(kStWords, 0);
#pragma unroll 1  // one copy of issue_unit's code (an unrolled prologue doubled it)
    for (int s = 0; s < ST - 1; ++s) {
      if ((u32)s < units) {
        load_words((u32)s);
        issue_unit((u32)s);
#if FERRATTN_LEAN_STAMPS
        if (s == 0) lean_stamp(kStFirstCopy, 0);
#endif
      }
      cp_async_commit();
    }
    if ((u32)(ST - 1) < units) load_words((u32)(ST - 1));
  } else if constexpr (ahead) {
    Fetched f0{kNoRow, 0u};
    if (units > 0) f0 = fetch_rows();
    if (units > 1) fa = fetch_rows();
    if (units > 2) fb = fetch_rows();
    cp_async_commit();
    cp_async_wait<0>();
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
      if ((u32)s < units) store_fetched((u32)s, s == 0 ? f0 : fa);
      __syncthreads();
      if ((u32)s < units) {
        if (s == 0) copy_fetched(0, f0.unit); else issue_unit((u32)s);  // units 1 and 2 are read
      }
      cp_async_commit();
    }
  } else {
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
      if ((u32)s < units) issue_unit((u32)s);
      if (s == 0) lean_stamp(kStFirstCopy, 0);
      cp_async_commit();
    }
  }
  lean_stamp(kStPrologue, 0);

  // ---- consumer state ----
  TileInfo ct = first;  // the consumer's tile (the first one's fields die here, not in the loop)
  u32 seg_begin = cs;
  float q[(S::kQInSmem || kMma) ? 1 : R][8];
  float o[RS][8], m[RS], l[RS];
  int vis[RS];
  // MMA path: Q as A fragments, O accumulators (16 rows x D per warp); a thread owns rows g, g+8
  u32 qa[kMma ? KS : 1][4];
  float oa[kMma ? D / 8 : 1][4];
  float m2[2], l2[2];
  int vis2[2];
  const int g = lane >> 2, t4 = lane & 3, mat = lane >> 3, r8 = lane & 7;
  // MMA path: a lane's ldmatrix row (bytes into a stage's K or V) and its chunk XOR (bytes)
  const u32 qk_row = (u32)(warp * KW + ((mat >> 1) << 3) + r8) * D * 2, qk_x = (u32)(((mat & 1) ^ r8) << 4);
  const u32 pv_row = (u32)(warp * KW + ((mat & 1) << 3) + r8) * D * 2, pv_x = (u32)(((mat >> 1) ^ r8) << 4);

  // A new segment (Alg. 2 lines 11-16): Q, the row states and the accumulators of tile ct. It runs
  // after the previous segment's role (store or merge), so the accumulators are dead during a
  // merge and its registers serve the merge's loads; the Q loads still overlap the wait for the
  // next K/V stage.
  auto start_segment = [&]() {
    if constexpr (kMma) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = g + 8 * h;
        const int row = ct.qg * p.tile_m + r;
        const int i = row / p.group, hh = ct.hk * p.group + row % p.group;
        const bool valid = r < p.tile_m && row < p.group * p.max_sq && i < ct.len_q;
        int v_end = ct.len_k;
        if (p.causal) {
          v_end = i + ct.len_k - ct.len_q + 1;
          v_end = v_end < 0 ? 0 : (v_end > ct.len_k ? ct.len_k : v_end);
        }
        vis2[h] = valid ? v_end : 0;
        m2[h] = neg_inf();
        l2[h] = 0.f;
        const u16* qrow = p.q + (((u64)ct.b * p.max_sq + (valid ? i : 0)) * p.heads_q + (valid ? hh : 0)) * D;
#pragma unroll
        for (int k2 = 0; k2 < KS; ++k2) {
          qa[k2][h] = valid ? ld_global_u32(qrow + k2 * 16 + 2 * t4) : 0u;
          qa[k2][2 + h] = valid ? ld_global_u32(qrow + k2 * 16 + 8 + 2 * t4) : 0u;
        }
      }
#pragma unroll
      for (int n = 0; n < (kMma ? D / 8 : 1); ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) oa[n][e] = 0.f;
    } else {
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
    }  // SIMT init
  };
  start_segment();

  // the consumer's unit as (iteration, sub-stage), a cursor like the producer's
  u32 it = cs;
  int c_sub = 0;
#if FERRATTN_LEAN_STAMPS
  unsigned long long wait_sum = 0;  // cycles in the loop's waits and barriers
#endif
  for (u32 u = 0; u < units; ++u) {
    const unsigned long long w0 = lean_clock();
    cp_async_wait<ST - 2>();
    if constexpr (ahead) {
      if (u + ST - 1 < units) store_fetched(u + ST - 1, fa);
    }
    __syncthreads();
#if FERRATTN_LEAN_STAMPS
    wait_sum += lean_clock() - w0;
    if (u == 0) lean_stamp(kStFirstLanded, 0);
    if (u + 1 == units) lean_stamp(kStLastLanded, 0);
#else
    (void)w0;
#endif
    if (u + ST - 1 < units) issue_unit(u + ST - 1);
    cp_async_commit();
    if constexpr (regs) {
      if (u + ST < units) load_words(u + ST);  // completed by this iteration's wait and barrier
    }

    // ---- LeanTile on this stage (Alg. 1 lines 20-25), keys grp*8 .. grp*8+7 of the stage ----
    const int key0 = (int)(it - ct.start) * p.tile_k + c_sub * SK;
    const u16* ks = kv_s + (u64)(u % ST) * 2 * SK * D;
    const u16* vs = ks + SK * D;
    if constexpr (kMma) {
      // 32-bit shared addresses: the stage's K (and V) window plus a lane's row and its swizzled
      // chunk. A lane reads key kb + 16 n + 8 (bit of mat) + r8, so key % 8 = r8 and swz's XOR
      // acts on the chunk alone: chunk 2 c + b (b = one bit of mat) ^ r8 = 2 c ^ (b ^ r8).
      const u32 ks_a = slot_of(u), vs_a = ks_a + SK * D * 2;
      // S = Q K^T for this warp's KW keys (Alg. 1 line 20) on tensor cores
      const int kb = warp * KW;
      float sacc[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[n][e] = 0.f;
#pragma unroll
      for (int k2 = 0; k2 < KS; ++k2) {
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          u32 b[4];
          ldmatrix_x4(b, ks_a + qk_row + np * 16 * D * 2 + (((2 * k2) << 4) ^ qk_x));
          mma16816(T{}, sacc[2 * np], qa[k2], b[0], b[1]);
          mma16816(T{}, sacc[2 * np + 1], qa[k2], b[2], b[3]);
        }
      }
      // online softmax in base 2 (lines 21-23); rows g and g+8, max over the quad
      const int jb = key0 + kb + 2 * t4;
      float alpha2[2] = {1.f, 1.f};
#pragma unroll
      for (int h = 0; h < HALVES; ++h) {
        float mx = m2[h];
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float v = (jb + n * 8 + e) < vis2[h] ? sacc[n][2 * h + e] * p.scale_log2 : neg_inf();
            sacc[n][2 * h + e] = v;
            mx = fmax2(mx, v);
          }
        mx = fmax2(mx, shfl_xor(mx, 1));
        mx = fmax2(mx, shfl_xor(mx, 2));
        float sum = 0.f;
        if (mx == neg_inf()) {
          alpha2[h] = 1.f;
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            sacc[n][2 * h] = 0.f;
            sacc[n][2 * h + 1] = 0.f;
          }
        } else {
          alpha2[h] = exp2_approx(m2[h] - mx);
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float pv = exp2_approx(sacc[n][2 * h + e] - mx);
              sacc[n][2 * h + e] = pv;
              sum += pv;
            }
          m2[h] = mx;
        }
        l2[h] = l2[h] * alpha2[h] + sum;  // this thread's columns; the quad is summed at the end
      }
#pragma unroll
      for (int n = 0; n < (kMma ? D / 8 : 1); ++n) {
        oa[n][0] *= alpha2[0];
        oa[n][1] *= alpha2[0];
        if constexpr (HALVES == 2) {
          oa[n][2] *= alpha2[1];
          oa[n][3] *= alpha2[1];
        }
      }
      // O += P V (line 24): the score accumulators are already P's A fragments (rows 8-15 zero
      // when they are padding)
#pragma unroll
      for (int kt = 0; kt < KW / 16; ++kt) {
        const u32 a[4] = {pack2(T{}, sacc[2 * kt][0], sacc[2 * kt][1]),
                          HALVES == 2 ? pack2(T{}, sacc[2 * kt][2], sacc[2 * kt][3]) : 0u,
                          pack2(T{}, sacc[2 * kt + 1][0], sacc[2 * kt + 1][1]),
                          HALVES == 2 ? pack2(T{}, sacc[2 * kt + 1][2], sacc[2 * kt + 1][3]) : 0u};
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
          u32 b[4];
          ldmatrix_x4_trans(b, vs_a + pv_row + kt * 16 * D * 2 + (((2 * np) << 4) ^ pv_x));
          mma16816(T{}, oa[2 * np], a, b[0], b[1]);
          mma16816(T{}, oa[2 * np + 1], a, b[2], b[3]);
        }
      }
    } else {
#pragma unroll
    for (int c0 = 0; c0 < KPG; c0 += SC) {
      float s[R][SC];
#pragma unroll
      for (int kk = 0; kk < SC; ++kk) {
        const int key = grp * KPG + c0 + kk;
        float kf[8];
        unpack8<T>(ld_shared16(ks + swz<D>(key, gl)), kf);
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
        unpack8<T>(ld_shared16(vs + swz<D>(key, gl)), vf);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) o[r][e] = s[r][kk] * vf[e] + o[r][e];
      }
    }

    }  // SIMT stage

    // ---- end of a segment: reduce the key groups, then act by role ----
    if (++c_sub == sub) {  // it, c_sub: unit u + 1 from here on
      c_sub = 0;
      ++it;
    }
    const bool seg_end = (u + 1 == units) || (it >= ct.end);
    if (!seg_end) continue;
#if FERRATTN_LEAN_STAMPS
    if (u + 1 == units) lean_stamp(kStLastDone, __float_as_uint(kMma ? l2[0] : l[0]));
#endif

    if constexpr (kMma) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l2[h] += shfl_xor(l2[h], 1);
        l2[h] += shfl_xor(l2[h], 2);
      }
      if (t4 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = g + 8 * h;
          if (r < R) {
            wml[(warp * R + r) * 2] = m2[h];
            wml[(warp * R + r) * 2 + 1] = l2[h];
          }
        }
      }
      __syncthreads();
      if (tid < R) {
        float mm = neg_inf(), lsum = 0.f;
#pragma unroll
        for (int w = 0; w < cfg::kWarps; ++w) mm = fmax2(mm, wml[(w * R + tid) * 2]);
#pragma unroll
        for (int w = 0; w < cfg::kWarps; ++w) {
          const float mw = wml[(w * R + tid) * 2];
          lsum += wml[(w * R + tid) * 2 + 1] * (mw == neg_inf() ? 0.f : exp2_approx(mw - mm));
        }
        fin[2 * tid] = mm;
        fin[2 * tid + 1] = lsum;
      }
      // The warps' O, unscaled, into the stage this unit just read: every warp's reads of it
      // ended before the barrier above, and the next copy into it is issued after the next
      // unit's loop-top barrier (the copies in flight fill the other stages). Then one barrier,
      // and each thread sums whole float4s of obuf over the warps in order w = 0, 1, ..: acc =
      // fma(o_w, s_w, acc) from 0, s_w = 2^(m_w - m) from wml, the sums the warps once added into
      // obuf one warp at a time behind a barrier each (two barriers and three serialized rounds
      // of read-modify-writes fewer).
      constexpr int kStageFloats = SK * D;  // a stage: K and V, 2 SK D halves
      constexpr int LD = cfg::kWarps * R * (D + 4) <= kStageFloats ? D + 4 : D;  // row stride
      static_assert(cfg::kWarps * R * LD <= kStageFloats, "the warps' O fits one stage");
      float* sl = reinterpret_cast<float*>(kv_s + (u64)(u % ST) * 2 * SK * D);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = g + 8 * h;
        if (r < R) {
#pragma unroll
          for (int n = 0; n < D / 8; ++n)
            *reinterpret_cast<Flt2*>(sl + (warp * R + r) * LD + n * 8 + 2 * t4) = Flt2{oa[n][2 * h], oa[n][2 * h + 1]};
        }
      }
      __syncthreads();
      for (int v = tid; v < R * D / 4; v += cfg::kThreads) {
        const int r = 4 * v / D, c = 4 * v % D;
        float mm = neg_inf();
#pragma unroll
        for (int w = 0; w < cfg::kWarps; ++w) mm = fmax2(mm, wml[(w * R + r) * 2]);
        Flt4 acc = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int w = 0; w < cfg::kWarps; ++w) {
          const float mw = wml[(w * R + r) * 2];
          const float sw = mw == neg_inf() ? 0.f : exp2_approx(mw - mm);
          const Flt4 o = *reinterpret_cast<const Flt4*>(sl + (w * R + r) * LD + c);
          acc.x = __fmaf_rn(o.x, sw, acc.x);
          acc.y = __fmaf_rn(o.y, sw, acc.y);
          acc.z = __fmaf_rn(o.z, sw, acc.z);
          acc.w = __fmaf_rn(o.w, sw, acc.w);
        }
        *reinterpret_cast<Flt4*>(obuf + r * D + c) = acc;
      }
      __syncthreads();
    } else {

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
#pragma unroll 1
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

    }  // SIMT reduction

#if FERRATTN_LEAN_STAMPS
    if (u + 1 == units) {
      lean_stamp(kStReduced, 0);
      lean_stamp(kStFlags, 0);
    }
#endif
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
        store_release(p.flags + cta, 1u);
      }
    } else {
      if (!finishing) {  // lines 25-36: wait for and merge the CTAs that continue this tile
        const int last = host_last;  // the CTA holding iteration ct.end - 1
        for (int c = cta + 1 + tid; c <= last; c += cfg::kThreads) {  // all flags in parallel
          while (load_acquire(p.flags + c) != 1u) nanosleep(32);
          // each flag has exactly one waiter: re-arm it for the next launch, so that launches need
          // no host-side reset and can be replayed from a CUDA graph
          p.flags[c] = 0u;
        }
        __syncthreads();  // the pollers' acquires order every thread's partial reads after it
#if FERRATTN_LEAN_STAMPS
        if (u + 1 == units) lean_stamp(kStFlags, 0);
#endif
        merge_partials<D, R>(p, cta + 1, last, obuf, fin);
      }
      write_output<T, D, R>(p, ct, obuf, fin);  // lines 38-39
      __syncthreads();
    }
#if FERRATTN_LEAN_STAMPS
    if (u + 1 == units) {
      lean_stamp(kStEnd, 0);
      lean_stamp_value(kStGlobalEnd, lean_globaltimer());
      lean_stamp_value(kStWaitSum, wait_sum);
    }
#endif
    if (u + 1 < units) {
      ct = tile_by_index(p, ct.tile + 1);
      seg_begin = it;
      start_segment();
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
  const TileInfo t = tile_by_index(p, blockIdx.x);
  const int first = cta_of_iter(p, t.start), last = cta_of_iter(p, t.end - 1);
  if (first == last) return;  // one chunk: the main kernel wrote the tile
  for (int idx = threadIdx.x; idx < R * D; idx += cfg::kThreads) obuf[idx] = p.part_o[(u64)first * R * D + idx];
  if (threadIdx.x < 2 * R) fin[threadIdx.x] = p.part_ml[(u64)first * R * 2 + threadIdx.x];
  __syncthreads();
  merge_partials<D, R>(p, first + 1, last, obuf, fin);
  write_output<T, D, R>(p, t, obuf, fin);
}

}  // namespace ferrattn

// ---- Instances: the closed list of (dtype, head dim, rows) -> kernel ---------------------------
#define FERRATTN_LEAN(TN, T, D, R)                                                                   \
  extern "C" __global__ void __launch_bounds__(ferrattn::cfg::kThreads, FERRATTN_LEAN_MIN_CTAS > 0 ? FERRATTN_LEAN_MIN_CTAS : ferrattn::cfg::kMinCtasPerSm) \
      lean_decode_##TN##_d##D##_r##R(const ferrattn::LeanParams p) {                                 \
    ferrattn::lean_decode_body<ferrattn::T, D, R, false>(p);                                         \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(ferrattn::cfg::kThreads, FERRATTN_LEAN_MIN_CTAS > 0 ? FERRATTN_LEAN_MIN_CTAS : ferrattn::cfg::kMinCtasPerSm) \
      lean_decode_paged_##TN##_d##D##_r##R(const ferrattn::LeanParams p) {                           \
    ferrattn::lean_decode_body<ferrattn::T, D, R, true>(p);                                          \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(ferrattn::cfg::kThreads, FERRATTN_LEAN_MIN_CTAS > 0 ? FERRATTN_LEAN_MIN_CTAS : ferrattn::cfg::kMinCtasPerSm) \
      lean_decode_paged_ahead_##TN##_d##D##_r##R(const ferrattn::LeanParams p) {                     \
    ferrattn::lean_decode_body<ferrattn::T, D, R, true, true>(p);                                    \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(ferrattn::cfg::kThreads, FERRATTN_LEAN_MIN_CTAS > 0 ? FERRATTN_LEAN_MIN_CTAS : ferrattn::cfg::kMinCtasPerSm) \
      lean_decode_paged_regs_##TN##_d##D##_r##R(const ferrattn::LeanParams p) {                      \
    ferrattn::lean_decode_body<ferrattn::T, D, R, true, false, true>(p);                             \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(ferrattn::cfg::kThreads)                              \
      lean_combine_##TN##_d##D##_r##R(const ferrattn::LeanParams p) {                                \
    ferrattn::lean_combine_body<ferrattn::T, D, R>(p);                                               \
  }                                                                                                  \
  extern "C" __global__ void lean_smem_##TN##_d##D##_r##R(int* out) {                                \
    out[0] = ferrattn::Smem<D, R>::kBytes;                                                           \
    out[1] = ferrattn::Smem<D, R>::kStages;                                                          \
    out[2] = ferrattn::Smem<D, R>::kBytesAhead;                                                      \
    out[3] = ferrattn::Smem<D, R>::kBytesRegs;                                                       \
    out[4] = D <= ferrattn::kDeepMaxHeadDim ? ferrattn::Smem<D, R, ferrattn::kDeepStages>::kBytesRegs \
                                            : 0;                                                     \
  }
// The four-stage paged ring (REGS with kDeepStages stages), head dim 64 only: one CTA per SM, its
// ring takes more than half of the SM's shared memory. Llama's d128 rows lost 1-2 points with it
// (docs/DEVICE_PATH.md, "Lean paged, sixteenth session"), so no d128 / d256 instance is built.
#define FERRATTN_LEAN_DEEP(TN, T, D, R)                                                              \
  extern "C" __global__ void __launch_bounds__(ferrattn::cfg::kThreads, 1)                           \
      lean_decode_paged_deep_##TN##_d##D##_r##R(const ferrattn::LeanParams p) {                      \
    static_assert(D <= ferrattn::kDeepMaxHeadDim, "the deep ring is built for head dim 64 only");   \
    ferrattn::lean_decode_body<ferrattn::T, D, R, true, false, true, ferrattn::kDeepStages>(p);      \
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

#if FERRATTN_LEAN_STAMPS  // Llama's rows (d128, 4 rows a tile) and Lean-paper's (d64 MHA, 1 row)
FERRATTN_LEAN(f16, F16, 128, 4)
FERRATTN_LEAN(f16, F16, 64, 1)
#else
FERRATTN_LEAN_DIMS(f16, F16)
FERRATTN_LEAN_DIMS(bf16, BF16)
#endif
#define FERRATTN_LEAN_DEEP_ROWS(TN, T) \
  FERRATTN_LEAN_DEEP(TN, T, 64, 1)      \
  FERRATTN_LEAN_DEEP(TN, T, 64, 2)      \
  FERRATTN_LEAN_DEEP(TN, T, 64, 4)      \
  FERRATTN_LEAN_DEEP(TN, T, 64, 8)      \
  FERRATTN_LEAN_DEEP(TN, T, 64, 16)
#if FERRATTN_LEAN_STAMPS
FERRATTN_LEAN_DEEP(f16, F16, 64, 1)
#else
FERRATTN_LEAN_DEEP_ROWS(f16, F16)
FERRATTN_LEAN_DEEP_ROWS(bf16, BF16)
#endif

// Appends a step's new tokens to a K/V cache (the same kernel for f16 and bf16: it moves 16-byte
// vectors). Token i of sequence b, k_new[b, i] ([batch, n_new, heads_kv, head_dim], contiguous),
// goes to position append_start[b] + i while that is below seqlens_k[b]: the step's lengths
// already count its new tokens. Positions map to rows as in the decode (kv_row_of), so the
// paged variant writes through the page table that the decode reads.
namespace ferrattn {
struct AppendParams {
  const u16* k_new;          // [batch, n_new, heads_kv, head_dim]
  const u16* v_new;          // as k_new
  u16* k;                    // the cache (contiguous or page pool)
  u16* v;
  const int* seqlens_k;      // [batch] lengths after this step
  const int* append_start;   // [batch] first position written
  const int* page_table;     // [batch, max_pages] (paged only)
  int batch, n_new, heads_kv, head_dim, max_sk, max_pages, page_shift, reserved;
};

template <bool PAGED>
__device__ __forceinline__ void append_body(const AppendParams& a) {
  LeanParams p{};  // only the fields kv_row_of reads
  p.max_sk = a.max_sk;
  p.page_table = a.page_table;
  p.max_pages = a.max_pages;
  p.page_shift = a.page_shift;
  const int vecs = a.head_dim / 8;  // 16-byte vectors per head row
  const u64 row_vecs = (u64)a.heads_kv * vecs;
  const u64 n = (u64)a.batch * a.n_new * row_vecs;
  for (u64 x = blockIdx.x * (u64)blockDim.x + threadIdx.x; x < n; x += (u64)gridDim.x * blockDim.x) {
    const int b = (int)(x / ((u64)a.n_new * row_vecs));
    const int i = (int)(x / row_vecs % a.n_new);
    const int j = a.append_start[b] + i;
    if (j >= a.seqlens_k[b]) continue;
    const u64 dst = kv_row_of<PAGED>(p, b, j) * row_vecs + x % row_vecs;
    reinterpret_cast<Vec16*>(a.k)[dst] = reinterpret_cast<const Vec16*>(a.k_new)[x];
    reinterpret_cast<Vec16*>(a.v)[dst] = reinterpret_cast<const Vec16*>(a.v_new)[x];
  }
}
}  // namespace ferrattn

extern "C" __global__ void lean_append(const ferrattn::AppendParams a) { ferrattn::append_body<false>(a); }
extern "C" __global__ void lean_append_paged(const ferrattn::AppendParams a) { ferrattn::append_body<true>(a); }

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
