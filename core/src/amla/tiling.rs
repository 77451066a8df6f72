//! AMLA hierarchical tiling (section 4.2) and the memory model it must fit (Table 1).
//!
//! Both Cube stages run the pipe chain MTE2 (GM -> L1) -> MTE1 (L1 -> L0A/L0B) -> MMAD (-> L0C)
//! -> FixP (L0C -> GM) (Eq. 10). Per FlashAttention iteration the Cube core computes
//! `[C1] S = Q K^T` (`M x N x K = M x 512 x 576`) and `[C2] O_i = P V` (`M x 512 x 512`), with
//! `M` query rows (heads x query tokens: 256 = 128 heads x 2 tokens with MTP).
//!
//! Data is tiled twice: GM -> L1 in `singleM x singleK` (Q, P) and `singleN x singleK` (K, V)
//! tiles, L1 -> L0 in `baseM x baseK` and `baseN x baseK` tiles. L1 (512 KB) is seven 72 KB
//! buffers: four keep Q (then P) resident for the iteration, three stream K / V. L0A/L0B (64 KB)
//! and L0C (128 KB) are double-buffered, so `baseM baseK 2 B <= 32 KB`, `baseN baseK 2 B <= 32 KB`
//! and `baseM baseN 4 B <= 64 KB`; `baseM = baseN = 128` with `baseK = 96` (C1) or 128 (C2). Each
//! `baseM x baseN` output tile accumulates over the whole K extent in L0C before one FixP.
//!
//! One reading had to be chosen: the paper lists `singleN = 256` for both stages, but a
//! `256 x 288` BF16 K tile is 144 KB, two of the 72 KB buffers, which would leave the "three-buffer
//! pipeline" for K/V unable to hold even two tiles. We read `singleN` as the N extent one pass over
//! a resident Q/P stripe covers, streamed through the ring as `singleN / baseN` tiles of
//! `baseN x singleK` (72 KB for C1, 64 KB for C2); that is the only reading under which three
//! 72 KB buffers triple-buffer K and V, and it keeps `[C1]` and `[C2]` on identical L1 tiling
//! (Remark 4.1).
//!
//! The Vector side (not given in the paper) is ours: each of the two Vector cores of a Cube core
//! owns `M / 2` rows of S and processes them in `vector_rows`-row chunks, double-buffered in UB.
//!
//! [`HierarchicalTiling::validate`] rejects a tiling that overflows any buffer of a [`CubeTarget`]
//! with `CoreError::InvalidPlan` naming the buffer, what it needs and its capacity.
//! [`HierarchicalTiling::balance`] evaluates the block-size inequality of section 4.2,
//! `M N K 2 / (n_c f F) >= N K sizeof(BF16) / BW`: Cube time per block must cover loading its K/V.

use crate::{CoreError, Result};
use serde::{Deserialize, Serialize};

const KIB: usize = 1024;
const BF16: usize = 2;
const FP32: usize = 4;

/// Memory capacities and rates of one Ascend target (Table 1, section 2.3, section 4.2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CubeTarget {
    /// Human-readable name.
    pub name: String,
    /// L1 buffer of one Cube core, bytes (512 KB).
    pub l1_bytes: usize,
    /// L0A (left matmul operand), bytes (64 KB).
    pub l0a_bytes: usize,
    /// L0B (right matmul operand), bytes (64 KB).
    pub l0b_bytes: usize,
    /// L0C (FP32 accumulator), bytes (128 KB).
    pub l0c_bytes: usize,
    /// Unified Buffer of one Vector core, bytes (192 KB).
    pub ub_bytes: usize,
    /// Vector cores per Cube core (2 on Da Vinci V220).
    pub vector_per_cube: usize,
    /// Cube cores of the whole chip, `n_c` of section 4.2 (48 = 2 dies x 24).
    pub cube_cores: usize,
    /// Core clock `f`, Hz.
    pub clock_hz: f64,
    /// BF16 FLOPs per Cube core per clock, `F_BF16` (a 16x16x16 MAC array: 8192).
    pub cube_flops_per_clock: f64,
    /// HBM bandwidth of the whole chip, bytes/s (`BW_HBM` = 3.2 TB/s = 2 x 1.6 TB/s).
    pub hbm_bytes_per_s: f64,
}

impl CubeTarget {
    /// Ascend 910 (Da Vinci V220), both dies.
    ///
    /// Table 1 gives the buffer sizes and 1.6 TB/s HBM per die; section 4.2 gives `n_c = 48` and
    /// 3.2 TB/s. The clock is not stated: 614 TFLOPS at 86.8 % FU (section 5) puts the peak at
    /// 707 TFLOPS, which 48 cores of 16x16x16 BF16 MACs per cycle (8192 FLOPs) reach at 1.8 GHz.
    pub fn ascend910() -> CubeTarget {
        CubeTarget {
            name: "Ascend 910 (2 dies x 24 Cube + 48 Vector cores, Da Vinci V220)".into(),
            l1_bytes: 512 * KIB,
            l0a_bytes: 64 * KIB,
            l0b_bytes: 64 * KIB,
            l0c_bytes: 128 * KIB,
            ub_bytes: 192 * KIB,
            vector_per_cube: 2,
            cube_cores: 48,
            clock_hz: 1.8e9,
            cube_flops_per_clock: 8192.0,
            hbm_bytes_per_s: 3.2e12,
        }
    }

    /// Peak BF16 FLOP/s of the chip, `n_c f F`.
    pub fn peak_flops(&self) -> f64 {
        self.cube_cores as f64 * self.clock_hz * self.cube_flops_per_clock
    }
}

/// Tiling of one Cube stage (`[C1]` or `[C2]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageTiling {
    /// Output columns N of the stage (C1: KV block tokens; C2: Dv).
    pub n: u32,
    /// Reduction extent K (C1: Dk = 576; C2: KV block tokens).
    pub k: u32,
    /// Rows of a Q/P stripe moved GM -> L1 (singleM).
    pub single_m: u32,
    /// Output columns one pass over a resident stripe covers (singleN).
    pub single_n: u32,
    /// Reduction extent of one L1 tile (singleK).
    pub single_k: u32,
    /// Rows of an L0A tile (baseM).
    pub base_m: u32,
    /// Columns of an L0B tile and of an L0C output tile (baseN).
    pub base_n: u32,
    /// Reduction extent of one MMAD (baseK).
    pub base_k: u32,
}

impl StageTiling {
    /// MMADs accumulated into one `baseM x baseN` L0C tile before its FixP (`K / baseK`).
    pub fn fixp_accumulate(&self) -> usize {
        (self.k / self.base_k) as usize
    }

    /// Bytes of one K/V tile in L1 (`baseN x singleK` BF16).
    pub fn kv_tile_bytes(&self) -> usize {
        self.base_n as usize * self.single_k as usize * BF16
    }
}

/// Single/base tile sizes and buffer counts of both Cube stages and the Vector stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HierarchicalTiling {
    /// Query rows per FlashAttention iteration, M (heads x query tokens; 256 in the paper).
    pub m: u32,
    /// KV tokens per block (512 in section 4.2).
    pub block_k: u32,
    /// `[C1] S = Q K^T`: N = 512, K = 576.
    pub c1: StageTiling,
    /// `[C2] O_i = P V`: N = K = 512.
    pub c2: StageTiling,
    /// Bytes per L1 buffer (72 KB).
    pub l1_buffer_bytes: u32,
    /// L1 buffers keeping Q, then P, resident for an iteration (4).
    pub l1_qp_buffers: u32,
    /// L1 buffers of the K/V ring (3: triple buffering).
    pub l1_kv_buffers: u32,
    /// Buffers of each of L0A and L0B (2: double buffering).
    pub l0ab_buffers: u32,
    /// Buffers of L0C (2: double buffering).
    pub l0c_buffers: u32,
    /// Rows of S one Vector core takes into UB per pass of `[V1]`.
    pub vector_rows: u32,
    /// UB buffers for those passes (2: double buffering).
    pub ub_buffers: u32,
}

impl HierarchicalTiling {
    /// The paper's Ascend 910 values (section 4.2) for M = 256 (128 heads x 2 query tokens).
    pub fn ascend910() -> HierarchicalTiling {
        HierarchicalTiling::ascend910_rows(256).expect("256 rows is the paper's case")
    }

    /// The paper's tiling with M = `rows` query rows (a multiple of 128, at most 256: 128 heads
    /// without MTP, or with MTP 2).
    pub fn ascend910_rows(rows: usize) -> Result<HierarchicalTiling> {
        if rows == 0 || !rows.is_multiple_of(128) || rows > 256 {
            return Err(CoreError::Unsupported {
                what: format!("AMLA tiling for M = {rows} query rows"),
                supported: "M = 128 or 256 (128 heads x 1 or 2 query tokens)".into(),
            });
        }
        let block_k = 512;
        Ok(HierarchicalTiling {
            m: rows as u32,
            block_k,
            c1: StageTiling {
                n: block_k,
                k: 576,
                single_m: 128,
                single_n: 256,
                single_k: 288,
                base_m: 128,
                base_n: 128,
                base_k: 96,
            },
            c2: StageTiling {
                n: 512,
                k: block_k,
                single_m: 128,
                single_n: 256,
                single_k: 256,
                base_m: 128,
                base_n: 128,
                base_k: 128,
            },
            l1_buffer_bytes: 72 * KIB as u32,
            l1_qp_buffers: 4,
            l1_kv_buffers: 3,
            l0ab_buffers: 2,
            l0c_buffers: 2,
            vector_rows: 16,
            ub_buffers: 2,
        })
    }

    /// Checks divisibility and that every buffer fits `target`; the error names the buffer, the
    /// bytes it needs and its capacity.
    pub fn validate(&self, target: &CubeTarget) -> Result<()> {
        let reject = |m: String| Err(CoreError::InvalidPlan(m));
        let u = |x: u32| x as usize;
        if self.c1.n != self.block_k || self.c2.k != self.block_k {
            return reject(format!(
                "tiling: C1 N = {} and C2 K = {} must both equal the KV block {}",
                self.c1.n, self.c2.k, self.block_k
            ));
        }
        if self.c1.single_m != self.c2.single_m || self.c1.single_n != self.c2.single_n {
            return reject("tiling: C1 and C2 must share singleM and singleN (Remark 4.1)".into());
        }
        for (name, s) in [("C1", &self.c1), ("C2", &self.c2)] {
            for (what, outer, inner) in [
                ("M", u(self.m), u(s.single_m)),
                ("singleM", u(s.single_m), u(s.base_m)),
                ("N", u(s.n), u(s.single_n)),
                ("singleN", u(s.single_n), u(s.base_n)),
                ("K", u(s.k), u(s.single_k)),
                ("singleK", u(s.single_k), u(s.base_k)),
            ] {
                if inner == 0 || !outer.is_multiple_of(inner) {
                    return reject(format!(
                        "tiling {name}: {what} = {outer} is not a multiple of {inner}"
                    ));
                }
            }
            // Cube fractal: 16 x 16 BF16 blocks
            for (what, v) in [
                ("baseM", s.base_m),
                ("baseN", s.base_n),
                ("baseK", s.base_k),
            ] {
                if v % 16 != 0 {
                    return reject(format!(
                        "tiling {name}: {what} = {v} is not a multiple of the 16-wide fractal"
                    ));
                }
            }
        }
        if self.l0ab_buffers == 0
            || self.l0c_buffers == 0
            || self.ub_buffers == 0
            || self.l1_kv_buffers < 2
        {
            return reject(format!(
                "tiling: buffer counts L1 K/V {}, L0A/B {}, L0C {}, UB {}; need K/V >= 2 and the rest >= 1",
                self.l1_kv_buffers, self.l0ab_buffers, self.l0c_buffers, self.ub_buffers
            ));
        }
        let fit = |buffer: &str, need: usize, cap: usize, how: String| -> Result<()> {
            if need > cap {
                Err(CoreError::InvalidPlan(format!(
                    "{buffer} overflows: needs {need} B ({how}) but holds {cap} B"
                )))
            } else {
                Ok(())
            }
        };
        let b = u(self.l1_buffer_bytes);
        // L1: the Q/P buffers keep all of Q (M x 576) and later all of P (M x 512)
        let qp_cap = u(self.l1_qp_buffers) * b;
        fit(
            "L1 Q/P buffers",
            u(self.m) * u(self.c1.k) * BF16,
            qp_cap,
            format!("Q {} x {} BF16", self.m, self.c1.k),
        )?;
        fit(
            "L1 Q/P buffers",
            u(self.m) * u(self.c2.k) * BF16,
            qp_cap,
            format!("P {} x {} BF16", self.m, self.c2.k),
        )?;
        for (name, s) in [("C1", &self.c1), ("C2", &self.c2)] {
            fit(
                &format!("L1 buffer ({name} Q/P stripe)"),
                u(s.single_m) * u(s.single_k) * BF16,
                b,
                format!("singleM {} x singleK {} BF16", s.single_m, s.single_k),
            )?;
            fit(
                &format!("L1 buffer ({name} K/V tile)"),
                s.kv_tile_bytes(),
                b,
                format!("baseN {} x singleK {} BF16", s.base_n, s.single_k),
            )?;
            fit(
                "L0A",
                u(self.l0ab_buffers) * u(s.base_m) * u(s.base_k) * BF16,
                target.l0a_bytes,
                format!(
                    "{name}: {} buffers x baseM {} x baseK {} BF16",
                    self.l0ab_buffers, s.base_m, s.base_k
                ),
            )?;
            fit(
                "L0B",
                u(self.l0ab_buffers) * u(s.base_n) * u(s.base_k) * BF16,
                target.l0b_bytes,
                format!(
                    "{name}: {} buffers x baseN {} x baseK {} BF16",
                    self.l0ab_buffers, s.base_n, s.base_k
                ),
            )?;
            fit(
                "L0C",
                u(self.l0c_buffers) * u(s.base_m) * u(s.base_n) * FP32,
                target.l0c_bytes,
                format!(
                    "{name}: {} buffers x baseM {} x baseN {} FP32",
                    self.l0c_buffers, s.base_m, s.base_n
                ),
            )?;
        }
        fit(
            "L1",
            u(self.l1_qp_buffers + self.l1_kv_buffers) * b,
            target.l1_bytes,
            format!(
                "{} Q/P + {} K/V buffers of {b} B",
                self.l1_qp_buffers, self.l1_kv_buffers
            ),
        )?;
        // UB: per pass, S rows in FP32 plus P rows in BF16; row statistics m, l, n, S16 in FP32
        let rows_per_vector = u(self.m).div_ceil(target.vector_per_cube);
        if self.vector_rows == 0 || !rows_per_vector.is_multiple_of(u(self.vector_rows)) {
            return reject(format!(
                "tiling: vector_rows = {} does not divide the {rows_per_vector} rows a Vector core owns",
                self.vector_rows
            ));
        }
        let ub = u(self.ub_buffers) * u(self.vector_rows) * u(self.block_k) * (FP32 + BF16)
            + rows_per_vector * 8 * FP32;
        fit(
            "UB",
            ub,
            target.ub_bytes,
            format!(
                "{} buffers x {} rows x {} columns x (FP32 S + BF16 P) + {rows_per_vector} rows x 8 FP32 statistics",
                self.ub_buffers, self.vector_rows, self.block_k
            ),
        )?;
        Ok(())
    }

    /// The block-size inequality of section 4.2 on `target`.
    pub fn balance(&self, target: &CubeTarget) -> Balance {
        let (m, n, k) = (self.m as f64, self.c1.n as f64, self.c1.k as f64);
        let compute_s = m * n * k * 2.0 / target.peak_flops();
        let load_s = n * k * BF16 as f64 / target.hbm_bytes_per_s;
        Balance {
            compute_s,
            load_s,
            compute_bound: compute_s >= load_s,
            min_rows: (target.peak_flops() / target.hbm_bytes_per_s).ceil() as usize,
        }
    }

    /// Like [`validate`](Self::validate), and also requires the block-size inequality to hold.
    pub fn validate_compute_bound(&self, target: &CubeTarget) -> Result<()> {
        self.validate(target)?;
        let b = self.balance(target);
        if !b.compute_bound {
            return Err(CoreError::InvalidPlan(format!(
                "block-size inequality fails: M N K 2 / (n_c f F) = {:.3} us < N K 2 / BW = {:.3} us; M = {} needs at least {} rows",
                b.compute_s * 1e6,
                b.load_s * 1e6,
                self.m,
                b.min_rows
            )));
        }
        Ok(())
    }
}

/// Both sides of the block-size inequality for one KV block of `[C1]` on the whole chip.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Balance {
    /// Left side: Cube time of one block's `[C1]` at peak, seconds.
    pub compute_s: f64,
    /// Right side: time to read that block's K from HBM, seconds.
    pub load_s: f64,
    /// Whether compute covers the load (the inequality holds).
    pub compute_bound: bool,
    /// Smallest M for which it holds: `n_c f F / BW` rounded up.
    pub min_rows: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn papers_910_values_fit_and_are_compute_bound() {
        let t = HierarchicalTiling::ascend910();
        let target = CubeTarget::ascend910();
        t.validate_compute_bound(&target).unwrap();
        // seven 72 KB buffers in the 512 KB L1; Q exactly fills the four Q/P buffers (288 KB)
        let qp = (t.l1_qp_buffers * t.l1_buffer_bytes) as usize;
        assert_eq!(
            qp + (t.l1_kv_buffers * t.l1_buffer_bytes) as usize,
            504 * KIB
        );
        assert_eq!((t.m * t.c1.k) as usize * BF16, qp);
        assert_eq!(t.c1.kv_tile_bytes(), 72 * KIB);
        assert_eq!((t.c1.fixp_accumulate(), t.c2.fixp_accumulate()), (6, 4));
        let b = t.balance(&target);
        assert_eq!(b.min_rows, 222, "707.8 TFLOPS / 3.2 TB/s");
        assert!(
            (target.peak_flops() * 0.868 / 1e12 - 614.0).abs() < 1.0,
            "section 5: 614 TFLOPS = 86.8%"
        );
    }

    #[test]
    fn m128_fits_memory_but_not_the_inequality() {
        let t = HierarchicalTiling::ascend910_rows(128).unwrap();
        let target = CubeTarget::ascend910();
        t.validate(&target).unwrap();
        let e = t.validate_compute_bound(&target).unwrap_err().to_string();
        assert!(
            e.contains("block-size inequality") && e.contains("at least 222 rows"),
            "{e}"
        );
        assert!(HierarchicalTiling::ascend910_rows(192).is_err());
    }

    #[test]
    fn overflowing_l0_is_rejected_with_the_numbers() {
        let mut t = HierarchicalTiling::ascend910();
        t.c2.base_k = 256; // 2 x 128 x 256 x 2 B = 128 KB > 64 KB
        let e = t
            .validate(&CubeTarget::ascend910())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("L0A overflows: needs 131072 B") && e.contains("holds 65536 B"),
            "{e}"
        );

        let mut t = HierarchicalTiling::ascend910();
        t.l0c_buffers = 3; // 3 x 128 x 128 x 4 B = 192 KB > 128 KB
        let e = t
            .validate(&CubeTarget::ascend910())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("L0C overflows: needs 196608 B") && e.contains("holds 131072 B"),
            "{e}"
        );
    }

    #[test]
    fn overflowing_l1_is_rejected_with_the_numbers() {
        let mut t = HierarchicalTiling::ascend910();
        t.l1_kv_buffers = 4; // 8 x 72 KB = 576 KB > 512 KB
        let e = t
            .validate(&CubeTarget::ascend910())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("L1 overflows: needs 589824 B") && e.contains("holds 524288 B"),
            "{e}"
        );

        let mut t = HierarchicalTiling::ascend910();
        t.l1_buffer_bytes = 64 * KIB as u32; // Q (288 KB) no longer fits four buffers
        let e = t
            .validate(&CubeTarget::ascend910())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("L1 Q/P buffers overflows: needs 294912 B"),
            "{e}"
        );
    }

    #[test]
    fn overflowing_ub_and_bad_divisibility_are_rejected() {
        let mut t = HierarchicalTiling::ascend910();
        t.vector_rows = 64; // 2 x 64 x 512 x 6 B = 384 KB > 192 KB
        let e = t
            .validate(&CubeTarget::ascend910())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("UB overflows") && e.contains("holds 196608 B"),
            "{e}"
        );

        let mut t = HierarchicalTiling::ascend910();
        t.c1.base_k = 80;
        let e = t
            .validate(&CubeTarget::ascend910())
            .unwrap_err()
            .to_string();
        assert!(e.contains("singleK = 288 is not a multiple of 80"), "{e}");
    }

    #[test]
    fn a_smaller_target_rejects_the_papers_tiling() {
        let mut small = CubeTarget::ascend910();
        small.l0c_bytes = 64 * KIB;
        let e = HierarchicalTiling::ascend910()
            .validate(&small)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("L0C overflows: needs 131072 B") && e.contains("holds 65536 B"),
            "{e}"
        );
    }
}
