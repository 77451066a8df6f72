//! Tests of TurboQuant on CUDA (`ferrattn_cuda::turboquant`, `cuda-kernels/turboquant_*.cu`)
//! against `ferrattn_core::turboquant`, the CPU emulation that defines correctness:
//! - codes and norms bit for bit: the whole compressed cache, after a prefill and after appends;
//! - decode O within 1e-3 relative Frobenius error of the emulation, LSE within 2e-3 of
//!   max(1, |LSE|) (four f16 roundings of 2^-11 each),
//!   and against the f64 golden no worse than the emulation's own error by more than 10%;
//! - N decode steps with appends equal the emulation step by step (ragged lengths, one sequence
//!   that only joins later), the cache bit-exact at the end;
//! - outputs poisoned with NaN before every launch (`common::backend`): none may survive.
//!
//! GPU tests print `SKIPPED <test>: <reason>` and pass without a GPU.
//! `FERRATTN_GPU_TEST_SCALE=small` keeps only the small cases (compute-sanitizer).

use ferrattn_core::turboquant::{self, TurboQuantCodec, TurboQuantConfig};
use ferrattn_core::{golden, AttentionInputs, AttentionProblem, Comparison, DType, Tensor};
use ferrattn_cuda::turboquant::{PrepareKernel, TurboQuantCuda};
use ferrattn_cuda::{CudaBackend, Options};

mod common;
use common::{backend, small_only};

#[allow(clippy::too_many_arguments)] // the shape of one test case
fn problem(
    lq: &[usize],
    lk: &[usize],
    hq: usize,
    hk: usize,
    d: usize,
    causal: bool,
) -> AttentionProblem {
    let mut p = AttentionProblem::uniform(
        lq.len(),
        *lq.iter().max().unwrap(),
        (*lk.iter().max().unwrap()).max(1),
        hq,
        hk,
        d,
        d,
        DType::F16,
    );
    p.seqlens_q = lq.to_vec();
    p.seqlens_k = lk.to_vec();
    p.causal = causal;
    p
}

/// LLM-like inputs (outlier key channels) rounded to f16, padding set to large values: a kernel
/// that reads padding shows up in the comparisons.
fn inputs(p: &AttentionProblem, seed: u64) -> AttentionInputs {
    let mut x = ferrattn_core::turbo::llm_like_inputs(p, seed);
    let round = |t: &mut Tensor| t.data.iter_mut().for_each(|v| *v = DType::F16.round(*v));
    round(&mut x.q);
    round(&mut x.k);
    round(x.v.as_mut().unwrap());
    for b in 0..p.batch {
        for j in p.seqlens_k[b]..p.max_seqlen_k {
            for h in 0..p.heads_kv {
                x.k.row4_mut(b, j, h).iter_mut().for_each(|v| *v = -3000.0);
                x.v.as_mut()
                    .unwrap()
                    .row4_mut(b, j, h)
                    .iter_mut()
                    .for_each(|v| *v = 3000.0);
            }
        }
    }
    x.seqlens_q = Some(p.seqlens_q.iter().map(|&l| l as i64).collect());
    x.seqlens_k = Some(p.seqlens_k.iter().map(|&l| l as i64).collect());
    x
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.data.iter().map(|&v| v as f64).collect()
}

fn configs(p: &AttentionProblem) -> Vec<TurboQuantConfig> {
    let base = TurboQuantConfig::paper_default(p);
    let mut v = Vec::new();
    for (key_bits, key_qjl, value_bits) in [
        (4u8, true, 3u8),
        (3, true, 3),
        (2, true, 2),
        (4, false, 4),
        (3, false, 3),
        (2, false, 2),
        (4, true, 4),
        // 2-bit codes stored at 2 bits (crumbs): a 2-bit key codebook with QJL, 2-bit values
        (3, true, 2),
    ] {
        v.push(TurboQuantConfig {
            key_bits,
            key_qjl,
            value_bits,
            ..base.clone()
        });
    }
    v
}

fn name(c: &TurboQuantConfig) -> String {
    format!(
        "k{}{} v{}",
        c.key_bits,
        if c.key_qjl { "+qjl" } else { "" },
        c.value_bits
    )
}

/// Decode O of the GPU against the emulation and the f64 golden.
fn check_decode(
    what: &str,
    p: &AttentionProblem,
    x: &AttentionInputs,
    cfg: &TurboQuantConfig,
    got: &ferrattn_core::AttentionOutput,
) {
    let emu = turboquant::emulate(cfg, p, x).unwrap();
    assert!(
        got.o.data.iter().all(|v| v.is_finite()),
        "{what}: non-finite O (a poisoned element survived?)"
    );
    assert!(!got.lse.data.iter().any(|v| v.is_nan()), "{what}: NaN LSE");
    let c = Comparison::new(&f64s(&emu.o), &f64s(&got.o));
    let cl = Comparison::new(&f64s(&emu.lse), &f64s(&got.lse));
    assert!(
        c.non_finite_mismatch.is_none() && cl.non_finite_mismatch.is_none(),
        "{what}: -inf LSE in other places"
    );
    let (g_o, _) = golden::exact_attention_f64(p, x);
    let e_emu = Comparison::new(&g_o, &f64s(&emu.o)).rel_fro;
    let e_gpu = Comparison::new(&g_o, &f64s(&got.o)).rel_fro;
    eprintln!(
        "{what}: vs emulation O rel_fro {:.2e} (max abs {:.2e}), LSE max abs {:.2e}; vs golden GPU {e_gpu:.4e} emulation {e_emu:.4e}",
        c.rel_fro, c.max_abs, cl.max_abs
    );
    assert!(
        c.rel_fro <= 1e-3,
        "{what}: O rel_fro {:e} vs the emulation",
        c.rel_fro
    );
    // LSE relative to max(1, |LSE|): each logit carries up to four f16 roundings (S q, the key
    // centroid, and through P and the value centroid the weights), each at most 2^-11 relative,
    // so 4 · 2^-11 ≈ 2e-3 of the logit scale (the host twin `turboquant::twin` reaches 9.8e-4)
    let lse_rel = emu
        .lse
        .data
        .iter()
        .zip(&got.lse.data)
        .filter(|(a, _)| a.is_finite())
        .map(|(a, b)| ((a - b).abs() / a.abs().max(1.0)) as f64)
        .fold(0.0, f64::max);
    assert!(
        lse_rel <= 2e-3,
        "{what}: LSE relative error {lse_rel:e} vs the emulation"
    );
    assert!(
        e_gpu <= 1.1 * e_emu + 1e-6,
        "{what}: GPU {e_gpu} vs emulation {e_emu} against the golden"
    );
}

fn engine(b: &CudaBackend, cfg: &TurboQuantConfig, p: &AttentionProblem) -> TurboQuantCuda {
    b.turboquant(cfg, p).unwrap()
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_codes_and_norms_are_bit_exact() {
    let Some(b) = backend("gpu_codes_and_norms_are_bit_exact", Options::default()) else {
        return;
    };
    let cases: &[(&[usize], usize)] = if small_only() {
        &[(&[37, 0, 20], 64)]
    } else {
        &[(&[37, 0, 20], 64), (&[577, 65, 1, 130], 128), (&[33], 128)]
    };
    for &(lk, d) in cases {
        let p = problem(&vec![1; lk.len()], lk, 8, 2, d, false);
        let x = inputs(&p, 7 + d as u64);
        for cfg in configs(&p) {
            let t = engine(&b, &cfg, &p);
            let (_, cache) = t.run(&p, &x, None).unwrap();
            let got = cache.download(p.max_seqlen_k).unwrap();
            let want = TurboQuantCodec::new(&cfg, d, d).compress(&p, &x);
            let what = format!("{} d {d} lens {lk:?}", name(&cfg));
            let diff = |a: &[u8], b: &[u8]| a.iter().zip(b).filter(|(x, y)| x != y).count();
            assert_eq!(diff(&got.k_idx, &want.k_idx), 0, "{what}: key indices");
            assert_eq!(diff(&got.v_idx, &want.v_idx), 0, "{what}: value indices");
            assert_eq!(diff(&got.k_signs, &want.k_signs), 0, "{what}: QJL signs");
            let bits = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .filter(|(x, y)| x.to_bits() != y.to_bits())
                    .count()
            };
            assert_eq!(bits(&got.k_norm, &want.k_norm), 0, "{what}: key norms");
            assert_eq!(bits(&got.r_norm, &want.r_norm), 0, "{what}: residual norms");
            assert_eq!(bits(&got.v_norm, &want.v_norm), 0, "{what}: value norms");
            eprintln!(
                "{what}: cache bit-exact ({} key rows)",
                p.total_kv_tokens() * p.heads_kv
            );
        }
    }
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_decode_matches_the_emulation() {
    let Some(b) = backend("gpu_decode_matches_the_emulation", Options::default()) else {
        return;
    };
    // (query lengths, key lengths, Hq, Hk, d, causal, units)
    type Case<'a> = (
        &'a [usize],
        &'a [usize],
        usize,
        usize,
        usize,
        bool,
        Option<usize>,
    );
    let cases: Vec<Case> = if small_only() {
        vec![(&[1, 1], &[37, 20], 8, 2, 64, false, None)]
    } else {
        vec![
            (&[1, 1, 1], &[577, 0, 65], 32, 8, 128, false, None),
            (&[1, 1, 1], &[577, 0, 65], 32, 8, 128, false, Some(3)),
            (&[4, 2], &[300, 129], 32, 8, 128, true, None),
            (&[8], &[1000], 16, 2, 128, true, Some(5)),
            (&[3, 1], &[63, 4097], 8, 8, 64, true, None),
            (&[1], &[32767], 32, 8, 128, false, None),
            (&[5, 1], &[37, 1], 12, 4, 64, false, Some(2)),
            // 16 sequences x 8 KV heads: 128 tiles, up to one per SM (H100 / H200), where the
            // merge splits each tile's rows over two 8-warp CTAs (row_split)
            (
                &[1; 16],
                &[
                    300, 17, 1, 65, 129, 2000, 33, 500, 0, 2, 3, 70, 900, 16, 15, 200,
                ],
                32,
                8,
                128,
                false,
                None,
            ),
        ]
    };
    for (lq, lk, hq, hk, d, causal, units) in cases {
        let p = problem(lq, lk, hq, hk, d, causal);
        let x = inputs(&p, 11 + lk[0] as u64);
        let cfgs = configs(&p);
        let cfgs: Vec<_> = if lk[0] > 10000 {
            cfgs[..2].to_vec()
        } else {
            cfgs
        };
        for cfg in cfgs {
            let mut t = engine(&b, &cfg, &p);
            let (out, _) = t.run(&p, &x, units).unwrap();
            let what = format!(
                "{} lq {lq:?} lk {lk:?} {hq}/{hk} d {d} causal {causal} units {units:?}",
                name(&cfg)
            );
            check_decode(&what, &p, &x, &cfg, &out);
            // the spread prepare (D / 8 CTAs per tile) keeps the v1 kernel's FMA order per
            // element: the whole step's O and LSE must be bit-identical with either
            t.set_prepare_kernel(PrepareKernel::V1);
            let (v1, _) = t.run(&p, &x, units).unwrap();
            t.set_prepare_kernel(PrepareKernel::Spread);
            let (out, _) = t.run(&p, &x, units).unwrap();
            t.set_prepare_kernel(PrepareKernel::Auto);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&out.o.data),
                bits(&v1.o.data),
                "{what}: O differs from the v1 prepare's"
            );
            assert_eq!(
                bits(&out.lse.data),
                bits(&v1.lse.data),
                "{what}: LSE differs from the v1 prepare's"
            );
            // the decode's CTA size (4 warps, or 7 as at small work) groups the same units:
            // with the same width the outputs are bit-identical (7-warp CTAs need ~111 KiB of
            // shared memory at d = 128: every Hopper GPU; elsewhere the check is skipped)
            let u = units.unwrap_or_else(|| t.default_units(&p));
            t.set_unit_warps(Some(4)).unwrap();
            let (w4, _) = t.run(&p, &x, Some(u)).unwrap();
            if t.set_unit_warps(Some(7)).is_err() {
                eprintln!("{what}: 7-warp CTAs do not fit this GPU; CTA-size check skipped");
                t.set_unit_warps(None).unwrap();
                continue;
            }
            let (w7, _) = t.run(&p, &x, Some(u)).unwrap();
            t.set_unit_warps(None).unwrap();
            assert_eq!(
                bits(&w7.o.data),
                bits(&w4.o.data),
                "{what}: O differs between 7- and 4-warp CTAs ({u} units)"
            );
            assert_eq!(
                bits(&w7.lse.data),
                bits(&w4.lse.data),
                "{what}: LSE differs between 7- and 4-warp CTAs ({u} units)"
            );
        }
    }
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_decode_steps_with_appends_equal_the_emulation() {
    let Some(b) = backend(
        "gpu_decode_steps_with_appends_equal_the_emulation",
        Options::default(),
    ) else {
        return;
    };
    // ragged prefill (one sequence empty), then one token per sequence per step
    let (prefill, steps, d): (&[usize], usize, usize) = if small_only() {
        (&[5, 0], 3, 64)
    } else {
        (&[130, 0, 47], 40, 128)
    };
    let total: Vec<usize> = prefill.iter().map(|&l| l + steps).collect();
    let full = problem(&vec![1; total.len()], &total, 16, 4, d, false);
    let x = inputs(&full, 99);
    // [5], [7]: key and value codes as crumbs (value pairs split across appends)
    for i in [0, 4, 5, 7] {
        let cfg = configs(&full)[i].clone();
        let t = engine(&b, &cfg, &full);
        let mut cache = t
            .alloc_cache(full.batch, full.heads_kv, full.max_seqlen_k)
            .unwrap();
        let k_all = t.upload_f16(&x.k.data).unwrap();
        let v_all = t.upload_f16(&x.v.as_ref().unwrap().data).unwrap();
        t.append(&mut cache, &k_all, &v_all, full.max_seqlen_k, prefill)
            .unwrap();
        for step in 0..steps {
            // the new token of each sequence, at its current length
            let mut kn = Tensor::zeros(&[full.batch, 1, full.heads_kv, d], DType::F16);
            let mut vn = kn.clone();
            for bi in 0..full.batch {
                let j = cache.lens()[bi];
                for h in 0..full.heads_kv {
                    kn.row4_mut(bi, 0, h).copy_from_slice(x.k.row4(bi, j, h));
                    vn.row4_mut(bi, 0, h)
                        .copy_from_slice(x.v.as_ref().unwrap().row4(bi, j, h));
                }
            }
            let counts = vec![1; full.batch];
            t.append(
                &mut cache,
                &t.upload_f16(&kn.data).unwrap(),
                &t.upload_f16(&vn.data).unwrap(),
                1,
                &counts,
            )
            .unwrap();
            // the step's problem: one query token per sequence over the cache so far
            let mut p = full.clone();
            p.max_seqlen_q = 1;
            p.seqlens_q = vec![1; p.batch];
            p.seqlens_k = cache.lens().to_vec();
            let mut xs = x.clone();
            let mut q = Tensor::zeros(&[p.batch, 1, p.heads_q, d], DType::F16);
            for bi in 0..p.batch {
                for h in 0..p.heads_q {
                    q.row4_mut(bi, 0, h)
                        .copy_from_slice(x.q.row4(bi, step % full.max_seqlen_q, h));
                }
            }
            xs.q = q.clone();
            xs.seqlens_q = Some(vec![1; p.batch]);
            xs.seqlens_k = Some(p.seqlens_k.iter().map(|&l| l as i64).collect());
            let prep = t
                .prepare_decode(&p, &cache, if step % 2 == 0 { None } else { Some(3) })
                .unwrap();
            let mut out = t.alloc_outputs(&p).unwrap();
            t.launch_decode(&prep, &t.upload_f16(&q.data).unwrap(), &cache, &mut out)
                .unwrap();
            let got = t.download(&out, &p).unwrap();
            check_decode(&format!("{} step {step}", name(&cfg)), &p, &xs, &cfg, &got);
        }
        // the cache after all appends equals one compression of everything
        let got = cache.download(full.max_seqlen_k).unwrap();
        let want = TurboQuantCodec::new(&cfg, d, d).compress(&full, &x);
        assert_eq!(got.seqlens_k, total);
        assert!(
            got.k_idx == want.k_idx && got.v_idx == want.v_idx && got.k_signs == want.k_signs,
            "{}: codes after appends",
            name(&cfg)
        );
        assert!(
            got.k_norm == want.k_norm && got.r_norm == want.r_norm && got.v_norm == want.v_norm,
            "{}: norms after appends",
            name(&cfg)
        );
    }
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_unsupported_configs_are_refused() {
    let Some(b) = backend("gpu_unsupported_configs_are_refused", Options::default()) else {
        return;
    };
    let p = problem(&[1], &[16], 8, 2, 96, false);
    let cfg = TurboQuantConfig::paper_default(&p);
    let e = b.turboquant(&cfg, &p).unwrap_err().to_string();
    assert!(e.contains("qk = v = 64 or 128"), "{e}");
}

/// The merge fused into the small-work decode (7-warp CTAs, `turboquant_decode_*_r8f`: the CTA
/// that completes a tile merges it) against the merge kernel of the same schedule: O and LSE
/// bit-identical, and again on every launch of one prepared decode over one workspace (its
/// per-tile counters are set back to zero by each launch; a stale count would leave tiles
/// unmerged: the poisoned outputs would show it). Rows of 4, 6 and 8 (padded query rows among
/// them), d 64 and 128, QJL keys and not.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_fused_merge_equals_the_merge_kernel_launch_after_launch() {
    let Some(b) = backend(
        "gpu_fused_merge_equals_the_merge_kernel_launch_after_launch",
        Options::default(),
    ) else {
        return;
    };
    // (query lengths, key lengths, Hq, Hk, d, causal)
    type Case<'a> = (&'a [usize], &'a [usize], usize, usize, usize, bool);
    let cases: Vec<Case> = if small_only() {
        vec![(&[2, 1], &[37, 20], 8, 2, 64, true)]
    } else {
        vec![
            (&[1], &[32767], 32, 8, 128, false),
            (&[1, 1, 1], &[577, 0, 65], 32, 8, 128, false),
            (&[2, 1], &[300, 4097], 16, 4, 128, true),
            (&[1, 2], &[1000, 63], 12, 4, 64, true),
        ]
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (lq, lk, hq, hk, d, causal) in cases {
        let p = problem(lq, lk, hq, hk, d, causal);
        let x = inputs(&p, 7 + lk[0] as u64);
        for cfg in [0, 3, 7].map(|i| configs(&p)[i].clone()) {
            let what = format!(
                "{} lq {lq:?} lk {lk:?} {hq}/{hk} d {d} causal {causal}",
                name(&cfg)
            );
            let mut t = engine(&b, &cfg, &p);
            if t.set_unit_warps(Some(7)).is_err() {
                eprintln!("{what}: 7-warp CTAs do not fit this GPU; fused merge not tested");
                return;
            }
            t.set_fused_merge(false);
            let (want, cache) = t.run(&p, &x, None).unwrap();
            t.set_fused_merge(true);
            let prep = t.prepare_decode(&p, &cache, None).unwrap();
            if !prep.merge_fused() {
                eprintln!("{what}: the fused merge does not fit this GPU; not tested");
                return;
            }
            let q = t.upload_f16(&x.q.data).unwrap();
            for launch in 0..3 {
                let mut o = t.alloc_outputs(&p).unwrap();
                t.launch_decode(&prep, &q, &cache, &mut o).unwrap();
                let got = t.download(&o, &p).unwrap();
                assert_eq!(
                    bits(&got.o.data),
                    bits(&want.o.data),
                    "{what}, launch {launch}: O differs from the merge kernel's"
                );
                assert_eq!(
                    bits(&got.lse.data),
                    bits(&want.lse.data),
                    "{what}, launch {launch}: LSE differs from the merge kernel's"
                );
            }
        }
    }
}

/// The small grid under compute-sanitizer: compression (keys with and without QJL, values), a
/// split decode over a ragged batch, one append and a second decode.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_turboquant_sanitizer_small() {
    let Some(b) = backend("gpu_turboquant_sanitizer_small", Options::default()) else {
        return;
    };
    let p = problem(&[2, 1], &[37, 20], 8, 2, 64, true);
    let x = inputs(&p, 5);
    // [5], [7]: crumb codes (keys with and without QJL, values)
    for cfg in [0, 3, 5, 7].map(|i| configs(&p)[i].clone()) {
        let t = engine(&b, &cfg, &p);
        let (out, mut cache) = t.run(&p, &x, Some(3)).unwrap();
        check_decode(&format!("sanitizer {}", name(&cfg)), &p, &x, &cfg, &out);
        let kn = t.upload_f16(&vec![0.5; 2 * 2 * 64]).unwrap();
        let vn = t.upload_f16(&vec![-0.25; 2 * 2 * 64]).unwrap();
        t.append(&mut cache, &kn, &vn, 1, &[1, 1]).unwrap();
        let mut p2 = p.clone();
        p2.seqlens_k = cache.lens().to_vec();
        let prep = t.prepare_decode(&p2, &cache, None).unwrap();
        let mut o2 = t.alloc_outputs(&p2).unwrap();
        t.launch_decode(&prep, &t.upload_f16(&x.q.data).unwrap(), &cache, &mut o2)
            .unwrap();
        let got = t.download(&o2, &p2).unwrap();
        assert!(got.o.data.iter().all(|v| v.is_finite()));
    }
    // d 128 with 2-bit keys and values at <= 8 rows (k2-v2, k3q-v2: the crumb kernels whose P·V
    // runs after the next stage's softmax), which the d 64 grid above never reaches
    let p128 = problem(&[1, 1], &[37, 20], 8, 2, 128, true);
    let x128 = inputs(&p128, 6);
    for cfg in [5, 7].map(|i| configs(&p128)[i].clone()) {
        let t = engine(&b, &cfg, &p128);
        let (out, _) = t.run(&p128, &x128, Some(3)).unwrap();
        check_decode(
            &format!("sanitizer d 128 {}", name(&cfg)),
            &p128,
            &x128,
            &cfg,
            &out,
        );
    }
    // the merge fused into the decode (7-warp CTAs, one per SM at small work): its counters,
    // shared-memory reuse after the decode loop and partial reads, twice over one workspace
    let cfg = configs(&p)[0].clone();
    let mut t = engine(&b, &cfg, &p);
    if t.set_unit_warps(Some(7)).is_ok() {
        t.set_fused_merge(true);
        let (want, cache) = t.run(&p, &x, Some(3)).unwrap();
        let prep = t.prepare_decode(&p, &cache, Some(3)).unwrap();
        let q = t.upload_f16(&x.q.data).unwrap();
        for _ in 0..2 {
            let mut o = t.alloc_outputs(&p).unwrap();
            t.launch_decode(&prep, &q, &cache, &mut o).unwrap();
            let got = t.download(&o, &p).unwrap();
            assert_eq!(got.o.data, want.o.data, "sanitizer: fused merge O");
        }
    }
}

/// Holds a cache written by a fast compression path against the emulation's contract
/// (`ferrattn_cuda::turboquant::check_compress_contract`, shared with the device API's test;
/// docs/TURBOQUANT_CUDA.md, "Compression on tensor cores"): panics with the first violation.
fn check_fast_cache(
    what: &str,
    p: &AttentionProblem,
    x: &AttentionInputs,
    cfg: &TurboQuantConfig,
    got: &turboquant::CompressedKv,
    path: ferrattn_cuda::turboquant::CompressPath,
) -> ferrattn_cuda::turboquant::ContractCounts {
    ferrattn_cuda::turboquant::check_compress_contract(p, x, cfg, got, path)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The fast compression paths against their contract (random LLM-like inputs with outlier
/// channels), and the decode over a fast cache no worse against the f64 golden than over the
/// exact cache beyond noise: per case within the 10%, and within 3% in the geometric
/// mean over all cases and configurations.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_fast_compression_meets_its_contract() {
    use ferrattn_cuda::turboquant::CompressPath;
    let Some(b) = backend(
        "gpu_fast_compression_meets_its_contract",
        Options::default(),
    ) else {
        return;
    };
    let cases: &[(&[usize], usize, usize)] = if small_only() {
        &[(&[37, 0, 20], 64, 2)]
    } else {
        &[
            (&[37, 0, 20], 64, 2),
            (&[577, 65, 1, 130], 128, 2),
            (&[2049, 3], 128, 8),
        ]
    };
    let mut ratios = std::collections::BTreeMap::new();
    for &(lk, d, hk) in cases {
        let p = problem(&vec![1; lk.len()], lk, 4 * hk, hk, d, false);
        let x = inputs(&p, 17 + d as u64);
        let (g_o, _) = golden::exact_attention_f64(&p, &x);
        let rows = p.total_kv_tokens() * p.heads_kv;
        for cfg in configs(&p) {
            let (exact, _) = engine(&b, &cfg, &p).run(&p, &x, None).unwrap();
            let e_exact = Comparison::new(&g_o, &f64s(&exact.o)).rel_fro;
            for path in [CompressPath::Fast, CompressPath::Split] {
                let t = engine(&b, &cfg, &p).with_compress_path(path);
                let (out, cache) = t.run(&p, &x, None).unwrap();
                let got = cache.download(p.max_seqlen_k).unwrap();
                let what = format!("{} {path:?} d {d} lens {lk:?}", name(&cfg));
                let m = check_fast_cache(&what, &p, &x, &cfg, &got, path);
                assert!(
                    out.o.data.iter().all(|v| v.is_finite()),
                    "{what}: non-finite O"
                );
                let e_fast = Comparison::new(&g_o, &f64s(&out.o)).rel_fro;
                eprintln!(
                    "{what}: {rows} rows x 2; rows with a code off {} ({} coordinates, {:.2e} of all), key rows with a sign off {} ({} signs, {:.2e}), ‖r‖ max rel {:.2e}; decode vs golden fast {e_fast:.4e} exact {e_exact:.4e}",
                    m.rows_with_codes_off,
                    m.codes_off,
                    m.codes_off as f64 / (2 * rows * d) as f64,
                    m.rows_with_signs_off,
                    m.signs_off,
                    m.signs_off as f64 / (rows * d).max(1) as f64,
                    m.rnorm_max_rel
                );
                // the bound for a kernel against its emulation, per case: 10%. On these
                // inputs (outlier channels, logits of |s| ~ 10^2) one near-tie code or one f16
                // ulp of ‖r‖ moves a logit by ~0.1, so single cases move by a few % either way;
                // the mean over all cases must show no systematic loss
                assert!(
                    e_fast <= 1.1 * e_exact + 1e-6,
                    "{what}: decode over the fast cache {e_fast} vs over the exact cache {e_exact} against the golden"
                );
                ratios
                    .entry(format!("{path:?}"))
                    .or_insert_with(Vec::new)
                    .push(e_fast / e_exact.max(1e-12));
            }
        }
    }
    for (path, r) in &ratios {
        let mean = r.iter().map(|x| x.ln()).sum::<f64>() / r.len() as f64;
        let (lo, hi) = r
            .iter()
            .fold((f64::INFINITY, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
        eprintln!(
            "{path}: decode error over the fast cache / over the exact cache: geometric mean {:.4} over {} cases (min {lo:.4}, max {hi:.4})",
            mean.exp(),
            r.len()
        );
        assert!(
            mean.exp() <= 1.03,
            "{path}: the fast cache's decode is systematically worse (geometric mean ratio {})",
            mean.exp()
        );
    }
}

/// Rows at the edges of the fast norm (an f32 sum first, the f64 sum where the f32 one cannot
/// settle the f16 norm's rounding): all zeros, only f16 subnormals, subnormals beside a large
/// value, one nonzero element, and norms next to an f16 rounding midpoint (sqrt(1 + 2^-10) lies
/// 2^-23 below the midpoint between 1 and 1 + 2^-10), through both fast paths against the
/// contract (norms bit-exact with the emulation).
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_fast_compression_edge_rows_meet_its_contract() {
    use ferrattn_cuda::turboquant::CompressPath;
    let Some(b) = backend(
        "gpu_fast_compression_edge_rows_meet_its_contract",
        Options::default(),
    ) else {
        return;
    };
    let sub = |k: usize| {
        ((k % 7) as f32 + 1.0) * 2f32.powi(-24) * if k.is_multiple_of(3) { -1.0 } else { 1.0 }
    };
    for d in [64usize, 128] {
        let lk: &[usize] = &[37, 9];
        let p = problem(&[1, 1], lk, 8, 2, d, false);
        let mut x = inputs(&p, 29 + d as u64);
        let edge = |row: &mut [f32], j: usize| match j {
            0 => row.fill(0.0),
            1 => row.iter_mut().enumerate().for_each(|(k, v)| *v = sub(k)),
            2 => {
                row.iter_mut()
                    .enumerate()
                    .for_each(|(k, v)| *v = sub(k + 1));
                row[3] = 1000.0;
            }
            3 => {
                row.fill(0.0);
                row[5] = -0.5;
            }
            4 | 5 => {
                row.fill(0.0);
                row[0] = 1.0;
                row[d - 1] = if j == 4 { 0.03125 } else { -0.03125 };
                if j == 5 {
                    row[7] = 2f32.powi(-24);
                }
            }
            _ => {}
        };
        for bb in 0..p.batch {
            for j in 0..6.min(p.seqlens_k[bb]) {
                for h in 0..p.heads_kv {
                    edge(x.k.row4_mut(bb, j, h), j);
                    edge(x.v.as_mut().unwrap().row4_mut(bb, j, h), j);
                }
            }
        }
        for cfg in configs(&p) {
            for path in [CompressPath::Fast, CompressPath::Split] {
                let t = engine(&b, &cfg, &p).with_compress_path(path);
                let (out, cache) = t.run(&p, &x, None).unwrap();
                let got = cache.download(p.max_seqlen_k).unwrap();
                let what = format!("edge rows {} {path:?} d {d}", name(&cfg));
                let m = check_fast_cache(&what, &p, &x, &cfg, &got, path);
                assert!(
                    out.o.data.iter().all(|v| v.is_finite()),
                    "{what}: non-finite O"
                );
                eprintln!(
                    "{what}: contract met ({} coordinates off, {} signs off)",
                    m.codes_off, m.signs_off
                );
            }
        }
    }
}

/// A prefill long enough that every CTA of the fast kernels runs dozens of chunks (the cp.async
/// ring and the destination-row ring wrap many times; the contract tests above run one or two
/// chunks per CTA): the fast cache against the exact one, both on the GPU. Norms must be equal
/// bit for bit (a misplaced or unwritten row breaks them); a near-tie code or sign flips in at
/// most ~6e-4 of the coordinates (the contract tests' measured rate), a misplaced row in most of
/// its own, so more than 1% of codes or signs off is a failure.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_fast_compression_of_a_long_prefill_matches_the_exact_norms() {
    use ferrattn_cuda::turboquant::CompressPath;
    let Some(b) = backend(
        "gpu_fast_compression_of_a_long_prefill_matches_the_exact_norms",
        Options::default(),
    ) else {
        return;
    };
    if small_only() {
        return;
    }
    for d in [128usize, 64] {
        let lk: &[usize] = &[4096, 4093, 4096, 3001];
        let p = problem(&[1; 4], lk, 32, 8, d, false);
        let x = inputs(&p, 41 + d as u64);
        let cfg = configs(&p)[0].clone();
        let (_, exact) = engine(&b, &cfg, &p).run(&p, &x, None).unwrap();
        let exact = exact.download(p.max_seqlen_k).unwrap();
        let t = engine(&b, &cfg, &p).with_compress_path(CompressPath::Fast);
        let (_, fast) = t.run(&p, &x, None).unwrap();
        let fast = fast.download(p.max_seqlen_k).unwrap();
        let (hk, sk) = (p.heads_kv, p.max_seqlen_k);
        let (mut rows, mut codes_off, mut signs_off) = (0usize, 0usize, 0usize);
        let sb = exact.k_signs.len() / (p.batch * sk * hk);
        for bb in 0..p.batch {
            for j in 0..p.seqlens_k[bb] {
                for h in 0..hk {
                    let r = (bb * sk + j) * hk + h;
                    assert_eq!(
                        (fast.k_norm[r].to_bits(), fast.v_norm[r].to_bits()),
                        (exact.k_norm[r].to_bits(), exact.v_norm[r].to_bits()),
                        "d {d}: norms of (b {bb}, token {j}, head {h})"
                    );
                    codes_off += (0..d)
                        .filter(|&o| {
                            fast.k_idx[r * d + o] != exact.k_idx[r * d + o]
                                || fast.v_idx[r * d + o] != exact.v_idx[r * d + o]
                        })
                        .count();
                    signs_off += (0..sb)
                        .map(|i| {
                            (fast.k_signs[r * sb + i] ^ exact.k_signs[r * sb + i]).count_ones()
                                as usize
                        })
                        .sum::<usize>();
                    rows += 1;
                }
            }
        }
        let (fc, fs) = (
            codes_off as f64 / (rows * d) as f64,
            signs_off as f64 / (rows * sb * 8) as f64,
        );
        eprintln!(
            "long prefill d {d}, {rows} rows: norms bit-equal, coordinates with a key or value code off {fc:.2e}, signs off {fs:.2e}"
        );
        assert!(
            fc < 1e-2 && fs < 1e-2,
            "d {d}: codes off {fc}, signs off {fs}"
        );
    }
}

/// Appends through the fast path (ragged, odd starts, single tokens and a block) leave the same
/// cache as one fast compression of everything: a token's codes do not depend on where its tile
/// starts, and value token pairs split across appends keep both nibbles.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_fast_appends_equal_one_fast_compression() {
    use ferrattn_cuda::turboquant::CompressPath;
    let Some(b) = backend(
        "gpu_fast_appends_equal_one_fast_compression",
        Options::default(),
    ) else {
        return;
    };
    let d = if small_only() { 64 } else { 128 };
    let prefill: &[usize] = &[5, 0, 130, 47];
    // appends of (tokens per sequence) in order
    let appends: &[usize] = &[1, 1, 3, 1, 9, 1];
    let total: Vec<usize> = prefill
        .iter()
        .map(|&l| l + appends.iter().sum::<usize>())
        .collect();
    let full = problem(&vec![1; total.len()], &total, 8, 4, d, false);
    let x = inputs(&full, 123);
    for cfg in [0, 3, 5, 7].map(|i| configs(&full)[i].clone()) {
        for path in [CompressPath::Fast, CompressPath::Split] {
            let t = engine(&b, &cfg, &full).with_compress_path(path);
            let (_, once) = t.run(&full, &x, None).unwrap();
            let want = once.download(full.max_seqlen_k).unwrap();
            let mut cache = t
                .alloc_cache(full.batch, full.heads_kv, full.max_seqlen_k)
                .unwrap();
            let k_all = t.upload_f16(&x.k.data).unwrap();
            let v_all = t.upload_f16(&x.v.as_ref().unwrap().data).unwrap();
            t.append(&mut cache, &k_all, &v_all, full.max_seqlen_k, prefill)
                .unwrap();
            for &n in appends {
                let mut kn = Tensor::zeros(&[full.batch, n, full.heads_kv, d], DType::F16);
                let mut vn = kn.clone();
                for bi in 0..full.batch {
                    for s in 0..n {
                        let j = cache.lens()[bi] + s;
                        for h in 0..full.heads_kv {
                            kn.row4_mut(bi, s, h).copy_from_slice(x.k.row4(bi, j, h));
                            vn.row4_mut(bi, s, h)
                                .copy_from_slice(x.v.as_ref().unwrap().row4(bi, j, h));
                        }
                    }
                }
                t.append(
                    &mut cache,
                    &t.upload_f16(&kn.data).unwrap(),
                    &t.upload_f16(&vn.data).unwrap(),
                    n,
                    &vec![n; full.batch],
                )
                .unwrap();
            }
            let got = cache.download(full.max_seqlen_k).unwrap();
            assert_eq!(got.seqlens_k, total);
            let what = format!("{} {path:?}", name(&cfg));
            let diff = |a: &[u8], b: &[u8]| a.iter().zip(b).filter(|(x, y)| x != y).count();
            let fdiff = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .filter(|(x, y)| x.to_bits() != y.to_bits())
                    .count()
            };
            assert_eq!(diff(&got.k_idx, &want.k_idx), 0, "{what}: key codes");
            assert_eq!(diff(&got.v_idx, &want.v_idx), 0, "{what}: value codes");
            assert_eq!(diff(&got.k_signs, &want.k_signs), 0, "{what}: signs");
            assert_eq!(fdiff(&got.k_norm, &want.k_norm), 0, "{what}: key norms");
            assert_eq!(
                fdiff(&got.r_norm, &want.r_norm),
                0,
                "{what}: residual norms"
            );
            assert_eq!(fdiff(&got.v_norm, &want.v_norm), 0, "{what}: value norms");
            eprintln!(
                "{} {path:?} d {d}: appends equal one fast compression",
                name(&cfg)
            );
        }
    }
}

/// The small grid of the fast compression kernels under compute-sanitizer: a ragged prefill and
/// one append through each fast path, keys with and without QJL.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver library where this was built"
)]
fn gpu_turboquant_fast_sanitizer_small() {
    use ferrattn_cuda::turboquant::CompressPath;
    let Some(b) = backend("gpu_turboquant_fast_sanitizer_small", Options::default()) else {
        return;
    };
    let p = problem(&[1, 1], &[37, 20], 8, 2, 64, false);
    let x = inputs(&p, 5);
    for cfg in [0, 3, 5, 7].map(|i| configs(&p)[i].clone()) {
        for path in [CompressPath::Fast, CompressPath::Split] {
            let t = engine(&b, &cfg, &p).with_compress_path(path);
            let mut cache = t.alloc_cache(p.batch, p.heads_kv, 64).unwrap();
            let k = t.upload_f16(&x.k.data).unwrap();
            let v = t.upload_f16(&x.v.as_ref().unwrap().data).unwrap();
            t.append(&mut cache, &k, &v, p.max_seqlen_k, &p.seqlens_k)
                .unwrap();
            let kn = t.upload_f16(&vec![0.5; 2 * 2 * 64]).unwrap();
            let vn = t.upload_f16(&vec![-0.25; 2 * 2 * 64]).unwrap();
            t.append(&mut cache, &kn, &vn, 1, &[1, 1]).unwrap();
            assert_eq!(cache.lens(), &[38, 21]);
            let got = cache.download(39).unwrap();
            assert!(got.k_norm.iter().all(|v| v.is_finite()));
        }
    }
}
