//! The `ferrattn` command line: devices, plan, run, repro, sim, golden.

use clap::{Args, Parser, Subcommand};
use ferrattn_cli::error::CliError;
use ferrattn_cli::runtime::{describe, supported_on};
use ferrattn_cli::{
    devices, golden_files, io, Algorithm, AttentionInputs, AttentionOptions, AttentionPlan,
    AttentionProblem, Availability, BackendChoice, Comparison, CoreError, DType, FerrattnError,
    KvLayout, Runtime, Tensor,
};
use rand::SeedableRng;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "ferrattn",
    version,
    about = "Attention runtime: TurboAttention, LeanAttention, AMLA, TurboQuant on CPU, CUDA and Ascend"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List the backends, their hardware, and why any is unavailable.
    Devices,
    /// Print the plan for a problem as JSON (with --cp-ranks or --cp-kv-lens: the context-parallel
    /// plan over several GPUs).
    Plan(PlanArgs),
    /// Run attention and report its error against the exact f64 golden and its time. States the
    /// tolerance it judges against and exits with status 2 when the result misses it.
    Run(RunArgs),
    /// Reproduce a published table beside the paper's values.
    #[command(subcommand)]
    Repro(Repro),
    /// Run the simulated Ascend 910 schedule (a timing model, never a hardware measurement).
    #[command(subcommand)]
    Sim(Sim),
    /// TurboAttention serving loop: prefill a context into the compressed KV cache, then decode N
    /// tokens one at a time (each appended to the INT8 buffer, flushed into the cache every 64),
    /// reporting cache size, compression against fp16, and each step's error against exact
    /// attention over everything cached so far.
    TurboSession(TurboSessionArgs),
    /// Benchmark every algorithm on every backend present (baselines, ceilings, report).
    Bench(ferrattn_cli::bench::BenchArgs),
    /// TurboQuant serving loop: compress a prefill into the TurboQuant cache, then decode N
    /// tokens one at a time (each appended first), reporting bytes per token, compression against
    /// fp16 and each step's error against exact attention.
    TurboquantSession(TurboquantSessionArgs),
    /// Regenerate the checked-in golden files (deterministic).
    Golden {
        /// Output directory.
        #[arg(long, default_value = "tests/golden")]
        out: PathBuf,
    },
}

#[derive(Args, Clone)]
struct ProblemArgs {
    /// Algorithm: exact, turbo, lean, amla, turboquant.
    #[arg(long, value_parser = parse_algo)]
    algo: Algorithm,
    /// Backend: auto, cpu, cuda, ascend.
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    backend: BackendChoice,
    /// Input safetensors with q, k, v (or MLA q, kv) and optional int32 seqlens_k.
    #[arg(long, conflicts_with = "random")]
    input: Option<PathBuf>,
    /// Random inputs of shape B,Sq,Sk,Hq,Hk,D[,Dv] (MLA for --algo amla: Hk = 1, V = first Dv columns).
    #[arg(long, value_parser = parse_dims)]
    random: Option<Dims>,
    /// Element type of random inputs: f32, f16, bf16 (amla defaults to bf16, others to f16).
    #[arg(long, value_parser = parse_dtype)]
    dtype: Option<DType>,
    /// Per-sequence KV lengths for random inputs, comma separated (ragged batch).
    #[arg(long, value_delimiter = ',')]
    seqlens_k: Option<Vec<i64>>,
    /// Bottom-right aligned causal mask.
    #[arg(long)]
    causal: bool,
    /// Softmax scale (default 1/sqrt(head dim)).
    #[arg(long)]
    scale: Option<f32>,
    /// Seed of random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args)]
struct PlanArgs {
    #[command(flatten)]
    problem: ProblemArgs,
    #[command(flatten)]
    cp: CpArgs,
}

/// Context-parallel decode (ferrattn_core::cp): the problem's sequences split over ranks.
#[derive(Args)]
struct CpArgs {
    /// Ranks to split each sequence over, in proportion to --cp-bandwidth.
    #[arg(long, conflicts_with = "cp_kv_lens")]
    cp_ranks: Option<usize>,
    /// Keys each rank already holds: one comma-separated row per rank, rows separated by ';'
    /// (e.g. "4096,0;1000,37": rank 0 holds 4096 keys of sequence 0, none of sequence 1).
    #[arg(long)]
    cp_kv_lens: Option<String>,
    /// Read bandwidth per rank in GB/s, comma separated (default 4800 each, an H200).
    #[arg(long, value_delimiter = ',')]
    cp_bandwidth: Option<Vec<f64>>,
    /// Where the output goes: replicated (every rank) or head-sharded.
    #[arg(long, default_value = "replicated", value_parser = ["replicated", "head-sharded"])]
    cp_output: String,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    problem: ProblemArgs,
    /// Use this plan (JSON from `ferrattn plan`) instead of planning.
    #[arg(long)]
    plan: Option<PathBuf>,
    /// Write o and lse here.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Skip the comparison with the exact f64 golden (slow for big problems); the run then
    /// exits 0 without judging its result, and says so.
    #[arg(long)]
    no_check: bool,
}

#[derive(Args)]
struct TurboSessionArgs {
    /// Backend: cpu (the emulation) or cuda (the INT8 kernels).
    #[arg(long, default_value = "cpu", value_parser = parse_backend)]
    backend: BackendChoice,
    /// Context and heads: B,S,Hq,Hk,D (S tokens of causal prefill per sequence).
    #[arg(long, value_parser = parse_session_dims)]
    random: Dims,
    /// Decode steps after the prefill.
    #[arg(long, default_value_t = 128)]
    steps: usize,
    /// Element type: f16 or bf16 (f32 runs on cpu only).
    #[arg(long, default_value = "f16", value_parser = parse_dtype)]
    dtype: DType,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Skip the per-step comparison with exact attention.
    #[arg(long)]
    no_check: bool,
}

#[derive(Args)]
struct TurboquantSessionArgs {
    /// Backend: cpu (the emulation) or cuda (the kernels).
    #[arg(long, default_value = "cpu", value_parser = parse_backend)]
    backend: BackendChoice,
    /// Context and heads: B,S,Hq,Hk,D (f16).
    #[arg(long, value_parser = parse_session_dims)]
    random: Dims,
    /// Decode steps after the prefill.
    #[arg(long, default_value_t = 64)]
    steps: usize,
    /// Key bits (the QJL bit included unless --no-qjl).
    #[arg(long, default_value_t = 4)]
    key_bits: u8,
    /// Value bits.
    #[arg(long, default_value_t = 3)]
    value_bits: u8,
    /// Keys without QJL: every key bit on the codebook.
    #[arg(long)]
    no_qjl: bool,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Skip the comparisons with exact attention.
    #[arg(long)]
    no_check: bool,
}

fn cmd_turboquant_session(a: &TurboquantSessionArgs) -> ferrattn_cli::Result<()> {
    let Dims(d) = &a.random;
    let backend = match a.backend {
        BackendChoice::Exactly(k) => k,
        BackendChoice::Auto => ferrattn_cli::BackendKind::Cpu,
    };
    let args = ferrattn_cli::turboquant_session::SessionArgs {
        backend,
        batch: d[0],
        context: d[1],
        heads_q: d[2],
        heads_kv: d[3],
        head_dim: d[4],
        steps: a.steps,
        key_bits: a.key_bits,
        value_bits: a.value_bits,
        key_qjl: !a.no_qjl,
        seed: a.seed,
        check: !a.no_check,
    };
    let r = ferrattn_cli::turboquant_session::run(&args)?;
    println!(
        "turboquant session on {backend}: B={} context {} Hq={} Hk={} D={} f16, keys {} bits{}, values {} bits, {} decode steps",
        d[0], d[1], d[2], d[3], d[4], a.key_bits, if a.no_qjl { "" } else { " (QJL)" }, a.value_bits, a.steps
    );
    println!("prefill (compress + attention over the compressed cache): {:.3} ms host wall clock, O vs exact rel_fro {:.3e}", r.prefill_ms, r.prefill_error);
    println!(
        "bytes per token: {:.1} packed, {} in the device layout, {} fp16 ({:.2}x / {} smaller)",
        r.packed_bytes_per_token,
        r.device_bytes_per_token,
        r.fp16_bytes_per_token,
        r.fp16_bytes_per_token as f64 / r.packed_bytes_per_token,
        if r.device_bytes_per_token > 0 {
            format!(
                "{:.2}x",
                r.fp16_bytes_per_token as f64 / r.device_bytes_per_token as f64
            )
        } else {
            "n/a".into()
        }
    );
    if a.steps > 0 {
        println!("decode: {:.3} ms per step (append + decode, host wall clock, transfers included); worst step O vs exact rel_fro {:.3e}", r.step_ms, r.worst_step_error);
    }
    Ok(())
}

fn parse_session_dims(s: &str) -> Result<Dims, String> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|e| format!("{x:?} in --random: {e}"))
        })
        .collect::<Result<_, _>>()?;
    if v.len() != 5 {
        return Err(format!(
            "--random takes B,S,Hq,Hk,D: got {} numbers",
            v.len()
        ));
    }
    Ok(Dims(v))
}

/// The per-step decoder of a turbo session, on the cpu emulation or the cuda kernels.
enum TurboDecoder {
    Cpu(ferrattn_cli::turbo::TurboKvCache),
    Cuda(
        Box<ferrattn_cuda::CudaBackend>,
        Box<ferrattn_cuda::DeviceTurboCache>,
    ),
}

impl TurboDecoder {
    fn memory(&self) -> ferrattn_cli::turbo::CacheMemory {
        match self {
            TurboDecoder::Cpu(c) => c.memory(),
            TurboDecoder::Cuda(_, c) => c.memory(),
        }
    }
}

fn print_memory(when: &str, m: &ferrattn_cli::turbo::CacheMemory) {
    println!(
        "cache {when}: {} tokens, {} B compressed + {} B INT8 buffer, {:.1} B/token, {:.2}x smaller than fp16 ({} B)",
        m.tokens, m.compressed_bytes, m.buffer_bytes, m.bytes_per_token, m.compression_ratio, m.fp16_bytes
    );
}

fn cmd_turbo_session(a: &TurboSessionArgs) -> ferrattn_cli::Result<()> {
    use ferrattn_cli::turbo;
    let Dims(d) = &a.random;
    let (b, s, hq, hk, hd) = (d[0], d[1], d[2], d[3], d[4]);
    let shape = ferrattn_cli::session::SessionShape {
        batch: b,
        context: s,
        steps: a.steps,
        heads_q: hq,
        heads_kv: hk,
        head_dim: hd,
    };
    // the whole sequence, so each step can be checked against exact attention over its prefix
    let [q_all, k_all, v_all] =
        ferrattn_cli::session::sequence("turbo-session", shape, a.dtype, a.seed)?;

    let ctx = AttentionInputs::new(
        q_all.seq_range(0, s),
        k_all.seq_range(0, s),
        v_all.seq_range(0, s),
    );
    let p = ctx.problem(
        AttentionOptions {
            causal: true,
            softmax_scale: None,
        },
        None,
    )?;
    let rt = Runtime::select(a.backend, Algorithm::Turbo)?.runtime;
    let cfg = turbo::plan(&p, &rt.caps()?)?;
    let kind = rt.kind();
    let t0 = Instant::now();
    let mut dec = match rt {
        Runtime::Cuda(gpu) => {
            let (_, cache) = gpu.turbo_prefill(&cfg, &p, &ctx, a.steps)?;
            TurboDecoder::Cuda(gpu, Box::new(cache))
        }
        _ => TurboDecoder::Cpu(turbo::prefill(&cfg, &p, &ctx)?.1),
    };
    println!(
        "turbo session on {}: B={b} context {s} Hq={hq} Hk={hk} D={hd} {}, {} decode steps",
        kind, a.dtype, a.steps
    );
    println!(
        "prefill: {:.3} ms (host wall clock)",
        t0.elapsed().as_secs_f64() * 1e3
    );
    print_memory("after prefill", &dec.memory());
    let pb = progress_bar(a.steps as u64, "decode");
    let (mut worst, mut decode_secs) = (0.0f64, 0.0f64);
    for t in 0..a.steps {
        let (q, k, v) = (
            q_all.seq_range(s + t, 1),
            k_all.seq_range(s + t, 1),
            v_all.seq_range(s + t, 1),
        );
        let t1 = Instant::now();
        let out = match &mut dec {
            TurboDecoder::Cpu(cache) => {
                turbo::decode_step(&cfg, cache, &q, &k, &v, p.softmax_scale)?
            }
            TurboDecoder::Cuda(gpu, cache) => {
                gpu.turbo_decode_step(&cfg, cache, &q, &k, &v, p.softmax_scale, None)?
            }
        };
        decode_secs += t1.elapsed().as_secs_f64();
        if !a.no_check {
            let seen = s + t + 1;
            let x = AttentionInputs::new(q, k_all.seq_range(0, seen), v_all.seq_range(0, seen));
            let px = x.problem(
                AttentionOptions {
                    causal: false,
                    softmax_scale: Some(p.softmax_scale),
                },
                None,
            )?;
            let (o, _) = ferrattn_cli::golden::exact_attention_f64(&px, &x);
            let c = Comparison::new(
                &o,
                &out.o.data.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            );
            worst = worst.max(c.rel_fro);
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    if a.steps > 0 {
        println!(
            "decode: {:.3} ms per step (host wall clock, includes transfers)",
            decode_secs * 1e3 / a.steps as f64
        );
    }
    if !a.no_check && a.steps > 0 {
        println!("worst step O vs exact attention: rel_fro {worst:.3e}");
    }
    print_memory("after decode", &dec.memory());
    Ok(())
}

#[derive(Subcommand)]
enum Sim {
    /// AMLA MLA decode (128 heads, 576/512) on a simulated Ascend 910, beside the four-stage Base.
    Amla {
        /// Sequences in the batch.
        #[arg(long, default_value_t = 96)]
        batch: usize,
        /// Query tokens per sequence (1 or 2).
        #[arg(long, default_value_t = 2)]
        sq: usize,
        /// Context length.
        #[arg(long, default_value_t = 16384)]
        sk: usize,
        /// Print JSON (both variants) instead of tables.
        #[arg(long)]
        json: bool,
        /// Write a Gantt timeline of one Cube/Vector core pair (AMLA) as SVG.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// KV blocks shown in the timeline.
        #[arg(long, default_value_t = 6)]
        blocks: usize,
    },
}

#[derive(Subcommand)]
enum Repro {
    /// AMLA Tables 3 and 4 (8K context, Gaussian and uniform inputs) beside the paper's values.
    AmlaAccuracy {
        /// Random draws per configuration (the paper uses 100).
        #[arg(long, default_value_t = 100)]
        samples: usize,
        /// RNG seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// The paper's 12 performance configurations (batch 96; Sq 1, 2; Sk 1k-16k), Base and AMLA,
    /// on the SIMULATED Ascend 910 (a timing model, not a measurement).
    AmlaPerformance {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// TurboQuant MSE and inner-product distortion per bit width (Theorems 1 and 2).
    TurboquantDistortion {
        /// Vector dimension (head dim).
        #[arg(long, default_value_t = 128)]
        d: usize,
        /// Random unit vectors per bit width.
        #[arg(long, default_value_t = 20000)]
        samples: usize,
        /// RNG seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// TurboAttention accuracy on inputs with LLM-like channel outliers: 4-bit, 2-bit, mixed 2/4,
    /// SAS on/off, against exact attention (markdown table).
    TurboAccuracy {
        /// RNG seed.
        #[arg(long, default_value_t = 2025)]
        seed: u64,
    },
    /// TurboQuant at each bit width, with and without QJL, against exact attention and against
    /// TurboAttention on the same LLM-like inputs: O and LSE error, top-1 key agreement.
    TurboquantAccuracy {
        /// RNG seed (the TurboAttention decode rows' inputs for the same seed).
        #[arg(long, default_value_t = 2025)]
        seed: u64,
    },
    /// SmolLM2-135M on each attention method: perplexity, KL and top-1 against exact attention,
    /// greedy generation (docs/ACCURACY.md, "Real model").
    ModelAccuracy(ferrattn_cli::model::accuracy::ModelAccuracyArgs),
}

fn amla_accuracy(samples: usize, seed: u64) {
    use ferrattn_cli::amla::accuracy::{reproduce, AccuracyTable};
    println!(
        "AMLA accuracy (section 5.1): relative Frobenius error of the BF16 output against an f64 golden, \
         batch 1, 128 heads, Sq 1, Sk 8192, 576/512, mean over {samples} samples, seed {seed}"
    );
    for table in AccuracyTable::ALL {
        let pb = progress_bar(6 * samples as u64, table.name());
        let rows = reproduce(table, samples, seed, &|done| pb.set_position(done as u64));
        pb.finish_and_clear();
        println!("\n{}", table.name());
        println!("| input | paper AMLA | paper Base | AMLA | Base | AMLA/paper | AMLA/Base | AMLA, no compensation |");
        println!("|---|---|---|---|---|---|---|---|");
        for r in rows {
            println!(
                "| {} | {:.3e} | {:.3e} | {:.3e} | {:.3e} | {:.3} | {:.3} | {:.3e} |",
                r.label,
                r.paper_amla,
                r.paper_base,
                r.amla,
                r.base,
                r.amla_over_paper,
                r.amla_over_base,
                r.amla_uncompensated
            );
        }
    }
}

fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta} left)")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Largest batch `sim amla` models.
const SIM_MAX_BATCH: usize = 4096;
/// Longest context `sim amla` models (2048 KV blocks of 512).
const SIM_MAX_SK: usize = 1 << 20;
/// Most KV tokens `sim amla` models over the batch: memory grows about 4 bytes per token (batch
/// 96 x sk 2^20 took 0.4 GB and 13 s on 2 cores, batch 65536 x sk 16384 5 GB and 167 s).
const SIM_MAX_TOKENS: usize = 1 << 27;

fn cmd_sim(s: &Sim) -> ferrattn_cli::Result<()> {
    let Sim::Amla {
        batch,
        sq,
        sk,
        json,
        svg,
        blocks,
    } = s;
    // the model keeps every KV block's ops of every distinct core pair's work list, so its
    // memory grows with batch x sk: bound both well above the paper's configurations (batch 96,
    // sk up to 16k) instead of letting an allocation abort
    if !(1..=SIM_MAX_BATCH).contains(batch)
        || !(1..=SIM_MAX_SK).contains(sk)
        || !(1..=2).contains(sq)
        || batch * sk > SIM_MAX_TOKENS
    {
        return Err(ferrattn_cli::CoreError::Unsupported {
            what: format!("sim amla with batch {batch}, sq {sq}, sk {sk}"),
            supported: format!(
                "batch 1..={SIM_MAX_BATCH}, sq 1 or 2, sk 1..={SIM_MAX_SK}, batch x sk up to {SIM_MAX_TOKENS}"
            ),
        }
        .into());
    }
    let amla = ferrattn_ascend::simulate(*batch, *sq, *sk, ferrattn_ascend::Variant::Amla);
    let base = ferrattn_ascend::simulate(*batch, *sq, *sk, ferrattn_ascend::Variant::Base);
    if *json {
        println!(
            "{}",
            serde_json::to_string_pretty(&[&amla, &base]).expect("reports serialise")
        );
    } else {
        println!("{amla}");
        println!("{base}");
    }
    if let Some(path) = svg {
        ferrattn_ascend::timeline_svg(&amla, *blocks, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn cmd_repro(r: &Repro) -> Result<(), Failure> {
    match r {
        Repro::AmlaPerformance { json } => {
            let rep = ferrattn_ascend::repro_performance();
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rep).expect("report serialises")
                );
            } else {
                println!("{rep}");
            }
            Ok(())
        }
        Repro::AmlaAccuracy { samples, seed } => {
            if *samples == 0 {
                return Err(CoreError::BadLength {
                    what: "--samples".into(),
                    value: 0,
                    requirement: "at least 1 (the paper uses 100)".into(),
                }
                .into());
            }
            amla_accuracy(*samples, *seed);
            Ok(())
        }
        Repro::TurboquantDistortion {
            d,
            samples,
            seed,
            json,
        } => {
            if *d < 3 || *samples == 0 {
                return Err(ferrattn_cli::CoreError::BadLength {
                    what: if *d < 3 {
                        "--d".into()
                    } else {
                        "--samples".into()
                    },
                    value: if *d < 3 { *d as i64 } else { 0 },
                    requirement: "--d at least 3 and --samples at least 1".into(),
                }
                .into());
            }
            let pb = progress_bar(4 * *samples as u64, "turboquant distortion");
            let rows = ferrattn_cli::turboquant::distortion_table(*d, *samples, *seed, &|done| {
                pb.set_position(done as u64)
            });
            pb.finish_and_clear();
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).expect("rows serialise")
                );
                return Ok(());
            }
            println!(
                "TurboQuant distortion, d = {d}, {samples} unit vectors per bit width, seed {seed}"
            );
            println!("bits | MSE measured (paper, exact from codebook) | d*IP distortion measured (paper, theory) | prod bias / stderr");
            for r in rows {
                println!(
                    "{:>4} | {:.5} +- {:.5} ({}, {:.5}) | {:.4} +- {:.4} ({}, {:.4}) | {:+.2}",
                    r.bits,
                    r.mse,
                    r.mse_stderr,
                    r.mse_published,
                    r.mse_theory,
                    r.ip_distortion,
                    r.ip_distortion_stderr,
                    r.ip_distortion_published,
                    r.ip_distortion_theory,
                    r.ip_bias / r.ip_bias_stderr.max(f64::MIN_POSITIVE)
                );
            }
            Ok(())
        }
        Repro::TurboAccuracy { seed } => {
            let rows = ferrattn_cli::turbo::accuracy_table(*seed);
            println!("{}", ferrattn_cli::turbo::accuracy_markdown(&rows));
            Ok(())
        }
        Repro::TurboquantAccuracy { seed } => {
            let rows = ferrattn_cli::turboquant::accuracy::accuracy_table(*seed)?;
            println!(
                "{}",
                ferrattn_cli::turboquant::accuracy::accuracy_markdown(&rows)
            );
            Ok(())
        }
        Repro::ModelAccuracy(a) => Ok(ferrattn_cli::model::accuracy::repro(a)?),
    }
}

fn parse_algo(s: &str) -> Result<Algorithm, String> {
    Algorithm::parse(s).ok_or_else(|| {
        format!("unknown algorithm {s:?}; one of exact, turbo, lean, amla, turboquant")
    })
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    BackendChoice::parse(s)
        .ok_or_else(|| format!("unknown backend {s:?}; one of auto, cpu, cuda, ascend"))
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    DType::parse(s).ok_or_else(|| format!("unknown dtype {s:?}; one of f32, f16, bf16"))
}

/// The numbers of `--random`.
#[derive(Clone, Debug)]
struct Dims(Vec<usize>);

fn parse_dims(s: &str) -> Result<Dims, String> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|e| format!("{x:?} in --random: {e}"))
        })
        .collect::<Result<_, _>>()?;
    if v.len() != 6 && v.len() != 7 {
        return Err(format!(
            "--random takes B,Sq,Sk,Hq,Hk,D[,Dv]: got {} numbers",
            v.len()
        ));
    }
    Ok(Dims(v))
}

/// The problem `--random` describes, built from the numbers alone (no tensors), with its
/// sizes checked before anything is allocated.
fn random_problem(a: &ProblemArgs, d: &[usize]) -> ferrattn_cli::Result<AttentionProblem> {
    let (b, sq, sk, hq, hk, dqk) = (d[0], d[1], d[2], d[3], d[4], d[5]);
    let amla = a.algo == Algorithm::Amla;
    let dv = d
        .get(6)
        .copied()
        .unwrap_or(if amla && dqk == 576 { 512 } else { dqk });
    let dtype = a
        .dtype
        .unwrap_or(if amla { DType::BF16 } else { DType::F16 });
    let mut p = AttentionProblem::uniform(b, sq, sk, hq, hk, dqk, dv, dtype);
    if amla {
        p.kv_layout = KvLayout::MlaLatent;
    }
    p.causal = a.causal;
    if let Some(scale) = a.scale {
        p.softmax_scale = scale;
    }
    if let Some(lens) = &a.seqlens_k {
        p.seqlens_k =
            lens.iter()
                .enumerate()
                .map(|(i, &l)| {
                    usize::try_from(l).ok().filter(|&l| l <= sk).ok_or_else(|| {
                        CoreError::BadLength {
                            what: format!("seqlens_k[{i}]"),
                            value: l,
                            requirement: format!(
                                "between 0 and {sk} (the tensor's padded sequence extent)"
                            ),
                        }
                    })
                })
                .collect::<Result<_, _>>()?;
    }
    p.validate()?;
    Ok(p)
}

/// Random inputs for `p` (unit Gaussian, seeded), after checking the host can hold them and
/// `extra` more bytes (the outputs and the f64 check).
fn random_inputs(
    p: &AttentionProblem,
    seed: u64,
    extra: u128,
) -> ferrattn_cli::Result<AttentionInputs> {
    ferrattn_cli::problem::check_host_memory(
        &format!(
            "--random {} (inputs, outputs and the f64 check)",
            describe(p)
        ),
        p.host_bytes().saturating_add(extra),
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let shapes = p.buffer_shapes();
    let mut draw = |name: &str| {
        let shape = &shapes.iter().find(|(n, _)| *n == name).expect("listed").1;
        Tensor::randn(shape, p.dtype, 1.0, &mut rng)
    };
    let q = draw("q");
    let mut x = match p.kv_layout {
        KvLayout::MlaLatent => AttentionInputs::mla(q, draw("kv")),
        KvLayout::Separate => {
            let k = draw("k");
            AttentionInputs::new(q, k, draw("v"))
        }
    };
    if !p.is_uniform() {
        x.seqlens_k = Some(p.seqlens_k.iter().map(|&l| l as i64).collect());
    }
    Ok(x)
}

/// Bytes the f64 golden check of `p` allocates: O and LSE in f64, once per task and once
/// gathered.
fn check_bytes(p: &AttentionProblem) -> u128 {
    p.buffer_shapes()
        .iter()
        .filter(|(n, _)| matches!(*n, "o" | "lse"))
        .map(|(_, s)| 4 * ferrattn_cli::problem::buffer_bytes(s))
        .sum()
}

fn options(a: &ProblemArgs) -> AttentionOptions {
    AttentionOptions {
        causal: a.causal,
        softmax_scale: a.scale,
    }
}

/// The problem the arguments describe and, when `with_tensors`, its inputs (read from `--input`
/// or drawn for `--random`; `plan` asks for none and draws nothing).
fn problem_of(
    a: &ProblemArgs,
    with_tensors: bool,
    extra: u128,
) -> ferrattn_cli::Result<(AttentionProblem, Option<AttentionInputs>)> {
    if let Some(path) = &a.input {
        let x = io::read_inputs(path)?;
        // MLA files default to the FlashMLA split 576/512 when the latent dim is 576
        let dv = (x.v.is_none()).then(|| {
            if x.k.shape.get(3) == Some(&576) {
                512
            } else {
                x.k.shape.get(3).copied().unwrap_or(0)
            }
        });
        let p = x.problem(options(a), dv)?;
        return Ok((p, Some(x)));
    }
    let Some(Dims(d)) = &a.random else {
        return Err(FerrattnError::File {
            path: "-".into(),
            message: "give --input FILE or --random B,Sq,Sk,Hq,Hk,D[,Dv]".into(),
        });
    };
    let p = random_problem(a, d)?;
    if !with_tensors {
        return Ok((p, None));
    }
    let x = random_inputs(&p, a.seed, extra)?;
    // the tensors are the authority: the problem is read back from them as for a file
    let p = x.problem(options(a), Some(p.head_dim_v).filter(|_| x.v.is_none()))?;
    Ok((p, Some(x)))
}

fn select(a: &ProblemArgs) -> ferrattn_cli::Result<Runtime> {
    let sel = Runtime::select(a.backend, a.algo)?;
    for why in &sel.passed_over {
        eprintln!("note: passed over {why}");
    }
    Ok(sel.runtime)
}

/// `ferrattn plan`: the plan of the problem the arguments describe; draws no random tensors.
fn cmd_plan(args: &PlanArgs) -> ferrattn_cli::Result<()> {
    let a = &args.problem;
    let (problem, _) = problem_of(a, false, 0)?;
    if args.cp.cp_ranks.is_some() || args.cp.cp_kv_lens.is_some() {
        let plan = cp_plan(&problem, &args.cp)?;
        println!(
            "{}",
            serde_json::to_string_pretty(&plan).expect("a plan serialises")
        );
        return Ok(());
    }
    let plan = select(a)?.plan(a.algo, &problem)?;
    println!("{}", plan.to_json());
    Ok(())
}

fn cp_plan(p: &AttentionProblem, a: &CpArgs) -> ferrattn_cli::Result<ferrattn_core::cp::CpPlan> {
    use ferrattn_core::cp;
    let kv_lens = match (&a.cp_kv_lens, a.cp_ranks) {
        (Some(rows), _) => rows
            .split(';')
            .map(|row| {
                row.split(',')
                    .map(|x| x.trim().parse::<usize>())
                    .collect::<std::result::Result<Vec<usize>, _>>()
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| ferrattn_core::CoreError::BadValue {
                what: "--cp-kv-lens".into(),
                value: rows.clone(),
                requirement: format!("rows of comma-separated key counts separated by ';' ({e})"),
            })?,
        (None, Some(r)) => {
            let bw = a.cp_bandwidth.clone().unwrap_or(vec![4800.0; r]);
            if bw.len() != r {
                return Err(ferrattn_core::CoreError::BadLength {
                    what: "--cp-bandwidth entries".into(),
                    value: bw.len() as i64,
                    requirement: format!("{r}, one per rank of --cp-ranks"),
                }
                .into());
            }
            // boundaries on 64 tokens: a page of FlashMLA's size, four of vLLM's
            cp::split_by_bandwidth(&p.seqlens_k, &bw, 64)?
        }
        (None, None) => unreachable!("cmd_plan asks for a cp plan only with one of them"),
    };
    let ranks = kv_lens.len();
    let req = cp::CpRequest {
        shape: cp::CpShape {
            batch: p.batch,
            seqlen_q: p.max_seqlen_q,
            heads_q: p.heads_q,
            heads_kv: p.heads_kv,
            head_dim: p.head_dim_v,
            dtype: p.dtype,
            causal: p.causal,
        },
        kv_lens,
        bandwidth_gbs: a.cp_bandwidth.clone().unwrap_or(vec![4800.0; ranks]),
        output: if a.cp_output == "head-sharded" {
            cp::OutputPlacement::HeadSharded
        } else {
            cp::OutputPlacement::Replicated
        },
    };
    Ok(cp::plan(&req)?)
}

fn cmd_devices() {
    println!("{:<8} {:<12} details", "backend", "status");
    for d in devices() {
        let (status, detail) = match &d.availability {
            Availability::Ready => (
                "ready",
                d.caps
                    .as_ref()
                    .map(|c| match c.dram_bytes_per_s {
                        // the DRAM bandwidth the Lean planner's grid rule reads
                        Some(b) => format!(
                            "{} ({} compute units, {:.2} TB/s DRAM peak)",
                            c.name,
                            c.compute_units,
                            b as f64 / 1e12
                        ),
                        None => format!("{} ({} compute units)", c.name, c.compute_units),
                    })
                    .unwrap_or_default(),
            ),
            Availability::Simulated { reason } => ("simulated", reason.clone()),
            Availability::Unavailable { reason } => ("unavailable", reason.clone()),
        };
        println!("{:<8} {:<12} {}", d.backend, status, detail);
    }
    println!();
    println!("support matrix (algorithm: backends, fastest first)");
    for a in Algorithm::ALL {
        let b: Vec<String> = supported_on(a).iter().map(|b| b.to_string()).collect();
        println!("  {:<11} {}", a.name(), b.join(", "));
    }
}

/// Why a command failed: an error of the library, or a result that missed its tolerance.
enum Failure {
    Error(CliError),
    Tolerance(String),
}

impl From<CliError> for Failure {
    fn from(e: CliError) -> Failure {
        Failure::Error(e)
    }
}

impl From<FerrattnError> for Failure {
    fn from(e: FerrattnError) -> Failure {
        Failure::Error(e.into())
    }
}

impl From<CoreError> for Failure {
    fn from(e: CoreError) -> Failure {
        Failure::Error(e.into())
    }
}

/// A spinner on stderr for work that may take a while (hidden when stderr is not a terminal,
/// where the line printed before it is the progress report).
fn spinner(msg: String) -> indicatif::ProgressBar {
    eprintln!("{msg}");
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(msg);
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

/// Reads `--plan` and checks it belongs to this invocation: its algorithm is `--algo` (a plan
/// of another algorithm would silently run that algorithm instead). Every other field is checked
/// by `Runtime::run` against the inputs and the device.
fn read_plan(path: &std::path::Path, a: &ProblemArgs) -> ferrattn_cli::Result<AttentionPlan> {
    let text = std::fs::read_to_string(path).map_err(|e| FerrattnError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let plan = AttentionPlan::from_json(&text)?;
    if plan.algorithm != a.algo {
        return Err(FerrattnError::PlanMismatch(format!(
            "{} is a {} plan but --algo is {}",
            path.display(),
            plan.algorithm,
            a.algo
        )));
    }
    Ok(plan)
}

fn cmd_run(r: &RunArgs) -> Result<(), Failure> {
    let a = &r.problem;
    let extra = if r.no_check { 0 } else { check_bytes_of(a) };
    let (problem, x) = problem_of(a, true, extra)?;
    let x = x.expect("inputs asked for");
    let rt = select(a)?;
    let plan = match &r.plan {
        None => rt.plan(a.algo, &problem)?,
        Some(path) => read_plan(path, a)?,
    };
    let pb = spinner(format!(
        "running {} on {} for {}",
        plan.algorithm,
        plan.device,
        describe(&plan.problem)
    ));
    let t0 = Instant::now();
    let out = rt.run(&plan, &x);
    let secs = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let out = out?;
    println!("algorithm  {}", plan.algorithm);
    println!(
        "backend    {} on {}",
        out.provenance.backend, out.provenance.device
    );
    if let Some(why) = &out.provenance.simulated {
        println!("SIMULATED  {why}");
    }
    println!("problem    {}", describe(&plan.problem));
    println!(
        "time       {:.3} ms (wall clock, host, includes transfers)",
        secs * 1e3
    );
    let verdict = if r.no_check {
        println!("check      skipped (--no-check): the result is not compared with the f64 golden");
        Ok(())
    } else {
        let pb = spinner(format!(
            "checking against the exact f64 golden ({} query rows of up to {} keys)",
            plan.problem.batch * plan.problem.max_seqlen_q * plan.problem.heads_q,
            plan.problem.max_seqlen_k
        ));
        let (o, lse) = ferrattn_cli::golden::exact_attention_f64(&plan.problem, &x);
        pb.finish_and_clear();
        let co = Comparison::new(
            &o,
            &out.o.data.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        );
        let cl = Comparison::new(
            &lse,
            &out.lse.data.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        );
        let tol = ferrattn_cli::compare::RunTolerance::of(&plan);
        println!("tolerance  {tol}");
        println!("O   vs exact  {co}");
        println!("LSE vs exact  {cl}");
        let verdict = co
            .check("O", &tol.o)
            .and_then(|()| cl.check("LSE", &tol.lse));
        match &verdict {
            Ok(()) => println!("check      ok: within tolerance"),
            Err(e) => println!("check      FAILED: {e}"),
        }
        verdict
    };
    if let Some(path) = &r.output {
        let mut meta = HashMap::new();
        meta.insert("algorithm".to_string(), plan.algorithm.to_string());
        meta.insert("backend".to_string(), out.provenance.backend.clone());
        meta.insert("device".to_string(), out.provenance.device.clone());
        meta.insert("commit".to_string(), ferrattn_cli::GIT_COMMIT.to_string());
        if let Some(s) = &out.provenance.simulated {
            meta.insert("simulated".to_string(), s.clone());
        }
        io::write_file(path, &[("o", &out.o), ("lse", &out.lse)], &[], meta)?;
        println!("wrote      {}", path.display());
    }
    verdict.map_err(|e| Failure::Tolerance(format!("the result misses its tolerance: {e}")))
}

/// [`check_bytes`] of the problem `--random` describes (0 for `--input`, whose size the file
/// already fixed and whose check is then as large as the tensors read).
fn check_bytes_of(a: &ProblemArgs) -> u128 {
    match &a.random {
        Some(Dims(d)) => random_problem(a, d).map_or(0, |p| check_bytes(&p)),
        None => 0,
    }
}

fn dispatch(cmd: &Cmd) -> Result<(), Failure> {
    match cmd {
        Cmd::Devices => cmd_devices(),
        Cmd::Plan(a) => cmd_plan(a)?,
        Cmd::Run(r) => cmd_run(r)?,
        Cmd::Repro(r) => cmd_repro(r)?,
        Cmd::Sim(s) => cmd_sim(s)?,
        Cmd::TurboSession(a) => cmd_turbo_session(a)?,
        Cmd::Bench(a) => ferrattn_cli::bench::main(a)?,
        Cmd::TurboquantSession(a) => cmd_turboquant_session(a)?,
        Cmd::Golden { out } => {
            for p in golden_files::generate(out)? {
                println!("wrote {}", p.display());
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`ferrattn ... | head`) as command-line tools do, instead of
    // println! panicking on EPIPE. SAFETY: resetting a signal disposition before any thread starts.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match dispatch(&cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Error(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        Err(Failure::Tolerance(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
