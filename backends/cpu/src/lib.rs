//! `ferrattn-cpu`: the embedded default backend.
//!
//! Runs every algorithm's CPU emulation from `ferrattn-core` (parallel with rayon), so a user
//! without a GPU or NPU can run and check everything at small scale. Exact attention runs a
//! blocked online-softmax in `f32` ([`exact`]), the same structure a GPU kernel uses, not the
//! `f64` golden reference it is tested against.

pub mod device;
pub mod exact;

pub use device::{CpuBackend, CpuError};
