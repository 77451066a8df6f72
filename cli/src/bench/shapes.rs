//! The standard shape table of `ferrattn bench`: which problems each suite runs.
//!
//! - Lean paper (LeanAttention section 5: 56 heads, head dim 64, batch 1-64, context 1k-256k) and
//!   Llama-3-8B decode (32 query / 8 KV heads, head dim 128): uniform batches, one query token.
//! - Ragged batches: one sequence at the longest context, the others uniform around a mean that is
//!   10%, 25%, 50% or 100% of it (the heterogeneity of Lean Fig. 11).
//! - TurboAttention prefill (Llama heads, bf16, causal and not) and decode over 4-bit and mixed
//!   2/4-bit caches at 1 GB of fp16-equivalent KV and beyond (TurboAttention section 5).
//! - TurboQuant decode: on the CPU until the CUDA kernels land (issue 10).
//! - MLA decode on the SIMULATED Ascend 910 (AMLA section 5.2: batch 96, 128 heads, 576/512,
//!   Sq 1 and 2, Sk 1k-16k).
//! - Small host rows: every algorithm's CPU emulation.
//!
//! `quick` is a few rows per family (under 2 minutes on one H200, seconds on a CPU); `standard`
//! reproduces the tables of `docs/BENCHMARKS.md`; `full` adds the long contexts.

use ferrattn_core::DType;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// How much to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Suite {
    /// A few rows per algorithm.
    Quick,
    /// The documented tables.
    Standard,
    /// The documented tables and the long rows.
    Full,
}

impl Suite {
    /// Parses `quick`, `standard`, `full`.
    pub fn parse(s: &str) -> Option<Suite> {
        Some(match s {
            "quick" => Suite::Quick,
            "standard" => Suite::Standard,
            "full" => Suite::Full,
            _ => return None,
        })
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Suite::Quick => "quick",
            Suite::Standard => "standard",
            Suite::Full => "full",
        }
    }
}

/// A group of rows shown as one table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// Lean paper decode shapes.
    LeanPaper,
    /// Llama-3-8B decode shapes.
    #[serde(rename = "llama3-8b-decode", alias = "llama3-decode")]
    Llama3Decode,
    /// Ragged decode batches.
    Ragged,
    /// TurboAttention prefill.
    TurboPrefill,
    /// TurboAttention decode over a compressed cache.
    TurboDecode,
    /// TurboQuant decode over a compressed cache.
    #[serde(rename = "turboquant-decode", alias = "turbo-quant-decode")]
    TurboQuantDecode,
    /// MLA decode on the simulated Ascend 910.
    #[serde(rename = "mla-910-simulated", alias = "mla910")]
    Mla910,
    /// Every CPU emulation on small problems.
    Host,
}

impl Family {
    /// Every family, in report order.
    pub const ALL: [Family; 8] = [
        Family::LeanPaper,
        Family::Llama3Decode,
        Family::Ragged,
        Family::TurboPrefill,
        Family::TurboDecode,
        Family::TurboQuantDecode,
        Family::Host,
        Family::Mla910,
    ];

    /// Stable name (JSON, report headings).
    pub fn name(self) -> &'static str {
        match self {
            Family::LeanPaper => "lean-paper",
            Family::Llama3Decode => "llama3-8b-decode",
            Family::Ragged => "ragged",
            Family::TurboPrefill => "turbo-prefill",
            Family::TurboDecode => "turbo-decode",
            Family::TurboQuantDecode => "turboquant-decode",
            Family::Mla910 => "mla-910-simulated",
            Family::Host => "host",
        }
    }
}

/// One attention problem of the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    /// The table it belongs to.
    pub family: Family,
    /// Sequences.
    pub batch: usize,
    /// Query tokens per sequence.
    pub sq: usize,
    /// KV tokens of each sequence (ragged when they differ).
    pub lens: Vec<usize>,
    /// Query heads.
    pub hq: usize,
    /// KV heads (1 for MLA's shared latent).
    pub hk: usize,
    /// Q/K head dim.
    pub d: usize,
    /// V head dim.
    pub dv: usize,
    /// Element type of the inputs.
    pub dtype: DType,
    /// Bottom-right aligned causal mask.
    pub causal: bool,
}

impl Shape {
    fn decode(
        family: Family,
        batch: usize,
        ctx: usize,
        hq: usize,
        hk: usize,
        d: usize,
        dtype: DType,
    ) -> Shape {
        Shape {
            family,
            batch,
            sq: 1,
            lens: vec![ctx; batch],
            hq,
            hk,
            d,
            dv: d,
            dtype,
            causal: false,
        }
    }

    /// Longest KV length.
    pub fn max_ctx(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }

    /// Mean KV length.
    pub fn mean_ctx(&self) -> f64 {
        self.lens.iter().sum::<usize>() as f64 / self.lens.len().max(1) as f64
    }

    /// Whether the sequences differ in length.
    pub fn is_ragged(&self) -> bool {
        self.lens.windows(2).any(|w| w[0] != w[1])
    }

    /// The problem (default softmax scale).
    pub fn problem(&self) -> ferrattn_core::AttentionProblem {
        let mut p = ferrattn_core::AttentionProblem::uniform(
            self.batch,
            self.sq,
            self.max_ctx(),
            self.hq,
            self.hk,
            self.d,
            self.dv,
            self.dtype,
        );
        p.seqlens_k = self.lens.clone();
        p.causal = self.causal;
        p
    }

    /// Bytes of K and V of valid tokens at the input dtype (MLA: the latent once).
    pub fn kv_bytes(&self) -> usize {
        let per_token = if self.family == Family::Mla910 {
            self.d
        } else {
            self.d + self.dv
        };
        self.lens.iter().sum::<usize>() * self.hk * per_token * self.dtype.size_bytes()
    }

    /// Multiply-adds x 2 of QK^T and PV over visible keys.
    pub fn flops(&self) -> f64 {
        let mut f = 0.0;
        for &l in &self.lens {
            for i in 0..self.sq {
                let visible = if self.causal {
                    (i + 1 + l).saturating_sub(self.sq).min(l)
                } else {
                    l
                };
                f += 2.0 * (self.hq * visible * (self.d + self.dv)) as f64;
            }
        }
        f
    }
}

/// Decode lengths for a ragged batch: one sequence at `max`, the others uniform in
/// `[1, 2m - 1]` for the mean `m` that makes the batch mean `pct`% of `max` (seeded).
pub fn ragged_lens(batch: usize, max: usize, pct: usize, seed: u64) -> Vec<usize> {
    if pct >= 100 || batch < 2 {
        return vec![max; batch];
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let m = ((max * pct / 100) * batch).saturating_sub(max) / (batch - 1);
    (0..batch)
        .map(|i| {
            if i == 0 {
                max
            } else {
                rng.gen_range(1..=(2 * m).clamp(2, max))
            }
        })
        .collect()
}

fn grid(
    family: Family,
    batches: &[usize],
    ctxs: &[usize],
    max_tokens: usize,
    heads: Heads,
) -> Vec<Shape> {
    let (hq, hk, d, dtype) = heads;
    let mut v = vec![];
    for &b in batches {
        for &c in ctxs {
            if b * c <= max_tokens {
                v.push(Shape::decode(family, b, c, hq, hk, d, dtype));
            }
        }
    }
    v
}

/// Query heads, KV heads, head dim, dtype.
type Heads = (usize, usize, usize, DType);

const LEAN_HEADS: Heads = (56, 56, 64, DType::F16);
const LLAMA_HEADS: Heads = (32, 8, 128, DType::BF16);

/// The GPU decode shapes of the Lean kernel: Lean paper, Llama-3-8B, ragged.
pub fn lean_shapes(suite: Suite) -> Vec<Shape> {
    let mut v = vec![];
    match suite {
        Suite::Quick => {
            for (b, c) in [(1, 1024), (1, 16384), (4, 65536)] {
                v.push(Shape::decode(
                    Family::LeanPaper,
                    b,
                    c,
                    56,
                    56,
                    64,
                    DType::F16,
                ));
            }
            for (b, c) in [(1, 8192), (8, 32768), (32, 1024)] {
                v.push(Shape::decode(
                    Family::Llama3Decode,
                    b,
                    c,
                    32,
                    8,
                    128,
                    DType::BF16,
                ));
            }
        }
        Suite::Standard | Suite::Full => {
            // Lean paper: <= 1M tokens (15 GB of f16 KV)
            v.extend(grid(
                Family::LeanPaper,
                &[1, 4, 16, 64],
                &[1024, 4096, 16384, 65536, 262144],
                1 << 20,
                LEAN_HEADS,
            ));
            // Llama-3-8B: <= 4M tokens (17 GB of bf16 KV)
            v.extend(grid(
                Family::Llama3Decode,
                &[1, 8, 32, 64, 128],
                &[1024, 8192, 32768, 131072],
                1 << 22,
                LLAMA_HEADS,
            ));
            if suite == Suite::Full {
                v.push(Shape::decode(
                    Family::LeanPaper,
                    1,
                    1 << 20,
                    56,
                    56,
                    64,
                    DType::F16,
                ));
                v.push(Shape::decode(
                    Family::LeanPaper,
                    16,
                    131072,
                    56,
                    56,
                    64,
                    DType::F16,
                ));
                v.push(Shape::decode(
                    Family::Llama3Decode,
                    1,
                    1 << 19,
                    32,
                    8,
                    128,
                    DType::BF16,
                ));
                v.push(Shape::decode(
                    Family::Llama3Decode,
                    1,
                    1 << 20,
                    32,
                    8,
                    128,
                    DType::BF16,
                ));
                v.push(Shape::decode(
                    Family::Llama3Decode,
                    4,
                    1 << 19,
                    32,
                    8,
                    128,
                    DType::BF16,
                ));
            }
        }
    }
    // (batch, longest context, heads, mean/max percentages)
    let ragged: &[(usize, usize, Heads, &[usize])] = match suite {
        Suite::Quick => &[(16, 32768, LLAMA_HEADS, &[25, 100])],
        Suite::Standard | Suite::Full => &[
            (16, 32768, LLAMA_HEADS, &[10, 25, 50, 100]),
            (64, 32768, LLAMA_HEADS, &[10, 25, 50, 100]),
            (16, 65536, LEAN_HEADS, &[10, 25, 50, 100]),
        ],
    };
    for (i, &(b, max, (hq, hk, d, dtype), pcts)) in ragged.iter().enumerate() {
        for &pct in pcts {
            v.push(Shape {
                lens: ragged_lens(b, max, pct, 17 + i as u64),
                ..Shape::decode(Family::Ragged, b, max, hq, hk, d, dtype)
            });
        }
    }
    v
}

/// TurboAttention prefill shapes: (batch, length) x causal, Llama heads, bf16.
pub fn turbo_prefill_shapes(suite: Suite) -> Vec<Shape> {
    let sizes: &[(usize, usize)] = match suite {
        Suite::Quick => &[(4, 1024), (1, 8192)],
        Suite::Standard => &[(4, 1024), (4, 4096), (1, 16384), (1, 32768)],
        Suite::Full => &[(4, 1024), (4, 4096), (1, 16384), (1, 32768), (1, 65536)],
    };
    let mut v = vec![];
    for &(b, s) in sizes {
        for causal in [false, true] {
            v.push(Shape {
                family: Family::TurboPrefill,
                batch: b,
                sq: s,
                lens: vec![s; b],
                hq: 32,
                hk: 8,
                d: 128,
                dv: 128,
                dtype: DType::BF16,
                causal,
            });
        }
    }
    v
}

/// TurboAttention decode shapes (one token over a compressed cache), Llama heads, bf16.
pub fn turbo_decode_shapes(suite: Suite) -> Vec<Shape> {
    let sizes: &[(usize, usize)] = match suite {
        Suite::Quick => &[(4, 4096), (8, 32768)],
        Suite::Standard => &[
            (1, 16384),
            (4, 16384),
            (64, 4096),
            (16, 16384),
            (8, 32768),
            (2, 131072),
            (32, 32768),
            (8, 131072),
        ],
        Suite::Full => &[
            (1, 16384),
            (4, 16384),
            (64, 4096),
            (16, 16384),
            (8, 32768),
            (2, 131072),
            (32, 32768),
            (8, 131072),
            (1, 524288),
            (8, 262144),
        ],
    };
    sizes
        .iter()
        .map(|&(b, c)| Shape::decode(Family::TurboDecode, b, c, 32, 8, 128, DType::BF16))
        .collect()
}

/// TurboQuant decode shapes. On the CPU (the emulation) these are small; on CUDA (issue 10's
/// targets: batch 1 at 32k, and >= 1 GB of fp16-equivalent K/V) Llama-3-8B heads, f16.
pub fn turboquant_decode_shapes(suite: Suite, on_gpu: bool) -> Vec<Shape> {
    if on_gpu {
        let sizes: &[(usize, usize)] = match suite {
            Suite::Quick => &[(1, 32768), (16, 16384)],
            Suite::Standard | Suite::Full => &[
                (1, 32768),
                (1, 131072),
                (4, 16384),
                (16, 16384),
                (64, 4096),
                (32, 32768),
            ],
        };
        return sizes
            .iter()
            .map(|&(b, c)| Shape::decode(Family::TurboQuantDecode, b, c, 32, 8, 128, DType::F16))
            .collect();
    }
    let sizes: &[(usize, usize)] = match suite {
        Suite::Quick => &[(1, 256)],
        Suite::Standard | Suite::Full => &[(1, 1024), (1, 4096)],
    };
    sizes
        .iter()
        .map(|&(b, c)| Shape::decode(Family::TurboQuantDecode, b, c, 32, 8, 128, DType::F16))
        .collect()
}

/// MLA decode on the simulated Ascend 910: AMLA section 5.2 (batch 96, 128 heads, latent 576,
/// V 512, bf16).
pub fn mla_shapes(suite: Suite) -> Vec<Shape> {
    let (sqs, sks): (&[usize], &[usize]) = match suite {
        Suite::Quick => (&[1, 2], &[1024]),
        Suite::Standard | Suite::Full => (&[1, 2], &[1024, 2048, 3072, 4096, 6144, 16384]),
    };
    let mut v = vec![];
    for &sq in sqs {
        for &sk in sks {
            v.push(Shape {
                family: Family::Mla910,
                batch: 96,
                sq,
                lens: vec![sk; 96],
                hq: 128,
                hk: 1,
                d: 576,
                dv: 512,
                dtype: DType::BF16,
                causal: false,
            });
        }
    }
    v
}

/// Small problems for every CPU emulation (the CPU backend runs all five algorithms).
pub fn host_shapes(suite: Suite) -> Vec<Shape> {
    // quick: sized so the whole CPU part runs in seconds on a two-core CI machine
    let (ctx, sq) = if suite == Suite::Quick {
        (512, 128)
    } else {
        (2048, 256)
    };
    let mut v = vec![
        Shape::decode(Family::Host, 1, ctx, 32, 8, 128, DType::F16),
        Shape {
            lens: vec![ctx, ctx * 3 / 20, ctx / 2, ctx / 32],
            ..Shape::decode(Family::Host, 4, ctx, 32, 8, 128, DType::F16)
        },
        Shape {
            sq,
            lens: vec![sq],
            causal: true,
            ..Shape::decode(Family::Host, 1, sq, 32, 8, 128, DType::F16)
        },
        Shape {
            sq: 2,
            hk: 1,
            d: 576,
            dv: 512,
            ..Shape::decode(Family::Host, 1, ctx, 16, 1, 576, DType::BF16)
        },
    ];
    if suite != Suite::Quick {
        v.push(Shape::decode(Family::Host, 4, 8192, 32, 8, 128, DType::F16));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_reproduces_the_documented_lean_tables() {
        let v = lean_shapes(Suite::Standard);
        let n = |f: Family| v.iter().filter(|s| s.family == f).count();
        // docs/BENCHMARKS.md at 76fab82: 17 Lean-paper, 18 Llama, 12 ragged rows
        assert_eq!(
            (
                n(Family::LeanPaper),
                n(Family::Llama3Decode),
                n(Family::Ragged)
            ),
            (17, 18, 12)
        );
        assert!(lean_shapes(Suite::Full).len() > v.len());
        assert!(lean_shapes(Suite::Quick).len() < 12);
    }

    #[test]
    fn ragged_means_hit_their_targets() {
        for pct in [10usize, 25, 50] {
            let l = ragged_lens(64, 32768, pct, 18);
            let mean = l.iter().sum::<usize>() as f64 / 64.0 / 32768.0;
            assert_eq!(l[0], 32768);
            assert!(
                (mean - pct as f64 / 100.0).abs() < 0.06,
                "{pct}%: mean {mean}"
            );
        }
        assert_eq!(ragged_lens(4, 100, 100, 1), vec![100; 4]);
    }

    #[test]
    fn every_shape_is_a_valid_problem() {
        for s in Suite::ALL_FOR_TESTS {
            let all = [
                lean_shapes(s),
                turbo_prefill_shapes(s),
                turbo_decode_shapes(s),
                turboquant_decode_shapes(s, false),
                turboquant_decode_shapes(s, true),
                mla_shapes(s),
                host_shapes(s),
            ];
            for sh in all.iter().flatten() {
                sh.problem()
                    .validate()
                    .unwrap_or_else(|e| panic!("{sh:?}: {e}"));
            }
        }
    }

    #[test]
    fn json_names_are_the_report_names() {
        for f in Family::ALL {
            assert_eq!(
                serde_json::to_string(&f).unwrap(),
                format!("{:?}", f.name())
            );
        }
    }

    #[test]
    fn flops_count_causal_rows_by_visible_keys() {
        let s = &turbo_prefill_shapes(Suite::Quick)[..2];
        let (full, causal) = (s[0].flops(), s[1].flops());
        // S^2 / 2 + S / 2 visible pairs per head when causal
        let n = 1024.0;
        assert!((causal / full - (n * (n + 1.0) / 2.0) / (n * n)).abs() < 1e-12);
    }

    impl Suite {
        const ALL_FOR_TESTS: [Suite; 3] = [Suite::Quick, Suite::Standard, Suite::Full];
    }
}
