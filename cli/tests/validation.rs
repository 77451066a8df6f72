//! Bad input gives a clear error naming the values, never a panic.

use ferrattn_cli::{
    Algorithm, AttentionInputs, AttentionOptions, BackendChoice, BackendKind, CoreError, DType,
    FerrattnError, Runtime, Tensor,
};
use rand::SeedableRng;

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(7)
}

fn qkv(b: usize, sq: usize, sk: usize, hq: usize, hk: usize, d: usize) -> AttentionInputs {
    let mut r = rng();
    AttentionInputs::new(
        Tensor::randn(&[b, sq, hq, d], DType::F16, 1.0, &mut r),
        Tensor::randn(&[b, sk, hk, d], DType::F16, 1.0, &mut r),
        Tensor::randn(&[b, sk, hk, d], DType::F16, 1.0, &mut r),
    )
}

fn err(x: &AttentionInputs) -> CoreError {
    x.problem(AttentionOptions::default(), None)
        .expect_err("input must be rejected")
}

#[test]
fn shape_mismatch_names_both_shapes() {
    let mut x = qkv(2, 1, 10, 4, 2, 64);
    x.k = Tensor::zeros(&[2, 10, 2, 32], DType::F16);
    let e = err(&x);
    assert!(matches!(e, CoreError::Shape { tensor: "k", .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("[2, 10, 2, 32]") && msg.contains("64"),
        "{msg}"
    );
}

#[test]
fn rank_and_v_shape_are_checked() {
    let mut x = qkv(1, 1, 10, 4, 2, 64);
    x.q = Tensor::zeros(&[1, 4, 64], DType::F16);
    assert!(matches!(err(&x), CoreError::Shape { tensor: "q", .. }));
    let mut x = qkv(1, 1, 10, 4, 2, 64);
    x.v = Some(Tensor::zeros(&[1, 9, 2, 64], DType::F16));
    let msg = err(&x).to_string();
    assert!(msg.contains("v has shape [1, 9, 2, 64]"), "{msg}");
}

#[test]
fn dtype_mismatch_names_dtypes() {
    let mut x = qkv(1, 1, 10, 4, 2, 64);
    x.v.as_mut().unwrap().dtype = DType::BF16;
    let msg = err(&x).to_string();
    assert_eq!(
        msg,
        "v is bf16 but q is f16; all inputs must share one dtype"
    );
}

#[test]
fn head_ratio_must_divide() {
    let x = qkv(1, 1, 10, 32, 7, 64);
    assert_eq!(
        err(&x).to_string(),
        "k has 7 heads but q has 32; q heads must be a positive multiple of k heads"
    );
}

#[test]
fn zero_dimensions_are_rejected() {
    let x = qkv(0, 1, 10, 4, 2, 64);
    assert!(err(&x).to_string().contains("batch is 0"));
    let x = qkv(1, 1, 0, 4, 2, 64);
    assert!(err(&x).to_string().contains("max_seqlen_k is 0"));
    let x = qkv(1, 1, 10, 4, 2, 0);
    assert!(err(&x).to_string().contains("head_dim_qk is 0"));
}

#[test]
fn negative_and_too_long_seqlens_are_rejected() {
    let mut x = qkv(3, 1, 10, 4, 2, 64);
    x.seqlens_k = Some(vec![10, -1, 3]);
    assert_eq!(
        err(&x).to_string(),
        "seqlens_k[1] is -1; it must be between 0 and 10 (the tensor's padded sequence extent)"
    );
    x.seqlens_k = Some(vec![10, 11, 3]);
    assert!(err(&x).to_string().starts_with("seqlens_k[1] is 11"));
    x.seqlens_k = Some(vec![10, 3]);
    assert!(err(&x).to_string().contains("seqlens_k has shape [2]"));
}

#[test]
fn non_finite_inputs_are_rejected_with_their_index() {
    let mut x = qkv(1, 1, 10, 4, 2, 64);
    x.k.data[77] = f32::NAN;
    let e = err(&x);
    assert!(
        matches!(
            e,
            CoreError::NonFinite {
                tensor: "k",
                index: 77,
                ..
            }
        ),
        "{e:?}"
    );
    let mut x = qkv(1, 1, 10, 4, 2, 64);
    x.q.data[3] = f32::INFINITY;
    assert!(err(&x)
        .to_string()
        .contains("q holds a non-finite value (inf) at flat index 3"));
}

#[test]
fn bad_softmax_scale_is_rejected() {
    let x = qkv(1, 1, 10, 4, 2, 64);
    let e = x
        .problem(
            AttentionOptions {
                causal: false,
                softmax_scale: Some(f32::NAN),
            },
            None,
        )
        .unwrap_err();
    assert!(e.to_string().contains("softmax_scale"), "{e}");
}

#[test]
fn mla_needs_one_latent_head() {
    let mut r = rng();
    let x = AttentionInputs::mla(
        Tensor::randn(&[1, 1, 8, 64], DType::BF16, 1.0, &mut r),
        Tensor::randn(&[1, 10, 2, 64], DType::BF16, 1.0, &mut r),
    );
    let e = x
        .problem(AttentionOptions::default(), Some(48))
        .unwrap_err();
    assert!(e.to_string().contains("MLA with 2 latent KV heads"), "{e}");
}

#[test]
fn plan_for_another_problem_is_refused() {
    let rt = Runtime::select(BackendChoice::Exactly(BackendKind::Cpu), Algorithm::Exact)
        .unwrap()
        .runtime;
    let a = qkv(1, 1, 10, 4, 2, 64);
    let b = qkv(1, 1, 12, 4, 2, 64);
    let plan = rt
        .plan(
            Algorithm::Exact,
            &a.problem(AttentionOptions::default(), None).unwrap(),
        )
        .unwrap();
    let e = rt.run(&plan, &b).unwrap_err();
    assert!(matches!(e, FerrattnError::PlanMismatch(_)), "{e:?}");
    assert!(
        e.to_string().contains("Sk=10") && e.to_string().contains("Sk=12"),
        "{e}"
    );
    assert!(rt.run(&plan, &a).is_ok());
}

#[test]
fn corrupt_plan_json_is_an_error() {
    let e = ferrattn_cli::AttentionPlan::from_json("{\"algorithm\": \"exact\"").unwrap_err();
    assert!(e.to_string().starts_with("plan JSON:"), "{e}");
}

#[test]
fn cli_reports_bad_arguments_without_panicking() {
    let bin = env!("CARGO_BIN_EXE_ferrattn");
    let cases: &[&[&str]] = &[
        &["run", "--algo", "exact", "--random", "1,2,3"],
        &["run", "--algo", "exact", "--random", "1,1,10,4,3,64"],
        &["run", "--algo", "nope", "--random", "1,1,10,4,2,64"],
        &[
            "run",
            "--algo",
            "exact",
            "--random",
            "1,1,10,4,2,64",
            "--seqlens-k",
            "11",
        ],
        &[
            "run",
            "--algo",
            "exact",
            "--input",
            "/nonexistent.safetensors",
        ],
    ];
    for args in cases {
        let out = std::process::Command::new(bin)
            .args(*args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
    }
}
