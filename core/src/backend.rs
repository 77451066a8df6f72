//! Backend traits, one per capability (burn and wgpu-hal style).
//!
//! A backend crate implements [`Device`] plus the algorithm traits it can execute; the facade
//! crate's `Runtime` enum picks a backend and dispatches with static calls. Backends assume the
//! problem was validated at the public boundary (`AttentionInputs::problem`) and the plan was made
//! for it (`AttentionPlan::problem`).

use crate::{AttentionInputs, AttentionOutput, AttentionPlan, BackendKind, DeviceCaps};

/// Whether a backend can run now, and if not, why.
#[derive(Clone, Debug, PartialEq)]
pub enum Availability {
    /// Real hardware is present and initialised.
    Ready,
    /// No hardware; results come from a simulation and say so.
    Simulated {
        /// Why the hardware path is not used.
        reason: String,
    },
    /// Cannot run at all.
    Unavailable {
        /// Why, e.g. "libcuda.so not found".
        reason: String,
    },
}

/// What every backend reports about itself.
pub trait Device {
    /// Error type of this backend.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Backend family.
    fn kind(&self) -> BackendKind;
    /// Whether it can run, and why not.
    fn availability(&self) -> Availability;
    /// Capabilities for the planner (`None` when unavailable).
    fn caps(&self) -> Option<DeviceCaps>;
}

/// Exact attention (the golden semantics, computed by the backend).
pub trait ExactAttention: Device {
    /// Runs a plan whose algorithm is `Exact`.
    fn run_exact(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput, Self::Error>;
}

/// LeanAttention stream-K decode.
pub trait LeanDecode: Device {
    /// Runs a plan whose detail is `PlanDetail::Lean`.
    fn run_lean(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput, Self::Error>;
}

/// AMLA MLA decode.
pub trait AmlaDecode: Device {
    /// Runs a plan whose detail is `PlanDetail::Amla` over `q` and the latent `kv`.
    fn run_amla(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput, Self::Error>;
}

/// TurboAttention prefill/decode over a compressed KV cache.
pub trait TurboAttention: Device {
    /// Runs a plan whose detail is `PlanDetail::Turbo`.
    fn run_turbo(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput, Self::Error>;
}

/// Attention over a TurboQuant-compressed KV cache.
pub trait TurboQuantDecode: Device {
    /// Runs a plan whose detail is `PlanDetail::TurboQuant`.
    fn run_turboquant(
        &self,
        plan: &AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput, Self::Error>;
}
