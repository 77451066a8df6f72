//! `ferrattn._ferrattn`: the native half of the Python package `ferrattn`.
//!
//! Every tensor crosses the boundary as a DLPack capsule ([`dlpack`]); [`ops`] checks the
//! capsules (device, dtype, rank, strides, alignment, page tables) before anything reads
//! through them and raises the typed exceptions of [`error`]. The Python half (`ferrattn/`)
//! picks the stream, allocates outputs through the caller's framework and registers the torch
//! and transformers integrations.

mod cp;
mod cuda;
mod dlpack;
mod error;
mod host;
mod ops;
mod turbo_cuda;
mod turboquant;

use pyo3::prelude::*;

#[pymodule]
fn _ferrattn(py: Python<'_>, m: &Bound<'_, PyModule>) -> PyResult<()> {
    error::register(py, m)?;
    m.add_function(wrap_pyfunction!(ops::attention, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::probe_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(ops::cpu_threads, m)?)?;
    m.add_function(wrap_pyfunction!(cp::merge_states, m)?)?;
    m.add_class::<ops::PagedDecodePlan>()?;
    m.add_class::<ops::TurboCache>()?;
    m.add_class::<turboquant::TurboQuantCache>()?;
    m.add_class::<ops::DeviceDecode>()?;
    m.add_class::<dlpack::Exported>()?;
    m.add("GIT_COMMIT", ferrattn::GIT_COMMIT)?;
    Ok(())
}
