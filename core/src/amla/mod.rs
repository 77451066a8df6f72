//! AMLA (Liao et al., "AMLA: MUL by ADD in FlashAttention Rescaling", Huawei): MLA decode on
//! Ascend 910 whose FP32 output rescaling is an INT32 addition on the FP32 bit pattern in
//! global memory (Algorithm 2, Lemma 3.1), with the error compensation of Appendix A.
//!
//! * [`plan`] accepts MLA decode problems and fills an [`AmlaPlan`];
//! * [`emulate()`] runs Algorithm 2 on the CPU exactly as the kernel computes it (BF16 Cube
//!   inputs, FP32 accumulation, INT32 rescale); [`emulate_base`] runs the paper's "Base"
//!   (section 5.1) and [`emulate_naive_eq3`] the overflowing Eq. 3; [`emulate::emulate_with`]
//!   picks any [`Rescaling`];
//! * [`accuracy`] reproduces the accuracy study of section 5.1 (Tables 3 and 4).

pub mod accuracy;
pub mod emulate;
pub mod preload;
pub mod tiling;

pub use emulate::{
    int32_add_on_bits, int32_add_raw, mul_pow2_by_int_add, Compensation, Rescaling, EXPONENT_UNIT,
};

use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, BlockSizes, CoreError, DType, DeviceCaps,
    KvLayout, Result,
};
use serde::{Deserialize, Serialize};

/// KV tokens per FlashAttention iteration: section 4.2 "We fix the KV block size to 512".
pub const AMLA_BLOCK_K: usize = 512;
/// Rows of Q per Cube tile: section 4.2 sets M = 256 (128 query heads x 2 tokens with MTP).
pub const AMLA_BLOCK_M: usize = 256;
/// Query tokens per sequence AMLA decodes: 1, or 2 with Multi-Token Prediction (section 5.2).
pub const AMLA_MAX_SEQLEN_Q: usize = 2;

/// Plan of an AMLA decode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AmlaPlan {
    /// KV tokens per block processed by one C1/V1/C2 round (512 in the paper).
    pub block_k: usize,
    /// Query rows (heads x query tokens) per Cube tile M.
    pub block_q: usize,
    /// Apply the error compensation of Appendix A.
    pub compensation: bool,
    /// The Preload Pipeline (section 4.1).
    pub preload: preload::PreloadPipeline,
    /// Hierarchical tiling (section 4.2).
    pub tiling: tiling::HierarchicalTiling,
}

impl BlockSizes for AmlaPlan {
    fn block_q(&self) -> usize {
        self.block_q
    }
    fn block_k(&self) -> usize {
        self.block_k
    }
}

impl AmlaPlan {
    /// Checks a plan from outside against `p`: an AMLA problem, `block_k` the paper's 512 (the
    /// tiling and the kernel are built for it) and `block_q` what [`plan`] derives. The Preload
    /// Pipeline and the tiling are checked against the target by the backend that runs them.
    pub fn check(&self, p: &AttentionProblem) -> Result<()> {
        check_problem(p)?;
        let block_q = (p.heads_q * p.max_seqlen_q).min(AMLA_BLOCK_M);
        if (self.block_q, self.block_k) != (block_q, AMLA_BLOCK_K) {
            return Err(CoreError::InvalidPlan(format!(
                "AMLA block_q x block_k = {} x {}; for this problem they are {block_q} x {AMLA_BLOCK_K} \
                 (heads x query tokens capped at {AMLA_BLOCK_M}; the 512-token KV block of section 4.2)",
                self.block_q, self.block_k
            )));
        }
        Ok(())
    }

    /// The rescaling [`emulate()`] runs for this plan.
    pub fn rescaling(&self) -> Rescaling {
        Rescaling::Amla(if self.compensation {
            Compensation::AppendixA
        } else {
            Compensation::Off
        })
    }
}

/// Checks that `p` is an MLA decode problem AMLA covers.
fn check_problem(p: &AttentionProblem) -> Result<()> {
    p.validate()?;
    if p.kv_layout != KvLayout::MlaLatent {
        return Err(CoreError::Unsupported {
            what: format!(
                "AMLA with kv_layout {:?} ({} KV heads)",
                p.kv_layout, p.heads_kv
            ),
            supported: "MLA: one shared latent kv [B, Sk, 1, Dqk] whose first Dv columns are V \
                        (KvLayout::MlaLatent), e.g. Dqk = 576, Dv = 512"
                .into(),
        });
    }
    if p.heads_kv != 1 {
        return Err(CoreError::Unsupported {
            what: format!("AMLA with {} latent KV heads", p.heads_kv),
            supported: "exactly 1 shared latent KV head".into(),
        });
    }
    if p.head_dim_v > p.head_dim_qk {
        return Err(CoreError::BadLength {
            what: "head_dim_v".into(),
            value: p.head_dim_v as i64,
            requirement: format!(
                "at most head_dim_qk = {} (V is the first columns of the latent kv)",
                p.head_dim_qk
            ),
        });
    }
    if p.dtype != DType::BF16 {
        return Err(CoreError::Unsupported {
            what: format!("AMLA with dtype {}", p.dtype),
            supported: "bf16 (AMLA's Cube stages take BF16 Q, KV and P)".into(),
        });
    }
    if p.max_seqlen_q > AMLA_MAX_SEQLEN_Q {
        return Err(CoreError::BadLength {
            what: "max_seqlen_q".into(),
            value: p.max_seqlen_q as i64,
            requirement: format!(
                "between 1 and {AMLA_MAX_SEQLEN_Q}: AMLA is a decode kernel (1 query token, 2 with MTP)"
            ),
        });
    }
    Ok(())
}

/// Plans an AMLA decode: MLA latent layout, one KV head, `head_dim_v <= head_dim_qk`, BF16,
/// 1 or 2 query tokens, any (ragged) KV lengths.
///
/// `block_k` is the paper's 512; `block_q` is `heads_q x max_seqlen_q` capped at the 256 rows of
/// section 4.2; compensation is on; the Preload Pipeline and the tiling come from their Ascend
/// 910 constructors. `caps` does not change the plan: AMLA's tiles are fixed by the Ascend 910
/// memory sizes whatever backend runs (or emulates) it.
pub fn plan(p: &AttentionProblem, _caps: &DeviceCaps) -> Result<AmlaPlan> {
    check_problem(p)?;
    Ok(AmlaPlan {
        block_k: AMLA_BLOCK_K,
        block_q: (p.heads_q * p.max_seqlen_q).min(AMLA_BLOCK_M),
        compensation: true,
        preload: preload::PreloadPipeline::amla_default(),
        tiling: tiling::HierarchicalTiling::ascend910(),
    })
}

/// CPU emulation of AMLA Algorithm 2 (with the Appendix A compensation if
/// `plan.compensation`). O is returned in the problem's dtype (BF16), LSE in FP32 (natural log,
/// `-inf` for rows with no key).
pub fn emulate(
    plan: &AmlaPlan,
    p: &AttentionProblem,
    x: &AttentionInputs,
) -> Result<AttentionOutput> {
    check_problem(p)?;
    crate::range::check_amla(p, x)?;
    emulate::emulate_with(plan, p, x, plan.rescaling())
}

/// CPU emulation of the paper's "Base" (section 5.1): Algorithm 1 in mixed precision, with the
/// same BF16 casts of Q, K, P and V as AMLA, FP32 accumulation, and the FP32 output rescaled by
/// multiplication with `exp(m_{i-1} - m_i)`. Uses `plan.block_k`.
pub fn emulate_base(
    plan: &AmlaPlan,
    p: &AttentionProblem,
    x: &AttentionInputs,
) -> Result<AttentionOutput> {
    check_problem(p)?;
    crate::range::check_amla(p, x)?;
    emulate::emulate_with(plan, p, x, Rescaling::Base)
}

/// The naive Eq. 3 rescaling, `O^_i = O^_{i-1} + exp(m_i) P_i V_i`: correct while every
/// `m_i <= 88`, infinite or NaN beyond (the pitfall of section 3.1). Same casts as AMLA.
pub fn emulate_naive_eq3(
    plan: &AmlaPlan,
    p: &AttentionProblem,
    x: &AttentionInputs,
) -> Result<AttentionOutput> {
    check_problem(p)?;
    emulate::emulate_with(plan, p, x, Rescaling::NaiveEq3)
}

#[cfg(test)]
mod tests;
