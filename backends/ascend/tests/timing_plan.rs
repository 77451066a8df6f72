//! The simulated timing model reads its tiling and head count from the plan (SIMULATED numbers:
//! these tests compare the model with itself, never with hardware).

mod common;

use common::{amla_plan, mla_inputs};
use ferrattn_ascend::{AscendBackend, Variant};
use ferrattn_core::PlanDetail;

#[test]
fn paper_plan_reproduces_the_paper_configuration() {
    // 128 heads, Sq 2, the section 4.2 tiling: the same run as simulate()
    let (p, _) = mla_inputs(4, 2, 2048, 128, 576, 512, 1.0, None, false, 1);
    let plan = amla_plan(&p, 512, true);
    let from_plan = AscendBackend::simulate_plan(&plan, Variant::Amla).unwrap();
    let fixed = AscendBackend::simulate(4, 2, 2048, Variant::Amla);
    assert_eq!(from_plan.duration_us, fixed.duration_us);
    assert_eq!(from_plan.heads, 128);
}

#[test]
fn a_plan_change_moves_the_simulated_time() {
    let (p, _) = mla_inputs(4, 2, 2048, 128, 576, 512, 1.0, None, false, 2);
    let plan = amla_plan(&p, 512, true);
    let base = AscendBackend::simulate_plan(&plan, Variant::Amla)
        .unwrap()
        .duration_us;
    // smaller C1 MMADs (baseK 96 -> 48): twice the MMAD issues on the same data
    let mut small_k = plan.clone();
    if let PlanDetail::Amla(a) = &mut small_k.detail {
        a.tiling.c1.base_k = 48;
    }
    let t_small_k = AscendBackend::simulate_plan(&small_k, Variant::Amla)
        .unwrap()
        .duration_us;
    assert_ne!(t_small_k, base, "baseK of the plan reaches the model");
    // half the heads: half the rows of every stage
    let (p16, _) = mla_inputs(4, 2, 2048, 16, 576, 512, 1.0, None, false, 3);
    let t16 = AscendBackend::simulate_plan(&amla_plan(&p16, 512, true), Variant::Amla).unwrap();
    assert_eq!(t16.heads, 16);
    assert!(
        t16.duration_us < base,
        "16 heads {} us vs 128 heads {base} us",
        t16.duration_us
    );
}

#[test]
fn a_plan_that_does_not_fit_is_rejected() {
    let (p, _) = mla_inputs(1, 1, 512, 16, 576, 512, 1.0, None, false, 4);
    let mut plan = amla_plan(&p, 512, true);
    if let PlanDetail::Amla(a) = &mut plan.detail {
        a.tiling.c1.base_k = 288; // 144 KB of L0A per stage, past 64 KB
    }
    let e = AscendBackend::simulate_plan(&plan, Variant::Amla).unwrap_err();
    assert!(e.to_string().contains("L0A overflows"), "{e}");
}
