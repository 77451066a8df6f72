//! Launching the Lean decode: device-resident inputs and outputs, a prepared plan (schedule
//! tables and partial buffers uploaded once), and the launch itself.

use crate::device::{DeviceBuffer, Gpu};
use crate::error::{check, CudaError, Result};
use crate::kernels::{self, Function, LEAN_THREADS};
use cudarc::driver::sys;
use ferrattn_core::lean::{LeanPlan, Schedule};
use ferrattn_core::{
    AttentionInputs, AttentionOutput, AttentionPlan, AttentionProblem, DType, PlanDetail,
    Provenance, Tensor,
};
use half::{bf16, f16};
use std::sync::Arc;

/// Kernel parameters, mirrored by `struct LeanParams` in `cuda-kernels/lean_decode.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeanParams {
    q: u64,
    k: u64,
    v: u64,
    o: u64,
    lse: u64,
    seqlens_q: u64,
    seqlens_k: u64,
    seq_start: u64,
    cta_bounds: u64,
    cta_tiles: u64,
    part_o: u64,
    part_ml: u64,
    flags: u64,
    reserved: u32,
    num_ctas: i32,
    batch: i32,
    max_sq: i32,
    max_sk: i32,
    heads_q: i32,
    heads_kv: i32,
    group: i32,
    tile_m: i32,
    query_groups: i32,
    tile_k: i32,
    causal: i32,
    merge_in_kernel: i32,
    scale_log2: f32,
}

/// Q, K, V and sequence lengths on the device, as 16-bit values.
#[derive(Debug)]
pub struct DeviceInputs {
    /// The problem these tensors describe.
    pub problem: AttentionProblem,
    pub(crate) q: DeviceBuffer,
    pub(crate) k: DeviceBuffer,
    pub(crate) v: DeviceBuffer,
    pub(crate) seqlens_q: DeviceBuffer,
    pub(crate) seqlens_k: DeviceBuffer,
}

/// O `[B, Sq, Hq, D]` (16-bit) and LSE `f32 [B, Hq, Sq]` on the device.
#[derive(Debug)]
pub struct DeviceOutputs {
    pub(crate) o: DeviceBuffer,
    pub(crate) lse: DeviceBuffer,
}

/// A Lean plan made ready to launch: kernels chosen, tables and workspace on the device.
#[derive(Debug)]
pub struct PreparedLean {
    /// The plan.
    pub plan: LeanPlan,
    /// The problem it was made for.
    pub problem: AttentionProblem,
    decode: Function,
    combine: Function,
    /// Dynamic shared memory of the decode kernel, bytes.
    pub smem_bytes: u32,
    /// K/V pipeline stages the kernel instance uses.
    pub stages: u32,
    /// Co-resident CTAs per SM the driver reports for the decode kernel.
    pub ctas_per_sm: u32,
    rows: usize,
    num_tiles: usize,
    _seq_start: DeviceBuffer,
    _cta_bounds: DeviceBuffer,
    _cta_tiles: DeviceBuffer,
    _part_o: DeviceBuffer,
    _part_ml: DeviceBuffer,
    _flags: DeviceBuffer,
    params: LeanParams,
}

fn to_bits(dtype: DType, data: &[f32]) -> Result<Vec<u16>> {
    match dtype {
        DType::F16 => Ok(data.iter().map(|&x| f16::from_f32(x).to_bits()).collect()),
        DType::BF16 => Ok(data.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()),
        other => Err(CudaError::Unsupported {
            what: format!("{other} tensors on CUDA"),
            supported: "f16, bf16".into(),
        }),
    }
}

fn from_bits(dtype: DType, data: &[u16]) -> Vec<f32> {
    match dtype {
        DType::F16 => data.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
        _ => data.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
    }
}

impl DeviceInputs {
    /// Uploads host inputs of a validated problem.
    pub fn upload(
        gpu: &Arc<Gpu>,
        p: &AttentionProblem,
        x: &AttentionInputs,
    ) -> Result<DeviceInputs> {
        let v = x.v.as_ref().ok_or_else(|| CudaError::Unsupported {
            what: "MLA latent inputs for lean decode".into(),
            supported: "separate K and V".into(),
        })?;
        let lens = |l: &[usize]| l.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        Ok(DeviceInputs {
            problem: p.clone(),
            q: DeviceBuffer::from_slice(gpu, &to_bits(p.dtype, &x.q.data)?)?,
            k: DeviceBuffer::from_slice(gpu, &to_bits(p.dtype, &x.k.data)?)?,
            v: DeviceBuffer::from_slice(gpu, &to_bits(p.dtype, &v.data)?)?,
            seqlens_q: DeviceBuffer::from_slice(gpu, &lens(&p.seqlens_q))?,
            seqlens_k: DeviceBuffer::from_slice(gpu, &lens(&p.seqlens_k))?,
        })
    }

    /// Inputs filled on the device with uniform values in `[-scale, scale)` (no host copy; for
    /// inputs of many gigabytes).
    pub fn random(
        gpu: &Arc<Gpu>,
        fill: &Function,
        p: &AttentionProblem,
        seed: u32,
        scale: f32,
    ) -> Result<DeviceInputs> {
        let e = p.dtype.size_bytes();
        let nq = p.batch * p.max_seqlen_q * p.heads_q * p.head_dim_qk;
        let nk = p.batch * p.max_seqlen_k * p.heads_kv * p.head_dim_qk;
        let nv = p.batch * p.max_seqlen_k * p.heads_kv * p.head_dim_v;
        let lens = |l: &[usize]| l.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        let x = DeviceInputs {
            problem: p.clone(),
            q: DeviceBuffer::alloc(gpu, nq * e)?,
            k: DeviceBuffer::alloc(gpu, nk * e)?,
            v: DeviceBuffer::alloc(gpu, nv * e)?,
            seqlens_q: DeviceBuffer::from_slice(gpu, &lens(&p.seqlens_q))?,
            seqlens_k: DeviceBuffer::from_slice(gpu, &lens(&p.seqlens_k))?,
        };
        for (i, (buf, n)) in [(&x.q, nq), (&x.k, nk), (&x.v, nv)].into_iter().enumerate() {
            let mut ptr = buf.ptr();
            let mut n = n as u64;
            let mut s = seed.wrapping_mul(3).wrapping_add(i as u32 * 0x5bd1e995);
            let mut sc = scale;
            let mut args = [
                &mut ptr as *mut u64 as *mut std::ffi::c_void,
                &mut n as *mut u64 as *mut std::ffi::c_void,
                &mut s as *mut u32 as *mut std::ffi::c_void,
                &mut sc as *mut f32 as *mut std::ffi::c_void,
            ];
            launch_raw(gpu, fill, (132 * 16, 256), 0, &mut args)?;
        }
        Ok(x)
    }

    /// Copies the inputs back as host tensors (to compute references for device-filled inputs).
    pub fn download(&self) -> Result<AttentionInputs> {
        let p = &self.problem;
        let t = |b: &DeviceBuffer, shape: [usize; 4]| -> Result<Tensor> {
            Ok(Tensor {
                shape: shape.to_vec(),
                dtype: p.dtype,
                data: from_bits(p.dtype, &b.to_vec::<u16>()?),
            })
        };
        let q = t(&self.q, [p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk])?;
        let k = t(
            &self.k,
            [p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_qk],
        )?;
        let v = t(&self.v, [p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_v])?;
        Ok(AttentionInputs {
            seqlens_q: Some(p.seqlens_q.iter().map(|&x| x as i64).collect()),
            seqlens_k: Some(p.seqlens_k.iter().map(|&x| x as i64).collect()),
            ..AttentionInputs::new(q, k, v)
        })
    }

    /// Bytes of K and V that attention must read (valid tokens only).
    pub fn kv_bytes_read(&self) -> usize {
        let p = &self.problem;
        p.total_kv_tokens() * p.heads_kv * (p.head_dim_qk + p.head_dim_v) * p.dtype.size_bytes()
    }
}

impl DeviceOutputs {
    /// Uninitialised outputs for `p`.
    pub fn alloc(gpu: &Arc<Gpu>, p: &AttentionProblem) -> Result<DeviceOutputs> {
        let no = p.batch * p.max_seqlen_q * p.heads_q * p.head_dim_v;
        let nl = p.batch * p.heads_q * p.max_seqlen_q;
        Ok(DeviceOutputs {
            o: DeviceBuffer::alloc(gpu, no * 2)?,
            lse: DeviceBuffer::alloc(gpu, nl * 4)?,
        })
    }

    /// Fills O and LSE with NaN so that an element the kernel does not write shows up.
    pub fn poison(&mut self) -> Result<()> {
        self.o.fill_u16(0xffff)?; // NaN in f16 and bf16
        self.lse.fill_u32(0xffff_ffff) // NaN
    }

    /// Copies the outputs to host tensors.
    pub fn download(
        &self,
        p: &AttentionProblem,
        provenance: Provenance,
    ) -> Result<AttentionOutput> {
        let o = Tensor {
            shape: vec![p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_v],
            dtype: p.dtype,
            data: from_bits(p.dtype, &self.o.to_vec::<u16>()?),
        };
        let lse = Tensor {
            shape: vec![p.batch, p.heads_q, p.max_seqlen_q],
            dtype: DType::F32,
            data: self.lse.to_vec::<f32>()?,
        };
        Ok(AttentionOutput { o, lse, provenance })
    }

    /// Raw 16-bit O bits (for bitwise comparisons).
    pub fn o_bits(&self) -> Result<Vec<u16>> {
        self.o.to_vec()
    }
}

pub(crate) fn launch_raw(
    gpu: &Arc<Gpu>,
    f: &Function,
    (grid, block): (u32, u32),
    smem: u32,
    args: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    gpu.bind()?;
    // SAFETY: args point at live values matching the kernel's parameter list.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            f.f,
            grid,
            1,
            1,
            block,
            1,
            1,
            smem,
            gpu.stream,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

impl PreparedLean {
    /// Chooses the kernels for `plan`, checks the grid is co-resident, uploads the schedule.
    pub fn new(
        gpu: &Arc<Gpu>,
        module: &Arc<kernels::Module>,
        plan: &AttentionPlan,
    ) -> Result<PreparedLean> {
        let PlanDetail::Lean(lp) = &plan.detail else {
            return Err(CudaError::Plan(format!(
                "a {} plan was given to the lean kernel",
                plan.algorithm
            )));
        };
        let p = &plan.problem;
        let d = p.head_dim_qk;
        if p.head_dim_v != d {
            return Err(CudaError::Unsupported {
                what: format!("head dims qk={d} v={}", p.head_dim_v),
                supported: "qk = v".into(),
            });
        }
        let sk = kernels::lean_stage_keys(d);
        if !lp.tile_k.is_multiple_of(sk) {
            return Err(CudaError::Plan(format!(
                "tile_k {} is not a multiple of the kernel's {sk}-key stage for head dim {d} (plan made for another device?)",
                lp.tile_k
            )));
        }
        let [dn, cn, sn] = kernels::lean_kernel_names(p.dtype, d, lp.tile_m)?;
        let rows = kernels::lean_rows(lp.tile_m)?;
        let decode = module.function(&dn)?;
        let combine = module.function(&cn)?;
        // the kernel reports its own shared-memory size and stage count
        let smem_q = module.function(&sn)?;
        let out = DeviceBuffer::alloc(gpu, 8)?;
        let mut ptr = out.ptr();
        launch_raw(
            gpu,
            &smem_q,
            (1, 1),
            0,
            &mut [&mut ptr as *mut u64 as *mut std::ffi::c_void],
        )?;
        let info: Vec<i32> = out.to_vec()?;
        let (smem_bytes, stages) = (info[0] as u32, info[1] as u32);
        gpu.bind()?;
        // SAFETY: valid function handles; attribute values in range.
        unsafe {
            check(
                "cuFuncSetAttribute",
                sys::cuFuncSetAttribute(
                    decode.f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem_bytes as i32,
                ),
            )?;
        }
        let mut occ = 0i32;
        // SAFETY: out-parameter query.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut occ,
                decode.f,
                LEAN_THREADS as i32,
                smem_bytes as usize,
            )
        })?;
        let resident = occ as usize * gpu.caps.compute_units;
        if lp.schedule.merges_in_kernel() && lp.num_ctas > resident {
            // a host block may wait for a CTA that is never scheduled: refuse rather than hang
            return Err(CudaError::Plan(format!(
                "stream-K grid of {} CTAs exceeds the {resident} that can be co-resident ({occ} per SM x {} SMs for {dn} with {smem_bytes} bytes of shared memory)",
                lp.num_ctas, gpu.caps.compute_units
            )));
        }
        let space = lp.tile_space(p);
        if space.total_iters() >= u32::MAX as u64 {
            return Err(CudaError::Unsupported {
                what: format!("{} LeanTile iterations", space.total_iters()),
                supported: "fewer than 2^32".into(),
            });
        }
        let bounds: Vec<u32> = lp
            .schedule
            .cta_bounds(&space)
            .iter()
            .map(|&b| b as u32)
            .collect();
        let seq_start: Vec<u32> = space.seq_start.iter().map(|&b| b as u32).collect();
        let g = bounds.len() - 1;
        // per CTA: its first tile, and for the tile it hosts last, the CTA holding that tile's
        // final iteration (itself when the tile finishes inside its range)
        let mut cta_tiles = vec![0u32; 2 * g];
        let mut seen = vec![false; g];
        for seg in lp.schedule.segments(&space) {
            let c = seg.cta;
            if !seen[c] {
                seen[c] = true;
                cta_tiles[2 * c] = seg.tile as u32;
            }
            // segments come in iteration order: a CTA's last one decides what its host waits for
            let te = space.tile_range(seg.tile).1;
            cta_tiles[2 * c + 1] = if seg.host && !seg.finishing {
                (bounds.partition_point(|&b| (b as u64) < te) - 1) as u32
            } else {
                c as u32
            };
        }
        let seq_start_b = DeviceBuffer::from_slice(gpu, &seq_start)?;
        let cta_bounds_b = DeviceBuffer::from_slice(gpu, &bounds)?;
        let cta_tiles_b = DeviceBuffer::from_slice(gpu, &cta_tiles)?;
        let part_o = DeviceBuffer::alloc(gpu, g * rows * d * 4)?;
        let part_ml = DeviceBuffer::alloc(gpu, g * rows * 2 * 4)?;
        let flags = DeviceBuffer::from_slice(gpu, &vec![0u32; g])?;
        let params = LeanParams {
            q: 0,
            k: 0,
            v: 0,
            o: 0,
            lse: 0,
            seqlens_q: 0,
            seqlens_k: 0,
            seq_start: seq_start_b.ptr(),
            cta_bounds: cta_bounds_b.ptr(),
            cta_tiles: cta_tiles_b.ptr(),
            part_o: part_o.ptr(),
            part_ml: part_ml.ptr(),
            flags: flags.ptr(),
            reserved: 0,
            num_ctas: g as i32,
            batch: p.batch as i32,
            max_sq: p.max_seqlen_q as i32,
            max_sk: p.max_seqlen_k as i32,
            heads_q: p.heads_q as i32,
            heads_kv: p.heads_kv as i32,
            group: p.group_size() as i32,
            tile_m: lp.tile_m as i32,
            query_groups: lp.query_groups as i32,
            tile_k: lp.tile_k as i32,
            causal: p.causal as i32,
            merge_in_kernel: lp.schedule.merges_in_kernel() as i32,
            scale_log2: p.softmax_scale * std::f32::consts::LOG2_E,
        };
        Ok(PreparedLean {
            plan: lp.clone(),
            problem: p.clone(),
            decode,
            combine,
            smem_bytes,
            stages,
            ctas_per_sm: occ as u32,
            rows,
            num_tiles: space.num_tiles(),
            _seq_start: seq_start_b,
            _cta_bounds: cta_bounds_b,
            _cta_tiles: cta_tiles_b,
            _part_o: part_o,
            _part_ml: part_ml,
            _flags: flags,
            params,
        })
    }

    /// Whether this is the stream-K schedule (else fixed split).
    pub fn is_stream_k(&self) -> bool {
        matches!(self.plan.schedule, Schedule::StreamK { .. })
    }

    /// Enqueues the decode (and, for fixed split, the combine pass) on the stream.
    pub fn launch(&self, gpu: &Arc<Gpu>, x: &DeviceInputs, out: &mut DeviceOutputs) -> Result<()> {
        if x.problem != self.problem {
            return Err(CudaError::Plan(
                "inputs describe another problem than the plan".into(),
            ));
        }
        // flags start at 0 and every host re-arms the flags it consumed, so a launch needs no
        // per-launch state and can be captured in a CUDA graph
        let mut prm = LeanParams {
            q: x.q.ptr(),
            k: x.k.ptr(),
            v: x.v.ptr(),
            o: out.o.ptr(),
            lse: out.lse.ptr(),
            seqlens_q: x.seqlens_q.ptr(),
            seqlens_k: x.seqlens_k.ptr(),
            ..self.params
        };
        let mut args = [&mut prm as *mut LeanParams as *mut std::ffi::c_void];
        launch_raw(
            gpu,
            &self.decode,
            (self.params.num_ctas as u32, LEAN_THREADS),
            self.smem_bytes,
            &mut args,
        )?;
        if !self.is_stream_k() {
            let smem = (self.rows
                * (self.problem.head_dim_v + 2 + kernels::LEAN_MERGE_BATCH + 1)
                * 4) as u32;
            launch_raw(
                gpu,
                &self.combine,
                (self.num_tiles as u32, LEAN_THREADS),
                smem,
                &mut args,
            )?;
        }
        Ok(())
    }
}
