//! Shared helpers of the integration tests.
#![allow(dead_code)] // each test binary uses a subset

use ferrattn_core::amla::preload::PreloadPipeline;
use ferrattn_core::amla::tiling::HierarchicalTiling;
use ferrattn_core::amla::AmlaPlan;
use ferrattn_core::{
    Algorithm, AttentionInputs, AttentionOptions, AttentionPlan, AttentionProblem, BackendKind,
    DType, PlanDetail, Tensor,
};
use rand::SeedableRng;

/// An AMLA plan for `p` as the core's planner makes it (built here so these tests do not depend
/// on `amla::plan`, which is written elsewhere).
pub fn amla_plan(p: &AttentionProblem, block_k: usize, compensation: bool) -> AttentionPlan {
    let detail = AmlaPlan {
        block_k,
        block_q: (p.heads_q * p.max_seqlen_q).min(256),
        compensation,
        preload: PreloadPipeline::amla_default(),
        tiling: HierarchicalTiling::ascend910(),
    };
    AttentionPlan {
        algorithm: Algorithm::Amla,
        backend: BackendKind::Ascend,
        device: "Ascend 910 reference".into(),
        problem: p.clone(),
        block_q: detail.block_q,
        block_k,
        detail: PlanDetail::Amla(detail),
    }
}

#[allow(clippy::too_many_arguments)] // the B, Sq, Sk, H, Dk, Dv tuple of the problem plus data knobs
/// Random MLA inputs `q [B, Sq, H, dk]`, `kv [B, Sk, 1, dk]` with N(0, sigma^2) BF16 values.
pub fn mla_inputs(
    b: usize,
    sq: usize,
    sk: usize,
    h: usize,
    dk: usize,
    dv: usize,
    sigma: f32,
    seqlens_k: Option<Vec<i64>>,
    causal: bool,
    seed: u64,
) -> (AttentionProblem, AttentionInputs) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let q = Tensor::randn(&[b, sq, h, dk], DType::BF16, sigma, &mut rng);
    let kv = Tensor::randn(&[b, sk, 1, dk], DType::BF16, sigma, &mut rng);
    let mut x = AttentionInputs::mla(q, kv);
    x.seqlens_k = seqlens_k;
    let p = x
        .problem(
            AttentionOptions {
                causal,
                softmax_scale: None,
            },
            Some(dv),
        )
        .expect("valid MLA inputs");
    (p, x)
}
