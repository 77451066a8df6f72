//! A seeded property/fuzz harness over plans and inputs, through the library API (`Runtime::plan`,
//! `AttentionPlan::from_json`, `Runtime::run`), as issue 15 asks: 0 panics, 0 aborts, 0 hangs and
//! 0 wrong answers returned as success.
//!
//! Each case draws a small problem for one algorithm, inputs at a magnitude from `1e-30` to the
//! dtype's largest finite value (sometimes with single extreme elements, a truncated tensor or
//! ragged lengths), and a plan that is either fresh or a mutation of a fresh one's JSON (a number
//! set to 0, 1, a neighbour, 2^31, 2^62 or `u64::MAX`; an array emptied, shortened, duplicated or
//! reversed; a string or a boolean swapped). The run must then either return a typed error or a
//! result that is right:
//! * exact and lean are exact softmax attention in `f32`: O and LSE must lie within an a-priori
//!   bound of the `f64` reference (dot-product rounding `(d + 2) 2^-24` times the logit bound
//!   `scale max||q|| max||k||`, amplified by the softmax, plus the dtype's rounding of O);
//! * every algorithm: NaN/inf only where the reference has them (a row zeroed with LSE `-inf`
//!   where the reference is finite is the silent wrong answer the issue found), and on unit
//!   Gaussian inputs with a fresh plan the bound `ferrattn run` states ([`RunTolerance`]).
//!
//! Every case runs in its own thread under catch_unwind and a time limit, so a panic or a hang is
//! reported with the case's seed; an abort (a failed allocation) ends the test process, which CI
//! reports as a failure. The issue's cases run first as fixed seeds. Time budget:
//! `FERRATTN_FUZZ_SECS` (default 25 s, then the loop stops); `FERRATTN_FUZZ_SEED` moves the whole
//! sequence; `FERRATTN_FUZZ_CASE=n` replays case `n` alone.

use ferrattn::compare::RunTolerance;
use ferrattn::{
    Algorithm, AttentionInputs, AttentionOptions, AttentionPlan, AttentionProblem, BackendChoice,
    BackendKind, Comparison, DType, Runtime, Tensor,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A case longer than this is a hang (the slowest legitimate case takes milliseconds).
const CASE_LIMIT: Duration = Duration::from_secs(20);

/// What a case ended in.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// A typed error (the input or plan was refused).
    Refused,
    /// A result that passed the oracle.
    Right,
}

/// One fuzz case, fully determined by its seed.
#[derive(Clone, Debug)]
struct Case {
    algo: Algorithm,
    dims: [usize; 7],
    dtype: DType,
    causal: bool,
    scale: Option<f32>,
    magnitude: f32,
    seqlens_k: Option<Vec<i64>>,
    /// (tensor 0 = q, 1 = k, flat index, value) set after drawing.
    spikes: Vec<(usize, usize, f32)>,
    truncate: Option<usize>,
    /// JSON mutations of the fresh plan: (leaf index, mutation kind).
    mutations: Vec<(usize, u32)>,
    seed: u64,
}

const MAGNITUDES: [f32; 9] = [1e-30, 1e-3, 1.0, 1.0, 1.0, 30.0, 1e10, 4e20, 1e30];

fn draw_case(seed: u64) -> Case {
    let mut r = StdRng::seed_from_u64(seed);
    let algo = Algorithm::ALL[r.gen_range(0..Algorithm::ALL.len())];
    let b = r.gen_range(1..=3);
    let sq = match algo {
        Algorithm::Amla => r.gen_range(1..=2),
        Algorithm::Lean => r.gen_range(1..=4),
        _ => r.gen_range(1..=12),
    };
    let sk = r.gen_range(1..=150);
    let hk = if algo == Algorithm::Amla {
        1
    } else {
        r.gen_range(1..=3)
    };
    let hq = hk * [1, 2, 4][r.gen_range(0..3)];
    let (d, dv) = match algo {
        Algorithm::Amla => (64, 48),
        _ => (64, 64),
    };
    let dtype = match algo {
        Algorithm::Amla => DType::BF16,
        _ => [DType::F32, DType::F16, DType::BF16][r.gen_range(0..3)],
    };
    let magnitude = MAGNITUDES[r.gen_range(0..MAGNITUDES.len())].min(dtype.max_finite());
    let scale = match r.gen_range(0..8) {
        0 => Some(1e-40),
        1 => Some(1e3),
        2 => Some([f32::MIN_POSITIVE, 0.5, 7.0][r.gen_range(0..3)]),
        _ => None,
    };
    let seqlens_k = r.gen_bool(0.3).then(|| {
        (0..b)
            .map(|_| match r.gen_range(0..10) {
                0 => -1,
                1 => sk as i64 + 1,
                _ => r.gen_range(0..=sk as i64),
            })
            .collect()
    });
    let spikes = if r.gen_bool(0.2) {
        (0..r.gen_range(1..=3))
            .map(|_| {
                let v = [dtype.max_finite(), -dtype.max_finite(), 4e20, 1e-38][r.gen_range(0..4)];
                (
                    r.gen_range(0..2),
                    r.gen_range(0..usize::MAX),
                    v.min(dtype.max_finite()),
                )
            })
            .collect()
    } else {
        vec![]
    };
    let truncate = r.gen_bool(0.03).then(|| r.gen_range(0..3));
    let mutations = if r.gen_bool(0.6) {
        (0..r.gen_range(1..=3))
            .map(|_| (r.gen_range(0..10_000), r.gen_range(0..12)))
            .collect()
    } else {
        vec![]
    };
    Case {
        algo,
        dims: [b, sq, sk, hq, hk, d, dv],
        dtype,
        causal: r.gen_bool(0.3),
        scale,
        magnitude,
        seqlens_k,
        spikes,
        truncate,
        mutations,
        seed,
    }
}

fn inputs(c: &Case) -> AttentionInputs {
    let [b, sq, sk, hq, hk, d, dv] = c.dims;
    let mut r = StdRng::seed_from_u64(c.seed ^ 0x5eed);
    let mut q = Tensor::randn(&[b, sq, hq, d], c.dtype, c.magnitude, &mut r);
    let mut k = Tensor::randn(&[b, sk, hk, d], c.dtype, c.magnitude, &mut r);
    for &(t, i, v) in &c.spikes {
        let t = if t == 0 { &mut q } else { &mut k };
        let n = t.data.len();
        t.data[i % n] = c.dtype.round(v);
    }
    let mut x = if c.algo == Algorithm::Amla {
        AttentionInputs::mla(q, k)
    } else {
        let v = Tensor::randn(&[b, sk, hk, dv], c.dtype, 1.0, &mut r);
        AttentionInputs::new(q, k, v)
    };
    match c.truncate {
        Some(0) => {
            x.q.data.pop();
        }
        Some(1) => {
            x.k.data.pop();
        }
        Some(_) => {
            if let Some(v) = x.v.as_mut() {
                v.data.pop();
            }
        }
        None => {}
    }
    x.seqlens_k = c.seqlens_k.clone();
    x
}

/// Every leaf of a JSON value, in document order, as a path of keys and indices.
fn leaves(v: &Value, path: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                path.push(Value::String(k.clone()));
                leaves(x, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            out.push(path.clone()); // the array itself can be mutated
            for (i, x) in a.iter().enumerate() {
                path.push(Value::from(i));
                leaves(x, path, out);
                path.pop();
            }
        }
        _ => out.push(path.clone()),
    }
}

fn at<'a>(v: &'a mut Value, path: &[Value]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match k {
        Value::String(s) => &mut v[s.as_str()],
        Value::Number(n) => &mut v[n.as_u64().unwrap() as usize],
        _ => unreachable!(),
    })
}

fn mutate(json: &mut Value, leaf: usize, kind: u32) {
    let mut all = vec![];
    leaves(json, &mut vec![], &mut all);
    let path = &all[leaf % all.len()];
    let v = at(json, path);
    *v = match (&*v, kind) {
        (Value::Number(n), _) => {
            let x = n.as_u64().unwrap_or(1);
            Value::from(match kind % 8 {
                0 => 0,
                1 => 1,
                2 => x.saturating_add(1),
                3 => x.saturating_sub(1),
                4 => 1 << 31,
                5 => 1 << 62,
                6 => u64::MAX,
                _ => x.saturating_mul(2),
            })
        }
        (Value::Array(a), _) => {
            let mut a = a.clone();
            match kind % 4 {
                0 => a.clear(),
                1 => {
                    a.pop();
                }
                2 => {
                    if let Some(x) = a.first().cloned() {
                        a.push(x);
                    }
                }
                _ => a.reverse(),
            }
            Value::Array(a)
        }
        (Value::Bool(b), _) => Value::Bool(!b),
        (Value::String(_), _) => {
            let names = [
                "exact",
                "turbo",
                "lean",
                "amla",
                "turboquant",
                "cpu",
                "cuda",
                "stream_k",
            ];
            Value::from(names[kind as usize % names.len()])
        }
        (other, _) => other.clone(),
    };
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Unit roundoff of a dtype.
fn unit(d: DType) -> f64 {
    match d {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
    }
}

/// Runs one case; `Err` describes a wrong answer.
fn run_case(c: &Case) -> Result<Outcome, String> {
    let x = inputs(c);
    let opts = AttentionOptions {
        causal: c.causal,
        softmax_scale: c.scale,
    };
    let dv = (c.algo == Algorithm::Amla).then_some(c.dims[6]);
    let Ok(p) = x.problem(opts, dv) else {
        return Ok(Outcome::Refused);
    };
    let rt = Runtime::select(BackendChoice::Exactly(BackendKind::Cpu), c.algo)
        .expect("the cpu runs every algorithm")
        .runtime;
    let Ok(fresh) = rt.plan(c.algo, &p) else {
        return Ok(Outcome::Refused);
    };
    let plan = if c.mutations.is_empty() {
        fresh.clone()
    } else {
        let mut json: Value = serde_json::from_str(&fresh.to_json()).unwrap();
        for &(leaf, kind) in &c.mutations {
            mutate(&mut json, leaf, kind);
        }
        match AttentionPlan::from_json(&json.to_string()) {
            Ok(plan) => plan,
            Err(_) => return Ok(Outcome::Refused),
        }
    };
    let Ok(out) = rt.run(&plan, &x) else {
        return Ok(Outcome::Refused);
    };
    // whatever ran, it ran the plan's problem, which run() checked equals the inputs'
    let p: &AttentionProblem = &plan.problem;
    let (o_ref, lse_ref) = ferrattn::golden::exact_attention_f64(p, &x);
    if out.o.data.len() != o_ref.len() || out.lse.data.len() != lse_ref.len() {
        return Err(format!(
            "output sizes {} and {}, expected {} and {}",
            out.o.data.len(),
            out.lse.data.len(),
            o_ref.len(),
            lse_ref.len()
        ));
    }
    let co = Comparison::new(&o_ref, &f64s(&out.o.data));
    let cl = Comparison::new(&lse_ref, &f64s(&out.lse.data));
    if let Some(i) = co.non_finite_mismatch.or(cl.non_finite_mismatch) {
        return Err(format!(
            "non-finite placement differs at {i}: O {co} / LSE {cl}"
        ));
    }
    match plan.algorithm {
        Algorithm::Exact | Algorithm::Lean => {
            // a-priori forward error of the f32 softmax (see the module docs)
            let r = ferrattn::range::InputRange::of(p, &x);
            let n = p.max_seqlen_k as f64;
            let delta =
                (p.head_dim_qk as f64 + 2.0) * 2f64.powi(-24) * r.logit_bound + 2f64.powi(-24) * n;
            let o_tol = r.v_abs
                * ((2.0 * delta).exp() - 1.0 + unit(p.dtype) + (n + 4.0) * 2f64.powi(-24))
                + 1e-30;
            if co.max_abs > o_tol {
                return Err(format!(
                    "O {co} exceeds the a-priori bound {o_tol:.3e} (delta {delta:.3e})"
                ));
            }
            for (i, (&l, &g)) in lse_ref.iter().zip(&out.lse.data).enumerate() {
                if l.is_finite() && (g as f64 - l).abs() > delta + 2f64.powi(-23) * l.abs() + 1e-6 {
                    return Err(format!("LSE[{i}] {g} vs {l}: beyond delta {delta:.3e}"));
                }
            }
        }
        _ => {}
    }
    let unit_gaussian =
        c.magnitude == 1.0 && c.spikes.is_empty() && c.scale.is_none() && c.mutations.is_empty();
    if unit_gaussian {
        let tol = RunTolerance::of(&plan);
        co.check("O", &tol.o)
            .and_then(|()| cl.check("LSE", &tol.lse))
            .map_err(|e| format!("unit-Gaussian input misses the stated bound ({tol}): {e}"))?;
    }
    Ok(Outcome::Right)
}

/// Runs a case in its own thread: a panic or a hang is a failure message.
fn guarded(c: Case) -> Result<Outcome, String> {
    let (tx, rx) = mpsc::channel();
    let what = format!("{c:?}");
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(|| run_case(&c));
        tx.send(r).ok();
    });
    match rx.recv_timeout(CASE_LIMIT) {
        Ok(Ok(r)) => r.map_err(|e| format!("wrong answer: {e}\n  case {what}")),
        Ok(Err(_)) => Err(format!("panic\n  case {what}")),
        Err(_) => Err(format!("hang (over {CASE_LIMIT:?})\n  case {what}")),
    }
}

/// The issue's reported cases, as mutations of fresh plans and inputs that the random loop also
/// reaches, pinned so they run on every CI pass.
fn issue_cases() -> Vec<Case> {
    let lean = Case {
        algo: Algorithm::Lean,
        dims: [1, 1, 1024, 4, 1, 64, 64],
        dtype: DType::F16,
        causal: false,
        scale: None,
        magnitude: 1.0,
        seqlens_k: None,
        spikes: vec![],
        truncate: None,
        mutations: vec![],
        seed: 15,
    };
    let mut cases = vec![lean.clone()];
    // every single-leaf mutation of the lean plan (tile_k = 0, cta_bounds emptied or cut, ...)
    // and of an exact plan (block_k = 2^62, the algorithm swapped, ...)
    for kind in 0..12 {
        for leaf in 0..40 {
            cases.push(Case {
                mutations: vec![(leaf, kind)],
                ..lean.clone()
            });
            cases.push(Case {
                algo: Algorithm::Exact,
                dims: [1, 3, 70, 4, 2, 64, 64],
                mutations: vec![(leaf, kind)],
                ..lean.clone()
            });
        }
    }
    // |q|, |k| ~ 4e20 through exact, lean and turboquant
    for algo in [Algorithm::Exact, Algorithm::Lean, Algorithm::TurboQuant] {
        cases.push(Case {
            algo,
            dims: [1, 2, 40, 4, 2, 64, 64],
            dtype: DType::F32,
            magnitude: 4e20,
            ..lean.clone()
        });
    }
    cases
}

#[test]
fn fuzz_plans_and_inputs() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let budget = Duration::from_secs(env("FERRATTN_FUZZ_SECS").unwrap_or(25));
    let base = env("FERRATTN_FUZZ_SEED").unwrap_or(0x15);
    if let Some(n) = env("FERRATTN_FUZZ_CASE") {
        let c = draw_case(base.wrapping_add(n));
        println!("{c:?}");
        println!("{:?}", guarded(c));
        return;
    }
    let t0 = Instant::now();
    let mut failures = vec![];
    let mut counts = [0usize; 2]; // refused, right
    let mut tally = |r: Result<Outcome, String>, failures: &mut Vec<String>| match r {
        Ok(Outcome::Refused) => counts[0] += 1,
        Ok(Outcome::Right) => counts[1] += 1,
        Err(e) => failures.push(e),
    };
    let pinned = issue_cases().len();
    for c in issue_cases() {
        tally(guarded(c), &mut failures);
    }
    let mut n = 0u64;
    while t0.elapsed() < budget && failures.len() < 10 {
        let r = guarded(draw_case(base.wrapping_add(n)));
        if let Err(e) = &r {
            println!("case {n} (FERRATTN_FUZZ_CASE={n}): {e}");
        }
        tally(r, &mut failures);
        n += 1;
    }
    let [refused, right] = counts;
    println!(
        "fuzz: {pinned} pinned + {n} random cases in {:.1} s (seed {base}): {right} right, {refused} refused, {} failed",
        t0.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(right > 0 && refused > 0, "the harness exercised nothing");
}
