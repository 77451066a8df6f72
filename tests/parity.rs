//! Cross-backend parity: the simulated Ascend backend executes the same AMLA arithmetic as the
//! core's emulation (the CPU backend), and a plan that does not fit the target is refused.

use ferrattn::{
    Algorithm, AttentionInputs, AttentionOptions, AttentionPlan, BackendChoice, BackendKind, DType,
    FerrattnError, PlanDetail, Runtime, Tensor,
};
use rand::SeedableRng;

fn runtime(kind: BackendKind) -> Runtime {
    Runtime::select(BackendChoice::Exactly(kind), Algorithm::Amla)
        .unwrap()
        .runtime
}

fn mla_inputs(b: usize, sq: usize, sk: usize, hq: usize, seed: u64) -> AttentionInputs {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let q = Tensor::randn(&[b, sq, hq, 576], DType::BF16, 1.0, &mut rng);
    let kv = Tensor::randn(&[b, sk, 1, 576], DType::BF16, 1.0, &mut rng);
    let mut x = AttentionInputs::mla(q, kv);
    x.seqlens_k = Some((0..b).map(|i| (sk - i * sk / (b + 1)) as i64).collect());
    x
}

#[test]
fn simulated_ascend_equals_the_core_amla_emulation() {
    let ascend = runtime(BackendKind::Ascend);
    let cpu = runtime(BackendKind::Cpu);
    for (b, sq, sk, hq, seed) in [(2, 1, 600, 8, 1), (3, 2, 1100, 16, 2), (1, 2, 37, 4, 3)] {
        let x = mla_inputs(b, sq, sk, hq, seed);
        let p = x.problem(AttentionOptions::default(), Some(512)).unwrap();
        let plan_a = ascend.plan(Algorithm::Amla, &p).unwrap();
        let plan_c = cpu.plan(Algorithm::Amla, &p).unwrap();
        let a = ascend.run(&plan_a, &x).unwrap();
        let c = cpu.run(&plan_c, &x).unwrap();
        assert!(
            a.provenance.simulated.is_some(),
            "a simulated result must say so: {:?}",
            a.provenance
        );
        let max_o =
            a.o.data
                .iter()
                .zip(&c.o.data)
                .map(|(u, v)| (u - v).abs())
                .fold(0.0f32, f32::max);
        let max_lse = a
            .lse
            .data
            .iter()
            .zip(&c.lse.data)
            .map(|(u, v)| (u - v).abs())
            .fold(0.0f32, f32::max);
        // Both execute Algorithm 2 with the same BF16 casts, n_i rule, INT32 rescale and
        // compensation: outputs are equal to the bit.
        assert_eq!(
            max_o, 0.0,
            "O differs (B={b} Sq={sq} Sk={sk} Hq={hq}); LSE max diff {max_lse}"
        );
        assert!(max_lse <= 1e-6, "LSE differs by {max_lse}");
    }
}

#[test]
fn a_plan_whose_tiles_overflow_the_target_is_refused() {
    let ascend = runtime(BackendKind::Ascend);
    let x = mla_inputs(1, 1, 64, 4, 9);
    let p = x.problem(AttentionOptions::default(), Some(512)).unwrap();
    let mut plan: AttentionPlan = ascend.plan(Algorithm::Amla, &p).unwrap();
    let PlanDetail::Amla(d) = &mut plan.detail else {
        panic!("not an AMLA plan")
    };
    d.tiling.l1_buffer_bytes *= 4; // seven buffers of 288 KB cannot fit a 512 KB L1
    let e = ascend.run(&plan, &x).unwrap_err();
    assert!(matches!(e, FerrattnError::Ascend(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("L1"), "the message names the buffer: {msg}");
}
