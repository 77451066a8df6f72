//! Host tests (no GPU): parameter layouts, the schedule, the step plan, the device layout and
//! the decode's slow twin against the emulation.

use super::params::{
    CombineParams, CompressParams, DecodeParams, FastCompressParams, PrepareParams,
};
use super::*;
use crate::error::CudaError;
use ferrattn_core::turboquant::{TurboQuantCodec, TurboQuantConfig};
use ferrattn_core::{AttentionInputs, AttentionProblem, DType};
use half::f16;

#[test]
fn params_structs_match_the_kernel_layouts() {
    // pointers, ints, then float arrays (see the structs in turboquant_*.cu)
    assert_eq!(
        std::mem::size_of::<CompressParams>(),
        8 * 8 + 6 * 4 + 31 * 4 + 4
    );
    assert_eq!(
        std::mem::size_of::<FastCompressParams>(),
        // + the two FastDiv pairs (u32), then padding to 8
        10 * 8 + 6 * 4 + 35 * 4 + 4 * 4 + 4
    );
    // + the fused merge's 5 pointers and 3 scalars, then padding to 8
    assert_eq!(
        std::mem::size_of::<DecodeParams>(),
        14 * 8 + 8 * 4 + 16 * 4 + 5 * 8 + 3 * 4 + 4
    );
    assert_eq!(
        std::mem::size_of::<PrepareParams>(),
        7 * 8 + 7 * 4 + 2 * 4 + 4
    );
    assert_eq!(std::mem::size_of::<CombineParams>(), 7 * 8 + 7 * 4 + 4);
}

#[test]
fn the_small_work_cta_holds_the_fused_merge_and_fits_one_per_sm() {
    // H100 / H200: 227 KiB a CTA at most (228 KiB an SM, 1 KiB reserved by every CTA)
    let opt_in = 232_448;
    for d in [64, 128] {
        let s = small_work_smem_bytes(d, opt_in);
        assert!(s >= fused_merge_smem_bytes(d), "d {d}");
        assert!(s >= decode_smem_bytes(d, MAX_UNIT_WARPS_R8, false), "d {d}");
        assert!(s <= opt_in && s.is_multiple_of(16), "d {d}: {s}");
        // two CTAs of s bytes (and 1 KiB each) exceed the SM's opt_in + 1 KiB
        assert!(
            2 * (s + 1024) > opt_in + 1024,
            "d {d}: {s} lets two CTAs share an SM"
        );
    }
    // Π (64 KiB), 16 virtual warps' sums of 8 rows (64 KiB), O_rot, l, M, l, flag
    assert_eq!(fused_merge_smem_bytes(128), 135_760);
    // a GPU with 99 KiB a CTA (7-warp CTAs fit, the fused merge does not)
    assert!(small_work_smem_bytes(128, 101_376) > 101_376);
}

#[test]
fn seven_warp_ctas_are_padded_to_one_per_sm_only_where_two_would_fit() {
    let opt_in = 232_448; // H100 / H200
    for d in [64, 128] {
        // two fit by registers (<= 128 a thread): the fused merge's size, one CTA per SM
        let s = seven_warp_smem_bytes(d, MAX_UNIT_WARPS_R8, opt_in, true);
        assert_eq!(s, small_work_smem_bytes(d, opt_in), "d {d}");
        assert!(2 * (s + 1024) > opt_in + 1024, "d {d}: {s}");
        // one fits anyway, or fewer warps a CTA (the schedule fills every resident warp):
        // the CTA's own rings and query slots
        assert_eq!(
            seven_warp_smem_bytes(d, MAX_UNIT_WARPS_R8, opt_in, false),
            decode_smem_bytes(d, MAX_UNIT_WARPS_R8, false)
        );
        for w in UNIT_WARPS..MAX_UNIT_WARPS_R8 {
            for two in [false, true] {
                assert_eq!(
                    seven_warp_smem_bytes(d, w, opt_in, two),
                    decode_smem_bytes(d, w, false),
                    "d {d}, {w} warps"
                );
            }
        }
    }
}

#[test]
fn the_step_uploads_the_fused_merge_counters_as_zeros() {
    let cfg = TurboQuantConfig::paper_default(&AttentionProblem::uniform(
        1,
        1,
        4096,
        32,
        8,
        128,
        128,
        DType::F16,
    ));
    let p = AttentionProblem::uniform(3, 1, 4096, 32, 8, 128, 128, DType::F16);
    let t = TurboQuantDecodeTables::new(&cfg, &p, 924, 132).unwrap();
    let plan = TurboQuantStepPlan::new(Some(t.clone()), None);
    let r = plan.dec.unwrap();
    // one i32 per tile, inside the image the step's upload copies, all zero
    assert!(r.counts + 4 * t.tiles <= plan.table_bytes());
    assert!(plan.image[r.counts..r.counts + 4 * t.tiles]
        .iter()
        .all(|&b| b == 0));
    assert!(r.counts.is_multiple_of(TURBOQUANT_WORKSPACE_ALIGN) && r.counts >= r.seqlens_k + 4 * 3);
}

#[test]
fn the_16_warp_merge_serves_small_batches_only() {
    // batch 1 (8 tiles on 132 SMs): one CTA per row in use, 16 warps; batch 64: one CTA per
    // tile, 8 warps (the 16-warp merge lost 191 -> 205 µs there on an H200)
    let one = AttentionProblem::uniform(1, 1, 32768, 32, 8, 128, 128, DType::F16);
    let many = AttentionProblem::uniform(64, 1, 4096, 32, 8, 128, 128, DType::F16);
    let (r1, r64) = (row_split(&one, 8, 132), row_split(&many, 512, 132));
    assert_eq!((r1, r64), (4, 1));
    assert_eq!(merge_warps(r1, None), 16);
    assert_eq!(merge_warps(r64, None), COMBINE_WARPS);
    assert_eq!(merge_warps(r1, Some(8)), 8);
    assert_eq!(merge_warps(r64, Some(16)), 16);
}

#[test]
fn the_small_work_schedule_takes_the_measured_regime_only() {
    // 2.5 to 24 iterations a warp at 12 warps per SM on 132 SMs: batch 1 at 8k, 16k, 32k and
    // 64k (2.6, 5.2, 10.3, 20.7), 2 x 32k and 4 x 16k (20.7), where one 7-warp CTA per SM
    // measured faster (or equal: 4 x 16k); not 1 x 128k (41: measured slower that way), 16 x
    // 16k and 32 x 32k (83 and 248: measured slower), 1 x 4k (1.3, not measured), nor the
    // 16-row kernels (query length 4 with 4 query heads per KV head)
    let shape = |b, sq, ctx| AttentionProblem::uniform(b, sq, ctx, 32, 8, 128, 128, DType::F16);
    for (b, ctx) in [
        (1, 8192),
        (1, 16384),
        (1, 32768),
        (1, 65536),
        (2, 32768),
        (4, 16384),
    ] {
        assert!(small_decode(&shape(b, 1, ctx), 132), "{b} x {ctx}");
    }
    for (b, sq, ctx) in [
        (1, 1, 131072),
        (16, 1, 16384),
        (32, 1, 32768),
        (1, 1, 4096),
        (1, 4, 32768),
    ] {
        assert!(!small_decode(&shape(b, sq, ctx), 132), "{b} x {sq} x {ctx}");
    }
    // a 7-warp CTA's rings and query fragments at d = 128 (the kernels' opt-in maximum)
    assert_eq!(decode_smem_bytes(128, MAX_UNIT_WARPS_R8, false), 97_664);
    // 4-warp CTAs: the 8-row kernels' S q array is half the 16-row kernels'
    assert_eq!(decode_smem_bytes(128, UNIT_WARPS, false), 55_808);
    assert_eq!(decode_smem_bytes(128, UNIT_WARPS, true), 63_488);
}

#[test]
fn a_ctas_segments_cover_a_contiguous_range_of_tiles() {
    // The <= 8-row decode keeps the query fragments of a CTA's tiles in `warps` shared slots
    // (slot = tile - the CTA's first tile) when its units' segments span at most `warps` tiles:
    // that needs the segments in tile order, and at the measured shapes it holds for most CTAs
    // (batch 1: 924 units of 7-warp CTAs over 8 tiles, 1-2 tiles a CTA).
    let shape = |b, sq, ctx, hq| AttentionProblem::uniform(b, sq, ctx, hq, 8, 128, 128, DType::F16);
    for (p, units, warps, expect) in [
        (shape(1, 1, 32768, 32), 924, 7, 132),
        (shape(1, 1, 16384, 32), 924, 7, 132),
        (shape(1, 1, 131072, 32), 1584, 4, 396),
        (shape(16, 1, 16384, 32), 1584, 4, 396),
        (shape(3, 1, 577, 32), 3, 4, 0), // 24 tiles in one CTA: per-warp loads
    ] {
        let t = schedule_tables(&p, units);
        let tile = |s: i32| t.segs[4 * s as usize];
        assert!(
            t.segs
                .chunks(4)
                .zip(t.segs.chunks(4).skip(1))
                .all(|(a, b)| a[0] <= b[0]),
            "segments out of tile order"
        );
        let mut shared = 0;
        for c in 0..t.units.div_ceil(warps) {
            let (u0, u1) = (c * warps, ((c + 1) * warps).min(t.units));
            let (sa, sb) = (t.unit_segs[u0], t.unit_segs[u1]);
            if sa < sb && (tile(sb - 1) - tile(sa) + 1) as usize <= warps {
                shared += 1;
            }
        }
        assert_eq!(shared, expect, "CTAs with shared slots");
    }
}

#[test]
fn layouts_are_permutations_that_round_trip() {
    for d in [64usize, 128] {
        let mut seen = vec![false; d];
        for beta in 0..d / 2 {
            let c = layout::key_byte_channel(d, beta);
            assert!(c.is_multiple_of(2) && !seen[c] && !seen[c + 1]);
            seen[c] = true;
            seen[c + 1] = true;
        }
        let mut seen = vec![false; d];
        for bit in 0..d {
            let c = layout::sign_bit_channel(d, bit);
            assert!(!seen[c], "d {d} bit {bit}");
            seen[c] = true;
        }
        let mut seen = vec![false; d];
        for beta in 0..d {
            let c = layout::value_byte_channel(d, beta);
            assert!(!seen[c]);
            seen[c] = true;
        }
        let idx: Vec<u8> = (0..d).map(|i| ((i * 7 + 3) % 16) as u8).collect();
        assert_eq!(layout::unpack_key_codes(&layout::pack_key_codes(&idx)), idx);
        let signs: Vec<u8> = (0..d / 8).map(|i| (i * 37 + 11) as u8).collect();
        assert_eq!(
            layout::unpack_signs(d, &layout::pack_signs(d, &signs)),
            signs
        );
    }
}

#[test]
fn crumb_layout_round_trips_and_unpacks_to_the_nibble_words() {
    for d in [64usize, 128] {
        // keys: a row of codes < 4 as d/4 bytes; the decode's unpacking of each crumb word gives
        // the nibble layout's words of the same lane block (so the nibble path runs unchanged)
        let idx: Vec<u8> = (0..d).map(|i| ((i * 7 + 3) % 4) as u8).collect();
        let nib = layout::pack_key_codes(&idx);
        let cr = layout::pack_key_row(&idx, true);
        assert_eq!(cr.len(), d / 4);
        assert_eq!(layout::unpack_key_row(d, &cr, true), idx);
        assert_eq!(layout::unpack_key_row(d, &nib, false), idx);
        let words = |b: &[u8]| -> Vec<u32> {
            b.chunks(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        for q in 0..4 {
            let nw = words(&nib[q * d / 8..(q + 1) * d / 8]);
            let cw = words(&cr[q * d / 16..(q + 1) * d / 16]);
            for (j, &x) in cw.iter().enumerate() {
                assert_eq!(
                    layout::nibble_words_of_crumb_word(x),
                    (nw[2 * j], nw[2 * j + 1]),
                    "d {d} lane block {q} word {j}"
                );
            }
        }
        // values: a pair record of d/2 bytes, both tokens back
        let even: Vec<u8> = (0..d).map(|i| ((i * 5 + 1) % 4) as u8).collect();
        let odd: Vec<u8> = (0..d).map(|i| ((i * 3 + 2) % 4) as u8).collect();
        let nib = layout::pack_value_pair(&even, &odd, false);
        let cr = layout::pack_value_pair(&even, &odd, true);
        assert_eq!(cr.len(), d / 2);
        for (crumbs, rec) in [(false, &nib), (true, &cr)] {
            assert_eq!(layout::unpack_value_pair(d, rec, 0, crumbs), even);
            assert_eq!(layout::unpack_value_pair(d, rec, 1, crumbs), odd);
        }
        for g in 0..8 {
            let nw = words(&nib[g * d / 8..(g + 1) * d / 8]);
            let cw = words(&cr[g * d / 16..(g + 1) * d / 16]);
            for (j, &x) in cw.iter().enumerate() {
                assert_eq!(
                    layout::nibble_words_of_crumb_word(x),
                    (nw[2 * j], nw[2 * j + 1])
                );
            }
        }
        // the even token's codes are the low nibble of every byte in both layouts (an append of
        // one token of a pair masks with 0x0f / 0xf0)
        let zero = vec![0u8; d];
        assert!(layout::pack_value_pair(&even, &zero, true)
            .iter()
            .all(|b| b & 0xf0 == 0));
        assert!(layout::pack_value_pair(&zero, &odd, true)
            .iter()
            .all(|b| b & 0x0f == 0));
    }
    // bytes per token and KV head at d = 128
    assert_eq!(layout::bytes_per_token_head(128, true, false, false), 150); // k4q-v3
    assert_eq!(layout::bytes_per_token_head(128, true, true, true), 86); // k3q-v2, k2q-v2
    assert_eq!(layout::bytes_per_token_head(128, false, true, true), 70); // k2-v2
    assert_eq!(layout::bytes_per_token_head(128, true, true, false), 118); // k3q-v3
}

#[test]
fn key_layout_gives_each_lane_its_b_fragments() {
    // lane (g, q) reads bytes [q d/8, (q+1) d/8) of token g; its 32-bit word w holds, low 16
    // bits first, the b0/b1 pairs of chunks 2w and 2w + 1: (16κ + 2q, +1) then (16κ + 8 + 2q, +1)
    let d = 128;
    for q in 0..4 {
        for w in 0..d / 32 {
            for (half, kappa) in [(0usize, 2 * w), (1, 2 * w + 1)] {
                let byte0 = q * d / 8 + 4 * w + 2 * half;
                assert_eq!(layout::key_byte_channel(d, byte0), 16 * kappa + 2 * q);
                assert_eq!(
                    layout::key_byte_channel(d, byte0 + 1),
                    16 * kappa + 8 + 2 * q
                );
            }
        }
    }
    // signs: pair jj = 2κ + η of lane q at bits jj and jj + d/8 of its block
    for q in 0..4 {
        for jj in 0..d / 8 {
            let bit = q * d / 4 + jj;
            let c = 16 * (jj / 2) + 8 * (jj % 2) + 2 * q;
            assert_eq!(layout::sign_bit_channel(d, bit), c);
            assert_eq!(layout::sign_bit_channel(d, bit + d / 8), c + 1);
        }
    }
    // values: lane group g's byte ν is channel 8ν + g
    for g in 0..8 {
        for nu in 0..d / 8 {
            assert_eq!(layout::value_byte_channel(d, g * d / 8 + nu), 8 * nu + g);
        }
    }
}

#[test]
fn centroid_tables_hold_low_then_high_bytes() {
    let t = centroid_tables(&[1.0, -2.0, 0.5]);
    // f16: 1.0 = 0x3c00, -2.0 = 0xc000, 0.5 = 0x3800
    assert_eq!(t[0], 0x0000_0000);
    assert_eq!(t[4], 0x0038_c03c);
    assert_eq!(t[1..4], [0, 0, 0]);
}

#[test]
fn closed_list_of_configurations() {
    let p = AttentionProblem::uniform(1, 1, 64, 8, 2, 128, 128, DType::F16);
    let mut cfg = TurboQuantConfig::paper_default(&p);
    let n = kernel_names(&cfg, &p).unwrap();
    assert_eq!(n.decode_r8, "turboquant_decode_d128_kqjl_v8_r8");
    assert_eq!(n.compress_keys, "turboquant_compress_keys_qjl_d128");
    cfg.key_qjl = false;
    assert_eq!(
        kernel_names(&cfg, &p).unwrap().decode_r16,
        "turboquant_decode_d128_kn16_v8_r16"
    );
    cfg.value_bits = 4;
    cfg.key_bits = 2;
    assert_eq!(
        kernel_names(&cfg, &p).unwrap().decode_r8,
        "turboquant_decode_d128_knc_v16_r8"
    );
    // codes of at most 2 bits as crumbs: keys (a 1-2 bit codebook), values (2 bits)
    for (key_bits, key_qjl, value_bits, want) in [
        (3u8, true, 2u8, "kqjlc_vc"),
        (2, true, 3, "kqjlc_v8"),
        (4, true, 2, "kqjl_vc"),
        (2, false, 2, "knc_vc"),
        (3, false, 3, "kn8_v8"),
    ] {
        let c = TurboQuantConfig {
            key_bits,
            key_qjl,
            value_bits,
            ..cfg.clone()
        };
        assert_eq!(
            kernel_names(&c, &p).unwrap().decode_r8f,
            format!("turboquant_decode_d128_{want}_r8f")
        );
        assert_eq!(
            code_crumbs(&c),
            (c.key_codebook_bits() <= 2, value_bits == 2)
        );
    }
    let bad = |c: &TurboQuantConfig, p: &AttentionProblem| {
        matches!(kernel_names(c, p), Err(CudaError::Unsupported { .. }))
    };
    assert!(bad(
        &TurboQuantConfig {
            key_bits: 1,
            ..cfg.clone()
        },
        &p
    ));
    assert!(bad(
        &TurboQuantConfig {
            value_bits: 1,
            ..cfg.clone()
        },
        &p
    ));
    assert!(bad(
        &TurboQuantConfig {
            key_qjl: true,
            qjl_dim: 64,
            ..cfg.clone()
        },
        &p
    ));
    let p96 = AttentionProblem::uniform(1, 1, 64, 8, 2, 96, 96, DType::F16);
    assert!(bad(&cfg, &p96));
    let pbf = AttentionProblem::uniform(1, 1, 64, 8, 2, 128, 128, DType::BF16);
    assert!(bad(&cfg, &pbf));
}

/// LLM-like inputs rounded to f16, as the GPU tests use.
fn f16_inputs(p: &AttentionProblem, seed: u64) -> AttentionInputs {
    let mut x = ferrattn_core::turbo::llm_like_inputs(p, seed);
    for t in [&mut x.q, &mut x.k, x.v.as_mut().unwrap()] {
        t.data.iter_mut().for_each(|v| *v = DType::F16.round(*v));
    }
    x.seqlens_q = Some(p.seqlens_q.iter().map(|&l| l as i64).collect());
    x.seqlens_k = Some(p.seqlens_k.iter().map(|&l| l as i64).collect());
    x
}

#[test]
fn the_kernels_twin_matches_the_emulation() {
    use ferrattn_core::Comparison;
    // (query lengths, key lengths, Hq, Hk, d, causal, units): GQA 4 at query length 1
    // (rows 8-15 unused), 16 rows of GQA 3 x 5 tokens, two query groups, an empty sequence,
    // lengths off the 16-token tile, causal, stream-K splits inside tiles
    type Case = (Vec<usize>, Vec<usize>, usize, usize, usize, bool, usize);
    let cases: Vec<Case> = vec![
        (vec![1, 1, 1], vec![37, 0, 70], 8, 2, 64, false, 5),
        (vec![5, 2], vec![45, 33], 12, 4, 64, true, 3),
        (vec![4], vec![100], 16, 2, 128, true, 2),
        (vec![1], vec![129], 8, 2, 128, false, 1),
    ];
    for (lq, lk, hq, hk, d, causal, units) in cases {
        let mut p = AttentionProblem::uniform(
            lq.len(),
            *lq.iter().max().unwrap(),
            *lk.iter().max().unwrap(),
            hq,
            hk,
            d,
            d,
            DType::F16,
        );
        p.seqlens_q = lq.clone();
        p.seqlens_k = lk.clone();
        p.causal = causal;
        let x = f16_inputs(&p, 3 + d as u64);
        for (key_bits, key_qjl, value_bits) in
            [(4u8, true, 3u8), (4, false, 4), (2, true, 2), (3, false, 2)]
        {
            let cfg = TurboQuantConfig {
                key_bits,
                key_qjl,
                value_bits,
                ..TurboQuantConfig::paper_default(&p)
            };
            let codec = TurboQuantCodec::new(&cfg, d, d);
            let kv = codec.compress(&p, &x);
            let (o, lse) = twin::decode(&codec, &p, &x.q, &twin::image(&kv), units);
            let emu = codec.attend(&cfg, &p, &x.q, &kv);
            let f64s = |v: &[f32]| v.iter().map(|&y| y as f64).collect::<Vec<_>>();
            let co = Comparison::new(&f64s(&emu.o.data), &f64s(&o.data));
            let cl = Comparison::new(&f64s(&emu.lse.data), &f64s(&lse));
            let what = format!("k{key_bits} qjl {key_qjl} v{value_bits} lq {lq:?} lk {lk:?} {hq}/{hk} d {d} causal {causal} units {units}");
            assert!(
                co.non_finite_mismatch.is_none() && cl.non_finite_mismatch.is_none(),
                "{what}"
            );
            assert!(co.rel_fro < 1e-3, "{what}: O rel_fro {:e}", co.rel_fro);
            // LSE relative to max(1, |LSE|): each logit carries up to four f16 roundings
            // (S q, the key centroid, and through P and the value centroid the weights),
            // each at most 2^-11 relative, so 4 · 2^-11 ≈ 2e-3 of the logit scale
            let worst_rel = emu
                .lse
                .data
                .iter()
                .zip(&lse)
                .filter(|(a, _)| a.is_finite())
                .map(|(a, b)| ((a - b).abs() / a.abs().max(1.0)) as f64)
                .fold(0.0, f64::max);
            eprintln!(
                "{what}: O rel_fro {:.2e}, LSE max abs {:.2e}, max rel {worst_rel:.2e}",
                co.rel_fro, cl.max_abs
            );
            assert!(worst_rel < 2e-3, "{what}: LSE relative error {worst_rel:e}");
        }
    }
}

#[test]
fn scaled_codebooks_round_to_f16_almost_exactly() {
    // one factor per codebook brings every centroid within 2^-13 relative of an f16 value
    // (plain f16 rounding: up to 2^-11)
    for d in [64usize, 128] {
        for bits in 1u8..=4 {
            let c = ferrattn_core::turboquant::codebook(bits, d);
            let cents = c.centroids_f32();
            let sigma = f16_friendly_scale(cents);
            assert!((1.0..2.0).contains(&sigma));
            let worst = cents
                .iter()
                .map(|&x| {
                    let y = sigma * x;
                    ((f16::from_f32(y).to_f32() - y) / y).abs()
                })
                .fold(0.0f32, f32::max);
            assert!(worst < 2f32.powi(-13), "d {d} bits {bits}: {worst:e}");
        }
    }
}

/// The contract check itself: the emulation's own cache passes every path with nothing
/// counted; a code moved to a neighbour far from any boundary, a flipped QJL sign and a
/// norm one ulp off are refused by the exact contract, and the code and the norm by the
/// fast one too.
#[test]
fn compress_contract_check_refuses_what_its_path_does_not_allow() {
    let mut p = AttentionProblem::uniform(2, 1, 9, 4, 2, 64, 64, DType::F16);
    p.seqlens_k = vec![9, 5];
    let mut x = ferrattn_core::turbo::llm_like_inputs(&p, 3);
    let round =
        |t: &mut ferrattn_core::Tensor| t.data.iter_mut().for_each(|v| *v = DType::F16.round(*v));
    round(&mut x.k);
    round(x.v.as_mut().unwrap());
    x.seqlens_k = Some(vec![9, 5]);
    let cfg = TurboQuantConfig::paper_default(&p);
    let codec = TurboQuantCodec::new(&cfg, 64, 64);
    let kv = codec.compress(&p, &x);
    for path in [CompressPath::Exact, CompressPath::Fast, CompressPath::Split] {
        let m = check_compress_contract(&p, &x, &cfg, &kv, path).unwrap();
        assert_eq!(m, ContractCounts::default(), "{path:?}");
    }
    // the coordinate farthest from any boundary, moved to a neighbouring code
    let (mut idx, mut rot) = (vec![0u8; 64], vec![0f32; 64]);
    codec
        .key
        .mse()
        .quantize_into(&x.k.row4(0, 0, 0)[..64], &mut idx, &mut rot);
    let bounds = codec.key.mse().codebook().boundaries_f32();
    let dist = |y: f32| {
        bounds
            .iter()
            .map(|&b| (y - b).abs())
            .fold(f32::MAX, f32::min)
    };
    let o = (0..64)
        .max_by(|&a, &b| dist(rot[a]).total_cmp(&dist(rot[b])))
        .unwrap();
    assert!(dist(rot[o]) > FAST_CODE_MARGIN);
    let mut bad = kv.clone();
    bad.k_idx[o] = if idx[o] == 0 { 1 } else { idx[o] - 1 };
    for path in [CompressPath::Exact, CompressPath::Fast, CompressPath::Split] {
        let e = check_compress_contract(&p, &x, &cfg, &bad, path).unwrap_err();
        assert!(e.contains("coordinate"), "{path:?}: {e}");
    }
    let mut bad = kv.clone();
    bad.k_signs[0] ^= 1;
    let e = check_compress_contract(&p, &x, &cfg, &bad, CompressPath::Exact).unwrap_err();
    assert!(e.contains("sign 0"), "{e}");
    let mut bad = kv.clone();
    bad.v_norm[1] = f32::from_bits(bad.v_norm[1].to_bits() + 1);
    for path in [CompressPath::Exact, CompressPath::Fast] {
        let e = check_compress_contract(&p, &x, &cfg, &bad, path).unwrap_err();
        assert!(e.contains("norms"), "{path:?}: {e}");
    }
}

#[test]
fn fast_div_equals_integer_division() {
    let mut ds: Vec<u32> = (1..=300).collect();
    ds.extend([
        511,
        512,
        513,
        4095,
        4096,
        4097,
        65_535,
        65_537,
        1 << 20,
        12_345_679,
    ]);
    for d in ds {
        let f = FastDiv::new(d);
        let mut ns: Vec<u32> = (0..2000).collect();
        ns.extend([(1 << 31) - 1, (1 << 31) - 2, (1 << 30) + 7, 123_456_789]);
        ns.extend((1..64).flat_map(|k| [k * d - 1, k * d, k * d + 1]));
        ns.extend((1..64).map(|k| ((1u64 << 31) - 1 - k as u64 * d as u64 % (1 << 31)) as u32));
        for n in ns.into_iter().filter(|&n| n < 1 << 31) {
            assert_eq!(f.div(n), n / d, "{n} / {d}");
        }
    }
}

#[test]
fn code_lookup_equals_the_codebook_index() {
    for d in [64, 128] {
        for bits in 1..=4u8 {
            let cb = ferrattn_core::turboquant::codebook(bits, d);
            let (b, c) = (cb.boundaries_f32(), cb.centroids_f32());
            let lut = CodeLut::new(b, c);
            let mut ys: Vec<f32> = vec![0.0, -0.0, 1.0, -1.0, 1e-30, lut.lo, lut.hi];
            // every boundary and its neighbours to 64 ulps, and a fine sweep
            for &x in b {
                let mut up = x;
                let mut dn = x;
                ys.push(x);
                for _ in 0..64 {
                    up = up.next_up();
                    dn = dn.next_down();
                    ys.extend([up, dn]);
                }
            }
            ys.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 4e-6));
            for &y in &ys {
                let want = cb.index(y);
                let (got, cent) = lut.code(y);
                assert_eq!(got, want, "bits {bits} d {d}: y = {y:e}");
                assert_eq!(cent.to_bits(), cb.centroid(want).to_bits());
            }
        }
    }
}

#[test]
fn code_scaled_lookup_is_exact_outside_2e_22_of_a_boundary() {
    // the fourth compression pass's lookup (tqf::code_scaled) against the count for the real
    // quotient acc / n, over norms of every scale and coordinates at and beside every boundary
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let (mut near, mut total) = (0usize, 0usize);
    for d in [64, 128] {
        for bits in 1..=4u8 {
            let cb = ferrattn_core::turboquant::codebook(bits, d);
            let (b, c) = (cb.boundaries_f32(), cb.centroids_f32());
            let lut = CodeLut::new(b, c);
            for _ in 0..4000 {
                let n = (2f64.powf(next() * 40.0 - 20.0)) as f32;
                let mut ys: Vec<f64> = vec![0.0, 1.0, -1.0, lut.lo as f64, lut.hi as f64];
                for &x in b {
                    for k in -3i32..=3 {
                        ys.push(x as f64 * (1.0 + k as f64 * 2f64.powi(-23)));
                    }
                    ys.push(x as f64 + (next() - 0.5) * 1e-3);
                }
                ys.push((next() - 0.5) * 0.6);
                for &y in &ys {
                    let acc = (y * n as f64) as f32;
                    let q = acc as f64 / n as f64;
                    let want = b.iter().filter(|&&bb| (bb as f64) < q).count() as u8;
                    let got = lut.code_scaled(acc, n);
                    total += 1;
                    if got != want {
                        let gap = b
                            .iter()
                            .map(|&bb| (bb as f64 - q).abs())
                            .fold(f64::INFINITY, f64::min);
                        assert!(
                            gap <= 2f64.powi(-22) * q.abs(),
                            "bits {bits} d {d}: acc {acc:e} n {n:e}: {got} vs {want}, {gap:e} from a boundary"
                        );
                        near += 1;
                    }
                }
            }
            // a zero row: the code of y = 0, for acc = +0 and -0
            let zero = b.iter().filter(|&&bb| bb < 0.0).count() as u8;
            assert_eq!(lut.code_scaled(0.0, 0.0), zero);
            assert_eq!(lut.code_scaled(-0.0, 0.0), zero);
        }
    }
    // near ties are rare: the lookup is the real count almost everywhere
    assert!(near * 100 < total, "{near} of {total} lookups off");
}

#[test]
fn fast_matrices_split_pi_and_fold_the_sketch() {
    let cfg = TurboQuantConfig::paper_default(&AttentionProblem::uniform(
        1,
        1,
        16,
        8,
        2,
        64,
        64,
        DType::F16,
    ));
    let codec = TurboQuantCodec::new(&cfg, 64, 64);
    let (pi, s) = (codec.key_rotation().matrix(), codec.sketch().matrix());
    let (hi, lo, m) = fast_matrices(pi, s, 64);
    let f = |b: u16| f16::from_bits(b).to_f64();
    for i in 0..64 * 64 {
        // hi + lo carries Π to about 2^-22 of its magnitude (f16 subnormals: 2^-25 absolute)
        let e = (f(hi[i]) + f(lo[i]) - pi[i] as f64).abs();
        assert!(
            e <= (pi[i].abs() as f64) * 2f64.powi(-21) + 2f64.powi(-25),
            "{i}: {e:e}"
        );
    }
    // (S Πᵀ) Π = S: the folded sketch applied to a rotated vector is the sketch of the vector
    let x: Vec<f64> = (0..64)
        .map(|k| ((k * 37 % 11) as f64 - 5.0) / 7.0)
        .collect();
    let rot: Vec<f64> = (0..64)
        .map(|o| (0..64).map(|k| pi[o * 64 + k] as f64 * x[k]).sum())
        .collect();
    for i in 0..64 {
        let want: f64 = (0..64).map(|k| s[i * 64 + k] as f64 * x[k]).sum();
        let got: f64 = (0..64).map(|k| f(m[i * 64 + k]) * rot[k]).sum();
        let norm: f64 = (0..64)
            .map(|k| (s[i * 64 + k] as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let xn: f64 = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!(
            (got - want).abs() <= 2f64.powi(-10) * norm * xn,
            "row {i}: {got} vs {want}"
        );
    }
}

#[test]
fn compression_kernels_fit_in_shared_memory() {
    // the launch bounds of turboquant_compress.cu at d = 128 (228 KB per SM, 227 KB per CTA on
    // sm_90, 1 KB of each CTA's reserved by the driver): four fast value / MSE-key CTAs per SM,
    // three fast QJL-key ones, two split QJL-key ones
    assert!(4 * (fast_compress_smem_bytes(128, false, false) + 1024) <= 228 * 1024);
    assert!(3 * (fast_compress_smem_bytes(128, true, false) + 1024) <= 228 * 1024);
    assert!(2 * (fast_compress_smem_bytes(128, true, true) + 1024) <= 228 * 1024);
    // keys with QJL at d = 128: Π and S padded, f32, plus the rows: within 227 KiB
    assert!(compress_smem_bytes(128, true) <= 227 * 1024);
    assert_eq!(
        compress_smem_bytes(64, false),
        4 * (64 * 68 + 32 * 68 + 32) + 32 * 64
    );
}

/// A step's workspace: every region aligned, inside `workspace_bytes`, none overlapping;
/// the tables image holds exactly the kernels' tables (the schedule's, the lengths, the
/// append's destinations and counts) at their offsets.
#[test]
fn step_workspace_regions_are_aligned_disjoint_and_hold_the_tables() {
    let probe = AttentionProblem::uniform(1, 1, 1, 1, 1, 128, 128, DType::F16);
    for qjl in [true, false] {
        let mut cfg = TurboQuantConfig::paper_default(&probe);
        cfg.key_qjl = qjl;
        if !qjl {
            cfg.qjl_dim = 0;
        }
        let mut p = AttentionProblem::uniform(3, 1, 1001, 32, 8, 128, 128, DType::F16);
        p.seqlens_k = vec![1001, 1, 577];
        let dec = TurboQuantDecodeTables::new(&cfg, &p, 264, 132).unwrap();
        let app = TurboQuantAppendTables::new(&[1000, 0, 576], &[1, 1, 1], 1, 1008).unwrap();
        let plan = TurboQuantStepPlan::new(Some(dec.clone()), Some(app));
        let (r, a) = (plan.dec.unwrap(), plan.app.unwrap());
        let frag = dec.tiles * 32 * 128 * 2;
        let mut regions = vec![
            (a.dst0, 3 * 4),
            (a.count, 3 * 4),
            (r.segs, dec.segs.len() * 4),
            (r.unit_segs, dec.unit_segs.len() * 4),
            (r.tile_segs, dec.tile_segs.len() * 4),
            (r.seqlens_q, 3 * 4),
            (r.seqlens_k, 3 * 4),
            (r.qf, frag),
            (r.qf_lo, frag),
            (r.pf, if qjl { frag } else { 4 }),
            (r.part_o, dec.segments * ROWS * 128 * 4),
            (r.part_ml, dec.segments * ROWS * 2 * 4),
        ];
        regions.sort();
        for w in regions.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?} overlap");
        }
        for &(at, n) in &regions {
            assert_eq!(at % TURBOQUANT_WORKSPACE_ALIGN, 0);
            assert!(at + n <= plan.workspace_bytes());
        }
        assert_eq!(plan.workspace_bytes() % TURBOQUANT_WORKSPACE_ALIGN, 0);
        // the tables come first, the scratch after them
        assert!(plan.table_bytes() <= r.qf);
        let word = |at: usize, i: usize| {
            i32::from_le_bytes(plan.image[at + 4 * i..at + 4 * i + 4].try_into().unwrap())
        };
        assert_eq!(
            (0..3).map(|i| word(a.dst0, i)).collect::<Vec<_>>(),
            [1000, 0, 576]
        );
        assert_eq!(
            (0..3).map(|i| word(a.count, i)).collect::<Vec<_>>(),
            [1, 1, 1]
        );
        assert_eq!(
            (0..3).map(|i| word(r.seqlens_k, i)).collect::<Vec<_>>(),
            [1001, 1, 577]
        );
        let segs: Vec<i32> = (0..dec.segs.len()).map(|i| word(r.segs, i)).collect();
        assert_eq!(segs, dec.segs);
        let ts: Vec<i32> = (0..dec.tile_segs.len())
            .map(|i| word(r.tile_segs, i))
            .collect();
        assert_eq!(ts, dec.tile_segs);
        // a decode-only step: no append tables, a smaller workspace
        let alone = TurboQuantStepPlan::new(Some(dec.clone()), None);
        assert!(alone.workspace_bytes() < plan.workspace_bytes() && alone.app.is_none());
    }
    // a width of 0 and an append past the capacity are refused
    let cfg = TurboQuantConfig::paper_default(&probe);
    let p = AttentionProblem::uniform(1, 1, 16, 8, 8, 128, 128, DType::F16);
    assert!(TurboQuantDecodeTables::new(&cfg, &p, 0, 132).is_err());
    assert!(TurboQuantAppendTables::new(&[1000], &[9], 9, 1008).is_err());
}
