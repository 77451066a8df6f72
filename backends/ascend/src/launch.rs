//! The real path: copy inputs to the NPU, launch the AMLA kernel, copy O and LSE back.
//!
//! Not run in this repository's CI (no NPU); see `docs/ASCEND.md`.

use crate::acl::*;
use crate::device::NpuContext;
use crate::kernels::KernelParams;
use crate::Result;
use ferrattn_core::amla::AmlaPlan;
use ferrattn_core::{AttentionInputs, AttentionProblem, DType, Tensor};
use half::bf16;
use std::ffi::c_void;

/// Cube cores of one Ascend 910 (2 dies x 24); the kernel loops over sequences beyond it.
const MAX_BLOCK_DIM: usize = 48;
/// Blocks of S/P kept per core in the GM workspace: Preload count 2 plus the one in flight.
const WORKSPACE_DEPTH: usize = 3;

fn bf16_bytes(t: &Tensor) -> Vec<u8> {
    t.data
        .iter()
        .flat_map(|&x| bf16::from_f32(x).to_bits().to_le_bytes())
        .collect()
}

/// Runs the kernel; returns O (`[B, Sq, Hq, Dv]`, BF16 values) and LSE (`[B, Hq, Sq]`).
pub fn run(
    ctx: &NpuContext,
    plan: &AmlaPlan,
    p: &AttentionProblem,
    x: &AttentionInputs,
) -> Result<(Tensor, Tensor)> {
    let (b, sq, hq, dv) = (p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_v);
    let rows = sq * hq;
    let params = KernelParams {
        batch: b as u32,
        seq_q: sq as u32,
        heads: hq as u32,
        max_seq_k: p.max_seqlen_k as u32,
        block_k: plan.block_k as u32,
        compensation: plan.compensation as u32,
        causal: p.causal as u32,
        reserved: 0,
        scale: p.softmax_scale,
        reserved2: 0,
    };
    let block_dim = b.min(MAX_BLOCK_DIM);
    let q = ctx.malloc(x.q.numel() * 2)?;
    q.upload(&bf16_bytes(&x.q))?;
    let kv = ctx.malloc(x.k.numel() * 2)?;
    kv.upload(&bf16_bytes(&x.k))?;
    let lens: Vec<u8> = p
        .seqlens_k
        .iter()
        .flat_map(|&l| (l as i32).to_le_bytes())
        .collect();
    let seqlens = ctx.malloc(lens.len())?;
    seqlens.upload(&lens)?;
    let o_acc = ctx.malloc(b * rows * dv * 4)?;
    o_acc.zero()?; // Alg. 2 line 3: O = 0
    let out = ctx.malloc(b * rows * dv * 2)?;
    let lse = ctx.malloc(b * rows * 4)?;
    let ws_per_core = WORKSPACE_DEPTH * 256 * plan.block_k * (4 + 2);
    let ws = ctx.malloc(block_dim * ws_per_core)?;
    // SAFETY: KernelParams is repr(C) plain data.
    let pbytes = unsafe {
        std::slice::from_raw_parts(
            (&params as *const KernelParams).cast::<u8>(),
            std::mem::size_of::<KernelParams>(),
        )
    };
    let pbuf = ctx.malloc(pbytes.len())?;
    pbuf.upload(pbytes)?;
    let acl = &ctx.acl;
    let mut args: aclrtArgsHandle = std::ptr::null_mut();
    // SAFETY: documented AscendCL calls; every appended value is a device pointer held alive
    // until the stream is synchronised below.
    unsafe {
        acl.check(
            "aclrtKernelArgsInit",
            (acl.args_init)(ctx.kernel.func, &mut args),
        )?;
        for buf in [&q, &kv, &seqlens, &o_acc, &out, &lse, &ws, &pbuf] {
            let mut ptr: *mut c_void = buf.ptr;
            let mut param: aclrtParamHandle = std::ptr::null_mut();
            acl.check(
                "aclrtKernelArgsAppend",
                (acl.args_append)(
                    args,
                    (&mut ptr as *mut *mut c_void).cast(),
                    std::mem::size_of::<*mut c_void>(),
                    &mut param,
                ),
            )?;
        }
        acl.check("aclrtKernelArgsFinalize", (acl.args_finalize)(args))?;
        acl.check(
            "aclrtLaunchKernelWithConfig",
            (acl.launch)(
                ctx.kernel.func,
                block_dim as u32,
                ctx.stream,
                std::ptr::null_mut(),
                args,
                std::ptr::null_mut(),
            ),
        )?;
        acl.check("aclrtSynchronizeStream", (acl.sync_stream)(ctx.stream))?;
    }
    let mut ob = vec![0u8; b * rows * dv * 2];
    out.download(&mut ob)?;
    let mut lb = vec![0u8; b * rows * 4];
    lse.download(&mut lb)?;
    let o = Tensor {
        shape: vec![b, sq, hq, dv],
        dtype: DType::BF16,
        data: ob
            .chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
    };
    let lse = Tensor {
        shape: vec![b, hq, sq],
        dtype: DType::F32,
        // the kernel writes -3.4e38 for rows without keys (LSE = -inf)
        data: lb
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .map(|v| if v <= -3.0e38 { f32::NEG_INFINITY } else { v })
            .collect(),
    };
    Ok((o, lse))
}
