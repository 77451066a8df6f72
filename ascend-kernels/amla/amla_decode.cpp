// AMLA decode (Liao et al., Algorithm 2) for MLA on Ascend 910: BF16, Dk 576, Dv 512, one latent
// KV head, Sq 1 or 2, per-sequence KV lengths. A MIX kernel (1 cube : 2 vector cores): each AI
// Cube core (AIC) runs [C1] and [C2], its two AI Vector cores (AIV) run [V1] and the final
// normalisation on one half of the query rows each; they exchange S and P through a per-core GM
// workspace and synchronise with cross-core flags (mode 2).
//
// Schedule (section 4.1.3, Preload count 2; the host plan's PreloadPipeline::amla_default):
//   cycle c:  Cube  C2(c-2) then C1(c)      Vector  V1(c-1)
// so Preload = C1(0) | C1(1) V1(0), drain = C2(N-2) V1(N-1) | C2(N-1), then Last V.
// V1(t)'s INT32 rescale of O waits for C2(t-1)'s FixP (flag kFlagOAdded): O must already hold
// blocks < t when it is scaled by 2^(n_t - n_{t-1}).
//
// Tiling (section 4.2, amla_config.h): Q/P stripes of 128 x singleK in four 72 KB L1 buffers,
// K/V tiles of 128 x singleK through a 3-buffer L1 ring, 128 x 128 x baseK MMADs with
// double-buffered L0A/L0B/L0C, each 128 x 128 output accumulated over all of K before FixP.
//
// Layouts: GM -> L1 by Nd2Nz gives zN (column blocks of 16, rows of 16 elements inside a
// 16 x 16 fractal); L0A wants zZ (row-block major), L0B nZ (k-block major, a fractal stored
// column by column), so A (Q, P) and B = K^T load without transposing the fractals and B = V
// loads with ifTranspose; L0C is NZ and FixP writes it as ND rows.
//
// Launch (what ascendc_library generates for a mixed kernel, see docs/ASCEND.md): the entry is
// auto_gen_amla_decode_bf16_576_512_kernel(ffts_addr, <the 8 arguments>, overflow_status); the
// wrapper sets the hardware sync base from ffts_addr (aclrtGetHardwareSyncAddr on the host)
// before it calls this function. Block dim = number of AI Cores used; the workspace holds
// kWsBytesPerCore per AI Core.

#if defined(FERRATTN_ASCENDC_DECLS)
#include "ascendc_decls.h"
#else
#include "kernel_operator.h"
#endif
#include "amla_config.h"

using namespace AscendC;
using namespace amla;

namespace {

// -inf for masked keys and the LSE of rows without keys.
constexpr float kNegInf = -__builtin_inff();
// m_0: finite, so that exp(m_0 - m_1) = 0 and -m_0 / ln 2 stays finite (a row whose first
// block holds no visible key keeps m = m_0 and must not produce NaN in the other statistics).
constexpr float kM0 = -1.0e30f;
constexpr float kLog2E = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kExponentUnit = 8388608.0f;  // 2^23, one unit of the FP32 exponent field (Eq. 6)
constexpr uint32_t kFloatsPerBlock = 8;      // 32-byte block
constexpr uint32_t kFloatsPerRepeat = 64;    // 256-byte vector repeat

// Statistics of one vector core's rows in UB (kVecMaxRows floats each).
enum Stat : uint32_t {
  kStM = 0,   // running max m_i
  kStL,       // running sum l_i
  kStN,       // n_i = round(-m_i / ln 2), as float
  kStC,       // compensation c_i (Appendix A)
  kStS16,     // S16_i = BF16(2^n_i e^m_i)
  kStCount,
};
// Per-pass temporaries (kVecRows floats each), after the statistics.
enum Tmp : uint32_t {
  kTmMax = 0,  // row max of the block, then m_new
  kTmSum,      // row sum of the block, then l_new
  kTmUp,       // exp(m_old - m_new)
  kTmN,        // n_new (float)
  kTmS32,
  kTmS16,
  kTmC,
  kTmEps,      // eps, then the N argument
  kTmA,        // scratch
  kTmCount,
};

}  // namespace

class AmlaDecode {
 public:
  __aicore__ inline void Init(GM_ADDR q, GM_ADDR kv, GM_ADDR seqlens, GM_ADDR o_acc, GM_ADDR out, GM_ADDR lse,
                              GM_ADDR ws, GM_ADDR params) {
    // the parameter block is 40 bytes of plain data; read it field by field from GM
    GlobalTensor<uint32_t> prm;
    prm.SetGlobalBuffer(reinterpret_cast<__gm__ uint32_t*>(params), sizeof(AmlaParams) / 4);
    p_.batch = prm.GetValue(0);
    p_.seq_q = prm.GetValue(1);
    p_.heads = prm.GetValue(2);
    p_.max_seq_k = prm.GetValue(3);
    p_.block_k = prm.GetValue(4);
    p_.compensation = prm.GetValue(5);
    p_.causal = prm.GetValue(6);
    union {
      uint32_t u;
      float f;
    } scale;
    scale.u = prm.GetValue(8);
    p_.scale = scale.f;
    rows_ = p_.seq_q * p_.heads;
    q_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t*>(q), uint64_t(p_.batch) * rows_ * kDk);
    kv_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t*>(kv), uint64_t(p_.batch) * p_.max_seq_k * kDk);
    seqlens_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(seqlens), p_.batch);
    o_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(o_acc), uint64_t(p_.batch) * rows_ * kDv);
    o_bits_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(o_acc), uint64_t(p_.batch) * rows_ * kDv);
    out_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t*>(out), uint64_t(p_.batch) * rows_ * kDv);
    lse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(lse), uint64_t(p_.batch) * rows_);
    // In a 1:2 mixed kernel GetBlockIdx() on a vector core runs over [0, 2 x block dim): the
    // AI Core (cube) index is GetBlockIdx() / GetTaskRatio() there, and both vector cores of
    // core i must walk the same sequences and use the same workspace as their cube core.
    if ASCEND_IS_AIV {
      core_ = GetBlockIdx() / GetTaskRatio();
    } else {
      core_ = GetBlockIdx();
    }
    const uint64_t s_elems = uint64_t(kWsDepth) * kMaxRows * kBlockK;
    GM_ADDR base = ws + uint64_t(core_) * kWsBytesPerCore;
    ws_s_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(base), s_elems);
    ws_p_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t*>(base + s_elems * 4), s_elems);
  }

  // ---------------------------------------------------------------- Cube core ([C1], [C2])
  __aicore__ inline void ProcessCube() {
    pipe_.InitBuffer(l1_qp_, kL1QPBufs, kL1BufBytes);
    pipe_.InitBuffer(l1_kv_, kL1KVBufs, kL1BufBytes);
    pipe_.InitBuffer(l0a_, 2, 32 * 1024);
    pipe_.InitBuffer(l0b_, 2, 32 * 1024);
    pipe_.InitBuffer(l0c_, 2, 64 * 1024);
    for (int64_t b = core_; b < int64_t(p_.batch); b += GetBlockNum()) {
      const uint32_t blocks = Blocks(b);
      for (uint32_t c = 0; c < blocks + kPreload; ++c) {
        if (c >= kPreload) {  // C2(c-2): needs P from V1(c-2) of both vector cores
          CrossCoreWaitFlag(kFlagPReady);
          CubeStage(b, c - kPreload, /*c2=*/true);
          CrossCoreSetFlag<2, PIPE_FIX>(kFlagOAdded);
        }
        if (c < blocks) {  // C1(c)
          CubeStage(b, c, /*c2=*/false);
          CrossCoreSetFlag<2, PIPE_FIX>(kFlagSReady);
        }
      }
    }
  }

  // One Cube stage on block t: C1 S = Q K^T (A = Q, B = K^T, K dim = Dk) or C2 O += P V
  // (A = P, B = V, K dim = block tokens), in the section 4.2 tiling.
  __aicore__ inline void CubeStage(int64_t b, uint32_t t, bool c2) {
    const uint32_t w = BlockWidth(b, t);
    const uint32_t n_total = c2 ? kDv : w;
    const uint32_t k_total = c2 ? w : kDk;
    const uint32_t single_k = c2 ? kSingleKC2 : kSingleKC1;
    const uint32_t base_k = c2 ? kBaseKC2 : kBaseKC1;
    const uint32_t stripes = (rows_ + kSingleM - 1) / kSingleM;
    const uint32_t kcs = (k_total + single_k - 1) / single_k;
    const uint32_t slot = t % kWsDepth;
    const uint64_t kv0 = uint64_t(b) * p_.max_seq_k * kDk;
    // A stripes (Q or P) into the Q/P buffers, zN with Align16(rows) rows per column block;
    // Q comes from GM/L2 every block (section 4.2)
    LocalTensor<bfloat16_t> a_l1[kL1QPBufs];
    for (uint32_t m = 0; m < stripes; ++m) {
      const uint32_t mr = Min(kSingleM, rows_ - m * kSingleM);
      for (uint32_t kc = 0; kc < kcs; ++kc) {
        const uint32_t kw = Min(single_k, k_total - kc * single_k);
        LocalTensor<bfloat16_t> a = l1_qp_.AllocTensor<bfloat16_t>();
        Nd2NzParams nz;
        nz.ndNum = 1;
        nz.nValue = uint16_t(mr);
        nz.srcNdMatrixStride = 0;
        nz.dstNzC0Stride = uint16_t(Align16(mr));
        nz.dstNzNStride = 1;
        nz.dstNzMatrixStride = 0;
        if (c2) {
          // P columns up to Align16(kw): V1 wrote zeros past the visible keys, so the K tail
          // of the last fractal is zero in L1 (no stale data enters the sum)
          nz.dValue = Align16(kw);
          nz.srcDValue = kBlockK;
          DataCopy(a, ws_p_[(uint64_t(slot) * kMaxRows + m * kSingleM) * kBlockK + kc * single_k], nz);
        } else {
          nz.dValue = kw;
          nz.srcDValue = kDk;
          DataCopy(a, q_[(uint64_t(b) * rows_ + m * kSingleM) * kDk + kc * single_k], nz);
        }
        l1_qp_.EnQue(a);
        a_l1[m * kcs + kc] = l1_qp_.DeQue<bfloat16_t>();
      }
    }
    for (uint32_t n = 0; n * kBaseN < n_total; ++n) {
      const uint32_t nw = Min(kBaseN, n_total - n * kBaseN);
      LocalTensor<bfloat16_t> b_l1[2];
      for (uint32_t kc = 0; kc < kcs; ++kc) {  // K (or V) tiles through the 3-buffer ring
        const uint32_t kw = Min(single_k, k_total - kc * single_k);
        LocalTensor<bfloat16_t> bt = l1_kv_.AllocTensor<bfloat16_t>();
        Nd2NzParams nz;
        nz.ndNum = 1;
        nz.srcNdMatrixStride = 0;
        nz.srcDValue = kDk;
        nz.dstNzNStride = 1;
        nz.dstNzMatrixStride = 0;
        if (c2) {  // V tile: tokens [t*512 + kc*256, +kw) x dv [n*128, +nw), zN
          nz.nValue = uint16_t(kw);
          nz.dValue = nw;
          nz.dstNzC0Stride = uint16_t(Align16(kw));
          DataCopy(bt, kv_[kv0 + (uint64_t(t) * kBlockK + kc * single_k) * kDk + n * kBaseN], nz);
          if (kw % 16 != 0) {
            // zero the token rows [kw, Align16(kw)) of every column block: the Cube may read
            // the K tail of the last fractal, and stale L1 data (NaN) times P = 0 is NaN
            InitConstValueParams<bfloat16_t> z;
            z.repeatTimes = uint16_t(Align16(nw) / 16);
            z.blockNum = uint16_t(Align16(kw) - kw);
            z.dstGap = uint16_t(kw);
            z.initValue = bfloat16_t{0};
            InitConstValue(bt[kw * 16], z);
          }
        } else {  // K tile: tokens [t*512 + n*128, +nw) x dk [kc*288, +kw), zN
          nz.nValue = uint16_t(nw);
          nz.dValue = kw;
          nz.dstNzC0Stride = uint16_t(Align16(nw));
          DataCopy(bt, kv_[kv0 + (uint64_t(t) * kBlockK + n * kBaseN) * kDk + kc * single_k], nz);
        }
        l1_kv_.EnQue(bt);
        b_l1[kc] = l1_kv_.DeQue<bfloat16_t>();
      }
      for (uint32_t m = 0; m < stripes; ++m) {
        const uint32_t mr = Min(kSingleM, rows_ - m * kSingleM);
        const uint32_t m_align = Align16(mr), n_align = Align16(nw);
        LocalTensor<float> acc = l0c_.AllocTensor<float>();
        bool first = true;
        for (uint32_t kc = 0; kc < kcs; ++kc) {
          const uint32_t kw = Min(single_k, k_total - kc * single_k);
          const uint32_t k_rows = c2 ? Align16(kw) : n_align;  // rows per column block of B in L1
          for (uint32_t ks = 0; ks * base_k < kw; ++ks) {
            const uint32_t k0 = ks * base_k;  // multiple of 16
            const uint32_t bk = Min(base_k, kw - k0);
            const uint32_t k1 = Align16(bk) / 16;
            LocalTensor<bfloat16_t> a0 = l0a_.AllocTensor<bfloat16_t>();
            LocalTensor<bfloat16_t> b0 = l0b_.AllocTensor<bfloat16_t>();
            // A: per 16-row block, the k1 fractals of that row block (m_align / 16 fractals
            // apart in zN) to consecutive fractals of L0A (zZ)
            for (uint32_t mb = 0; mb < m_align / 16; ++mb) {
              LoadData2DParams la;
              la.startIndex = 0;
              la.repeatTimes = uint8_t(k1);
              la.srcStride = uint16_t(m_align / 16);
              la.sid = 0;
              la.dstGap = 0;
              la.ifTranspose = false;
              la.addrMode = 0;
              LoadData(a0[mb * k1 * 256], a_l1[m * kcs + kc][(k0 / 16) * m_align * 16 + mb * 256], la);
            }
            LoadData2DParams lb;
            lb.startIndex = 0;
            lb.sid = 0;
            lb.dstGap = 0;
            lb.addrMode = 0;
            if (c2) {
              // B = V: fractal (kb, nb) sits at nb x Align16(kw)/16 + kb in zN and holds V rows;
              // L0B (nZ) wants it transposed, n/16 fractals per k block
              for (uint32_t kb = 0; kb < k1; ++kb) {
                lb.repeatTimes = uint8_t(n_align / 16);
                lb.srcStride = uint16_t(k_rows / 16);
                lb.ifTranspose = true;
                LoadData(b0[kb * (n_align / 16) * 256], b_l1[kc][(k0 / 16 + kb) * 256], lb);
              }
            } else {
              // B = K^T: the zN fractals of K (16 tokens x 16 dims, row by row) are already
              // nZ fractals of K^T, and the k1 x n/16 fractals from dim k0 are contiguous
              lb.repeatTimes = uint8_t(k1 * (n_align / 16));
              lb.srcStride = 1;
              lb.ifTranspose = false;
              LoadData(b0, b_l1[kc][(k0 / 16) * k_rows * 16], lb);
            }
            l0a_.EnQue(a0);
            l0b_.EnQue(b0);
            a0 = l0a_.DeQue<bfloat16_t>();
            b0 = l0b_.DeQue<bfloat16_t>();
            // FP32 accumulation in L0C over the whole K extent (section 4.2 "FixP")
            MmadParams mp;
            mp.m = uint16_t(mr);
            mp.n = uint16_t(nw);
            mp.k = uint16_t(bk);
            mp.cmatrixInitVal = first;
            Mmad(acc, a0, b0, mp);
            first = false;
            l0a_.FreeTensor(a0);
            l0b_.FreeTensor(b0);
          }
        }
        l0c_.EnQue(acc);
        acc = l0c_.DeQue<float>();
        FixpipeParamsV220 fp;
        fp.nSize = uint16_t(nw);
        fp.mSize = uint16_t(mr);
        fp.srcStride = uint16_t(m_align);
        fp.dstStride = c2 ? kDv : kBlockK;  // S rows keep the block pitch the vector side reads
        fp.reluEn = false;
        if (c2) {  // Alg. 2 line 20: O += O_i, AtomicAdd<FP32> in GM
          SetAtomicAdd<float>();
          Fixpipe<float, float, CFG_ROW_MAJOR>(o_[(uint64_t(b) * rows_ + m * kSingleM) * kDv + n * kBaseN], acc, fp);
          SetAtomicNone();
        } else {  // line 6: S to the workspace
          Fixpipe<float, float, CFG_ROW_MAJOR>(ws_s_[(uint64_t(slot) * kMaxRows + m * kSingleM) * kBlockK + n * kBaseN],
                                              acc, fp);
        }
        l0c_.FreeTensor(acc);
      }
      for (uint32_t kc = 0; kc < kcs; ++kc) l1_kv_.FreeTensor(b_l1[kc]);
    }
    for (uint32_t i = 0; i < stripes * kcs; ++i) l1_qp_.FreeTensor(a_l1[i]);
  }

  // ---------------------------------------------------------------- Vector cores ([V1], last V)
  __aicore__ inline void ProcessVector() {
    pipe_.InitBuffer(ub_s_, 2, kVecRows * kBlockK * 4);      // S / exp(S - m) / O (FP32)
    pipe_.InitBuffer(ub_p_, 2, kVecRows * kBlockK * 2);      // P / O (BF16)
    pipe_.InitBuffer(ub_lse_, 2, kVecRows * 4);
    pipe_.InitBuffer(ub_n_, kVecRows * kNBrcb * 4);          // N broadcast to kNBrcb words per row
    pipe_.InitBuffer(ub_stat_, (kStCount * kVecMaxRows + kTmCount * kVecRows) * 4);
    pipe_.InitBuffer(ub_fold_, kVecRows * (kBlockK / 2) * 4);  // row reductions
    pipe_.InitBuffer(ub_brcb_, kVecRows * kFloatsPerBlock * 4);
    const uint32_t half = (rows_ + 1) / 2;
    r0_ = GetSubBlockIdx() == 0 ? 0 : half;
    r1_ = GetSubBlockIdx() == 0 ? half : rows_;
    SetFlag<HardEvent::MTE3_V>(kEventN);  // nbuf starts free
    for (int64_t b = core_; b < int64_t(p_.batch); b += GetBlockNum()) {
      const uint32_t blocks = Blocks(b);
      InitStats();
      for (uint32_t t = 0; t < blocks; ++t) {
        CrossCoreWaitFlag(kFlagSReady);
        if (t > 0) CrossCoreWaitFlag(kFlagOAdded);  // C2(t-1) is in O
        V1(b, t);
        CrossCoreSetFlag<2, PIPE_MTE3>(kFlagPReady);
      }
      if (blocks > 0) CrossCoreWaitFlag(kFlagOAdded);  // C2(N-1)
      LastV(b, blocks);
    }
    WaitFlag<HardEvent::MTE3_V>(kEventN);
  }

  // Alg. 2 lines 7-17 for this core's rows of block t, kVecRows rows per pass, every step one
  // vector instruction over all rows of the pass.
  __aicore__ inline void V1(int64_t b, uint32_t t) {
    const uint32_t w = BlockWidth(b, t);
    const uint32_t slot = t % kWsDepth;
    const uint32_t start = t * kBlockK;
    for (uint32_t r = r0_; r < r1_; r += kVecRows) {
      const uint32_t nr = Min(kVecRows, r1_ - r);
      const uint32_t lr = r - r0_;
      // S rows at the block pitch; DataCopyPad moves exactly w FP32 per row (any w)
      LocalTensor<float> s = ub_s_.AllocTensor<float>();
      DataCopyExtParams in;
      in.blockCount = uint16_t(nr);
      in.blockLen = w * 4;
      in.srcStride = (kBlockK - w) * 4;
      in.dstStride = (kBlockK - Align8(w)) / kFloatsPerBlock;
      in.rsv = 0;
      DataCopyPadExtParams<float> pad;
      pad.isPad = false;
      DataCopyPad(s, ws_s_[(uint64_t(slot) * kMaxRows + r) * kBlockK], in, pad);
      ub_s_.EnQue(s);
      s = ub_s_.DeQue<float>();
      Muls(s, s, p_.scale, int32_t(nr * kBlockK));  // line 7: S / sqrt(Dk)
      // keys past the row's causal end or past the block: -inf (exp gives 0, P and the sums
      // see nothing); a row without any visible key in this block keeps its state below
      uint32_t inactive = 0;
      for (uint32_t i = 0; i < nr; ++i) {
        const uint32_t end = VisibleEnd(b, r + i);
        const uint32_t vis = end <= start ? 0 : Min(w, end - start);
        if (vis == 0) inactive |= 1u << i;
        if (vis < kBlockK) MaskFrom(s[i * kBlockK], vis);
      }
      LocalTensor<float> st = ub_stat_.Get<float>();
      LocalTensor<float> tm = st[kStCount * kVecMaxRows];
      LocalTensor<float> bc = ub_brcb_.Get<float>();
      RowReduce(s, tm[kTmMax * kVecRows], nr, /*sum=*/false);
      Max(tm[kTmMax * kVecRows], tm[kTmMax * kVecRows], st[kStM * kVecMaxRows + lr], int32_t(nr));  // m_new
      Sub(tm[kTmUp * kVecRows], st[kStM * kVecMaxRows + lr], tm[kTmMax * kVecRows], int32_t(nr));
      Exp(tm[kTmUp * kVecRows], tm[kTmUp * kVecRows], int32_t(nr));  // M_up = exp(m_old - m_new)
      // line 8: P = exp(S - m_new), l = l M_up + rowsum P
      Brcb(bc, tm[kTmMax * kVecRows], uint8_t((nr + 7) / 8), BrcbRepeatParams(1, 8));
      RowBroadcast(s, bc, nr, /*mul=*/false);
      Exp(s, s, int32_t(nr * kBlockK));
      RowReduce(s, tm[kTmSum * kVecRows], nr, /*sum=*/true);
      Mul(tm[kTmA * kVecRows], st[kStL * kVecMaxRows + lr], tm[kTmUp * kVecRows], int32_t(nr));
      Add(tm[kTmSum * kVecRows], tm[kTmA * kVecRows], tm[kTmSum * kVecRows], int32_t(nr));
      // n = round(-m / ln 2) (CAST_ROUND, as the official kernels), S32 = exp(ln 2 (n + m / ln 2))
      Muls(tm[kTmN * kVecRows], tm[kTmMax * kVecRows], -kLog2E, int32_t(nr));
      Cast(tm[kTmN * kVecRows], tm[kTmN * kVecRows], RoundMode::CAST_ROUND, nr);
      Muls(tm[kTmA * kVecRows], tm[kTmMax * kVecRows], kLog2E, int32_t(nr));
      Add(tm[kTmA * kVecRows], tm[kTmN * kVecRows], tm[kTmA * kVecRows], int32_t(nr));
      Muls(tm[kTmA * kVecRows], tm[kTmA * kVecRows], kLn2, int32_t(nr));
      Exp(tm[kTmS32 * kVecRows], tm[kTmA * kVecRows], int32_t(nr));  // line 9
      // line 10: S16 = BF16(S32), round half away (CAST_ROUND, as the official kernels)
      LocalTensor<bfloat16_t> s16b = tm[kTmEps * kVecRows].ReinterpretCast<bfloat16_t>();
      Cast(s16b, tm[kTmS32 * kVecRows], RoundMode::CAST_ROUND, nr);
      Cast(tm[kTmS16 * kVecRows], s16b, RoundMode::CAST_NONE, nr);
      // Appendix A: c = r_i / r'_i = S16 / S32 (line 11 as printed has the reciprocal)
      if (p_.compensation != 0) {
        Div(tm[kTmC * kVecRows], tm[kTmS16 * kVecRows], tm[kTmS32 * kVecRows], int32_t(nr));
      } else {
        Duplicate(tm[kTmC * kVecRows], 1.0f, int32_t(nr));
      }
      // line 11: eps = 1.5 (c_i / c_{i-1} - 1)
      Div(tm[kTmEps * kVecRows], tm[kTmC * kVecRows], st[kStC * kVecMaxRows + lr], int32_t(nr));
      Adds(tm[kTmEps * kVecRows], tm[kTmEps * kVecRows], -1.0f, int32_t(nr));
      Muls(tm[kTmEps * kVecRows], tm[kTmEps * kVecRows], 1.5f, int32_t(nr));
      // line 12: P = BF16(P S16), round to nearest even (CAST_RINT)
      Brcb(bc, tm[kTmS16 * kVecRows], uint8_t((nr + 7) / 8), BrcbRepeatParams(1, 8));
      RowBroadcast(s, bc, nr, /*mul=*/true);
      LocalTensor<bfloat16_t> pb = ub_p_.AllocTensor<bfloat16_t>();
      Cast(pb, s, RoundMode::CAST_RINT, nr * kBlockK);
      ub_s_.FreeTensor(s);
      ub_p_.EnQue(pb);
      pb = ub_p_.DeQue<bfloat16_t>();
      DataCopy(ws_p_[(uint64_t(slot) * kMaxRows + r) * kBlockK], pb, nr * kBlockK);
      ub_p_.FreeTensor(pb);
      // lines 13-14: N = Cast_to_int32((max(n_i - n_{i-1}, -30) + eps + 1e-6) 2^23), CAST_ROUND
      Sub(tm[kTmA * kVecRows], tm[kTmN * kVecRows], st[kStN * kVecMaxRows + lr], int32_t(nr));
      Maxs(tm[kTmA * kVecRows], tm[kTmA * kVecRows], -30.0f, int32_t(nr));
      Add(tm[kTmA * kVecRows], tm[kTmA * kVecRows], tm[kTmEps * kVecRows], int32_t(nr));
      Adds(tm[kTmA * kVecRows], tm[kTmA * kVecRows], 1.0e-6f, int32_t(nr));
      Muls(tm[kTmA * kVecRows], tm[kTmA * kVecRows], kExponentUnit, int32_t(nr));
      LocalTensor<int32_t> nint = tm[kTmEps * kVecRows].ReinterpretCast<int32_t>();
      Cast(nint, tm[kTmA * kVecRows], RoundMode::CAST_ROUND, nr);
      if (inactive != 0) {
        // rows whose causal window ends before this block (Sq 2, at most one block per
        // sequence): keep their state and add nothing to O
        SetFlag<HardEvent::V_S>(0);
        WaitFlag<HardEvent::V_S>(0);
        for (uint32_t i = 0; i < nr; ++i) {
          if ((inactive >> i & 1u) == 0) continue;
          tm.SetValue(kTmMax * kVecRows + i, st.GetValue(kStM * kVecMaxRows + lr + i));
          tm.SetValue(kTmSum * kVecRows + i, st.GetValue(kStL * kVecMaxRows + lr + i));
          tm.SetValue(kTmN * kVecRows + i, st.GetValue(kStN * kVecMaxRows + lr + i));
          tm.SetValue(kTmC * kVecRows + i, st.GetValue(kStC * kVecMaxRows + lr + i));
          tm.SetValue(kTmS16 * kVecRows + i, st.GetValue(kStS16 * kVecMaxRows + lr + i));
          nint.SetValue(i, 0);
        }
        SetFlag<HardEvent::S_V>(0);
        WaitFlag<HardEvent::S_V>(0);
      }
      // the new statistics (x 1.0: an exact vector copy)
      Muls(st[kStM * kVecMaxRows + lr], tm[kTmMax * kVecRows], 1.0f, int32_t(nr));
      Muls(st[kStL * kVecMaxRows + lr], tm[kTmSum * kVecRows], 1.0f, int32_t(nr));
      Muls(st[kStN * kVecMaxRows + lr], tm[kTmN * kVecRows], 1.0f, int32_t(nr));
      Muls(st[kStC * kVecMaxRows + lr], tm[kTmC * kVecRows], 1.0f, int32_t(nr));
      Muls(st[kStS16 * kVecMaxRows + lr], tm[kTmS16 * kVecRows], 1.0f, int32_t(nr));
      if (t > 0) {
        // lines 15-17: O = AS_FP32(AS_INT32(O) + N), AtomicAdd<INT32> on every word of the row.
        // nbuf is a TBuf: the vector core may overwrite it only after the previous atomic add
        // has read it (MTE3 -> V), and MTE3 may read it only after Brcb wrote it (V -> MTE3).
        LocalTensor<int32_t> nbuf = ub_n_.Get<int32_t>();
        WaitFlag<HardEvent::MTE3_V>(kEventN);
        for (uint32_t k = 0; k < kNBrcb / kFloatsPerBlock; ++k) {
          Brcb(nbuf[k * kFloatsPerBlock], nint, uint8_t((nr + 7) / 8),
               BrcbRepeatParams(kNBrcb / kFloatsPerBlock, kNBrcb));
        }
        SetFlag<HardEvent::V_MTE3>(kEventN);
        WaitFlag<HardEvent::V_MTE3>(kEventN);
        SetAtomicAdd<int32_t>();
        for (uint32_t k = 0; k < kDv / kNBrcb; ++k) {
          DataCopy(o_bits_[(uint64_t(b) * rows_ + r) * kDv + k * kNBrcb], nbuf,
                   DataCopyParams(uint16_t(nr), uint16_t(kNBrcb / kFloatsPerBlock), 0,
                                  uint16_t((kDv - kNBrcb) / kFloatsPerBlock)));
        }
        SetAtomicNone();
        SetFlag<HardEvent::MTE3_V>(kEventN);
      }
    }
  }

  // Line 22 and the LSE: O / (l S16) -> BF16, lse = m + ln l, rows without keys O = 0, -inf.
  __aicore__ inline void LastV(int64_t b, uint32_t blocks) {
    LocalTensor<float> st = ub_stat_.Get<float>();
    LocalTensor<float> tm = st[kStCount * kVecMaxRows];
    LocalTensor<float> bc = ub_brcb_.Get<float>();
    for (uint32_t r = r0_; r < r1_; r += kVecRows) {
      const uint32_t nr = Min(kVecRows, r1_ - r);
      const uint32_t lr = r - r0_;
      LocalTensor<float> o = ub_s_.AllocTensor<float>();
      DataCopy(o, o_[(uint64_t(b) * rows_ + r) * kDv], nr * kDv);
      ub_s_.EnQue(o);
      o = ub_s_.DeQue<float>();
      Mul(tm[kTmA * kVecRows], st[kStL * kVecMaxRows + lr], st[kStS16 * kVecMaxRows + lr], int32_t(nr));
      Brcb(bc, tm[kTmA * kVecRows], uint8_t((nr + 7) / 8), BrcbRepeatParams(1, 8));
      for (uint32_t j = 0; j < kDv / kFloatsPerRepeat; ++j) {
        Div(o[j * kFloatsPerRepeat], o[j * kFloatsPerRepeat], bc, kFloatsPerRepeat, uint8_t(nr),
            BinaryRepeatParams(1, 1, 0, kDv / kFloatsPerBlock, kDv / kFloatsPerBlock, 1));
      }
      LocalTensor<float> lse = ub_lse_.AllocTensor<float>();
      Ln(lse, st[kStL * kVecMaxRows + lr], int32_t(nr));
      Add(lse, lse, st[kStM * kVecMaxRows + lr], int32_t(nr));
      uint64_t empty[2] = {0, 0};  // rows without any key: O = 0, LSE = -inf
      for (uint32_t i = 0; i < nr; ++i) {
        if (blocks == 0 || VisibleEnd(b, r + i) == 0) {
          Duplicate(o[i * kDv], 0.0f, int32_t(kDv));
          empty[0] |= uint64_t(1) << i;
        }
      }
      if (empty[0] != 0) Duplicate(lse, kNegInf, empty, 1, 1, 8);
      LocalTensor<bfloat16_t> ob = ub_p_.AllocTensor<bfloat16_t>();
      Cast(ob, o, RoundMode::CAST_RINT, nr * kDv);
      ub_s_.FreeTensor(o);
      ub_p_.EnQue(ob);
      ob = ub_p_.DeQue<bfloat16_t>();
      DataCopy(out_[(uint64_t(b) * rows_ + r) * kDv], ob, nr * kDv);
      ub_p_.FreeTensor(ob);
      // LSE through UB with DataCopyPad: exactly nr x 4 bytes, so the neighbouring entries of
      // the other vector core and of other sequences are never written
      ub_lse_.EnQue(lse);
      lse = ub_lse_.DeQue<float>();
      DataCopyExtParams outp;
      outp.blockCount = 1;
      outp.blockLen = nr * 4;
      outp.srcStride = 0;
      outp.dstStride = 0;
      outp.rsv = 0;
      DataCopyPad(lse_[uint64_t(b) * rows_ + r], lse, outp);
      ub_lse_.FreeTensor(lse);
    }
  }

 private:
  __aicore__ static inline uint32_t Min(uint32_t a, uint32_t b) { return a < b ? a : b; }
  __aicore__ static inline uint32_t Align16(uint32_t x) { return (x + 15) / 16 * 16; }
  __aicore__ static inline uint32_t Align8(uint32_t x) { return (x + 7) / 8 * 8; }

  // Row max or row sum of the nr x kBlockK tile x: three halving folds 512 -> 64 (one
  // instruction over all rows each), then one WholeReduce per row. The sum's order is part of
  // the numerics (sim/numerics.rs reproduces it).
  __aicore__ inline void RowReduce(const LocalTensor<float>& x, const LocalTensor<float>& dst, uint32_t nr, bool sum) {
    LocalTensor<float> f = ub_fold_.Get<float>();
    constexpr uint32_t half = kBlockK / 2;
    constexpr uint8_t x_rep = kBlockK / kFloatsPerBlock, f_rep = half / kFloatsPerBlock;
    for (uint32_t j = 0; j < half / kFloatsPerRepeat; ++j) {  // 512 -> 256
      const uint32_t c = j * kFloatsPerRepeat;
      const BinaryRepeatParams rp(1, 1, 1, f_rep, x_rep, x_rep);
      if (sum) {
        Add(f[c], x[c], x[half + c], kFloatsPerRepeat, uint8_t(nr), rp);
      } else {
        Max(f[c], x[c], x[half + c], kFloatsPerRepeat, uint8_t(nr), rp);
      }
    }
    for (uint32_t width = half / 2; width >= kFloatsPerRepeat; width /= 2) {  // 256 -> 64
      for (uint32_t j = 0; j < width / kFloatsPerRepeat; ++j) {
        const uint32_t c = j * kFloatsPerRepeat;
        const BinaryRepeatParams rp(1, 1, 1, f_rep, f_rep, f_rep);
        if (sum) {
          Add(f[c], f[c], f[width + c], kFloatsPerRepeat, uint8_t(nr), rp);
        } else {
          Max(f[c], f[c], f[width + c], kFloatsPerRepeat, uint8_t(nr), rp);
        }
      }
    }
    if (sum) {
      WholeReduceSum(dst, f, int32_t(kFloatsPerRepeat), int32_t(nr), 1, 1, f_rep);
    } else {
      WholeReduceMax(dst, f, int32_t(kFloatsPerRepeat), int32_t(nr), 1, 1, f_rep, ReduceOrder::ORDER_ONLY_VALUE);
    }
  }

  // Sets row[vis, kBlockK) to -inf from 32-byte aligned addresses only (vector operands must be
  // aligned): a bit-masked repeat for the 64 lanes holding vis, then whole repeats.
  __aicore__ inline void MaskFrom(const LocalTensor<float>& row, uint32_t vis) {
    const uint32_t c0 = vis / kFloatsPerRepeat * kFloatsPerRepeat;
    uint64_t lanes[2] = {~uint64_t(0) << (vis % kFloatsPerRepeat), 0};
    Duplicate(row[c0], kNegInf, lanes, 1, 1, 8);
    if (c0 + kFloatsPerRepeat < kBlockK) {
      Duplicate(row[c0 + kFloatsPerRepeat], kNegInf, int32_t(kBlockK - c0 - kFloatsPerRepeat));
    }
  }

  // x[i][:] -= bc[i] (or *=): the per-row scalar as one 32-byte block (Brcb), read with
  // block stride 0 across the repeat and one block per row.
  __aicore__ inline void RowBroadcast(const LocalTensor<float>& x, const LocalTensor<float>& bc, uint32_t nr, bool mul) {
    constexpr uint8_t x_rep = kBlockK / kFloatsPerBlock;
    const BinaryRepeatParams rp(1, 1, 0, x_rep, x_rep, 1);
    for (uint32_t j = 0; j < kBlockK / kFloatsPerRepeat; ++j) {
      const uint32_t c = j * kFloatsPerRepeat;
      if (mul) {
        Mul(x[c], x[c], bc, kFloatsPerRepeat, uint8_t(nr), rp);
      } else {
        Sub(x[c], x[c], bc, kFloatsPerRepeat, uint8_t(nr), rp);
      }
    }
  }

  __aicore__ inline uint32_t SeqK(int64_t b) const { return uint32_t(seqlens_.GetValue(b)); }
  __aicore__ inline uint32_t Blocks(int64_t b) const { return (SeqK(b) + kBlockK - 1) / kBlockK; }
  __aicore__ inline uint32_t BlockWidth(int64_t b, uint32_t t) const { return Min(kBlockK, SeqK(b) - t * kBlockK); }
  // bottom-right causal window of row = token * heads + head
  __aicore__ inline uint32_t VisibleEnd(int64_t b, uint32_t row) const {
    const uint32_t sk = SeqK(b);
    if (p_.causal == 0) return sk;
    const int64_t end = int64_t(row / p_.heads) + int64_t(sk) - int64_t(p_.seq_q) + 1;
    return end < 0 ? 0 : (end > int64_t(sk) ? sk : uint32_t(end));
  }
  __aicore__ inline void InitStats() {
    LocalTensor<float> st = ub_stat_.Get<float>();
    Duplicate(st[kStM * kVecMaxRows], kM0, int32_t(kVecMaxRows));
    Duplicate(st[kStL * kVecMaxRows], 0.0f, int32_t(kVecMaxRows));
    Duplicate(st[kStN * kVecMaxRows], 0.0f, int32_t(kVecMaxRows));
    Duplicate(st[kStC * kVecMaxRows], 1.0f, int32_t(kVecMaxRows));
    Duplicate(st[kStS16 * kVecMaxRows], 1.0f, int32_t(kVecMaxRows));
  }

  AmlaParams p_;
  int64_t core_ = 0;
  uint32_t rows_ = 0, r0_ = 0, r1_ = 0;
  TPipe pipe_;
  GlobalTensor<bfloat16_t> q_, kv_, out_, ws_p_;
  GlobalTensor<float> o_, lse_, ws_s_;
  GlobalTensor<int32_t> o_bits_, seqlens_;
  TQue<TPosition::A1, 4> l1_qp_;
  TQue<TPosition::B1, 3> l1_kv_;
  TQue<TPosition::A2, 2> l0a_;
  TQue<TPosition::B2, 2> l0b_;
  TQue<TPosition::CO1, 2> l0c_;
  TQue<TPosition::VECIN, 2> ub_s_;
  TQue<TPosition::VECOUT, 2> ub_p_;
  TQue<TPosition::VECOUT, 2> ub_lse_;
  TBuf<TPosition::VECCALC> ub_n_, ub_stat_, ub_fold_, ub_brcb_;
};

extern "C" __global__ __aicore__ void amla_decode_bf16_576_512(GM_ADDR q, GM_ADDR kv, GM_ADDR seqlens,
                                                               GM_ADDR o_acc, GM_ADDR out, GM_ADDR lse,
                                                               GM_ADDR workspace, GM_ADDR params) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
  AmlaDecode op;
  op.Init(q, kv, seqlens, o_acc, out, lse, workspace, params);
  if ASCEND_IS_AIC {
    op.ProcessCube();
  } else {
    op.ProcessVector();
  }
}
