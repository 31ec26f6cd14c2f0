//! The `tandem` command-line tool.

mod args;
mod bench_cmd;
mod bench_engine;
mod bench_prefix;
mod chat_cmd;
mod engine_setup;
mod generate_cmd;
mod generation;
mod plan;
mod prompting;
mod runner_setup;
mod score_cmd;
mod serve_cmd;
mod serve_limits;
mod serve_ops;
mod speculation_setup;
mod structured_args;
mod trace_out;

use clap::{Parser, Subcommand};

/// tandem: an LLM inference engine where scoring and generation share one forward pass.
#[derive(Debug, Parser)]
#[command(name = "tandem", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate text for a prompt, or for every line of a JSONL file at once.
    Generate(generate_cmd::GenerateArgs),
    /// Talk with the model: interactive, streaming, multi-turn.
    Chat(chat_cmd::ChatArgs),
    /// Teacher-forced scoring: the log-probability of every token of a text given the ones
    /// before it, with sum and perplexity.
    Score(score_cmd::ScoreArgs),
    /// Prefill and decode throughput: one JSON line per (batch, prompt length).
    Bench(bench_cmd::BenchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(serve_cmd::ServeArgs),
    /// Predict what a workload costs (KV capacity, step time, TTFT, ITL, throughput) from a
    /// roofline of the hardware; --calibrate measures this machine, --validate checks.
    Plan(plan::PlanArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => generate_cmd::run(a),
        Command::Chat(a) => chat_cmd::run(a),
        Command::Score(a) => score_cmd::run(a),
        Command::Bench(a) => bench_cmd::run(a),
        Command::Serve(a) => serve_cmd::run(a),
        Command::Plan(a) => plan::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tandem: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
