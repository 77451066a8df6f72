//! TurboQuant KV compression with QJL correction. SKELETON.

use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, BlockSizes, CoreError, DeviceCaps, Result,
};
use serde::{Deserialize, Serialize};

/// TurboQuant settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurboQuantConfig {
    /// Keys per tile of the fused decode.
    pub block_k: usize,
}

impl BlockSizes for TurboQuantConfig {
    fn block_q(&self) -> usize {
        1
    }
    fn block_k(&self) -> usize {
        self.block_k
    }
}

/// Plans TurboQuant attention.
pub fn plan(_p: &AttentionProblem, _caps: &DeviceCaps) -> Result<TurboQuantConfig> {
    Err(CoreError::Unsupported {
        what: "turboquant (not written yet)".into(),
        supported: "none".into(),
    })
}

/// Attention over a TurboQuant-compressed K and V.
pub fn emulate(
    _cfg: &TurboQuantConfig,
    _p: &AttentionProblem,
    _x: &AttentionInputs,
) -> Result<AttentionOutput> {
    Err(CoreError::Unsupported {
        what: "turboquant (not written yet)".into(),
        supported: "none".into(),
    })
}
