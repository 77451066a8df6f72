//! Issue 15, one test per reported case, through the library API: forged plans, sizes whose
//! products overflow, inputs whose logits overflow an `f32` softmax, tensors shorter than their
//! shape, and input files with unknown or mistyped tensors. Each must fail with a typed error
//! (or, where the input is representable, compute the right answer), never panic, abort, hang
//! or return a wrong result. The CLI's side of the issue is in `cli/tests/cli.rs`.

use ferrattn_cli::lean::Schedule;
use ferrattn_cli::{
    Algorithm, AttentionInputs, AttentionOptions, AttentionPlan, AttentionProblem, BackendChoice,
    BackendKind, Comparison, CoreError, DType, FerrattnError, PlanDetail, Runtime, Tensor,
    Tolerance,
};
use rand::SeedableRng;

fn cpu(algo: Algorithm) -> Runtime {
    Runtime::select(BackendChoice::Exactly(BackendKind::Cpu), algo)
        .unwrap()
        .runtime
}

fn qkv(
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
) -> AttentionInputs {
    let mut r = rand::rngs::StdRng::seed_from_u64(15);
    AttentionInputs::new(
        Tensor::randn(&[b, sq, hq, d], dtype, 1.0, &mut r),
        Tensor::randn(&[b, sk, hk, d], dtype, 1.0, &mut r),
        Tensor::randn(&[b, sk, hk, d], dtype, 1.0, &mut r),
    )
}

/// A lean decode with 8 LeanTile iterations in one tile: 1024 keys, 128 per iteration on the CPU.
fn lean_case() -> (Runtime, AttentionInputs, AttentionPlan) {
    let rt = cpu(Algorithm::Lean);
    let x = qkv(1, 1, 1024, 4, 1, 64, DType::F16);
    let p = x.problem(AttentionOptions::default(), None).unwrap();
    let plan = rt.plan(Algorithm::Lean, &p).unwrap();
    let PlanDetail::Lean(d) = &plan.detail else {
        unreachable!()
    };
    assert_eq!(
        (d.tile_k, d.tile_space(&p).total_iters()),
        (128, 8),
        "the cases below assume 8 iterations"
    );
    (rt, x, plan)
}

fn lean_mut(
    plan: &AttentionPlan,
    f: impl FnOnce(&mut ferrattn_cli::lean::LeanPlan),
) -> AttentionPlan {
    let mut plan = plan.clone();
    let PlanDetail::Lean(d) = &mut plan.detail else {
        unreachable!()
    };
    f(d);
    plan
}

fn invalid(rt: &Runtime, plan: &AttentionPlan, x: &AttentionInputs) -> String {
    match rt.run(plan, x) {
        Err(FerrattnError::Core(e @ CoreError::InvalidPlan(_))) => e.to_string(),
        other => panic!("a forged plan must be refused as InvalidPlan: {other:?}"),
    }
}

#[test]
fn forged_lean_schedules_are_refused() {
    let (rt, x, plan) = lean_case();
    assert!(rt.run(&plan, &x).is_ok());
    // tile_k = 0 divided by zero in the replay
    let e = invalid(&rt, &lean_mut(&plan, |d| d.tile_k = 0), &x);
    assert!(e.contains("tile_k = 0"), "{e}");
    // stream-K bounds that are empty, descending, past the end, short of it, or not from 0
    for (bounds, says) in [
        (vec![], "from 0 to total_iters = 8"),
        (
            vec![0, 9, 8],
            "cta_bounds[1] = 9 is not below cta_bounds[2] = 8",
        ),
        (vec![0, 4, 12], "from 0 to total_iters = 8"),
        (vec![0, 6], "from 0 to total_iters = 8"),
        (vec![1, 8], "from 0 to total_iters = 8"),
        (
            vec![0, 4, 4, 8],
            "cta_bounds[1] = 4 is not below cta_bounds[2] = 4",
        ),
    ] {
        let forged = lean_mut(&plan, |d| {
            d.num_ctas = bounds.len().saturating_sub(1);
            d.schedule = Schedule::StreamK {
                total_iters: 8,
                cta_bounds: bounds.clone(),
            };
        });
        let e = invalid(&rt, &forged, &x);
        assert!(e.contains(says), "{bounds:?}: {e}");
    }
    // tile_m = 0 returned all zeros with exit 0
    let e = invalid(&rt, &lean_mut(&plan, |d| d.tile_m = 0), &x);
    assert!(e.contains("tile_m = 0"), "{e}");
    // num_ctas that disagrees with the schedule
    let e = invalid(&rt, &lean_mut(&plan, |d| d.num_ctas += 1), &x);
    assert!(e.contains("num_ctas"), "{e}");
    // a fixed split with chunk_iters 0 grew a list until memory ran out
    let forged = lean_mut(&plan, |d| {
        d.schedule = Schedule::FixedSplit {
            total_iters: 8,
            splits: 2,
            chunk_iters: 0,
            num_ctas: 2,
        }
    });
    let e = invalid(&rt, &forged, &x);
    assert!(e.contains("not the fixed split"), "{e}");
}

#[test]
fn forged_exact_and_cross_algorithm_plans_are_refused() {
    let rt = cpu(Algorithm::Exact);
    let x = qkv(1, 3, 70, 4, 2, 64, DType::F16);
    let p = x.problem(AttentionOptions::default(), None).unwrap();
    let plan = rt.plan(Algorithm::Exact, &p).unwrap();
    // block_k = 2^62 overflowed a capacity
    for bk in [0, 1 << 62] {
        let forged = AttentionPlan {
            block_k: bk,
            ..plan.clone()
        };
        let e = invalid(&rt, &forged, &x);
        assert!(e.contains(&format!("block_k = {bk}")), "{e}");
    }
    // an exact detail under the turbo algorithm ran exact silently
    let forged = AttentionPlan {
        algorithm: Algorithm::Turbo,
        ..plan.clone()
    };
    let e = invalid(&rt, &forged, &x);
    assert!(
        e.contains("the algorithm is turbo but the detail is a exact plan"),
        "{e}"
    );
    // block sizes that are not the detail's
    let turbo = rt.plan(Algorithm::Turbo, &p).unwrap();
    let forged = AttentionPlan {
        block_q: 7,
        ..turbo
    };
    let e = invalid(&rt, &forged, &x);
    assert!(e.contains("block_q x block_k = 7 x 64"), "{e}");
    // a plan for another backend
    let forged = AttentionPlan {
        backend: BackendKind::Cuda,
        ..plan
    };
    assert!(rt.run(&forged, &x).is_err());
}

#[test]
fn replayed_plan_equals_a_fresh_run() {
    let (rt, x, plan) = lean_case();
    let back = AttentionPlan::from_json(&plan.to_json()).unwrap();
    assert_eq!(rt.run(&back, &x).unwrap().o, rt.run(&plan, &x).unwrap().o);
}

#[test]
fn sizes_whose_products_overflow_are_refused_before_allocating() {
    for (dims, what) in [
        (
            [1, 1, usize::MAX, 1, 1, 1],
            "k of shape [1, 18446744073709551615, 1, 1]",
        ),
        ([1, 1 << 32, 1 << 32, 1 << 32, 1 << 32, 1], "q of shape"),
    ] {
        let [b, sq, sk, hq, hk, d] = dims;
        let p = AttentionProblem::uniform(b, sq, sk, hq, hk, d, d, DType::F16);
        match ferrattn_cli::plan(Algorithm::Exact, &p, &ferrattn_cli::DeviceCaps::cpu(2)) {
            Err(CoreError::TooLarge {
                what: w,
                bytes_needed,
                ..
            }) => {
                assert!(w.starts_with(what), "{w}");
                assert!(bytes_needed > isize::MAX as u128, "{bytes_needed}");
            }
            other => panic!("{dims:?}: {other:?}"),
        }
    }
    // more than the host has: the error names the bytes needed and what is available
    let e = ferrattn_cli::problem::check_host_memory("a test buffer", 1 << 60).unwrap_err();
    assert!(
        e.to_string().contains("needs 1152921504606846976 bytes"),
        "{e}"
    );
}

#[test]
fn tensor_data_shorter_than_its_shape_is_a_typed_error() {
    for which in ["q", "k", "v"] {
        let mut x = qkv(1, 2, 10, 4, 2, 64, DType::F16);
        let t = match which {
            "q" => &mut x.q,
            "k" => &mut x.k,
            _ => x.v.as_mut().unwrap(),
        };
        t.data.truncate(t.data.len() - 1);
        match x.problem(AttentionOptions::default(), None) {
            Err(CoreError::Shape {
                tensor, expected, ..
            }) => {
                assert_eq!(tensor, which);
                assert!(expected.contains("but its data holds"), "{expected}");
            }
            other => panic!("{which}: {other:?}"),
        }
    }
}

/// Inputs with every element of q, k equal to `qk` (random signs) and unit-Gaussian v.
fn big(qk: f32, dtype: DType) -> AttentionInputs {
    let mut x = qkv(1, 2, 40, 4, 2, 64, dtype);
    for t in [&mut x.q, &mut x.k] {
        for (i, v) in t.data.iter_mut().enumerate() {
            // a fixed pseudo-random sign per element, so keys get different logits
            *v = if (i.wrapping_mul(2_654_435_761) >> 7) & 1 == 0 {
                qk
            } else {
                -qk
            };
        }
    }
    x
}

#[test]
fn logits_past_f32_are_refused_with_the_range_not_zeroed() {
    // |q|, |k| ~ 4e20 gave O = 0 and LSE = -inf with exit 0 through exact, lean and turboquant
    let x = big(4e20, DType::F32);
    let p = x.problem(AttentionOptions::default(), None).unwrap();
    for algo in [Algorithm::Exact, Algorithm::Lean, Algorithm::TurboQuant] {
        let rt = cpu(algo);
        let plan = rt.plan(algo, &p).unwrap();
        let e = rt.run(&plan, &x).unwrap_err().to_string();
        assert!(
            e.contains("logits may reach") && e.contains("up to 1e37"),
            "{algo}: {e}"
        );
    }
}

#[test]
fn scale_before_multiply_computes_huge_inputs_with_a_small_scale() {
    // q . k overflows f32 (64 x 1e40) but the logits scale * q . k are O(10): the f32 emulations
    // scale q first and match the f64 reference
    let x = big(1e20, DType::F32);
    let opts = AttentionOptions {
        causal: false,
        softmax_scale: Some(1e-40),
    };
    let p = x.problem(opts, None).unwrap();
    let (o_ref, lse_ref) = ferrattn_cli::golden::exact_attention_f64(&p, &x);
    assert!(lse_ref.iter().all(|l| l.is_finite()));
    for algo in [Algorithm::Exact, Algorithm::Lean] {
        let rt = cpu(algo);
        let out = rt.run(&rt.plan(algo, &p).unwrap(), &x).unwrap();
        let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        Comparison::new(&o_ref, &f64s(&out.o.data))
            .check("O", &Tolerance::output(DType::F32))
            .unwrap_or_else(|e| panic!("{algo}: {e}"));
        Comparison::new(&lse_ref, &f64s(&out.lse.data))
            .check("LSE", &Tolerance::lse())
            .unwrap_or_else(|e| panic!("{algo}: {e}"));
    }
    // TurboQuant stores row norms as f16: the same inputs are refused with that range
    let rt = cpu(Algorithm::TurboQuant);
    let e = rt
        .run(&rt.plan(Algorithm::TurboQuant, &p).unwrap(), &x)
        .unwrap_err()
        .to_string();
    assert!(e.contains("row norms up to 65504"), "{e}");
}

#[test]
fn input_files_with_unknown_or_mistyped_tensors_are_errors() {
    let dir = std::env::temp_dir().join(format!("ferrattn-regress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x = qkv(2, 1, 10, 4, 2, 64, DType::F16);
    let v = x.v.as_ref().unwrap();
    let base = [("q", &x.q), ("k", &x.k), ("v", v)];
    let write = |name: &str, extra_f: &[(&str, &Tensor)], ints: &[(&str, &[i64])]| {
        let path = dir.join(name);
        let all: Vec<(&str, &Tensor)> = base
            .iter()
            .copied()
            .chain(extra_f.iter().copied())
            .collect();
        ferrattn_cli::io::write_file(&path, &all, ints, Default::default()).unwrap();
        path
    };
    // the good file reads, with its lengths
    let good = write("good.safetensors", &[], &[("seqlens_k", &[10, 3])]);
    assert_eq!(
        ferrattn_cli::io::read_inputs(&good).unwrap().seqlens_k,
        Some(vec![10, 3])
    );
    // misspelt seqlen_k was dropped and the full lengths used
    let misspelt = write("misspelt.safetensors", &[], &[("seqlen_k", &[10, 3])]);
    let e = ferrattn_cli::io::read_inputs(&misspelt)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown tensor \"seqlen_k\""), "{e}");
    // seqlens_k stored as f32 was dropped too
    let lens = Tensor::from_vec(&[2], DType::F32, vec![10.0, 3.0]).unwrap();
    let float = write("float.safetensors", &[("seqlens_k", &lens)], &[]);
    let e = ferrattn_cli::io::read_inputs(&float)
        .unwrap_err()
        .to_string();
    assert!(e.contains("seqlens_k is f32; it must be I32 or I64"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn written_files_are_the_same_bytes_every_time() {
    // metadata used to be written in HashMap order, which changes from run to run
    let dir = std::env::temp_dir().join(format!("ferrattn-bytes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x = qkv(1, 1, 5, 2, 1, 8, DType::BF16);
    let meta = || {
        (0..12)
            .map(|i| (format!("key{i}"), format!("value {i}")))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let bytes: Vec<Vec<u8>> = (0..4)
        .map(|i| {
            let path = dir.join(format!("{i}.safetensors"));
            ferrattn_cli::io::write_file(
                &path,
                &[("q", &x.q), ("k", &x.k)],
                &[("n", &[5])],
                meta(),
            )
            .unwrap();
            std::fs::read(&path).unwrap()
        })
        .collect();
    assert!(bytes.windows(2).all(|w| w[0] == w[1]));
    let back = ferrattn_cli::io::read_file(&dir.join("0.safetensors")).unwrap();
    assert_eq!(back.tensors["q"], x.q);
    assert_eq!(back.ints["n"], vec![5]);
    assert_eq!(back.metadata, meta());
    std::fs::remove_dir_all(&dir).ok();
}
