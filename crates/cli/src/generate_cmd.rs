//! `tandem generate`: one prompt, or a JSONL file whose lines all run at once with continuous
//! batching; results in input order (README.md § generate, chat, bench).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use serde_json::json;
use tandem_model::chat_template::ChatMessage;

use crate::args::{EngineArgs, ModelArgs, SamplingArgs};
use crate::engine_setup::build_engine;
use crate::generation::{run_jobs, JobResult, Observer};
use crate::prompting::{PromptBuilder, PromptInput, SamplingOverrides};
use crate::runner_setup::PreparedModel;
use crate::structured_args::StructuredArgs;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["prompt", "input"])))]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: Option<String>,
    /// A JSONL file: one `{"prompt": str}` or `{"messages": [...]}` per line, with optional
    /// sampling fields (max_tokens, temperature, top_p, top_k, min_p, seed, stop, n, ...).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Where to write the JSONL results (default: stdout).
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Apply the model's chat template to `--prompt` (a single user message).
    #[arg(long)]
    chat: bool,
    /// Print one JSON object per result instead of the plain text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    structured: StructuredArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// One input line of `--input`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputLine {
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    #[serde(flatten)]
    overrides: SamplingOverrides,
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let (lm, target) = PreparedModel::load(&a.model, a.engine.kv_cache_dtype)?;
    let tokenizer = Arc::new(lm.tokenizer);
    let builder = PromptBuilder::new(
        tokenizer.clone(),
        lm.chat_template.as_deref(),
        &lm.eos_token_ids,
    )?
    .with_adapter(a.model.adapter()?);
    let inputs = read_inputs(&a)?;
    let constraint = a.structured.compile(&tokenizer)?;
    let mut jobs = Vec::new();
    let mut owners = Vec::new(); // (input index, sample index) of each result
    for (i, (input, overrides)) in inputs.iter().enumerate() {
        let mut job = builder
            .job(input, &a.sampling, overrides)
            .with_context(|| format!("input {i}"))?;
        job.sampling.constraint = constraint.clone();
        // The JSON records list each token's logprob; plain text needs none.
        job.sampling.logprobs = prints_json(&a);
        owners.extend((0..job.num_results()).map(|k| (i, k)));
        jobs.push(job);
    }
    let mut engine = build_engine(
        target,
        lm.eos_token_ids.clone(),
        &a.model,
        &a.engine,
        a.sampling.seed.unwrap_or(0),
    )?;
    // One plain-text result streams to the terminal; JSON records (to stdout or `--output`)
    // are written at the end.
    let streaming = a.prompt.is_some()
        && !prints_json(&a)
        && a.sampling.n == 1
        && a.sampling.beam_width.is_none();
    let mut observer = Progress::new(owners.len(), streaming);
    let started = Instant::now();
    let results = run_jobs(
        &mut engine,
        &tokenizer,
        jobs,
        &mut observer,
        &AtomicBool::new(false),
    )?;
    observer.bar.finish_and_clear();
    crate::trace_out::write(engine.trace(), a.engine.trace.as_deref())?;
    let generated: usize = results.iter().map(|r| r.token_ids.len()).sum();
    eprintln!(
        "tandem: {} results, {generated} tokens in {:.2} s ({:.1} tok/s)",
        results.len(),
        started.elapsed().as_secs_f64(),
        generated as f64 / started.elapsed().as_secs_f64()
    );
    if streaming {
        println!();
        if let Some(e) = &results[0].error {
            bail!("{e}");
        }
        return Ok(());
    }
    write_results(&a, &inputs, &owners, &results)?;
    let failed: Vec<&str> = results.iter().filter_map(|r| r.error.as_deref()).collect();
    match failed.first() {
        None => Ok(()),
        Some(first) => bail!(
            "{} of {} requests failed; the first: {first}",
            failed.len(),
            results.len()
        ),
    }
}

/// Whether the results are written as JSON records (with `--json`, `--output` or `--input`)
/// rather than as plain text.
fn prints_json(a: &GenerateArgs) -> bool {
    a.json || a.output.is_some() || a.input.is_some()
}

fn read_inputs(a: &GenerateArgs) -> Result<Vec<(PromptInput, SamplingOverrides)>> {
    if let Some(p) = &a.prompt {
        let input = if a.chat {
            PromptInput::Messages(vec![ChatMessage::new("user", p.clone())])
        } else {
            PromptInput::Text(p.clone())
        };
        return Ok(vec![(input, SamplingOverrides::default())]);
    }
    let path = a
        .input
        .as_ref()
        .context("--prompt or --input is required")?;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let l: InputLine = serde_json::from_str(&line).with_context(|| {
            format!(
                "{} line {}: not a valid input object",
                path.display(),
                n + 1
            )
        })?;
        let input = match (l.prompt, l.messages) {
            (Some(p), None) if a.chat => PromptInput::Messages(vec![ChatMessage::new("user", p)]),
            (Some(p), None) => PromptInput::Text(p),
            (None, Some(m)) => PromptInput::Messages(m),
            _ => bail!(
                "{} line {}: give exactly one of `prompt` or `messages`",
                path.display(),
                n + 1
            ),
        };
        out.push((input, l.overrides));
    }
    if out.is_empty() {
        bail!("{} has no input lines", path.display());
    }
    Ok(out)
}

fn write_results(
    a: &GenerateArgs,
    inputs: &[(PromptInput, SamplingOverrides)],
    owners: &[(usize, usize)],
    results: &[JobResult],
) -> Result<()> {
    let mut out: Box<dyn Write> = match &a.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let many_samples = owners.iter().any(|&(_, k)| k > 0);
    for (&(i, k), r) in owners.iter().zip(results) {
        if !prints_json(a) {
            writeln!(out, "{}", r.text)?;
            continue;
        }
        let beam_search = inputs[i].1.beam_width.or(a.sampling.beam_width).is_some();
        let mut v = json!({
            "index": i,
            "prompt": inputs[i].0.display_text(),
            "text": r.text,
            "token_ids": r.token_ids,
            // Beam search reports each hypothesis' cumulative logprob in `beams` instead (none
            // when it failed).
            "logprobs": if beam_search { serde_json::Value::Null } else { json!(r.logprobs) },
            "finish_reason": r.finish_reason,
            "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.token_ids.len()},
        });
        if many_samples {
            v["sample"] = json!(k);
        }
        if let Some(e) = &r.error {
            v["error"] = json!(e);
        }
        if !r.beams.is_empty() {
            let beams: Vec<serde_json::Value> = r
                .beams
                .iter()
                .map(|b| json!({"text": b.text, "token_ids": b.token_ids, "cum_logprob": b.cum_logprob, "score": b.score}))
                .collect();
            v["beams"] = json!(beams);
        }
        writeln!(out, "{v}")?;
    }
    out.flush()?;
    Ok(())
}

/// Progress on stderr (requests done, tok/s) and, for a single plain prompt, streamed text.
struct Progress {
    bar: ProgressBar,
    stream_text: bool,
    started: Instant,
}

impl Progress {
    fn new(total: usize, stream_text: bool) -> Progress {
        let bar = if stream_text {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(total as u64)
        };
        let style = ProgressStyle::with_template("{bar:40} {pos}/{len} requests  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        Progress {
            bar,
            stream_text,
            started: Instant::now(),
        }
    }
}

impl Observer for Progress {
    fn text(&mut self, _index: usize, delta: &str) {
        if self.stream_text && !delta.is_empty() {
            print!("{delta}");
            let _ = std::io::stdout().flush();
        }
    }

    fn finished(&mut self, _index: usize, generated: usize) {
        self.bar.inc(1);
        let rate = generated as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_message(format!("{rate:.1} tok/s"));
    }
}
