//! The simulated Ascend path: the kernel's numerics on the CPU ([`numerics`]), a discrete-event
//! timing model of an Ascend 910 ([`timing`]), its Gantt chart ([`timeline`]) and the paper's
//! performance sweep ([`repro`]). Everything here is SIMULATED and labelled so.

pub mod numerics;
pub mod repro;
#[cfg(feature = "svg")]
pub mod timeline;
pub mod timing;
