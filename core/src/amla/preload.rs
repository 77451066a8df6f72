//! AMLA Preload Pipeline (section 4.1, Theorem 4.1, Appendix B). SKELETON.

use serde::{Deserialize, Serialize};

/// A Preload Pipeline schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreloadPipeline {
    /// Number of Cube stages issued ahead of the first Vector stage.
    pub preload_count: usize,
}
