//! `ferrattn-core`: the backend-agnostic heart of ferrattn.
//!
//! Holds the problem types and their validation, attention plans and the planner, the exact
//! `f64` golden reference, and a CPU emulation of each algorithm ferrattn runs:
//! TurboAttention ([`turbo`]), LeanAttention ([`lean`]), AMLA ([`amla`]) and TurboQuant
//! ([`turboquant`]). It never links a vendor library; every backend's tests compare against
//! what is computed here.

pub mod amla;
pub mod backend;
pub mod caps;
pub mod compare;
pub mod cp;
pub mod dtype;
pub mod error;
pub mod golden;
pub mod lean;
pub mod plan;
pub mod planner;
pub mod problem;
pub mod range;
pub mod softmax;
pub mod tensor;
pub mod turbo;
pub mod turboquant;

pub use backend::{Availability, Device};
pub use caps::{BackendKind, DeviceCaps};
pub use compare::{Comparison, Tolerance};
pub use dtype::DType;
pub use error::{CoreError, Result};
pub use plan::{Algorithm, AttentionPlan, PlanDetail};
pub use planner::{plan, BlockSizes};
pub use problem::{
    AttentionInputs, AttentionOptions, AttentionOutput, AttentionProblem, KvLayout, Provenance,
};
pub use softmax::SoftmaxState;
pub use tensor::Tensor;
