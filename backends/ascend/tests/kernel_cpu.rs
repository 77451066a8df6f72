//! `ascend-kernels/amla/amla_decode.cpp` itself, executed on the CPU model of the AscendC API
//! (`ascend-kernels/include/ascendc_decls.h`: GM/UB/L1/L0 arenas, nZ/zN fractals, DataCopy,
//! LoadData2D, Mmad, Fixpipe, vector ops, queues, atomics, cross-core flags with one thread per
//! core), compared bit for bit with the simulated numerics (`sim::numerics`), which follow the
//! same documented semantics in Rust.
//!
//! Where the AscendC docs leave a semantic open that changes the numbers (the add order of
//! `WholeReduceSum`) both readings run against the matching simulation; where it does not change
//! them when the kernel is right (whether `Mmad` reads the K tail of a fractal, which the kernel
//! zeroes) both readings must give the same bits.

mod common;

use common::mla_inputs;
use ferrattn_ascend::kernels::KernelParams;
use ferrattn_ascend::sim::numerics::{run, to_tensors, Arithmetic, KernelSettings, RowSumOrder};
use ferrattn_core::amla::preload::PreloadPipeline;
use ferrattn_core::{AttentionInputs, AttentionProblem};
use half::bf16;
use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Bytes of GM workspace per AI Core (`kWsBytesPerCore` in `amla_config.h`).
const WS_PER_CORE: usize = 3 * 256 * 512 * (4 + 2);
/// Model option bits of `ferrattn_amla_cpu_launch`.
const MMAD_K_ALIGN16: u32 = 1;
const SUM_ADJACENT: u32 = 2;
/// Seconds a cross-core wait may block before the model reports a hang.
const FLAG_TIMEOUT_S: f64 = 20.0;

type LaunchFn = unsafe extern "C" fn(
    u32,
    *mut c_void,
    *const *mut c_void,
    *const *const c_void,
    *const usize,
    usize,
    u32,
    f64,
    *mut c_char,
    usize,
) -> i32;
type HangFn = unsafe extern "C" fn(f64, *mut c_char, usize) -> i32;

/// The runner (`tests/cpu_model/runner.cpp` with the kernel) built once per test binary.
fn model() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    LIB.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let kernels = root.join("../../ascend-kernels");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("libamla_cpu_model.so");
        let status = Command::new("g++")
            .args([
                "-std=c++17",
                "-O2",
                // one rounding per FP32 operation, as the documented vector and Cube ops
                "-ffp-contract=off",
                "-fPIC",
                "-shared",
                "-pthread",
                "-Wall",
                "-Werror",
                "-DFERRATTN_ASCENDC_DECLS",
            ])
            .arg(format!("-I{}", kernels.join("include").display()))
            .arg(format!("-I{}", kernels.join("amla").display()))
            .arg(root.join("tests/cpu_model/runner.cpp"))
            .arg("-o")
            .arg(&out)
            .status()
            .expect("this test needs the system g++");
        assert!(status.success(), "g++ failed to build the CPU model");
        // SAFETY: the library was just built from runner.cpp and has no initialisers with
        // side effects.
        unsafe { libloading::Library::new(&out) }.expect("load the CPU model")
    })
}

/// Device memory of one launch, as host buffers.
struct Launch {
    q: Vec<u16>,
    kv: Vec<u16>,
    seqlens: Vec<i32>,
    o_acc: Vec<f32>,
    out: Vec<u16>,
    lse: Vec<f32>,
    ws: Vec<u8>,
    params: KernelParams,
    sync_word: u64,
}

impl Launch {
    fn new(
        p: &AttentionProblem,
        x: &AttentionInputs,
        block_dim: usize,
        compensation: bool,
    ) -> Self {
        let bits =
            |v: &[f32]| -> Vec<u16> { v.iter().map(|&f| bf16::from_f32(f).to_bits()).collect() };
        let rows = p.max_seqlen_q * p.heads_q;
        Launch {
            q: bits(&x.q.data),
            kv: bits(&x.k.data),
            seqlens: p.seqlens_k.iter().map(|&l| l as i32).collect(),
            o_acc: vec![0.0; p.batch * rows * 512], // Alg. 2 line 3, done by the host (aclrtMemset)
            out: vec![0xFFFF; p.batch * rows * 512], // poisoned: unwritten elements show as NaN
            lse: vec![f32::NAN; p.batch * rows],
            ws: vec![0xFF; block_dim * WS_PER_CORE],
            params: KernelParams {
                batch: p.batch as u32,
                seq_q: p.max_seqlen_q as u32,
                heads: p.heads_q as u32,
                max_seq_k: p.max_seqlen_k as u32,
                block_k: 512,
                compensation: compensation as u32,
                causal: p.causal as u32,
                reserved: 0,
                scale: p.softmax_scale,
                reserved2: 0,
            },
            sync_word: 0,
        }
    }

    /// Runs the kernel on `block_dim` AI Cores; `with_sync`: pass the hardware sync address.
    fn run(&mut self, block_dim: usize, flags: u32, with_sync: bool) -> Result<(), String> {
        let launch: libloading::Symbol<LaunchFn> =
            // SAFETY: the symbol has this signature in runner.cpp.
            unsafe { model().get(b"ferrattn_amla_cpu_launch") }.expect("launch symbol");
        let ptrs: [*mut c_void; 8] = [
            self.q.as_mut_ptr().cast(),
            self.kv.as_mut_ptr().cast(),
            self.seqlens.as_mut_ptr().cast(),
            self.o_acc.as_mut_ptr().cast(),
            self.out.as_mut_ptr().cast(),
            self.lse.as_mut_ptr().cast(),
            self.ws.as_mut_ptr().cast(),
            (&mut self.params as *mut KernelParams).cast(),
        ];
        let sizes = [
            self.q.len() * 2,
            self.kv.len() * 2,
            self.seqlens.len() * 4,
            self.o_acc.len() * 4,
            self.out.len() * 2,
            self.lse.len() * 4,
            self.ws.len(),
            std::mem::size_of::<KernelParams>(),
        ];
        let allocs: Vec<*const c_void> = ptrs.iter().map(|&p| p as *const c_void).collect();
        let sync: *mut c_void = if with_sync {
            (&mut self.sync_word as *mut u64).cast()
        } else {
            std::ptr::null_mut()
        };
        let mut err = vec![0u8; 1024];
        // SAFETY: every pointer stays valid for the call; the model checks every access
        // against `allocs`/`sizes`.
        let rc = unsafe {
            launch(
                block_dim as u32,
                sync,
                ptrs.as_ptr(),
                allocs.as_ptr(),
                sizes.as_ptr(),
                sizes.len(),
                flags,
                FLAG_TIMEOUT_S,
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            let end = err.iter().position(|&c| c == 0).unwrap_or(err.len());
            Err(String::from_utf8_lossy(&err[..end]).into_owned())
        }
    }
}

/// Runs the kernel and the simulation on one problem and compares O (BF16) and LSE bit for bit.
fn check(
    case: &str,
    p: &AttentionProblem,
    x: &AttentionInputs,
    block_dim: usize,
    flags: u32,
    compensation: bool,
) {
    let mut l = Launch::new(p, x, block_dim, compensation);
    l.run(block_dim, flags, true)
        .unwrap_or_else(|e| panic!("{case}: the kernel failed on the CPU model: {e}"));
    let settings = KernelSettings {
        block_k: 512,
        compensation,
        preload: PreloadPipeline::amla_default(),
        arithmetic: Arithmetic::Kernel(if flags & SUM_ADJACENT != 0 {
            RowSumOrder::AdjacentPairs
        } else {
            RowSumOrder::Halving
        }),
    };
    let (so, slse) = to_tensors(p, run(p, x, &settings));
    let (sq, hq) = (p.max_seqlen_q, p.heads_q);
    let mut mismatches = Vec::new();
    for (i, (&k, &s)) in l.out.iter().zip(&so.data).enumerate() {
        let sb = bf16::from_f32(s).to_bits();
        if k != sb {
            mismatches.push(format!(
                "O[{i}] kernel {} sim {}",
                bf16::from_bits(k),
                bf16::from_bits(sb)
            ));
        }
    }
    // the kernel writes LSE as [B, Sq, Hq] (row = token x Hq + head); the simulation as [B, Hq, Sq]
    for b in 0..p.batch {
        for i in 0..sq {
            for h in 0..hq {
                let k = l.lse[(b * sq + i) * hq + h];
                let s = slse.data[(b * hq + h) * sq + i];
                if k.to_bits() != s.to_bits() {
                    mismatches.push(format!("LSE[b {b} token {i} head {h}] kernel {k} sim {s}"));
                }
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{case}: {} of {} values differ, first: {:?}",
        mismatches.len(),
        l.out.len() + l.lse.len(),
        &mismatches[..mismatches.len().min(5)]
    );
}

#[test]
fn kernel_matches_simulation_sq1_16_heads_all_lengths() {
    // Sk 1, 37, 512, 513, 2000 in one batch on two AI Cores: partial and exact blocks, several
    // sequences per core
    let lens = vec![1i64, 37, 512, 513, 2000];
    let (p, x) = mla_inputs(5, 1, 2000, 16, 576, 512, 1.0, Some(lens), false, 41);
    check("sq 1, 16 heads", &p, &x, 2, 0, true);
}

#[test]
fn kernel_matches_simulation_sq2_causal_128_heads() {
    // 256 query rows (two 128-row stripes, 128 rows per vector core); causal with Sq 2 leaves
    // the token-0 rows without a key in the last block of Sk 513, and without any key at Sk 1
    let lens = vec![513i64, 1, 37];
    let (p, x) = mla_inputs(3, 2, 513, 128, 576, 512, 1.0, Some(lens), true, 42);
    check("sq 2 causal, 128 heads", &p, &x, 2, 0, true);
}

#[test]
fn kernel_matches_simulation_sq1_128_heads() {
    // 128 rows: one stripe, 64 rows per vector core (four UB passes each)
    let lens = vec![2000i64, 512];
    let (p, x) = mla_inputs(2, 1, 2000, 128, 576, 512, 1.0, Some(lens), false, 49);
    check("sq 1, 128 heads", &p, &x, 1, 0, true);
}

#[test]
fn kernel_matches_simulation_both_readings_of_open_semantics() {
    // Mmad reading the K tail (must not change a bit: the kernel zeroes it) and the adjacent-pair
    // WholeReduceSum (changes the sums; the simulation follows the same reading)
    let lens = vec![600i64, 37];
    let (p, x) = mla_inputs(2, 2, 600, 16, 576, 512, 1.5, Some(lens), false, 43);
    for flags in [MMAD_K_ALIGN16, SUM_ADJACENT, MMAD_K_ALIGN16 | SUM_ADJACENT] {
        check(&format!("model flags {flags}"), &p, &x, 1, flags, true);
    }
}

#[test]
fn kernel_matches_simulation_without_compensation() {
    let (p, x) = mla_inputs(1, 1, 1100, 16, 576, 512, 2.0, None, false, 44);
    check("no compensation", &p, &x, 1, 0, false);
}

#[test]
fn launch_without_the_hardware_sync_address_fails_fast() {
    let (p, x) = mla_inputs(1, 1, 37, 16, 576, 512, 1.0, None, false, 45);
    let mut l = Launch::new(&p, &x, 1, true);
    let e = l.run(1, 0, false).unwrap_err();
    assert!(e.contains("SetSyncBaseAddr"), "{e}");
}

#[test]
fn workspace_of_fewer_cores_than_the_block_dim_is_caught() {
    // block dim 2 with a workspace for 1 AI Core: the second core's workspace is outside every
    // allocation (the vector cores index it by AI Core, not by GetBlockIdx)
    let lens = vec![37i64, 37];
    let (p, x) = mla_inputs(2, 1, 37, 16, 576, 512, 1.0, Some(lens), false, 46);
    let mut l = Launch::new(&p, &x, 1, true);
    let e = l.run(2, 0, true).unwrap_err();
    assert!(e.contains("outside every host allocation"), "{e}");
}

#[test]
fn an_unpaired_cross_core_flag_fails_within_the_timeout() {
    let hang: libloading::Symbol<HangFn> =
        // SAFETY: the symbol has this signature in runner.cpp.
        unsafe { model().get(b"ferrattn_cpu_hang_probe") }.expect("probe symbol");
    let mut err = vec![0u8; 512];
    let t0 = std::time::Instant::now();
    // SAFETY: err outlives the call.
    let rc = unsafe { hang(0.5, err.as_mut_ptr().cast(), err.len()) };
    let msg =
        String::from_utf8_lossy(&err[..err.iter().position(|&c| c == 0).unwrap()]).into_owned();
    assert_eq!(rc, 1);
    assert!(msg.contains("hang") && msg.contains("flag 5"), "{msg}");
    assert!(t0.elapsed().as_secs_f64() < 5.0);
}

#[test]
fn orders_differ_by_rounding_only() {
    // the backend's simulated path (the core emulation's order) and the kernel's order run the
    // same algorithm with other FP32 roundings (dot products, row sums) and tie rules (S16, n,
    // N): a few BF16 outputs move by about one ulp, the LSE by FP32 rounding
    let lens = vec![2000i64, 513, 37];
    let (p, x) = mla_inputs(3, 2, 2000, 16, 576, 512, 1.0, Some(lens), true, 48);
    let settings = |arithmetic| KernelSettings {
        block_k: 512,
        compensation: true,
        preload: PreloadPipeline::amla_default(),
        arithmetic,
    };
    let (co, cl) = to_tensors(&p, run(&p, &x, &settings(Arithmetic::CoreEmulation)));
    let kernel = Arithmetic::Kernel(RowSumOrder::Halving);
    let (ko, kl) = to_tensors(&p, run(&p, &x, &settings(kernel)));
    let differ = co
        .data
        .iter()
        .zip(&ko.data)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let max_o = co.data.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let max_diff = co
        .data
        .iter()
        .zip(&ko.data)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    let max_lse = cl
        .data
        .iter()
        .zip(&kl.data)
        .filter(|(a, _)| a.is_finite())
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!(
        "core vs kernel order: {differ} of {} BF16 outputs differ, max |diff| {max_diff:.2e} \
         (max |O| {max_o:.2e}), LSE max |diff| {max_lse:.2e}",
        co.data.len()
    );
    assert!(
        differ > 0,
        "identical outputs would mean the order switch is dead"
    );
    // one BF16 ulp at the largest output
    assert!(
        max_diff <= max_o * (1.0 / 128.0),
        "{max_diff} vs max |O| {max_o}"
    );
    assert!(max_lse <= 1e-5, "LSE differs by {max_lse}");
}
