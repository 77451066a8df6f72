//! CPU backend throughput per algorithm at small scale (the CPU is the reference, not the
//! fast path; this tracks regressions of the emulations).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrattn::{
    Algorithm, AttentionInputs, AttentionOptions, BackendChoice, BackendKind, DType, Runtime,
    Tensor,
};
use rand::SeedableRng;

fn inputs(algo: Algorithm, sk: usize) -> AttentionInputs {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    if algo == Algorithm::Amla {
        let q = Tensor::randn(&[1, 2, 16, 576], DType::BF16, 1.0, &mut rng);
        let kv = Tensor::randn(&[1, sk, 1, 576], DType::BF16, 1.0, &mut rng);
        return AttentionInputs::mla(q, kv);
    }
    let q = Tensor::randn(&[1, 1, 8, 128], DType::F16, 1.0, &mut rng);
    let k = Tensor::randn(&[1, sk, 2, 128], DType::F16, 1.0, &mut rng);
    let v = Tensor::randn(&[1, sk, 2, 128], DType::F16, 1.0, &mut rng);
    AttentionInputs::new(q, k, v)
}

fn bench(c: &mut Criterion) {
    let rt = Runtime::select(BackendChoice::Exactly(BackendKind::Cpu), Algorithm::Exact)
        .unwrap()
        .runtime;
    let mut g = c.benchmark_group("cpu_decode");
    g.sample_size(10);
    for algo in Algorithm::ALL {
        let sk = 4096;
        let x = inputs(algo, sk);
        let dv = (algo == Algorithm::Amla).then_some(512);
        let p = x.problem(AttentionOptions::default(), dv).unwrap();
        let plan = match rt.plan(algo, &p) {
            Ok(plan) => plan,
            Err(e) => {
                eprintln!("skipping {algo}: {e}");
                continue;
            }
        };
        g.throughput(Throughput::Elements(sk as u64));
        g.bench_with_input(BenchmarkId::new(algo.name(), sk), &x, |b, x| {
            b.iter(|| rt.run(&plan, x).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
