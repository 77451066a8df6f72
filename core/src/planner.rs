//! The planner: `plan(algorithm, &problem, &caps) -> AttentionPlan`, pure and host-side.

use crate::{
    amla, lean, turbo, turboquant, Algorithm, AttentionPlan, AttentionProblem, DeviceCaps,
    PlanDetail, Result,
};

/// Block sizes a plan detail implies.
pub trait BlockSizes {
    /// Query rows per tile (B_r).
    fn block_q(&self) -> usize;
    /// Key columns per tile (B_c).
    fn block_k(&self) -> usize;
}

/// Default tile of exact attention on any backend: 64 x 64 (FlashAttention-2's forward tile).
pub const EXACT_BLOCK: usize = 64;

/// Makes a plan for `algorithm` on a device with `caps`. Validates the problem first.
pub fn plan(
    algorithm: Algorithm,
    problem: &AttentionProblem,
    caps: &DeviceCaps,
) -> Result<AttentionPlan> {
    problem.validate()?;
    let (block_q, block_k, detail) = match algorithm {
        Algorithm::Exact => (EXACT_BLOCK, EXACT_BLOCK, PlanDetail::Exact),
        Algorithm::Lean => {
            let d = lean::plan(problem, caps)?;
            (d.block_q(), d.block_k(), PlanDetail::Lean(d))
        }
        Algorithm::Amla => {
            let d = amla::plan(problem, caps)?;
            (d.block_q(), d.block_k(), PlanDetail::Amla(d))
        }
        Algorithm::Turbo => {
            let d = turbo::plan(problem, caps)?;
            (d.block_q(), d.block_k(), PlanDetail::Turbo(d))
        }
        Algorithm::TurboQuant => {
            let d = turboquant::plan(problem, caps)?;
            (d.block_q(), d.block_k(), PlanDetail::TurboQuant(d))
        }
    };
    tracing::debug!(%algorithm, device = %caps.name, block_q, block_k, "planned");
    Ok(AttentionPlan {
        algorithm,
        backend: caps.backend,
        device: caps.name.clone(),
        problem: problem.clone(),
        block_q,
        block_k,
        detail,
    })
}
