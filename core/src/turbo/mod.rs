//! TurboAttention (Kang et al., MLSys 2025): FlashQ + SAS. SKELETON.

use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, BlockSizes, CoreError, DeviceCaps, Result,
};
use serde::{Deserialize, Serialize};

/// TurboAttention settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurboConfig {
    /// Query rows per block (B_r).
    pub block_q: usize,
    /// Key columns per block (B_c).
    pub block_k: usize,
}

impl BlockSizes for TurboConfig {
    fn block_q(&self) -> usize {
        self.block_q
    }
    fn block_k(&self) -> usize {
        self.block_k
    }
}

/// Plans TurboAttention.
pub fn plan(_p: &AttentionProblem, _caps: &DeviceCaps) -> Result<TurboConfig> {
    Err(CoreError::Unsupported {
        what: "turbo (not written yet)".into(),
        supported: "none".into(),
    })
}

/// CPU emulation (prefill, or prefill of the context then decode).
pub fn emulate(
    _cfg: &TurboConfig,
    _p: &AttentionProblem,
    _x: &AttentionInputs,
) -> Result<AttentionOutput> {
    Err(CoreError::Unsupported {
        what: "turbo (not written yet)".into(),
        supported: "none".into(),
    })
}
