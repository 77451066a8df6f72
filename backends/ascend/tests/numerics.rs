//! The simulated kernel's numerics against the f64 golden reference (AMLA Tables 3/4 level).

mod common;

use common::{amla_plan, mla_inputs};
use ferrattn_ascend::sim::numerics::{run, Arithmetic, KernelSettings};
use ferrattn_ascend::AscendBackend;
use ferrattn_core::amla::preload::{PreloadPipeline, StageSlot};
use ferrattn_core::backend::AmlaDecode;
use ferrattn_core::golden::exact_attention;
use ferrattn_core::{Comparison, DType, Tolerance};

fn check(
    case: &str,
    p: &ferrattn_core::AttentionProblem,
    x: &ferrattn_core::AttentionInputs,
    block_k: usize,
) {
    let be = AscendBackend::simulated("test");
    let out = be.run_amla(&amla_plan(p, block_k, true), x).unwrap();
    assert!(out
        .provenance
        .simulated
        .as_deref()
        .unwrap()
        .contains("no NPU ran it"));
    let gold = exact_attention(p, x);
    let co = Comparison::f32(&gold.o.data, &out.o.data);
    co.check(&format!("{case} O"), &Tolerance::output(DType::BF16))
        .unwrap();
    // the paper's Tables 3/4 report 1e-3..2e-3 relative Frobenius error at 8K context
    assert!(co.rel_fro < 4e-3, "{case}: O rel_fro {:.3e}", co.rel_fro);
    Comparison::f32(&gold.lse.data, &out.lse.data)
        .check(&format!("{case} LSE"), &Tolerance::lse())
        .unwrap();
}

#[test]
fn small_shapes_many_blocks_match_golden() {
    // block_k 16 over 37..577 keys: many INT32 rescales per row, lengths off tile boundaries
    for (i, &sk) in [1usize, 37, 65, 577].iter().enumerate() {
        let (p, x) = mla_inputs(2, 1, sk, 4, 64, 48, 1.0, None, false, 10 + i as u64);
        check(&format!("sk {sk}"), &p, &x, 16);
    }
}

#[test]
fn mtp_causal_ragged_match_golden() {
    let (p, x) = mla_inputs(3, 2, 97, 4, 64, 32, 2.0, Some(vec![97, 0, 33]), true, 7);
    check("sq 2 causal ragged", &p, &x, 16);
    // the empty sequence has O = 0 and LSE = -inf
    let out = AscendBackend::simulated("test")
        .run_amla(&amla_plan(&p, 16, true), &x)
        .unwrap();
    let lse_b1 = &out.lse.data[p.heads_q * 2..p.heads_q * 4];
    assert!(lse_b1.iter().all(|v| *v == f32::NEG_INFINITY));
}

#[test]
fn deepseek_576_512_case_matches_golden() {
    let (p, x) = mla_inputs(1, 2, 1100, 16, 576, 512, 1.0, None, false, 3);
    check("576/512", &p, &x, 512);
}

#[test]
fn large_logits_rescale_through_int32_adds() {
    // sigma 3 gives logits far above 88 (where exp(m) overflows FP32, section 3.1); only the
    // INT32 exponent arithmetic keeps O in range
    let (p, x) = mla_inputs(1, 1, 300, 2, 64, 32, 3.0, None, false, 5);
    check("large logits", &p, &x, 32);
}

#[test]
fn stage_order_does_not_change_the_numbers() {
    // the Preload Pipeline reorders stages across blocks; each row's arithmetic must not change
    let (p, x) = mla_inputs(2, 2, 200, 4, 64, 32, 1.5, Some(vec![200, 150]), true, 9);
    let s = |stage, lag| StageSlot { stage, lag };
    let serial =
        PreloadPipeline::from_orders(2, vec![s(1, 0), s(2, 0)], vec![s(1, 0), s(2, 0)]).unwrap();
    let a = run(
        &p,
        &x,
        &KernelSettings {
            block_k: 16,
            compensation: true,
            preload: PreloadPipeline::amla_default(),
            arithmetic: Arithmetic::default(),
        },
    );
    let b = run(
        &p,
        &x,
        &KernelSettings {
            block_k: 16,
            compensation: true,
            preload: serial,
            arithmetic: Arithmetic::default(),
        },
    );
    assert_eq!(
        a.o.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.o.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(a.lse, b.lse);
}

#[test]
fn compensation_reduces_error_on_average() {
    // Appendix A: the compensation reduces the error of the uncompensated INT32 rescale, over many rows
    let (p, x) = mla_inputs(4, 1, 2048, 8, 64, 64, 1.0, None, false, 21);
    let gold = exact_attention(&p, &x);
    let err = |comp: bool| {
        let s = run(
            &p,
            &x,
            &KernelSettings {
                block_k: 64,
                compensation: comp,
                preload: PreloadPipeline::amla_default(),
                arithmetic: Arithmetic::default(),
            },
        );
        let o: Vec<f32> = s.o.to_vec();
        Comparison::f32(&gold.o.data, &o).rel_fro
    };
    let (on, off) = (err(true), err(false));
    // measured on these inputs (seed 21): 1.695e-3 compensated against 1.895e-3 without (0.894x);
    // the test demands a real reduction, not "no worse than 2% more" as it once did
    assert!(
        on < off * 0.95,
        "compensated {on:.3e} vs uncompensated {off:.3e}"
    );
}

#[test]
fn overflowing_tiling_is_rejected_by_the_backend() {
    let (p, x) = mla_inputs(1, 1, 8, 2, 64, 32, 1.0, None, false, 1);
    let mut plan = amla_plan(&p, 16, true);
    if let ferrattn_core::PlanDetail::Amla(a) = &mut plan.detail {
        a.tiling.c1.base_k = 288; // 2 x 128 x 288 x 2 B = 144 KB > 64 KB L0A
    }
    let e = AscendBackend::simulated("test")
        .run_amla(&plan, &x)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("L0A overflows: needs 147456 B") && e.contains("holds 65536 B"),
        "{e}"
    );
}
