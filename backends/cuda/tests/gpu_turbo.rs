//! Tests of TurboAttention on CUDA (`ferrattn_cuda::turbo`, `cuda-kernels/turbo_*.cu`).
//!
//! Host tests (every machine): the closed list of kernels and configurations, the packing and
//! slot layouts the kernels assume (mirrored formulas against the core's packing), the decode
//! plan over the core's Lean iteration space, and the CPU twin of the split decode against the
//! emulation (bit for bit with one unit (warp) per output tile) and the f64 golden reference.
//!
//! GPU tests (print `SKIPPED <test>: <reason>` and pass without a GPU): against
//! `ferrattn_core::turbo`, the CPU emulation that defines correctness —
//! - integer paths bit for bit: the whole compressed cache (codes, channel scales and zero
//!   points, block scales, INT8 buffer and universal scales) after prefill, appends and flushes;
//! - floats: O within 1e-3 relative Frobenius error of the emulation (the kernels are written to
//!   match it bit for bit; the number of differing elements is printed and, with SAS on and one
//!   unit per tile, asserted to be zero), LSE within 1e-4;
//! - against the f64 golden: no worse than the emulation's own error by more than 10%;
//! - outputs poisoned with NaN before every launch: no NaN may survive.
//!
//! Sizes: `FERRATTN_GPU_TEST_SCALE=small` keeps only small cases (compute-sanitizer).

use ferrattn_core::backend::{Device, TurboAttention};
use ferrattn_core::turbo::quant::unpack_codes;
use ferrattn_core::turbo::{self, KvBits, TurboConfig, TurboKvCache};
use ferrattn_core::{
    golden, plan, Algorithm, AttentionInputs, AttentionOutput, AttentionProblem, Comparison, DType,
    DeviceCaps, Tensor,
};
use ferrattn_cuda::turbo::{
    check_supported, code_layout, decode_twin, plan_decode, DecodeSchedule, DECODE_ROWS,
    TURBO_BLOCK,
};
use ferrattn_cuda::{kernels, CudaBackend, CudaError, Options};
use rand::{rngs::StdRng, Rng, SeedableRng};

// ---- helpers -----------------------------------------------------------------------------------

mod common;
use common::{backend, small_only};

/// Q, K, V of LLM-like statistics (the core's `llm_like_inputs`: outlier key channels in every
/// other head) rounded to `dtype`, with the padding past each sequence's length set to large
/// values: a kernel that reads padding changes a scale and shows up in the comparisons.
fn inputs(p: &AttentionProblem, seed: u64) -> AttentionInputs {
    let mut x = turbo::llm_like_inputs(p, seed);
    let round = |t: &mut Tensor| t.data.iter_mut().for_each(|v| *v = p.dtype.round(*v));
    round(&mut x.q);
    round(&mut x.k);
    round(x.v.as_mut().unwrap());
    for b in 0..p.batch {
        for i in p.seqlens_q[b]..p.max_seqlen_q {
            for h in 0..p.heads_q {
                x.q.row4_mut(b, i, h).iter_mut().for_each(|v| *v = 3000.0);
            }
        }
        for j in p.seqlens_k[b]..p.max_seqlen_k {
            for h in 0..p.heads_kv {
                x.k.row4_mut(b, j, h).iter_mut().for_each(|v| *v = -3000.0);
                x.v.as_mut()
                    .unwrap()
                    .row4_mut(b, j, h)
                    .iter_mut()
                    .for_each(|v| *v = 3000.0);
            }
        }
    }
    x.seqlens_q = Some(p.seqlens_q.iter().map(|&l| l as i64).collect());
    x.seqlens_k = Some(p.seqlens_k.iter().map(|&l| l as i64).collect());
    x
}

#[allow(clippy::too_many_arguments)] // the shape of one test case
fn problem(
    lq: &[usize],
    lk: &[usize],
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
    causal: bool,
) -> AttentionProblem {
    let mut p = AttentionProblem::uniform(
        lq.len(),
        *lq.iter().max().unwrap(),
        *lk.iter().max().unwrap(),
        hq,
        hk,
        d,
        d,
        dtype,
    );
    p.seqlens_q = lq.to_vec();
    p.seqlens_k = lk.to_vec();
    p.causal = causal;
    p
}

fn differing_bits(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// How closely a kernel follows the emulation.
#[derive(Clone, Copy, PartialEq)]
enum Follows {
    /// Every step: O bit for bit, LSE up to `logf`'s last bit.
    Bits,
    /// Every integer step, f32 steps possibly reordered: O within 1e-3, LSE within 1e-4.
    Steps,
    /// As `Steps`, but a P code may land one step apart where P / s_P is within an ulp or two
    /// of a half-integer (the warpgroup-MMA prefill multiplies by 1 / s_P). One such flip moves
    /// that row's `ln l` by at most about 1/119 (the row's largest code in the tile holding its
    /// maximum is >= 119), so LSE is held to 1e-3 relative (the bound) and 1e-2 absolute.
    Codes,
}

/// The default backend and one with `exact_turbo_prefill` and `exact_turbo_decode` (both
/// poisoning outputs), or `None` after printing why the test is skipped.
fn default_and_exact(test: &str) -> Option<(CudaBackend, CudaBackend)> {
    let exact = Options {
        exact_turbo_prefill: true,
        exact_turbo_decode: true,
        ..Options::default()
    };
    Some((backend(test, Options::default())?, backend(test, exact)?))
}

/// How a prefill of `b` follows the emulation: the mma.sync kernel step by step, the wgmma
/// kernel up to P codes at rounding boundaries.
fn prefill_follows(b: &CudaBackend) -> Follows {
    if b.turbo_prefill_is_exact() {
        Follows::Steps
    } else {
        Follows::Codes
    }
}

/// GPU output against the emulation's: no NaN, O within 1e-3 relative (and bit for bit under
/// `Follows::Bits`), LSE as `follows` says; returns the number of O elements whose bits differ.
fn check_vs_emulation(
    what: &str,
    emu: &AttentionOutput,
    gpu: &AttentionOutput,
    exact: bool,
) -> usize {
    check_following(
        what,
        emu,
        gpu,
        if exact { Follows::Bits } else { Follows::Steps },
    )
}

fn check_following(
    what: &str,
    emu: &AttentionOutput,
    gpu: &AttentionOutput,
    follows: Follows,
) -> usize {
    assert!(
        gpu.o.data.iter().all(|v| !v.is_nan()),
        "{what}: NaN in O (an output element was not written)"
    );
    assert!(
        gpu.lse.data.iter().all(|v| !v.is_nan()),
        "{what}: NaN in LSE (an output element was not written)"
    );
    let c = Comparison::f32(&emu.o.data, &gpu.o.data);
    let l = Comparison::f32(&emu.lse.data, &gpu.lse.data);
    let diff = differing_bits(&emu.o.data, &gpu.o.data);
    eprintln!(
        "{what}: O vs emulation {c}, {diff} of {} elements differ in bits; LSE max abs {:.2e}",
        c.len, l.max_abs
    );
    assert_eq!(
        c.non_finite_mismatch, None,
        "{what}: O non-finite placement differs"
    );
    assert_eq!(
        l.non_finite_mismatch, None,
        "{what}: LSE -inf placement (rows without keys) differs"
    );
    assert!(c.rel_fro <= 1e-3, "{what}: O vs emulation {c}");
    if follows == Follows::Codes {
        assert!(
            l.rel_fro <= 1e-3 && l.max_abs <= 1e-2,
            "{what}: LSE vs emulation {l}"
        );
    } else {
        assert!(l.max_abs <= 1e-4, "{what}: LSE vs emulation {l}");
    }
    if follows == Follows::Bits {
        assert_eq!(diff, 0, "{what}: O should equal the emulation bit for bit");
    }
    diff
}

/// Relative Frobenius error of O against the f64 golden; the GPU's may exceed the emulation's
/// by at most 10%.
fn check_vs_golden(
    what: &str,
    p: &AttentionProblem,
    x: &AttentionInputs,
    emu: &AttentionOutput,
    gpu: &AttentionOutput,
) {
    let gold = golden::exact_attention(p, x);
    let e = Comparison::f32(&gold.o.data, &emu.o.data).rel_fro;
    let g = Comparison::f32(&gold.o.data, &gpu.o.data).rel_fro;
    eprintln!("{what}: vs golden: emulation {e:.4e}, gpu {g:.4e}");
    assert!(
        g <= 1.1 * e + 1e-7,
        "{what}: GPU error vs golden {g:.4e} exceeds the emulation's {e:.4e} by more than 10%"
    );
}

/// The fast decode contract (`Options::fast_turbo_decode`, docs/TURBO_CUDA.md): O within this
/// relative Frobenius error of the bit-exact result (the emulation, or the CPU twin of a
/// stream-K split; the bound the twin test holds a split to), LSE within `FAST_LSE_ABS`; against
/// the f64 golden no worse than the bit-exact result by more than 10% (asserted over all steps
/// of a case in `decode_steps`, and per row of the accuracy table). Why these: the fast kernel
/// replaces SAS by e^x, and SAS is within [-1.03e-3, +2.3e-4] of e^x relative, once per key and
/// once per move of a row's running maximum (a rescale), so a row's l (hence LSE) moves by about
/// 1e-3 per maximum move, and O by the spread of those factors over its keys.
const FAST_O_REL: f64 = 2e-2;
const FAST_LSE_ABS: f64 = 1e-2;

/// A fast-contract output against the bit-exact one; returns (O relative Frobenius error, LSE
/// max abs error).
fn check_fast(what: &str, exact: &AttentionOutput, gpu: &AttentionOutput) -> (f64, f64) {
    assert!(
        gpu.o.data.iter().all(|v| !v.is_nan()) && gpu.lse.data.iter().all(|v| !v.is_nan()),
        "{what}: NaN in the fast output (an element was not written)"
    );
    let c = Comparison::f32(&exact.o.data, &gpu.o.data);
    let l = Comparison::f32(&exact.lse.data, &gpu.lse.data);
    assert_eq!(
        c.non_finite_mismatch, None,
        "{what}: O non-finite placement differs"
    );
    assert_eq!(
        l.non_finite_mismatch, None,
        "{what}: LSE -inf placement (rows without keys) differs"
    );
    assert!(
        c.rel_fro <= FAST_O_REL,
        "{what}: fast O vs the bit-exact result {c}"
    );
    assert!(
        l.max_abs <= FAST_LSE_ABS,
        "{what}: fast LSE vs the bit-exact result {l}"
    );
    (c.rel_fro, l.max_abs)
}

/// The first difference between two caches, in words (None when equal).
fn cache_diff(a: &TurboKvCache, b: &TurboKvCache) -> Option<String> {
    if a == b {
        return None;
    }
    if (
        a.head_dim,
        a.heads_kv,
        a.block_tokens,
        &a.bits,
        a.seqs.len(),
    ) != (
        b.head_dim,
        b.heads_kv,
        b.block_tokens,
        &b.bits,
        b.seqs.len(),
    ) {
        return Some(format!(
            "shape/bits differ: {:?} vs {:?}",
            (
                a.head_dim,
                a.heads_kv,
                a.block_tokens,
                &a.bits,
                a.seqs.len()
            ),
            (
                b.head_dim,
                b.heads_kv,
                b.block_tokens,
                &b.bits,
                b.seqs.len()
            )
        ));
    }
    for (s, (sa, sb)) in a.seqs.iter().zip(&b.seqs).enumerate() {
        for (which, (ta, tb)) in [("k", (&sa.k, &sb.k)), ("v", (&sa.v, &sb.v))] {
            for h in 0..a.heads_kv {
                let (x, y) = (&ta[h], &tb[h]);
                if x.blocks.len() != y.blocks.len() {
                    return Some(format!(
                        "seq {s} {which} head {h}: {} vs {} blocks",
                        x.blocks.len(),
                        y.blocks.len()
                    ));
                }
                for (j, (bx, by)) in x.blocks.iter().zip(&y.blocks).enumerate() {
                    if bx != by {
                        let ch = bx
                            .channels
                            .iter()
                            .zip(&by.channels)
                            .position(|(p, q)| p != q);
                        let code = bx.packed.iter().zip(&by.packed).position(|(p, q)| p != q);
                        return Some(format!(
                            "seq {s} {which} head {h} block {j}: scale {:e} vs {:e}, first channel param diff {ch:?}, first code byte diff {code:?}",
                            bx.int8_scale, by.int8_scale
                        ));
                    }
                }
                if x.buffer != y.buffer {
                    let code = x
                        .buffer
                        .codes
                        .iter()
                        .zip(&y.buffer.codes)
                        .position(|(p, q)| p != q);
                    return Some(format!(
                        "seq {s} {which} head {h} buffer: scale {:?} vs {:?}, tokens {} vs {}, first code diff {code:?}",
                        x.buffer.scale, y.buffer.scale, x.buffer.tokens, y.buffer.tokens
                    ));
                }
            }
        }
    }
    Some("caches differ".into())
}

fn assert_cache_eq(what: &str, emu: &TurboKvCache, gpu: &TurboKvCache) {
    if let Some(d) = cache_diff(emu, gpu) {
        panic!("{what}: device cache differs from the emulation's: {d}");
    }
}

fn cfg_with(bits: KvBits, sas: bool) -> TurboConfig {
    TurboConfig {
        kv_bits: bits,
        sas,
        ..TurboConfig::default()
    }
}

// ---- host tests --------------------------------------------------------------------------------

#[test]
fn turbo_kernel_selection_is_a_closed_list() {
    let n = kernels::turbo_kernel_names(DType::BF16, 128).unwrap();
    assert_eq!(n.prefill, "turbo_prefill_bf16_d128");
    assert_eq!(n.decode, "turbo_decode_bf16_d128");
    assert_eq!(n.flush, "turbo_flush_d128");
    assert_eq!(
        kernels::turbo_kernel_names(DType::F16, 64)
            .unwrap()
            .quant_kv,
        "turbo_quant_kv_f16_d64"
    );
    for (dt, d) in [
        (DType::F32, 128),
        (DType::F16, 96),
        (DType::BF16, 256),
        (DType::F16, 32),
    ] {
        assert!(
            matches!(
                kernels::turbo_kernel_names(dt, d),
                Err(CudaError::Unsupported { .. })
            ),
            "{dt} d{d}"
        );
    }
    // every selectable name is instantiated by the embedded sources
    let pre = kernels::image("turbo_prefill").expect("turbo_prefill embedded");
    let dec = kernels::image("turbo_decode").expect("turbo_decode embedded");
    for src in [pre.source, dec.source] {
        assert!(
            !src.contains("#include \"common.cuh\"")
                && !src.contains("#include \"turbo_common.cuh\""),
            "headers inlined for NVRTC"
        );
        assert!(src.contains("namespace turbo"));
    }
    for (tn, t) in [("f16", "F16"), ("bf16", "BF16")] {
        for d in [64, 128] {
            assert!(pre
                .source
                .contains(&format!("FERRATTN_TURBO_PREFILL({tn}, {t}, {d})")));
            assert!(dec
                .source
                .contains(&format!("FERRATTN_TURBO_DECODE({tn}, {t}, {d})")));
        }
    }
    for d in [64, 128] {
        assert!(dec.source.contains(&format!("turbo_flush_d{d}(")));
    }
    if let (Some(fp), Some(fd)) = (pre.fatbin, dec.fatbin) {
        let (hp, hd) = (String::from_utf8_lossy(fp), String::from_utf8_lossy(fd));
        for dt in [DType::F16, DType::BF16] {
            for d in [64, 128] {
                let n = kernels::turbo_kernel_names(dt, d).unwrap();
                for name in [&n.quant_kv, &n.buffer_tail, &n.prefill] {
                    assert!(hp.contains(name.as_str()), "{name} missing from the fatbin");
                }
                for name in [
                    &n.decode,
                    &n.decode_g4,
                    &n.decode_fast,
                    &n.decode_g4_fast,
                    &n.decode_g4_fast_mixed,
                    &n.combine,
                    &n.append,
                    &n.flush,
                ] {
                    assert!(hd.contains(name.as_str()), "{name} missing from the fatbin");
                }
            }
        }
    }
}

#[test]
fn turbo_unsupported_configurations_name_the_supported_list() {
    let ok = TurboConfig::default();
    check_supported(&ok, DType::BF16, 128).expect("the paper's settings are supported");
    check_supported(&cfg_with(KvBits::Int2, false), DType::F16, 64).expect("2-bit, SAS off");
    let small = TurboConfig {
        block_q: 32,
        block_k: 32,
        buffer_tokens: 32,
        ..ok.clone()
    };
    match check_supported(&small, DType::F16, 128) {
        Err(CudaError::Unsupported { what, supported }) => {
            assert!(what.contains("B_r = 32"), "{what}");
            assert!(supported.contains("64"), "{supported}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert!(matches!(
        check_supported(&ok, DType::F16, 96),
        Err(CudaError::Unsupported { .. })
    ));
    assert!(matches!(
        check_supported(&ok, DType::F32, 128),
        Err(CudaError::Unsupported { .. })
    ));
    let bad = TurboConfig {
        sas_threshold: -40,
        ..ok
    };
    assert!(matches!(
        check_supported(&bad, DType::F16, 128),
        Err(CudaError::Core(_))
    ));
}

/// `slot_key` of turbo_common.cuh, mirrored.
fn slot_key(slot: usize) -> usize {
    let s = slot & 15;
    (slot & !15) + 2 * (s >> 2) + (s & 1) + 8 * ((s >> 1) & 1)
}

/// The slot order of P and V^T: P's INT8 codes go from the QK^T accumulator to the A
/// registers of the PV MMA without a shuffle exactly when slot `4t + i` (byte `i` of lane
/// `t`'s A register, PTX ISA m16n8k32 A layout: k = 4t + i) holds the key that lane `t`'s
/// accumulator holds there (C layout: n8 tile `i / 2`, column `2t + i % 2`).
#[test]
fn turbo_slot_order_matches_the_mma_fragment_layouts() {
    for t in 0..4 {
        for i in 0..4 {
            let acc_key = 8 * (i / 2) + 2 * t + i % 2;
            assert_eq!(slot_key(4 * t + i), acc_key);
            assert_eq!(
                slot_key(16 + 4 * t + i),
                16 + acc_key,
                "second half of a k32 slice"
            );
        }
    }
    // a permutation of each 16-key group
    let mut seen: Vec<usize> = (0..64).map(slot_key).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..64).collect::<Vec<_>>());
    // the decode kernel stores S of key 16w + 8n + 2t + e at slot 16w + 4t + 2n + e
    for w in 0..4 {
        for n in 0..2 {
            for t in 0..4 {
                for e in 0..2 {
                    assert_eq!(
                        slot_key(16 * w + 4 * t + 2 * n + e),
                        16 * w + 8 * n + 2 * t + e
                    );
                }
            }
        }
    }
}

/// The words the kernels write (compress_block: one u32 holds 32 / bits consecutive codes of a
/// token row, code i at bit i * bits) and read (dequant8: channels 8 c8 .. 8 c8 + 7 of a token
/// at byte 4 c8 for INT4, 2 c8 for INT2) are the core's packing, byte for byte.
#[test]
fn turbo_packing_words_are_the_core_layout() {
    use ferrattn_core::turbo::quant::pack_codes;
    let mut rng = StdRng::seed_from_u64(7);
    for d in [64usize, 128] {
        for bits in [2u8, 4] {
            let codes: Vec<u8> = (0..TURBO_BLOCK * d)
                .map(|_| rng.gen_range(0..(1u8 << bits)))
                .collect();
            let per_word = 32 / bits as usize;
            let mut bytes = Vec::new();
            for w in 0..codes.len() / per_word {
                let mut word = 0u32;
                for i in 0..per_word {
                    word |= (codes[w * per_word + i] as u32) << (i * bits as usize);
                }
                bytes.extend_from_slice(&word.to_le_bytes());
            }
            assert_eq!(bytes, pack_codes(&codes, bits), "d {d} bits {bits}");
            // the kernel's read of 8 channels
            let row_bytes = d * bits as usize / 8;
            for tok in [0usize, 17, 63] {
                for c8 in 0..d / 8 {
                    let at = tok * row_bytes + c8 * bits as usize;
                    let w = if bits == 4 {
                        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
                    } else {
                        u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap()) as u32
                    };
                    for i in 0..8usize {
                        let code = ((w >> (i as u32 * bits as u32)) & ((1 << bits) - 1)) as u8;
                        assert_eq!(code, codes[tok * d + 8 * c8 + i]);
                    }
                }
            }
            assert_eq!(unpack_codes(&bytes, bits, codes.len()), codes);
        }
    }
}

#[test]
fn turbo_device_cache_layout_gives_each_head_its_own_width() {
    let (off, seq) = code_layout(128, &[4, 2, 2, 4], 10);
    let blk4 = 64 * 128 / 2;
    let blk2 = 64 * 128 / 4;
    assert_eq!(
        off,
        vec![
            0,
            10 * blk4 as u64,
            10 * (blk4 + blk2) as u64,
            10 * (blk4 + 2 * blk2) as u64
        ]
    );
    assert_eq!(seq, 10 * (2 * blk4 + 2 * blk2) as u64);
    // every offset is 16-byte aligned (cp.async)
    assert!(off.iter().all(|o| o % 16 == 0));
}

#[test]
fn turbo_decode_plan_covers_every_cache_tile_once() {
    let lens = [0usize, 1, 64, 65, 700, 4096];
    let q_tok = [0, 0, 0, -1, 0, 0];
    for sched in [
        DecodeSchedule::PerTile,
        DecodeSchedule::StreamK(7),
        DecodeSchedule::StreamK(132 * 4),
    ] {
        for (hq, hk) in [(8usize, 2usize), (40, 2), (4, 4)] {
            let pl = plan_decode(&lens, &q_tok, hq, hk, sched).unwrap();
            assert_eq!(pl.lens[3], 0, "a sequence not decoded is planned as empty");
            assert_eq!(pl.qgroups, (hq / hk).div_ceil(DECODE_ROWS));
            assert_eq!(*pl.tile_slot.last().unwrap() as usize, pl.slots());
            for t in 0..pl.num_tiles() {
                let segs = &pl.segments[pl.tile_slot[t] as usize..pl.tile_slot[t + 1] as usize];
                assert!(!segs.is_empty());
                let mut at = 0;
                for s in segs {
                    assert_eq!(s.tile, t);
                    assert_eq!(s.local_begin, at);
                    at = s.local_end;
                }
                let (b, _, _) = pl.space.tile_coords(t);
                assert_eq!(
                    at as usize,
                    pl.lens[b].div_ceil(64).max(1),
                    "tile {t} covered"
                );
            }
            for g in 0..pl.num_ctas() {
                assert_eq!(
                    pl.segments[pl.cta_slot[g] as usize].cta, g,
                    "unit {g}'s first slot"
                );
            }
            if sched == DecodeSchedule::PerTile {
                assert_eq!(pl.num_ctas(), pl.num_tiles());
                assert_eq!(pl.slots(), pl.num_tiles());
            }
        }
    }
}

#[test]
fn turbo_auto_decode_schedule_fills_the_gpu_without_starving_units() {
    use ferrattn_cuda::turbo::{
        decode_units, DECODE_COSTS, DECODE_ITERS_PER_UNIT, DECODE_MIN_ITERS_PER_UNIT,
    };
    let resident = 132 * 3 * 4;
    let bal = |units| DecodeSchedule::Balanced {
        units,
        costs: DECODE_COSTS,
    };
    // enough output tiles: the emulation's order, one unit per tile
    assert_eq!(
        decode_units(resident, 2000, 1 << 20),
        DecodeSchedule::PerTile
    );
    // a large cache: every resident unit, cut by cost
    assert_eq!(decode_units(resident, 256, 131_072), bal(resident));
    assert_eq!(decode_units(resident, 512, 32_768), bal(resident));
    // 4 x 16k: DECODE_ITERS_PER_UNIT cache tiles a unit, at least half the resident units
    assert_eq!(
        decode_units(resident, 32, 8192),
        bal((8192 / DECODE_ITERS_PER_UNIT) as usize)
    );
    // a small one (batch 1 at 16k): 8 a unit would leave SMs idle, so DECODE_MIN_ITERS_PER_UNIT;
    // never fewer units than output tiles
    assert_eq!(
        decode_units(resident, 8, 2048),
        bal((2048 / DECODE_MIN_ITERS_PER_UNIT) as usize)
    );
    assert_eq!(decode_units(resident, 40, 80), bal(40));
    // unknown iteration count (turbo_auto_schedule): every resident unit
    assert_eq!(decode_units(resident, 8, u64::MAX), bal(resident));
}

/// Context + decode problem for the twin tests: a cache built from `ctx` tokens and one query.
fn decode_case(
    lens: &[usize],
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
    bits: KvBits,
    seed: u64,
) -> (
    TurboConfig,
    TurboKvCache,
    Tensor,
    AttentionProblem,
    AttentionInputs,
) {
    let cfg = cfg_with(bits, true);
    let p = problem(&vec![1; lens.len()], lens, hq, hk, d, dtype, false);
    let x = inputs(&p, seed);
    let cache = TurboKvCache::from_context(&cfg, &x.k, x.v.as_ref().unwrap(), lens).unwrap();
    let q = x.q.seq_range(0, 1);
    (cfg, cache, q, p, x)
}

/// Compressed blocks of `cache` in which some channel's largest code can decode above 127
/// (`scale x (2^bits - 1) + zero > 127`): the decode kernel takes its clamping dequantization
/// path for those tiles (turbo_decode.cu, `dq4<true>`).
fn clamped_blocks(cache: &TurboKvCache) -> usize {
    cache
        .seqs
        .iter()
        .flat_map(|s| s.k.iter().chain(&s.v))
        .flat_map(|t| &t.blocks)
        .filter(|b| {
            // the decode's clamp flag (CacheView::clamp): some code dequantizes past 127
            let d = b.channels.len();
            unpack_codes(&b.packed, b.bits, b.tokens * d)
                .iter()
                .enumerate()
                .any(|(i, &code)| {
                    let c = b.channels[i % d];
                    code as i32 * c.scale as i32 + c.zero as i32 > 127
                })
        })
        .count()
}

/// The inputs of a decode-steps case: the whole sequences (`ctx[b] + steps` tokens, seed 77) and
/// their first `ctx[b]` tokens as a problem of its own (the context to prefill).
fn steps_inputs(
    ctx: &[usize],
    steps: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
) -> (
    AttentionProblem,
    AttentionInputs,
    AttentionProblem,
    AttentionInputs,
) {
    let total: Vec<usize> = ctx.iter().map(|&c| c + steps).collect();
    let pfull = problem(&total, &total, hq, hk, d, dtype, true);
    let x = inputs(&pfull, 77);
    let pctx = problem(ctx, ctx, hq, hk, d, dtype, true);
    let max_ctx = pctx.max_seqlen_k;
    let mut cx = AttentionInputs::new(
        prefix(&x.q, max_ctx),
        prefix(&x.k, max_ctx),
        prefix(x.v.as_ref().unwrap(), max_ctx),
    );
    cx.seqlens_q = Some(ctx.iter().map(|&l| l as i64).collect());
    cx.seqlens_k = cx.seqlens_q.clone();
    (pfull, x, pctx, cx)
}

/// The cache the emulation holds after prefilling `ctx` tokens per sequence and `steps` decode
/// steps of the inputs `decode_steps` uses.
#[allow(clippy::too_many_arguments)] // the shape of one test case
fn emulated_steps_cache(
    ctx: &[usize],
    steps: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
    bits: KvBits,
) -> TurboKvCache {
    let cfg = cfg_with(bits, true);
    let (pfull, x, pctx, cx) = steps_inputs(ctx, steps, hq, hk, d, dtype);
    let v = x.v.as_ref().unwrap();
    let (_, mut cache) = turbo::prefill(&cfg, &pctx, &cx).unwrap();
    for s in 0..steps {
        let idx: Vec<usize> = ctx.iter().map(|&c| c + s).collect();
        let (q, kn, vn) = (
            tokens_at(&x.q, &idx),
            tokens_at(&x.k, &idx),
            tokens_at(v, &idx),
        );
        turbo::decode_step(&cfg, &mut cache, &q, &kn, &vn, pfull.softmax_scale).unwrap();
    }
    cache
}

#[test]
fn turbo_decode_steps_exercise_both_dequantization_paths() {
    // the GPU per-tile steps test: blocks flushed from the INT8 buffer (codes up to 127 under
    // the universal scale) need the clamp, prefilled blocks (codes within 119) never do
    let cache = emulated_steps_cache(
        &[100, 63, 1, 130],
        70,
        8,
        2,
        128,
        DType::BF16,
        KvBits::Mixed {
            two_bit_fraction: 0.5,
        },
    );
    let blocks: usize = cache
        .seqs
        .iter()
        .flat_map(|s| s.k.iter().chain(&s.v))
        .map(|t| t.blocks.len())
        .sum();
    let clamped = clamped_blocks(&cache);
    eprintln!("{clamped} of {blocks} blocks take the clamping path");
    assert!(clamped > 0 && clamped < blocks);
}

#[test]
fn turbo_twin_with_one_cta_per_tile_is_the_emulation_bit_for_bit() {
    let lens = [0usize, 1, 63, 64, 65, 300];
    let (cfg, cache, q, p, _) = decode_case(
        &lens,
        8,
        2,
        64,
        DType::BF16,
        KvBits::Mixed {
            two_bit_fraction: 0.5,
        },
        11,
    );
    let emu = turbo::decode(&cfg, &cache, &q, p.softmax_scale).unwrap();
    let pl = plan_decode(&lens, &vec![0; lens.len()], 8, 2, DecodeSchedule::PerTile).unwrap();
    let (mut o, mut lse) = (
        Tensor::zeros(&emu.o.shape, DType::BF16),
        Tensor::zeros(&emu.lse.shape, DType::F32),
    );
    decode_twin(&cfg, &cache, &pl, &q, p.softmax_scale, &mut o, &mut lse);
    assert_eq!(differing_bits(&emu.o.data, &o.data), 0);
    assert_eq!(differing_bits(&emu.lse.data, &lse.data), 0);
}

#[test]
fn turbo_twin_stream_k_is_close_to_the_emulation_and_as_good_against_golden() {
    let lens = [40usize, 777, 2048, 130];
    let (cfg, cache, q, p, x) = decode_case(&lens, 16, 4, 128, DType::F16, KvBits::Int4, 12);
    let scale = p.softmax_scale;
    let emu = turbo::decode(&cfg, &cache, &q, scale).unwrap();
    // golden: the query against every cached token
    let gold = golden::exact_attention(&p, &x);
    let e_emu = Comparison::f32(&gold.o.data, &emu.o.data).rel_fro;
    for ctas in [3usize, 7, 50, 528] {
        let pl = plan_decode(&lens, &[0; 4], 16, 4, DecodeSchedule::StreamK(ctas)).unwrap();
        let (mut o, mut lse) = (
            Tensor::zeros(&emu.o.shape, DType::F16),
            Tensor::zeros(&emu.lse.shape, DType::F32),
        );
        decode_twin(&cfg, &cache, &pl, &q, scale, &mut o, &mut lse);
        let c = Comparison::f32(&emu.o.data, &o.data);
        let e = Comparison::f32(&gold.o.data, &o.data).rel_fro;
        eprintln!("stream-K {ctas} CTAs ({} segments): vs emulation {c}; vs golden {e:.4e} (emulation {e_emu:.4e})", pl.slots());
        // splitting changes which tile maximum each P~ is quantized against: the difference is
        // the INT8 rounding of P (step 1/119 of a tile maximum), not a bias
        assert!(c.rel_fro <= 0.02 && c.cosine >= 0.9998, "{c}");
        assert!(
            e <= 1.1 * e_emu,
            "stream-K error vs golden {e:.4e}, emulation {e_emu:.4e}"
        );
        // LSE: a split applies SAS's threshold (Eq. 14) against each segment's own running
        // maximum, so it drops fewer small keys than the sequential emulation; both are
        // TurboAttention's approximation, judged against the exact LSE
        let (lt, le, lg) = (
            Comparison::f32(&emu.lse.data, &lse.data),
            Comparison::f32(&gold.lse.data, &emu.lse.data),
            Comparison::f32(&gold.lse.data, &lse.data),
        );
        eprintln!("  LSE vs emulation {lt}; vs golden: twin {lg}, emulation {le}");
        assert!(
            lg.rel_fro <= 1.1 * le.rel_fro,
            "LSE vs golden: twin {lg}, emulation {le}"
        );
    }
}

// ---- GPU tests ---------------------------------------------------------------------------------

struct PrefillCase {
    lq: Vec<usize>,
    lk: Vec<usize>,
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
    causal: bool,
    bits: KvBits,
}

fn prefill_cases() -> Vec<PrefillCase> {
    let mut v = Vec::new();
    let mixed = KvBits::Mixed {
        two_bit_fraction: 0.5,
    };
    for &d in &[64usize, 128] {
        for &dtype in &[DType::F16, DType::BF16] {
            for &causal in &[false, true] {
                // ragged, lengths off tile boundaries, Sq != Sk both ways, an empty sequence
                v.push(PrefillCase {
                    lq: vec![37, 65, 1, 0],
                    lk: vec![37, 65, 130, 5],
                    hq: 8,
                    hk: 2,
                    d,
                    dtype,
                    causal,
                    bits: mixed.clone(),
                });
                v.push(PrefillCase {
                    lq: vec![577, 64],
                    lk: vec![300, 63],
                    hq: 4,
                    hk: 4,
                    d,
                    dtype,
                    causal,
                    bits: KvBits::Int4,
                });
            }
        }
    }
    v.push(PrefillCase {
        lq: vec![129],
        lk: vec![129],
        hq: 8,
        hk: 1,
        d: 128,
        dtype: DType::BF16,
        causal: true,
        bits: KvBits::Int2,
    });
    if !small_only() {
        v.push(PrefillCase {
            lq: vec![1000, 700],
            lk: vec![1000, 4097],
            hq: 16,
            hk: 4,
            d: 128,
            dtype: DType::BF16,
            causal: true,
            bits: mixed.clone(),
        });
        v.push(PrefillCase {
            lq: vec![4097],
            lk: vec![4097],
            hq: 4,
            hk: 2,
            d: 64,
            dtype: DType::F16,
            causal: false,
            bits: KvBits::Int4,
        });
    } else {
        v.truncate(3);
    }
    v
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_prefill_matches_the_emulation() {
    let name = "gpu_turbo_prefill_matches_the_emulation";
    let Some((fast, exact)) = default_and_exact(name) else {
        return;
    };
    // the default kernel (warpgroup MMA on sm_90), then the bit-exact mma.sync one
    for (kernel, b) in [("default", &fast), ("exact", &exact)] {
        let mut total_diff = 0;
        let mut total = 0;
        for (i, c) in prefill_cases().into_iter().enumerate() {
            let p = problem(&c.lq, &c.lk, c.hq, c.hk, c.d, c.dtype, c.causal);
            let x = inputs(&p, 100 + i as u64);
            let cfg = cfg_with(c.bits.clone(), true);
            let what = format!(
                "{kernel} prefill #{i} lq {:?} lk {:?} hq {} hk {} d {} {} causal {} {:?}",
                c.lq, c.lk, c.hq, c.hk, c.d, c.dtype, c.causal, c.bits
            );
            if kernel == "default" {
                // the fast contract's paths of this case's query blocks (the twin's choice)
                eprintln!("{what}: {:?}", turbo::fixed_p_paths(&cfg, &p, &x));
            }
            let (emu, emu_cache) = turbo::prefill(&cfg, &p, &x).unwrap();
            let (gpu, gpu_cache) = b.turbo_prefill(&cfg, &p, &x, 70).unwrap();
            assert_cache_eq(&what, &emu_cache, &gpu_cache.download().unwrap());
            assert_eq!(
                gpu_cache.memory(),
                emu_cache.memory(),
                "{what}: memory accounting"
            );
            let follows = match (kernel, b.turbo_prefill_is_exact()) {
                ("exact", _) => Follows::Bits,
                (_, true) => Follows::Steps,
                _ => Follows::Codes,
            };
            total_diff += check_following(&what, &emu, &gpu, follows);
            total += emu.o.data.len();
            check_vs_golden(&what, &p, &x, &emu, &gpu);
        }
        eprintln!(
            "{kernel} prefill: {total_diff} of {total} O elements differ in bits from the emulation over all cases"
        );
    }
}

fn fast_backend(test: &str) -> Option<CudaBackend> {
    backend(
        test,
        Options {
            fast_turbo_prefill: true,
            ..Options::default()
        },
    )
}

/// The fast-contract kernel (`turbo_prefill_wgf_*`) against its CPU twin
/// (`turbo::prefill_fixed_p`): O within 1e-3 relative Frobenius error and LSE within 1e-3
/// absolute (the kernel's ex2.approx against the twin's exp2 can move a u8 code by one where
/// 255 p lies at a rounding boundary); no NaN (outputs poisoned); against the f64 golden no
/// worse than the emulation by more than 10%; the cache is the emulation's bit for bit. Off
/// sm_90 the option falls back to the mma.sync kernel, which is held to the emulation instead.
fn check_fast_prefill(
    what: &str,
    b: &CudaBackend,
    cfg: &TurboConfig,
    p: &AttentionProblem,
    x: &AttentionInputs,
    reserve: usize,
) {
    let (emu, emu_cache) = turbo::prefill(cfg, p, x).unwrap();
    let (gpu, gpu_cache) = b.turbo_prefill(cfg, p, x, reserve).unwrap();
    assert_cache_eq(what, &emu_cache, &gpu_cache.download().unwrap());
    if !b.turbo_prefill_is_exact() {
        let twin = turbo::prefill_fixed_p(cfg, p, x).unwrap();
        assert!(
            gpu.o.data.iter().all(|v| !v.is_nan()) && gpu.lse.data.iter().all(|v| !v.is_nan()),
            "{what}: NaN in O or LSE (an output element was not written)"
        );
        let c = Comparison::f32(&twin.o.data, &gpu.o.data);
        let l = Comparison::f32(&twin.lse.data, &gpu.lse.data);
        let e = Comparison::f32(&emu.o.data, &gpu.o.data);
        eprintln!(
            "{what}: O vs fixed-P twin {c}, {} of {} differ in bits; LSE max abs {:.2e}; O vs emulation rel_fro {:.3e}",
            differing_bits(&twin.o.data, &gpu.o.data),
            c.len,
            l.max_abs,
            e.rel_fro
        );
        assert_eq!(
            c.non_finite_mismatch, None,
            "{what}: O non-finite placement differs"
        );
        assert_eq!(
            l.non_finite_mismatch, None,
            "{what}: LSE -inf placement differs"
        );
        assert!(c.rel_fro <= 1e-3, "{what}: O vs twin {c}");
        assert!(l.max_abs <= 1e-3, "{what}: LSE vs twin {l}");
    } else {
        check_following(what, &emu, &gpu, Follows::Steps);
    }
    check_vs_golden(what, p, x, &emu, &gpu);
}

/// V blocks of scales up to about 95x apart (round 8's INT32 path: per-tile units `s_u 2^-n`, n
/// up to 6, and the accumulator shifted left and right between them), non-causal over `lk` keys,
/// Q scaled by `q_scale` (1e-3: nearly flat rows, so `l` passes the guard's 2^(23 - 6) at
/// 2048 keys).
/// V block scales about 95x apart (round 8). `late`: tiles 0..33 take the small factors and the
/// largest (1.9) first comes at tile 34, past the kernel's table of 32 tiles (round 10: the
/// unit's move, `n` and the guard's `n_min` of tiles 32.. come from a refilled table).
fn spread_v_case(
    lk: usize,
    q_scale: f32,
    seed: u64,
    late: bool,
) -> (AttentionProblem, AttentionInputs) {
    let p = problem(&[128, 100], &[lk, lk - 37], 4, 2, 128, DType::BF16, false);
    let mut x = inputs(&p, seed);
    x.q.data
        .iter_mut()
        .for_each(|e| *e = p.dtype.round(*e * q_scale));
    let v = x.v.as_mut().unwrap();
    for b in 0..p.batch {
        for t in 0..p.seqlens_k[b] {
            let f = match (late, t / 64) {
                (true, j) if j < 34 => [0.3, 0.02, 0.1, 0.05, 0.6][j % 5],
                (true, j) => [1.9, 0.6, 0.02, 1.0][j % 4],
                (false, j) => [1.0, 0.02, 0.3, 1.9, 0.1, 1.0, 0.05, 0.6][j % 8],
            };
            for h in 0..p.heads_kv {
                v.row4_mut(b, t, h)
                    .iter_mut()
                    .for_each(|e| *e = p.dtype.round(*e * f));
            }
        }
    }
    (p, x)
}

/// The fast contract's CPU twin (`turbo::prefill_fixed_p`, which the kernel follows within
/// 1e-3) against the f64 golden on this file's prefill cases and its uneven-V-scale cases, on
/// the host (no GPU): no worse than the emulation by more than 10%, the bound
/// `check_fast_prefill` holds the kernel to. Round 7's INT32 path (an integer row reference:
/// the largest code of a row in 128..=255 instead of 255) must keep this.
#[test]
fn fast_prefill_twin_is_as_accurate_as_the_emulation_on_the_gpu_cases() {
    let mut worst = 0.0f64;
    let mut check = |what: &str, cfg: &TurboConfig, p: &AttentionProblem, x: &AttentionInputs| {
        let (emu, _) = turbo::prefill(cfg, p, x).unwrap();
        let twin = turbo::prefill_fixed_p(cfg, p, x).unwrap();
        let gold = golden::exact_attention(p, x);
        let e = Comparison::f32(&gold.o.data, &emu.o.data).rel_fro;
        let t = Comparison::f32(&gold.o.data, &twin.o.data).rel_fro;
        eprintln!(
            "{what}: vs golden: emulation {e:.4e}, twin {t:.4e} ({:.3})",
            t / e
        );
        worst = worst.max(t / e);
        assert!(
            t <= 1.1 * e + 1e-7,
            "{what}: twin error vs golden {t:.4e} exceeds the emulation's {e:.4e} by more than 10%"
        );
    };
    for (i, c) in prefill_cases().into_iter().enumerate() {
        let p = problem(&c.lq, &c.lk, c.hq, c.hk, c.d, c.dtype, c.causal);
        let x = inputs(&p, 100 + i as u64);
        check(
            &format!("case {i}"),
            &cfg_with(c.bits.clone(), true),
            &p,
            &x,
        );
    }
    for (seed, d, dtype, causal, scaled) in [
        (23, 128, DType::BF16, true, true),
        (24, 64, DType::F16, false, false),
    ] {
        let p = problem(&[300, 520], &[520, 520], 8, 2, d, dtype, causal);
        let mut x = inputs(&p, seed);
        let v = x.v.as_mut().unwrap();
        for b in 0..p.batch {
            for t in 0..p.seqlens_k[b] {
                let f = match (scaled, t / 64) {
                    (true, 1) => 1.6,
                    (true, 2) => 3.0,
                    (true, 4) => 0.0,
                    (true, 6) => 0.7,
                    (false, 1 | 4) => 2.5,
                    _ => 1.0,
                };
                for h in 0..p.heads_kv {
                    v.row4_mut(b, t, h)
                        .iter_mut()
                        .for_each(|e| *e = p.dtype.round(*e * f));
                }
            }
        }
        check(
            &format!("uneven V seed {seed}"),
            &TurboConfig::default(),
            &p,
            &x,
        );
    }
    // (round 10: and with the largest scale first at tile 34, past the kernel's table of 32
    // tiles, over 2,600 keys with nearly flat rows: n_min and d move after a refill)
    for (lk, q_scale, seed, late) in [
        (640, 1.0, 26, false),
        (2048, 1e-3, 27, false),
        (2600, 1e-3, 28, true),
    ] {
        let (p, x) = spread_v_case(lk, q_scale, seed, late);
        let cfg = TurboConfig::default();
        let paths = turbo::fixed_p_paths(&cfg, &p, &x);
        assert!(paths.by_r[6] > 0, "spread V {lk}: {paths:?}");
        check(&format!("spread V {lk} keys q x {q_scale}"), &cfg, &p, &x);
    }
    eprintln!("twin / emulation error vs golden, worst: {worst:.3}");
}

/// Byte of channel `c` of row `row` in an INT8 tile image of `d` channels per row
/// (`swz<D / 16>` of turbo_common.cuh: 16-byte chunks XOR-permuted by row).
fn image_at(row: usize, c: usize, d: usize) -> usize {
    let chunks = d / 16;
    let x = if chunks == 4 { (row >> 1) & 3 } else { row & 7 };
    row * d + (((c / 16) ^ x) << 4) + c % 16
}

/// The fast prefill's INT8 Q blocks come from the pre-pass (`turbo_quant_q_*`) instead of an
/// on-chip prologue: every block with a row holds `quantize_int8(q, int8_scale(block))` over
/// the block's rows of its sequence (the padding rows, 3000 here, excluded; rows past the
/// sequence 0), bit for bit, in the K-tile image layout, and its scale is `int8_scale`'s bits.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_fast_prefill_q_tiles_are_the_prologue_codes() {
    q_tiles_match_the_prologue(
        "gpu_turbo_fast_prefill_q_tiles_are_the_prologue_codes",
        |_| {},
    );
}

/// The blocks the pre-pass leaves to its exact loop (round 21): sequence 0's block 0 of head 0
/// scaled by 2^-126 (bf16: s = amax / 119 subnormal; f16: every value rounds to 0, s = 0), a +inf
/// in head 1's block 0 and a -inf in head 2's block 1 (s = inf: every code 0, the inf's
/// NaN quotient too); their codes and scales, and every other block's, as the prologue's.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_fast_prefill_q_tiles_at_the_edges() {
    q_tiles_match_the_prologue("gpu_turbo_fast_prefill_q_tiles_at_the_edges", |x| {
        for t in 0..TURBO_BLOCK {
            x.q.row4_mut(0, t, 0)
                .iter_mut()
                .for_each(|v| *v *= f32::powi(2.0, -126));
        }
        x.q.row4_mut(0, 5, 1)[7] = f32::INFINITY;
        x.q.row4_mut(0, TURBO_BLOCK + 2, 2)[3] = f32::NEG_INFINITY;
    });
}

fn q_tiles_match_the_prologue(name: &str, edit: impl Fn(&mut AttentionInputs)) {
    use ferrattn_core::turbo::quant::{int8_scale, quantize_int8};
    use ferrattn_cuda::launch::{DeviceInputs, DeviceOutputs};
    let Some(b) = fast_backend(name) else {
        return;
    };
    let mut checked = 0;
    for &d in &[64usize, 128] {
        for &dtype in &[DType::F16, DType::BF16] {
            let p = problem(&[150, 64, 0, 1], &[150, 64, 3, 70], 8, 4, d, dtype, true);
            let mut x = inputs(&p, 300 + d as u64);
            edit(&mut x);
            x.q.data.iter_mut().for_each(|v| *v = dtype.round(*v));
            let cfg = TurboConfig::default();
            let prep = b.turbo_prepare_prefill(&cfg, &p).unwrap();
            if !b.turbo_prefill_uses_fast(&prep) {
                eprintln!("{name}: the fast kernel is not used here (not sm_90); skipped");
                return;
            }
            let gpu = b.gpu().unwrap();
            let dx = DeviceInputs::upload(gpu, &p, &x).unwrap();
            let mut out = DeviceOutputs::alloc(gpu, &p).unwrap();
            b.turbo_launch_prefill(&prep, &dx, &mut out, None).unwrap();
            let (codes, scales) = b.turbo_prefill_q_tiles(&prep).unwrap().unwrap();
            let nqb = p.max_seqlen_q.div_ceil(TURBO_BLOCK);
            assert_eq!(scales.len(), p.batch * p.heads_q * nqb);
            assert_eq!(codes.len(), scales.len() * TURBO_BLOCK * d);
            for s in 0..p.batch {
                for h in 0..p.heads_q {
                    for qb in 0..nqb {
                        let rows = p.seqlens_q[s]
                            .saturating_sub(qb * TURBO_BLOCK)
                            .min(TURBO_BLOCK);
                        if rows == 0 {
                            continue;
                        }
                        let blk = (s * p.heads_q + h) * nqb + qb;
                        let row = |r: usize| x.q.row4(s, qb * TURBO_BLOCK + r, h);
                        let sc = int8_scale((0..rows).flat_map(row));
                        assert_eq!(
                            scales[blk].to_bits(),
                            sc.to_bits(),
                            "d {d} {dtype} seq {s} head {h} block {qb}: s_Q {} vs {sc}",
                            scales[blk]
                        );
                        let tile = &codes[blk * TURBO_BLOCK * d..(blk + 1) * TURBO_BLOCK * d];
                        for r in 0..TURBO_BLOCK {
                            for c in 0..d {
                                let want = if r < rows {
                                    quantize_int8(row(r)[c], sc)
                                } else {
                                    0
                                };
                                assert_eq!(
                                    tile[image_at(r, c, d)],
                                    want,
                                    "d {d} {dtype} seq {s} head {h} block {qb} row {r} channel {c}"
                                );
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    eprintln!("{name}: {checked} Q blocks equal to the prologue's codes and scales");
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_fast_prefill_matches_its_twin() {
    let name = "gpu_turbo_fast_prefill_matches_its_twin";
    let Some(b) = fast_backend(name) else {
        return;
    };
    for (i, c) in prefill_cases().into_iter().enumerate() {
        let p = problem(&c.lq, &c.lk, c.hq, c.hk, c.d, c.dtype, c.causal);
        let x = inputs(&p, 100 + i as u64);
        let cfg = cfg_with(c.bits.clone(), true);
        let what = format!(
            "fast prefill #{i} lq {:?} lk {:?} hq {} hk {} d {} {} causal {} {:?}",
            c.lq, c.lk, c.hq, c.hk, c.d, c.dtype, c.causal, c.bits
        );
        check_fast_prefill(&what, &b, &cfg, &p, &x, 70);
    }
    // SAS off, a threshold the kernel applies itself (-3) and one below the u8 cut (-16)
    let p = problem(&[150, 90], &[150, 200], 8, 4, 128, DType::F16, true);
    let x = inputs(&p, 21);
    for cfg in [
        cfg_with(KvBits::Int4, false),
        TurboConfig {
            sas_threshold: -3,
            ..TurboConfig::default()
        },
        TurboConfig {
            sas_threshold: -16,
            ..TurboConfig::default()
        },
    ] {
        let what = format!("fast prefill sas {} n_r {}", cfg.sas, cfg.sas_threshold);
        check_fast_prefill(&what, &b, &cfg, &p, &x, 0);
    }
    // V blocks whose scales pair with an exponent offset (x 1.6), do not pair (x 3, and a block
    // of zeros: s_V = 0), so the chunks are of one and two tiles in every combination
    // (turbo::fixed_p_chunks)
    let p = problem(&[300, 520], &[520, 520], 8, 2, 128, DType::BF16, true);
    let mut x = inputs(&p, 23);
    let v = x.v.as_mut().unwrap();
    for b in 0..p.batch {
        for t in 0..p.seqlens_k[b] {
            let f = match t / 64 {
                1 => 1.6,
                2 => 3.0,
                4 => 0.0,
                6 => 0.7,
                _ => 1.0,
            };
            for h in 0..p.heads_kv {
                v.row4_mut(b, t, h)
                    .iter_mut()
                    .for_each(|e| *e = p.dtype.round(*e * f));
            }
        }
    }
    let cfg = TurboConfig::default();
    check_fast_prefill("fast prefill uneven V block scales", &b, &cfg, &p, &x, 0);
    let p = problem(&[300, 520], &[520, 520], 8, 2, 64, DType::F16, false);
    let mut x = inputs(&p, 24);
    let v = x.v.as_mut().unwrap();
    for b in 0..p.batch {
        for t in (64..128).chain(256..320) {
            for h in 0..p.heads_kv {
                v.row4_mut(b, t, h)
                    .iter_mut()
                    .for_each(|e| *e = p.dtype.round(*e * 2.5));
            }
        }
    }
    check_fast_prefill(
        "fast prefill uneven V block scales d 64",
        &b,
        &cfg,
        &p,
        &x,
        0,
    );
    // K and V block scales that move from block to block (each block's absolute maximum set
    // to 0.5..1.5 x 4 for K and 1.0..1.4 x 4 for V: within the INT32 path's factor 2) over
    // 2,560 keys (40 full tiles): c2, s_u / s_V and -log2 of it differ per tile, and tiles
    // 32..39 take them from the refill of the kernel's table of 32 tiles (round 9), so a tile
    // reading another tile's entry moves O far past 1e-3
    for (d, causal, seed) in [(128, false, 26), (64, true, 27)] {
        let p = problem(&[200, 2560], &[2560, 2560], 8, 2, d, DType::BF16, causal);
        let mut x = inputs(&p, seed);
        let v = x.v.as_mut().unwrap();
        for b in 0..p.batch {
            for h in 0..p.heads_kv {
                for j in 0..p.seqlens_k[b] / 64 {
                    let fk = 4.0 * (0.5 + (j * 7 % 11) as f32 / 10.0);
                    let fv = 4.0 * (1.0 + (j * 3 % 5) as f32 / 10.0);
                    for (t, target) in [(&mut x.k, fk), (&mut *v, fv)] {
                        let amax = (64 * j..64 * j + 64)
                            .flat_map(|r| t.row4(b, r, h).iter().map(|e| e.abs()))
                            .fold(0.0f32, f32::max);
                        for r in 64 * j..64 * j + 64 {
                            t.row4_mut(b, r, h)
                                .iter_mut()
                                .for_each(|e| *e = p.dtype.round(*e * (target / amax)));
                        }
                    }
                }
            }
        }
        let what =
            format!("fast prefill K and V scales per block, 2560 keys, d {d} causal {causal}");
        check_fast_prefill(&what, &b, &cfg, &p, &x, 0);
    }
    // V block scales about 95x apart (round 8: the INT32 path's units s_u 2^-n, n up to 6), with
    // peaked rows and with nearly flat ones (l past the guard's 2^17)
    // (round 10: and with the largest scale first at tile 34, past the kernel's table of 32
    // tiles, over 2,600 keys with nearly flat rows: n_min and d move after a refill)
    for (lk, q_scale, seed, late) in [
        (640, 1.0, 26, false),
        (2048, 1e-3, 27, false),
        (2600, 1e-3, 28, true),
    ] {
        let (p, x) = spread_v_case(lk, q_scale, seed, late);
        eprintln!("spread V {lk}: {:?}", turbo::fixed_p_paths(&cfg, &p, &x));
        check_fast_prefill(
            &format!("fast prefill V block scales 95x apart, {lk} keys, q x {q_scale}"),
            &b,
            &cfg,
            &p,
            &x,
            0,
        );
    }
    // nearly flat rows over 70,000 keys: l passes 2^23 (about 33,000 keys of p near 1), so the
    // INT32 path's guard moves m up and halves the accumulator (and the accumulator stays in
    // i32 where it would not without the guard)
    if !small_only() {
        let p = problem(&[64], &[70_000], 2, 1, 64, DType::F16, false);
        let mut x = inputs(&p, 25);
        x.q.data
            .iter_mut()
            .for_each(|e| *e = p.dtype.round(*e * 1e-3));
        check_fast_prefill("fast prefill flat rows, 70000 keys", &b, &cfg, &p, &x, 0);
    }
}

/// On sm_90 the default prefill is the warpgroup-MMA kernel (so the tests above exercise it);
/// elsewhere, and with `exact_turbo_prefill`, the mma.sync kernel.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_prefill_kernel_choice() {
    let name = "gpu_turbo_prefill_kernel_choice";
    let Some((fast, exact)) = default_and_exact(name) else {
        return;
    };
    let p = problem(&[64], &[64], 2, 1, 128, DType::BF16, false);
    let cfg = TurboConfig::default();
    let sm90 = fast.gpu().unwrap().caps.compute_capability == Some((9, 0));
    let prep = fast.turbo_prepare_prefill(&cfg, &p).unwrap();
    assert_eq!(fast.turbo_prefill_uses_wgmma(&prep), sm90);
    assert!(!fast.turbo_prefill_uses_fast(&prep));
    let prep = exact.turbo_prepare_prefill(&cfg, &p).unwrap();
    assert!(!exact.turbo_prefill_uses_wgmma(&prep));
    let Some(f) = fast_backend(name) else {
        return;
    };
    let prep = f.turbo_prepare_prefill(&cfg, &p).unwrap();
    assert_eq!(f.turbo_prefill_uses_fast(&prep), sm90);
    eprintln!("sm_90: {sm90}; default prefill kernel is warpgroup MMA: {sm90}");
    // the decode: the fast-contract instances by default on sm_90, the bit-exact ones with
    // exact_turbo_decode (which wins over fast_turbo_decode) and by default elsewhere
    assert_eq!(fast.turbo_decode_is_fast(), sm90);
    assert!(!exact.turbo_decode_is_fast());
    for (fast_opt, exact_opt, want) in [
        (true, false, true),
        (true, true, false),
        (false, true, false),
    ] {
        let Some(b) = backend(
            name,
            Options {
                fast_turbo_decode: fast_opt,
                exact_turbo_decode: exact_opt,
                ..Options::default()
            },
        ) else {
            return;
        };
        assert_eq!(
            b.turbo_decode_is_fast(),
            want,
            "fast {fast_opt} exact {exact_opt}"
        );
    }
    eprintln!("default decode is the fast-contract instance: {sm90}");
}

/// With SAS on, every f32 step of the mma.sync kernel is the emulation's: O bit for bit.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_prefill_is_bit_exact_with_sas() {
    let Some(b) = backend(
        "gpu_turbo_prefill_is_bit_exact_with_sas",
        Options {
            exact_turbo_prefill: true,
            ..Options::default()
        },
    ) else {
        return;
    };
    for (i, (d, dtype, causal)) in [(128usize, DType::BF16, true), (64, DType::F16, false)]
        .into_iter()
        .enumerate()
    {
        let p = problem(&[200, 64], &[300, 64], 8, 2, d, dtype, causal);
        let x = inputs(&p, 7 + i as u64);
        let cfg = TurboConfig::default();
        let (emu, _) = turbo::prefill(&cfg, &p, &x).unwrap();
        let (gpu, _) = b.turbo_prefill(&cfg, &p, &x, 0).unwrap();
        check_vs_emulation(
            &format!("bit-exact prefill d{d} {dtype} causal {causal}"),
            &emu,
            &gpu,
            true,
        );
    }
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_prefill_sas_off_and_thresholds() {
    let Some(b) = backend(
        "gpu_turbo_prefill_sas_off_and_thresholds",
        Options::default(),
    ) else {
        return;
    };
    let p = problem(&[150, 90], &[150, 200], 8, 4, 128, DType::F16, true);
    let x = inputs(&p, 21);
    for cfg in [
        cfg_with(KvBits::Int4, false),
        TurboConfig {
            sas_threshold: -3,
            ..TurboConfig::default()
        },
        TurboConfig {
            sas_threshold: -16,
            ..TurboConfig::default()
        },
    ] {
        let what = format!("prefill sas {} n_r {}", cfg.sas, cfg.sas_threshold);
        let (emu, _) = turbo::prefill(&cfg, &p, &x).unwrap();
        let (gpu, _) = b.turbo_prefill(&cfg, &p, &x, 0).unwrap();
        check_following(&what, &emu, &gpu, prefill_follows(&b));
        check_vs_golden(&what, &p, &x, &emu, &gpu);
    }
}

/// `[B, 1, H, D]`: token `idx[b]` of sequence `b` of a `[B, S, H, D]` tensor.
fn tokens_at(t: &Tensor, idx: &[usize]) -> Tensor {
    let (h, d) = (t.shape[2], t.shape[3]);
    let mut data = Vec::with_capacity(idx.len() * h * d);
    for (b, &j) in idx.iter().enumerate() {
        for hh in 0..h {
            data.extend_from_slice(t.row4(b, j, hh));
        }
    }
    Tensor {
        shape: vec![idx.len(), 1, h, d],
        dtype: t.dtype,
        data,
    }
}

/// The first `s` tokens of every sequence of a `[B, S', H, D]` tensor.
fn prefix(t: &Tensor, s: usize) -> Tensor {
    let (b, h, d) = (t.shape[0], t.shape[2], t.shape[3]);
    let mut data = Vec::with_capacity(b * s * h * d);
    for bi in 0..b {
        for j in 0..s {
            for hh in 0..h {
                data.extend_from_slice(t.row4(bi, j, hh));
            }
        }
    }
    Tensor {
        shape: vec![b, s, h, d],
        dtype: t.dtype,
        data,
    }
}

/// Prefill a ragged context, then decode step by step across buffer flushes: each step's O
/// equals the emulation's (one unit per tile: bit for bit; stream-K: the CPU twin bit for bit),
/// and the cache equals the emulation's after every flush. Where the backend decodes on the
/// fast-contract instances (`CudaBackend::turbo_decode_is_fast`: the default on sm_90,
/// `Options::fast_turbo_decode`) the steps are held to the fast contract instead (`check_fast`,
/// and the golden comparison for both schedules); the bit-exact cases pass
/// `Options::exact_turbo_decode`.
#[allow(clippy::too_many_arguments)] // the shape of one test case
fn decode_steps(
    test: &str,
    opts: Options,
    schedule: DecodeSchedule,
    ctx: &[usize],
    steps: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
    bits: KvBits,
    sas: bool,
) {
    decode_steps_q(
        test,
        opts,
        schedule,
        ctx,
        steps,
        hq,
        hk,
        d,
        dtype,
        bits,
        sas,
        |_| {},
    );
}

/// `decode_steps` with each step's query (`[batch, 1, heads, d]`) passed through `edit_q` first.
#[allow(clippy::too_many_arguments)] // the shape of one test case
fn decode_steps_q(
    test: &str,
    opts: Options,
    schedule: DecodeSchedule,
    ctx: &[usize],
    steps: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dtype: DType,
    bits: KvBits,
    sas: bool,
    edit_q: fn(&mut Tensor),
) {
    let Some(b) = backend(test, opts) else {
        return;
    };
    let fast = b.turbo_decode_is_fast();
    if opts.exact_turbo_decode {
        assert!(
            !fast,
            "{test}: exact_turbo_decode selects the bit-exact instances"
        );
    } else if opts.fast_turbo_decode {
        assert!(fast, "{test}: fast_turbo_decode selects the fast instances");
    }
    let (mut fast_o, mut fast_lse) = (0.0f64, 0.0f64);
    let cfg = cfg_with(bits, sas);
    let (pfull, x, pctx, cx) = steps_inputs(ctx, steps, hq, hk, d, dtype);
    let v = x.v.as_ref().unwrap();
    let (_, mut emu_cache) = turbo::prefill(&cfg, &pctx, &cx).unwrap();
    let (_, mut gpu_cache) = b.turbo_prefill(&cfg, &pctx, &cx, steps + 64).unwrap();
    assert_cache_eq(
        &format!("{test}: context"),
        &emu_cache,
        &gpu_cache.download().unwrap(),
    );
    let mut diffs = 0;
    let (mut err_gpu, mut err_emu, mut norm_gold) = (0.0f64, 0.0f64, 0.0f64);
    for s in 0..steps {
        let idx: Vec<usize> = ctx.iter().map(|&c| c + s).collect();
        let (mut q, kn, vn) = (
            tokens_at(&x.q, &idx),
            tokens_at(&x.k, &idx),
            tokens_at(v, &idx),
        );
        edit_q(&mut q);
        let emu =
            turbo::decode_step(&cfg, &mut emu_cache, &q, &kn, &vn, pfull.softmax_scale).unwrap();
        let gpu = b
            .turbo_decode_step(
                &cfg,
                &mut gpu_cache,
                &q,
                &kn,
                &vn,
                pfull.softmax_scale,
                Some(schedule),
            )
            .unwrap();
        let lens: Vec<usize> = (0..ctx.len()).map(|bi| emu_cache.len(bi)).collect();
        assert_eq!(gpu_cache.lens(), &lens[..]);
        let what = format!("{test} step {s} lens {lens:?}");
        let mut note_fast = |(o, l): (f64, f64)| {
            fast_o = fast_o.max(o);
            fast_lse = fast_lse.max(l);
        };
        match schedule {
            DecodeSchedule::PerTile if fast => {
                note_fast(check_fast(&what, &emu, &gpu));
                // and step by step against the CPU model of the contract (attend_tile_fast):
                // the same integer and f32 steps but for the exponential (ex2.approx against
                // the host's exp2, about 2^-22 apart), which can move a P code by one where
                // 2^arg is that close to a half-integer: the bounds of `Follows::Codes`
                let model =
                    turbo::attention::decode_fast(&cfg, &emu_cache, &q, pfull.softmax_scale)
                        .unwrap();
                check_following(
                    &format!("{what} (vs the fast contract's CPU model)"),
                    &model,
                    &gpu,
                    Follows::Codes,
                );
            }
            DecodeSchedule::PerTile => diffs += check_vs_emulation(&what, &emu, &gpu, true),
            DecodeSchedule::StreamK(_) | DecodeSchedule::Balanced { .. } => {
                let pl = plan_decode(&lens, &vec![0; ctx.len()], hq, hk, schedule).unwrap();
                let (mut o, mut lse) = (
                    Tensor::zeros(&emu.o.shape, dtype),
                    Tensor::zeros(&emu.lse.shape, DType::F32),
                );
                decode_twin(
                    &cfg,
                    &emu_cache,
                    &pl,
                    &q,
                    pfull.softmax_scale,
                    &mut o,
                    &mut lse,
                );
                let twin = AttentionOutput {
                    o,
                    lse,
                    provenance: emu.provenance.clone(),
                };
                let what_twin = format!("{what} (vs the stream-K twin)");
                if fast {
                    note_fast(check_fast(&what_twin, &twin, &gpu));
                } else {
                    diffs += check_vs_emulation(&what_twin, &twin, &gpu, true);
                }
            }
        }
        if fast
            || matches!(
                schedule,
                DecodeSchedule::StreamK(_) | DecodeSchedule::Balanced { .. }
            )
        {
            // against the emulation itself a split differs by its own rounding of P (see
            // the twin test), the fast contract by its exponential: judged by the error
            // against the exact result instead
            let mut ps = problem(&vec![1; ctx.len()], &lens, hq, hk, d, dtype, false);
            ps.max_seqlen_k = pfull.max_seqlen_k;
            let xs = AttentionInputs {
                q: q.clone(),
                seqlens_q: None,
                seqlens_k: Some(lens.iter().map(|&l| l as i64).collect()),
                ..x.clone()
            };
            let gold = golden::exact_attention(&ps, &xs);
            for (acc, out) in [(&mut err_gpu, &gpu), (&mut err_emu, &emu)] {
                *acc += gold
                    .o
                    .data
                    .iter()
                    .zip(&out.o.data)
                    .map(|(a, b)| ((a - b) as f64).powi(2))
                    .sum::<f64>();
            }
            norm_gold += gold.o.data.iter().map(|&a| (a as f64).powi(2)).sum::<f64>();
        }
        if lens.iter().any(|&l| l % 64 == 0) || s + 1 == steps {
            assert_cache_eq(
                &format!("{what}: cache"),
                &emu_cache,
                &gpu_cache.download().unwrap(),
            );
            assert_eq!(
                gpu_cache.memory(),
                emu_cache.memory(),
                "{what}: memory accounting"
            );
        }
    }
    eprintln!(
        "{test}: {diffs} differing O elements over {steps} steps; {} compressed blocks decoded with the clamp",
        clamped_blocks(&emu_cache)
    );
    if fast {
        eprintln!(
            "{test}: fast contract over {steps} steps: max O rel {fast_o:.3e} (bound {FAST_O_REL:.0e}), max LSE abs {fast_lse:.3e} (bound {FAST_LSE_ABS:.0e})"
        );
    }
    if norm_gold > 0.0 {
        let (g, e) = ((err_gpu / norm_gold).sqrt(), (err_emu / norm_gold).sqrt());
        eprintln!("{test}: O vs golden over all steps: gpu {g:.4e}, emulation {e:.4e}");
        assert!(
            g <= 1.1 * e,
            "{test}: GPU error vs golden {g:.4e} exceeds the emulation's {e:.4e} by more than 10%"
        );
    }
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_decode_steps_per_tile_match_the_emulation() {
    let (ctx, steps) = if small_only() {
        (vec![60usize, 3], 8)
    } else {
        (vec![100usize, 63, 1, 130], 70)
    };
    decode_steps(
        "gpu_turbo_decode_steps_per_tile_match_the_emulation",
        Options {
            exact_turbo_decode: true,
            ..Options::default()
        },
        DecodeSchedule::PerTile,
        &ctx,
        steps,
        8,
        2,
        128,
        DType::BF16,
        KvBits::Mixed {
            two_bit_fraction: 0.5,
        },
        true,
    );
}

/// Query rows that take every route of the decode's query quantization
/// (turbo_decode.cu, `quantize_query_row`): rows whose codes sit on and next to half-integers
/// (x = (c - 64) / 64 of a row whose largest |x| is 1, so 119 x hits n + 1/2 at c = 96 and 32:
/// the exact remainder and its correction decide the rounding), a row of values 2^-120 x that
/// (its scale below 2^-100) sends its warp to the division of every channel, an all-zero row
/// (scale 0), the rest as drawn. Bit for bit against the emulation on the bit-exact g4 instance,
/// then under the fast contract (the g4 fast instance: its CPU model step by step).
fn edge_queries(q: &mut Tensor) {
    let (b, h, d) = (q.shape[0], q.shape[2], q.shape[3]);
    for bi in 0..b {
        for hh in 0..h {
            let row = &mut q.data[(bi * h + hh) * d..(bi * h + hh + 1) * d];
            for (c, x) in row.iter_mut().enumerate() {
                let ties = (c as f32 - 64.0) / 64.0 * (if c % 2 == 0 { 1.0 } else { -1.0 });
                match hh % 4 {
                    0 => *x = ties,
                    1 if hh < 4 => *x = ties * 2f32.powi(-120),
                    2 => *x = 0.0,
                    _ => {}
                }
            }
        }
    }
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_decode_query_quantization_routes() {
    let (ctx, steps) = if small_only() {
        (vec![70usize, 5], 3)
    } else {
        (vec![130usize, 64, 7], 6)
    };
    for (what, opts) in [
        (
            "bit-exact",
            Options {
                exact_turbo_decode: true,
                ..Options::default()
            },
        ),
        (
            "fast",
            Options {
                fast_turbo_decode: true,
                ..Options::default()
            },
        ),
    ] {
        decode_steps_q(
            &format!("gpu_turbo_decode_query_quantization_routes ({what})"),
            opts,
            DecodeSchedule::PerTile,
            &ctx,
            steps,
            8,
            2,
            128,
            DType::BF16,
            KvBits::Mixed {
                two_bit_fraction: 0.5,
            },
            true,
            edge_queries,
        );
    }
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_decode_steps_stream_k_match_the_twin() {
    let (ctx, steps) = if small_only() {
        (vec![200usize], 4)
    } else {
        (vec![700usize, 64, 0], 66)
    };
    decode_steps(
        "gpu_turbo_decode_steps_stream_k_match_the_twin",
        Options {
            exact_turbo_decode: true,
            ..Options::default()
        },
        DecodeSchedule::StreamK(37),
        &ctx,
        steps,
        40,
        2,
        64,
        DType::F16,
        KvBits::Int4,
        true,
    );
}

#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_decode_2bit_large_group() {
    if small_only() {
        return;
    }
    decode_steps(
        "gpu_turbo_decode_2bit_large_group",
        Options {
            exact_turbo_decode: true,
            ..Options::default()
        },
        DecodeSchedule::StreamK(132 * 4),
        &[1500usize, 3000],
        3,
        32,
        2,
        128,
        DType::F16,
        KvBits::Int2,
        true,
    );
}

/// Stream-K decode steps with flushes at Llama's GQA group of 4 (the `turbo_decode_g4_*`
/// instance, half-row layout) bit for bit against the CPU twin, then the same steps on the
/// full-row instance (`Options::turbo_decode_full_rows`), which must give the same bits.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_decode_steps_stream_k_group4_match_the_twin() {
    let (ctx, steps) = if small_only() {
        (vec![150usize], 4)
    } else {
        (vec![700usize, 64, 0, 190], 66)
    };
    for full_rows in [false, true] {
        decode_steps(
            "gpu_turbo_decode_steps_stream_k_group4_match_the_twin",
            Options {
                turbo_decode_full_rows: full_rows,
                exact_turbo_decode: true,
                ..Options::default()
            },
            DecodeSchedule::StreamK(37),
            &ctx,
            steps,
            16,
            4,
            128,
            DType::BF16,
            KvBits::Mixed {
                two_bit_fraction: 0.5,
            },
            true,
        );
    }
}

/// A buffer tile and segment priced high enough that [`DecodeSchedule::Balanced`]'s units around
/// the buffer tiles are a few cache tiles long (its tests' uneven cut).
const STEEP_COSTS: ferrattn_cuda::turbo::DecodeCosts = ferrattn_cuda::turbo::DecodeCosts {
    tile: 16,
    buffer_tile: 96,
    segment: 40,
};

/// Decode steps under [`DecodeSchedule::Balanced`] (units of unequal length, cut by cost) at
/// Llama's group of 4 over a mixed cache with flushes, bit for bit against the CPU twin, with the
/// default costs and with a buffer tile and segment priced high enough that the units around
/// the buffer tiles are a few cache tiles long; bit-exact and fast contract.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_decode_steps_balanced_match_the_twin() {
    use ferrattn_cuda::turbo::DECODE_COSTS;
    let (ctx, steps) = if small_only() {
        (vec![150usize], 3)
    } else {
        (vec![700usize, 64, 0, 190, 1000], 66)
    };
    for (exact, costs) in [
        (true, DECODE_COSTS),
        (true, STEEP_COSTS),
        (false, STEEP_COSTS),
    ] {
        decode_steps(
            "gpu_turbo_decode_steps_balanced_match_the_twin",
            Options {
                exact_turbo_decode: exact,
                ..Options::default()
            },
            DecodeSchedule::Balanced { units: 37, costs },
            &ctx,
            steps,
            16,
            4,
            128,
            DType::BF16,
            KvBits::Mixed {
                two_bit_fraction: 0.5,
            },
            true,
        );
    }
}

/// Stream-K decode steps over a 2-bit cache on the g4 instance (group of 4; the other 2-bit
/// cases run the full-row instance or a mixed cache), bit for bit against the CPU twin: at
/// lengths that are multiples of 64 (the first step: 128 and 640 tokens, no buffer tile) a unit
/// goes from the last block of one KV head straight to block 0 of the next; then the same steps
/// under the fast contract (the default on sm_90).
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_decode_2bit_group4_stream_k_match_the_twin() {
    let (ctx, steps) = if small_only() {
        (vec![127usize], 2)
    } else {
        (vec![127usize, 639, 190, 0], 3)
    };
    for exact in [true, false] {
        decode_steps(
            "gpu_turbo_decode_2bit_group4_stream_k_match_the_twin",
            Options {
                exact_turbo_decode: exact,
                ..Options::default()
            },
            DecodeSchedule::StreamK(37),
            &ctx,
            steps,
            16,
            4,
            128,
            DType::BF16,
            KvBits::Int2,
            true,
        );
    }
}

/// The fast-contract decode instances (`Options::fast_turbo_decode`) one unit per tile, on both
/// instances (g4 and full rows), SAS on and off: each step within `check_fast` of the
/// emulation and within `Follows::Codes` of the contract's CPU model
/// (`turbo::attention::decode_fast`; this comparison was added after the 2026-11-26 H200 run and
/// has not run on a GPU yet), the steps' O no further from the f64 golden than the emulation's
/// (10%), the cache still bit for bit the emulation's (the appends and flushes are not part of
/// the contract).
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_fast_decode_per_tile_within_its_contract() {
    let (ctx, steps) = if small_only() {
        (vec![60usize, 3], 8)
    } else {
        (vec![100usize, 63, 1, 130], 70)
    };
    for (full_rows, sas) in [(false, true), (true, true), (false, false)] {
        decode_steps(
            "gpu_turbo_fast_decode_per_tile_within_its_contract",
            Options {
                fast_turbo_decode: true,
                turbo_decode_full_rows: full_rows,
                ..Options::default()
            },
            DecodeSchedule::PerTile,
            &ctx,
            steps,
            8,
            2,
            128,
            DType::BF16,
            KvBits::Mixed {
                two_bit_fraction: 0.5,
            },
            sas,
        );
    }
}

/// `turbo_decode_g4_fast_mixed_*` (the tile's format as branches; `Options::turbo_decode_branches`
/// forces it where the fast g4 instance runs) against `turbo_decode_g4_fast_*` (the switch): the
/// same O and LSE bit for bit, step by step over a mixed 2/4-bit cache whose appends flush
/// buffers into blocks that take the clamping path (and prefilled blocks that fold), with INT8
/// buffer tiles of 1-63 tokens and an empty sequence, one unit per tile and stream-K (units
/// that cross output tiles and KV heads of both widths); the two caches stay equal. The names
/// `turbo_decode_instance_name` reports are checked first, so that the comparison is between
/// the two kernels.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_decode_branches_equal_the_switch() {
    let test = "gpu_turbo_decode_branches_equal_the_switch";
    let (ctx, steps) = if small_only() {
        (vec![127usize, 3], 4)
    } else {
        (vec![127usize, 639, 190, 0, 64], 70)
    };
    let with = |branches: bool| {
        backend(
            test,
            Options {
                fast_turbo_decode: true,
                turbo_decode_branches: Some(branches),
                ..Options::default()
            },
        )
    };
    let (Some(sw), Some(br)) = (with(false), with(true)) else {
        return;
    };
    let (hq, hk, d, dtype) = (16, 4, 128, DType::BF16);
    let bits = KvBits::Mixed {
        two_bit_fraction: 0.5,
    };
    let cfg = cfg_with(bits, true);
    let head_bits = [4u8, 2, 4, 2];
    assert_eq!(
        sw.turbo_decode_instance_name(dtype, d, hq / hk, &head_bits, 1000)
            .unwrap(),
        "turbo_decode_g4_fast_bf16_d128"
    );
    assert_eq!(
        br.turbo_decode_instance_name(dtype, d, hq / hk, &head_bits, 1)
            .unwrap(),
        "turbo_decode_g4_fast_mixed_bf16_d128"
    );
    let (pfull, x, pctx, cx) = steps_inputs(&ctx, steps, hq, hk, d, dtype);
    let v = x.v.as_ref().unwrap();
    for schedule in [DecodeSchedule::PerTile, DecodeSchedule::StreamK(37)] {
        let (_, mut cache_sw) = sw.turbo_prefill(&cfg, &pctx, &cx, steps + 64).unwrap();
        let (_, mut cache_br) = br.turbo_prefill(&cfg, &pctx, &cx, steps + 64).unwrap();
        for s in 0..steps {
            let idx: Vec<usize> = ctx.iter().map(|&c| c + s).collect();
            let (q, kn, vn) = (
                tokens_at(&x.q, &idx),
                tokens_at(&x.k, &idx),
                tokens_at(v, &idx),
            );
            let run = |b: &CudaBackend, cache: &mut ferrattn_cuda::turbo::DeviceTurboCache| {
                b.turbo_decode_step(
                    &cfg,
                    cache,
                    &q,
                    &kn,
                    &vn,
                    pfull.softmax_scale,
                    Some(schedule),
                )
                .unwrap()
            };
            let (o_sw, o_br) = (run(&sw, &mut cache_sw), run(&br, &mut cache_br));
            let what = format!("{test} {schedule:?} step {s} lens {:?}", cache_br.lens());
            assert!(o_br.o.data.iter().all(|v| v.is_finite()), "{what}: O");
            assert_eq!(differing_bits(&o_sw.o.data, &o_br.o.data), 0, "{what}: O");
            assert_eq!(
                differing_bits(&o_sw.lse.data, &o_br.lse.data),
                0,
                "{what}: LSE"
            );
        }
        let (a, b) = (cache_sw.download().unwrap(), cache_br.download().unwrap());
        assert!(cache_diff(&a, &b).is_none(), "{test} {schedule:?}: caches");
        eprintln!(
            "{test} {schedule:?}: {steps} steps equal; {} compressed blocks take the clamp",
            clamped_blocks(&b)
        );
    }
}

/// The fast-contract instances under stream-K against the CPU twin: Llama's group of 4 on both
/// instances (mixed bits, bf16, d 128), and a group of 20 at d 64 in f16 over INT4 (full rows).
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_fast_decode_stream_k_within_its_contract() {
    let (ctx, steps) = if small_only() {
        (vec![150usize], 4)
    } else {
        (vec![700usize, 64, 0, 190], 66)
    };
    let test = "gpu_turbo_fast_decode_stream_k_within_its_contract";
    for full_rows in [false, true] {
        decode_steps(
            test,
            Options {
                fast_turbo_decode: true,
                turbo_decode_full_rows: full_rows,
                ..Options::default()
            },
            DecodeSchedule::StreamK(37),
            &ctx,
            steps,
            16,
            4,
            128,
            DType::BF16,
            KvBits::Mixed {
                two_bit_fraction: 0.5,
            },
            true,
        );
    }
    decode_steps(
        test,
        Options {
            fast_turbo_decode: true,
            ..Options::default()
        },
        DecodeSchedule::StreamK(37),
        &ctx,
        steps,
        40,
        2,
        64,
        DType::F16,
        KvBits::Int4,
        true,
    );
}

/// The decode rows of docs/ACCURACY.md (`ferrattn repro turbo-accuracy`, seed 2025: 16 causal
/// decode tokens after a 500-token context, fp16, d 128, GQA 8/4, LLM-like inputs) through
/// `run_turbo` on the bit-exact and on the fast-contract decode (both with the bit-exact
/// prefill): the fast one's O error against the f64 golden may exceed the bit-exact one's by at
/// most 10% (it costs no accuracy), and it stays within `check_fast` of the emulation. Prints
/// the table's columns for both.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_fast_decode_costs_no_accuracy_on_the_accuracy_table() {
    let name = "gpu_turbo_fast_decode_costs_no_accuracy_on_the_accuracy_table";
    if small_only() {
        return;
    }
    let exact_prefill = Options {
        exact_turbo_prefill: true,
        ..Options::default()
    };
    let Some(exact) = backend(
        name,
        Options {
            exact_turbo_decode: true,
            ..exact_prefill
        },
    ) else {
        return;
    };
    let Some(fast) = backend(
        name,
        Options {
            fast_turbo_decode: true,
            ..exact_prefill
        },
    ) else {
        return;
    };
    let caps = exact.caps().unwrap();
    let mut dec = AttentionProblem::uniform(1, 16, 516, 8, 4, 128, 128, DType::F16);
    dec.causal = true;
    let x = turbo::llm_like_inputs(&dec, 2025 ^ 0x5eed);
    let gold = golden::exact_attention(&dec, &x);
    eprintln!(
        "| KV bits | SAS | kernel | rel. Frobenius err | cosine | max abs err | LSE max abs err |"
    );
    for (bits_name, kv_bits) in [
        ("int4", KvBits::Int4),
        ("int2", KvBits::Int2),
        (
            "mixed 2/4",
            KvBits::Mixed {
                two_bit_fraction: 0.5,
            },
        ),
    ] {
        for sas in [true, false] {
            let cfg = TurboConfig {
                sas,
                kv_bits: kv_bits.clone(),
                ..TurboConfig::default()
            };
            let mut pl = plan(Algorithm::Turbo, &dec, &caps).unwrap();
            pl.detail = ferrattn_core::PlanDetail::Turbo(cfg.clone());
            let emu = turbo::emulate(&cfg, &dec, &x).unwrap();
            let out_exact = exact.run_turbo(&pl, &x).unwrap();
            let out_fast = fast.run_turbo(&pl, &x).unwrap();
            let what = format!("{name} {bits_name} sas {sas}");
            // bit for bit with SAS on; with SAS off the kernel's expf may differ from the
            // host's in the last bit (the module docs: zero differing elements asserted with SAS
            // on only)
            check_vs_emulation(&format!("{what} (bit-exact)"), &emu, &out_exact, sas);
            check_fast(&format!("{what} (fast)"), &emu, &out_fast);
            let mut errs = [0.0f64; 2];
            for (i, (kernel, out)) in [("bit-exact", &out_exact), ("fast", &out_fast)]
                .into_iter()
                .enumerate()
            {
                let c = Comparison::f32(&gold.o.data, &out.o.data);
                let l = Comparison::f32(&gold.lse.data, &out.lse.data);
                eprintln!(
                    "| {bits_name} | {} | {kernel} | {:.4e} | {:.6} | {:.4e} | {:.4e} |",
                    if sas { "on" } else { "off" },
                    c.rel_fro,
                    c.cosine,
                    c.max_abs,
                    l.max_abs
                );
                errs[i] = c.rel_fro;
            }
            assert!(
                errs[1] <= 1.1 * errs[0] + 1e-7,
                "{what}: the fast decode's error vs golden {:.4e} exceeds the bit-exact one's {:.4e} by more than 10%",
                errs[1],
                errs[0]
            );
        }
    }
}

/// The TurboAttention trait: emulate's semantics (mixed batch of prefill and decode sequences).
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_run_turbo_matches_emulate() {
    let name = "gpu_turbo_run_turbo_matches_emulate";
    let Some((b, exact)) = default_and_exact(name) else {
        return;
    };
    // the default prefill with the bit-exact decode (the default before the fast decode was)
    let Some(exact_decode) = backend(
        name,
        Options {
            exact_turbo_decode: true,
            ..Options::default()
        },
    ) else {
        return;
    };
    let caps = b.caps().unwrap();
    for causal in [true, false] {
        // sequences 0 and 2 decode (Sq < Sk), 1 prefills
        let p = problem(&[3, 80, 1], &[150, 80, 64], 8, 2, 128, DType::BF16, causal);
        let x = inputs(&p, 5);
        let pl = plan(Algorithm::Turbo, &p, &caps).unwrap();
        let ferrattn_core::PlanDetail::Turbo(cfg) = &pl.detail else {
            unreachable!()
        };
        let emu = turbo::emulate(cfg, &p, &x).unwrap();
        let gpu = b.run_turbo(&pl, &x).unwrap();
        assert_eq!(gpu.provenance.backend, "cuda");
        let what = format!("run_turbo causal {causal}");
        // run_turbo decodes with one unit per tile (emulate's order); with the bit-exact prefill
        // kernel the whole output equals the emulation bit for bit
        let gpu_exact = exact.run_turbo(&pl, &x).unwrap();
        check_vs_emulation(&format!("{what} (exact prefill)"), &emu, &gpu_exact, true);
        let follows = if exact_decode.turbo_prefill_is_exact() {
            Follows::Bits
        } else {
            Follows::Codes
        };
        let gpu_exact_decode = exact_decode.run_turbo(&pl, &x).unwrap();
        let what_ed = format!("{what} (exact decode)");
        check_following(&what_ed, &emu, &gpu_exact_decode, follows);
        check_vs_golden(&what_ed, &p, &x, &emu, &gpu_exact_decode);
        // the default: on sm_90 the fast-contract decode, held to that contract (the prefill
        // rows of the batch as well: they are within `Follows::Codes`, inside it)
        if b.turbo_decode_is_fast() {
            check_fast(&format!("{what} (default, fast decode)"), &emu, &gpu);
        } else {
            check_following(&what, &emu, &gpu, follows);
        }
        check_vs_golden(&what, &p, &x, &emu, &gpu);
    }
    // a plan for an unsupported head dim is refused by the planner for CUDA
    let p = problem(&[4], &[4], 2, 2, 96, DType::F16, false);
    assert!(plan(Algorithm::Turbo, &p, &caps).is_err());
    // and a plan of another algorithm by run_turbo
    let p = problem(&[4], &[4], 2, 2, 128, DType::F16, false);
    let mut pl = plan(Algorithm::Turbo, &p, &DeviceCaps::hopper_reference()).unwrap();
    pl.detail = ferrattn_core::PlanDetail::Exact;
    assert!(matches!(
        b.run_turbo(&pl, &inputs(&p, 1)),
        Err(CudaError::Plan(_))
    ));
}

/// The NVRTC path computes the same bits as the fatbin.
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_nvrtc_equals_fatbin() {
    let Some(b) = backend("gpu_turbo_nvrtc_equals_fatbin", Options::default()) else {
        return;
    };
    let Some(n) = backend(
        "gpu_turbo_nvrtc_equals_fatbin",
        Options {
            force_nvrtc: true,
            ..Options::default()
        },
    ) else {
        return;
    };
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!(
            "SKIPPED gpu_turbo_nvrtc_equals_fatbin: libnvrtc.so not found (set LD_LIBRARY_PATH)"
        );
        return;
    }
    let p = problem(&[70], &[70], 4, 2, 64, DType::F16, true);
    let x = inputs(&p, 9);
    let cfg = TurboConfig::default();
    let (a, ca) = b.turbo_prefill(&cfg, &p, &x, 0).unwrap();
    let (c, cc) = n.turbo_prefill(&cfg, &p, &x, 0).unwrap();
    assert_eq!(differing_bits(&a.o.data, &c.o.data), 0);
    assert_eq!(differing_bits(&a.lse.data, &c.lse.data), 0);
    assert!(cache_diff(&ca.download().unwrap(), &cc.download().unwrap()).is_none());
}

/// A small prefill and decode for compute-sanitizer (memcheck, racecheck).
#[test]
#[cfg_attr(
    ferrattn_no_gpu,
    ignore = "no CUDA driver (libcuda) where this was built; on a GPU run with --include-ignored"
)]
fn gpu_turbo_sanitizer_small() {
    let Some(b) = backend("gpu_turbo_sanitizer_small", Options::default()) else {
        return;
    };
    let p = problem(&[70, 3], &[70, 130], 4, 2, 128, DType::BF16, true);
    let x = inputs(&p, 3);
    let cfg = TurboConfig::default();
    let (emu, emu_cache) = turbo::prefill(&cfg, &p, &x).unwrap();
    let (gpu, mut cache) = b.turbo_prefill(&cfg, &p, &x, 64).unwrap();
    check_following("sanitizer prefill", &emu, &gpu, prefill_follows(&b));
    assert_cache_eq("sanitizer prefill", &emu_cache, &cache.download().unwrap());
    if let Some(f) = fast_backend("gpu_turbo_sanitizer_small") {
        check_fast_prefill("sanitizer fast prefill", &f, &cfg, &p, &x, 64);
    }
    let q = x.q.seq_range(0, 1);
    let kn = x.k.seq_range(0, 1);
    let vn = x.v.as_ref().unwrap().seq_range(0, 1);
    // and units of unequal length (DecodeSchedule::Balanced, a buffer tile and segments priced high)
    for s in [
        DecodeSchedule::PerTile,
        DecodeSchedule::StreamK(5),
        DecodeSchedule::Balanced {
            units: 5,
            costs: STEEP_COSTS,
        },
    ] {
        let out = b
            .turbo_decode_step(&cfg, &mut cache, &q, &kn, &vn, p.softmax_scale, Some(s))
            .unwrap();
        assert!(out.o.data.iter().all(|v| v.is_finite()));
    }
    // every decode instance explicitly (the default above is the fast g4 one on sm_90, the
    // bit-exact g4 one elsewhere; the group of 2 takes turbo_decode_g4_*): bit-exact
    // (Options::exact_turbo_decode) and fast contract (Options::fast_turbo_decode), g4 and full
    // rows, and the fast g4 one with the tile's format as branches
    // (turbo_decode_g4_fast_mixed_*, Options::turbo_decode_branches)
    for (exact, full_rows, branches) in [
        (true, false, None),
        (true, true, None),
        (false, false, Some(false)),
        (false, true, None),
        (false, false, Some(true)),
    ] {
        let Some(inst) = backend(
            "gpu_turbo_sanitizer_small",
            Options {
                exact_turbo_decode: exact,
                fast_turbo_decode: !exact,
                turbo_decode_full_rows: full_rows,
                turbo_decode_branches: branches,
                ..Options::default()
            },
        ) else {
            return;
        };
        assert_eq!(inst.turbo_decode_is_fast(), !exact);
        let (_, mut cache) = inst.turbo_prefill(&cfg, &p, &x, 64).unwrap();
        for s in [DecodeSchedule::PerTile, DecodeSchedule::StreamK(5)] {
            let out = inst
                .turbo_decode_step(&cfg, &mut cache, &q, &kn, &vn, p.softmax_scale, Some(s))
                .unwrap();
            assert!(out.o.data.iter().all(|v| v.is_finite()));
        }
        // a 2-bit cache (its own copy sizes and staging offsets), per tile and under stream-K
        let cfg2 = cfg_with(KvBits::Int2, true);
        let (_, mut cache) = inst.turbo_prefill(&cfg2, &p, &x, 64).unwrap();
        for s in [DecodeSchedule::PerTile, DecodeSchedule::StreamK(3)] {
            let out = inst
                .turbo_decode_step(&cfg2, &mut cache, &q, &kn, &vn, p.softmax_scale, Some(s))
                .unwrap();
            assert!(out.o.data.iter().all(|v| v.is_finite()));
        }
    }
}
