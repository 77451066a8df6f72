//! AMLA hierarchical tiling (section 4.2). SKELETON.

use serde::{Deserialize, Serialize};

/// Single/base tile sizes and buffer counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HierarchicalTiling {
    /// Single-tile M.
    pub single_m: usize,
}

impl HierarchicalTiling {
    /// The paper's Ascend 910 values (section 4.2).
    pub fn ascend910() -> HierarchicalTiling {
        HierarchicalTiling { single_m: 256 }
    }
}
