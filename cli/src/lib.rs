//! The library half of the `ferrattn` command line: everything the CLI needs that an engine
//! embedding `ferrattn` does not (benchmark suite, model runner, sessions, golden and tensor
//! files), kept out of the facade so `cargo add ferrattn` brings no clap, indicatif, plotters,
//! rayon, rand or tracing-subscriber. It re-exports the facade, so `ferrattn_cli::X` names the
//! same items as `ferrattn::X`.

pub mod bench;
pub mod error;
pub mod golden_files;
pub mod io;
pub mod model;
pub mod session;
pub mod turboquant_session;

pub use ferrattn::*;
