//! The device path through the facade on a GPU: `LeanDecoder::begin_step`, `DecodeStep::run` and
//! `DecodeStep::append` on caller-owned buffers and the caller's stream. Without a usable GPU the
//! test prints `SKIPPED <test>: <reason>` and passes (the GPU runner fails on that line).

use ferrattn::device_api::{
    DecodePlan, DecodeShape, DecodeViews, KvCache, LeanSchedule, TensorView,
};
use ferrattn::DType;

/// The facade on a GPU (skips without one): a step planned, begun and run through
/// [`LeanDecoder`] on caller-owned buffers and the caller's stream gives the prepared path's bits,
/// contiguous and paged (the pool filled by `append` from the contiguous K/V).
#[test]
fn gpu_facade_step_matches_the_prepared_path() {
    use ferrattn::device_api::{contiguous_strides, LeanDecoder, Stream, Workspace};
    use ferrattn::{lean, plan, Algorithm, AttentionProblem, Device, PlanDetail};
    use ferrattn_cuda::{CudaBackend, DeviceBuffer};
    let gpu = match LeanDecoder::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("SKIPPED gpu_facade_step_matches_the_prepared_path: {e}");
            return;
        }
    };
    let b = CudaBackend::new(0);
    let g = b.gpu().unwrap().clone();
    let caps = gpu.caps().unwrap();
    let lens = [1000usize, 37, 4096, 577];
    let shape = DecodeShape {
        batch: 4,
        query_len: 1,
        heads_q: 32,
        heads_kv: 8,
        head_dim: 128,
        dtype: DType::BF16,
        causal: false,
        softmax_scale: None,
    };
    let mut p = AttentionProblem::uniform(4, 1, 4096, 32, 8, 128, 128, DType::BF16);
    p.seqlens_k = lens.to_vec();
    let x = b.random_inputs(&p, 9, 2.0).unwrap();
    // the prepared path
    let mut ap = plan(Algorithm::Lean, &p, &b.caps().unwrap()).unwrap();
    ap.detail = PlanDetail::Lean(lean::plan(&p, &caps).unwrap());
    let prep = b.prepare(&ap).unwrap();
    let mut out = b.alloc_outputs(&p).unwrap();
    b.launch(&prep, &x, &mut out).unwrap();
    let want: Vec<u16> = out.o().to_vec().unwrap();
    let want_lse: Vec<u32> = out.lse().to_vec().unwrap();
    // SAFETY: the backend's own stream, alive as long as `b`.
    let stream = unsafe { Stream::from_raw(g.raw_stream() as *mut std::ffi::c_void) };
    let view = |buf: &DeviceBuffer, dtype: DType, shape: &[usize]| {
        // SAFETY: `buf` holds at least these bytes of device 0 and outlives the work.
        unsafe {
            TensorView::cuda(
                buf.ptr(),
                buf.bytes(),
                0,
                dtype,
                shape,
                &contiguous_strides(shape),
            )
        }
        .unwrap()
    };
    let run = |plan: &DecodePlan, k: &TensorView<'_>, v: &TensorView<'_>, fill: bool| {
        let ws_buf = DeviceBuffer::alloc(&g, plan.workspace_bytes()).unwrap();
        // SAFETY: a fresh allocation of the plan's size on device 0.
        let mut ws = unsafe { Workspace::cuda(ws_buf.ptr(), ws_buf.bytes(), 0) };
        let step = gpu.begin_step(plan, &mut ws, stream).unwrap();
        if fill {
            // the whole prompt as the step's new tokens: [batch, new_tokens = 4096, heads, dim]
            let kx = view(x.k(), DType::BF16, &[4, 4096, 8, 128]);
            let vx = view(x.v(), DType::BF16, &[4, 4096, 8, 128]);
            step.append(&kx, &vx, k, v, stream).unwrap();
        }
        let o = DeviceBuffer::alloc(&g, want.len() * 2).unwrap();
        let lse = DeviceBuffer::alloc(&g, want_lse.len() * 4).unwrap();
        let views = DecodeViews {
            q: &view(x.q(), DType::BF16, &[4, 1, 32, 128]),
            k,
            v,
            o: &view(&o, DType::BF16, &[4, 1, 32, 128]),
            lse: &view(&lse, DType::F32, &[4, 32, 1]),
        };
        step.run(&views, stream).unwrap();
        (o.to_vec::<u16>().unwrap(), lse.to_vec::<u32>().unwrap())
    };
    let contiguous = DecodePlan::new(
        &shape,
        &caps,
        &lens,
        KvCache::Contiguous { max_seqlen_k: 4096 },
        0,
        LeanSchedule::StreamK,
    )
    .unwrap();
    let k = view(x.k(), DType::BF16, &[4, 4096, 8, 128]);
    let v = view(x.v(), DType::BF16, &[4, 4096, 8, 128]);
    assert!(run(&contiguous, &k, &v, false) == (want.clone(), want_lse.clone()));
    for page in [16usize, 64] {
        let max_pages = 4096 / page;
        let num_pages = 4 * max_pages;
        // sequence b's logical page i on pool page (i * 4 + 3 - b): interleaved, reversed
        let table: Vec<i32> = (0..4)
            .flat_map(|b| (0..max_pages).map(move |i| (i * 4 + 3 - b) as i32))
            .collect();
        let paged = DecodePlan::new(
            &shape,
            &caps,
            &lens,
            KvCache::Paged {
                page_size: page,
                num_pages,
                max_pages,
                page_table: &table,
            },
            4096,
            LeanSchedule::StreamK,
        )
        .unwrap();
        let kp = DeviceBuffer::alloc(&g, num_pages * page * 8 * 128 * 2).unwrap();
        let vp = DeviceBuffer::alloc(&g, num_pages * page * 8 * 128 * 2).unwrap();
        let k = view(&kp, DType::BF16, &[num_pages, page, 8, 128]);
        let v = view(&vp, DType::BF16, &[num_pages, page, 8, 128]);
        let got = run(&paged, &k, &v, true);
        assert!(
            got == (want.clone(), want_lse.clone()),
            "paged {page} differs"
        );
    }
}

/// The TurboAttention cache through the facade on a GPU (skips without one): a ragged prefill,
/// then decode steps that cross a block boundary (a buffer flushed into a block), each through
/// [`TurboDevice`] on caller-owned buffers and the caller's stream, equal the host path
/// (`turbo_prefill`, `turbo_decode_step`) bit for bit: O, LSE and the whole compressed cache.
/// Then one step (append + decode of several layers' caches) captured in a CUDA graph and
/// replayed 100 times equals its eager run bit for bit, and leaves the caches as one run did.
#[test]
fn gpu_turbo_cache_matches_the_host_path_and_replays_in_a_graph() {
    use ferrattn::device_api::{
        Stream, TurboCacheSpec, TurboDecodePlan, TurboDecodeViews, TurboDevice, TurboPrefillPlan,
        TurboPrefillViews, TurboShape, Workspace,
    };
    use ferrattn::turbo::{KvBits, TurboConfig};
    use ferrattn::{AttentionInputs, AttentionProblem, Tensor};
    use ferrattn_cuda::{DeviceBuffer, Graph};
    use half::bf16;
    use rand::SeedableRng;
    let dev = match TurboDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED gpu_turbo_cache_matches_the_host_path_and_replays_in_a_graph: {e}");
            return;
        }
    };
    let host = dev.backend();
    let g = host.gpu().unwrap().clone();
    // SAFETY: the backend's own stream, alive as long as `dev`.
    let stream = unsafe { Stream::from_raw(g.raw_stream() as *mut std::ffi::c_void) };
    let (b, hq, hk, d, max) = (3usize, 16usize, 4usize, 128usize, 130usize);
    let lens = [100usize, 62, 130];
    let cfg = TurboConfig {
        kv_bits: KvBits::Mixed {
            two_bit_fraction: 0.5,
        },
        ..TurboConfig::default()
    };
    let shape = TurboShape {
        batch: b,
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
        dtype: DType::BF16,
        softmax_scale: None,
    };
    let scale = 1.0 / (d as f32).sqrt();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut randn = |s: &[usize]| Tensor::randn(s, DType::BF16, 1.0, &mut rng);
    let bits16 = |t: &Tensor| -> Vec<u16> {
        t.data
            .iter()
            .map(|&x| bf16::from_f32(x).to_bits())
            .collect()
    };
    let upload = |t: &Tensor| DeviceBuffer::from_slice(&g, &bits16(t)).unwrap();
    let view = |buf: &DeviceBuffer, dtype: DType, s: &[usize]| {
        // SAFETY: `buf` holds at least these bytes of device 0 and outlives the work.
        unsafe {
            TensorView::cuda(
                buf.ptr(),
                buf.bytes(),
                0,
                dtype,
                s,
                &ferrattn::device_api::contiguous_strides(s),
            )
        }
        .unwrap()
    };
    let f32_bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
    let o_bits = |buf: &DeviceBuffer| -> Vec<u32> {
        buf.to_vec::<u16>()
            .unwrap()
            .iter()
            .map(|&x| bf16::from_bits(x).to_f32().to_bits())
            .collect()
    };

    // ---- prefill: the host path, then the device path on the same inputs
    let (q, k, v) = (
        randn(&[b, max, hq, d]),
        randn(&[b, max, hk, d]),
        randn(&[b, max, hk, d]),
    );
    let mut p = AttentionProblem::uniform(b, max, max, hq, hk, d, d, DType::BF16);
    p.seqlens_q = lens.to_vec();
    p.seqlens_k = lens.to_vec();
    p.causal = true;
    let x = AttentionInputs::new(q.clone(), k.clone(), v.clone());
    let steps = 4;
    let (want, mut ref_cache) = host.turbo_prefill(&cfg, &p, &x, steps + 2).unwrap();
    let spec = TurboCacheSpec {
        batch: b,
        heads_kv: hk,
        head_dim: d,
        bits: ref_cache.bits.clone(), // the host path's head priorities (section 3.2)
        capacity_tokens: max + steps + 2,
    };
    let layers = 3;
    let mut caches: Vec<_> = (0..layers).map(|_| dev.cache(&spec).unwrap()).collect();
    assert_eq!(caches[0].allocated_bytes(), spec.allocated_bytes());
    let plan = TurboPrefillPlan::new(&cfg, &shape, &lens, max, true).unwrap();
    let ws_buf = DeviceBuffer::alloc(&g, plan.workspace_bytes().max(1 << 20)).unwrap();
    // SAFETY: a fresh allocation of device 0, used only by these steps.
    let mut ws = unsafe { Workspace::cuda(ws_buf.ptr(), ws_buf.bytes(), 0) };
    let (qb, kb, vb) = (upload(&q), upload(&k), upload(&v));
    let ob = DeviceBuffer::alloc(&g, b * max * hq * d * 2).unwrap();
    let lb = DeviceBuffer::alloc(&g, b * hq * max * 4).unwrap();
    let (qv, kv_, vv) = (
        view(&qb, DType::BF16, &[b, max, hq, d]),
        view(&kb, DType::BF16, &[b, max, hk, d]),
        view(&vb, DType::BF16, &[b, max, hk, d]),
    );
    let (ov, lv) = (
        view(&ob, DType::BF16, &[b, max, hq, d]),
        view(&lb, DType::F32, &[b, hq, max]),
    );
    {
        let step = dev.begin_prefill(&plan, &mut ws, stream).unwrap();
        let xv = TurboPrefillViews {
            q: &qv,
            k: &kv_,
            v: &vv,
            o: &ov,
            lse: &lv,
        };
        for c in caches.iter_mut() {
            step.run(&xv, c, stream).unwrap();
        }
    }
    assert_eq!(o_bits(&ob), f32_bits(&want.o.data), "prefill O");
    assert_eq!(
        lb.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        f32_bits(&want.lse.data),
        "prefill LSE"
    );
    let want_cache = ref_cache.download().unwrap();
    for c in &caches {
        assert!(c.download().unwrap() == want_cache, "prefill cache");
        assert_eq!(c.lens(), &lens);
    }
    let mem = caches[0].memory();
    assert_eq!(mem.tokens, lens.iter().sum::<usize>());
    assert!(mem.compression_ratio > 3.0, "{mem:?}");

    // ---- decode steps: append + decode, sequence 1 crosses 64 tokens (a flush) on step 2
    let (mut qd, od, ld) = (
        DeviceBuffer::alloc(&g, b * hq * d * 2).unwrap(),
        DeviceBuffer::alloc(&g, b * hq * d * 2).unwrap(),
        DeviceBuffer::alloc(&g, b * hq * 4).unwrap(),
    );
    let (mut kn, mut vn) = (
        DeviceBuffer::alloc(&g, b * hk * d * 2).unwrap(),
        DeviceBuffer::alloc(&g, b * hk * d * 2).unwrap(),
    );
    let (qdv, odv, ldv) = (
        view(&qd, DType::BF16, &[b, 1, hq, d]),
        view(&od, DType::BF16, &[b, 1, hq, d]),
        view(&ld, DType::F32, &[b, hq, 1]),
    );
    let (knv, vnv) = (
        view(&kn, DType::BF16, &[b, 1, hk, d]),
        view(&vn, DType::BF16, &[b, 1, hk, d]),
    );
    for s in 0..steps {
        let (qs, ks, vs) = (
            randn(&[b, 1, hq, d]),
            randn(&[b, 1, hk, d]),
            randn(&[b, 1, hk, d]),
        );
        let before = caches[0].lens().to_vec();
        let after: Vec<usize> = before.iter().map(|l| l + 1).collect();
        let want = host
            .turbo_decode_step(&cfg, &mut ref_cache, &qs, &ks, &vs, scale, None)
            .unwrap();
        let schedule = dev.decode_schedule(&shape, &after).unwrap();
        let plan = TurboDecodePlan::new(&cfg, &shape, &before, true, schedule).unwrap();
        // the step's inputs into the fixed buffers the views point at
        for (buf, t) in [(&mut qd, &qs), (&mut kn, &ks), (&mut vn, &vs)] {
            buf.copy_from(&upload(t)).unwrap();
        }
        let step = dev.begin_decode(&plan, &mut ws, stream).unwrap();
        for c in caches.iter_mut() {
            step.append(&knv, &vnv, c, stream).unwrap();
            let xv = TurboDecodeViews {
                q: &qdv,
                o: &odv,
                lse: &ldv,
            };
            step.decode(&xv, c, stream).unwrap();
        }
        assert_eq!(o_bits(&od), f32_bits(&want.o.data), "step {s} O");
        assert_eq!(
            ld.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            f32_bits(&want.lse.data),
            "step {s} LSE"
        );
        let want_cache = ref_cache.download().unwrap();
        for c in &caches {
            assert!(c.download().unwrap() == want_cache, "step {s} cache");
        }
    }

    // ---- one more step, eager, then captured and replayed 100 times
    let before = caches[0].lens().to_vec();
    let after: Vec<usize> = before.iter().map(|l| l + 1).collect();
    let plan = TurboDecodePlan::new(
        &cfg,
        &shape,
        &before,
        true,
        dev.decode_schedule(&shape, &after).unwrap(),
    )
    .unwrap();
    let mut outs: Vec<_> = (0..layers)
        .map(|_| {
            (
                DeviceBuffer::alloc(&g, b * hq * d * 2).unwrap(),
                DeviceBuffer::alloc(&g, b * hq * 4).unwrap(),
            )
        })
        .collect();
    let out_views: Vec<_> = outs
        .iter()
        .map(|(o, l)| {
            (
                view(o, DType::BF16, &[b, 1, hq, d]),
                view(l, DType::F32, &[b, hq, 1]),
            )
        })
        .collect();
    let step = dev.begin_decode(&plan, &mut ws, stream).unwrap();
    let enqueue = |caches: &mut Vec<ferrattn::device_api::TurboCache>| -> ferrattn::Result<()> {
        for (c, (o, l)) in caches.iter_mut().zip(&out_views) {
            step.append(&knv, &vnv, c, stream)?;
            step.decode(&TurboDecodeViews { q: &qdv, o, lse: l }, c, stream)?;
        }
        Ok(())
    };
    enqueue(&mut caches).unwrap();
    let eager: Vec<_> = outs
        .iter()
        .map(|(o, l)| (o_bits(o), l.to_vec::<u32>().unwrap()))
        .collect();
    let eager_cache: Vec<_> = caches.iter().map(|c| c.download().unwrap()).collect();
    let graph = Graph::capture(&g, || {
        enqueue(&mut caches).map_err(|e| ferrattn_cuda::CudaError::Plan(e.to_string()))
    })
    .expect("capture of the decode step");
    // poisoned outputs: every element a replay does not write shows
    for (o, l) in outs.iter_mut() {
        o.fill_u16(0xffff).unwrap();
        l.fill_u32(0xffff_ffff).unwrap();
    }
    for _ in 0..100 {
        graph.launch().unwrap();
    }
    g.synchronize().unwrap();
    for (i, (o, l)) in outs.iter().enumerate() {
        assert_eq!(o_bits(o), eager[i].0, "layer {i} O after 100 replays");
        assert_eq!(
            l.to_vec::<u32>().unwrap(),
            eager[i].1,
            "layer {i} LSE after 100 replays"
        );
    }
    for (c, want) in caches.iter().zip(&eager_cache) {
        assert!(c.download().unwrap() == *want, "cache after 100 replays");
    }
}

/// The device merge of partial states through the facade (skips without a GPU): three ranks'
/// partials (one rank empty on some rows: LSE `-inf`), folded in a given order on the caller's
/// stream, equal the core's CPU merge of the same partials within one rounding of the dtype (O)
/// and the LSE tolerance; bad views are typed errors before any launch.
/// The fast prefill (`Options::fast_turbo_prefill`: `turbo_prefill_wgf_*` after
/// `turbo_quant_q_*`, the Q tiles in the step's workspace) through [`TurboDevice`] equals the
/// host path of the same backend bit for bit: O, LSE and the compressed cache (skips without a
/// GPU; on a GPU other than sm_90 both paths run the mma.sync kernel).
#[test]
fn gpu_turbo_fast_prefill_device_path_matches_the_host_path() {
    use ferrattn::device_api::{
        Stream, TurboCacheSpec, TurboDevice, TurboPrefillPlan, TurboPrefillViews, TurboShape,
        Workspace,
    };
    use ferrattn::turbo::TurboConfig;
    use ferrattn::{AttentionInputs, AttentionProblem, Tensor};
    use ferrattn_cuda::DeviceBuffer;
    use half::bf16;
    use rand::SeedableRng;
    let options = ferrattn_cuda::Options {
        fast_turbo_prefill: true,
        ..ferrattn_cuda::Options::default()
    };
    let dev = match TurboDevice::with_options(0, options) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED gpu_turbo_fast_prefill_device_path_matches_the_host_path: {e}");
            return;
        }
    };
    let host = dev.backend();
    let g = host.gpu().unwrap().clone();
    // SAFETY: the backend's own stream, alive as long as `dev`.
    let stream = unsafe { Stream::from_raw(g.raw_stream() as *mut std::ffi::c_void) };
    let (b, hq, hk, d, max) = (3usize, 16usize, 4usize, 128usize, 200usize);
    let lens = [200usize, 62, 129];
    let cfg = TurboConfig::default();
    let shape = TurboShape {
        batch: b,
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
        dtype: DType::BF16,
        softmax_scale: None,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let mut randn = |s: &[usize]| Tensor::randn(s, DType::BF16, 1.0, &mut rng);
    let bits16 = |t: &Tensor| -> Vec<u16> {
        t.data
            .iter()
            .map(|&x| bf16::from_f32(x).to_bits())
            .collect()
    };
    let upload = |t: &Tensor| DeviceBuffer::from_slice(&g, &bits16(t)).unwrap();
    let view = |buf: &DeviceBuffer, dtype: DType, s: &[usize]| {
        // SAFETY: `buf` holds at least these bytes of device 0 and outlives the work.
        unsafe {
            TensorView::cuda(
                buf.ptr(),
                buf.bytes(),
                0,
                dtype,
                s,
                &ferrattn::device_api::contiguous_strides(s),
            )
        }
        .unwrap()
    };
    let (q, k, v) = (
        randn(&[b, max, hq, d]),
        randn(&[b, max, hk, d]),
        randn(&[b, max, hk, d]),
    );
    let mut p = AttentionProblem::uniform(b, max, max, hq, hk, d, d, DType::BF16);
    p.seqlens_q = lens.to_vec();
    p.seqlens_k = lens.to_vec();
    p.causal = true;
    let x = AttentionInputs::new(q.clone(), k.clone(), v.clone());
    let (want, ref_cache) = host.turbo_prefill(&cfg, &p, &x, 0).unwrap();
    let spec = TurboCacheSpec {
        batch: b,
        heads_kv: hk,
        head_dim: d,
        bits: ref_cache.bits.clone(),
        capacity_tokens: max,
    };
    let mut cache = dev.cache(&spec).unwrap();
    let plan = TurboPrefillPlan::new(&cfg, &shape, &lens, max, true).unwrap();
    let ws_buf = DeviceBuffer::alloc(&g, plan.workspace_bytes().max(1 << 20)).unwrap();
    // SAFETY: a fresh allocation of device 0, used only by this step.
    let mut ws = unsafe { Workspace::cuda(ws_buf.ptr(), ws_buf.bytes(), 0) };
    let (qb, kb, vb) = (upload(&q), upload(&k), upload(&v));
    let ob = DeviceBuffer::alloc(&g, b * max * hq * d * 2).unwrap();
    let lb = DeviceBuffer::alloc(&g, b * hq * max * 4).unwrap();
    let (qv, kv_, vv) = (
        view(&qb, DType::BF16, &[b, max, hq, d]),
        view(&kb, DType::BF16, &[b, max, hk, d]),
        view(&vb, DType::BF16, &[b, max, hk, d]),
    );
    let (ov, lv) = (
        view(&ob, DType::BF16, &[b, max, hq, d]),
        view(&lb, DType::F32, &[b, hq, max]),
    );
    {
        let step = dev.begin_prefill(&plan, &mut ws, stream).unwrap();
        let xv = TurboPrefillViews {
            q: &qv,
            k: &kv_,
            v: &vv,
            o: &ov,
            lse: &lv,
        };
        step.run(&xv, &mut cache, stream).unwrap();
    }
    let o_bits: Vec<u32> = ob
        .to_vec::<u16>()
        .unwrap()
        .iter()
        .map(|&x| bf16::from_bits(x).to_f32().to_bits())
        .collect();
    let want_o: Vec<u32> = want.o.data.iter().map(|x| x.to_bits()).collect();
    assert_eq!(o_bits, want_o, "fast prefill O");
    let lse: Vec<u32> = lb
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let want_lse: Vec<u32> = want.lse.data.iter().map(|x| x.to_bits()).collect();
    assert_eq!(lse, want_lse, "fast prefill LSE");
    assert!(
        cache.download().unwrap() == ref_cache.download().unwrap(),
        "fast prefill cache"
    );
    eprintln!(
        "fast prefill through the device path: O, LSE and cache equal the host path's (fast kernel: {})",
        !host.turbo_prefill_is_exact()
    );
}

#[test]
fn gpu_merge_states_matches_the_core_merge() {
    use ferrattn::device_api::{contiguous_strides, LeanDecoder, MergeViews, Stream};
    use ferrattn::{Comparison, FerrattnError, Tolerance};
    use ferrattn_core::cp::{merge_partials, CpShape};
    use ferrattn_cuda::{CudaBackend, DeviceBuffer};
    use rand::{Rng, SeedableRng};
    let gpu = match LeanDecoder::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("SKIPPED gpu_merge_states_matches_the_core_merge: {e}");
            return;
        }
    };
    let b = CudaBackend::new(0);
    let g = b.gpu().unwrap().clone();
    // SAFETY: the backend's own stream, alive as long as `b`.
    let stream = unsafe { Stream::from_raw(g.raw_stream() as *mut std::ffi::c_void) };
    let (r, bt, sq, h, d) = (3usize, 2usize, 2usize, 8usize, 128usize);
    for dtype in [DType::F16, DType::BF16] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let rows = bt * sq * h;
        let part_o: Vec<Vec<f32>> = (0..r)
            .map(|_| {
                (0..rows * d)
                    .map(|_| dtype.round(rng.gen_range(-1.0f32..1.0)))
                    .collect()
            })
            .collect();
        // rank 1 saw no key on its first rows
        let part_l: Vec<Vec<f32>> = (0..r)
            .map(|k| {
                (0..rows)
                    .map(|i| {
                        if k == 1 && i < 5 {
                            f32::NEG_INFINITY
                        } else {
                            rng.gen_range(-4.0f32..12.0)
                        }
                    })
                    .collect()
            })
            .collect();
        let order = [2usize, 0, 1];
        let shape = CpShape {
            batch: bt,
            seqlen_q: sq,
            heads_q: h,
            heads_kv: 1,
            head_dim: d,
            dtype,
            causal: false,
        };
        let (want_o, want_l) = merge_partials(&shape, &part_o, &part_l, &order, (0, h)).unwrap();
        let bits = |x: &[f32]| -> Vec<u16> {
            x.iter()
                .map(|&v| match dtype {
                    DType::F16 => half::f16::from_f32(v).to_bits(),
                    _ => half::bf16::from_f32(v).to_bits(),
                })
                .collect()
        };
        let o_buf = DeviceBuffer::from_slice(&g, &bits(&part_o.concat())).unwrap();
        let l_buf = DeviceBuffer::from_slice(&g, &part_l.concat()).unwrap();
        let mut out = DeviceBuffer::alloc(&g, rows * d * 2).unwrap();
        let mut out_l = DeviceBuffer::alloc(&g, rows * 4).unwrap();
        out.fill_u16(0x7e00).unwrap(); // poison: NaN in f16 and bf16 alike
        out_l.fill_u32(0x7fc0_0000).unwrap();
        let view = |buf: &DeviceBuffer, dt: DType, shape: &[usize]| {
            // SAFETY: `buf` holds these bytes of device 0 and outlives the work.
            unsafe {
                ferrattn::device_api::TensorView::cuda(
                    buf.ptr(),
                    buf.bytes(),
                    0,
                    dt,
                    shape,
                    &contiguous_strides(shape),
                )
            }
            .unwrap()
        };
        let (ov, lv) = (
            view(&o_buf, dtype, &[r, bt, sq, h, d]),
            view(&l_buf, DType::F32, &[r, bt, h, sq]),
        );
        let (outv, outlv) = (
            view(&out, dtype, &[bt, sq, h, d]),
            view(&out_l, DType::F32, &[bt, h, sq]),
        );
        let x = MergeViews {
            o: &ov,
            lse: &lv,
            out: &outv,
            out_lse: &outlv,
        };
        gpu.merge_states(&x, Some(&order), stream).unwrap();
        let got_o: Vec<f32> = out
            .to_vec::<u16>()
            .unwrap()
            .iter()
            .map(|&v| match dtype {
                DType::F16 => half::f16::from_bits(v).to_f32(),
                _ => half::bf16::from_bits(v).to_f32(),
            })
            .collect();
        let got_l: Vec<f32> = out_l.to_vec().unwrap();
        let u = match dtype {
            DType::F16 => 2f32.powi(-11),
            _ => 2f32.powi(-8),
        };
        for (i, (&a, &t)) in got_o.iter().zip(&want_o).enumerate() {
            assert!(
                (a - t).abs() <= 2.0 * u * t.abs().max(a.abs()) + 1e-6,
                "{dtype} O[{i}] = {a}, core merge {t}"
            );
        }
        Comparison::f32(&want_l, &got_l)
            .check(&format!("{dtype} merged LSE"), &Tolerance::lse())
            .unwrap();
        // a bad order is a typed error, and nothing is written
        let err = gpu.merge_states(&x, Some(&[0, 1, 1]), stream).unwrap_err();
        assert!(matches!(err, FerrattnError::View(_)), "{err}");
    }
}

/// The TurboQuant cache through the facade (skips without a GPU): two layers' caches filled by
/// a ragged prefill step and two one-token steps of `TurboQuantDecodeStep::append` on
/// caller-owned buffers and the caller's stream, each step decoded by `run` into poisoned
/// outputs; O within 1e-3 relative Frobenius error and LSE within 2e-3 of max(1, |LSE|) of the
/// core's emulation (the tolerances of `backends/cuda/tests/gpu_turboquant.rs`), the caches'
/// codes and norms equal the core's compression bit for bit. Then one more step, eager, then
/// captured in a CUDA graph and replayed 20 times into poisoned outputs: equal to the eager run
/// bit for bit. Bad views and a cache of another configuration are typed errors.
#[test]
fn gpu_turboquant_cache_matches_the_emulation_and_replays_in_a_graph() {
    use ferrattn::device_api::{
        Stream, TurboQuantCacheSpec, TurboQuantCompression, TurboQuantDecodePlan,
        TurboQuantDecodeViews, TurboQuantDevice, TurboQuantSchedule, TurboQuantShape, ViewError,
        Workspace,
    };
    use ferrattn::turboquant::{self, TurboQuantCodec, TurboQuantConfig};
    use ferrattn::{AttentionInputs, AttentionProblem, Comparison, FerrattnError, Tensor};
    use ferrattn_cuda::{DeviceBuffer, Graph};
    use half::f16;
    use rand::SeedableRng;
    let name = "gpu_turboquant_cache_matches_the_emulation_and_replays_in_a_graph";
    let dev = match TurboQuantDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED {name}: {e}");
            return;
        }
    };
    let g = dev.backend().gpu().unwrap().clone();
    // SAFETY: the backend's own stream, alive as long as `dev`.
    let stream = unsafe { Stream::from_raw(g.raw_stream() as *mut std::ffi::c_void) };
    let (b, hq, hk, d, layers) = (3usize, 16usize, 4usize, 128usize, 2usize);
    let prompt = [37usize, 1, 130];
    let steps = 2;
    let total: Vec<usize> = prompt.iter().map(|&l| l + steps + 1).collect();
    let max_total = *total.iter().max().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut randn = |shape: &[usize]| tq::uniform_f16(&mut rng, shape);
    // every token any step appends, [b, max_total, hk, d]; the query of each step
    let (k_all, v_all) = (randn(&[b, max_total, hk, d]), randn(&[b, max_total, hk, d]));
    let queries: Vec<Tensor> = (0..=steps + 1).map(|_| randn(&[b, 1, hq, d])).collect();
    let probe = AttentionProblem::uniform(1, 1, 1, 1, 1, d, d, DType::F16);
    let mut cfg = TurboQuantConfig::paper_default(&probe);
    cfg.value_bits = 3;
    let shape = TurboQuantShape {
        batch: b,
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
        softmax_scale: None,
    };
    let spec = TurboQuantCacheSpec {
        batch: b,
        heads_kv: hk,
        head_dim: d,
        capacity_tokens: max_total,
        config: cfg.clone(),
        // the codes are compared with the emulation's bit for bit: the exact kernels
        compression: TurboQuantCompression::Exact,
    };
    let mut caches: Vec<_> = (0..layers).map(|_| dev.cache(&spec).unwrap()).collect();
    assert_eq!(caches[0].allocated_bytes(), spec.allocated_bytes());
    assert_eq!(caches[0].capacity_tokens(), spec.capacity());
    let upload = |t: &Tensor| tq::upload_f16(&g, t);
    let view = tq::cuda_view;
    let rows = tq::seq_rows;
    // the emulation's decode of query `q` over the first `lens[b]` tokens of each sequence
    let emulate = |q: &Tensor, lens: &[usize]| {
        let m = *lens.iter().max().unwrap();
        let mut p = AttentionProblem::uniform(b, 1, m, hq, hk, d, d, DType::F16);
        p.seqlens_k = lens.to_vec();
        let zero = vec![0; b];
        let mut x = AttentionInputs::new(
            q.clone(),
            rows(&k_all, &zero, lens),
            rows(&v_all, &zero, lens),
        );
        x.seqlens_k = Some(lens.iter().map(|&l| l as i64).collect());
        let codec = TurboQuantCodec::new(&cfg, d, d);
        let kv = codec.compress(&p, &x);
        (turboquant::emulate(&cfg, &p, &x).unwrap(), kv)
    };
    let outs: Vec<_> = (0..layers)
        .map(|_| {
            (
                DeviceBuffer::alloc(&g, b * hq * d * 2).unwrap(),
                DeviceBuffer::alloc(&g, b * hq * 4).unwrap(),
            )
        })
        .collect();
    let out_views: Vec<_> = outs
        .iter()
        .map(|(o, l)| {
            (
                view(o, DType::F16, &[b, 1, hq, d]),
                view(l, DType::F32, &[b, hq, 1]),
            )
        })
        .collect();
    let read = tq::read_outs;
    let mut outs = outs;

    // ---- a ragged prefill step, then one-token steps, each decoded and checked
    let mut lens = vec![0usize; b];
    for (s, query) in queries.iter().enumerate().take(steps + 1) {
        let new: Vec<usize> = if s == 0 { prompt.to_vec() } else { vec![1; b] };
        let after: Vec<usize> = lens.iter().zip(&new).map(|(l, n)| l + n).collect();
        let schedule = if s == 1 {
            TurboQuantSchedule::stream_k(5, &dev.caps().unwrap()).unwrap()
        } else {
            dev.decode_schedule(&cfg, &shape, &after).unwrap()
        };
        let plan = TurboQuantDecodePlan::new(&cfg, &shape, &lens, &new, schedule).unwrap();
        let (kn, vn) = (
            upload(&rows(&k_all, &lens, &new)),
            upload(&rows(&v_all, &lens, &new)),
        );
        let m = plan.new_rows();
        let (knv, vnv) = (
            view(&kn, DType::F16, &[b, m, hk, d]),
            view(&vn, DType::F16, &[b, m, hk, d]),
        );
        let qd = upload(query);
        let qdv = view(&qd, DType::F16, &[b, 1, hq, d]);
        for (o, l) in outs.iter_mut() {
            o.fill_u16(0x7e00).unwrap(); // NaN
            l.fill_u32(0x7fc0_0000).unwrap();
        }
        let ws_buf = DeviceBuffer::alloc(&g, plan.workspace_bytes()).unwrap();
        // SAFETY: a fresh allocation of the plan's size on device 0, used by this step only.
        let mut ws = unsafe { Workspace::cuda(ws_buf.ptr(), ws_buf.bytes(), 0) };
        let step = dev.begin_decode(&plan, &mut ws, stream).unwrap();
        for (c, (o, l)) in caches.iter_mut().zip(&out_views) {
            step.append(&knv, &vnv, c, stream).unwrap();
            step.run(&TurboQuantDecodeViews { q: &qdv, o, lse: l }, c, stream)
                .unwrap();
        }
        lens = plan.lens_after().to_vec();
        let (want, want_kv) = emulate(query, &lens);
        for (i, (o, l)) in read(&outs).into_iter().enumerate() {
            let what = format!("step {s} layer {i}");
            let o: Vec<f64> = o.iter().map(|&x| f16::from_bits(x).to_f64()).collect();
            let l: Vec<f64> = l.iter().map(|&x| f32::from_bits(x) as f64).collect();
            assert!(
                o.iter().all(|v| v.is_finite()),
                "{what}: non-finite O (poison survived?)"
            );
            assert!(l.iter().all(|v| v.is_finite()), "{what}: non-finite LSE");
            let wo: Vec<f64> = want.o.data.iter().map(|&x| x as f64).collect();
            let c = Comparison::new(&wo, &o);
            let lse_rel = want
                .lse
                .data
                .iter()
                .zip(&l)
                .map(|(&a, &b)| (a as f64 - b).abs() / (a.abs() as f64).max(1.0))
                .fold(0.0, f64::max);
            eprintln!("{what}: O rel_fro {:.2e}, LSE rel {lse_rel:.2e}", c.rel_fro);
            assert!(c.rel_fro <= 1e-3, "{what}: O rel_fro {:e}", c.rel_fro);
            assert!(lse_rel <= 2e-3, "{what}: LSE relative error {lse_rel:e}");
        }
        for c in &caches {
            assert_eq!(c.lens(), &lens[..]);
            let got = c.download().unwrap();
            assert!(
                got.k_idx == want_kv.k_idx && got.v_idx == want_kv.v_idx,
                "step {s}: codes"
            );
            assert!(got.k_signs == want_kv.k_signs, "step {s}: QJL signs");
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&got.k_norm) == bits(&want_kv.k_norm)
                    && bits(&got.r_norm) == bits(&want_kv.r_norm)
                    && bits(&got.v_norm) == bits(&want_kv.v_norm),
                "step {s}: norms"
            );
        }
        let m = caches[0].memory();
        assert_eq!(m.tokens, lens.iter().sum::<usize>());
        assert!(m.compression_ratio > 3.0, "{m:?}");
        drop(step);
    }

    // ---- typed errors before any launch
    let after: Vec<usize> = lens.iter().map(|l| l + 1).collect();
    let schedule = dev.decode_schedule(&cfg, &shape, &after).unwrap();
    let plan = TurboQuantDecodePlan::new(&cfg, &shape, &lens, &[1; 3], schedule).unwrap();
    let ws_buf = DeviceBuffer::alloc(&g, plan.workspace_bytes()).unwrap();
    // SAFETY: a fresh allocation of the plan's size on device 0, used by these steps only.
    let mut ws = unsafe { Workspace::cuda(ws_buf.ptr(), ws_buf.bytes(), 0) };
    // a workspace one alignment unit short of the plan's: typed, with both sizes
    // SAFETY: never used (refused before any GPU access).
    let mut short = unsafe { Workspace::cuda(ws_buf.ptr(), plan.workspace_bytes() - 256, 0) };
    let e = dev.begin_decode(&plan, &mut short, stream).unwrap_err();
    assert!(
        matches!(e, FerrattnError::View(ViewError::Workspace { needed, declared })
            if needed == plan.workspace_bytes() && declared == needed - 256),
        "{e}"
    );
    let step = dev.begin_decode(&plan, &mut ws, stream).unwrap();
    let qd = upload(&queries[steps + 1]);
    let qdv = view(&qd, DType::F16, &[b, 1, hq, d]);
    // decode before the step's append: the cache is one token short
    let e = step
        .run(
            &TurboQuantDecodeViews {
                q: &qdv,
                o: &out_views[0].0,
                lse: &out_views[0].1,
            },
            &caches[0],
            stream,
        )
        .unwrap_err();
    assert!(
        matches!(e, FerrattnError::View(ViewError::Length { .. })),
        "{e}"
    );
    // q in bf16
    let e = step
        .run(
            &TurboQuantDecodeViews {
                q: &view(&qd, DType::BF16, &[b, 1, hq, d]),
                o: &out_views[0].0,
                lse: &out_views[0].1,
            },
            &caches[0],
            stream,
        )
        .unwrap_err();
    assert!(
        matches!(e, FerrattnError::View(ViewError::DType { tensor: "q", .. })),
        "{e}"
    );
    // a cache of another configuration (MSE-only keys)
    let mut other_cfg = cfg.clone();
    other_cfg.key_qjl = false;
    let mut other = dev
        .cache(&TurboQuantCacheSpec {
            config: other_cfg,
            ..spec.clone()
        })
        .unwrap();
    let kn1 = upload(&rows(&k_all, &lens, &[1; 3]));
    let kn1v = view(&kn1, DType::F16, &[b, 1, hk, d]);
    let e = step.append(&kn1v, &kn1v, &mut other, stream).unwrap_err();
    assert!(matches!(e, FerrattnError::PlanMismatch(_)), "{e}");
    // lengths over the capacity: a cache made for fewer tokens
    let mut small = dev
        .cache(&TurboQuantCacheSpec {
            capacity_tokens: 16,
            ..spec.clone()
        })
        .unwrap();
    let e = step.append(&kn1v, &kn1v, &mut small, stream).unwrap_err();
    assert!(
        matches!(
            e,
            FerrattnError::View(ViewError::SequenceLongerThanCache { .. })
        ),
        "{e}"
    );
    drop(step);

    // ---- one more step, eager, then captured and replayed 20 times
    let vn1 = upload(&rows(&v_all, &lens, &[1; 3]));
    let vn1v = view(&vn1, DType::F16, &[b, 1, hk, d]);
    let step = dev.begin_decode(&plan, &mut ws, stream).unwrap();
    let enqueue =
        |caches: &mut Vec<ferrattn::device_api::TurboQuantCache>| -> ferrattn::Result<()> {
            for (c, (o, l)) in caches.iter_mut().zip(&out_views) {
                step.append(&kn1v, &vn1v, c, stream)?;
                step.run(&TurboQuantDecodeViews { q: &qdv, o, lse: l }, c, stream)?;
            }
            Ok(())
        };
    enqueue(&mut caches).unwrap();
    let eager = read(&outs);
    let (want, _) = emulate(&queries[steps + 1], plan.lens_after());
    let wo: Vec<f64> = want.o.data.iter().map(|&x| x as f64).collect();
    let got: Vec<f64> = eager[0]
        .0
        .iter()
        .map(|&x| f16::from_bits(x).to_f64())
        .collect();
    assert!(
        Comparison::new(&wo, &got).rel_fro <= 1e-3,
        "eager step vs the emulation"
    );
    let graph = Graph::capture(&g, || {
        enqueue(&mut caches).map_err(|e| ferrattn_cuda::CudaError::Plan(e.to_string()))
    })
    .expect("capture of the decode step");
    for (o, l) in outs.iter_mut() {
        o.fill_u16(0xffff).unwrap();
        l.fill_u32(0xffff_ffff).unwrap();
    }
    for _ in 0..20 {
        graph.launch().unwrap();
    }
    g.synchronize().unwrap();
    assert!(read(&outs) == eager, "outputs after 20 replays");
    assert_eq!(caches[0].lens(), plan.lens_after());
    drop(graph);
    drop(step);
}

/// A TurboQuant decode step of 4 layers (Llama-3-8B heads: 32 query, 8 KV, d 128; a ragged batch
/// of 4 over caches filled by a prefill step) captured in one CUDA graph and replayed 50 times
/// (`FERRATTN_TQ_REPLAYS`) into poisoned outputs equals its eager run bit for bit, both ways the API allows:
/// (a) the step's appends inside the graph (the eager run appended first; each replay rewrites
/// the same slots, and the caches' codes and norms after the replays equal the eager ones bit
/// for bit), and (b) the appends enqueued eagerly, outside the graph, which holds the layers'
/// decodes only. The step's tables and scratch live in one caller-owned workspace, copied
/// there by `begin_decode` on the caller's stream; layer 0 of (b) is checked against the
/// emulation (O within 1e-3 relative Frobenius) so the replays are compared with right answers.
#[test]
fn gpu_turboquant_step_of_4_layers_in_one_graph_equals_eager() {
    use ferrattn::device_api::{
        Stream, TurboQuantCache, TurboQuantCacheSpec, TurboQuantCompression, TurboQuantDecodePlan,
        TurboQuantDecodeViews, TurboQuantDevice, TurboQuantShape, Workspace,
    };
    use ferrattn::turboquant::{self, TurboQuantConfig};
    use ferrattn::{AttentionInputs, AttentionProblem, Comparison, Tensor};
    use ferrattn_cuda::{DeviceBuffer, Graph};
    use half::f16;
    use rand::SeedableRng;
    let name = "gpu_turboquant_step_of_4_layers_in_one_graph_equals_eager";
    let dev = match TurboQuantDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED {name}: {e}");
            return;
        }
    };
    let g = dev.backend().gpu().unwrap().clone();
    // SAFETY: the backend's own stream, alive as long as `dev`.
    let stream = unsafe { Stream::from_raw(g.raw_stream() as *mut std::ffi::c_void) };
    // FERRATTN_TQ_REPLAYS: fewer replays under compute-sanitizer (each launch is slow there)
    let replays: usize = std::env::var("FERRATTN_TQ_REPLAYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let (b, hq, hk, d, layers) = (4usize, 32usize, 8usize, 128usize, 4usize);
    let prompt = [577usize, 37, 1000, 65];
    let max_total = prompt.iter().max().unwrap() + 2;
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let mut randn = |shape: &[usize]| tq::uniform_f16(&mut rng, shape);
    // per layer: every token the steps append ([b, max_total, hk, d]) and the two queries
    let k_all: Vec<Tensor> = (0..layers).map(|_| randn(&[b, max_total, hk, d])).collect();
    let v_all: Vec<Tensor> = (0..layers).map(|_| randn(&[b, max_total, hk, d])).collect();
    let q_all: Vec<Tensor> = (0..2 * layers).map(|_| randn(&[b, 1, hq, d])).collect();
    let probe = AttentionProblem::uniform(1, 1, 1, 1, 1, d, d, DType::F16);
    let mut cfg = TurboQuantConfig::paper_default(&probe);
    cfg.value_bits = 3;
    let shape = TurboQuantShape {
        batch: b,
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
        softmax_scale: None,
    };
    let spec = TurboQuantCacheSpec {
        batch: b,
        heads_kv: hk,
        head_dim: d,
        capacity_tokens: max_total,
        config: cfg.clone(),
        // the codes are compared with the emulation's bit for bit: the exact kernels
        compression: TurboQuantCompression::Exact,
    };
    let mut caches: Vec<TurboQuantCache> = (0..layers).map(|_| dev.cache(&spec).unwrap()).collect();
    let upload = |t: &Tensor| tq::upload_f16(&g, t);
    let view = tq::cuda_view;
    let rows = tq::seq_rows;
    let mut outs: Vec<(DeviceBuffer, DeviceBuffer)> = (0..layers)
        .map(|_| {
            (
                DeviceBuffer::alloc(&g, b * hq * d * 2).unwrap(),
                DeviceBuffer::alloc(&g, b * hq * 4).unwrap(),
            )
        })
        .collect();
    let out_views: Vec<_> = outs
        .iter()
        .map(|(o, l)| {
            (
                view(o, DType::F16, &[b, 1, hq, d]),
                view(l, DType::F32, &[b, hq, 1]),
            )
        })
        .collect();
    let poison = tq::poison_outs;
    let read = tq::read_outs;
    let written = |got: &[(Vec<u16>, Vec<u32>)], what: &str| {
        for (i, (o, l)) in got.iter().enumerate() {
            assert!(
                o.iter().all(|&x| f16::from_bits(x).is_finite()),
                "{what} layer {i}: non-finite O (poison survived?)"
            );
            assert!(
                l.iter().all(|&x| f32::from_bits(x).is_finite()),
                "{what} layer {i}: non-finite LSE"
            );
        }
        assert!(
            got[0] != got[1],
            "{what}: layers 0 and 1 gave the same bits"
        );
    };
    let codes = |caches: &[TurboQuantCache]| {
        caches
            .iter()
            .map(|c| {
                let kv = c.download().unwrap();
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                (
                    kv.k_idx,
                    kv.v_idx,
                    kv.k_signs,
                    bits(&kv.k_norm),
                    bits(&kv.r_norm),
                    bits(&kv.v_norm),
                )
            })
            .collect::<Vec<_>>()
    };
    // per step: one plan, one workspace of the plan's size, one upload
    let plan_for = |lens: &[usize], new: &[usize]| {
        let after: Vec<usize> = lens.iter().zip(new).map(|(l, n)| l + n).collect();
        let schedule = dev.decode_schedule(&cfg, &shape, &after).unwrap();
        TurboQuantDecodePlan::new(&cfg, &shape, lens, new, schedule).unwrap()
    };
    let workspace = |plan: &TurboQuantDecodePlan| {
        let buf = DeviceBuffer::alloc(&g, plan.workspace_bytes()).unwrap();
        // SAFETY: a fresh allocation of the plan's size on device 0, used by one step at a time.
        let ws = unsafe { Workspace::cuda(buf.ptr(), buf.bytes(), 0) };
        (buf, ws)
    };

    // ---- the prefill step (ragged prompts into every layer's cache), eager
    let zero = vec![0usize; b];
    let plan0 = plan_for(&zero, &prompt);
    let (_buf0, mut ws0) = workspace(&plan0);
    let kv0: Vec<_> = (0..layers)
        .map(|l| {
            (
                upload(&rows(&k_all[l], &zero, &prompt)),
                upload(&rows(&v_all[l], &zero, &prompt)),
            )
        })
        .collect();
    let qs: Vec<DeviceBuffer> = q_all.iter().map(upload).collect();
    let m = plan0.new_rows();
    {
        let step = dev.begin_decode(&plan0, &mut ws0, stream).unwrap();
        for (l, c) in caches.iter_mut().enumerate() {
            let (kn, vn) = (
                view(&kv0[l].0, DType::F16, &[b, m, hk, d]),
                view(&kv0[l].1, DType::F16, &[b, m, hk, d]),
            );
            step.append(&kn, &vn, c, stream).unwrap();
            let (o, lse) = &out_views[l];
            let q = view(&qs[l], DType::F16, &[b, 1, hq, d]);
            step.run(&TurboQuantDecodeViews { q: &q, o, lse }, c, stream)
                .unwrap();
        }
    }
    let mut lens: Vec<usize> = plan0.lens_after().to_vec();

    // per layer: the step's one new token per sequence, uploaded once
    let one = vec![1usize; b];
    let new_tokens = |lens: &[usize]| -> Vec<(DeviceBuffer, DeviceBuffer)> {
        (0..layers)
            .map(|l| {
                (
                    upload(&rows(&k_all[l], lens, &one)),
                    upload(&rows(&v_all[l], lens, &one)),
                )
            })
            .collect()
    };

    // ---- (a) appends inside the graph
    let plan_a = plan_for(&lens, &one);
    let (_buf_a, mut ws_a) = workspace(&plan_a);
    let kv_a = new_tokens(&lens);
    let kv_a_views: Vec<_> = kv_a
        .iter()
        .map(|(k, v)| {
            (
                view(k, DType::F16, &[b, 1, hk, d]),
                view(v, DType::F16, &[b, 1, hk, d]),
            )
        })
        .collect();
    let q_a: Vec<_> = (0..layers)
        .map(|l| view(&qs[layers + l], DType::F16, &[b, 1, hq, d]))
        .collect();
    let step = dev.begin_decode(&plan_a, &mut ws_a, stream).unwrap();
    let enqueue_a = |caches: &mut Vec<TurboQuantCache>| -> ferrattn::Result<()> {
        for (l, c) in caches.iter_mut().enumerate() {
            step.append(&kv_a_views[l].0, &kv_a_views[l].1, c, stream)?;
            let (o, lse) = &out_views[l];
            step.run(&TurboQuantDecodeViews { q: &q_a[l], o, lse }, c, stream)?;
        }
        Ok(())
    };
    poison(&mut outs);
    enqueue_a(&mut caches).unwrap();
    let eager_a = read(&outs);
    written(&eager_a, "(a) eager");
    let codes_a = codes(&caches);
    let graph = Graph::capture(&g, || {
        enqueue_a(&mut caches).map_err(|e| ferrattn_cuda::CudaError::Plan(e.to_string()))
    })
    .expect("capture of the 4-layer step with its appends");
    poison(&mut outs);
    for _ in 0..replays {
        graph.launch().unwrap();
    }
    g.synchronize().unwrap();
    assert!(
        read(&outs) == eager_a,
        "(a) outputs after {replays} replays"
    );
    assert!(
        codes(&caches) == codes_a,
        "(a) caches after {replays} replays"
    );
    assert!(caches.iter().all(|c| c.lens() == plan_a.lens_after()));
    drop(graph);
    drop(step);
    lens = plan_a.lens_after().to_vec();

    // ---- (b) appends eager, outside the graph; the graph holds the 4 decodes
    let plan_b = plan_for(&lens, &one);
    let (_buf_b, mut ws_b) = workspace(&plan_b);
    let kv_b = new_tokens(&lens);
    let q_b: Vec<_> = (0..layers)
        .map(|l| view(&qs[l], DType::F16, &[b, 1, hq, d]))
        .collect();
    let step = dev.begin_decode(&plan_b, &mut ws_b, stream).unwrap();
    for (l, c) in caches.iter_mut().enumerate() {
        let (k, v) = (
            view(&kv_b[l].0, DType::F16, &[b, 1, hk, d]),
            view(&kv_b[l].1, DType::F16, &[b, 1, hk, d]),
        );
        step.append(&k, &v, c, stream).unwrap();
    }
    let enqueue_b = |caches: &[TurboQuantCache]| -> ferrattn::Result<()> {
        for (l, c) in caches.iter().enumerate() {
            let (o, lse) = &out_views[l];
            step.run(&TurboQuantDecodeViews { q: &q_b[l], o, lse }, c, stream)?;
        }
        Ok(())
    };
    poison(&mut outs);
    enqueue_b(&caches).unwrap();
    let eager_b = read(&outs);
    written(&eager_b, "(b) eager");
    // layer 0 against the emulation over everything the cache holds
    {
        let after = plan_b.lens_after();
        let mx = *after.iter().max().unwrap();
        let mut p = AttentionProblem::uniform(b, 1, mx, hq, hk, d, d, DType::F16);
        p.seqlens_k = after.to_vec();
        let mut x = AttentionInputs::new(
            q_all[0].clone(),
            rows(&k_all[0], &zero, after),
            rows(&v_all[0], &zero, after),
        );
        x.seqlens_k = Some(after.iter().map(|&l| l as i64).collect());
        let want = turboquant::emulate(&cfg, &p, &x).unwrap();
        let wo: Vec<f64> = want.o.data.iter().map(|&x| x as f64).collect();
        let got: Vec<f64> = eager_b[0]
            .0
            .iter()
            .map(|&x| f16::from_bits(x).to_f64())
            .collect();
        let c = Comparison::new(&wo, &got);
        eprintln!("(b) layer 0 vs the emulation: O rel_fro {:.2e}", c.rel_fro);
        assert!(
            c.rel_fro <= 1e-3,
            "(b) layer 0 vs the emulation: {:e}",
            c.rel_fro
        );
    }
    let graph = Graph::capture(&g, || {
        enqueue_b(&caches).map_err(|e| ferrattn_cuda::CudaError::Plan(e.to_string()))
    })
    .expect("capture of the 4-layer step's decodes");
    poison(&mut outs);
    for _ in 0..replays {
        graph.launch().unwrap();
    }
    g.synchronize().unwrap();
    assert!(
        read(&outs) == eager_b,
        "(b) outputs after {replays} replays"
    );
    drop(graph);
    drop(step);
    eprintln!(
        "{name}: {layers} layers, workspaces of {} / {} / {} bytes, {} / {} units",
        plan0.workspace_bytes(),
        plan_a.workspace_bytes(),
        plan_b.workspace_bytes(),
        plan_a.units(),
        plan_b.units()
    );
}

/// The tensor-core compression through the facade (skips without a GPU). For each of
/// `TurboQuantCompression::{Fast, Split}`, one cache of that path and one of `Exact` (the
/// `compression` of their specs) are filled by the same steps on the caller's stream: a ragged
/// prefill step and two one-token steps of `TurboQuantDecodeStep::append`, each decoded by `run`
/// into poisoned outputs. After each step:
/// - the exact cache holds the emulation's codes, signs and norms bit for bit, and the fast
///   cache meets its path's contract against the emulation
///   (`ferrattn_cuda::turboquant::check_compress_contract`, the check of
///   `backends/cuda/tests/gpu_turboquant.rs`: norms bit-exact, codes off only within the path's
///   margin of a Lloyd-Max boundary, `‖r‖` and QJL signs within theirs), and differs from the
///   exact cache (the fast kernels ran: their `‖r‖` comes from an f16 residual);
/// - the decode over the fast cache equals the core's decode of the codes that cache holds
///   (`TurboQuantCodec::attend`: O within 1e-3 relative Frobenius error, LSE within 2e-3 of
///   max(1, |LSE|), the kernels' tolerances) and is no worse against the f64 golden than the
///   decode over the exact cache by more than the 10%.
///
/// Then one more step whose fast (and exact) appends and decodes, run eagerly, are captured in
/// one CUDA graph and replayed 20 times into poisoned outputs: outputs and both caches' codes
/// and norms equal the eager run's bit for bit.
#[test]
fn gpu_turboquant_fast_cache_meets_its_contract_and_replays_in_a_graph() {
    use ferrattn::device_api::{
        Stream, TurboQuantCache, TurboQuantCacheSpec, TurboQuantCompression, TurboQuantDecodePlan,
        TurboQuantDecodeViews, TurboQuantDevice, TurboQuantShape, Workspace,
    };
    use ferrattn::turboquant::{CompressedKv, TurboQuantCodec, TurboQuantConfig};
    use ferrattn::{golden, AttentionInputs, AttentionProblem, Comparison, Tensor};
    use ferrattn_cuda::turboquant::{check_compress_contract, CompressPath};
    use ferrattn_cuda::{DeviceBuffer, Graph};
    use half::f16;
    use rand::SeedableRng;
    let name = "gpu_turboquant_fast_cache_meets_its_contract_and_replays_in_a_graph";
    let dev = match TurboQuantDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED {name}: {e}");
            return;
        }
    };
    let g = dev.backend().gpu().unwrap().clone();
    // SAFETY: the backend's own stream, alive as long as `dev`.
    let stream = unsafe { Stream::from_raw(g.raw_stream() as *mut std::ffi::c_void) };
    let (b, hq, hk, d) = (3usize, 16usize, 4usize, 128usize);
    let prompt = [37usize, 1, 530];
    let steps = 2;
    let max_total = prompt.iter().max().unwrap() + steps + 1;
    let mut rng = rand::rngs::StdRng::seed_from_u64(47);
    let mut randn = |shape: &[usize]| tq::uniform_f16(&mut rng, shape);
    let (k_all, v_all) = (randn(&[b, max_total, hk, d]), randn(&[b, max_total, hk, d]));
    let queries: Vec<Tensor> = (0..=steps + 1).map(|_| randn(&[b, 1, hq, d])).collect();
    let probe = AttentionProblem::uniform(1, 1, 1, 1, 1, d, d, DType::F16);
    let mut cfg = TurboQuantConfig::paper_default(&probe);
    cfg.value_bits = 3;
    let codec = TurboQuantCodec::new(&cfg, d, d);
    let shape = TurboQuantShape {
        batch: b,
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
        softmax_scale: None,
    };
    let upload = |t: &Tensor| tq::upload_f16(&g, t);
    let view = tq::cuda_view;
    let rows = tq::seq_rows;
    // the problem and inputs of a decode of `q` over the first `lens[b]` tokens of each sequence
    let problem = |q: &Tensor, lens: &[usize]| {
        let m = *lens.iter().max().unwrap();
        let mut p = AttentionProblem::uniform(b, 1, m, hq, hk, d, d, DType::F16);
        p.seqlens_k = lens.to_vec();
        let zero = vec![0; b];
        let mut x = AttentionInputs::new(
            q.clone(),
            rows(&k_all, &zero, lens),
            rows(&v_all, &zero, lens),
        );
        x.seqlens_k = Some(lens.iter().map(|&l| l as i64).collect());
        (p, x)
    };
    let f64s = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    let lse_rel = |want: &[f32], got: &[f64]| {
        want.iter()
            .zip(got)
            .map(|(&a, &b)| (a as f64 - b).abs() / (a.abs() as f64).max(1.0))
            .fold(0.0, f64::max)
    };
    let read = tq::read_outs;
    let decoded = |(o, l): &(Vec<u16>, Vec<u32>)| -> (Vec<f64>, Vec<f64>) {
        (
            o.iter().map(|&x| f16::from_bits(x).to_f64()).collect(),
            l.iter().map(|&x| f32::from_bits(x) as f64).collect(),
        )
    };
    let poison = tq::poison_outs;
    let bits_of = |kv: &CompressedKv| {
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        (
            kv.k_idx.clone(),
            kv.v_idx.clone(),
            kv.k_signs.clone(),
            bits(&kv.k_norm),
            bits(&kv.r_norm),
            bits(&kv.v_norm),
        )
    };
    let plan_for = |lens: &[usize], new: &[usize]| {
        let after: Vec<usize> = lens.iter().zip(new).map(|(l, n)| l + n).collect();
        let schedule = dev.decode_schedule(&cfg, &shape, &after).unwrap();
        TurboQuantDecodePlan::new(&cfg, &shape, lens, new, schedule).unwrap()
    };

    for fast in [TurboQuantCompression::Fast, TurboQuantCompression::Split] {
        let spec = |compression| TurboQuantCacheSpec {
            batch: b,
            heads_kv: hk,
            head_dim: d,
            capacity_tokens: max_total,
            config: cfg.clone(),
            compression,
        };
        // [0]: the exact cache, [1]: the fast one
        let mut caches: Vec<TurboQuantCache> = [TurboQuantCompression::Exact, fast]
            .into_iter()
            .map(|c| dev.cache(&spec(c)).unwrap())
            .collect();
        assert_eq!(caches[1].compression(), fast);
        let mut outs: Vec<(DeviceBuffer, DeviceBuffer)> = (0..2)
            .map(|_| {
                (
                    DeviceBuffer::alloc(&g, b * hq * d * 2).unwrap(),
                    DeviceBuffer::alloc(&g, b * hq * 4).unwrap(),
                )
            })
            .collect();
        let out_views: Vec<_> = outs
            .iter()
            .map(|(o, l)| {
                (
                    view(o, DType::F16, &[b, 1, hq, d]),
                    view(l, DType::F32, &[b, hq, 1]),
                )
            })
            .collect();

        // ---- a ragged prefill step, then one-token steps, each checked
        let mut lens = vec![0usize; b];
        for (s, query) in queries.iter().enumerate().take(steps + 1) {
            let what = format!("{fast} step {s}");
            let new: Vec<usize> = if s == 0 { prompt.to_vec() } else { vec![1; b] };
            let plan = plan_for(&lens, &new);
            let (kn, vn) = (
                upload(&rows(&k_all, &lens, &new)),
                upload(&rows(&v_all, &lens, &new)),
            );
            let m = plan.new_rows();
            let (knv, vnv) = (
                view(&kn, DType::F16, &[b, m, hk, d]),
                view(&vn, DType::F16, &[b, m, hk, d]),
            );
            let qd = upload(query);
            let qdv = view(&qd, DType::F16, &[b, 1, hq, d]);
            poison(&mut outs);
            let ws_buf = DeviceBuffer::alloc(&g, plan.workspace_bytes()).unwrap();
            // SAFETY: a fresh allocation of the plan's size on device 0, used by this step only.
            let mut ws = unsafe { Workspace::cuda(ws_buf.ptr(), ws_buf.bytes(), 0) };
            let step = dev.begin_decode(&plan, &mut ws, stream).unwrap();
            for (c, (o, l)) in caches.iter_mut().zip(&out_views) {
                step.append(&knv, &vnv, c, stream).unwrap();
                step.run(&TurboQuantDecodeViews { q: &qdv, o, lse: l }, c, stream)
                    .unwrap();
            }
            lens = plan.lens_after().to_vec();
            let got = read(&outs);
            drop(step);
            let (p, x) = problem(query, &lens);
            let (exact_kv, fast_kv) =
                (caches[0].download().unwrap(), caches[1].download().unwrap());
            let counts = check_compress_contract(&p, &x, &cfg, &exact_kv, CompressPath::Exact)
                .unwrap_or_else(|e| panic!("{what}: the exact cache: {e}"));
            assert_eq!(
                counts,
                Default::default(),
                "{what}: the exact cache differs"
            );
            let m = check_compress_contract(&p, &x, &cfg, &fast_kv, fast.path())
                .unwrap_or_else(|e| panic!("{what}: the {fast} cache: {e}"));
            assert!(
                bits_of(&fast_kv) != bits_of(&exact_kv),
                "{what}: the {fast} cache equals the exact one bit for bit (were its kernels run?)"
            );
            // decodes: each output written, the fast one against the core's decode of its codes
            let (eo, el) = decoded(&got[0]);
            let (fo, fl) = decoded(&got[1]);
            for (o, l) in [(&eo, &el), (&fo, &fl)] {
                assert!(
                    o.iter().all(|v| v.is_finite()) && l.iter().all(|v| v.is_finite()),
                    "{what}: non-finite output (poison survived?)"
                );
            }
            let want = codec.attend(&cfg, &p, &x.q, &fast_kv);
            let c = Comparison::new(&f64s(&want.o.data), &fo);
            let lr = lse_rel(&want.lse.data, &fl);
            let (g_o, _) = golden::exact_attention_f64(&p, &x);
            let (e_exact, e_fast) = (
                Comparison::new(&g_o, &eo).rel_fro,
                Comparison::new(&g_o, &fo).rel_fro,
            );
            eprintln!(
                "{what}: {} codes off ({} rows), {} signs off, ‖r‖ max rel {:.2e}; decode vs the core over its codes O rel_fro {:.2e}, LSE rel {lr:.2e}; vs golden {fast} {e_fast:.4e} exact {e_exact:.4e}",
                m.codes_off, m.rows_with_codes_off, m.signs_off, m.rnorm_max_rel, c.rel_fro
            );
            assert!(c.rel_fro <= 1e-3, "{what}: O rel_fro {:e}", c.rel_fro);
            assert!(lr <= 2e-3, "{what}: LSE relative error {lr:e}");
            assert!(
                e_fast <= 1.1 * e_exact + 1e-6,
                "{what}: decode over the {fast} cache {e_fast} vs over the exact cache {e_exact} against the golden"
            );
        }

        // ---- one more step, eager, then captured (fast appends inside) and replayed
        let one = vec![1usize; b];
        let plan = plan_for(&lens, &one);
        let (kn, vn) = (
            upload(&rows(&k_all, &lens, &one)),
            upload(&rows(&v_all, &lens, &one)),
        );
        let (knv, vnv) = (
            view(&kn, DType::F16, &[b, 1, hk, d]),
            view(&vn, DType::F16, &[b, 1, hk, d]),
        );
        let qd = upload(&queries[steps + 1]);
        let qdv = view(&qd, DType::F16, &[b, 1, hq, d]);
        let ws_buf = DeviceBuffer::alloc(&g, plan.workspace_bytes()).unwrap();
        // SAFETY: a fresh allocation of the plan's size on device 0, used by this step only.
        let mut ws = unsafe { Workspace::cuda(ws_buf.ptr(), ws_buf.bytes(), 0) };
        let step = dev.begin_decode(&plan, &mut ws, stream).unwrap();
        let enqueue = |caches: &mut Vec<TurboQuantCache>| -> ferrattn::Result<()> {
            for (c, (o, l)) in caches.iter_mut().zip(&out_views) {
                step.append(&knv, &vnv, c, stream)?;
                step.run(&TurboQuantDecodeViews { q: &qdv, o, lse: l }, c, stream)?;
            }
            Ok(())
        };
        poison(&mut outs);
        enqueue(&mut caches).unwrap();
        let eager = read(&outs);
        assert!(
            eager
                .iter()
                .map(decoded)
                .all(|(o, l)| o.iter().all(|v| v.is_finite()) && l.iter().all(|v| v.is_finite())),
            "{fast} graph step: eager outputs not written"
        );
        let codes_eager: Vec<_> = caches
            .iter()
            .map(|c| bits_of(&c.download().unwrap()))
            .collect();
        let graph = Graph::capture(&g, || {
            enqueue(&mut caches).map_err(|e| ferrattn_cuda::CudaError::Plan(e.to_string()))
        })
        .expect("capture of the step with its fast appends");
        poison(&mut outs);
        for _ in 0..20 {
            graph.launch().unwrap();
        }
        g.synchronize().unwrap();
        assert!(read(&outs) == eager, "{fast}: outputs after 20 replays");
        let codes_replayed: Vec<_> = caches
            .iter()
            .map(|c| bits_of(&c.download().unwrap()))
            .collect();
        assert!(
            codes_replayed == codes_eager,
            "{fast}: caches after 20 replays"
        );
        assert!(caches.iter().all(|c| c.lens() == plan.lens_after()));
        drop(graph);
        drop(step);
        eprintln!("{name}: {fast}: 20 replays equal the eager step");
    }
}

/// Helpers of the TurboQuant cache tests above (one definition instead of one per test).
mod tq {
    use ferrattn::device_api::{contiguous_strides, TensorView};
    use ferrattn::{DType, Tensor};
    use ferrattn_cuda::{DeviceBuffer, Gpu};
    use half::f16;
    use rand::Rng;
    use std::sync::Arc;

    /// An f16 tensor of `shape` with values uniform in [-2, 2), rounded to f16.
    pub fn uniform_f16(rng: &mut impl Rng, shape: &[usize]) -> Tensor {
        let mut t = Tensor::zeros(shape, DType::F16);
        t.data
            .iter_mut()
            .for_each(|v| *v = DType::F16.round(rng.gen_range(-2.0f32..2.0)));
        t
    }

    /// `t`'s values as f16 bits in a new device buffer.
    pub fn upload_f16(g: &Arc<Gpu>, t: &Tensor) -> DeviceBuffer {
        let bits: Vec<u16> = t.data.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
        DeviceBuffer::from_slice(g, &bits).unwrap()
    }

    /// A contiguous view of `buf` (device 0) as `dtype` of `shape`.
    pub fn cuda_view<'a>(buf: &DeviceBuffer, dtype: DType, shape: &[usize]) -> TensorView<'a> {
        // SAFETY: `buf` holds at least these bytes of device 0 and outlives the work.
        unsafe {
            TensorView::cuda(
                buf.ptr(),
                buf.bytes(),
                0,
                dtype,
                shape,
                &contiguous_strides(shape),
            )
        }
        .unwrap()
    }

    /// Rows `[from, from + n[b])` of each sequence of `all` (`[batch, tokens, heads_kv, d]`),
    /// padded to the longest.
    pub fn seq_rows(all: &Tensor, from: &[usize], n: &[usize]) -> Tensor {
        let (b, hk, d) = (all.shape[0], all.shape[2], all.shape[3]);
        let m = *n.iter().max().unwrap();
        let mut t = Tensor::zeros(&[b, m, hk, d], DType::F16);
        for bi in 0..b {
            for j in 0..n[bi] {
                for h in 0..hk {
                    t.row4_mut(bi, j, h)
                        .copy_from_slice(all.row4(bi, from[bi] + j, h));
                }
            }
        }
        t
    }

    /// Each (O, LSE) pair's bits.
    pub fn read_outs(outs: &[(DeviceBuffer, DeviceBuffer)]) -> Vec<(Vec<u16>, Vec<u32>)> {
        outs.iter()
            .map(|(o, l)| (o.to_vec::<u16>().unwrap(), l.to_vec::<u32>().unwrap()))
            .collect()
    }

    /// Fills every O with f16 NaN and every LSE with f32 NaN.
    pub fn poison_outs(outs: &mut [(DeviceBuffer, DeviceBuffer)]) {
        for (o, l) in outs.iter_mut() {
            o.fill_u16(0x7e00).unwrap(); // NaN
            l.fill_u32(0x7fc0_0000).unwrap();
        }
    }
}
