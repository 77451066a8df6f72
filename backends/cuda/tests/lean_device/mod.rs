//! GPU tests of the Lean device path (`LeanStepPlan` + `LeanKernels`: caller-owned memory and
//! streams, tables uploaded once per step, launch-only runs): equal to the prepared path and to
//! the golden reference, paged K/V equal to contiguous K/V bit for bit (page sizes 16 and 64,
//! shuffled pages), a Llama-shape decode step of 32 layers captured in one CUDA graph and
//! replayed 100 times equal to eager runs bit for bit, and the co-residency refusal.
//!
//! Without a usable GPU every test prints `SKIPPED <test>: <reason>` and passes (see gpu_lean.rs).
//! `FERRATTN_GPU_TEST_SCALE=small` keeps the small cases (compute-sanitizer runs
//! `lean_device::gpu_device_sanitizer_small`). A module of the gpu_lean binary rather than a
//! binary of its own: each test binary embeds every kernel image (about 10 MB), and the device
//! tool carries 64 MiB.

use ferrattn_core::{
    golden, lean, plan, Algorithm, AttentionProblem, Comparison, DType, Device, DeviceCaps,
    PlanDetail, Tolerance,
};
use ferrattn_cuda::{
    CudaBackend, DeviceBuffer, DeviceInputs, Graph, KvStorage, LeanInstance, LeanKernels,
    LeanStepPlan, LeanTensors, Options, PagedRead, Paging,
};
use rand::{seq::SliceRandom, SeedableRng};
use std::sync::Arc;

use crate::common::{backend, small_only};

fn problem(
    lens: &[usize],
    sq: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dt: DType,
) -> AttentionProblem {
    let max = lens.iter().copied().max().unwrap().max(1);
    let mut p = AttentionProblem::uniform(lens.len(), sq, max, hq, hk, d, d, dt);
    p.seqlens_k = lens.to_vec();
    p
}

fn lean_plan(b: &CudaBackend, p: &AttentionProblem, fixed: bool) -> lean::LeanPlan {
    let caps = b.caps().unwrap();
    if fixed {
        lean::plan_fixed_split(p, &caps, None).unwrap()
    } else {
        lean::plan(p, &caps).unwrap()
    }
}

fn kernels(b: &CudaBackend, p: &AttentionProblem, lp: &lean::LeanPlan) -> Arc<LeanKernels> {
    b.lean_kernels(LeanInstance::new(p.dtype, p.head_dim_qk, lp.tile_m).unwrap())
        .unwrap()
}

/// Outputs of one layer: O (16-bit) and LSE, poisoned with NaN.
struct Out {
    o: DeviceBuffer,
    lse: DeviceBuffer,
}

impl Out {
    fn new(b: &CudaBackend, p: &AttentionProblem) -> Out {
        let gpu = b.gpu().unwrap();
        let mut o =
            DeviceBuffer::alloc(gpu, p.batch * p.max_seqlen_q * p.heads_q * p.head_dim_v * 2)
                .unwrap();
        let mut lse = DeviceBuffer::alloc(gpu, p.batch * p.heads_q * p.max_seqlen_q * 4).unwrap();
        o.fill_u16(0xffff).unwrap();
        lse.fill_u32(0xffff_ffff).unwrap();
        Out { o, lse }
    }
    fn bits(&self) -> (Vec<u16>, Vec<u32>) {
        (self.o.to_vec().unwrap(), self.lse.to_vec().unwrap())
    }
}

/// A page pool holding the contiguous K and V of `x`, written by the append kernel through a
/// shuffled page table (so that logical and physical page order differ).
struct Pool {
    k: DeviceBuffer,
    v: DeviceBuffer,
    paging: Paging,
}

fn paged_copy(
    b: &CudaBackend,
    x: &DeviceInputs,
    p: &AttentionProblem,
    lp: &lean::LeanPlan,
    page: usize,
    seed: u64,
) -> Pool {
    let gpu = b.gpu().unwrap();
    let max_pages = p.max_seqlen_k.div_ceil(page);
    // two spare pages nobody uses: entries past a sequence's end point at them or at -1
    let used: usize = p.seqlens_k.iter().map(|l| l.div_ceil(page)).sum();
    let num_pages = used + 2;
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    ids.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let mut next = ids.into_iter();
    let mut table = vec![-1i32; p.batch * max_pages];
    for (bi, &len) in p.seqlens_k.iter().enumerate() {
        for slot in 0..len.div_ceil(page) {
            table[bi * max_pages + slot] = next.next().unwrap();
        }
    }
    let paging = Paging::new(page, num_pages, max_pages, table, &p.seqlens_k).unwrap();
    let row = p.heads_kv * p.head_dim_qk * 2;
    let mut k = DeviceBuffer::alloc(gpu, num_pages * page * row).unwrap();
    let mut v = DeviceBuffer::alloc(gpu, num_pages * page * row).unwrap();
    k.fill_u16(0xffff).unwrap(); // NaN where no token is written
    v.fill_u16(0xffff).unwrap();
    // "append" the whole sequences: new_tokens = max_seqlen_k, so token i goes to position i
    let fill = LeanStepPlan::new(p, lp, KvStorage::Paged(paging.clone()), p.max_seqlen_k).unwrap();
    let kern = kernels(b, p, lp);
    let ws = DeviceBuffer::alloc(gpu, fill.workspace_bytes()).unwrap();
    // SAFETY: buffers allocated above for these shapes on this GPU; the backend's stream.
    unsafe {
        kern.upload(&fill, ws.ptr(), gpu.raw_stream()).unwrap();
        kern.append(
            &fill,
            (x.k().ptr(), x.v().ptr()),
            (k.ptr(), v.ptr()),
            ws.ptr(),
            gpu.raw_stream(),
        )
        .unwrap();
    }
    gpu.synchronize().unwrap();
    Pool { k, v, paging }
}

/// Runs `step` once on the backend's stream with its own workspace; returns (O bits, LSE bits).
fn run_step(b: &CudaBackend, step: &LeanStepPlan, q: u64, k: u64, v: u64) -> (Vec<u16>, Vec<u32>) {
    let gpu = b.gpu().unwrap();
    let out = Out::new(b, step.problem());
    let ws = DeviceBuffer::alloc(gpu, step.workspace_bytes()).unwrap();
    let kern = kernels(b, step.problem(), step.lean_plan());
    let t = LeanTensors {
        q,
        k,
        v,
        o: out.o.ptr(),
        lse: out.lse.ptr(),
    };
    // SAFETY: every buffer was allocated for the step's problem on this GPU.
    unsafe {
        kern.upload(step, ws.ptr(), gpu.raw_stream()).unwrap();
        kern.run(step, &t, ws.ptr(), gpu.raw_stream()).unwrap();
    }
    out.bits()
}

fn first_diff<'a, T: PartialEq>(a: &'a [T], b: &'a [T]) -> Option<(usize, &'a T, &'a T)> {
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .map(|(i, (x, y))| (i, x, y))
}

fn assert_bits_eq(what: &str, a: &(Vec<u16>, Vec<u32>), b: &(Vec<u16>, Vec<u32>)) {
    assert_eq!(a.0.len(), b.0.len());
    if let Some((i, x, y)) = first_diff(&a.0, &b.0) {
        panic!("{what}: O differs first at {i}: {x:#06x} vs {y:#06x}");
    }
    if let Some((i, x, y)) = first_diff(&a.1, &b.1) {
        panic!("{what}: LSE differs first at {i}: {x:#010x} vs {y:#010x}");
    }
    assert!(
        a.0.iter().all(|&h| h != 0xffff),
        "{what}: an O element was never written"
    );
}

struct Case {
    lens: Vec<usize>,
    sq: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dt: DType,
}

fn cases() -> Vec<Case> {
    let c = |lens: &[usize], sq, hq, hk, d, dt| Case {
        lens: lens.to_vec(),
        sq,
        hq,
        hk,
        d,
        dt,
    };
    let mut v = vec![
        c(&[1, 37, 63, 65], 1, 8, 2, 128, DType::F16),
        c(&[577, 4097, 0, 130], 1, 32, 8, 128, DType::BF16),
        c(&[300, 31], 2, 4, 4, 64, DType::F16),
    ];
    if !small_only() {
        v.extend([
            c(&[4097, 1000, 17], 1, 16, 1, 256, DType::BF16),
            c(&[32767], 1, 32, 8, 128, DType::F16),
            c(&[2000; 16], 4, 8, 2, 128, DType::F16),
        ]);
    }
    v
}

/// The device path on caller memory equals the prepared path (same kernels, its own workspace
/// and stream) bit for bit and the golden reference within the dtype's tolerance; paged K/V
/// (pages of 16 and 64, shuffled) equals contiguous K/V bit for bit; stream-K and fixed split.
fn device_cases(test: &str) {
    let Some(b) = backend(test, Options::default()) else {
        return;
    };
    for (i, c) in cases().iter().enumerate() {
        let p = problem(&c.lens, c.sq, c.hq, c.hk, c.d, c.dt);
        let x = b.random_inputs(&p, 11 + i as u32, 2.0).unwrap();
        let hx = x.download().unwrap();
        let gold = golden::exact_attention(&p, &hx);
        // stream-K, the fixed split, and one chunk per tile (the kernels' `tile_per_cta` path,
        // whose first page words come from the page table, not from the CTA records)
        for fixed in [None, Some(None), Some(Some(1))] {
            let lp = match fixed {
                None => lean_plan(&b, &p, false),
                Some(splits) => lean::plan_fixed_split(&p, &b.caps().unwrap(), splits).unwrap(),
            };
            let what = format!(
                "case {i} lens {:?} sq {} {}:{} d{} {:?} fixed={fixed:?}",
                c.lens, c.sq, c.hq, c.hk, c.d, c.dt
            );
            let step = LeanStepPlan::new(&p, &lp, KvStorage::Contiguous, 0).unwrap();
            let dev = run_step(&b, &step, x.q().ptr(), x.k().ptr(), x.v().ptr());
            // the prepared path
            let mut ap = plan(Algorithm::Lean, &p, &b.caps().unwrap()).unwrap();
            ap.detail = PlanDetail::Lean(lp.clone());
            let prep = b.prepare(&ap).unwrap();
            let mut out = b.alloc_outputs(&p).unwrap();
            b.launch(&prep, &x, &mut out).unwrap();
            let prepared = (
                out.o().to_vec::<u16>().unwrap(),
                out.lse().to_vec::<u32>().unwrap(),
            );
            assert_bits_eq(&format!("device vs prepared, {what}"), &dev, &prepared);
            let got = b.download(&out, &p).unwrap();
            Comparison::f32(&gold.o.data, &got.o.data)
                .check(&format!("O vs golden {what}"), &Tolerance::output(p.dtype))
                .unwrap();
            Comparison::f32(&gold.lse.data, &got.lse.data)
                .check(&format!("LSE vs golden {what}"), &Tolerance::lse())
                .unwrap();
            for page in [16, 64] {
                let pool = paged_copy(&b, &x, &p, &lp, page, 5 + i as u64);
                let step =
                    LeanStepPlan::new(&p, &lp, KvStorage::Paged(pool.paging.clone()), 0).unwrap();
                // the default instance, then every way of reading the page table forced
                let kern = kernels(&b, &p, &lp);
                for mode in PagedRead::ALL {
                    kern.set_paged_read(mode);
                    let paged = run_step(&b, &step, x.q().ptr(), pool.k.ptr(), pool.v.ptr());
                    assert_bits_eq(
                        &format!("paged {page} (page table read: {mode:?}) vs contiguous, {what}"),
                        &paged,
                        &dev,
                    );
                }
                kern.set_paged_read(PagedRead::default());
            }
        }
    }
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_device_path_and_paged_kv_match() {
    device_cases("gpu_device_path_and_paged_kv_match");
}

/// The small cases alone, for compute-sanitizer (memcheck, racecheck) over the paged decode and
/// append kernels and the cooperative stream-K launch.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_device_sanitizer_small() {
    if !small_only() {
        eprintln!("gpu_device_sanitizer_small: runs the small cases only under FERRATTN_GPU_TEST_SCALE=small; the full set ran above");
        return;
    }
    device_cases("gpu_device_sanitizer_small");
}

/// A Llama-3-8B decode step (32 query heads, 8 KV heads, head dim 128, f16), 32 layers, each
/// appending its new token to its own paged cache (pages of 16) and attending: captured in one
/// CUDA graph and replayed 100 times, O and LSE of every layer equal an eager run bit for bit.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_llama_step_in_one_graph_equals_eager() {
    let test = "gpu_llama_step_in_one_graph_equals_eager";
    let Some(b) = backend(test, Options::default()) else {
        return;
    };
    let gpu = b.gpu().unwrap().clone();
    let layers = if small_only() { 2 } else { 32 };
    let lens = [1000usize, 37, 4097, 577];
    let p = problem(&lens, 1, 32, 8, 128, DType::F16);
    let lp = lean_plan(&b, &p, false);
    let page = 16;
    let max_pages = p.max_seqlen_k.div_ceil(page);
    let num_pages: usize = lens.iter().map(|l| l.div_ceil(page)).sum();
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    ids.shuffle(&mut rand::rngs::StdRng::seed_from_u64(3));
    let mut table = vec![-1i32; p.batch * max_pages];
    let mut next = ids.into_iter();
    for (bi, &len) in lens.iter().enumerate() {
        for s in 0..len.div_ceil(page) {
            table[bi * max_pages + s] = next.next().unwrap();
        }
    }
    let paging = Paging::new(page, num_pages, max_pages, table, &lens).unwrap();
    let step = LeanStepPlan::new(&p, &lp, KvStorage::Paged(paging), 1).unwrap();
    let kern = kernels(&b, &p, &lp);
    let ws = DeviceBuffer::alloc(&gpu, step.workspace_bytes()).unwrap();
    struct Layer {
        x: DeviceInputs, // q and the layer's new token (k, v of a 1-token problem)
        kv_new: DeviceInputs,
        k: DeviceBuffer,
        v: DeviceBuffer,
        out: Out,
    }
    let pool_bytes = num_pages * page * p.heads_kv * p.head_dim_qk * 2;
    let one = problem(&[1; 4], 1, 32, 8, 128, DType::F16);
    let fill = |pool: &mut DeviceBuffer, seed: u32| {
        // pool contents: device-random via a problem whose K is exactly the pool's size
        let mut fp = problem(&[num_pages * page], 1, 8, 8, 128, DType::F16);
        fp.max_seqlen_k = num_pages * page;
        let r = b.random_inputs(&fp, seed, 1.0).unwrap();
        pool.copy_from(r.k()).unwrap();
    };
    let mut net = Vec::new();
    for l in 0..layers {
        let mut k = DeviceBuffer::alloc(&gpu, pool_bytes).unwrap();
        let mut v = DeviceBuffer::alloc(&gpu, pool_bytes).unwrap();
        fill(&mut k, 100 + 2 * l as u32);
        fill(&mut v, 101 + 2 * l as u32);
        net.push(Layer {
            x: b.random_inputs(&p, 1000 + l as u32, 2.0).unwrap(),
            kv_new: b.random_inputs(&one, 2000 + l as u32, 2.0).unwrap(),
            k,
            v,
            out: Out::new(&b, &p),
        });
    }
    let s = gpu.raw_stream();
    let enqueue_step = |net: &[Layer]| -> ferrattn_cuda::Result<()> {
        for layer in net {
            let t = LeanTensors {
                q: layer.x.q().ptr(),
                k: layer.k.ptr(),
                v: layer.v.ptr(),
                o: layer.out.o.ptr(),
                lse: layer.out.lse.ptr(),
            };
            // SAFETY: buffers allocated above for these shapes on this GPU; tables uploaded.
            unsafe {
                kern.append(
                    &step,
                    (layer.kv_new.k().ptr(), layer.kv_new.v().ptr()),
                    (layer.k.ptr(), layer.v.ptr()),
                    ws.ptr(),
                    s,
                )?;
                kern.run(&step, &t, ws.ptr(), s)?;
            }
        }
        Ok(())
    };
    // SAFETY: workspace of the step's size on this GPU.
    unsafe { kern.upload(&step, ws.ptr(), s).unwrap() };
    enqueue_step(&net).unwrap();
    let eager: Vec<_> = net.iter().map(|l| l.out.bits()).collect();
    // a second eager step gives the same bits (the append rewrites the same token)
    enqueue_step(&net).unwrap();
    for (i, l) in net.iter().enumerate() {
        assert_bits_eq(&format!("eager rerun, layer {i}"), &l.out.bits(), &eager[i]);
    }
    for l in net.iter_mut() {
        l.out.o.fill_u16(0xffff).unwrap();
        l.out.lse.fill_u32(0xffff_ffff).unwrap();
    }
    let graph = Graph::capture(&gpu, || enqueue_step(&net)).expect("capture of the decode step");
    let replays = 100;
    let t0 = std::time::Instant::now();
    for _ in 0..replays {
        graph.launch().unwrap();
    }
    gpu.synchronize().unwrap();
    let per_step = t0.elapsed().as_secs_f64() * 1e6 / replays as f64;
    for (i, l) in net.iter().enumerate() {
        assert_bits_eq(
            &format!("graph replay vs eager, layer {i}"),
            &l.out.bits(),
            &eager[i],
        );
    }
    eprintln!(
        "{test}: {layers} layers (append + stream-K decode, {} CTAs, paged 16) per graph, {replays} replays equal eager; {per_step:.1} us per step (wall clock)",
        step.num_ctas()
    );
}

/// A stream-K grid larger than what can be co-resident is refused before any launch, with
/// the numbers (the cooperative launch would refuse it too).
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_stream_k_grid_beyond_residency_is_refused() {
    let Some(b) = backend(
        "gpu_stream_k_grid_beyond_residency_is_refused",
        Options::default(),
    ) else {
        return;
    };
    let p = problem(&[65536], 1, 32, 8, 128, DType::F16);
    let caps: DeviceCaps = b.caps().unwrap();
    let lp = lean::plan_with_ctas(&p, &caps, caps.compute_units * 64).unwrap();
    let step = LeanStepPlan::new(&p, &lp, KvStorage::Contiguous, 0).unwrap();
    let kern = kernels(&b, &p, &lp);
    let err = kern.check(&step).unwrap_err().to_string();
    assert!(err.contains("co-resident"), "{err}");
}
