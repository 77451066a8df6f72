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
