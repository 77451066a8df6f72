//! Host-side planner cost: planning must be negligible next to a decode step.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use ferrattn::{plan, Algorithm, AttentionProblem, DType, DeviceCaps, KvLayout};

fn problems() -> Vec<(&'static str, Algorithm, AttentionProblem, DeviceCaps)> {
    let mut llama = AttentionProblem::uniform(64, 1, 32768, 32, 8, 128, 128, DType::F16);
    llama.seqlens_k = (0..64).map(|i| 4096 + i * 400).collect();
    let mut mla = AttentionProblem::uniform(96, 2, 16384, 128, 1, 576, 512, DType::BF16);
    mla.kv_layout = KvLayout::MlaLatent;
    let prefill = AttentionProblem::uniform(4, 4096, 4096, 32, 8, 128, 128, DType::F16);
    vec![
        (
            "exact_prefill_4x4k",
            Algorithm::Exact,
            prefill.clone(),
            DeviceCaps::hopper_reference(),
        ),
        (
            "lean_llama3_b64_ragged",
            Algorithm::Lean,
            llama,
            DeviceCaps::hopper_reference(),
        ),
        (
            "amla_b96_sq2_16k",
            Algorithm::Amla,
            mla,
            DeviceCaps::ascend910_reference(),
        ),
        (
            "turbo_prefill_4x4k",
            Algorithm::Turbo,
            prefill.clone(),
            DeviceCaps::hopper_reference(),
        ),
        (
            "turboquant_prefill_4x4k",
            Algorithm::TurboQuant,
            prefill,
            DeviceCaps::hopper_reference(),
        ),
    ]
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan");
    for (name, algo, p, caps) in problems() {
        if let Err(e) = plan(algo, &p, &caps) {
            eprintln!("skipping {name}: {e}");
            continue;
        }
        g.bench_function(name, |b| {
            b.iter(|| plan(algo, black_box(&p), black_box(&caps)).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
