//! PyTorch SDPA baselines and the torch-measured ceilings, through the machine's `python3`.
//!
//! `scripts/bench_sdpa.py` is compiled into the binary and written to a temporary file at run
//! time, so the bundle is one executable. It receives the jobs and the timing [`Method`] as JSON
//! and times cuDNN and FlashAttention SDPA the way the Rust rows are timed (graph replay, input
//! sets rotated, median and percentiles). Without python3, torch or a GPU visible to torch, every
//! SDPA baseline says why it did not run.

use crate::bench::report::Ceilings;
use crate::bench::shapes::Shape;
use crate::bench::timing::{Method, Timing};
use ferrattn_core::DType;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

const SCRIPT: &str = include_str!("../../../scripts/bench_sdpa.py");

/// Decode (one query token per sequence, GQA as MHA over the KV heads with the query group as
/// rows) or prefill (K/V expanded to every query head).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// One query token.
    Decode,
    /// Sq = Sk.
    Prefill,
}

/// One SDPA configuration to time, for the row `row`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SdpaJob {
    /// Index of the row in the report.
    pub row: usize,
    /// Decode or prefill.
    pub kind: JobKind,
    /// Sequences.
    pub batch: usize,
    /// Query tokens.
    pub sq: usize,
    /// KV tokens (the longest sequence: SDPA pads ragged batches).
    pub ctx: usize,
    /// Query heads.
    pub hq: usize,
    /// KV heads.
    pub hk: usize,
    /// Head dim.
    pub d: usize,
    /// `f16` or `bf16`.
    pub dtype: String,
    /// Causal mask (Sq = Sk, so top-left and bottom-right agree).
    pub causal: bool,
    /// Input sets to rotate.
    pub sets: usize,
}

impl SdpaJob {
    /// The job for `shape` over `ctx` keys; turbo decode rows compare against an fp16 cache.
    pub fn new(row: usize, kind: JobKind, shape: &Shape, ctx: usize, sets: usize) -> SdpaJob {
        let dtype = match (shape.family, shape.dtype) {
            (crate::bench::shapes::Family::TurboDecode, _) | (_, DType::F16) => "f16",
            _ => "bf16",
        };
        SdpaJob {
            row,
            kind,
            batch: shape.batch,
            sq: shape.sq,
            ctx,
            hq: shape.hq,
            hk: shape.hk,
            d: shape.d,
            dtype: dtype.into(),
            causal: shape.causal,
            sets,
        }
    }

    fn key(&self) -> String {
        let mut j = self.clone();
        j.row = 0;
        serde_json::to_string(&j).expect("jobs serialise")
    }
}

#[derive(Serialize)]
struct Request<'a> {
    method: Method,
    jobs: Vec<&'a SdpaJob>,
}

/// One job's result.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SdpaResult {
    /// cuDNN backend.
    pub cudnn: Option<Timing>,
    /// FlashAttention backend.
    pub flash: Option<Timing>,
    /// Why cuDNN refused.
    pub cudnn_error: Option<String>,
    /// Why flash refused.
    pub flash_error: Option<String>,
}

#[derive(Deserialize)]
struct Response {
    torch: String,
    ceilings: Ceilings,
    results: Vec<SdpaResult>,
}

/// What the script returned: torch's version, its ceilings, a result per row index.
pub struct Baselines {
    /// `torch.__version__`.
    pub torch: String,
    /// copy, GEMM and launch-floor ceilings through torch.
    pub ceilings: Ceilings,
    /// Results by row index.
    pub by_row: HashMap<usize, SdpaResult>,
}

/// Runs the script over `jobs` (identical configurations run once). `Err` says why nothing ran.
pub fn run(jobs: &[SdpaJob]) -> std::result::Result<Baselines, String> {
    let mut unique: Vec<&SdpaJob> = vec![];
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut of_row = vec![];
    for j in jobs {
        let k = j.key();
        let i = *index.entry(k).or_insert_with(|| {
            unique.push(j);
            unique.len() - 1
        });
        of_row.push((j.row, i));
    }
    let dir = std::env::temp_dir().join(format!("ferrattn-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (script, req, resp) = (
        dir.join("bench_sdpa.py"),
        dir.join("jobs.json"),
        dir.join("sdpa.json"),
    );
    let write = |p: &std::path::Path, s: &str| {
        std::fs::write(p, s).map_err(|e| format!("{}: {e}", p.display()))
    };
    write(&script, SCRIPT)?;
    let request = Request {
        method: Method::DEVICE,
        jobs: unique,
    };
    write(
        &req,
        &serde_json::to_string(&request).expect("request serialises"),
    )?;
    let python = std::env::var("FERRATTN_PYTHON").unwrap_or_else(|_| "python3".into());
    let status = std::process::Command::new(&python)
        .arg(&script)
        .arg(&req)
        .arg(&resp)
        .env("PYTHONUNBUFFERED", "1")
        .status()
        .map_err(|e| format!("{python} could not be started: {e}"))?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(format!(
            "{python} {} exited with {status} (torch with CUDA missing? see its stderr above)",
            script.display()
        ));
    }
    let text = std::fs::read_to_string(&resp).map_err(|e| format!("{}: {e}", resp.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    let r: Response = serde_json::from_str(&text).map_err(|e| format!("SDPA results: {e}"))?;
    let by_row = of_row
        .into_iter()
        .map(|(row, i)| (row, r.results.get(i).cloned().unwrap_or_default()))
        .collect();
    Ok(Baselines {
        torch: r.torch,
        ceilings: r.ceilings,
        by_row,
    })
}
