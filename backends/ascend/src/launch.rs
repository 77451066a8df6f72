//! The real path: copy inputs to the NPU, launch the AMLA kernel, copy O and LSE back.
//!
//! The launch follows what `ascendc_library` generates for a mixed kernel (see
//! [`crate::kernels`]): entry `auto_gen_amla_decode_bf16_576_512_kernel`, arguments
//! `ffts_addr` (from `aclrtGetHardwareSyncAddr`), the kernel's 8, `overflow_status`; block dim =
//! the AI Cores used (at most the device's, the kernel loops over the sequences beyond them);
//! a workspace of [`WORKSPACE_BYTES_PER_CORE`] per AI Core. The same argument order runs on the
//! CPU model in the test `kernel_cpu`; this file itself has not run (no NPU, see
//! `docs/ASCEND.md`).

use crate::acl::*;
use crate::device::NpuContext;
use crate::kernels::{
    KernelParams, AMLA_ENTRY_ARGS, OVERFLOW_STATUS_BYTES, WORKSPACE_BYTES_PER_CORE,
};
use crate::Result;
use ferrattn_core::amla::AmlaPlan;
use ferrattn_core::{AttentionInputs, AttentionProblem, DType, Tensor};
use half::bf16;
use std::ffi::c_void;

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
    if plan.block_k != 512 {
        // kBlockK in amla_config.h: the workspace and UB tiles are laid out for 512-token blocks
        return Err(crate::AscendError::Unsupported {
            what: format!("AMLA kernel with block_k {}", plan.block_k),
            supported: "block_k 512".into(),
        });
    }
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
    let block_dim = b.min(ctx.ai_cores);
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
    let ws = ctx.malloc(block_dim * WORKSPACE_BYTES_PER_CORE)?;
    let overflow = ctx.malloc(OVERFLOW_STATUS_BYTES)?;
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
        let mut ffts: *mut c_void = std::ptr::null_mut();
        acl.check("aclrtGetHardwareSyncAddr", (acl.sync_addr)(&mut ffts))?;
        acl.check(
            "aclrtKernelArgsInit",
            (acl.args_init)(ctx.kernel.func, &mut args),
        )?;
        let ptrs: [*mut c_void; AMLA_ENTRY_ARGS] = [
            ffts,
            q.ptr,
            kv.ptr,
            seqlens.ptr,
            o_acc.ptr,
            out.ptr,
            lse.ptr,
            ws.ptr,
            pbuf.ptr,
            overflow.ptr,
        ];
        for p in ptrs {
            let mut ptr: *mut c_void = p;
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
    // the kernel writes LSE per query row, [B, Sq, Hq] (row = token x Hq + head), -inf for rows
    // without keys; the API's layout is [B, Hq, Sq]
    let rows_lse: Vec<f32> = lb
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut lse_data = vec![0.0f32; b * hq * sq];
    for bi in 0..b {
        for i in 0..sq {
            for h in 0..hq {
                lse_data[(bi * hq + h) * sq + i] = rows_lse[(bi * sq + i) * hq + h];
            }
        }
    }
    let lse = Tensor {
        shape: vec![b, hq, sq],
        dtype: DType::F32,
        data: lse_data,
    };
    Ok((o, lse))
}
