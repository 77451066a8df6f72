//! ferrattn: one Rust API for four published attention algorithms on CPU, CUDA and Ascend.
//!
//! ```no_run
//! use ferrattn::{Algorithm, AttentionInputs, AttentionOptions, BackendChoice, DType, Runtime, Tensor};
//! let mut rng = rand::thread_rng();
//! let q = Tensor::randn(&[1, 1, 8, 64], DType::F16, 1.0, &mut rng);
//! let k = Tensor::randn(&[1, 1000, 2, 64], DType::F16, 1.0, &mut rng);
//! let v = Tensor::randn(&[1, 1000, 2, 64], DType::F16, 1.0, &mut rng);
//! let x = AttentionInputs::new(q, k, v);
//! let problem = x.problem(AttentionOptions::default(), None)?;
//! let sel = Runtime::select(BackendChoice::Auto, Algorithm::Lean)?;
//! let plan = sel.runtime.plan(Algorithm::Lean, &problem)?;
//! let out = sel.runtime.run(&plan, &x)?;
//! # Ok::<(), ferrattn::FerrattnError>(())
//! ```
//!
//! The work is split as FlashInfer splits it: [`Runtime::plan`] is pure and host-side and
//! returns a serialisable [`AttentionPlan`]; [`Runtime::run`] executes it.

pub mod bench;
pub mod error;
pub mod golden_files;
pub mod io;
pub mod model;
pub mod runtime;

pub use error::{FerrattnError, Result};
pub use ferrattn_core::*;
pub use runtime::{devices, BackendChoice, DeviceReport, Runtime, Selection};

/// The git commit this binary was built from (`unknown` outside a git checkout).
pub const GIT_COMMIT: &str = env!("FERRATTN_GIT_COMMIT");
