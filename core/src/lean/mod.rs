//! LeanAttention (Sanovar et al.): stream-K decode. SKELETON — the owner of this module fills it.

use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, BlockSizes, CoreError, DeviceCaps, Result,
};
use serde::{Deserialize, Serialize};

/// Plan of a stream-K decode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeanPlan {
    /// Keys per LeanTile (B_c).
    pub tile_k: usize,
    /// Persistent CTAs in the grid.
    pub num_ctas: usize,
}

impl BlockSizes for LeanPlan {
    fn block_q(&self) -> usize {
        1
    }
    fn block_k(&self) -> usize {
        self.tile_k
    }
}

/// Plans a stream-K decode.
pub fn plan(_p: &AttentionProblem, _caps: &DeviceCaps) -> Result<LeanPlan> {
    Err(CoreError::Unsupported {
        what: "lean (not written yet)".into(),
        supported: "none".into(),
    })
}

/// CPU emulation of the stream-K decode.
pub fn emulate(
    _plan: &LeanPlan,
    _p: &AttentionProblem,
    _x: &AttentionInputs,
) -> Result<AttentionOutput> {
    Err(CoreError::Unsupported {
        what: "lean (not written yet)".into(),
        supported: "none".into(),
    })
}
