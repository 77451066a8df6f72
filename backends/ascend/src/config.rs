//! Every hardware constant of the simulated Ascend 910, in one place (FlashMLA `config.h` style).
//!
//! Sources: the AMLA paper (section 2.3, Table 1, section 4.2, section 5) and public Da Vinci
//! descriptions. Where neither gives a number the constant is marked ASSUMED with the reasoning;
//! the single FITTED constant is marked FITTED and was fitted on the one public point only.

use ferrattn_core::amla::tiling::CubeTarget;

/// Constants of the timing model.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Ascend910 {
    /// Memory sizes, Cube count, clock and Cube rate shared with the core's tiling validation.
    pub target: CubeTarget,
    /// Dies per chip (section 2.3).
    pub dies: usize,
    /// Cube cores per die (section 2.3: 24); each has `target.vector_per_cube` Vector cores.
    pub cube_per_die: usize,
    /// HBM bandwidth per die, bytes/s (Table 1: 1.6 TB/s).
    pub hbm_bytes_per_s_per_die: f64,
    /// L2 per die, bytes (section 2.3: 192 MB).
    pub l2_bytes_per_die: usize,
    /// ASSUMED: L2 bandwidth per die, bytes/s. Not in the paper; taken as 4x HBM, the usual
    /// ratio of an on-die SRAM cache to HBM on accelerators of this class.
    pub l2_bytes_per_s_per_die: f64,
    /// ASSUMED: bytes per clock one Cube core's MTE2 moves GM -> L1. Chosen so that loading the
    /// K/V tiles of a 128x128x96 MMAD sequence never limits the paper's tiling on its own.
    pub mte2_bytes_per_clock: f64,
    /// ASSUMED: bytes per clock MTE1 moves L1 -> L0A/L0B (both operands): 256, twice what a
    /// 16x16x16 MAC array consumes without reuse inside a base tile.
    pub mte1_bytes_per_clock: f64,
    /// ASSUMED: bytes per clock FixP moves L0C -> GM.
    pub fixp_bytes_per_clock: f64,
    /// ASSUMED: bytes per clock a Vector core moves GM <-> UB (MTE2 in, MTE3 out).
    pub vec_gm_bytes_per_clock: f64,
    /// FP32 lanes of a Vector core per clock: a 2048-bit (256-byte) vector unit (Da Vinci).
    pub vec_fp32_lanes: f64,
    /// ASSUMED: clocks-per-element multiplier of `Exp` relative to a simple FP32 vector op.
    pub vec_exp_cost: f64,
    /// ASSUMED: L2 bandwidth an atomic add costs per byte sent: 1, the adds execute in the L2
    /// slices, so the operand crosses the interconnect once, like a plain write.
    pub atomic_l2_factor: f64,
    /// ASSUMED: latency of a GM access before data streams, clocks.
    pub gm_latency_clocks: f64,
    /// ASSUMED: latency of a Cube <-> Vector cross-core flag, clocks.
    pub flag_latency_clocks: f64,
    /// FITTED: fraction of its peak the MMAD pipe sustains on the paper's base tiles (fractal
    /// scheduling, L0 bank conflicts, MMAD issue gaps). The only fitted constant: chosen so the
    /// model gives 86.8 % FLOPS utilisation for AMLA at batch 96, Sq = 2, Sk = 16384 (section 5,
    /// the one public measured point); every other configuration is a prediction.
    pub mmad_efficiency: f64,
}

impl Ascend910 {
    /// The Ascend 910 of the paper.
    pub fn paper() -> Ascend910 {
        Ascend910 {
            target: CubeTarget::ascend910(),
            dies: 2,
            cube_per_die: 24,
            hbm_bytes_per_s_per_die: 1.6e12,
            l2_bytes_per_die: 192 << 20,
            l2_bytes_per_s_per_die: 6.4e12,
            mte2_bytes_per_clock: 128.0,
            mte1_bytes_per_clock: 256.0,
            fixp_bytes_per_clock: 128.0,
            vec_gm_bytes_per_clock: 64.0,
            vec_fp32_lanes: 64.0,
            vec_exp_cost: 2.0,
            atomic_l2_factor: 1.0,
            gm_latency_clocks: 600.0,
            flag_latency_clocks: 100.0,
            mmad_efficiency: MMAD_EFFICIENCY_FIT,
        }
    }

    /// Cube cores of the chip.
    pub fn cube_cores(&self) -> usize {
        self.dies * self.cube_per_die
    }

    /// Peak BF16 FLOP/s of the chip.
    pub fn peak_flops(&self) -> f64 {
        self.target.peak_flops()
    }

    /// Clock, Hz.
    pub fn clock(&self) -> f64 {
        self.target.clock_hz
    }
}

/// The fitted MMAD efficiency (see [`Ascend910::mmad_efficiency`]); re-derived by the test
/// `fitted_constant_reproduces_the_public_point`.
pub const MMAD_EFFICIENCY_FIT: f64 = 0.921;
