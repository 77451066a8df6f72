//! GPU tests of the Lean decode kernel: against the f64 golden reference, against the CPU
//! emulation of the same schedule, poisoned outputs, ragged batches, every head dim, GQA ratio,
//! query length and dtype, bitwise reproducibility, the fixed-split variant and the NVRTC path.
//!
//! libtest cannot mark a test skipped at run time. Without a usable GPU every test here prints
//! `SKIPPED <test>: <reason>` on stderr and passes; `scripts/gpu-run.sh` greps for that line and
//! fails if any GPU test skipped on the GPU machine.
//!
//! Sizes: `FERRATTN_GPU_TEST_SCALE=small` keeps only the small cases (used under
//! compute-sanitizer).

use ferrattn_core::Device;
use ferrattn_core::{
    golden, lean, plan, Algorithm, AttentionPlan, AttentionProblem, Comparison, DType, PlanDetail,
    Tolerance,
};
use ferrattn_cuda::{CudaBackend, ModuleOrigin, Options};

mod common;
use common::{backend, small_only};
mod lean_device;

#[derive(Clone, Debug)]
struct Case {
    lens: Vec<usize>,
    hq: usize,
    hk: usize,
    d: usize,
    sq: usize,
    dtype: DType,
    causal: bool,
}

impl Case {
    fn new(lens: Vec<usize>, hq: usize, hk: usize, d: usize, dtype: DType) -> Case {
        Case {
            lens,
            hq,
            hk,
            d,
            sq: 1,
            dtype,
            causal: false,
        }
    }
    fn problem(&self) -> AttentionProblem {
        let max = *self.lens.iter().max().unwrap();
        let mut p = AttentionProblem::uniform(
            self.lens.len(),
            self.sq,
            max.max(1),
            self.hq,
            self.hk,
            self.d,
            self.d,
            self.dtype,
        );
        p.seqlens_k = self.lens.clone();
        p.causal = self.causal;
        p
    }
    fn macs(&self) -> usize {
        self.lens.iter().sum::<usize>() * self.hq * self.sq * self.d
    }
}

/// Runs each plan (all for one problem) on the same device-random inputs and compares with the
/// golden reference and, when `twin`, with the CPU emulation of that plan.
fn check_plans(
    b: &CudaBackend,
    plans: &[AttentionPlan],
    seed: u32,
    twin: bool,
) -> Result<(), String> {
    let p = &plans[0].problem;
    let x = b.random_inputs(p, seed, 2.0).map_err(|e| e.to_string())?;
    let hx = x.download().map_err(|e| e.to_string())?;
    let gold = golden::exact_attention(p, &hx);
    let mut errors = Vec::new();
    for pl in plans {
        let what = format!(
            "{} lens[..4]={:?}",
            pl.detail_kind(),
            &p.seqlens_k[..p.batch.min(4)]
        );
        let run = || -> Result<(), String> {
            let prep = b.prepare(pl).map_err(|e| e.to_string())?;
            let mut out = b.alloc_outputs(p).map_err(|e| e.to_string())?;
            b.launch(&prep, &x, &mut out).map_err(|e| e.to_string())?;
            let got = b.download(&out, p).map_err(|e| e.to_string())?;
            Comparison::f32(&gold.o.data, &got.o.data)
                .check(&format!("O vs golden {what}"), &Tolerance::output(p.dtype))?;
            Comparison::f32(&gold.lse.data, &got.lse.data)
                .check(&format!("LSE vs golden {what}"), &Tolerance::lse())?;
            if twin {
                let PlanDetail::Lean(lp) = &pl.detail else {
                    unreachable!()
                };
                let emu = lean::emulate(lp, p, &hx).map_err(|e| e.to_string())?;
                Comparison::f32(&emu.o.data, &got.o.data).check(
                    &format!("O vs CPU emulation {what}"),
                    &Tolerance::output(p.dtype),
                )?;
                Comparison::f32(&emu.lse.data, &got.lse.data)
                    .check(&format!("LSE vs CPU emulation {what}"), &Tolerance::lse())?;
            }
            Ok(())
        };
        if let Err(e) = run() {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

trait DetailKind {
    fn detail_kind(&self) -> String;
}
impl DetailKind for AttentionPlan {
    fn detail_kind(&self) -> String {
        match &self.detail {
            PlanDetail::Lean(l) => format!(
                "{} B={} Hq={} Hk={} d={} sq={} {} {} ctas",
                if l.schedule.merges_in_kernel() {
                    "stream-K"
                } else {
                    "fixed-split"
                },
                self.problem.batch,
                self.problem.heads_q,
                self.problem.heads_kv,
                self.problem.head_dim_qk,
                self.problem.max_seqlen_q,
                self.problem.dtype,
                l.num_ctas
            ),
            other => format!("{other:?}"),
        }
    }
}

fn run_cases(test: &str, cases: &[Case], fixed_too: bool) {
    let Some(b) = backend(test, Options::default()) else {
        return;
    };
    let caps = b.caps().unwrap();
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        if small_only() && c.macs() > 50_000_000 {
            continue;
        }
        let p = c.problem();
        let twin = c.macs() < 20_000_000;
        let sk = plan(Algorithm::Lean, &p, &caps).expect("plan");
        let mut plans = vec![sk.clone()];
        if fixed_too {
            let lp = lean::plan_fixed_split(&p, &caps, None).expect("fixed-split plan");
            plans.push(AttentionPlan {
                detail: PlanDetail::Lean(lp),
                ..sk
            });
        }
        if let Err(e) = check_plans(&b, &plans, 1000 + i as u32, twin) {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Batch sizes {1, 3, 16, 128} and KV lengths {1, 37, 577, 4097, 32767, 262144}: the product is
/// pruned to what the f64 reference can check in seconds, keeping every value.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_grid_of_batches_and_lengths_matches_golden() {
    use DType::*;
    let mut cases = Vec::new();
    for (i, &l) in [1usize, 37, 577, 4097, 32767, 262144].iter().enumerate() {
        let dt = if i % 2 == 0 { BF16 } else { F16 };
        cases.push(Case::new(vec![l], 8, 2, 128, dt)); // B = 1
    }
    cases.push(Case::new(vec![1, 37, 577], 4, 4, 64, F16)); // B = 3, ragged
    cases.push(Case::new(vec![4097, 262144, 32767], 4, 1, 128, BF16)); // B = 3, ragged, MQA
    cases.push(Case::new(vec![4097; 16], 32, 8, 128, F16)); // B = 16 Llama-3-8B heads
    cases.push(Case::new(
        (0..16).map(|i| 32767 - 2000 * i).collect(),
        8,
        8,
        64,
        BF16,
    ));
    cases.push(Case::new(vec![37; 128], 32, 8, 128, BF16)); // B = 128
    cases.push(Case::new(vec![577; 128], 8, 2, 256, F16));
    cases.push(Case::new(
        (0..128).map(|i| 1 + (i * 97) % 4097).collect(),
        8,
        1,
        128,
        F16,
    ));
    cases.push(Case::new(vec![32767; 128], 1, 1, 64, BF16));
    run_cases(
        "gpu_grid_of_batches_and_lengths_matches_golden",
        &cases,
        true,
    );
}

/// Every head dim x GQA ratio x dtype, query lengths 1..=8 (causal and not): 16 query heads per
/// KV head times 8 tokens is 128 rows, eight query-tile groups.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_every_head_dim_group_and_query_length() {
    let mut cases = Vec::new();
    for (i, &d) in [64usize, 128, 256].iter().enumerate() {
        for (j, &g) in [1usize, 2, 4, 8, 16].iter().enumerate() {
            for dt in [DType::F16, DType::BF16] {
                let sq = [1, 2, 3, 5, 8][(i + j) % 5];
                let mut c = Case::new(vec![577, 63, 1000 + 17 * j], 2 * g, 2, d, dt);
                c.sq = sq;
                c.causal = (i + j) % 2 == 1;
                cases.push(c);
            }
        }
    }
    // short causal sequences: rows before the first key are empty (O = 0, LSE = -inf)
    let mut c = Case::new(vec![3, 0, 8, 1], 8, 2, 128, DType::F16);
    c.sq = 8;
    c.causal = true;
    cases.push(c);
    run_cases("gpu_every_head_dim_group_and_query_length", &cases, true);
}

/// Ragged batches with average/maximum length from 10% to 100%.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_ragged_batches_10_to_100_percent() {
    let mut cases = Vec::new();
    let max = 4097usize;
    for (k, pct) in [10usize, 25, 50, 75, 100].into_iter().enumerate() {
        // one sequence at the maximum, the rest spread around the mean that gives `pct`
        let b = 16;
        let target_mean = max * pct / 100;
        let rest_mean = (target_mean * b - max) / (b - 1);
        let lens: Vec<usize> = (0..b)
            .map(|i| {
                if i == 0 {
                    max
                } else {
                    (rest_mean * (2 * i) / b).clamp(1, max)
                }
            })
            .collect();
        let dt = if k % 2 == 0 { DType::F16 } else { DType::BF16 };
        cases.push(Case::new(lens, 32, 8, 128, dt));
    }
    run_cases("gpu_ragged_batches_10_to_100_percent", &cases, true);
}

/// The same inputs give bitwise identical O and LSE on repeated runs (the merge order is fixed),
/// also when the launches are replayed from a CUDA graph.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_repeated_runs_are_bitwise_identical() {
    let Some(b) = backend(
        "gpu_repeated_runs_are_bitwise_identical",
        Options::default(),
    ) else {
        return;
    };
    let caps = b.caps().unwrap();
    let c = Case::new(
        (0..8).map(|i| 20000 - 1999 * i).collect(),
        32,
        8,
        128,
        DType::BF16,
    );
    let p = c.problem();
    let sk = plan(Algorithm::Lean, &p, &caps).unwrap();
    let fx = AttentionPlan {
        detail: PlanDetail::Lean(lean::plan_fixed_split(&p, &caps, None).unwrap()),
        ..sk.clone()
    };
    let x = b.random_inputs(&p, 7, 2.0).unwrap();
    for pl in [sk, fx] {
        let prep = b.prepare(&pl).unwrap();
        let mut out = b.alloc_outputs(&p).unwrap();
        let mut first: Option<(Vec<u16>, Vec<u32>)> = None;
        for _ in 0..5 {
            b.launch(&prep, &x, &mut out).unwrap(); // poisons first
            let o = out.o_bits().unwrap();
            let lse: Vec<u32> = b
                .download(&out, &p)
                .unwrap()
                .lse
                .data
                .iter()
                .map(|x| x.to_bits())
                .collect();
            match &first {
                None => first = Some((o, lse)),
                Some((o0, l0)) => {
                    assert!(
                        o0 == &o && l0 == &lse,
                        "{}: a rerun changed the result",
                        pl.detail_kind()
                    );
                }
            }
        }
        // replayed from a CUDA graph (flags re-armed in-kernel): still the same bits
        let gpu = b.gpu().unwrap();
        let graph = ferrattn_cuda::Graph::capture(gpu, || {
            for _ in 0..3 {
                b.launch(&prep, &x, &mut out)?;
            }
            Ok(())
        })
        .unwrap();
        for _ in 0..3 {
            graph.launch().unwrap();
            let (o0, l0) = first.as_ref().unwrap();
            let lse: Vec<u32> = b
                .download(&out, &p)
                .unwrap()
                .lse
                .data
                .iter()
                .map(|x| x.to_bits())
                .collect();
            assert!(
                o0 == &out.o_bits().unwrap() && l0 == &lse,
                "{}: a graph replay changed the result",
                pl.detail_kind()
            );
        }
    }
}

/// Exact attention on CUDA is the Lean kernel with one split per tile.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_exact_route_matches_golden() {
    use ferrattn_core::backend::ExactAttention;
    let Some(b) = backend("gpu_exact_route_matches_golden", Options::default()) else {
        return;
    };
    let c = Case::new(vec![100, 3000], 16, 4, 128, DType::F16);
    let p = c.problem();
    let pl = plan(Algorithm::Exact, &p, &b.caps().unwrap()).unwrap();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(3);
    let t = |s: &[usize], rng: &mut rand::rngs::StdRng| {
        ferrattn_core::Tensor::randn(s, p.dtype, 1.0, rng)
    };
    let x = ferrattn_core::AttentionInputs {
        seqlens_k: Some(vec![100, 3000]),
        ..ferrattn_core::AttentionInputs::new(
            t(&[2, 1, 16, 128], &mut rng),
            t(&[2, 3000, 4, 128], &mut rng),
            t(&[2, 3000, 4, 128], &mut rng),
        )
    };
    let p = x.problem(Default::default(), None).unwrap();
    let got = b
        .run_exact(
            &AttentionPlan {
                problem: p.clone(),
                ..pl
            },
            &x,
        )
        .unwrap();
    assert_eq!(got.provenance.backend, "cuda");
    let gold = golden::exact_attention(&p, &x);
    Comparison::f32(&gold.o.data, &got.o.data)
        .check("O", &Tolerance::output(p.dtype))
        .unwrap();
    Comparison::f32(&gold.lse.data, &got.lse.data)
        .check("LSE", &Tolerance::lse())
        .unwrap();
}

/// The NVRTC path (sources compiled at run time) runs and agrees with the golden reference.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_nvrtc_path_matches_golden() {
    if small_only() {
        eprintln!("SKIPPED gpu_nvrtc_path_matches_golden: small scale (sanitizer run)");
        return;
    }
    let Some(b) = backend(
        "gpu_nvrtc_path_matches_golden",
        Options {
            force_nvrtc: true,
            ..Options::default()
        },
    ) else {
        return;
    };
    match b.module_origin() {
        Ok(ModuleOrigin::Nvrtc { arch, .. }) => eprintln!("NVRTC module for {arch}"),
        other => panic!("expected an NVRTC module, got {other:?}"),
    }
    let p = Case::new(vec![577, 4097], 32, 8, 128, DType::BF16).problem();
    let pl = plan(Algorithm::Lean, &p, &b.caps().unwrap()).unwrap();
    check_plans(&b, &[pl], 5, true).unwrap();
}

/// A small grid for compute-sanitizer (memcheck, racecheck): few CTAs, every role present.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_sanitizer_small_grid() {
    let Some(b) = backend("gpu_sanitizer_small_grid", Options::default()) else {
        return;
    };
    let mut caps = b.caps().unwrap();
    caps.compute_units = 3; // 6 CTAs over 2 x (several tiles): hosts, finishers, partials
    for (lens, hq, hk, d, dt) in [
        (vec![300, 37, 1000], 8, 2, 128, DType::F16),
        (vec![129, 0, 64], 4, 4, 64, DType::BF16),
        (vec![70], 16, 1, 256, DType::F16),
    ] {
        let p = Case::new(lens, hq, hk, d, dt).problem();
        let sk = plan(Algorithm::Lean, &p, &caps).unwrap();
        let fx = AttentionPlan {
            detail: PlanDetail::Lean(lean::plan_fixed_split(&p, &caps, Some(3)).unwrap()),
            ..sk.clone()
        };
        check_plans(&b, &[sk, fx], 11, true).unwrap();
    }
}

/// The thread's current CUDA context (null when none), as a framework sharing the thread sees it.
fn current_context() -> cudarc::driver::sys::CUcontext {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: out-parameter query; the driver was initialised by the backend's open.
    let r = unsafe { cudarc::driver::sys::cuCtxGetCurrent(&mut ctx) };
    assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    ctx
}

/// Opening the backend, running, reading back and dropping everything leave the calling thread's
/// current context as it was: none, or a context the caller made (torch and jax keep their
/// current device in it; a library that moves it breaks them, as a 2 x H200 run showed).
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_callers_current_context_is_left_alone() {
    use cudarc::driver::sys;
    // a fresh thread starts with no current context
    std::thread::spawn(|| {
        let Some(b) = backend(
            "gpu_callers_current_context_is_left_alone",
            Options::default(),
        ) else {
            return;
        };
        assert!(
            current_context().is_null(),
            "opening the GPU left a context current"
        );
        let caps = b.caps().unwrap();
        let p = Case::new(vec![300, 37], 8, 2, 128, DType::F16).problem();
        let sk = plan(Algorithm::Lean, &p, &caps).unwrap();
        check_plans(&b, std::slice::from_ref(&sk), 5, false).unwrap();
        assert!(current_context().is_null(), "a run left a context current");

        // a context of the caller's own (not the primary one the backend uses) stays current
        let mut mine = std::ptr::null_mut();
        let mut params = sys::CUctxCreateParams {
            execAffinityParams: std::ptr::null_mut(),
            numExecAffinityParams: 0,
            cigParams: std::ptr::null_mut(),
        };
        // SAFETY: out-parameter; device 0 exists (the backend opened it); zeroed parameters.
        let r = unsafe { sys::cuCtxCreate_v4(&mut mine, &mut params, 0, 0) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        assert_eq!(current_context(), mine);
        check_plans(&b, &[sk], 6, false).unwrap();
        assert_eq!(
            current_context(),
            mine,
            "a run replaced the caller's context"
        );
        drop(b);
        assert_eq!(current_context(), mine, "dropping the backend replaced it");
        // SAFETY: created above, current on this thread, no work pending.
        assert_eq!(
            unsafe { sys::cuCtxDestroy_v2(mine) },
            sys::CUresult::CUDA_SUCCESS
        );
    })
    .join()
    .unwrap();
}
