//! Helpers shared by the GPU test binaries.

use ferrattn_cuda::{CudaBackend, Options};

/// The backend on GPU 0 with poisoned outputs, or `None` after printing why the test is skipped.
pub fn backend(test: &str, options: Options) -> Option<CudaBackend> {
    let b = CudaBackend::with_options(
        0,
        Options {
            poison_outputs: true,
            ..options
        },
    );
    match b.gpu() {
        Ok(_) => Some(b),
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            None
        }
    }
}

/// `FERRATTN_GPU_TEST_SCALE=small` (the sanitizer runs) asks for the small grid only.
pub fn small_only() -> bool {
    std::env::var("FERRATTN_GPU_TEST_SCALE").is_ok_and(|s| s == "small")
}
