//! The device path end to end, as an engine calls it: a Llama-3-8B-shape decode step (32 query /
//! 8 KV heads, d 128, bf16) over a paged KV cache (pages of 16 tokens, NHD pools) for 32 layers,
//! on memory and a stream this program owns (allocated with cudarc, as an engine would with its
//! own allocator), then checked against exact attention computed on the host.
//!
//! ```sh
//! cargo run --release --example decode_step
//! ```
//!
//! Without a CUDA device the program plans the same step on the host for a reference Hopper (the
//! plan is pure host data), says why the device part did not run, and runs the step's first layer
//! through the host path (`Runtime`) instead, checked the same way.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use ferrattn::device_api::{
    contiguous_strides, DecodePlan, DecodeShape, DecodeViews, KvCache, LeanDecoder, LeanSchedule,
    Stream, TensorView, Workspace,
};
use ferrattn::{
    golden, Algorithm, AttentionInputs, AttentionOptions, BackendChoice, Comparison, DType,
    DeviceCaps, Runtime, Tensor,
};
use half::bf16;
use rand::{rngs::StdRng, seq::SliceRandom, SeedableRng};
use std::error::Error;
use std::sync::Arc;

const LAYERS: usize = 32;
const BATCH: usize = 4;
const HEADS_Q: usize = 32;
const HEADS_KV: usize = 8;
const D: usize = 128;
const PAGE: usize = 16;
/// Keys per sequence after this step's token (ragged, one sequence shorter than a page).
const LENS: [usize; BATCH] = [1000, 9, 4096, 577];
/// bf16 output against an f32 reference: a few bf16 ulps of relative error.
const MAX_REL_ERR: f64 = 1e-2;

/// One layer's host data: q, and K/V (padded to the longest sequence; position `LENS[b] - 1`
/// is this step's token). To keep the example quick every layer shares one host K/V; each
/// layer has its own q and its own device pages.
struct Layer {
    q: Tensor,
    k: Arc<Tensor>,
    v: Arc<Tensor>,
}

/// Host inputs of a layer with its ragged lengths, for the reference and the host path.
fn host_inputs(l: &Layer) -> AttentionInputs {
    let mut x = AttentionInputs::new(l.q.clone(), (*l.k).clone(), (*l.v).clone());
    x.seqlens_k = Some(LENS.iter().map(|&n| n as i64).collect());
    x
}

/// O of a layer against exact attention on the host; an error if it misses [`MAX_REL_ERR`].
fn check(what: &str, l: &Layer, o: &[f32]) -> Result<(), Box<dyn Error>> {
    let x = host_inputs(l);
    let p = x.problem(AttentionOptions::default(), None)?;
    let exact = golden::exact_attention(&p, &x);
    let c = Comparison::f32(&exact.o.data, o);
    println!(
        "{what}: O against exact attention: rel. Frobenius {:.2e}, max abs {:.2e}",
        c.rel_fro, c.max_abs
    );
    if c.rel_fro > MAX_REL_ERR {
        return Err(format!("{what}: relative error {:.3e} > {MAX_REL_ERR}", c.rel_fro).into());
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let max_len = *LENS.iter().max().expect("a batch");
    let max_pages = max_len.div_ceil(PAGE);
    // The engine's page table: each sequence's pages anywhere in the pool; -1 past the end.
    let need: Vec<usize> = LENS.iter().map(|n| n.div_ceil(PAGE)).collect();
    let num_pages = need.iter().sum::<usize>();
    let mut rng = StdRng::seed_from_u64(7);
    let mut pool: Vec<i32> = (0..num_pages as i32).collect();
    pool.shuffle(&mut rng);
    let mut table = vec![-1i32; BATCH * max_pages];
    let mut next = pool.iter();
    for (b, &n) in need.iter().enumerate() {
        for slot in &mut table[b * max_pages..][..n] {
            *slot = *next.next().expect("pool sized to the pages needed");
        }
    }
    let shape = DecodeShape {
        batch: BATCH,
        query_len: 1,
        heads_q: HEADS_Q,
        heads_kv: HEADS_KV,
        head_dim: D,
        dtype: DType::BF16,
        causal: false,
        softmax_scale: None,
    };
    let kv = KvCache::Paged {
        page_size: PAGE,
        num_pages,
        max_pages,
        page_table: &table,
    };

    let kv_shape = [BATCH, max_len, HEADS_KV, D];
    let k = Arc::new(Tensor::randn(&kv_shape, DType::BF16, 1.0, &mut rng));
    let v = Arc::new(Tensor::randn(&kv_shape, DType::BF16, 1.0, &mut rng));
    let layer = |rng: &mut StdRng| Layer {
        q: Tensor::randn(&[BATCH, 1, HEADS_Q, D], DType::BF16, 1.0, rng),
        k: k.clone(),
        v: v.clone(),
    };
    let gpu = match LeanDecoder::new(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            // no GPU: the plan is still host data; then the host path on the same inputs
            let plan = DecodePlan::new(
                &shape,
                &DeviceCaps::hopper_reference(),
                &LENS,
                kv,
                1,
                LeanSchedule::StreamK,
            )?;
            println!("no CUDA device ({e}); the device path was planned but not run:");
            println!(
                "  plan for a reference Hopper: {} bytes of workspace",
                plan.workspace_bytes()
            );
            let l = layer(&mut rng);
            let sel = Runtime::select(BackendChoice::Auto, Algorithm::Lean)?;
            let x = host_inputs(&l);
            let problem = x.problem(AttentionOptions::default(), None)?;
            let out = sel
                .runtime
                .run(&sel.runtime.plan(Algorithm::Lean, &problem)?, &x)?;
            return check("host path, layer 0", &l, &out.o.data);
        }
    };

    // The engine's context (the primary one, as torch uses) and its own stream.
    let ctx = CudaContext::new(0)?;
    let cu = ctx.new_stream()?;
    // SAFETY: `cu` outlives every launch below (it is synchronised before the program ends).
    let stream = unsafe { Stream::from_raw(cu.cu_stream() as *mut std::ffi::c_void) };
    let caps = gpu.caps()?;
    let step_plan = DecodePlan::new(&shape, &caps, &LENS, kv, 1, LeanSchedule::StreamK)?;
    // Writing the prompts into the cache: the same pages, prompt lengths, the whole prompt new.
    let prompt_lens: Vec<usize> = LENS.iter().map(|n| n - 1).collect();
    let fill_plan = DecodePlan::new(
        &shape,
        &caps,
        &prompt_lens,
        kv,
        max_len,
        LeanSchedule::StreamK,
    )?;

    let bits = |t: &Tensor| -> Vec<u16> {
        t.data
            .iter()
            .map(|&x| bf16::from_f32(x).to_bits())
            .collect()
    };
    let upload = |t: &Tensor| cu.clone_htod(&bits(t));
    let addr = |s: &CudaSlice<u16>, cu: &Arc<CudaStream>| s.device_ptr(cu).0;
    // SAFETY (every view below): the slice holds `len * 2` bytes of device 0 and outlives the
    // work enqueued on `cu` (synchronised before the slices drop).
    let view = |s: &CudaSlice<u16>, shape: &[usize]| unsafe {
        TensorView::cuda(
            addr(s, &cu),
            s.len() * 2,
            0,
            DType::BF16,
            shape,
            &contiguous_strides(shape),
        )
    };

    let ws_bytes = step_plan.workspace_bytes().max(fill_plan.workspace_bytes());
    let ws_buf = cu.alloc_zeros::<u8>(ws_bytes.max(1))?;
    let ws_addr = ws_buf.device_ptr(&cu).0;
    let pool_shape = [num_pages, PAGE, HEADS_KV, D];
    let pool_len = pool_shape.iter().product::<usize>();
    let mut layers = Vec::with_capacity(LAYERS);
    let mut device = Vec::with_capacity(LAYERS);
    for _ in 0..LAYERS {
        let l = layer(&mut rng);
        // this step's token of each sequence, at position LENS[b] - 1 of the host K/V
        let token = |t: &Tensor| {
            let mut x = Tensor::zeros(&[BATCH, 1, HEADS_KV, D], DType::BF16);
            for (b, &n) in LENS.iter().enumerate() {
                for h in 0..HEADS_KV {
                    x.row4_mut(b, 0, h).copy_from_slice(t.row4(b, n - 1, h));
                }
            }
            x
        };
        let d = (
            upload(&l.q)?,
            upload(&l.k)?,
            upload(&l.v)?,
            upload(&token(&l.k))?,
            upload(&token(&l.v))?,
            cu.alloc_zeros::<u16>(pool_len)?,
            cu.alloc_zeros::<u16>(pool_len)?,
            cu.alloc_zeros::<u16>(BATCH * HEADS_Q * D)?,
            cu.alloc_zeros::<f32>(BATCH * HEADS_Q)?,
        );
        layers.push(l);
        device.push(d);
    }

    // Prefill (done by the engine's prefill kernels in real life): the prompts into the pages.
    {
        // SAFETY: `ws_buf` holds `ws_bytes` bytes of device 0 and outlives the step.
        let mut ws = unsafe { Workspace::cuda(ws_addr, ws_bytes, 0) };
        let fill = gpu.begin_step(&fill_plan, &mut ws, stream)?;
        for (_, k, v, _, _, kp, vp, _, _) in &device {
            let (k, v) = (
                view(k, &[BATCH, max_len, HEADS_KV, D])?,
                view(v, &[BATCH, max_len, HEADS_KV, D])?,
            );
            fill.append(
                &k,
                &v,
                &view(kp, &pool_shape)?,
                &view(vp, &pool_shape)?,
                stream,
            )?;
        }
    }
    // The decode step: plan once (above), begin once, then per layer append + attention, all
    // on the engine's stream: no allocation, copy or host synchronisation from here to the end.
    {
        // SAFETY: as above.
        let mut ws = unsafe { Workspace::cuda(ws_addr, ws_bytes, 0) };
        let step = gpu.begin_step(&step_plan, &mut ws, stream)?;
        for (q, _, _, kn, vn, kp, vp, o, lse) in &device {
            let (kp, vp) = (view(kp, &pool_shape)?, view(vp, &pool_shape)?);
            let new = [BATCH, 1, HEADS_KV, D];
            step.append(&view(kn, &new)?, &view(vn, &new)?, &kp, &vp, stream)?;
            let q = view(q, &[BATCH, 1, HEADS_Q, D])?;
            let o_v = view(o, &[BATCH, 1, HEADS_Q, D])?;
            // SAFETY: `lse` holds BATCH * HEADS_Q f32 of device 0 and outlives the step.
            let lse_v = unsafe {
                TensorView::cuda(
                    lse.device_ptr(&cu).0,
                    lse.len() * 4,
                    0,
                    DType::F32,
                    &[BATCH, HEADS_Q, 1],
                    &[HEADS_Q, 1, 1],
                )
            }?;
            step.run(
                &DecodeViews {
                    q: &q,
                    k: &kp,
                    v: &vp,
                    o: &o_v,
                    lse: &lse_v,
                },
                stream,
            )?;
        }
    }
    cu.synchronize()?;
    println!(
        "{LAYERS} layers of a {BATCH}-sequence decode step (lengths {LENS:?}, pages of {PAGE}) ran on the caller's stream"
    );
    for i in [0, LAYERS - 1] {
        let o: Vec<f32> = cu
            .clone_dtoh(&device[i].7)?
            .into_iter()
            .map(|b| bf16::from_bits(b).to_f32())
            .collect();
        check(&format!("layer {i}"), &layers[i], &o)?;
    }
    Ok(())
}
