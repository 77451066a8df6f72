// AMLA decode (Liao et al., Algorithm 2) for MLA on Ascend 910: BF16, Dk 576, Dv 512, one latent
// KV head, Sq 1 or 2, per-sequence KV lengths. A MIX kernel: each AI Cube core (AIC) runs [C1]
// and [C2], its two AI Vector cores (AIV) run [V1] and the final normalisation; they exchange S
// and P through a per-core GM workspace and synchronise with cross-core flags.
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

#if defined(FERRATTN_ASCENDC_DECLS)
#include "ascendc_decls.h"
#else
#include "kernel_operator.h"
#endif
#include "amla_config.h"

using namespace AscendC;
using namespace amla;

class AmlaDecode {
 public:
  __aicore__ void Init(GM_ADDR q, GM_ADDR kv, GM_ADDR seqlens, GM_ADDR o_acc, GM_ADDR out, GM_ADDR lse,
                       GM_ADDR ws, GM_ADDR params) {
    auto* prm = reinterpret_cast<__gm__ AmlaParams*>(params);
    p_ = *prm;
    rows_ = p_.seq_q * p_.heads;
    q_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t*>(q), uint64_t(p_.batch) * rows_ * kDk);
    kv_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t*>(kv), uint64_t(p_.batch) * p_.max_seq_k * kDk);
    seqlens_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(seqlens), p_.batch);
    o_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(o_acc), uint64_t(p_.batch) * rows_ * kDv);
    o_bits_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(o_acc), uint64_t(p_.batch) * rows_ * kDv);
    out_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t*>(out), uint64_t(p_.batch) * rows_ * kDv);
    lse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(lse), uint64_t(p_.batch) * rows_);
    // workspace of this core: kWsDepth blocks of S (FP32) then kWsDepth blocks of P (BF16)
    const uint64_t s_elems = uint64_t(kWsDepth) * kMaxRows * kBlockK;
    auto* base = ws + GetBlockIdx() * (s_elems * 4 + s_elems * 2);
    ws_s_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(base), s_elems);
    ws_p_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t*>(base + s_elems * 4), s_elems);
  }

  // ---------------------------------------------------------------- Cube core ([C1], [C2])
  __aicore__ void ProcessCube() {
    pipe_.InitBuffer(l1_qp_, kL1QPBufs, kL1BufBytes);
    pipe_.InitBuffer(l1_kv_, kL1KVBufs, kL1BufBytes);
    pipe_.InitBuffer(l0a_, 2, 32 * 1024);
    pipe_.InitBuffer(l0b_, 2, 32 * 1024);
    pipe_.InitBuffer(l0c_, 2, 64 * 1024);
    for (int64_t b = GetBlockIdx(); b < p_.batch; b += GetBlockNum()) {
      const uint32_t blocks = Blocks(b);
      for (uint32_t c = 0; c < blocks + kPreload; ++c) {
        if (c >= kPreload) {  // C2(c-2): needs P from V1(c-2)
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

  // One Cube stage on block t: C1 S = Q K^T (A = Q, B = K, K dim = Dk) or C2 O += P V
  // (A = P, B = V^T, K dim = block tokens), in the section 4.2 tiling.
  __aicore__ void CubeStage(int64_t b, uint32_t t, bool c2) {
    const uint32_t w = BlockWidth(b, t);
    const uint32_t n_total = c2 ? kDv : w;
    const uint32_t k_total = c2 ? w : kDk;
    const uint32_t single_k = c2 ? kSingleKC2 : kSingleKC1;
    const uint32_t base_k = c2 ? kBaseKC2 : kBaseKC1;
    const uint32_t stripes = (rows_ + kSingleM - 1) / kSingleM;
    const uint32_t kcs = (k_total + single_k - 1) / single_k;
    const uint32_t slot = t % kWsDepth;
    // A stripes (Q or P) into the Q/P buffers; Q comes from GM/L2 every block (section 4.2)
    LocalTensor<bfloat16_t> a_l1[kL1QPBufs];
    for (uint32_t m = 0; m < stripes; ++m) {
      for (uint32_t kc = 0; kc < kcs; ++kc) {
        const uint32_t mr = Min(kSingleM, rows_ - m * kSingleM);
        const uint32_t kw = Min(single_k, k_total - kc * single_k);
        LocalTensor<bfloat16_t> a = l1_qp_.AllocTensor<bfloat16_t>();
        Nd2NzParams nz{1, uint16_t(mr), uint16_t(kw), 0, uint16_t(c2 ? kBlockK : kDk), uint16_t(Align16(mr)), 1, 0};
        if (c2) {
          DataCopy(a, ws_p_[(uint64_t(slot) * kMaxRows + m * kSingleM) * kBlockK + kc * single_k], nz);
        } else {
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
        const uint64_t kv0 = uint64_t(b) * p_.max_seq_k * kDk;
        if (c2) {  // V^T tile: tokens [t*512 + kc*256, +kw) x dv [n*128, +nw)
          Nd2NzParams nz{1, uint16_t(kw), uint16_t(nw), 0, uint16_t(kDk), uint16_t(Align16(kw)), 1, 0};
          DataCopy(bt, kv_[kv0 + (uint64_t(t) * kBlockK + kc * single_k) * kDk + n * kBaseN], nz);
        } else {  // K tile: tokens [t*512 + n*128, +nw) x dk [kc*288, +kw)
          Nd2NzParams nz{1, uint16_t(nw), uint16_t(kw), 0, uint16_t(kDk), uint16_t(Align16(nw)), 1, 0};
          DataCopy(bt, kv_[kv0 + (uint64_t(t) * kBlockK + n * kBaseN) * kDk + kc * single_k], nz);
        }
        l1_kv_.EnQue(bt);
        b_l1[kc] = l1_kv_.DeQue<bfloat16_t>();
      }
      for (uint32_t m = 0; m < stripes; ++m) {
        const uint32_t mr = Min(kSingleM, rows_ - m * kSingleM);
        LocalTensor<float> acc = l0c_.AllocTensor<float>();
        bool first = true;
        for (uint32_t kc = 0; kc < kcs; ++kc) {
          const uint32_t kw = Min(single_k, k_total - kc * single_k);
          for (uint32_t ks = 0; ks * base_k < kw; ++ks) {
            const uint32_t bk = Min(base_k, kw - ks * base_k);
            LocalTensor<bfloat16_t> a0 = l0a_.AllocTensor<bfloat16_t>();
            LocalTensor<bfloat16_t> b0 = l0b_.AllocTensor<bfloat16_t>();
            LoadData(a0, a_l1[m * kcs + kc][ks * base_k * 16],
                     LoadData2DParams{0, uint8_t(Align16(bk) / 16), uint16_t(Align16(mr) / 16), 0, 0, false, 0});
            LoadData(b0, b_l1[kc][ks * base_k * 16],
                     LoadData2DParams{0, uint8_t(Align16(bk) / 16), uint16_t(Align16(nw) / 16), 0, 0, !c2, 0});
            l0a_.EnQue(a0);
            l0b_.EnQue(b0);
            a0 = l0a_.DeQue<bfloat16_t>();
            b0 = l0b_.DeQue<bfloat16_t>();
            // FP32 accumulation in L0C over the whole K extent (section 4.2 "FixP")
            Mmad(acc, a0, b0, MmadParams{uint16_t(mr), uint16_t(nw), uint16_t(bk), first});
            first = false;
            l0a_.FreeTensor(a0);
            l0b_.FreeTensor(b0);
          }
        }
        l0c_.EnQue(acc);
        acc = l0c_.DeQue<float>();
        FixpipeParamsV220 fp{uint16_t(nw), uint16_t(mr), uint16_t(Align16(mr)), c2 ? kDv : kBlockK};
        if (c2) {  // Alg. 2 line 20: O += O_i, AtomicAdd<FP32> in GM
          SetAtomicAdd<float>();
          Fixpipe(o_[(uint64_t(b) * rows_ + m * kSingleM) * kDv + n * kBaseN], acc, fp);
          SetAtomicNone();
        } else {  // line 6: S to the workspace
          Fixpipe(ws_s_[(uint64_t(slot) * kMaxRows + m * kSingleM) * kBlockK + n * kBaseN], acc, fp);
        }
        l0c_.FreeTensor(acc);
      }
      for (uint32_t kc = 0; kc < kcs; ++kc) l1_kv_.FreeTensor(b_l1[kc]);
    }
    for (uint32_t i = 0; i < stripes * kcs; ++i) l1_qp_.FreeTensor(a_l1[i]);
  }

  // ---------------------------------------------------------------- Vector cores ([V1], last V)
  __aicore__ void ProcessVector() {
    pipe_.InitBuffer(ub_s_, 2, kVecRows * kBlockK * 4);
    pipe_.InitBuffer(ub_p_, 2, kVecRows * kBlockK * 2);
    pipe_.InitBuffer(ub_n_, kVecRows * kDv * 4);
    pipe_.InitBuffer(ub_stat_, 16 * kMaxRows * 4);
    pipe_.InitBuffer(ub_work_, kBlockK * 4);
    for (int64_t b = GetBlockIdx(); b < p_.batch; b += GetBlockNum()) {
      const uint32_t blocks = Blocks(b);
      const uint32_t half = (rows_ + 1) / 2;
      r0_ = GetSubBlockIdx() == 0 ? 0 : half;
      r1_ = GetSubBlockIdx() == 0 ? half : rows_;
      InitStats();
      for (uint32_t c = 1; c < blocks + kPreload; ++c) {
        if (c - 1 < blocks) {  // V1(c-1)
          CrossCoreWaitFlag(kFlagSReady);
          const uint32_t t = c - 1;
          if (t > 0) CrossCoreWaitFlag(kFlagOAdded);  // C2(t-1) is in O
          V1(b, t);
          CrossCoreSetFlag<2, PIPE_MTE3>(kFlagPReady);
        }
      }
      if (blocks > 0) CrossCoreWaitFlag(kFlagOAdded);  // C2(N-1)
      LastV(b, blocks);
    }
  }

  // Alg. 2 lines 7-17 for this core's rows of block t.
  __aicore__ void V1(int64_t b, uint32_t t) {
    const uint32_t w = BlockWidth(b, t);
    const uint32_t slot = t % kWsDepth;
    LocalTensor<float> st = ub_stat_.Get<float>();   // per row: m, l, n, c, s16 (5 x kMaxRows)
    LocalTensor<float> work = ub_work_.Get<float>();
    for (uint32_t r = r0_; r < r1_; r += kVecRows) {
      const uint32_t nr = Min(kVecRows, r1_ - r);
      LocalTensor<float> s = ub_s_.AllocTensor<float>();
      DataCopyParams in{uint16_t(nr), uint16_t(w * 4 / 32), uint16_t((kBlockK - w) * 4 / 32), 0};
      DataCopy(s, ws_s_[(uint64_t(slot) * kMaxRows + r) * kBlockK], in);
      ub_s_.EnQue(s);
      s = ub_s_.DeQue<float>();
      LocalTensor<bfloat16_t> pb = ub_p_.AllocTensor<bfloat16_t>();
      LocalTensor<int32_t> nbuf = ub_n_.Get<int32_t>();
      for (uint32_t i = 0; i < nr; ++i) {
        const uint32_t row = r + i;
        const uint32_t end = VisibleEnd(b, row);
        const uint32_t start = t * kBlockK;
        if (end <= start) {  // no key of this row in the block: N = 0, P = 0
          Duplicate(nbuf[i * kDv], int32_t(0), kDv);
          Duplicate(pb[i * kBlockK], bfloat16_t{0}, kBlockK);
          continue;
        }
        const uint32_t vis = Min(w, end - start);
        LocalTensor<float> srow = s[i * kBlockK];
        if (vis < kBlockK) Duplicate(srow[vis], -3.0e38f, kBlockK - vis);  // masked keys
        Muls(srow, srow, p_.scale, kBlockK);                            // line 7: S / sqrt(Dk)
        ReduceMax(work, srow, work[64], kBlockK);
        const float m_old = st.GetValue(0 * kMaxRows + row);
        const float m_new = Fmax(m_old, work.GetValue(0));
        Adds(srow, srow, -m_new, kBlockK);                              // line 8: P = exp(S - m)
        Exp(srow, srow, kBlockK);
        ReduceSum(work, srow, work[64], vis);
        const float rowsum = work.GetValue(0);
        // scalars through 8-wide vector ops (the scalar unit has no exp): M_up, n, S32
        work.SetValue(0, m_old - m_new);
        Exp(work, work, 1);
        const float m_up = (t == 0) ? 0.0f : work.GetValue(0);
        const float l = st.GetValue(1 * kMaxRows + row) * m_up + rowsum;
        work.SetValue(0, -m_new * 1.4426950408889634f);                 // -m / ln 2
        LocalTensor<int32_t> wi = work.ReinterpretCast<int32_t>();
        Cast(wi[8], work, RoundMode::CAST_ROUND, 1);                    // n = round(-m / ln 2)
        const int32_t n = wi.GetValue(8);
        work.SetValue(0, 0.6931471805599453f * (float(n) + m_new * 1.4426950408889634f));
        Exp(work, work, 1);                                             // line 9: S32 = 2^n e^m
        const float s32 = work.GetValue(0);
        LocalTensor<bfloat16_t> wb = work.ReinterpretCast<bfloat16_t>();
        Cast(wb[32], work, RoundMode::CAST_RINT, 1);                    // line 10: S16
        Cast(work[8], wb[32], RoundMode::CAST_NONE, 1);
        const float s16 = work.GetValue(8);
        const float c = p_.compensation ? s16 / s32 : 1.0f;             // Appendix A: r_i / r'_i
        const float eps = 1.5f * (c / st.GetValue(3 * kMaxRows + row) - 1.0f);  // line 11
        Muls(srow, srow, s16, kBlockK);                                 // line 12: P S16 -> BF16
        Cast(pb[i * kBlockK], srow, RoundMode::CAST_RINT, kBlockK);
        // lines 13-14: N = Cast_to_int32((max(n_i - n_{i-1}, -30) + eps + 1e-6) 2^23)
        const int32_t dn = int32_t(st.GetValue(2 * kMaxRows + row));
        const float nf = float(Imax(n - dn, -30)) + eps + 1e-6f;
        work.SetValue(16, nf * 8388608.0f);
        Cast(wi[24], work[16], RoundMode::CAST_RINT, 1);
        Duplicate(nbuf[i * kDv], (t == 0) ? int32_t(0) : wi.GetValue(24), kDv);
        st.SetValue(0 * kMaxRows + row, m_new);
        st.SetValue(1 * kMaxRows + row, l);
        st.SetValue(2 * kMaxRows + row, float(n));
        st.SetValue(3 * kMaxRows + row, c);
        st.SetValue(4 * kMaxRows + row, s16);
      }
      ub_s_.FreeTensor(s);
      ub_p_.EnQue(pb);
      pb = ub_p_.DeQue<bfloat16_t>();
      DataCopy(ws_p_[(uint64_t(slot) * kMaxRows + r) * kBlockK], pb, nr * kBlockK);
      ub_p_.FreeTensor(pb);
      if (t > 0) {  // lines 15-17: O = AS_FP32(AS_INT32(O) + N), AtomicAdd<INT32> in GM
        SetAtomicAdd<int32_t>();
        DataCopy(o_bits_[(uint64_t(b) * rows_ + r) * kDv], nbuf, nr * kDv);
        SetAtomicNone();
      }
    }
  }

  // Line 22 and the LSE: O / (l S16) -> BF16, lse = m + ln l.
  __aicore__ void LastV(int64_t b, uint32_t blocks) {
    LocalTensor<float> st = ub_stat_.Get<float>();
    for (uint32_t r = r0_; r < r1_; r += kVecRows) {
      const uint32_t nr = Min(kVecRows, r1_ - r);
      LocalTensor<float> o = ub_s_.AllocTensor<float>();
      DataCopy(o, o_[(uint64_t(b) * rows_ + r) * kDv], nr * kDv);
      ub_s_.EnQue(o);
      o = ub_s_.DeQue<float>();
      LocalTensor<bfloat16_t> ob = ub_p_.AllocTensor<bfloat16_t>();
      for (uint32_t i = 0; i < nr; ++i) {
        const uint32_t row = r + i;
        const float l = st.GetValue(1 * kMaxRows + row);
        const bool empty = blocks == 0 || VisibleEnd(b, row) == 0;
        Muls(o[i * kDv], o[i * kDv], empty ? 0.0f : 1.0f / (l * st.GetValue(4 * kMaxRows + row)), kDv);
        LocalTensor<float> work = ub_work_.Get<float>();
        work.SetValue(0, l);
        // ln l through the vector unit is omitted from the declarations subset: lse is written
        // as m + ln(l) by a scalar series below (host recomputes nothing).
        lse_.SetValue(uint64_t(b) * rows_ + row, empty ? -3.4e38f : st.GetValue(row) + LnSeries(l));
      }
      Cast(ob, o, RoundMode::CAST_RINT, nr * kDv);
      ub_s_.FreeTensor(o);
      ub_p_.EnQue(ob);
      ob = ub_p_.DeQue<bfloat16_t>();
      DataCopy(out_[(uint64_t(b) * rows_ + r) * kDv], ob, nr * kDv);
      ub_p_.FreeTensor(ob);
    }
  }

 private:
  __aicore__ static uint32_t Min(uint32_t a, uint32_t b) { return a < b ? a : b; }
  __aicore__ static int32_t Imax(int32_t a, int32_t b) { return a > b ? a : b; }
  __aicore__ static float Fmax(float a, float b) { return a > b ? a : b; }
  __aicore__ static uint32_t Align16(uint32_t x) { return (x + 15) / 16 * 16; }
  // ln(l) for l >= 1 (l is a sum of exp(S - m) with one term equal to 1): l = 2^e x, x in [1, 2)
  __aicore__ static float LnSeries(float l) {
    int32_t e = 0;
    while (l >= 2.0f) { l *= 0.5f; ++e; }
    const float y = (l - 1.0f) / (l + 1.0f), y2 = y * y;
    float s = 0.0f, term = y;
    for (int k = 1; k < 20; k += 2) { s += term / float(k); term *= y2; }
    return 2.0f * s + float(e) * 0.6931471805599453f;
  }
  __aicore__ uint32_t SeqK(int64_t b) const { return uint32_t(seqlens_.GetValue(b)); }
  __aicore__ uint32_t Blocks(int64_t b) const { return (SeqK(b) + kBlockK - 1) / kBlockK; }
  __aicore__ uint32_t BlockWidth(int64_t b, uint32_t t) const { return Min(kBlockK, SeqK(b) - t * kBlockK); }
  // bottom-right causal window of row = token * heads + head
  __aicore__ uint32_t VisibleEnd(int64_t b, uint32_t row) const {
    const uint32_t sk = SeqK(b);
    if (!p_.causal) return sk;
    const int64_t end = int64_t(row / p_.heads) + int64_t(sk) - int64_t(p_.seq_q) + 1;
    return end < 0 ? 0 : (end > sk ? sk : uint32_t(end));
  }
  __aicore__ void InitStats() {
    LocalTensor<float> st = ub_stat_.Get<float>();
    for (uint32_t r = 0; r < kMaxRows; ++r) {
      st.SetValue(0 * kMaxRows + r, -3.4e38f);  // m_0 = -inf
      st.SetValue(1 * kMaxRows + r, 0.0f);      // l_0 = 0
      st.SetValue(2 * kMaxRows + r, 0.0f);      // n_0 (unused for block 0)
      st.SetValue(3 * kMaxRows + r, 1.0f);      // c_0 = 1
      st.SetValue(4 * kMaxRows + r, 1.0f);      // S16
    }
  }

  AmlaParams p_;
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
  TBuf<TPosition::VECCALC> ub_n_, ub_stat_, ub_work_;
};

extern "C" __global__ __aicore__ void amla_decode_bf16_576_512(GM_ADDR q, GM_ADDR kv, GM_ADDR seqlens,
                                                               GM_ADDR o_acc, GM_ADDR out, GM_ADDR lse,
                                                               GM_ADDR workspace, GM_ADDR params) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
  AmlaDecode op;
  op.Init(q, kv, seqlens, o_acc, out, lse, workspace, params);
  if (ASCEND_IS_AIC) {
    op.ProcessCube();
  } else {
    op.ProcessVector();
  }
}
