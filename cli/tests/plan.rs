//! Plans are values: they round-trip through JSON, and `run --plan` replays them.

use ferrattn_cli::{plan, Algorithm, AttentionPlan, AttentionProblem, DType, DeviceCaps, KvLayout};

fn problems() -> Vec<(Algorithm, AttentionProblem, DeviceCaps)> {
    let mut ragged = AttentionProblem::uniform(3, 1, 4097, 32, 8, 128, 128, DType::F16);
    ragged.seqlens_k = vec![4097, 37, 1];
    let mut mla = AttentionProblem::uniform(4, 2, 1024, 128, 1, 576, 512, DType::BF16);
    mla.kv_layout = KvLayout::MlaLatent;
    let prefill = AttentionProblem {
        causal: true,
        ..AttentionProblem::uniform(2, 577, 577, 8, 2, 64, 64, DType::F16)
    };
    vec![
        (Algorithm::Exact, prefill.clone(), DeviceCaps::cpu(2)),
        (
            Algorithm::Lean,
            ragged.clone(),
            DeviceCaps::hopper_reference(),
        ),
        (Algorithm::Amla, mla, DeviceCaps::ascend910_reference()),
        (Algorithm::Turbo, prefill, DeviceCaps::cpu(2)),
        (Algorithm::TurboQuant, ragged, DeviceCaps::cpu(2)),
    ]
}

#[test]
fn every_algorithm_plans_and_round_trips_through_json() {
    for (algo, p, caps) in problems() {
        let pl = plan(algo, &p, &caps).unwrap_or_else(|e| panic!("{algo}: {e}"));
        assert_eq!(pl.algorithm, algo);
        assert_eq!(pl.problem, p);
        assert!(
            pl.block_q >= 1 && pl.block_k >= 1,
            "{algo}: blocks {} x {}",
            pl.block_q,
            pl.block_k
        );
        let back = AttentionPlan::from_json(&pl.to_json()).unwrap();
        assert_eq!(back, pl, "{algo} plan changed through JSON");
    }
}

#[test]
fn cli_plan_then_run_with_that_plan() {
    let bin = env!("CARGO_BIN_EXE_ferrattn");
    let dir = std::env::temp_dir().join(format!("ferrattn-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = [
        "--algo",
        "lean",
        "--backend",
        "cpu",
        "--random",
        "2,1,300,8,2,64",
        "--seqlens-k",
        "300,41",
        "--seed",
        "3",
    ];
    let out = std::process::Command::new(bin)
        .arg("plan")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = String::from_utf8(out.stdout).unwrap();
    let pl = AttentionPlan::from_json(&json).unwrap();
    assert_eq!(pl.problem.seqlens_k, vec![300, 41]);
    let plan_path = dir.join("plan.json");
    std::fs::write(&plan_path, &json).unwrap();
    let o_path = dir.join("o.safetensors");
    let out = std::process::Command::new(bin)
        .arg("run")
        .args(args)
        .arg("--plan")
        .arg(&plan_path)
        .arg("--output")
        .arg(&o_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // the replay is judged against lean's stated tolerance, and equals a run planned afresh
    assert!(
        stdout.contains("check      ok: within tolerance"),
        "{stdout}"
    );
    let f = ferrattn_cli::io::read_file(&o_path).unwrap();
    assert_eq!(f.tensors["o"].shape, vec![2, 1, 8, 64]);
    assert_eq!(f.tensors["lse"].shape, vec![2, 8, 1]);
    let fresh_path = dir.join("fresh.safetensors");
    let out = std::process::Command::new(bin)
        .arg("run")
        .args(args)
        .arg("--output")
        .arg(&fresh_path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let fresh = ferrattn_cli::io::read_file(&fresh_path).unwrap();
    assert_eq!(fresh.tensors["o"], f.tensors["o"]);
    assert_eq!(fresh.tensors["lse"], f.tensors["lse"]);
    // a plan for another shape is refused
    let out = std::process::Command::new(bin)
        .args([
            "run",
            "--algo",
            "lean",
            "--random",
            "2,1,299,8,2,64",
            "--plan",
        ])
        .arg(&plan_path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("plan mismatch: plan is for B=2 Sq=1 Sk=300")
            && stderr.contains("but the inputs are B=2 Sq=1 Sk=299"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
