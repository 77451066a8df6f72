//! The checked-in golden files, run through every backend of this build.
//!
//! Each case lists the algorithms that cover it; every (algorithm, backend) pair in the support
//! matrix runs it, and pairs that cannot run here are listed as data with the reason, never
//! skipped silently.

use ferrattn::golden_files::{generate, load_dir, GoldenCase};
use ferrattn::io::read_file;
use ferrattn::runtime::supported_on;
use ferrattn::{Algorithm, BackendChoice, BackendKind, Comparison, DType, Runtime, Tolerance};
use std::path::Path;

fn golden_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden"))
}

/// Accuracy an algorithm promises against exact attention on the golden inputs (unit-variance
/// Gaussian q, k, v). Exact and Lean compute exact softmax attention, so they meet the dtype's
/// output tolerance. Approximate algorithms have their own bounds, justified beside each.
fn tolerance(algo: Algorithm, dtype: DType) -> Tolerance {
    match algo {
        Algorithm::Exact | Algorithm::Lean => Tolerance::output(dtype),
        // AMLA casts Q, K, V and the scaled P to BF16 before each Cube stage (Alg. 2):
        // 2^-8 relative rounding on each operand, averaged over hundreds of keys.
        Algorithm::Amla => Tolerance {
            rel_fro: 1e-2,
            max_abs: 5e-2,
        },
        // The default config keeps half the KV heads at 2 bits. core/src/turbo/tests.rs derives
        // a quantisation-noise bound per bit width for Gaussian inputs; the loosest path of the
        // default (mixed 2/4-bit decode) is bounded there by 0.60 relative Frobenius error.
        Algorithm::Turbo => Tolerance {
            rel_fro: 0.60,
            max_abs: 3.0,
        },
        // Default: 4-bit keys (3-bit codebook + QJL) and 3-bit values. The model of
        // core/src/turboquant (rel. error ~ sqrt(exp(var_logit) - 1 + D_v)) predicts 0.48 for
        // 3-bit keys and values, an upper bound for this default.
        Algorithm::TurboQuant => Tolerance {
            rel_fro: 0.48,
            max_abs: 3.0,
        },
    }
}

/// (backend, algorithm, case, reason): pairs in the support matrix that do not cover a golden
/// case. A listed pair must fail to plan; one that starts to pass is reported as stale.
const KNOWN_GAPS: &[(BackendKind, Algorithm, &str, &str)] = &[
    (
        BackendKind::Cuda,
        Algorithm::Turbo,
        "mha_f32_prefill_causal",
        "the INT8 tensor-core kernels read f16/bf16 tiles; f32 runs on the cpu",
    ),
    (
        BackendKind::Cuda,
        Algorithm::TurboQuant,
        "gqa_bf16_decode_sq4_causal",
        "the TurboQuant kernels take f16 inputs; bf16 runs on the cpu",
    ),
];

fn as_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

#[test]
fn golden_files_match_a_fresh_generation() {
    let tmp = std::env::temp_dir().join(format!("ferrattn-golden-{}", std::process::id()));
    let written = generate(&tmp).unwrap();
    for path in &written {
        // safetensors orders metadata keys by hash, so compare decoded contents, not bytes
        let fresh = read_file(path).unwrap();
        let checked_in = read_file(&golden_dir().join(path.file_name().unwrap()))
            .unwrap_or_else(|e| panic!("{e}; run `ferrattn golden` to create it"));
        assert!(
            fresh.tensors == checked_in.tensors
                && fresh.ints == checked_in.ints
                && fresh.metadata == checked_in.metadata,
            "{} differs from a fresh generation; run `ferrattn golden`",
            path.display()
        );
    }
    std::fs::remove_dir_all(&tmp).ok();
}

fn check_case(case: &GoldenCase, algo: Algorithm, rt: &Runtime) -> Result<String, String> {
    let plan = rt
        .plan(algo, &case.problem)
        .map_err(|e| format!("plan: {e}"))?;
    let out = rt
        .run(&plan, &case.inputs)
        .map_err(|e| format!("run: {e}"))?;
    let co = Comparison::new(&as_f64(&case.o_ref.data), &as_f64(&out.o.data));
    co.check("O", &tolerance(algo, case.problem.dtype))?;
    if matches!(algo, Algorithm::Exact | Algorithm::Lean | Algorithm::Amla) {
        let cl = Comparison::new(&as_f64(&case.lse_ref.data), &as_f64(&out.lse.data));
        cl.check("LSE", &Tolerance::lse())?;
    }
    Ok(format!("{co}"))
}

#[test]
fn every_backend_passes_the_golden_files() {
    let cases = load_dir(golden_dir()).unwrap();
    assert_eq!(cases.len(), ferrattn::golden_files::CASES.len());
    let mut failures = vec![];
    let mut gaps = vec![];
    let mut ran = 0;
    for case in &cases {
        for &algo in &case.algorithms {
            for &backend in supported_on(algo) {
                let rt = match Runtime::select(BackendChoice::Exactly(backend), algo) {
                    Ok(sel) => sel.runtime,
                    Err(e) => {
                        gaps.push(format!("{backend} / {algo} / {}: {e}", case.name));
                        continue;
                    }
                };
                let known = KNOWN_GAPS
                    .iter()
                    .find(|g| g.0 == backend && g.1 == algo && g.2 == case.name);
                if let Some((_, _, _, reason)) = known {
                    match rt.plan(algo, &case.problem) {
                        Err(_) => gaps.push(format!(
                            "{backend} / {algo} / {}: known gap: {reason}",
                            case.name
                        )),
                        Ok(_) => failures.push(format!(
                            "{backend} / {algo} / {}: listed as a gap but plans; update KNOWN_GAPS",
                            case.name
                        )),
                    }
                    continue;
                }
                match check_case(case, algo, &rt) {
                    Ok(summary) => {
                        ran += 1;
                        println!("ok   {backend:<6} {algo:<10} {:<28} {summary}", case.name);
                    }
                    Err(e) => failures.push(format!("{backend} / {algo} / {}: {e}", case.name)),
                }
            }
        }
    }
    for g in &gaps {
        println!("gap  {g}");
    }
    assert!(
        failures.is_empty(),
        "golden failures:\n{}",
        failures.join("\n")
    );
    assert!(
        ran >= cases.len(),
        "only {ran} (case, algorithm, backend) runs"
    );
}
