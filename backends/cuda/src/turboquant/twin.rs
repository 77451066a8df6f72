use super::{layout, schedule_tables, ROWS, TILE_K};
use ferrattn_core::turboquant::{CompressedKv, TurboQuantCodec};
use ferrattn_core::{AttentionProblem, Tensor};
use half::f16;

/// The device bytes of a cache (capacity rounded to 16 tokens), as the compression kernels
/// write them in the nibble layout. Codes of at most 2 bits are stored as crumbs on the device
/// ([`layout::crumbs_of_nibbles`]); the decode unpacks a crumb word into exactly the two nibble
/// words held here (`layout::nibble_words_of_crumb_word`, tested), so the twin reads nibbles
/// for every configuration.
pub struct DeviceImage {
    cap: usize,
    kcodes: Vec<u8>,
    ksigns: Vec<u8>,
    knorms: Vec<u32>,
    vcodes: Vec<u8>,
    vnorms: Vec<u16>,
}

fn h(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}
fn f(x: u16) -> f32 {
    f16::from_bits(x).to_f32()
}

/// Lays a [`CompressedKv`] out as the device does.
pub fn image(kv: &CompressedKv) -> DeviceImage {
    let (b_, hk, d) = (kv.batch, kv.heads_kv, kv.head_dim_k);
    let cap = kv.max_seqlen_k.div_ceil(TILE_K).max(1) * TILE_K;
    let rows = b_ * hk * cap;
    let mut im = DeviceImage {
        cap,
        kcodes: vec![0; rows * d / 2],
        ksigns: vec![0; rows * d / 8],
        knorms: vec![0; rows],
        vcodes: vec![0; rows * d / 2],
        vnorms: vec![0; rows],
    };
    for b in 0..b_ {
        for j in 0..kv.seqlens_k[b] {
            for hh in 0..hk {
                let src = (b * kv.max_seqlen_k + j) * hk + hh;
                let dst = (b * hk + hh) * cap + j;
                im.kcodes[dst * d / 2..(dst + 1) * d / 2]
                    .copy_from_slice(&layout::pack_key_codes(&kv.k_idx[src * d..(src + 1) * d]));
                im.ksigns[dst * d / 8..(dst + 1) * d / 8].copy_from_slice(&layout::pack_signs(
                    d,
                    &kv.k_signs[src * d / 8..(src + 1) * d / 8],
                ));
                im.knorms[dst] = h(kv.k_norm[src]) as u32 | (h(kv.r_norm[src]) as u32) << 16;
                im.vnorms[dst] = h(kv.v_norm[src]);
                let pair = ((b * hk + hh) * cap) / 2 + j / 2;
                for beta in 0..d {
                    let c = layout::value_byte_channel(d, beta);
                    im.vcodes[pair * d + beta] |= kv.v_idx[src * d + c] << (4 * (j % 2));
                }
            }
        }
    }
    im
}

/// `prmt.b32` in its default mode.
pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let bytes = (a as u64 | (b as u64) << 32).to_le_bytes();
    (0..4).fold(0u32, |r, i| {
        let n = (sel >> (4 * i)) & 15;
        let byte = bytes[(n & 7) as usize];
        let v = if n & 8 != 0 {
            if byte & 0x80 != 0 {
                0xff
            } else {
                0
            }
        } else {
            byte
        };
        r | (v as u32) << (8 * i)
    })
}

/// `lookup4` of the kernel.
pub fn lookup4(w: u32, t: &[u32; 8], wide: bool) -> (u32, u32) {
    let (lo, hi) = if !wide {
        (prmt(t[0], t[1], w), prmt(t[4], t[5], w))
    } else {
        let sel = w & 0x7777;
        let pick = ((w >> 1) & 0x4444) | 0x3210;
        (
            prmt(prmt(t[0], t[1], sel), prmt(t[2], t[3], sel), pick),
            prmt(prmt(t[4], t[5], sel), prmt(t[6], t[7], sel), pick),
        )
    };
    (prmt(lo, hi, 0x5140), prmt(lo, hi, 0x7362))
}

/// QJL sign pair `jj` of word `w` (bits jj and jj + 16, stored 1 = +1) as the kernel's B
/// fragment (`signs2m` in turboquant_decode.cu): not ±1 but `1 + b 2^(p - 10)`, the bit masked
/// into mantissa bit `p = 6 + jj % 4` of f16 1.0 after the shift of its group of 4 pairs.
fn signs2m(w: u32, jj: u32) -> u32 {
    let g = jj / 4;
    let sh = if 4 * g <= 6 {
        w << (6 - 4 * g)
    } else {
        w >> (4 * g - 6)
    };
    (sh & (0x0040_0040 << (jj % 4))) | 0x3C00_3C00
}

/// log2 of the weight `M = 2^(11 - p)` by which the kernel scales the S q entries of chunk `c`,
/// A register `reg` (0, 1: pair 2c; 2, 3: pair 2c + 1), so that `Σ a B = Σ M Sq + 2 Σ Sq b`.
fn qjl_log2_scale(c: usize, reg: usize) -> i32 {
    5 - 2 * (c % 2) as i32 - (reg / 2) as i32
}

fn half2(w: u32) -> (f32, f32) {
    (f(w as u16), f((w >> 16) as u16))
}

/// `mma.m16n8k16` over a warp: `d[lane] += A B` with the fragments of every lane.
fn mma(d: &mut [[f32; 4]; 32], a: &[[u32; 4]; 32], b0: &[u32; 32], b1: &[u32; 32]) {
    let mut am = [[0f32; 16]; 16];
    let mut bm = [[0f32; 8]; 16];
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        for (r, (row, col)) in [
            (g, 2 * t),
            (g + 8, 2 * t),
            (g, 2 * t + 8),
            (g + 8, 2 * t + 8),
        ]
        .into_iter()
        .enumerate()
        {
            let (x, y) = half2(a[lane][r]);
            am[row][col] = x;
            am[row][col + 1] = y;
        }
        let (x, y) = half2(b0[lane]);
        bm[2 * t][g] = x;
        bm[2 * t + 1][g] = y;
        let (x, y) = half2(b1[lane]);
        bm[2 * t + 8][g] = x;
        bm[2 * t + 9][g] = y;
    }
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        for (e, (row, col)) in [
            (g, 2 * t),
            (g, 2 * t + 1),
            (g + 8, 2 * t),
            (g + 8, 2 * t + 1),
        ]
        .into_iter()
        .enumerate()
        {
            let mut acc = d[lane][e];
            for k in 0..16 {
                acc += (am[row][k] as f64 * bm[k][col] as f64) as f32;
            }
            d[lane][e] = acc;
        }
    }
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| {
            u32::from_le_bytes([
                c[0],
                c[1],
                c.get(2).copied().unwrap_or(0),
                c.get(3).copied().unwrap_or(0),
            ])
        })
        .collect()
}

/// Attention of `q` over the cache image, as the three kernels compute it, with `units`
/// stream-K units. `p.seqlens_k` are the cache's lengths.
pub fn decode(
    codec: &TurboQuantCodec,
    p: &AttentionProblem,
    q: &Tensor,
    im: &DeviceImage,
    units: usize,
) -> (Tensor, Vec<f32>) {
    let d = p.head_dim_qk;
    let (ch, nb) = (d / 16, d / 8);
    let group = p.group_size();
    let st = schedule_tables(p, units);
    let qjl = codec.key_qjl;
    let r8 = group * p.max_seqlen_q <= 8; // the <= 8-row kernels (decode_r8)
    let kwide = codec.key.mse().bits() == 4;
    let vwide = codec.value.bits() == 4;
    let kc = codec.key.mse().codebook().centroids_f32();
    let vc = codec.value.codebook().centroids_f32();
    let (sk, sv) = (super::f16_friendly_scale(kc), super::f16_friendly_scale(vc));
    let ktab = super::centroid_tables(&kc.iter().map(|c| c * sk).collect::<Vec<_>>());
    let vtab = super::centroid_tables(&vc.iter().map(|c| c * sv).collect::<Vec<_>>());
    let log2e = std::f32::consts::LOG2_E;
    let qscale = p.softmax_scale * log2e / sk;
    let pscale = p.softmax_scale * log2e * codec.sketch().correction_scale();
    let pi = codec.key_rotation().matrix();
    let sm = codec.sketch().matrix();
    // ---- prepare_q: A fragments per tile, [tile][lane][chunk][reg] f16x2
    let frag = |tile: usize, lane: usize, c: usize, r: usize| ((tile * 32 + lane) * ch + c) * 4 + r;
    let mut qf = vec![0u32; st.tiles * 32 * ch * 4];
    let mut qlo = qf.clone();
    let mut pf = qf.clone();
    for tile in 0..st.tiles {
        let (qg, hh, b) = (
            tile % st.qgroups,
            (tile / st.qgroups) % p.heads_kv,
            tile / (st.qgroups * p.heads_kv),
        );
        for r in 0..ROWS {
            let rr = qg * ROWS + r;
            let (hl, i) = (rr / p.max_seqlen_q, rr % p.max_seqlen_q);
            if hl >= group || i >= p.seqlens_q[b] {
                continue;
            }
            let qrow = q.row4(b, i, hh * group + hl);
            for o in 0..d {
                let rot: f32 = (0..d).map(|k| pi[o * d + k] * qrow[k]).sum::<f32>() * qscale;
                let proj: f32 = (0..d).map(|k| sm[o * d + k] * qrow[k]).sum::<f32>() * pscale;
                let (c, cc) = (o / 16, o % 16);
                let (eta, e, t) = (cc / 8, cc % 2, (cc % 8) / 2);
                let (lane, reg) = ((r % 8) * 4 + t, r / 8 + 2 * eta);
                let hi = h(rot);
                let at = frag(tile, lane, c, reg);
                qf[at] |= (hi as u32) << (16 * e);
                qlo[at] |= (h(rot - f(hi)) as u32) << (16 * e);
                pf[at] |= (h(proj) as u32) << (16 * e);
            }
        }
    }
    // ---- decode: one warp per unit
    let n_segs = st.segs.len() / 4;
    let mut part_o = vec![0f32; n_segs * ROWS * d];
    let mut part_ml = vec![0f32; n_segs * ROWS * 2];
    for u in 0..st.units {
        for sgi in st.unit_segs[u] as usize..st.unit_segs[u + 1] as usize {
            let (tile, tok0, tok1) = (
                st.segs[4 * sgi] as usize,
                st.segs[4 * sgi + 1] as usize,
                st.segs[4 * sgi + 2] as usize,
            );
            let (qg, hh, b) = (
                tile % st.qgroups,
                (tile / st.qgroups) % p.heads_kv,
                tile / (st.qgroups * p.heads_kv),
            );
            let row_end = |r: usize| {
                let rr = qg * ROWS + r;
                let (hl, i) = (rr / p.max_seqlen_q, rr % p.max_seqlen_q);
                if hl >= group || i >= p.seqlens_q[b] {
                    0
                } else {
                    p.visible_keys(b, i)
                }
            };
            let row0 = (b * p.heads_kv + hh) * im.cap;
            let mut o = [[[0f32; 4]; 32]; 32]; // [n-block][lane][e] (up to d = 256 / 8)
            let (mut m, mut l) = ([[f32::NEG_INFINITY; 2]; 32], [[0f32; 2]; 32]);
            let mut start = tok0;
            while start < tok1 {
                let mut s0 = [[0f32; 4]; 32];
                let mut s1 = s0;
                let mut t0 = s0;
                let mut t1 = s0;
                // at most 8 rows: the odd chunks' T in a second pair of chains from 0 (the
                // kernel stacks chunks 2w and 2w + 1 on MMA rows 0-7 and 8-15: qjl_word), added
                // to the even chunks' chains (from -C) before the scores
                let mut u0 = s0;
                let mut u1 = s0;
                let k0: Vec<Vec<u32>> = (0..32)
                    .map(|lane| {
                        let (g, q4) = (lane / 4, lane % 4);
                        let at = (row0 + start + g) * d / 2 + q4 * d / 8;
                        words(&im.kcodes[at..at + d / 8])
                    })
                    .collect();
                let k1: Vec<Vec<u32>> = (0..32)
                    .map(|lane| {
                        let (g, q4) = (lane / 4, lane % 4);
                        let at = (row0 + start + g + 8) * d / 2 + q4 * d / 8;
                        words(&im.kcodes[at..at + d / 8])
                    })
                    .collect();
                for w in 0..d / 32 {
                    for (kk, sacc) in [(&k0, &mut s0), (&k1, &mut s1)] {
                        let mut b_lo = [[0u32; 32]; 2];
                        let mut b_hi = [[0u32; 32]; 2];
                        for lane in 0..32 {
                            let (x0, x1) = lookup4(kk[lane][w], &ktab, kwide);
                            let (y0, y1) = lookup4(kk[lane][w] >> 16, &ktab, kwide);
                            b_lo[0][lane] = x0;
                            b_lo[1][lane] = x1;
                            b_hi[0][lane] = y0;
                            b_hi[1][lane] = y1;
                        }
                        for (chunk, bb) in [(2 * w, &b_lo), (2 * w + 1, &b_hi)] {
                            for src in [&qf, &qlo] {
                                let a: [[u32; 4]; 32] = std::array::from_fn(|lane| {
                                    std::array::from_fn(|r| src[frag(tile, lane, chunk, r)])
                                });
                                mma(sacc, &a, &bb[0], &bb[1]);
                            }
                        }
                    }
                }
                if qjl {
                    // T = Σ a B - C (signs2m): the accumulators start at -C of their row,
                    // C = Σ_i Sq_i (1 + M_i) summed as the kernel does (per lane over its chunks in
                    // order, registers 0 then 2 for row g, 1 then 3 for row g + 8; then the quad's
                    // lanes as (q0 + q1) + (q2 + q3))
                    let part = |lane: usize, regs: [usize; 2]| -> f32 {
                        let mut acc = 0f32;
                        for c in 0..ch {
                            for reg in regs {
                                let w = pf[frag(tile, lane, c, reg)];
                                let fct = 1.0 + (1u32 << qjl_log2_scale(c, reg)) as f32;
                                let (lo, hi) = half2(w);
                                acc += lo * fct + hi * fct;
                            }
                        }
                        acc
                    };
                    for lane in 0..32 {
                        let quad = lane & !3;
                        for (half, regs) in [(0usize, [0usize, 2]), (1, [1, 3])] {
                            let pq: [f32; 4] = std::array::from_fn(|j| part(quad + j, regs));
                            let c = (pq[0] + pq[1]) + (pq[2] + pq[3]);
                            for tacc in [&mut t0, &mut t1] {
                                tacc[lane][2 * half] = -c;
                                tacc[lane][2 * half + 1] = -c;
                            }
                        }
                    }
                    let sg = |tok: usize, lane: usize| -> u32 {
                        let at = (row0 + tok) * d / 8 + (lane % 4) * d / 32;
                        let wv = words(&im.ksigns[at..at + d / 32])[0];
                        if d == 128 {
                            wv
                        } else {
                            (wv & 0xff) | ((wv & 0xff00) << 8)
                        }
                    };
                    for c in 0..ch {
                        // S q times its pairs' weights, in f16 (exact barring overflow)
                        let a: [[u32; 4]; 32] = std::array::from_fn(|lane| {
                            std::array::from_fn(|r| {
                                let (lo, hi) = half2(pf[frag(tile, lane, c, r)]);
                                let m = (1u32 << qjl_log2_scale(c, r)) as f32;
                                h(lo * m) as u32 | (h(hi * m) as u32) << 16
                            })
                        });
                        let odd = r8 && c % 2 == 1;
                        let (ta, tb) = if odd {
                            (&mut u0, &mut u1)
                        } else {
                            (&mut t0, &mut t1)
                        };
                        for (off, tacc) in [(0usize, ta), (8, tb)] {
                            let b0: [u32; 32] = std::array::from_fn(|lane| {
                                signs2m(sg(start + lane / 4 + off, lane), 2 * c as u32)
                            });
                            let b1: [u32; 32] = std::array::from_fn(|lane| {
                                signs2m(sg(start + lane / 4 + off, lane), 2 * c as u32 + 1)
                            });
                            mma(tacc, &a, &b0, &b1);
                        }
                    }
                    if r8 {
                        for lane in 0..32 {
                            for e in 0..4 {
                                t0[lane][e] += u0[lane][e];
                                t1[lane][e] += u1[lane][e];
                            }
                        }
                    }
                }
                // scores, masking, online softmax per lane (rows g, g + 8)
                let mut pa = [[0u32; 4]; 32];
                let mut sc_all = [[0f32; 8]; 32];
                for lane in 0..32 {
                    let (g, q4) = (lane / 4, lane % 4);
                    let j0 = start + 2 * q4;
                    let kn = |t: usize| half2(im.knorms[row0 + t]);
                    let toks = [j0, j0 + 1, j0 + 8, j0 + 9];
                    let sv = [
                        s0[lane][0],
                        s0[lane][1],
                        s1[lane][0],
                        s1[lane][1],
                        s0[lane][2],
                        s0[lane][3],
                        s1[lane][2],
                        s1[lane][3],
                    ];
                    let tv = [
                        t0[lane][0],
                        t0[lane][1],
                        t1[lane][0],
                        t1[lane][1],
                        t0[lane][2],
                        t0[lane][3],
                        t1[lane][2],
                        t1[lane][3],
                    ];
                    let lims = [tok1.min(row_end(g)), tok1.min(row_end(g + 8))];
                    for e in 0..8 {
                        let (kk, rn) = kn(toks[e % 4]);
                        let mut x = kk * sv[e] + if qjl { rn * tv[e] } else { 0.0 };
                        if toks[e % 4] >= lims[e / 4] {
                            x = f32::NEG_INFINITY;
                        }
                        sc_all[lane][e] = x;
                    }
                }
                for lane in 0..32 {
                    let quad = lane & !3;
                    let mut pr = [0f32; 8];
                    for half in 0..2 {
                        let mx = (quad..quad + 4)
                            .flat_map(|l2| sc_all[l2][4 * half..4 * half + 4].to_vec())
                            .fold(f32::NEG_INFINITY, f32::max);
                        let mn = m[lane][half].max(mx);
                        let mu = if mn == f32::NEG_INFINITY { 0.0 } else { mn };
                        let al = (m[lane][half] - mu).exp2();
                        m[lane][half] = mn;
                        let mut sum = 0.0;
                        for e in 0..4 {
                            pr[4 * half + e] = (sc_all[lane][4 * half + e] - mu).exp2();
                            sum += pr[4 * half + e];
                        }
                        l[lane][half] = l[lane][half] * al + sum;
                        for nblk in o.iter_mut().take(nb) {
                            nblk[lane][2 * half] *= al;
                            nblk[lane][2 * half + 1] *= al;
                        }
                    }
                    let j0 = start + 2 * (lane % 4);
                    let vn = [j0, j0 + 1, j0 + 8, j0 + 9].map(|t| f(im.vnorms[row0 + t]));
                    let pv: [f32; 8] =
                        std::array::from_fn(|e| if pr[e] == 0.0 { 0.0 } else { pr[e] * vn[e % 4] });
                    let pk = |a: f32, b2: f32| h(a) as u32 | (h(b2) as u32) << 16;
                    pa[lane] = [
                        pk(pv[0], pv[1]),
                        pk(pv[4], pv[5]),
                        pk(pv[2], pv[3]),
                        pk(pv[6], pv[7]),
                    ];
                }
                // O_rot += P' · c[idx_v]
                let vw = |pair: usize, lane: usize| -> Vec<u32> {
                    let at = (row0 / 2 + pair) * d + (lane / 4) * d / 8;
                    words(&im.vcodes[at..at + d / 8])
                };
                let v0: Vec<Vec<u32>> =
                    (0..32).map(|lane| vw(start / 2 + lane % 4, lane)).collect();
                let v1: Vec<Vec<u32>> = (0..32)
                    .map(|lane| vw(start / 2 + lane % 4 + 4, lane))
                    .collect();
                for w in 0..d / 32 {
                    let mut bs = [[[0u32; 32]; 4]; 2];
                    for lane in 0..32 {
                        for (which, vv) in [(0usize, &v0), (1, &v1)] {
                            let (a0, a1) = lookup4(vv[lane][w], &vtab, vwide);
                            let (a2, a3) = lookup4(vv[lane][w] >> 16, &vtab, vwide);
                            bs[which][0][lane] = a0;
                            bs[which][1][lane] = a1;
                            bs[which][2][lane] = a2;
                            bs[which][3][lane] = a3;
                        }
                    }
                    for k in 0..4 {
                        mma(&mut o[4 * w + k], &pa, &bs[0][k], &bs[1][k]);
                    }
                }
                start += TILE_K;
            }
            for lane in 0..32 {
                let (g, q4) = (lane / 4, lane % 4);
                let quad = lane & !3;
                for half in 0..2 {
                    let row = g + 8 * half;
                    let lsum: f32 = (quad..quad + 4).map(|l2| l[l2][half]).sum();
                    if q4 == 0 {
                        part_ml[(sgi * ROWS + row) * 2] = m[lane][half];
                        part_ml[(sgi * ROWS + row) * 2 + 1] = lsum;
                    }
                    for (n, nblk) in o.iter().take(nb).enumerate() {
                        part_o[(sgi * ROWS + row) * d + 8 * n + 2 * q4] = nblk[lane][2 * half];
                        part_o[(sgi * ROWS + row) * d + 8 * n + 2 * q4 + 1] =
                            nblk[lane][2 * half + 1];
                    }
                }
            }
        }
    }
    // ---- combine
    let mut out = Tensor::zeros(&[p.batch, p.max_seqlen_q, p.heads_q, d], p.dtype);
    let mut lse = vec![f32::NEG_INFINITY; p.batch * p.heads_q * p.max_seqlen_q];
    let piv = codec.value_rotation().matrix();
    for tile in 0..st.tiles {
        let (qg, hh, b) = (
            tile % st.qgroups,
            (tile / st.qgroups) % p.heads_kv,
            tile / (st.qgroups * p.heads_kv),
        );
        let segs = st.tile_segs[tile] as usize..st.tile_segs[tile + 1] as usize;
        for r in 0..ROWS {
            let rr = qg * ROWS + r;
            let (hl, i) = (rr / p.max_seqlen_q, rr % p.max_seqlen_q);
            if hl >= group || i >= p.seqlens_q[b] {
                continue;
            }
            let m = segs
                .clone()
                .map(|s| part_ml[(s * ROWS + r) * 2])
                .fold(f32::NEG_INFINITY, f32::max);
            if m == f32::NEG_INFINITY {
                continue;
            }
            let mut l = 0.0;
            let mut orot = vec![0f32; d];
            for s in segs.clone() {
                let fct = (part_ml[(s * ROWS + r) * 2] - m).exp2();
                l += part_ml[(s * ROWS + r) * 2 + 1] * fct;
                for c in 0..d {
                    orot[c] += part_o[(s * ROWS + r) * d + c] * fct;
                }
            }
            if l <= 0.0 {
                continue;
            }
            let head = hh * group + hl;
            let dst = out.row4_mut(b, i, head);
            for (oo, x) in dst.iter_mut().enumerate() {
                *x = (0..d)
                    .map(|k| piv[k * d + oo] * (orot[k] / l * (1.0 / sv)))
                    .sum();
            }
            lse[(b * p.heads_q + head) * p.max_seqlen_q + i] =
                (m + l.log2()) * std::f32::consts::LN_2;
        }
    }
    (out, lse)
}
