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
