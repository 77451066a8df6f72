//! AMLA hierarchical tiling (section 4.2). SKELETON.

use serde::{Deserialize, Serialize};

/// Single/base tile sizes and buffer counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HierarchicalTiling {
    /// Single-tile M.
    pub single_m: usize,
}
