//! `tandem chat`: an interactive, streaming, multi-turn conversation through the model's
//! chat template. `/reset` forgets the conversation, `/quit` (or end of input) leaves, and
//! Ctrl-C stops the current answer, not the program.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use tandem_model::chat_template::ChatMessage;

use crate::args::{EngineArgs, ModelArgs, SamplingArgs};
use crate::engine_setup::build_engine;
use crate::generation::{run_jobs, Observer};
use crate::prompting::{PromptBuilder, PromptInput, SamplingOverrides};
use crate::runner_setup::PreparedModel;

#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A system message that starts every conversation.
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Prints the answer as it is generated.
struct Printer;

impl Observer for Printer {
    fn text(&mut self, _index: usize, delta: &str) {
        print!("{delta}");
        let _ = std::io::stdout().flush();
    }
}

pub fn run(a: ChatArgs) -> Result<()> {
    // A conversation keeps one answer per turn.
    anyhow::ensure!(
        a.sampling.n == 1,
        "--n {}: tandem chat answers each turn once (use generate for several samples)",
        a.sampling.n
    );
    let (lm, target) = PreparedModel::load(&a.model, a.engine.kv_cache_dtype)?;
    let tokenizer = Arc::new(lm.tokenizer);
    let builder = PromptBuilder::new(
        tokenizer.clone(),
        lm.chat_template.as_deref(),
        &lm.eos_token_ids,
    )?
    .with_adapter(a.model.adapter()?);
    let mut engine = build_engine(
        target,
        lm.eos_token_ids.clone(),
        &a.model,
        &a.engine,
        a.sampling.seed.unwrap_or(0),
    )?;
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed))
        .context("installing the Ctrl-C handler")?;
    eprintln!("tandem chat: /reset forgets the conversation, /quit leaves, Ctrl-C stops an answer");
    let start: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.clone()))
        .collect();
    let mut history = start.clone();
    let stdin = std::io::stdin();
    loop {
        print!("> ");
        std::io::stdout().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            println!();
            return crate::trace_out::write(engine.trace(), a.engine.trace.as_deref());
        }
        match line.trim() {
            "" => continue,
            "/quit" | "/exit" => {
                return crate::trace_out::write(engine.trace(), a.engine.trace.as_deref())
            }
            "/reset" => {
                history = start.clone();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new(
            "user",
            line.trim_end_matches(['\n', '\r']),
        ));
        let job = builder.job(
            &PromptInput::Messages(history.clone()),
            &a.sampling,
            &SamplingOverrides::default(),
        );
        let jobs = match job {
            Ok(j) => vec![j],
            Err(e) => {
                eprintln!("error: {e:#}");
                history.pop();
                continue;
            }
        };
        cancel.store(false, Ordering::Relaxed);
        let result = run_jobs(&mut engine, &tokenizer, jobs, &mut Printer, &cancel)?.remove(0);
        if !result.beams.is_empty() {
            // Beam search streams nothing: its best hypothesis is known at the end.
            print!("{}", result.text);
        }
        println!();
        match (&result.error, result.finish_reason.as_str()) {
            (Some(e), _) => {
                eprintln!("error: {e}");
                history.pop();
            }
            (None, "abort") => eprintln!("(stopped)"),
            _ => {}
        }
        if result.error.is_none() {
            history.push(ChatMessage::new("assistant", result.text));
        }
    }
}
