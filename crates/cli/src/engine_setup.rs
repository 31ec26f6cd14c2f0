//! Turns the engine flags into a running [`Engine`]: KV pool size from `--kv-cache-memory`,
//! batching limits, context length, speculative decoding.

use anyhow::{bail, Context, Result};
use tandem_engine::engine::Engine;
use tandem_engine::SchedulerConfig;
use tandem_model::batch::TokenId;

use crate::args::{EngineArgs, ModelArgs};
use crate::runner_setup::PreparedModel;
use crate::speculation_setup;

/// Default KV pool when `--kv-cache-memory` is not given.
const DEFAULT_KV_BYTES: u64 = 2 << 30;

/// Parses sizes such as `2GiB`, `512MiB`, `1.5G`, `1000000` (bytes).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("`{s}` is not a size like 2GiB"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => bail!("unknown size unit `{other}` in `{s}` (use B, KiB, MiB, GiB, KB, MB, GB)"),
    };
    let bytes = value * scale;
    if !(bytes.is_finite() && bytes >= 1.0) {
        bail!("size `{s}` must be positive");
    }
    Ok(bytes as u64)
}

/// Builds the engine over `target` (and the draft model the flags name), reporting the
/// runner and its KV pool on stderr.
pub fn build_engine(
    target: PreparedModel,
    eos: Vec<TokenId>,
    model_args: &ModelArgs,
    args: &EngineArgs,
    seed: u64,
) -> Result<Engine> {
    let block_size = args.block_size as usize;
    let context = target.config().context_len;
    let spec = speculation_setup::load_method(args, model_args)?;
    // A draft model's KV pool holds as many tokens as the target's, out of the same budget.
    let draft_bytes = spec
        .as_ref()
        .and_then(|(_, d)| d.as_ref())
        .map_or(0, PreparedModel::kv_bytes_per_token);
    let per_block = ((target.kv_bytes_per_token() + draft_bytes) * block_size) as u64;
    let bytes = match &args.kv_cache_memory {
        Some(s) => Some(parse_size(s).context("--kv-cache-memory")?),
        None if target.is_cuda() => None, // what --gpu-memory-utilization leaves
        None => Some(DEFAULT_KV_BYTES),
    };
    let num_blocks = match bytes {
        Some(bytes) if bytes < per_block => {
            bail!("--kv-cache-memory {bytes} bytes holds no block of {per_block} bytes")
        }
        Some(bytes) => Some((bytes / per_block) as usize),
        None if draft_bytes > 0 => {
            bail!("a draft model on CUDA needs --kv-cache-memory (the budget both pools share)")
        }
        None => None,
    };
    let max_model_len = match args.max_model_len {
        Some(m) if m as usize > context => {
            bail!("--max-model-len {m} exceeds the model's context length of {context}")
        }
        Some(m) => m as usize,
        None => context,
    };
    let (kv_dtype, target_weights) = (target.kv_dtype(), target.weight_bytes());
    let runner = target.into_runner(block_size, num_blocks)?;
    let g = runner.kv_geometry();
    let mut config = SchedulerConfig::new(g.num_blocks, g.block_size, max_model_len);
    if let Some(n) = args.max_num_seqs {
        config.max_num_seqs = n;
    }
    if let Some(n) = args.max_num_batched_tokens {
        config.max_num_batched_tokens = n;
    }
    config.eos_token_ids = eos;
    config.enable_prefix_caching = !args.no_prefix_caching;
    eprintln!(
        "tandem: {}; KV cache {} blocks x {block_size} tokens = {} tokens ({:.0} MiB, {}), prefix caching {}",
        runner.describe(),
        g.num_blocks,
        g.capacity_tokens(),
        g.bytes() as f64 / (1 << 20) as f64,
        kv_dtype.name(),
        if config.enable_prefix_caching { "on" } else { "off" }
    );
    let mut engine = Engine::new(runner, config, seed)?;
    engine.set_overlap(!args.no_overlap);
    if args.trace.is_some() {
        engine.enable_trace(args.trace_steps);
    }
    if let Some((method, draft)) = spec {
        let draft = match draft {
            Some(d) => {
                let ratio = d.weight_bytes() as f64 / target_weights.max(1) as f64;
                let runner = d.into_runner(block_size, Some(g.num_blocks)).context(
                    "the draft model's KV pool (it stores keys and values as the target's do)",
                )?;
                Some((runner, ratio))
            }
            None => None,
        };
        speculation_setup::enable(&mut engine, method, draft, args)?;
    }
    Ok(engine)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("512 MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3 parsecs").is_err());
        assert!(parse_size("0").is_err());
    }
}
