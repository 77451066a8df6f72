//! The CPU device and its trait implementations.

use ferrattn_core::backend::{
    AmlaDecode, Availability, Device, ExactAttention, LeanDecode, TurboAttention, TurboQuantDecode,
};
use ferrattn_core::{
    amla, lean, turbo, turboquant, AttentionInputs, AttentionOutput, AttentionPlan, BackendKind,
    CoreError, DeviceCaps, PlanDetail,
};
use thiserror::Error;

/// Errors of the CPU backend.
#[derive(Debug, Error)]
pub enum CpuError {
    /// An error from the core (validation, planning, an emulation).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The plan's detail does not belong to the algorithm entry point it was given to.
    #[error("plan for {found} given to the {expected} entry point")]
    WrongPlan {
        /// Entry point called.
        expected: &'static str,
        /// Algorithm of the plan.
        found: String,
    },
}

/// The host CPU, using rayon's global pool.
#[derive(Clone, Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// The CPU backend (always available).
    pub fn new() -> CpuBackend {
        CpuBackend
    }
}

impl Device for CpuBackend {
    type Error = CpuError;

    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn availability(&self) -> Availability {
        Availability::Ready
    }

    fn caps(&self) -> Option<DeviceCaps> {
        Some(DeviceCaps::cpu(rayon::current_num_threads()))
    }
}

fn wrong(expected: &'static str, plan: &AttentionPlan) -> CpuError {
    CpuError::WrongPlan {
        expected,
        found: plan.algorithm.to_string(),
    }
}

impl ExactAttention for CpuBackend {
    fn run_exact(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput, CpuError> {
        match plan.detail {
            PlanDetail::Exact => {
                // inputs that would overflow the f32 softmax are refused with the range
                ferrattn_core::range::check_f32_softmax(&plan.problem, x)?;
                Ok(crate::exact::blocked_attention(
                    &plan.problem,
                    x,
                    plan.block_k,
                ))
            }
            _ => Err(wrong("exact", plan)),
        }
    }
}

impl LeanDecode for CpuBackend {
    fn run_lean(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput, CpuError> {
        match &plan.detail {
            PlanDetail::Lean(d) => Ok(lean::emulate(d, &plan.problem, x)?),
            _ => Err(wrong("lean", plan)),
        }
    }
}

impl AmlaDecode for CpuBackend {
    fn run_amla(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput, CpuError> {
        match &plan.detail {
            PlanDetail::Amla(d) => Ok(amla::emulate(d, &plan.problem, x)?),
            _ => Err(wrong("amla", plan)),
        }
    }
}

impl TurboAttention for CpuBackend {
    fn run_turbo(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput, CpuError> {
        match &plan.detail {
            PlanDetail::Turbo(d) => Ok(turbo::emulate(d, &plan.problem, x)?),
            _ => Err(wrong("turbo", plan)),
        }
    }
}

impl TurboQuantDecode for CpuBackend {
    fn run_turboquant(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput, CpuError> {
        match &plan.detail {
            PlanDetail::TurboQuant(d) => Ok(turboquant::emulate(d, &plan.problem, x)?),
            _ => Err(wrong("turboquant", plan)),
        }
    }
}
