//! Attention plans: pure values, serialisable to JSON so a run can be reproduced.

use crate::planner::{BlockSizes, EXACT_BLOCK};
use crate::{
    amla, lean, turbo, turboquant, AttentionProblem, BackendKind, CoreError, DeviceCaps, Result,
};
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

    /// Parses a plan written by [`AttentionPlan::to_json`]. The result is only well-formed JSON:
    /// [`AttentionPlan::validate`] decides whether it may run.
    pub fn from_json(s: &str) -> Result<AttentionPlan> {
        serde_json::from_str(s).map_err(|e| CoreError::Io(format!("plan JSON: {e}")))
    }

    /// Checks every field against the plan's problem and the device that is to run it. A plan is
    /// data from outside (a file, another process, a hand edit): backends index buffers and size
    /// grids with its numbers, so nothing reaches them unchecked (STYLE: validate once, at the
    /// boundary). Checked: the problem itself, the backend family, that the detail belongs to the
    /// algorithm, that `block_q`/`block_k` are the detail's and non-zero and bounded, and each
    /// detail field against what the planner derives from the problem and the device
    /// ([`lean::LeanPlan::check`], [`turbo::TurboConfig::check_device`],
    /// [`turboquant::TurboQuantConfig::check_device`], [`amla::AmlaPlan::check`]).
    pub fn validate(&self, caps: &DeviceCaps) -> Result<()> {
        let bad = |m: String| Err(CoreError::InvalidPlan(m));
        self.problem.validate()?;
        if self.backend != caps.backend {
            return bad(format!(
                "made for the {} backend, the device is {} ({})",
                self.backend, caps.backend, caps.name
            ));
        }
        let detail_blocks = match (&self.detail, self.algorithm) {
            (PlanDetail::Exact, Algorithm::Exact) => {
                for (what, v) in [("block_q", self.block_q), ("block_k", self.block_k)] {
                    if v == 0 || v > MAX_EXACT_BLOCK {
                        return bad(format!(
                            "exact {what} = {v}; it must be between 1 and {MAX_EXACT_BLOCK} (the planner uses {EXACT_BLOCK})"
                        ));
                    }
                }
                (self.block_q, self.block_k)
            }
            (PlanDetail::Lean(d), Algorithm::Lean) => {
                d.check(&self.problem, caps)?;
                (d.block_q(), d.block_k())
            }
            (PlanDetail::Amla(d), Algorithm::Amla) => {
                d.check(&self.problem)?;
                (d.block_q(), d.block_k())
            }
            (PlanDetail::Turbo(d), Algorithm::Turbo) => {
                d.check_device(&self.problem, caps)?;
                (d.block_q(), d.block_k())
            }
            (PlanDetail::TurboQuant(d), Algorithm::TurboQuant) => {
                d.check_device(&self.problem, caps)?;
                (d.block_q(), d.block_k())
            }
            (detail, algorithm) => {
                return bad(format!(
                    "the algorithm is {algorithm} but the detail is a {} plan",
                    detail.algorithm()
                ))
            }
        };
        if caps.backend == BackendKind::Cpu {
            // the CPU backend allocates O and LSE in host memory; refuse what would abort
            let out: u128 = self
                .problem
                .buffer_shapes()
                .iter()
                .filter(|(name, _)| matches!(*name, "o" | "lse"))
                .map(|(_, s)| crate::problem::buffer_bytes(s))
                .sum();
            crate::problem::check_host_memory("the outputs o and lse", out)?;
        }
        if (self.block_q, self.block_k) != detail_blocks {
            return bad(format!(
                "block_q x block_k = {} x {} but the {} detail says {} x {}",
                self.block_q, self.block_k, self.algorithm, detail_blocks.0, detail_blocks.1
            ));
        }
        Ok(())
    }
}

/// Largest block an exact plan may ask for (the planner uses [`EXACT_BLOCK`]); the CPU keeps one
/// block of scores per row, so a bound keeps a forged plan from sizing that buffer.
pub const MAX_EXACT_BLOCK: usize = 4096;

impl PlanDetail {
    /// The algorithm this detail belongs to.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            PlanDetail::Exact => Algorithm::Exact,
            PlanDetail::Lean(_) => Algorithm::Lean,
            PlanDetail::Amla(_) => Algorithm::Amla,
            PlanDetail::Turbo(_) => Algorithm::Turbo,
            PlanDetail::TurboQuant(_) => Algorithm::TurboQuant,
        }
    }
}
