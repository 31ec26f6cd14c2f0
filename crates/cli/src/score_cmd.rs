//! `tandem score`: per-token log-probabilities of a known text (README.md § score).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use tandem_model::batch::TokenId;
use tandem_model::host_model::HostModel;
use tandem_model::loader::LoadedModel;
use tandem_model::runner::ModelRunner;
use tandem_model::scoring::{score_tokens, span_tokens, ScoreOptions, ScoreOutput, Window};
use tandem_model::tokenizer::Tokenizer;

use crate::args::{EngineArgs, ModelArgs};
use crate::runner_setup::PreparedModel;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["text", "file", "tokens"])))]
pub struct ScoreArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text to score (tokenized as a completion prompt: BOS added if the model says so).
    #[arg(long)]
    text: Option<String>,
    /// A UTF-8 file whose contents are scored.
    #[arg(long, value_name = "F")]
    file: Option<PathBuf>,
    /// Token ids, verbatim, comma-separated: 1,2,3.
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    tokens: Option<Vec<u32>>,
    /// Also report the K most likely tokens and the actual token's rank at each position.
    #[arg(long, value_name = "K", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    top_k: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Score inputs longer than the context in sliding windows of N tokens ...
    #[arg(long, value_name = "N", requires = "stride")]
    window: Option<usize>,
    /// ... advanced S tokens at a time; each window scores only tokens no earlier window did.
    #[arg(long, value_name = "S", requires = "window")]
    stride: Option<usize>,
    #[command(flatten)]
    engine: EngineArgs,
}

pub fn run(a: ScoreArgs) -> Result<()> {
    let started = Instant::now();
    let lm = a.model.load()?;
    let tokens = input_tokens(&a, &lm)?;
    if tokens.is_empty() {
        bail!("the input has no tokens to score");
    }
    let opts = ScoreOptions {
        top_k: a.top_k as usize,
        window: a
            .window
            .zip(a.stride)
            .map(|(size, stride)| Window { size, stride }),
        max_context: a.engine.max_model_len.map(|m| m as usize),
        adapter: a.model.adapter()?,
        ..ScoreOptions::default()
    };
    let LoadedModel {
        host,
        tokenizer,
        path,
        ..
    } = lm;
    let mut runner = score_runner(host, &a, &opts, tokens.len())?;
    let load_time = started.elapsed();
    let bar = progress_bar(tokens.len());
    let started = Instant::now();
    let out = score_tokens(runner.as_mut(), &tokens, &opts, &mut |done, _| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    let mut stdout = std::io::stdout().lock();
    if a.json {
        writeln!(stdout, "{}", to_json(&path, &tokenizer, &out, a.top_k > 0))?;
    } else {
        print_table(&mut stdout, &tokenizer, &out)?;
        writeln!(
            stdout,
            "{} tokens scored in {elapsed:.3} s ({:.1} tok/s, {} threads; model loaded in {:.3} s)",
            out.tokens.len(),
            out.tokens.len() as f64 / elapsed,
            a.model.threads(),
            load_time.as_secs_f64()
        )?;
    }
    Ok(())
}

/// A runner whose pool holds one scoring context of `num_tokens`.
fn score_runner(
    host: HostModel,
    a: &ScoreArgs,
    opts: &ScoreOptions,
    num_tokens: usize,
) -> Result<Box<dyn ModelRunner>> {
    let span = span_tokens(num_tokens, opts, host.config.context_len);
    let block_size = a.engine.block_size as usize;
    let mut prepared = PreparedModel::new(host, &a.model, a.engine.kv_cache_dtype)?;
    prepared.add_adapters(&a.model)?;
    let runner = prepared.into_runner(block_size, Some(span.div_ceil(block_size)))?;
    let trace = a.engine.trace.as_deref();
    Ok(crate::trace_out::TracedRunner::wrap(
        runner,
        trace,
        a.engine.trace_steps,
    ))
}

fn input_tokens(a: &ScoreArgs, lm: &LoadedModel) -> Result<Vec<TokenId>> {
    if let Some(ids) = &a.tokens {
        let vocab = lm.host.config.vocab_size;
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            bail!("--tokens: id {bad} is outside the vocabulary of {vocab}");
        }
        return Ok(ids.iter().map(|&t| TokenId(t)).collect());
    }
    let text = match (&a.text, &a.file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        (None, None) => bail!("one of --text, --file or --tokens is required"),
    };
    let ids = lm.tokenizer.encode(&text, true)?;
    Ok(ids.into_iter().map(TokenId).collect())
}

fn progress_bar(total: usize) -> ProgressBar {
    if total < 512 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} tokens ({per_sec}, eta {eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

fn to_json(path: &Path, tok: &Tokenizer, out: &ScoreOutput, with_top: bool) -> Value {
    let logprobs: Vec<Value> = out
        .positions
        .iter()
        .map(|p| json!(p.as_ref().map(|p| p.logprob)))
        .collect();
    let mut v = json!({
        "model": path.display().to_string(),
        "num_tokens": out.tokens.len(),
        "tokens": out.tokens.iter().map(|t| t.0).collect::<Vec<_>>(),
        "token_logprobs": logprobs,
        "sum_logprob": out.sum_logprob(),
        "perplexity": out.perplexity(),
    });
    if with_top {
        let top: Vec<Value> = out
            .positions
            .iter()
            .map(|p| match p {
                None => Value::Null,
                Some(p) => p
                    .top
                    .iter()
                    .map(|(id, lp)| json!({"id": id.0, "token": piece(tok, *id), "logprob": lp}))
                    .collect(),
            })
            .collect();
        v["top_logprobs"] = json!(top);
        v["ranks"] = json!(out
            .positions
            .iter()
            .map(|p| p.as_ref().and_then(|p| p.rank))
            .collect::<Vec<_>>());
    }
    v
}

fn piece(tok: &Tokenizer, id: TokenId) -> String {
    tok.decode(&[id.0], false).unwrap_or_default()
}

fn print_table(w: &mut impl Write, tok: &Tokenizer, out: &ScoreOutput) -> Result<()> {
    writeln!(
        w,
        "{:>6} {:>7} {:>10} {:>6}  token",
        "pos", "id", "logprob", "rank"
    )?;
    for (i, (t, p)) in out.tokens.iter().zip(&out.positions).enumerate() {
        let (lp, rank) = match p {
            Some(p) => (
                format!("{:.4}", p.logprob),
                p.rank.map_or(String::new(), |r| r.to_string()),
            ),
            None => ("-".to_string(), String::new()),
        };
        let mut line = format!("{i:>6} {:>7} {lp:>10} {rank:>6}  {:?}", t.0, piece(tok, *t));
        if let Some(p) = p.as_ref().filter(|p| !p.top.is_empty()) {
            let alts: Vec<String> = p
                .top
                .iter()
                .map(|(id, l)| format!("{:?} {l:.3}", piece(tok, *id)))
                .collect();
            line.push_str(&format!("   top: {}", alts.join(", ")));
        }
        writeln!(w, "{line}")?;
    }
    let ppl = out
        .perplexity()
        .map_or("n/a".to_string(), |p| format!("{p:.4}"));
    writeln!(w, "sum logprob {:.4}, perplexity {ppl}", out.sum_logprob())?;
    Ok(())
}
