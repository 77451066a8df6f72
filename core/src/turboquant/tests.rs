//! Tests of the TurboQuant module (small `d`, a few thousand samples at most).

use super::*;
use crate::compare::Comparison;
use crate::golden::exact_attention_f64;
use crate::{golden, AttentionOptions, DType, Tensor};
use rand::SeedableRng;

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Random GQA inputs with full lengths.
#[allow(clippy::too_many_arguments)]
fn inputs(
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dv: usize,
    seed: u64,
) -> AttentionInputs {
    let mut r = rng(seed);
    AttentionInputs::new(
        Tensor::randn(&[b, sq, hq, d], DType::F32, 1.0, &mut r),
        Tensor::randn(&[b, sk, hk, d], DType::F32, 1.0, &mut r),
        Tensor::randn(&[b, sk, hk, dv], DType::F32, 1.0, &mut r),
    )
}

fn problem(x: &AttentionInputs, causal: bool) -> AttentionProblem {
    x.problem(
        AttentionOptions {
            causal,
            softmax_scale: None,
        },
        None,
    )
    .unwrap()
}

fn to_f64(t: &Tensor) -> Vec<f64> {
    t.data.iter().map(|&v| v as f64).collect()
}

// ---------------------------------------------------------------- rotation

#[test]
fn rotation_is_orthogonal_and_reproducible_from_its_seed() {
    for d in [16usize, 64, 96, 128] {
        let r = Rotation::new(d, 42);
        let m = r.matrix();
        let mut worst = 0.0f64;
        for i in 0..d {
            for j in 0..d {
                let dot: f64 = (0..d)
                    .map(|k| m[i * d + k] as f64 * m[j * d + k] as f64)
                    .sum();
                let want = if i == j { 1.0 } else { 0.0 };
                worst = worst.max((dot - want).abs());
            }
        }
        assert!(worst < 1e-6, "d={d}: |Π Πᵀ - I| = {worst:e}");
        // the same seed rebuilds the same bits; another seed gives another matrix
        assert_eq!(
            r,
            Rotation::new(d, 42),
            "d={d}: rotation is not reproducible from its seed"
        );
        assert_ne!(r.matrix(), Rotation::new(d, 43).matrix());
        // apply_t inverts apply
        let x = rng::SeededRng::new(5).unit_vector(d);
        let (mut y, mut z) = (vec![0.0; d], vec![0.0; d]);
        r.apply(&x, &mut y);
        r.apply_t(&y, &mut z);
        let err = x
            .iter()
            .zip(&z)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-5, "d={d}: Πᵀ Π x differs from x by {err}");
    }
    // pinned values: a change of the generator or the construction shows up here
    // (SplitMix64's published first output for state 0 is 0xE220A8397B1DCDAF)
    let mut s0 = 0u64;
    assert_eq!(rng::splitmix64(&mut s0), 0xE220_A839_7B1D_CDAF);
    let mut g = rng::SeededRng::new(0);
    assert_eq!(g.next_u64(), 5_987_356_902_031_041_503);
    assert_eq!(g.normal(), -0.6237998987701002);
    assert_eq!(
        &Rotation::new(4, 0).matrix()[..4],
        &[-0.50534755f32, 0.4613463, 0.7273467, 0.05244289]
    );
}

#[test]
fn rotated_unit_vector_coordinates_have_variance_one_over_d() {
    let d = 64;
    let mut g = rng::SeededRng::new(11);
    let x = g.unit_vector(d); // one fixed input, rotated by many rotations
    let (mut s2, mut s4, mut n) = (0.0f64, 0.0f64, 0usize);
    for seed in 0..400u64 {
        let r = Rotation::new(d, 1000 + seed);
        let mut y = vec![0.0; d];
        r.apply(&x, &mut y);
        for &t in &y {
            s2 += (t as f64).powi(2);
            s4 += (t as f64).powi(4);
            n += 1;
        }
    }
    let var = s2 / n as f64;
    // E t² = 1/d and E t⁴ = 3/(d(d+2)) under the sphere's coordinate law
    assert!(
        (var * d as f64 - 1.0).abs() < 0.01,
        "d·E t² = {}",
        var * d as f64
    );
    let k4 = s4 / n as f64 * (d * (d + 2)) as f64 / 3.0;
    assert!((k4 - 1.0).abs() < 0.05, "E t⁴ / (3/(d(d+2))) = {k4}");
}

// ---------------------------------------------------------------- codebooks

/// `E|t|` of the sphere's coordinate law: `2 C_d / (d - 1)` with
/// `C_d = Γ(d/2) / (√π Γ((d-1)/2))`, `C_3 = 1/2`, `C_4 = 2/π`, `C_(d+2) = C_d · d/(d-1)`.
fn mean_abs_coordinate(d: usize) -> f64 {
    let (mut c, mut k) = if d % 2 == 1 {
        (0.5, 3)
    } else {
        (2.0 / std::f64::consts::PI, 4)
    };
    while k < d {
        c *= k as f64 / (k as f64 - 1.0);
        k += 2;
    }
    2.0 * c / (d as f64 - 1.0)
}

#[test]
fn codebooks_are_symmetric_and_satisfy_the_lloyd_max_conditions() {
    for d in [64usize, 128] {
        let law = CoordinateLaw::new(d);
        for bits in 1u8..=4 {
            let cb = codebook(bits, d);
            let c = cb.centroids();
            let n = c.len();
            assert_eq!(n, 1 << bits);
            for i in 0..n {
                assert_eq!(c[i], -c[n - 1 - i], "d={d} b={bits}: not symmetric at {i}");
                if i > 0 {
                    assert!(c[i] > c[i - 1], "d={d} b={bits}: centroids not ascending");
                    // nearest-neighbour condition: boundaries are midpoints
                    assert_eq!(cb.boundaries()[i - 1], 0.5 * (c[i - 1] + c[i]));
                }
            }
            // centroid condition, checked by an independent composite Simpson rule on the pdf
            for (i, &ci) in c.iter().enumerate() {
                let lo = if i == 0 { -1.0 } else { cb.boundaries()[i - 1] };
                let hi = if i == n - 1 { 1.0 } else { cb.boundaries()[i] };
                let steps = 20_000;
                let h = (hi - lo) / steps as f64;
                let (mut m0, mut m1) = (0.0, 0.0);
                for k in 0..=steps {
                    let t = lo + k as f64 * h;
                    let w = if k == 0 || k == steps {
                        1.0
                    } else if k % 2 == 1 {
                        4.0
                    } else {
                        2.0
                    };
                    let f = law.pdf(t);
                    m0 += w * f;
                    m1 += w * f * t;
                }
                let mean = m1 / m0;
                let tol = 1e-9 / (d as f64).sqrt();
                assert!(
                    (mean - ci).abs() < tol,
                    "d={d} b={bits} cell {i}: centroid {ci} but E[t | cell] = {mean}"
                );
            }
        }
        // 1 bit has a closed form: ±E|t|
        let c1 = codebook(1, d).centroids()[1];
        let want = mean_abs_coordinate(d);
        assert!(
            (c1 - want).abs() < 1e-12,
            "d={d}: 1-bit centroid {c1}, E|t| = {want}"
        );
        // distortion of the 1-bit codebook: 1 - d (E|t|)²
        let d1 = 1.0 - d as f64 * want * want;
        assert!((codebook(1, d).distortion() - d1).abs() < 1e-10);
    }
}

#[test]
fn codebook_distortion_tends_to_max_gaussian_values_and_explains_the_papers_numbers() {
    // large d: the law is N(0, 1/d) and the distortions are Max's (1960) Gaussian ones
    let d = 1 << 16;
    let max_1960 = [0.3634, 0.1175, 0.03454, 0.009497];
    let mut theory = [1.0f64; 5];
    for bits in 1u8..=4 {
        let dist = Codebook::compute(bits, d).distortion();
        theory[bits as usize] = dist;
        let want = max_1960[bits as usize - 1];
        assert!(
            (dist - want).abs() / want < 1e-3,
            "b={bits}: D = {dist}, Max (1960) gives {want}"
        );
        // the paper prints these truncated: 0.36, 0.117, 0.03, 0.009
        let digits = [2, 3, 2, 3][bits as usize - 1];
        let scale = 10f64.powi(digits);
        let truncated = (dist * scale).floor() / scale;
        let published = distortion::PUBLISHED_MSE[bits as usize - 1];
        assert!(
            (truncated - published).abs() < 1e-12,
            "b={bits}: D = {dist} truncates to {truncated}, paper {published}"
        );
    }
    // the paper's D_prod figures are π/2 times its printed D_mse(b - 1) (D_mse(0) = 1), truncated:
    // 1.57, 0.56 (= π/2 · 0.36), 0.18, 0.047 (= π/2 · 0.03); the exact values are 1.57, 0.571,
    // 0.185, 0.0543
    let printed_prev = [1.0, 0.36, 0.117, 0.03];
    for b in 0..4 {
        let v = std::f64::consts::FRAC_PI_2 * printed_prev[b];
        let digits = [2, 2, 2, 3][b];
        let scale = 10f64.powi(digits);
        assert!(((v * scale).floor() / scale - distortion::PUBLISHED_IP[b]).abs() < 1e-12);
    }
    // higher bit widths keep the 4^-b trend and stay under Theorem 1's bound √3π/2 · 4^-b
    let cb6 = Codebook::compute(6, 64);
    let bound = 3f64.sqrt() * std::f64::consts::PI / 2.0 * 4f64.powi(-6);
    assert!(
        cb6.distortion() < bound && cb6.distortion() > bound / 3.0,
        "6-bit D = {}",
        cb6.distortion()
    );
}

// ---------------------------------------------------------------- distortion table

#[test]
fn distortion_table_reproduces_the_paper() {
    let d = 128;
    let samples = 2000;
    let calls = std::cell::Cell::new(0usize);
    let last = std::cell::Cell::new(0usize);
    let rows = distortion_table(d, samples, 1, &|n| {
        assert!(n >= last.get(), "progress went backwards");
        last.set(n);
        calls.set(calls.get() + 1);
    });
    assert_eq!(last.get(), 4 * samples, "progress ends at 4 x samples");
    assert!(calls.get() >= 4);
    assert_eq!(rows.len(), 4);
    for r in &rows {
        let b = r.bits;
        eprintln!(
            "b={b}: mse {:.5} ± {:.5} (theory {:.5}, paper {}), d·D_prod {:.4} ± {:.4} (theory {:.4}, paper {}), \
             bias {:.5} ± {:.5}, mse bias {:.5} ± {:.5} (theory {:.5})",
            r.mse,
            r.mse_stderr,
            r.mse_theory,
            r.mse_published,
            r.ip_distortion,
            r.ip_distortion_stderr,
            r.ip_distortion_theory,
            r.ip_distortion_published,
            r.ip_bias,
            r.ip_bias_stderr,
            r.mse_ip_bias,
            r.mse_ip_bias_stderr,
            r.mse_ip_bias_theory
        );
        // measured MSE agrees with the codebook's exact distortion and sits under Theorem 1
        assert!(
            (r.mse - r.mse_theory).abs() < 4.0 * r.mse_stderr + 0.005 * r.mse_theory,
            "b={b}: {r:?}"
        );
        assert!(r.mse < r.mse_bound);
        // and within 10% of the paper; at 3 bits the paper's 0.03 is 0.0345 truncated (previous
        // test), so the 10% is taken of the value it truncates
        let paper = if b == 3 { 0.03454 } else { r.mse_published };
        assert!(
            (r.mse - paper).abs() < 0.10 * paper,
            "b={b}: MSE {} vs paper {paper}",
            r.mse
        );
        // inner-product distortion: measured vs exact prediction, the bound, and the paper
        assert!(
            (r.ip_distortion - r.ip_distortion_theory).abs() < 4.0 * r.ip_distortion_stderr,
            "b={b}: d·D_prod {} ± {} vs theory {}",
            r.ip_distortion,
            r.ip_distortion_stderr,
            r.ip_distortion_theory
        );
        assert!(r.ip_distortion < r.ip_distortion_bound);
        // at 4 bits the paper's 0.047 is π/2 · 0.03 (its truncated 3-bit MSE); exact is 0.0543
        let paper = if b == 4 {
            std::f64::consts::FRAC_PI_2 * 0.03454
        } else {
            r.ip_distortion_published
        };
        assert!(
            (r.ip_distortion - paper).abs() < 0.12 * paper,
            "b={b}: d·D_prod {} vs paper {paper}",
            r.ip_distortion
        );
        // unbiased: mean error within 3 standard errors of 0 on pairs with <x, y> ≈ 0.71
        assert!((r.mean_xy - 0.707).abs() < 0.01);
        assert!(
            r.ip_bias.abs() < 3.0 * r.ip_bias_stderr,
            "b={b}: prod bias {} ± {}",
            r.ip_bias,
            r.ip_bias_stderr
        );
        // while the MSE quantizer at the same bits is visibly biased, by about -D_mse(b) <x, y>
        assert!(
            r.mse_ip_bias < -10.0 * r.mse_ip_bias_stderr,
            "b={b}: MSE bias {} ± {}",
            r.mse_ip_bias,
            r.mse_ip_bias_stderr
        );
        assert!(
            (r.mse_ip_bias - r.mse_ip_bias_theory).abs() < 4.0 * r.mse_ip_bias_stderr,
            "b={b}: MSE bias {} ± {} vs theory {}",
            r.mse_ip_bias,
            r.mse_ip_bias_stderr,
            r.mse_ip_bias_theory
        );
    }
}

#[test]
fn distortion_table_is_a_function_of_its_seed() {
    let a = distortion_table(32, 200, 3, &|_| {});
    let b = distortion_table(32, 200, 3, &|_| {});
    assert_eq!(a, b);
    let c = distortion_table(32, 200, 4, &|_| {});
    assert_ne!(a[0].mse, c[0].mse);
}

// ---------------------------------------------------------------- quantizers

#[test]
fn quantizers_handle_norms_and_the_prod_estimate_is_the_dequantized_inner_product() {
    let d = 64;
    let mut g = rng::SeededRng::new(3);
    let x: Vec<f32> = g.unit_vector(d).iter().map(|v| v * 7.5).collect();
    let q: Vec<f32> = g.unit_vector(d).iter().map(|v| v * 2.0).collect();
    for bits in 1u8..=4 {
        let mse = MseQuantizer::new(d, bits, 17);
        let c = mse.quantize(&x);
        assert!((c.norm - 7.5).abs() < 1e-4);
        assert!(c.idx.iter().all(|&i| (i as usize) < (1 << bits)));
        let xh = mse.dequantize(&c);
        let err: f32 =
            x.iter().zip(&xh).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / (7.5f32 * 7.5);
        assert!(
            err < 3.0 * codebook(bits, d).distortion() as f32,
            "b={bits}: relative error {err}"
        );
        // zero stays zero
        let z = mse.quantize(&vec![0.0; d]);
        assert_eq!(z.norm, 0.0);
        assert!(mse.dequantize(&z).iter().all(|&v| v == 0.0));

        let prod = ProdQuantizer::new(d, bits, d, 17);
        assert_eq!(prod.bits(), bits);
        let pc = prod.quantize(&x);
        let est = prod.estimate(&prod.prepare_query(&q), &pc);
        let deq = prod.dequantize(&pc);
        let via: f32 = q.iter().zip(&deq).map(|(a, b)| a * b).sum();
        assert!(
            (est - via).abs() < 1e-4 * (1.0 + via.abs()),
            "b={bits}: estimate {est} vs <q, x̃> {via}"
        );
        // the residual norm is ‖x‖ · ‖u - u_mse‖ and shrinks with bits
        let r_unit = pc.r_norm / 7.5;
        assert!(r_unit <= 1.0 + 1e-5);
        if bits == 1 {
            assert!(
                (r_unit - 1.0).abs() < 1e-5,
                "1 bit: residual is the whole vector"
            );
        }
        // signs are sign(S r)
        let m = prod.qjl().rows();
        let mut pm = vec![0.0; m];
        prod.qjl().unpack_signs(&pc.signs, &mut pm);
        assert!(pm.iter().all(|&s| s == 1.0 || s == -1.0));
    }
    // QJL alone is unbiased over sketches: average the estimate over many S for a fixed pair
    let y = g.unit_vector(d);
    let u = g.unit_vector(d);
    let truth: f64 = y.iter().zip(&u).map(|(a, b)| (a * b) as f64).sum();
    let n = 3000;
    let ests: Vec<f64> = (0..n)
        .map(|s| {
            let p = ProdQuantizer::new(d, 1, d, 10_000 + s);
            p.estimate(&p.prepare_query(&y), &p.quantize(&u)) as f64
        })
        .collect();
    let mean = ests.iter().sum::<f64>() / n as f64;
    let sd = (ests.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
    let se = sd / (n as f64).sqrt();
    assert!(
        (mean - truth).abs() < 3.0 * se,
        "QJL mean {mean} vs {truth} (se {se})"
    );
    // and its variance is (π/2 - <y,u>²)/m
    let want = ((std::f64::consts::FRAC_PI_2 - truth * truth) / d as f64).sqrt();
    assert!(
        (sd - want).abs() < 0.06 * want,
        "QJL sd {sd}, theory {want}"
    );
}

// ---------------------------------------------------------------- attention

fn ragged_inputs(seed: u64, d: usize, dv: usize) -> AttentionInputs {
    let mut x = inputs(3, 5, 37, 6, 2, d, dv, seed);
    x.seqlens_k = Some(vec![37, 0, 20]);
    x.seqlens_q = Some(vec![5, 3, 1]);
    x
}

#[test]
fn emulation_equals_exact_attention_over_the_dequantized_cache() {
    // GQA 6/2, ragged lengths (one empty sequence), causal and not, d_k != d_v, blocks of 16
    // over 37 keys: the fused loop must be exact attention over K̂, V̂ up to f32 rounding
    let x = ragged_inputs(21, 64, 32);
    for causal in [false, true] {
        let p = problem(&x, causal);
        for (key_bits, value_bits, defer, key_qjl) in [
            (4u8, 3u8, false, true),
            (4, 3, true, true),
            (1, 1, false, true),
            (2, 4, true, true),
            (3, 2, false, true),
            (3, 3, false, false),
            (1, 2, true, false),
            (4, 2, true, false),
        ] {
            let cfg = TurboQuantConfig {
                block_k: 16,
                key_bits,
                value_bits,
                qjl_dim: 48,
                seed: 5,
                defer_value_unrotation: defer,
                key_qjl,
            };
            let out = emulate(&cfg, &p, &x).unwrap();
            let codec = TurboQuantCodec::new(&cfg, 64, 32);
            let kv = codec.compress(&p, &x);
            let (kh, vh) = codec.dequantize(&kv);
            let xh = AttentionInputs {
                q: x.q.clone(),
                k: kh,
                v: Some(vh),
                ..x.clone()
            };
            let (o_ref, lse_ref) = exact_attention_f64(&p, &xh);
            let co = Comparison::new(&o_ref, &to_f64(&out.o));
            let cl = Comparison::new(&lse_ref, &to_f64(&out.lse));
            let what =
                format!("causal={causal} k{key_bits} v{value_bits} defer={defer} qjl={key_qjl}");
            assert!(
                co.non_finite_mismatch.is_none() && cl.non_finite_mismatch.is_none(),
                "{what}"
            );
            assert!(co.rel_fro < 2e-5, "{what}: O rel_fro {:e}", co.rel_fro);
            assert!(cl.max_abs < 1e-4, "{what}: LSE max_abs {:e}", cl.max_abs);
            // padded rows and the empty sequence are zero with LSE -inf
            assert!(out.o.row4(1, 0, 0).iter().all(|&v| v == 0.0));
            assert_eq!(out.lse.data[6 * 5], f32::NEG_INFINITY);
            assert!(out.o.row4(2, 3, 5).iter().all(|&v| v == 0.0));
        }
    }
}

#[test]
fn emulation_is_reproducible_and_seeded() {
    let x = inputs(1, 4, 40, 4, 1, 32, 32, 8);
    let p = problem(&x, true);
    let cfg = TurboQuantConfig::paper_default(&p);
    let a = emulate(&cfg, &p, &x).unwrap();
    assert_eq!(a, emulate(&cfg, &p, &x).unwrap());
    let other = emulate(
        &TurboQuantConfig {
            seed: cfg.seed + 1,
            ..cfg.clone()
        },
        &p,
        &x,
    )
    .unwrap();
    assert_ne!(a.o, other.o);
}

/// Predicted relative Frobenius error of O for i.i.d. N(0, 1) q, k, v (see the test below).
fn predicted_rel_error(
    p: &AttentionProblem,
    x: &AttentionInputs,
    key_bits: u8,
    value_bits: u8,
    m: usize,
) -> f64 {
    let d = p.head_dim_qk;
    let sq_norm = |t: &Tensor| -> f64 {
        t.data
            .chunks(t.shape[3])
            .map(|r| r.iter().map(|&v| (v as f64).powi(2)).sum::<f64>())
            .sum::<f64>()
            / (t.numel() / t.shape[3]) as f64
    };
    let qk = sq_norm(&x.q) * sq_norm(&x.k);
    let scale = p.softmax_scale as f64;
    let sigma2 = scale
        * scale
        * qk
        * (std::f64::consts::FRAC_PI_2 - 1.0 / d as f64)
        * codebook(key_bits - 1, d).distortion()
        / m as f64;
    (sigma2.exp() - 1.0 + codebook(value_bits, p.head_dim_v).distortion()).sqrt()
}

#[test]
fn attention_converges_to_exact_attention_as_bits_grow() {
    // Error model, for i.i.d. N(0, 1) q, k, v and scale 1/√d:
    // * keys: the prod estimate is unbiased with variance ‖q‖²‖k‖² (π/2 - 1/d) D_mse(b_k - 1)/m
    //   (QJL variance, Theorem 2), so logits get independent noise of variance
    //   σ² = scale² ‖q‖²‖k‖² (π/2 - 1/d) D_mse(b_k - 1)/m; weights are multiplied by e^δ, whose
    //   relative spread is e^σ² - 1, and with values independent of the weights this adds
    //   (e^σ² - 1) to the squared relative error of O;
    // * values: Σ p_j (v̂_j - v_j) with independent errors of E‖e‖² = D_mse(b_v) ‖v‖² adds
    //   D_mse(b_v).
    // So rel_fro(O) ≈ sqrt(e^σ² - 1 + D_mse(b_v)): 2.0, 0.92, 0.48, 0.25, 0.13, 0.066 at b = 1..6
    // here (measured: 1.24, 0.82, 0.47, 0.27, 0.125, 0.067). The test asserts the measured error
    // within [0.8, 1.25] of the prediction from 2 bits on, and below it at 1 bit (σ ≈ 1.25 there:
    // e^δ is so heavy-tailed that the softmax normalisation absorbs much of it, and e^σ² - 1
    // over-counts), and that it falls with every bit. 5 and 6 bits run through the codec directly
    // (the config accepts 1..=4), to show the error keeps halving per bit.
    let x = inputs(2, 16, 256, 8, 2, 64, 64, 31);
    let p = problem(&x, false);
    let (o_ref, lse_ref) = exact_attention_f64(&p, &x);
    let mut prev = f64::INFINITY;
    let mut prev_lse = f64::INFINITY;
    for bits in 1u8..=6 {
        let cfg = TurboQuantConfig {
            key_bits: bits,
            value_bits: bits,
            ..TurboQuantConfig::paper_default(&p)
        };
        let codec = TurboQuantCodec::new(&cfg, 64, 64);
        let out = codec.attend(&cfg, &p, &x.q, &codec.compress(&p, &x));
        let c = Comparison::new(&o_ref, &to_f64(&out.o));
        let cl = Comparison::new(&lse_ref, &to_f64(&out.lse));
        let pred = predicted_rel_error(&p, &x, bits, bits, cfg.qjl_dim);
        eprintln!(
            "b={bits}: rel_fro {:.4}, predicted {:.4}, LSE max_abs {:.4}",
            c.rel_fro, pred, cl.max_abs
        );
        let (lo, hi) = if bits == 1 { (0.5, 1.0) } else { (0.8, 1.25) };
        assert!(
            c.rel_fro < hi * pred && c.rel_fro > lo * pred,
            "b={bits}: rel_fro {} vs predicted {pred}",
            c.rel_fro
        );
        assert!(c.rel_fro < prev, "b={bits}: error did not fall");
        assert!(cl.max_abs < prev_lse, "b={bits}: LSE error did not fall");
        prev = c.rel_fro;
        prev_lse = cl.max_abs;
        if bits <= 4 {
            // the config path gives the same
            assert_eq!(emulate(&cfg, &p, &x).unwrap().o, out.o);
        }
    }
    assert!(prev < 0.1, "6 bits: rel_fro {prev}");
}

#[test]
fn keys_without_qjl_put_every_bit_on_the_codebook() {
    // b-bit MSE keys: the same Π as the prod keys, a b-bit codebook, no signs, ‖r‖ = 0; the score
    // is scale · ‖k‖ <Π q, c[idx]>, so attention equals exact attention over ‖k‖ Πᵀ c[idx]
    let x = ragged_inputs(33, 64, 64);
    let p = problem(&x, false);
    let base = TurboQuantConfig {
        block_k: 16,
        ..TurboQuantConfig::paper_default(&p)
    };
    for bits in 1u8..=4 {
        let cfg = TurboQuantConfig {
            key_bits: bits,
            key_qjl: false,
            ..base.clone()
        };
        assert_eq!(cfg.key_codebook_bits(), bits);
        let codec = TurboQuantCodec::new(&cfg, 64, 64);
        assert_eq!(codec.key.mse().bits(), bits);
        let prod = TurboQuantCodec::new(
            &TurboQuantConfig {
                key_bits: bits + 1,
                ..base.clone()
            },
            64,
            64,
        );
        // one Π per head dim whatever the key mode
        assert_eq!(codec.key_rotation(), prod.key_rotation());
        let kv = codec.compress(&p, &x);
        assert!(kv.k_signs.iter().all(|&s| s == 0) && kv.r_norm.iter().all(|&r| r == 0.0));
        assert!(kv.k_idx.iter().all(|&i| (i as usize) < (1 << bits)));
        // every valid key row is the MSE code of that row
        let mse = MseQuantizer::new(64, bits, cfg.seed);
        let row = (2 * 37 + 19) * 2 + 1; // sequence 2, token 19, KV head 1
        let code = mse.quantize(x.k.row4(2, 19, 1));
        assert_eq!(&kv.k_idx[row * 64..(row + 1) * 64], &code.idx[..]);
        assert_eq!(kv.k_norm[row], DType::F16.round(code.norm));
        // the fused loop equals exact attention over the dequantized cache
        let out = codec.attend(&cfg, &p, &x.q, &kv);
        let (kh, vh) = codec.dequantize(&kv);
        let xh = AttentionInputs {
            q: x.q.clone(),
            k: kh,
            v: Some(vh),
            ..x.clone()
        };
        let (o_ref, _) = exact_attention_f64(&p, &xh);
        let c = Comparison::new(&o_ref, &to_f64(&out.o));
        assert!(c.rel_fro < 2e-5, "{bits} bits: rel_fro {:e}", c.rel_fro);
        assert_eq!(emulate(&cfg, &p, &x).unwrap(), out);
    }
}

#[test]
fn keys_without_qjl_have_lower_score_error_at_equal_bits() {
    // At b bits per coordinate, MSE keys have D_mse(b) ‖q‖²‖k‖²/d logit variance around a
    // shrunk mean, prod keys (π/2 - 1/d) D_mse(b-1) ‖q‖²‖k‖²/m unbiased: at b = 2..4 and m = d the
    // MSE keys' O error is lower on i.i.d. inputs (the practice the issue cites); both fall with b
    let x = inputs(2, 8, 256, 8, 2, 64, 64, 41);
    let p = problem(&x, false);
    let (o_ref, _) = exact_attention_f64(&p, &x);
    let err = |bits: u8, key_qjl: bool| {
        let cfg = TurboQuantConfig {
            key_bits: bits,
            value_bits: 4,
            key_qjl,
            ..TurboQuantConfig::paper_default(&p)
        };
        let out = emulate(&cfg, &p, &x).unwrap();
        Comparison::new(&o_ref, &to_f64(&out.o)).rel_fro
    };
    let mut prev = (f64::INFINITY, f64::INFINITY);
    for bits in 2u8..=4 {
        let (mse, prod) = (err(bits, false), err(bits, true));
        eprintln!("{bits} bits: O rel_fro MSE keys {mse:.4}, prod keys {prod:.4}");
        assert!(mse < prod, "{bits} bits: MSE {mse} vs prod {prod}");
        assert!(
            mse < prev.0 && prod < prev.1,
            "{bits} bits: error did not fall"
        );
        prev = (mse, prod);
    }
}

#[test]
fn configs_without_the_key_qjl_field_read_as_prod_keys() {
    // plans serialised before the flag existed still parse, as TurboQuant_prod keys
    let p = AttentionProblem::uniform(1, 1, 64, 4, 2, 64, 64, DType::F16);
    let cfg = TurboQuantConfig::paper_default(&p);
    let mut v = serde_json::to_value(&cfg).unwrap();
    v.as_object_mut().unwrap().remove("key_qjl");
    let back: TurboQuantConfig = serde_json::from_value(v).unwrap();
    assert!(back.key_qjl);
    assert_eq!(back, cfg);
}

// ---------------------------------------------------------------- config, plan, accounting

#[test]
fn plan_picks_the_paper_settings_and_fits_the_device() {
    let p = AttentionProblem::uniform(4, 1, 8192, 32, 8, 128, 128, DType::F16);
    let cfg = plan(&p, &crate::DeviceCaps::hopper_reference()).unwrap();
    assert_eq!(
        (cfg.key_bits, cfg.value_bits, cfg.qjl_dim, cfg.block_k),
        (4, 3, 128, 64)
    );
    assert!(!cfg.defer_value_unrotation);
    // through the planner
    let ap = crate::plan(
        crate::Algorithm::TurboQuant,
        &p,
        &crate::DeviceCaps::hopper_reference(),
    )
    .unwrap();
    assert_eq!(ap.block_k, 64);
    assert_eq!(ap.block_q, 1);
    let json = ap.to_json();
    assert_eq!(crate::AttentionPlan::from_json(&json).unwrap(), ap);
    // d = 256: Π is 128 KiB, the block shrinks to fit 227 KiB
    let p256 = AttentionProblem::uniform(1, 1, 4096, 16, 4, 256, 256, DType::F16);
    let c256 = plan(&p256, &crate::DeviceCaps::hopper_reference()).unwrap();
    assert!(
        c256.block_k < 64 && c256.fused_smem_bytes(&p256) <= 227 * 1024,
        "{c256:?}"
    );
    // d = 512: Π alone is 512 KiB: refused on the GPU, fine on the CPU
    let p512 = AttentionProblem::uniform(1, 1, 64, 4, 4, 512, 512, DType::F16);
    let e = plan(&p512, &crate::DeviceCaps::hopper_reference())
        .unwrap_err()
        .to_string();
    assert!(e.contains("shared memory") && e.contains("524288"), "{e}");
    assert!(plan(&p512, &crate::DeviceCaps::cpu(2)).is_ok());
}

#[test]
fn compression_accounting_against_fp16() {
    // Llama-style d = 128, 8 KV heads, 4-bit keys (3 + QJL), 3-bit values
    let p = AttentionProblem::uniform(2, 1, 1000, 32, 8, 128, 128, DType::F16);
    let cfg = TurboQuantConfig::paper_default(&p);
    let c = cfg.compression(&p);
    assert_eq!(c.key_bits_per_row, 3 * 128 + 128 + 32); // 68 bytes
    assert_eq!(c.value_bits_per_row, 3 * 128 + 16); // 50 bytes
    assert_eq!(c.packed_bytes_per_token, 8.0 * 118.0);
    assert_eq!(c.fp16_bytes_per_token, 8 * 512);
    assert!((c.packed_ratio - 512.0 / 118.0).abs() < 1e-12); // 4.34x
    assert_eq!(c.kernel_bytes_per_token, 8 * (128 + 16 + 4 + 128 + 2)); // u8 indices: 1.84x
    assert!((c.bits_per_coordinate - 944.0 / 256.0).abs() < 1e-12); // 3.69 with the norms
    assert_eq!(c.tokens, 2000);
    assert_eq!(c.total_fp16_bytes, 2000 * 8 * 512);
    assert_eq!(c.fixed_bytes, 2 * (128 * 128 + 128 * 128));
    // keys without QJL: 4 codebook bits and one f16 norm, no sketch matrix
    let mse = TurboQuantConfig {
        key_qjl: false,
        ..cfg.clone()
    }
    .compression(&p);
    assert_eq!(mse.key_bits_per_row, 4 * 128 + 16); // 66 bytes
    assert_eq!(mse.packed_bytes_per_token, 8.0 * 116.0);
    assert_eq!(mse.kernel_bytes_per_token, 8 * (128 + 2 + 128 + 2));
    assert_eq!(mse.fixed_bytes, 2 * 128 * 128);
}

#[test]
fn bad_configs_give_clear_errors() {
    let p = AttentionProblem::uniform(1, 2, 16, 4, 2, 64, 64, DType::F32);
    let ok = TurboQuantConfig::paper_default(&p);
    assert!(ok.check(&p).is_ok());
    let err = |c: TurboQuantConfig, p: &AttentionProblem| c.check(p).unwrap_err().to_string();
    let e = err(
        TurboQuantConfig {
            key_bits: 5,
            ..ok.clone()
        },
        &p,
    );
    assert!(
        e.contains("key_bits = 5") && e.contains("1, 2, 3 or 4"),
        "{e}"
    );
    let e = err(
        TurboQuantConfig {
            key_bits: 0,
            ..ok.clone()
        },
        &p,
    );
    assert!(e.contains("key_bits = 0"), "{e}");
    let e = err(
        TurboQuantConfig {
            value_bits: 8,
            ..ok.clone()
        },
        &p,
    );
    assert!(
        e.contains("value_bits = 8") && e.contains("1, 2, 3 or 4"),
        "{e}"
    );
    let e = err(
        TurboQuantConfig {
            qjl_dim: 12,
            ..ok.clone()
        },
        &p,
    );
    assert!(
        e.contains("qjl_dim is 12") && e.contains("multiple of 8"),
        "{e}"
    );
    let e = err(
        TurboQuantConfig {
            qjl_dim: 0,
            ..ok.clone()
        },
        &p,
    );
    assert!(e.contains("qjl_dim is 0"), "{e}");
    let e = err(
        TurboQuantConfig {
            block_k: 0,
            ..ok.clone()
        },
        &p,
    );
    assert!(e.contains("block_k is 0"), "{e}");
    for (dk, dv, bad) in [
        (20usize, 64usize, "head_dim_qk = 20"),
        (8, 8, "head_dim_qk = 8"),
        (64, 2048, "head_dim_v = 2048"),
    ] {
        let q = AttentionProblem::uniform(1, 1, 4, 2, 2, dk, dv, DType::F32);
        let e = err(ok.clone(), &q);
        assert!(
            e.contains(bad) && e.contains("multiples of 8 from 16 to 1024"),
            "{e}"
        );
    }
    let mut mla = AttentionProblem::uniform(1, 1, 8, 4, 1, 576, 512, DType::BF16);
    mla.kv_layout = crate::KvLayout::MlaLatent;
    let e = plan(&mla, &crate::DeviceCaps::cpu(1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("MLA latent") && e.contains("separate"), "{e}");
    // block_k not a multiple of 16 on CUDA
    let e = TurboQuantConfig {
        block_k: 24,
        ..ok.clone()
    }
    .check_device(&p, &crate::DeviceCaps::hopper_reference())
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("block_k = 24") && e.contains("multiple of 16"),
        "{e}"
    );
    // emulate checks the tensors against the problem
    let x = inputs(1, 2, 16, 4, 2, 64, 64, 1);
    let mut wrong = x.clone();
    wrong.v = Some(Tensor::zeros(&[1, 16, 2, 32], DType::F32));
    let e = emulate(&ok, &p, &wrong).unwrap_err().to_string();
    assert!(
        e.contains("v has shape [1, 16, 2, 32]") && e.contains("[1, 16, 2, 64]"),
        "{e}"
    );
    let e = emulate(
        &TurboQuantConfig {
            value_bits: 0,
            ..ok.clone()
        },
        &p,
        &x,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("value_bits = 0"), "{e}");
    let _ = golden::exact_attention(&p, &x);
}
