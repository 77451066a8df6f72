//! Attention plans: pure values, serialisable to JSON so a run can be reproduced.

use crate::{amla, lean, turbo, turboquant, AttentionProblem, BackendKind};
use serde::{Deserialize, Serialize};

/// Which published algorithm a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Exact softmax attention (FlashAttention-style blocked online softmax).
    Exact,
    /// TurboAttention: FlashQ progressive quantisation + SAS softmax.
    Turbo,
    /// LeanAttention: stream-K decode.
    Lean,
    /// AMLA: MLA decode with INT32-add rescaling.
    Amla,
    /// TurboQuant: rotated codebook KV compression with QJL correction.
    TurboQuant,
}

impl Algorithm {
    /// Every algorithm, in CLI order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Exact,
        Algorithm::Turbo,
        Algorithm::Lean,
        Algorithm::Amla,
        Algorithm::TurboQuant,
    ];

    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Exact => "exact",
            Algorithm::Turbo => "turbo",
            Algorithm::Lean => "lean",
            Algorithm::Amla => "amla",
            Algorithm::TurboQuant => "turboquant",
        }
    }

    /// Parses a CLI name.
    pub fn parse(s: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == s)
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Algorithm-specific part of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum PlanDetail {
    /// Exact attention needs nothing beyond the block sizes.
    Exact,
    /// LeanAttention stream-K schedule.
    Lean(lean::LeanPlan),
    /// AMLA Preload Pipeline and hierarchical tiling.
    Amla(amla::AmlaPlan),
    /// TurboAttention quantisation and SAS settings.
    Turbo(turbo::TurboConfig),
    /// TurboQuant codebook and sketch settings.
    TurboQuant(turboquant::TurboQuantConfig),
}

/// A complete, self-describing plan for one attention call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionPlan {
    /// The algorithm to run.
    pub algorithm: Algorithm,
    /// The backend family the plan was made for.
    pub backend: BackendKind,
    /// Name of the device whose capabilities shaped the plan.
    pub device: String,
    /// The problem the plan was made for; `run` refuses a plan for another shape.
    pub problem: AttentionProblem,
    /// Query rows per tile (B_r).
    pub block_q: usize,
    /// Key columns per tile (B_c).
    pub block_k: usize,
    /// Algorithm-specific settings.
    pub detail: PlanDetail,
}

impl AttentionPlan {
    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plans contain only serialisable values")
    }

    /// Parses a plan written by [`AttentionPlan::to_json`].
    pub fn from_json(s: &str) -> crate::Result<AttentionPlan> {
        serde_json::from_str(s).map_err(|e| crate::CoreError::Io(format!("plan JSON: {e}")))
    }
}
