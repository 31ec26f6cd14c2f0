//! Engines over the real CPU model for the tests that check numbers (the fixtures and the
//! default model); scheduling tests use `tandem_model::fake_runner::FakeRunner` instead.

#![allow(dead_code)]

use tandem_engine::engine::{Engine, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::RequestParams;
use tandem_engine::SchedulerConfig;
use tandem_model::batch::{AdapterId, TokenId};
use tandem_model::cpu_runner::{CpuRunner, KvSpec};
use tandem_model::kv_store::KvDtype;
use tandem_model::loader::load_model;
use tandem_model::runner::ModelRunner;
use tandem_model::transformer::Model;
use tandem_model::ModelConfig;

/// The untied Llama HF fixture on 2 threads.
pub fn fixture_model() -> Model {
    hf_fixture("llama_untied")
}

/// The Gemma 3 HF fixture (a sliding window of 8 positions on two of its three layers) on
/// 2 threads.
pub fn gemma3_fixture() -> Model {
    hf_fixture("gemma3")
}

/// The Mixtral HF fixture (a mixture of 8 experts, 2 per token) on 2 threads.
pub fn mixtral_fixture() -> Model {
    hf_fixture("mixtral")
}

/// The HF fixture `name` (crates/model/tests/fixtures/hf) on 2 threads.
pub fn hf_fixture(name: &str) -> Model {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/hf")
        .join(name);
    Model::new(load_model(&dir).expect("fixture model").host, 2)
}

/// The default model (downloaded once into the cache) on 2 threads.
pub fn default_model() -> Model {
    let path = tandem_model::default_model::test_model_path().expect("default model");
    Model::new(load_model(&path).expect("default model").host, 2)
}

/// A pool of `num_blocks` blocks of `block_size` tokens for `model`'s context, with a token
/// budget of `budget` per step (also the chunk cap, so smaller budgets chunk prefills).
pub fn config(
    model: &ModelConfig,
    num_blocks: usize,
    budget: usize,
    block_size: usize,
) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(num_blocks, block_size, model.context_len);
    c.max_num_batched_tokens = budget;
    c.long_prefill_token_threshold = budget;
    c
}

/// A CPU runner over `model` with `config`'s pool, keys and values as `kv_dtype` (else the
/// model's default).
pub fn cpu_runner(
    model: Model,
    config: &SchedulerConfig,
    kv_dtype: Option<KvDtype>,
) -> Box<dyn ModelRunner> {
    let spec = KvSpec {
        block_size: config.block_size,
        num_blocks: config.num_blocks,
        dtype: kv_dtype,
    };
    Box::new(CpuRunner::new(model, spec).expect("KV pool"))
}

/// An engine over `model` on the CPU with the pool and limits of `config`.
pub fn cpu_engine(model: Model, config: SchedulerConfig, seed: u64) -> Engine {
    cpu_engine_with(model, config, None, seed)
}

/// [`cpu_engine`] with keys and values stored as `kv_dtype`.
pub fn cpu_engine_with(
    model: Model,
    config: SchedulerConfig,
    kv_dtype: Option<KvDtype>,
    seed: u64,
) -> Engine {
    let runner = cpu_runner(model, &config, kv_dtype);
    Engine::new(runner, config, seed).expect("engine")
}

/// A runner over `model` whose pool holds one scoring context of up to 2,048 tokens in
/// blocks of 16 (what `tandem score` would build for such an input).
pub fn scoring_runner(model: Model) -> Box<dyn ModelRunner> {
    scoring_runner_with(model, None)
}

/// [`scoring_runner`] with keys and values stored as `kv_dtype` (else the model's default).
pub fn scoring_runner_with(model: Model, kv_dtype: Option<KvDtype>) -> Box<dyn ModelRunner> {
    let spec = KvSpec {
        block_size: 16,
        num_blocks: 2048 / 16,
        dtype: kv_dtype,
    };
    Box::new(CpuRunner::new(model, spec).expect("KV pool"))
}

/// A request for `prompt`, sampled as `sampling`, that generates `max_tokens` tokens (EOS
/// ignored) under LoRA adapter `adapter`.
pub fn request_under(
    prompt: &[TokenId],
    sampling: SamplingParams,
    max_tokens: usize,
    adapter: Option<AdapterId>,
) -> GenerationRequest {
    GenerationRequest {
        prompt: prompt.to_vec(),
        sampling,
        limits: RequestParams {
            max_tokens,
            ignore_eos: true,
            adapter,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    }
}
