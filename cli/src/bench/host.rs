//! Rows that need no accelerator: every CPU emulation on small problems (against exact attention
//! on the CPU, timed in the same run), and MLA decode on the SIMULATED Ascend 910 (AMLA against
//! the four-stage Base; durations from the timing model, numerics from the simulated backend).
//!
//! CPU rows are timed through the public API (`Runtime::plan` once, `Runtime::run` per call:
//! host slices in, host tensors out), which is the CPU backend's device path.

use crate::bench::check::{check_host, tolerance};
use crate::bench::report::{Baseline, Check, Row};
use crate::bench::shapes::{Family, Shape};
use crate::bench::timing::{measure, rotation_sets, HostClock, Method, Timing};
use crate::{AttentionInputs, AttentionOptions, BackendChoice, Result, Runtime, Tensor};
use ferrattn_core::{Algorithm, AttentionProblem};
use rand::SeedableRng;

/// Random host inputs of `s` (uniform in [-2, 2), rounded to the dtype), seeded.
pub fn inputs(s: &Shape, seed: u64) -> Result<(AttentionProblem, AttentionInputs)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut t = |h: usize, len: usize, d: usize| {
        Tensor::uniform(&[s.batch, len, h, d], s.dtype, -2.0, 2.0, &mut rng)
    };
    let q = t(s.hq, s.sq, s.d);
    let mut x = if s.hk == 1 && s.dv < s.d {
        // MLA: one latent per token whose first dv columns are V
        AttentionInputs::mla(q, t(1, s.max_ctx(), s.d))
    } else {
        let k = t(s.hk, s.max_ctx(), s.d);
        AttentionInputs::new(q, k, t(s.hk, s.max_ctx(), s.dv))
    };
    x.seqlens_k = Some(s.lens.iter().map(|&l| l as i64).collect());
    let p = x.problem(
        AttentionOptions {
            causal: s.causal,
            softmax_scale: None,
        },
        Some(s.dv),
    )?;
    Ok((p, x))
}

fn input_bytes(x: &AttentionInputs) -> usize {
    4 * (x.q.numel() + x.k.numel() + x.v.as_ref().map_or(0, |v| v.numel()))
}

/// What each CPU emulation runs on: the algorithms that take a shape.
pub fn cpu_algorithms(s: &Shape) -> Vec<Algorithm> {
    let mla = s.hk == 1 && s.dv < s.d;
    match (s.family, mla, s.sq, s.is_ragged()) {
        (Family::TurboQuantDecode, ..) => vec![Algorithm::TurboQuant],
        (_, true, ..) => vec![Algorithm::Amla],
        (_, false, 1, false) => vec![Algorithm::Lean, Algorithm::Turbo, Algorithm::TurboQuant],
        (_, false, 1, true) => vec![Algorithm::Lean],
        (_, false, _, _) => vec![Algorithm::Turbo],
    }
}

fn host_time(rt: &Runtime, plan: &crate::AttentionPlan, xs: &[AttentionInputs]) -> Result<Timing> {
    measure(&Method::HOST, &mut HostClock, xs.len(), |i| {
        rt.run(plan, &xs[i]).map(|_| ())
    })
}

/// The CPU rows of one shape: exact attention timed once as the baseline, then each algorithm
/// of `algos` checked against the f64 golden and timed.
pub fn cpu_rows(s: &Shape, algos: &[Algorithm]) -> Result<Vec<Row>> {
    let (p, x) = inputs(s, 1)?;
    let sets = rotation_sets(input_bytes(&x), ferrattn_core::DeviceCaps::cpu(1).l2_bytes).min(4);
    let mut xs = vec![x];
    for i in 1..sets {
        xs.push(inputs(s, 1 + i as u64)?.1);
    }
    let exact_rt = Runtime::select(
        BackendChoice::Exactly(ferrattn_core::BackendKind::Cpu),
        Algorithm::Exact,
    )?
    .runtime;
    let exact = match exact_rt.plan(Algorithm::Exact, &p) {
        Ok(plan) => Baseline {
            name: "exact-cpu".into(),
            time: Some(host_time(&exact_rt, &plan, &xs)?),
            note: Some("blocked online softmax in f32 on the CPU".into()),
            error: None,
        },
        Err(e) => Baseline {
            name: "exact-cpu".into(),
            time: None,
            note: None,
            error: Some(e.to_string()),
        },
    };
    let mut rows = vec![];
    for &algo in algos {
        let rt = Runtime::select(
            BackendChoice::Exactly(ferrattn_core::BackendKind::Cpu),
            algo,
        )?
        .runtime;
        let plan = rt.plan(algo, &p)?;
        let out = rt.run(&plan, &xs[0])?;
        let check = check_host(
            algo.name(),
            &p,
            &xs[0],
            &out.o,
            &out.lse,
            tolerance(algo, p.dtype),
            matches!(algo, Algorithm::Lean | Algorithm::Exact),
        );
        let time = if check.passed {
            Some(host_time(&rt, &plan, &xs)?)
        } else {
            None
        };
        let timed = match algo {
            Algorithm::Turbo => "quantisation of K/V (and Q) + attention, emulated",
            Algorithm::TurboQuant => {
                "compression of K/V + attention over the compressed cache, emulated"
            }
            _ => "attention, emulated",
        };
        rows.push(Row {
            shape: s.clone(),
            algorithm: algo.name().into(),
            variant: "emulation".into(),
            backend: "cpu".into(),
            simulated: false,
            plan: format!("{} threads", rayon::current_num_threads()),
            bytes: s.kv_bytes() as f64,
            flops: s.flops(),
            timed: timed.into(),
            check,
            time,
            baselines: vec![exact.clone()],
            floor_ms: None,
            floor_bound: None,
        });
    }
    Ok(rows)
}

/// One MLA row on the simulated Ascend 910: AMLA and Base from the timing model; the numerics of
/// the simulated backend checked at batch 1 of the same (Sq, Sk) (the model's batch of 96 would
/// cost minutes of emulation on a CPU).
pub fn mla_row(s: &Shape) -> Result<Row> {
    let sk = s.max_ctx();
    let amla = ferrattn_ascend::simulate(s.batch, s.sq, sk, ferrattn_ascend::Variant::Amla);
    let base = ferrattn_ascend::simulate(s.batch, s.sq, sk, ferrattn_ascend::Variant::Base);
    let one = Shape {
        batch: 1,
        lens: vec![sk],
        ..s.clone()
    };
    let (p, x) = inputs(&one, 3)?;
    let rt = Runtime::select(
        BackendChoice::Exactly(ferrattn_core::BackendKind::Ascend),
        Algorithm::Amla,
    )?
    .runtime;
    let plan = rt.plan(Algorithm::Amla, &p)?;
    let out = rt.run(&plan, &x)?;
    let mut check: Check = check_host(
        "amla (simulated 910)",
        &p,
        &x,
        &out.o,
        &out.lse,
        tolerance(Algorithm::Amla, p.dtype),
        false,
    );
    check.reference = format!("f64 golden, batch 1 of the same Sq {} and Sk {sk}", s.sq);
    let time = check.passed.then(|| Timing::model(amla.duration_us * 1e-3));
    Ok(Row {
        shape: s.clone(),
        algorithm: "amla".into(),
        variant: format!("preload {}", amla.preload_count),
        backend: "ascend".into(),
        simulated: true,
        plan: format!("{} core pairs", amla.core_pairs_used),
        bytes: s.kv_bytes() as f64,
        flops: amla.tflops * 1e12 * amla.duration_us * 1e-6,
        timed: format!(
            "{} (SIMULATED timing model, not a measurement)",
            amla.provenance
        ),
        check,
        time,
        baselines: vec![Baseline {
            name: "base-simulated".into(),
            time: Some(Timing::model(base.duration_us * 1e-3)),
            note: Some("the four-stage Base kernel (AMLA Alg. 1) on the same model".into()),
            error: None,
        }],
        // the model's floor: its peak FLOPS, so floor / time is the FLOPS utilisation
        floor_ms: Some(amla.duration_us * 1e-3 * amla.fu_pct / 100.0),
        floor_bound: Some("compute (model peak)".into()),
    })
}
