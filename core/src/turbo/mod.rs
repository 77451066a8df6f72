//! TurboAttention (Kang et al., MLSys 2025): FlashQ + SAS, as a bit-faithful CPU emulation.
//!
//! This module fixes what "correct" means for the INT8 tensor-core kernels: every integer step,
//! rounding mode, clamp and storage layout is defined here, and a kernel that performs the same
//! operations in the same order reproduces [`emulate`]'s O bit for bit (LSE up to the `ln`
//! implementation; see "Bit exactness" below).
//!
//! # Pieces and where the paper defines them
//! - [`quant`]: blockwise progressive quantization, BPQ (section 3.1, Eq. 9-10; Alg. 1 lines
//!   computing `s_Q_i, Q_i^q1, ..., s^int, z^int, K_j^q2`), INT4/INT2 packing.
//! - [`heads`]: head-wise mixed precision, `priority = gap x std` (section 3.2, Eq. 11-12).
//! - [`cache`]: the compressed KV cache and the INT8 decode buffer of `n_b` tokens with a
//!   universal scale (section 3.3), memory accounting.
//! - [`sas`]: SAS, `e^x ~ LUT[int] x POLY(frac)` with threshold `n_r` (section 4, Eq. 13-15,
//!   Alg. 3).
//! - [`attention`]: prefill (Alg. 1) and decode (Alg. 2).
//! - [`accuracy`]: an accuracy table on inputs with LLM-like channel outliers (Figure 4).
//!
//! # Numeric contract (all `f32` operations IEEE, round to nearest even)
//! 1. **INT8 symmetric (BPQ stage 1).** `s = max|x| / 119` over the block (one `f32`
//!    division); `code = clamp(rne(x / s), -127, 127)` with `x / s` an IEEE division and `rne`
//!    round-half-to-even (`__float2int_rn`); `s = 0` gives code 0. Blocks: prefill Q, `B_r`
//!    rows x all `d` channels of one (sequence, head); prefill K and V, `B_c` rows of one
//!    (sequence, KV head); tiles start at token 0 of each sequence, the last may be partial,
//!    padding rows past `seqlens` never enter a maximum. Decode q: one row of one head.
//! 2. **INT4/INT2 asymmetric per channel (BPQ stage 2)**, on the INT8 codes of one block, per
//!    channel `c` with `lo, hi` its min and max code: `scale = max(1, ceil((hi - lo) / (2^b - 1)))`
//!    (`u8`), `zero = lo` (`i8`), `code4 = floor((2 (x - lo) + scale) / (2 scale))` (half up;
//!    never leaves `[0, 2^b - 1]`), decode `clamp(code4 x scale + zero, -127, 127)`.
//! 3. **Packing.** Token-major, `8 / b` codes per byte, first code in the least significant
//!    bits: byte `k` of a token row holds channels `2k` (bits 0-3), `2k+1` (bits 4-7) for INT4,
//!    channels `4k..4k+3` at bits 0-1, 2-3, 4-5, 6-7 for INT2. A block stores `tokens x d x b / 8`
//!    code bytes, `d` scale bytes, `d` zero bytes and its `f32` INT8 scale.
//! 4. **Logits.** `S = f32(dot_i32(q, k)) x alpha`, `alpha = (s_q x s_k) x softmax_scale`
//!    (the listing's `S = s_Q s_K Q^q1 K^q1`, with the softmax scale folded into `alpha`); the
//!    `i32` dot is exact and its conversion to `f32` exact (`|dot| <= 127^2 x 256 < 2^24`).
//! 5. **SAS** as defined in [`sas`] (LUT bits, FMA Horner POLY, `x < n_r` flushed to 0). With
//!    SAS off, `expf`.
//! 6. **Online softmax, per tile in ascending key order** ([`attention::attend_tile`]):
//!    `m_new = max(m, rowmax S)`, `r = 1` if `m_new == m` else `EXP(m - m_new)`,
//!    `P~ = EXP(S - m_new)`, `s_P = max(P~ over the tile) / 119`,
//!    `Q(P~) = clamp(rne(P~ / s_P), 0, 127)`, `l = fma(f32(rowsum_i32 Q(P~)), s_P, l x r)`,
//!    `O = fma(f32(Q(P~) V^q1 as i32), s_P x s_V, O x r)`.
//! 7. **Finish.** `O = acc / l` (IEEE division), rounded to the problem's dtype;
//!    `LSE = m + ln(l)`; a row that saw no key gets O = 0, LSE = `-inf`.
//!
//! # Where this departs from the listings, and why
//! - Alg. 1-2 write `O = diag(SAS(m_old - m_new))^-1 O_old + ...`; the inverse is a typo
//!   (FlashAttention-2's listing has the same one): the old accumulator must shrink, as `l` does.
//! - `r = 1` when the row maximum did not move, instead of `SAS(0) = 0.9996`: otherwise every
//!   tile that leaves the maximum in place would shrink all earlier tiles' weight by 4e-4
//!   (2.5% at 4k context against the last tile); FlashAttention kernels skip that rescale anyway.
//! - `l` sums the *quantized* probabilities `s_P x Q(P~)` instead of `P~`: the normalizer then
//!   matches the weights that actually multiply V (O is a convex combination of the INT8 V
//!   rows), and the sum is an exact integer, so no reduction order can change a bit.
//! - The zero point is stored as the INT8 channel minimum and the integer scale rounds up
//!   (item 2), so no code is ever clipped.
//! - In the cache, the tail of a prefill that does not fill a block goes to the INT8 buffer
//!   (universal scale) instead of being compressed as a partial block, so decode tokens
//!   continue filling it; every compressed block holds exactly `B_c` tokens.
//!
//! # Bit exactness
//! Every reduction whose order could matter is done in integers (`Q K^T`, `P V`, `rowsum`);
//! max and abs-max are order-free. A kernel must use the tile partition and order above and
//! the written FMAs (`__fmaf_rn`), round every other product and quotient on its own
//! (`__fmul_rn`, `__fdiv_rn`: no `--use_fast_math`, and `S = dot x alpha` must be rounded
//! before `S - m`, not fused into it). O is then bit exact; LSE depends on `logf` (compare
//! within 2 ulp); with SAS off, P depends on `expf`.
//! A split-K (stream-K) kernel changes the rescale sequence and can only match within a
//! tolerance.
//!
//! # `emulate` semantics
//! Per sequence `b`: if `seqlens_q[b] >= seqlens_k[b]` (prefill, including `Sq == Sk`),
//! Alg. 1 with the bottom-right causal mask if asked. If `seqlens_q[b] < seqlens_k[b]`, the
//! first `ctx = Sk - Sq` tokens are the context: compressed into a [`TurboKvCache`] as a
//! prefill would leave it (full blocks INT4/INT2 at their per-block INT8 scale, the tail in the
//! INT8 buffer), then the `Sq` query tokens are decoded one at a time with Alg. 2. Causal: step
//! `i` appends key/value `ctx + i` (flushing a full buffer) and decodes query `i`, which sees
//! keys `0..=ctx + i`, the bottom-right mask. Not causal: all `Sq` new tokens are appended
//! first, then every query sees all `Sk` keys. Head bit widths come from `kv_bits`, priorities
//! measured on the contexts of the sequences that decode.
//!
//! # Supported
//! Separate K and V (no MLA latent), `head_dim_v == head_dim_qk`, head dims
//! [`SUPPORTED_HEAD_DIMS`] on the CPU ([`SUPPORTED_HEAD_DIMS_CUDA`] when planning for CUDA),
//! any GQA ratio, ragged lengths, f32/f16/bf16 inputs with magnitudes up to [`MAX_MAGNITUDE`],
//! blocks [`SUPPORTED_BLOCKS`] with `buffer_tokens == block_k`, `n_r` in `-16..=-1`, KV bits
//! 4, 2 or mixed. Not the Ascend backend.

pub mod accuracy;
pub mod attention;
pub mod cache;
pub mod decode_plan;
pub mod heads;
pub mod quant;
pub mod sas;

#[cfg(test)]
mod tests;

pub use accuracy::{accuracy_markdown, accuracy_table, llm_like_inputs, AccuracyRow};
pub use attention::{
    decode, decode_step, fixed_p_paths, prefill, prefill_fixed_p, FixedPPaths, PQuant,
};
pub use cache::{block_compression_ratio, CacheMemory, TurboKvCache};

use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, BackendKind, BlockSizes, CoreError,
    DeviceCaps, KvLayout, Result,
};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Block sizes (`B_r`, `B_c`, `n_b`) the emulation accepts; the paper runs 64 and ablates 32.
pub const SUPPORTED_BLOCKS: [usize; 4] = [16, 32, 64, 128];
/// Head dimensions the CPU emulation accepts (multiples of 4 so INT2 rows fill whole bytes,
/// at most 256 so the `i32` logit dot converts to `f32` exactly). 96 is Phi-3's.
pub const SUPPORTED_HEAD_DIMS: [usize; 5] = [32, 64, 96, 128, 256];
/// Head dimensions a plan for the CUDA backend accepts.
pub const SUPPORTED_HEAD_DIMS_CUDA: [usize; 2] = [64, 128];
/// Largest input magnitude: beyond it the `f32` product of two INT8 scales may overflow.
pub const MAX_MAGNITUDE: f32 = 1e15;

/// Bit widths of the compressed KV cache.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum KvBits {
    /// Every KV head at 4 bits.
    Int4,
    /// Every KV head at 2 bits.
    Int2,
    /// Head-wise mixed precision (section 3.2): the `floor(two_bit_fraction x heads_kv)`
    /// lowest-priority heads at 2 bits, the rest at 4.
    Mixed {
        /// Fraction of KV heads at 2 bits, in `[0, 1]` (0.5 in the paper).
        two_bit_fraction: f32,
    },
    /// Explicit bits per KV head (each 2 or 4).
    PerHead {
        /// One entry per KV head.
        bits: Vec<u8>,
    },
}

/// TurboAttention settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurboConfig {
    /// Query rows per block (B_r): the INT8 scale granularity of Q in prefill.
    pub block_q: usize,
    /// Key/value rows per block (B_c): INT8 scale granularity of K and V, tokens per cache block.
    pub block_k: usize,
    /// Decode buffer capacity n_b in tokens; equals `block_k` (a full buffer becomes one block).
    pub buffer_tokens: usize,
    /// SAS threshold n_r: `SAS(x) = 0` for `x < n_r` (natural-log units, -6 in the paper).
    pub sas_threshold: i32,
    /// Exponentials by SAS (true) or by `f32` exp (false, the ablation baseline).
    pub sas: bool,
    /// Bit widths of the compressed KV cache.
    pub kv_bits: KvBits,
}

impl Default for TurboConfig {
    /// The paper's settings (section 5.2): `B_r = B_c = n_b = 64`, `n_r = -6`, SAS on, half
    /// of the KV heads at 2 bits.
    fn default() -> TurboConfig {
        TurboConfig {
            block_q: 64,
            block_k: 64,
            buffer_tokens: 64,
            sas_threshold: -6,
            sas: true,
            kv_bits: KvBits::Mixed {
                two_bit_fraction: 0.5,
            },
        }
    }
}

impl BlockSizes for TurboConfig {
    fn block_q(&self) -> usize {
        self.block_q
    }
    fn block_k(&self) -> usize {
        self.block_k
    }
}

impl TurboConfig {
    /// Checks the settings on their own.
    pub fn validate(&self) -> Result<()> {
        let supported = || format!("{SUPPORTED_BLOCKS:?}");
        for (what, v) in [
            ("block_q", self.block_q),
            ("block_k", self.block_k),
            ("buffer_tokens", self.buffer_tokens),
        ] {
            if !SUPPORTED_BLOCKS.contains(&v) {
                return Err(CoreError::Unsupported {
                    what: format!("turbo {what} = {v}"),
                    supported: supported(),
                });
            }
        }
        if self.buffer_tokens != self.block_k {
            return Err(CoreError::InvalidPlan(format!(
                "turbo buffer_tokens {} must equal block_k {}: a full decode buffer is flushed into one cache block",
                self.buffer_tokens, self.block_k
            )));
        }
        if !(sas::MIN_THRESHOLD..=-1).contains(&self.sas_threshold) {
            return Err(CoreError::Unsupported {
                what: format!("SAS threshold n_r = {}", self.sas_threshold),
                supported: format!(
                    "integers {}..=-1 (the LUT holds e^0 .. e^{})",
                    sas::MIN_THRESHOLD,
                    sas::MIN_THRESHOLD
                ),
            });
        }
        match &self.kv_bits {
            KvBits::Mixed {
                two_bit_fraction: f,
            } if !(0.0..=1.0).contains(f) => Err(CoreError::Unsupported {
                what: format!("two_bit_fraction {f}"),
                supported: "a fraction of KV heads in [0, 1]".into(),
            }),
            KvBits::PerHead { bits } => {
                match bits.iter().enumerate().find(|(_, &b)| b != 2 && b != 4) {
                    Some((h, b)) => Err(CoreError::Unsupported {
                        what: format!("{b} bits for KV head {h}"),
                        supported: "2 or 4".into(),
                    }),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// Checks the settings against a problem (shapes the emulation covers, per-head bits count).
    pub fn check_problem(&self, p: &AttentionProblem) -> Result<()> {
        self.validate()?;
        check_problem_support(p, BackendKind::Cpu)?;
        if let KvBits::PerHead { bits } = &self.kv_bits {
            if bits.len() != p.heads_kv {
                return Err(CoreError::Shape {
                    tensor: "kv_bits",
                    actual: vec![bits.len()],
                    expected: format!("one bit width per KV head, [{}]", p.heads_kv),
                });
            }
        }
        Ok(())
    }

    /// [`Self::check_problem`] on the backend of `caps` (the CUDA kernels cover fewer head dims
    /// and no f32): what a plan from outside must pass before it runs there.
    pub fn check_device(&self, p: &AttentionProblem, caps: &DeviceCaps) -> Result<()> {
        self.check_problem(p)?;
        check_problem_support(p, caps.backend)
    }

    /// The exponential this configuration uses.
    pub fn exp_kind(&self) -> sas::ExpKind {
        if self.sas {
            sas::ExpKind::Sas(self.sas_threshold)
        } else {
            sas::ExpKind::Exact
        }
    }
}

pub(crate) fn check_head_dim(dqk: usize, dv: usize, backend: BackendKind) -> Result<()> {
    let list: &[usize] = if backend == BackendKind::Cuda {
        &SUPPORTED_HEAD_DIMS_CUDA
    } else {
        &SUPPORTED_HEAD_DIMS
    };
    if dqk != dv {
        return Err(CoreError::Unsupported {
            what: format!("turbo with head_dim_qk {dqk} != head_dim_v {dv}"),
            supported: "equal Q/K and V head dimensions".into(),
        });
    }
    if !list.contains(&dqk) {
        return Err(CoreError::Unsupported {
            what: format!("turbo head_dim {dqk} on {backend}"),
            supported: format!("{list:?}"),
        });
    }
    Ok(())
}

fn check_problem_support(p: &AttentionProblem, backend: BackendKind) -> Result<()> {
    if backend == BackendKind::Ascend {
        return Err(CoreError::Unsupported {
            what: "turbo on the ascend backend".into(),
            supported: "cpu (this emulation) and cuda (INT8 tensor cores)".into(),
        });
    }
    if p.kv_layout != KvLayout::Separate {
        return Err(CoreError::Unsupported {
            what: "turbo with an MLA latent cache".into(),
            supported: "separate K and V".into(),
        });
    }
    if backend == BackendKind::Cuda && p.dtype == crate::DType::F32 {
        // the INT8 kernels read fp16/bf16 tiles; the CPU emulation takes any dtype
        return Err(CoreError::Unsupported {
            what: "turbo on cuda with f32 inputs".into(),
            supported: "f16, bf16 on cuda; f32 on cpu".into(),
        });
    }
    check_head_dim(p.head_dim_qk, p.head_dim_v, backend)
}

/// Plans TurboAttention: the paper's settings ([`TurboConfig::default`]) once the problem is
/// known to be covered on `caps.backend`.
pub fn plan(p: &AttentionProblem, caps: &DeviceCaps) -> Result<TurboConfig> {
    p.validate()?;
    check_problem_support(p, caps.backend)?;
    let cfg = TurboConfig::default();
    cfg.check_problem(p)?;
    Ok(cfg)
}

/// Validates a configuration, a problem and its tensors together (the public boundary of
/// [`emulate`] and [`prefill`]).
pub fn check_inputs(cfg: &TurboConfig, p: &AttentionProblem, x: &AttentionInputs) -> Result<()> {
    p.validate()?;
    cfg.check_problem(p)?;
    let v = x.v.as_ref().ok_or_else(|| CoreError::Unsupported {
        what: "turbo without a separate v tensor".into(),
        supported: "separate K and V".into(),
    })?;
    let expect = [
        (
            "q",
            &x.q,
            [p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk],
        ),
        (
            "k",
            &x.k,
            [p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_qk],
        ),
        ("v", v, [p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_v]),
    ];
    for (name, t, shape) in expect {
        if t.shape != shape {
            return Err(CoreError::Shape {
                tensor: name,
                actual: t.shape.clone(),
                expected: format!("{shape:?} as the problem says"),
            });
        }
        t.check_data(name)?;
        check_values(name, &t.data)?;
    }
    Ok(())
}

/// Rejects non-finite values and magnitudes above [`MAX_MAGNITUDE`] in an input tensor.
pub(crate) fn check_values(name: &'static str, data: &[f32]) -> Result<()> {
    if let Some((index, &value)) = data.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(CoreError::NonFinite {
            tensor: name,
            index,
            value,
        });
    }
    let amax = data.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    if amax > MAX_MAGNITUDE {
        return Err(CoreError::Unsupported {
            what: format!("{name} with magnitudes up to {amax:e}"),
            supported: format!(
                "magnitudes up to {MAX_MAGNITUDE:e} (f32 products of INT8 scales overflow beyond)"
            ),
        });
    }
    Ok(())
}

/// CPU emulation: Alg. 1 for sequences with `Sq >= Sk`, context compression then Alg. 2 per
/// query token for `Sq < Sk` (see the module docs for the exact semantics).
pub fn emulate(
    cfg: &TurboConfig,
    p: &AttentionProblem,
    x: &AttentionInputs,
) -> Result<AttentionOutput> {
    check_inputs(cfg, p, x)?;
    let (mut o, mut lse) = attention::output_buffers(p);
    let (prefill_seqs, decode_seqs): (Vec<usize>, Vec<usize>) =
        (0..p.batch).partition(|&b| p.seqlens_q[b] >= p.seqlens_k[b]);
    if !prefill_seqs.is_empty() {
        attention::prefill_into(
            cfg,
            p,
            x,
            &prefill_seqs,
            attention::PQuant::PerTile,
            0,
            &mut o.data,
            &mut lse.data,
        );
    }
    if !decode_seqs.is_empty() {
        let v = x.v.as_ref().expect("checked: separate K and V");
        let ctx: Vec<usize> = (0..p.batch)
            .map(|b| {
                if decode_seqs.contains(&b) {
                    p.seqlens_k[b] - p.seqlens_q[b]
                } else {
                    0
                }
            })
            .collect();
        let mut cache = TurboKvCache::from_context(cfg, &x.k, v, &ctx)?;
        let (hq, hk, d, sq_max) = (p.heads_q, p.heads_kv, p.head_dim_qk, p.max_seqlen_q);
        let (bits, n_b) = (cache.bits.clone(), cache.block_tokens);
        let token = |t: &crate::Tensor, b: usize, j: usize| -> Vec<f32> {
            (0..hk).flat_map(|h| t.row4(b, j, h).to_vec()).collect()
        };
        let results: Vec<(usize, Vec<Vec<attention::RowOut>>)> = cache
            .seqs
            .par_iter_mut()
            .enumerate()
            .filter(|(b, _)| decode_seqs.contains(b))
            .map(|(b, seq)| {
                let (c, sq) = (ctx[b], p.seqlens_q[b]);
                let mut steps = Vec::with_capacity(sq);
                let append = |seq: &mut cache::SeqCache, j: usize| {
                    seq.push_token(&token(&x.k, b, j), &token(v, b, j), d, n_b, &bits)
                };
                if !p.causal {
                    (c..c + sq).for_each(|j| append(seq, j));
                }
                for i in 0..sq {
                    if p.causal {
                        append(seq, c + i);
                    }
                    steps.push(attention::decode_seq(
                        cfg,
                        seq,
                        hq,
                        d,
                        |h| x.q.row4(b, i, h),
                        p.softmax_scale,
                        false,
                    ));
                }
                (b, steps)
            })
            .collect();
        for (b, steps) in results {
            for (i, heads) in steps.into_iter().enumerate() {
                for (h, (orow, l)) in heads.into_iter().enumerate() {
                    for (dst, s) in o.row4_mut(b, i, h).iter_mut().zip(orow) {
                        *dst = p.dtype.round(s);
                    }
                    lse.data[(b * hq + h) * sq_max + i] = l;
                }
            }
        }
    }
    Ok(AttentionOutput {
        o,
        lse,
        provenance: attention::provenance(),
    })
}
