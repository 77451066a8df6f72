//! Element types a tensor can be stored in on a device.
//!
//! Host tensors in `ferrattn-core` keep their values as `f32` that are already
//! exactly representable in their [`DType`]; a backend converts to the device
//! encoding at its boundary. This keeps every emulation readable in plain `f32`.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// Storage type of an attention input or output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
}

impl DType {
    /// Bytes per element in device memory.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Rounds `x` to the nearest value representable in this type (round to nearest even).
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::F32 => x,
            DType::F16 => f16::from_f32(x).to_f32(),
            DType::BF16 => bf16::from_f32(x).to_f32(),
        }
    }

    /// Largest finite value of this type.
    pub fn max_finite(self) -> f32 {
        match self {
            DType::F32 => f32::MAX,
            DType::F16 => f16::MAX.to_f32(),
            DType::BF16 => bf16::MAX.to_f32(),
        }
    }

    /// Parses `f32`, `f16`/`fp16`, `bf16`.
    pub fn parse(s: &str) -> Option<DType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Some(DType::F32),
            "f16" | "fp16" | "float16" | "half" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::BF16),
            _ => None,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        })
    }
}

/// Rounds `x` to bfloat16 and back (the cast AMLA applies before every Cube stage).
#[inline]
pub fn to_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Rounds `x` to binary16 and back.
#[inline]
pub fn to_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}
