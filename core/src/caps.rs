//! What a device offers the planner.

use serde::{Deserialize, Serialize};

/// Which backend family a device belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The host CPU (always present; runs the emulations).
    Cpu,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
    /// A Huawei Ascend NPU through CANN, or its simulated schedule.
    Ascend,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Ascend => "ascend",
        })
    }
}

/// Capabilities of one device, as the planner needs them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceCaps {
    /// Backend family.
    pub backend: BackendKind,
    /// Human-readable device name.
    pub name: String,
    /// Parallel compute units: SMs (CUDA), AI cores (Ascend), worker threads (CPU).
    pub compute_units: usize,
    /// Resident CTAs per compute unit the planner may assume for persistent kernels.
    pub ctas_per_unit: usize,
    /// Shared memory (CUDA) or unified buffer (Ascend) bytes one block may use.
    pub shared_mem_per_block: usize,
    /// Last-level cache bytes.
    pub l2_bytes: usize,
    /// CUDA compute capability `(major, minor)`; `None` elsewhere.
    pub compute_capability: Option<(u32, u32)>,
    /// Peak DRAM bandwidth in bytes per second (CUDA: memory clock x bus width x 2, as the driver
    /// reports them); `None` when unknown. The Lean planner reads it per compute unit
    /// ([`DeviceCaps::dram_bytes_per_unit`]). Absent from older serialised caps (`None`).
    #[serde(default)]
    pub dram_bytes_per_s: Option<u64>,
}

impl DeviceCaps {
    /// CTAs the device holds at once: `compute_units * ctas_per_unit` (the latter at least 1).
    /// Saturating, as caps may come from a caller or a file: an absurd count gives a grid the
    /// planners clamp to the work, not an overflow.
    pub fn slots(&self) -> usize {
        self.compute_units.saturating_mul(self.ctas_per_unit.max(1))
    }

    /// Peak DRAM bandwidth per compute unit (bytes per second), when the bandwidth is known.
    pub fn dram_bytes_per_unit(&self) -> Option<u64> {
        self.dram_bytes_per_s
            .map(|b| b / self.compute_units.max(1) as u64)
    }

    /// The host CPU with `threads` workers.
    pub fn cpu(threads: usize) -> DeviceCaps {
        DeviceCaps {
            backend: BackendKind::Cpu,
            name: format!("host CPU ({threads} threads)"),
            compute_units: threads.max(1),
            ctas_per_unit: 1,
            shared_mem_per_block: 1 << 20,
            l2_bytes: 32 << 20,
            compute_capability: None,
            dram_bytes_per_s: None,
        }
    }

    /// An H100/H200-class GPU (132 SMs, 227 KiB shared memory per block, 50 MiB L2), for planning
    /// without a device present. A real device reports its own numbers.
    pub fn hopper_reference() -> DeviceCaps {
        DeviceCaps {
            backend: BackendKind::Cuda,
            name: "Hopper reference (132 SMs)".into(),
            compute_units: 132,
            ctas_per_unit: 2,
            shared_mem_per_block: 227 * 1024,
            l2_bytes: 50 << 20,
            compute_capability: Some((9, 0)),
            // unknown: H100 and H200 differ (3.35 / 4.8 TB/s) and plan differently
            dram_bytes_per_s: None,
        }
    }

    /// One die of an Ascend 910 (AMLA Table 1: 24 Cube cores, 48 Vector cores, 192 KB UB per
    /// Vector core).
    pub fn ascend910_reference() -> DeviceCaps {
        DeviceCaps {
            backend: BackendKind::Ascend,
            name: "Ascend 910 reference (24 AI cores per die)".into(),
            compute_units: 24,
            ctas_per_unit: 1,
            shared_mem_per_block: 192 * 1024,
            l2_bytes: 96 << 20,
            compute_capability: None,
            dram_bytes_per_s: None,
        }
    }
}
