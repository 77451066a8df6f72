//! Tests of the AMLA plan, emulation and accuracy reproduction.

use super::accuracy::{self, AccuracySetup, AccuracyTable};
use super::*;
use crate::golden::{exact_attention, exact_attention_f64};
use crate::{AttentionOptions, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn caps() -> DeviceCaps {
    DeviceCaps::cpu(2)
}

/// An MLA problem with per-sequence KV lengths.
fn mla_problem(
    heads: usize,
    sq: usize,
    lens_k: &[usize],
    dqk: usize,
    dv: usize,
    causal: bool,
) -> AttentionProblem {
    let sk = lens_k.iter().copied().max().unwrap_or(1).max(1);
    let mut p = AttentionProblem::uniform(lens_k.len(), sq, sk, heads, 1, dqk, dv, DType::BF16);
    p.kv_layout = KvLayout::MlaLatent;
    p.seqlens_k = lens_k.to_vec();
    p.causal = causal;
    p
}

fn mla_inputs(p: &AttentionProblem, scale: f32, seed: u64) -> AttentionInputs {
    let mut rng = StdRng::seed_from_u64(seed);
    let q = Tensor::randn(
        &[p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk],
        DType::BF16,
        scale,
        &mut rng,
    );
    let kv = Tensor::randn(
        &[p.batch, p.max_seqlen_k, 1, p.head_dim_qk],
        DType::BF16,
        scale,
        &mut rng,
    );
    AttentionInputs {
        seqlens_q: Some(p.seqlens_q.iter().map(|&l| l as i64).collect()),
        seqlens_k: Some(p.seqlens_k.iter().map(|&l| l as i64).collect()),
        ..AttentionInputs::mla(q, kv)
    }
}

/// Relative Frobenius error of `o` against the f64 golden O, and the largest LSE error.
fn errors_vs_golden(
    p: &AttentionProblem,
    x: &AttentionInputs,
    out: &AttentionOutput,
) -> (f64, f64) {
    let (go, glse) = exact_attention_f64(p, x);
    let rel = accuracy::relative_frobenius(&out.o.data, &go);
    let mut lse_err = 0.0f64;
    for (&a, &g) in out.lse.data.iter().zip(&glse) {
        if g == f64::NEG_INFINITY {
            assert_eq!(a, f32::NEG_INFINITY, "row with no key must have LSE = -inf");
        } else {
            lse_err = lse_err.max((a as f64 - g).abs());
        }
    }
    (rel, lse_err)
}

/// Rows with no visible key and padding rows must be exactly zero, as in the golden output.
fn assert_zero_rows_match(p: &AttentionProblem, x: &AttentionInputs, out: &AttentionOutput) {
    let g = exact_attention(p, x);
    for (i, (&a, &r)) in out.o.data.iter().zip(&g.o.data).enumerate() {
        if r == 0.0 && g.lse.data[lse_index_of(p, i)] == f32::NEG_INFINITY {
            assert_eq!(a, 0.0, "O[{i}] of a row with no key must be 0");
        }
    }
}

fn lse_index_of(p: &AttentionProblem, flat_o: usize) -> usize {
    let row = flat_o / p.head_dim_v;
    let h = row % p.heads_q;
    let i = (row / p.heads_q) % p.max_seqlen_q;
    let b = row / (p.heads_q * p.max_seqlen_q);
    (b * p.heads_q + h) * p.max_seqlen_q + i
}

#[test]
fn plan_accepts_the_paper_case() {
    for sq in [1, 2] {
        let p = mla_problem(128, sq, &[8192, 100, 4097], 576, 512, sq == 2);
        let plan = plan(&p, &caps()).unwrap();
        assert_eq!(plan.block_k, 512);
        assert_eq!(plan.block_q, 128 * sq);
        assert!(plan.compensation);
        assert_eq!(plan.preload, preload::PreloadPipeline::amla_default());
        assert_eq!(plan.tiling, tiling::HierarchicalTiling::ascend910());
    }
    // more than 256 rows: tiles of 256
    let p = mla_problem(256, 2, &[64], 576, 512, false);
    assert_eq!(plan(&p, &caps()).unwrap().block_q, 256);
    let p = mla_problem(16, 1, &[64], 64, 48, false);
    assert_eq!(plan(&p, &caps()).unwrap().block_q, 16);
}

#[test]
fn plan_rejects_what_amla_does_not_cover() {
    let base = mla_problem(16, 1, &[64], 576, 512, false);

    let mut p = base.clone();
    p.kv_layout = KvLayout::Separate;
    let e = plan(&p, &caps()).unwrap_err();
    assert!(matches!(e, CoreError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("Separate"), "{e}");

    let mut p = base.clone();
    p.kv_layout = KvLayout::Separate;
    p.heads_kv = 2;
    let e = plan(&p, &caps()).unwrap_err();
    assert!(e.to_string().contains("2 KV heads"), "{e}");

    let mut p = base.clone();
    p.dtype = DType::F16;
    let e = plan(&p, &caps()).unwrap_err();
    assert!(
        matches!(e, CoreError::Unsupported { .. }) && e.to_string().contains("f16"),
        "{e}"
    );

    let mut p = base.clone();
    p.head_dim_v = 640;
    let e = plan(&p, &caps()).unwrap_err();
    assert!(matches!(e, CoreError::BadLength { value: 640, .. }), "{e}");

    let mut p = base.clone();
    p.max_seqlen_q = 3;
    p.seqlens_q = vec![3];
    let e = plan(&p, &caps()).unwrap_err();
    assert!(
        matches!(e, CoreError::BadLength { value: 3, .. })
            && e.to_string().contains("max_seqlen_q"),
        "{e}"
    );
}

#[test]
fn emulate_rejects_a_bad_plan_or_inputs() {
    let p = mla_problem(4, 1, &[40], 64, 48, false);
    let x = mla_inputs(&p, 1.0, 1);
    let mut pl = plan(&p, &caps()).unwrap();
    pl.block_k = 0;
    assert!(matches!(
        emulate(&pl, &p, &x),
        Err(CoreError::InvalidPlan(_))
    ));
    let pl = plan(&p, &caps()).unwrap();
    let mut wrong = p.clone();
    wrong.heads_q = 8;
    assert!(matches!(
        emulate(&pl, &wrong, &x),
        Err(CoreError::Shape { tensor: "q", .. })
    ));
}

/// Small head dims, lengths that miss block boundaries, ragged batches, Sq = 1 and 2.
#[test]
fn emulate_matches_golden_on_small_mla_shapes() {
    let lens = [1usize, 37, 513, 600, 0, 512];
    for (sq, causal) in [(1, false), (2, false), (2, true)] {
        for block_k in [512usize, 64, 7] {
            let mut p = mla_problem(6, sq, &lens, 64, 48, causal);
            if sq == 2 {
                p.seqlens_q = vec![2, 1, 2, 2, 2, 0];
            }
            let x = mla_inputs(&p, 1.0, 7 + block_k as u64);
            let mut pl = plan(&p, &caps()).unwrap();
            pl.block_k = block_k;
            for (name, out) in [
                ("amla", emulate(&pl, &p, &x).unwrap()),
                ("base", emulate_base(&pl, &p, &x).unwrap()),
            ] {
                assert_eq!(out.o.shape, vec![6, sq, 6, 48]);
                assert_eq!(out.lse.shape, vec![6, 6, sq]);
                assert_eq!(out.o.dtype, DType::BF16);
                let (rel, lse_err) = errors_vs_golden(&p, &x, &out);
                assert!(
                    rel < 4e-3,
                    "{name} sq={sq} causal={causal} block_k={block_k}: rel {rel:.3e}"
                );
                assert!(
                    lse_err < 1e-4,
                    "{name} sq={sq} block_k={block_k}: lse err {lse_err:.3e}"
                );
                assert_zero_rows_match(&p, &x, &out);
            }
        }
    }
}

/// The paper's dims (576/512) with few heads and short ragged lengths.
#[test]
fn emulate_matches_golden_at_576_512() {
    let p = mla_problem(3, 2, &[37, 600, 1, 513], 576, 512, true);
    let x = mla_inputs(&p, 1.0, 3);
    let pl = plan(&p, &caps()).unwrap();
    let out = emulate(&pl, &p, &x).unwrap();
    let (rel, lse_err) = errors_vs_golden(&p, &x, &out);
    assert!(rel < 4e-3, "rel {rel:.3e}");
    assert!(lse_err < 1e-4, "lse err {lse_err:.3e}");
    assert_zero_rows_match(&p, &x, &out);
    // the validated public path gives the same problem
    let q = x
        .problem(
            AttentionOptions {
                causal: true,
                softmax_scale: None,
            },
            Some(512),
        )
        .unwrap();
    assert_eq!(q, p);
}

#[test]
fn shared_scores_give_the_same_bits_as_single_runs() {
    let mut p = mla_problem(9, 2, &[600, 37, 1], 64, 48, true);
    p.seqlens_q = vec![2, 1, 2];
    let x = mla_inputs(&p, 2.0, 9);
    let all = [
        Rescaling::Amla(Compensation::AppendixA),
        Rescaling::Amla(Compensation::Off),
        Rescaling::Base,
        Rescaling::NaiveEq3,
    ];
    let multi = emulate::run_f32_multi(&p, &x, 64, &all).unwrap();
    for (r, (o, lse)) in all.iter().zip(&multi) {
        let (o1, lse1) = emulate::run_f32(&p, &x, 64, *r).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(o), bits(&o1), "{r:?}");
        assert_eq!(bits(lse), bits(&lse1), "{r:?}");
    }
}

#[test]
fn accuracy_golden_matches_the_core_golden() {
    for (sq, causal) in [(1, false), (2, true)] {
        let mut p = mla_problem(11, sq, &[1, 300, 0, 777], 576, 512, causal);
        if sq == 2 {
            p.seqlens_q = vec![2, 1, 2, 0];
        }
        let x = mla_inputs(&p, 2.0, 5);
        let (want, _) = exact_attention_f64(&p, &x);
        let got = accuracy::golden_f64(&p, &x);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-12 * w.abs().max(1e-3), "{g} vs {w}");
        }
    }
}

#[test]
fn int32_add_equals_multiplication_by_power_of_two() {
    let values = [
        1.0f32,
        -1.0,
        0.5,
        -0.5,
        std::f32::consts::PI,
        -std::f32::consts::E,
        1.5e-20,
        -3.25e-30,
        6.0e30,
        -1.0e35,
        f32::MIN_POSITIVE * 8.0,
        -f32::MIN_POSITIVE * 1024.0,
        123_456.79,
        -0.001_234_5,
    ];
    for &x in &values {
        let e = ((x.to_bits() >> 23) & 0xff) as i32;
        for k in -40..=40 {
            // Lemma 3.1's range: 0 < E + k < 255
            if e + k <= 0 || e + k >= 255 {
                continue;
            }
            let want = x * 2f32.powi(k);
            assert_eq!(
                mul_pow2_by_int_add(x, k).to_bits(),
                want.to_bits(),
                "{x} * 2^{k}"
            );
            assert_eq!(
                int32_add_raw(x, k * EXPONENT_UNIT).to_bits(),
                want.to_bits(),
                "raw {x} * 2^{k}"
            );
        }
    }
    // zero keeps its sign and value; the raw hardware addition turns +0 into -inf, -0 into +inf
    assert_eq!(mul_pow2_by_int_add(0.0, -3).to_bits(), 0.0f32.to_bits());
    assert_eq!(mul_pow2_by_int_add(-0.0, -3).to_bits(), (-0.0f32).to_bits());
    assert_eq!(int32_add_raw(0.0, -EXPONENT_UNIT), f32::NEG_INFINITY);
    assert_eq!(int32_add_raw(-0.0, -EXPONENT_UNIT), f32::INFINITY);
    // subnormals flush to signed zero; underflow to signed zero; overflow to signed inf
    assert_eq!(mul_pow2_by_int_add(1e-40, -1), 0.0);
    assert_eq!(
        mul_pow2_by_int_add(-1e-40, -1).to_bits(),
        (-0.0f32).to_bits()
    );
    assert_eq!(mul_pow2_by_int_add(f32::MIN_POSITIVE * 2.0, -5), 0.0);
    assert_eq!(
        mul_pow2_by_int_add(-f32::MIN_POSITIVE, -1).to_bits(),
        (-0.0f32).to_bits()
    );
    assert_eq!(mul_pow2_by_int_add(1e38, 10), f32::INFINITY);
    assert_eq!(mul_pow2_by_int_add(-1e38, 10), f32::NEG_INFINITY);
    // a non-multiple of 2^23 scales the mantissa: +1.5 * 2^23 e multiplies a value with
    // mantissa ~0.5 by ~(1 + e) (Appendix A)
    let eps = 1e-3f32;
    let x = -1.5f32;
    let y = int32_add_on_bits(x, (1.5 * eps * EXPONENT_UNIT as f32).round() as i32);
    assert!(((y / x) - (1.0 + eps)).abs() < 1e-6, "{y}");
    assert!(y < 0.0);
}

/// Scores above 88: the naive Eq. 3 overflows FP32, AMLA and Base stay finite and accurate.
#[test]
fn naive_eq3_overflows_above_88_and_amla_does_not() {
    let p = mla_problem(4, 1, &[700, 300], 64, 48, false);
    // N(0, 64) inputs: scores q.k / 8 have std 64; every row maximum exceeds 88
    let x = mla_inputs(&p, 8.0, 11);
    let pl = plan(&p, &caps()).unwrap();
    let (_, glse) = exact_attention_f64(&p, &x);
    assert!(
        glse.iter().all(|&l| l > 88.0),
        "test needs m > 88: {glse:?}"
    );
    let naive = emulate_naive_eq3(&pl, &p, &x).unwrap();
    assert!(
        naive.o.data.iter().all(|v| !v.is_finite()),
        "naive Eq. 3 must overflow"
    );
    for out in [
        emulate(&pl, &p, &x).unwrap(),
        emulate_base(&pl, &p, &x).unwrap(),
    ] {
        assert!(out.o.data.iter().all(|v| v.is_finite()));
        let (rel, lse_err) = errors_vs_golden(&p, &x, &out);
        assert!(rel < 4e-3, "rel {rel:.3e}");
        assert!(lse_err < 1e-3, "lse {lse_err:.3e}");
    }
    // below 88 the naive rescale is fine (N(0, 1/4) inputs: scores of std 1/4)
    let small = mla_inputs(&p, 0.5, 11);
    let naive = emulate_naive_eq3(&pl, &p, &small).unwrap();
    let (rel, _) = errors_vs_golden(&p, &small, &naive);
    assert!(rel < 4e-3, "naive below 88: {rel:.3e}");
}

/// Appendix A compensation is no worse than none; line 11 as printed (c_i = S32/S16) is worse.
#[test]
fn compensation_helps() {
    // many blocks and a growing maximum so the rescale with epsilon != 0 happens often
    let p = mla_problem(16, 1, &[2048, 2048], 64, 64, false);
    let (mut on, mut off, mut printed) = (0.0, 0.0, 0.0);
    for seed in 0..4 {
        let x = mla_inputs(&p, 1.0, 100 + seed);
        let (golden, _) = exact_attention_f64(&p, &x);
        let err = |r| {
            let (o, _) = emulate::run_f32(&p, &x, 64, r).unwrap();
            accuracy::relative_frobenius(&o, &golden) // FP32 output: the rescaling error alone
        };
        on += err(Rescaling::Amla(Compensation::AppendixA));
        off += err(Rescaling::Amla(Compensation::Off));
        printed += err(Rescaling::Amla(Compensation::Line11AsPrinted));
    }
    eprintln!("FP32-output error x4: on {on:.3e}, off {off:.3e}, line 11 as printed {printed:.3e}");
    assert!(
        on <= off,
        "compensation on {on:.3e} worse than off {off:.3e}"
    );
    assert!(
        printed > off,
        "line 11 as printed {printed:.3e} vs off {off:.3e}"
    );
}

/// How the paper's metric was pinned down (a report, not a check): for each column, the error
/// of AMLA, Base and uncompensated AMLA against Golden under five readings of section 5.1 —
/// the method's output in BF16, FP16 or FP32, against an unrounded golden (`raw`) or a golden
/// rounded to BF16 (`bf16g`). `bf16/raw` matches Tables 3 and 4 within 1% on the eight columns
/// whose error does not hinge on a few near-tie rows; `f16/bf16g` within 0-3% (the golden's
/// rounding standing in for the output's); the other three miss by 7-64%. See the module
/// documentation of `accuracy` for the reading adopted.
/// `AMLA_EXPLORE_SAMPLES`, `_HEADS`, `_SK`, `_BATCH`, `_TABLE` (3 or 4) select the run.
#[test]
#[ignore]
fn explore_metric_definitions() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let samples = env("AMLA_EXPLORE_SAMPLES", 2);
    let setup = AccuracySetup {
        batch: env("AMLA_EXPLORE_BATCH", 1),
        heads: env("AMLA_EXPLORE_HEADS", 128),
        seq_k: env("AMLA_EXPLORE_SK", 8192),
        ..AccuracySetup::paper()
    };
    let tables: Vec<AccuracyTable> = match env("AMLA_EXPLORE_TABLE", 0) {
        3 => vec![AccuracyTable::Table3],
        4 => vec![AccuracyTable::Table4],
        _ => AccuracyTable::ALL.to_vec(),
    };
    let p = setup.problem();
    let rnd = |o: &[f32], d: DType| -> Vec<f32> { o.iter().map(|&v| d.round(v)).collect() };
    for table in tables {
        for (col, pubv) in table.published().iter().enumerate() {
            // acc[reading][method], methods: AMLA, Base, uncompensated AMLA
            let names = ["bf16/raw", "f16/raw", "f32/raw", "bf16/bf16g", "f16/bf16g"];
            let mut acc = vec![[0.0f64; 3]; names.len()];
            let t0 = std::time::Instant::now();
            for s in 0..samples {
                let mut rng =
                    StdRng::seed_from_u64(1000 * col as u64 + s as u64 + 77 * table as u64);
                let x = accuracy::sample_inputs(&pubv.distribution, &setup, &mut rng);
                let g = accuracy::golden_f64(&p, &x);
                let gb: Vec<f64> = g
                    .iter()
                    .map(|&v| DType::BF16.round(v as f32) as f64)
                    .collect();
                let variants = [
                    Rescaling::Amla(Compensation::AppendixA),
                    Rescaling::Base,
                    Rescaling::Amla(Compensation::Off),
                ];
                let outs = emulate::run_f32_multi(&p, &x, setup.block_k, &variants).unwrap();
                for (m, (o, _)) in outs.iter().enumerate() {
                    acc[0][m] += accuracy::relative_frobenius(&rnd(o, DType::BF16), &g);
                    acc[1][m] += accuracy::relative_frobenius(&rnd(o, DType::F16), &g);
                    acc[2][m] += accuracy::relative_frobenius(o, &g);
                    acc[3][m] += accuracy::relative_frobenius(&rnd(o, DType::BF16), &gb);
                    acc[4][m] += accuracy::relative_frobenius(&rnd(o, DType::F16), &gb);
                }
            }
            let n = samples as f64;
            println!(
                "{} {:>9} paper base {:.2e} amla {:.2e}   ({:.1}s)",
                table.name(),
                pubv.distribution.label(),
                pubv.base,
                pubv.amla,
                t0.elapsed().as_secs_f64()
            );
            for (v, name) in names.iter().enumerate() {
                println!(
                    "    {name:>10}: amla {:.3e} base {:.3e} amla-nocomp {:.3e}",
                    acc[v][0] / n,
                    acc[v][1] / n,
                    acc[v][2] / n
                );
            }
        }
    }
}

fn check_columns(columns: &[(AccuracyTable, usize, usize)]) {
    let setup = AccuracySetup::paper();
    let mut failures = Vec::new();
    for &(table, col, samples) in columns {
        let row = accuracy::reproduce_column(table, col, &setup, samples, 2025, &|_| {}).unwrap();
        eprintln!(
            "{} {:>9} ({:>3} samples): AMLA {:.3e} (paper {:.3e}, x{:.3}), Base {:.3e} (paper {:.3e}), \
             AMLA/Base {:.3}, uncompensated AMLA {:.3e}",
            table.name(),
            row.label,
            row.samples,
            row.amla,
            row.paper_amla,
            row.amla_over_paper,
            row.base,
            row.paper_base,
            row.amla_over_base,
            row.amla_uncompensated
        );
        if (row.amla_over_paper - 1.0).abs() > 0.10 || row.amla_over_base > 1.05 {
            failures.push(format!("{} {}: {row:?}", table.name(), row.label));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Tables 3 and 4 at the paper's shape (batch 1, 128 heads, one query token, 8K context,
/// 576/512) with fewer samples than the paper's 100: every AMLA value within 10% of the
/// published one, and AMLA no more than 5% worse than Base.
///
/// Sample counts follow the spread of the per-sample error measured over 100 samples
/// (standard deviation / mean): <= 5% for the first four Gaussian and the first four uniform
/// columns (2 samples), 10% for N(0,100) and U(-20,20) (8 samples, ~3.5% standard error).
/// U(-60,60) is in [`acceptance_table_4_u60`].
#[test]
fn acceptance_tables_3_and_4() {
    let mut cols = Vec::new();
    for table in AccuracyTable::ALL {
        for col in 0..6 {
            match (table, col) {
                (AccuracyTable::Table4, 5) => {}
                (AccuracyTable::Table3, 5) | (AccuracyTable::Table4, 4) => {
                    cols.push((table, col, 8))
                }
                _ => cols.push((table, col, 2)),
            }
        }
    }
    check_columns(&cols);
}

/// U(-60,60) of Table 4. Its error comes from the ~2% of rows whose two best keys lie within a
/// few logits of each other (all other rows are exactly one-hot: O = V_argmax, no error), so the
/// per-sample error spreads by 31% (standard deviation / mean) and 100 samples (the paper's
/// count) are needed for a 3% standard error. Our mean is 4% below the paper's at 128 rows per
/// sample. Ignored by default: ~50 s on 2 cores in the test profile
/// (`cargo test -p ferrattn-core acceptance_table_4_u60 -- --ignored`).
#[test]
#[ignore]
fn acceptance_table_4_u60() {
    check_columns(&[(AccuracyTable::Table4, 5, 100)]);
}

/// The CLI's run: both tables, `AMLA_REPRO_SAMPLES` samples (100), JSON rows written to
/// `AMLA_REPRO_OUT` (default `/tmp/amla_repro.json`).
#[test]
#[ignore]
fn reproduce_paper_tables() {
    let samples = std::env::var("AMLA_REPRO_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let out = std::env::var("AMLA_REPRO_OUT").unwrap_or_else(|_| "/tmp/amla_repro.json".into());
    let mut rows = Vec::new();
    for table in AccuracyTable::ALL {
        let t0 = std::time::Instant::now();
        rows.extend(accuracy::reproduce(table, samples, 42, &|_| {}));
        eprintln!("{} in {:.0}s", table.name(), t0.elapsed().as_secs_f64());
    }
    for r in &rows {
        eprintln!(
            "{} {:>9}: paper AMLA {:.2e} Base {:.2e} | ours AMLA {:.3e} Base {:.3e} uncomp {:.3e} | \
             AMLA/paper {:.3} AMLA/Base {:.3}",
            r.table.name(),
            r.label,
            r.paper_amla,
            r.paper_base,
            r.amla,
            r.base,
            r.amla_uncompensated,
            r.amla_over_paper,
            r.amla_over_base
        );
    }
    std::fs::write(out, serde_json::to_string_pretty(&rows).unwrap()).unwrap();
}
