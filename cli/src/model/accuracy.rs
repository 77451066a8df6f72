//! The model-accuracy table (`ferrattn repro model-accuracy`): every attention method against
//! exact attention on SmolLM2-135M.
//!
//! Measured per method, on the same tokens:
//! - **Teacher-forced text.** The first `N` tokens of a fixed English text. The first half is one
//!   prefill through the method's prefill; each token of the second half is then one decode
//!   step through its decode with the cache it keeps (for TurboAttention the INT8 buffer and its
//!   flush into INT4/INT2 blocks every 64 tokens). At every position: the negative log-likelihood
//!   of the next token (perplexity = `exp(mean NLL)`), the KL divergence
//!   `KL(p_ref ‖ p_method)` of the next-token distribution against the reference's at that
//!   position, and whether both put their maximum on the same token (top-1 agreement). Prefill
//!   and decode positions are reported apart, since several methods only differ in decode.
//! - **Greedy generation.** Five fixed chat prompts, each prefilled and then continued greedily
//!   for 64 tokens by decode steps; the continuation is compared position by position with the
//!   reference's (tokens equal, and the length of the identical prefix).

use super::attention::Method;
use super::ops::{argmax, log_softmax};
use super::{Model, ModelError};
use crate::error::Result;
use ferrattn_core::turbo::{KvBits, TurboConfig};
use ferrattn_core::turboquant::{TurboQuantConfig, DEFAULT_BLOCK_K, DEFAULT_SEED};
use std::path::PathBuf;
use std::time::Instant;

/// One row of the table: a named method.
#[derive(Clone, Debug)]
pub struct Row {
    /// Row name (`exact`, `lean`, `turbo-int4-sas`, `turboquant-k4-v3`, `turboquant-k3-v2-noqjl`,
    /// ...): TurboQuant rows name total key bits (`k4` = 3 codebook bits + 1 QJL bit; with
    /// `-noqjl` all 4 on the codebook) and value bits.
    pub name: String,
    /// Family the `--algos` filter also accepts: exact, lean, turbo, turboquant.
    pub family: &'static str,
    /// The method.
    pub method: Method,
}

/// Every row the table knows, reference first.
pub fn all_rows() -> Vec<Row> {
    let mut rows = vec![
        Row {
            name: "exact".into(),
            family: "exact",
            method: Method::Exact,
        },
        Row {
            name: "lean".into(),
            family: "lean",
            method: Method::Lean,
        },
    ];
    for (bits, kv_bits) in [
        ("int4", KvBits::Int4),
        ("int2", KvBits::Int2),
        (
            "mixed",
            KvBits::Mixed {
                two_bit_fraction: 0.5,
            },
        ),
    ] {
        for sas in [true, false] {
            rows.push(Row {
                name: format!("turbo-{bits}-{}", if sas { "sas" } else { "exp" }),
                family: "turbo",
                method: Method::Turbo(TurboConfig {
                    sas,
                    kv_bits: kv_bits.clone(),
                    ..TurboConfig::default()
                }),
            });
        }
    }
    for key_qjl in [true, false] {
        for key_bits in [4u8, 3, 2] {
            for value_bits in [3u8, 2] {
                rows.push(Row {
                    name: format!(
                        "turboquant-k{key_bits}-v{value_bits}{}",
                        if key_qjl { "" } else { "-noqjl" }
                    ),
                    family: "turboquant",
                    method: Method::TurboQuant(TurboQuantConfig {
                        block_k: DEFAULT_BLOCK_K,
                        key_bits,
                        key_qjl,
                        value_bits,
                        // m = d, as the paper and the fused kernel use
                        qjl_dim: 64,
                        seed: DEFAULT_SEED,
                        defer_value_unrotation: false,
                    }),
                });
            }
        }
    }
    rows
}

/// The rows `filter` names (row names or families, comma separated), the reference first;
/// every row when `filter` is empty.
pub fn select_rows(filter: &[String]) -> Result<Vec<Row>> {
    let all = all_rows();
    if let Some(bad) = filter
        .iter()
        .find(|f| !all.iter().any(|r| r.name == **f || r.family == f.as_str()))
    {
        return Err(ModelError::Unsupported(format!(
            "--algos {bad:?}; rows: {}; families: exact, lean, turbo, turboquant",
            all.iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into());
    }
    Ok(all
        .into_iter()
        .filter(|r| {
            r.name == "exact"
                || filter.is_empty()
                || filter
                    .iter()
                    .any(|f| r.name == *f || r.family == f.as_str())
        })
        .collect())
}

/// The fixed user turns of the greedy-generation prompts.
pub const PROMPTS: [&str; 5] = [
    "What is the capital of France, and what is it famous for?",
    "Explain in simple terms why the sky is blue.",
    "Write a short poem about the sea.",
    "Give three tips for writing clean code.",
    "How does a computer store numbers in memory?",
];

/// A prompt in SmolLM2's chat template (the one in its GGUF `tokenizer.chat_template`).
pub fn chat(user: &str) -> String {
    format!(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )
}

/// What the harness runs: tokens and prompts, the same for every row.
pub struct Workload {
    /// The teacher-forced text tokens.
    pub text: Vec<u32>,
    /// Tokens of `text` that go through the prefill; the rest are decode steps.
    pub prefill: usize,
    /// Greedy-generation prompts, tokenised.
    pub prompts: Vec<Vec<u32>>,
    /// Tokens generated per prompt.
    pub generate: usize,
}

/// Per-position statistics of one run of the text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Part {
    /// Positions.
    pub positions: usize,
    /// Sum of next-token NLL (nats).
    pub nll: f64,
    /// Sum of `KL(p_ref ‖ p)` (nats).
    pub kl: f64,
    /// Largest single-position KL.
    pub kl_max: f64,
    /// Positions whose argmax equals the reference's.
    pub top1: usize,
}

impl Part {
    /// `exp(mean NLL)`.
    pub fn perplexity(&self) -> f64 {
        (self.nll / self.positions.max(1) as f64).exp()
    }
    /// Mean KL.
    pub fn kl_mean(&self) -> f64 {
        self.kl / self.positions.max(1) as f64
    }
    /// Top-1 agreement as a fraction.
    pub fn top1_rate(&self) -> f64 {
        self.top1 as f64 / self.positions.max(1) as f64
    }
    fn add(&mut self, o: &Part) {
        self.positions += o.positions;
        self.nll += o.nll;
        self.kl += o.kl;
        self.kl_max = self.kl_max.max(o.kl_max);
        self.top1 += o.top1;
    }
}

/// One row's measurements.
#[derive(Clone, Debug)]
pub struct RowResult {
    /// Row name.
    pub name: String,
    /// Positions predicted from prefill logits.
    pub prefill: Part,
    /// Positions predicted from decode-step logits.
    pub decode: Part,
    /// Greedy continuation of each prompt.
    pub generated: Vec<Vec<u32>>,
    /// Wall time of the row in seconds.
    pub seconds: f64,
}

impl RowResult {
    /// Both parts together.
    pub fn total(&self) -> Part {
        let mut t = self.prefill.clone();
        t.add(&self.decode);
        t
    }
}

/// Log-probabilities of the reference at every text position, `[positions, vocab]`.
pub struct Reference {
    logp: Vec<f32>,
    vocab: usize,
}

/// Feeds the text through `method` (prefill, then one decode step per token) and hands each
/// position's logits to `sink(position, logits)`.
fn teacher_forced(
    model: &Model,
    method: &Method,
    w: &Workload,
    sink: &mut dyn FnMut(usize, &[f32]),
) -> Result<()> {
    let (llama, vocab) = (&model.llama, model.llama.cfg.vocab);
    let mut attn = method.session(llama.cfg.layers)?;
    let logits = llama.forward(&w.text[..w.prefill], 0, attn.as_mut(), &mut |_, _, _, _| {})?;
    for (i, row) in logits.chunks(vocab).enumerate() {
        sink(i, row);
    }
    for pos in w.prefill..w.text.len() - 1 {
        let logits = llama.forward(
            &w.text[pos..pos + 1],
            pos,
            attn.as_mut(),
            &mut |_, _, _, _| {},
        )?;
        sink(pos, &logits);
    }
    Ok(())
}

/// Greedy continuation of one prompt: `n` tokens, the first from the prefill's last logits.
pub fn greedy(model: &Model, method: &Method, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
    let (llama, vocab) = (&model.llama, model.llama.cfg.vocab);
    let mut attn = method.session(llama.cfg.layers)?;
    let logits = llama.forward(prompt, 0, attn.as_mut(), &mut |_, _, _, _| {})?;
    let mut out = vec![argmax(&logits[logits.len() - vocab..]) as u32];
    while out.len() < n {
        let pos = prompt.len() + out.len() - 1;
        let last = [*out.last().expect("one token generated")];
        let logits = llama.forward(&last, pos, attn.as_mut(), &mut |_, _, _, _| {})?;
        out.push(argmax(&logits) as u32);
    }
    Ok(out)
}

/// Runs the reference (exact attention) over the workload.
pub fn reference(model: &Model, w: &Workload) -> Result<(Reference, RowResult)> {
    let t0 = Instant::now();
    let vocab = model.llama.cfg.vocab;
    let positions = w.text.len() - 1;
    let mut logp = vec![0.0f32; positions * vocab];
    let mut parts = (Part::default(), Part::default());
    teacher_forced(model, &Method::Exact, w, &mut |i, logits| {
        let lp = log_softmax(logits);
        let part = if i < w.prefill {
            &mut parts.0
        } else {
            &mut parts.1
        };
        part.positions += 1;
        part.nll -= lp[w.text[i + 1] as usize] as f64;
        part.top1 += 1;
        logp[i * vocab..(i + 1) * vocab].copy_from_slice(&lp);
    })?;
    let generated = w
        .prompts
        .iter()
        .map(|p| greedy(model, &Method::Exact, p, w.generate))
        .collect::<Result<Vec<_>>>()?;
    Ok((
        Reference { logp, vocab },
        RowResult {
            name: "exact".into(),
            prefill: parts.0,
            decode: parts.1,
            generated,
            seconds: t0.elapsed().as_secs_f64(),
        },
    ))
}

/// Runs one method over the workload and compares it with the reference.
pub fn evaluate(model: &Model, row: &Row, w: &Workload, r: &Reference) -> Result<RowResult> {
    let t0 = Instant::now();
    let mut parts = (Part::default(), Part::default());
    teacher_forced(model, &row.method, w, &mut |i, logits| {
        let lp = log_softmax(logits);
        let lr = &r.logp[i * r.vocab..(i + 1) * r.vocab];
        let kl: f64 = lr
            .iter()
            .zip(&lp)
            .map(|(&a, &b)| (a as f64).exp() * (a as f64 - b as f64))
            .sum();
        let part = if i < w.prefill {
            &mut parts.0
        } else {
            &mut parts.1
        };
        part.positions += 1;
        part.nll -= lp[w.text[i + 1] as usize] as f64;
        part.kl += kl;
        part.kl_max = part.kl_max.max(kl);
        part.top1 += usize::from(argmax(&lp) == argmax(lr));
    })?;
    let generated = w
        .prompts
        .iter()
        .map(|p| greedy(model, &row.method, p, w.generate))
        .collect::<Result<Vec<_>>>()?;
    Ok(RowResult {
        name: row.name.clone(),
        prefill: parts.0,
        decode: parts.1,
        generated,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// `(tokens equal at the same position, identical-prefix length)` of a continuation.
pub fn agreement(a: &[u32], reference: &[u32]) -> (usize, usize) {
    let same = a.iter().zip(reference).filter(|(x, y)| x == y).count();
    let prefix = a.iter().zip(reference).take_while(|(x, y)| x == y).count();
    (same, prefix)
}

/// The table in markdown.
pub fn markdown(results: &[RowResult], w: &Workload) -> String {
    let reference = &results[0];
    let ref_ppl = reference.total().perplexity();
    let mut s = format!(
        "| method | ppl | Δppl | ppl prefill / decode | KL prefill / decode (max) | top-1 prefill / decode | greedy tokens equal (of {}) | identical prefix per prompt |\n|---|---|---|---|---|---|---|---|\n",
        w.generate * w.prompts.len()
    );
    for r in results {
        let t = r.total();
        let (mut same, mut prefixes) = (0, vec![]);
        for (g, gr) in r.generated.iter().zip(&reference.generated) {
            let (s, p) = agreement(g, gr);
            same += s;
            prefixes.push(p.to_string());
        }
        s += &format!(
            "| {} | {:.3} | {:+.2}% | {:.3} / {:.3} | {:.4} / {:.4} ({:.2}) | {:.1}% / {:.1}% | {} | {} |\n",
            r.name,
            t.perplexity(),
            100.0 * (t.perplexity() / ref_ppl - 1.0),
            r.prefill.perplexity(),
            r.decode.perplexity(),
            r.prefill.kl_mean(),
            r.decode.kl_mean(),
            r.prefill.kl_max.max(r.decode.kl_max),
            100.0 * r.prefill.top1_rate(),
            100.0 * r.decode.top1_rate(),
            same,
            prefixes.join(", ")
        );
    }
    s
}

/// Writes `tokens` (the scored text tokens), `all_tokens` (the whole text), `prompt{i}` (each
/// prompt) and `logits` (`[tokens, vocab]`, the exact-attention prefill of the scored tokens) to
/// a safetensors file.
fn dump_reference(
    model: &Model,
    w: &Workload,
    all_tokens: &[u32],
    path: &std::path::Path,
) -> Result<()> {
    let mut attn = Method::Exact.session(model.llama.cfg.layers)?;
    let logits = model
        .llama
        .forward(&w.text, 0, attn.as_mut(), &mut |_, _, _, _| {})?;
    let logits = ferrattn_core::Tensor {
        shape: vec![w.text.len(), model.llama.cfg.vocab],
        dtype: ferrattn_core::DType::F32,
        data: logits,
    };
    let ints: Vec<(String, Vec<i64>)> = [("tokens", &w.text[..]), ("all_tokens", all_tokens)]
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .chain(
            w.prompts
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("prompt{i}"), p.as_slice())),
        )
        .map(|(n, t)| (n, t.iter().map(|&x| x as i64).collect()))
        .collect();
    let int_refs: Vec<(&str, &[i64])> = ints
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect();
    crate::io::write_file(path, &[("logits", &logits)], &int_refs, Default::default())?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Arguments of `ferrattn repro model-accuracy`.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelAccuracyArgs {
    /// The GGUF file (scripts/fetch-smollm2.sh extracts it and prints its path).
    #[arg(long, default_value = ".models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// The English text whose first tokens are scored.
    #[arg(long, default_value = "../shared/papers/turboattention-paper.txt")]
    pub text: PathBuf,
    /// Text tokens scored: the first half prefilled, the second half decoded one by one.
    #[arg(long, default_value_t = 1024)]
    pub tokens: usize,
    /// Rows to run (names or families, comma separated; the exact reference always runs).
    #[arg(long, value_delimiter = ',')]
    pub algos: Vec<String>,
    /// Greedy prompts (the first N of five).
    #[arg(long, default_value_t = 5)]
    pub prompts: usize,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 64)]
    pub generate: usize,
    /// Print every row's first greedy continuation to stderr.
    #[arg(long)]
    pub show: bool,
    /// Instead of the table, write the tokens of the text and prompts and the reference's
    /// prefill logits of the text to this safetensors file (for scripts/check-model-numpy.py).
    #[arg(long)]
    pub dump_reference: Option<PathBuf>,
    /// Instead of the table, capture real Q/K/V golden files into this directory
    /// (`tests/golden/real`; see `ferrattn_cli::model::capture`).
    #[arg(long)]
    pub capture_golden: Option<PathBuf>,
}

/// `ferrattn repro model-accuracy`: prints the markdown table (progress on stderr).
pub fn repro(a: &ModelAccuracyArgs) -> Result<()> {
    if a.tokens < 4 || a.prompts > PROMPTS.len() || a.generate == 0 {
        return Err(ModelError::Unsupported(format!(
            "--tokens {} --prompts {} --generate {}: need at least 4 tokens, at most {} prompts, at least 1 generated token",
            a.tokens,
            a.prompts,
            a.generate,
            PROMPTS.len()
        ))
        .into());
    }
    let rows = select_rows(&a.algos)?;
    let t0 = Instant::now();
    let model = Model::load(&a.model).map_err(|e| match e {
        ModelError::Io { path, message } => ModelError::Io {
            path,
            message: format!("{message} (run scripts/fetch-smollm2.sh to fetch the model)"),
        },
        e => e,
    })?;
    let text = std::fs::read_to_string(&a.text).map_err(|e| ModelError::Io {
        path: a.text.display().to_string(),
        message: e.to_string(),
    })?;
    let mut tokens = model.tokenizer.encode(&text)?;
    if let Some(path) = &a.dump_reference {
        let all_tokens = tokens.clone();
        tokens.truncate(a.tokens);
        let w = Workload {
            prefill: a.tokens,
            text: tokens,
            prompts: PROMPTS
                .iter()
                .map(|p| model.tokenizer.encode(&chat(p)))
                .collect::<Result<Vec<_>, _>>()?,
            generate: 0,
        };
        return dump_reference(&model, &w, &all_tokens, path);
    }
    if let Some(dir) = &a.capture_golden {
        let source = a
            .text
            .file_name()
            .map_or(String::new(), |f| f.to_string_lossy().into_owned());
        super::capture::capture(&model, &tokens, &source, dir)?;
        return Ok(());
    }
    if tokens.len() < a.tokens {
        return Err(ModelError::Unsupported(format!(
            "{} has {} tokens; --tokens asks for {}",
            a.text.display(),
            tokens.len(),
            a.tokens
        ))
        .into());
    }
    tokens.truncate(a.tokens);
    let w = Workload {
        prefill: a.tokens / 2,
        text: tokens,
        prompts: PROMPTS[..a.prompts]
            .iter()
            .map(|p| model.tokenizer.encode(&chat(p)))
            .collect::<Result<Vec<_>, _>>()?,
        generate: a.generate,
    };
    eprintln!(
        "model-accuracy: {} loaded in {:.1} s; {} text tokens ({} prefill + {} decode), {} prompts x {} tokens, {} rows",
        a.model.display(),
        t0.elapsed().as_secs_f64(),
        w.text.len(),
        w.prefill,
        w.text.len() - w.prefill,
        w.prompts.len(),
        w.generate,
        rows.len()
    );
    let (r, first) = reference(&model, &w)?;
    let report = |res: &RowResult| -> Result<()> {
        eprintln!(
            "  {:<24} ppl {:.3}  {:.1} s",
            res.name,
            res.total().perplexity(),
            res.seconds
        );
        if a.show {
            if let Some(g) = res.generated.first() {
                eprintln!("    {:?}", model.tokenizer.decode(g)?);
            }
        }
        Ok(())
    };
    report(&first)?;
    let mut results = vec![first];
    for row in rows.iter().skip(1) {
        let res = evaluate(&model, row, &w, &r)?;
        report(&res)?;
        results.push(res);
    }
    println!(
        "SmolLM2-135M-Instruct (Q4_1 GGUF, f32 forward) on ferrattn attention: {} tokens of {} ({} prefill + {} decode steps), {} greedy prompts x {} tokens",
        w.text.len(),
        a.text.display(),
        w.prefill,
        w.text.len() - w.prefill,
        w.prompts.len(),
        w.generate
    );
    println!();
    print!("{}", markdown(&results, &w));
    Ok(())
}
