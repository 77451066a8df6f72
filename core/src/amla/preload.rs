//! AMLA Preload Pipeline (section 4.1, Theorem 4.1, Appendix B). SKELETON.

use serde::{Deserialize, Serialize};

/// A Preload Pipeline schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreloadPipeline {
    /// Number of Cube stages issued ahead of the first Vector stage.
    pub preload_count: usize,
}

impl PreloadPipeline {
    /// AMLA's own case: n = 2 Cube/Vector pairs (C1, V1, C2, V2 with [V2] = 0), Preload count 2.
    pub fn amla_default() -> PreloadPipeline {
        PreloadPipeline { preload_count: 2 }
    }
}
