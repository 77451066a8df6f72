//! AMLA (Liao et al.): MLA decode with FP32 rescaling as INT32 addition. SKELETON.

pub mod preload;
pub mod tiling;

use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, BlockSizes, CoreError, DeviceCaps, Result,
};
use serde::{Deserialize, Serialize};

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

/// Plans an AMLA decode.
pub fn plan(_p: &AttentionProblem, _caps: &DeviceCaps) -> Result<AmlaPlan> {
    Err(CoreError::Unsupported {
        what: "amla (not written yet)".into(),
        supported: "none".into(),
    })
}

/// CPU emulation of AMLA Algorithm 2.
pub fn emulate(
    _plan: &AmlaPlan,
    _p: &AttentionProblem,
    _x: &AttentionInputs,
) -> Result<AttentionOutput> {
    Err(CoreError::Unsupported {
        what: "amla (not written yet)".into(),
        supported: "none".into(),
    })
}
