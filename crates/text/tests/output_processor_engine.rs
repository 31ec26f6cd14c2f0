//! The output processor over a real engine (the model crate's tiny random-weight Llama
//! fixture, one kernel thread): `n = 2` seeded samples come back as text equal to the
//! decoding of their tokens, and rerunning with a stop string taken from that text cuts it
//! there and ends the request in the engine (nothing is left running).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tandem_engine::engine::{Engine, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{RequestParams, SchedulerConfig};
use tandem_model::batch::TokenId;
use tandem_model::cpu_runner::{CpuRunner, KvSpec};
use tandem_model::tokenizer::Tokenizer;
use tandem_model::transformer::Model;
use tandem_text::{
    Finish, OutputProcessor, RequestDelta, RequestOutput, StopStrings, TextOptions, TextRequest,
};

const MAX_TOKENS: usize = 24;

fn engine() -> (Engine, Arc<Tokenizer>) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf/llama_untied");
    let lm = tandem_model::loader::load_model(&path).expect("the fixture model loads");
    let config = SchedulerConfig::new(64, 16, 256);
    let spec = KvSpec {
        block_size: config.block_size,
        num_blocks: config.num_blocks,
        dtype: None,
    };
    let runner = CpuRunner::new(Model::new(lm.host, 1), spec).expect("a KV pool");
    let engine = Engine::new(Box::new(runner), config, 0).expect("a valid config");
    (engine, Arc::new(lm.tokenizer))
}

fn request(tokenizer: &Tokenizer, stop: &[&str]) -> TextRequest {
    let prompt = tokenizer.encode("hello there", false).expect("encodes");
    TextRequest {
        request: GenerationRequest {
            prompt: prompt.into_iter().map(TokenId).collect(),
            sampling: SamplingParams {
                seed: Some(11),
                ignore_eos: true,
                ..SamplingParams::default()
            },
            limits: RequestParams {
                max_tokens: MAX_TOKENS,
                ignore_eos: true,
                ..RequestParams::default()
            },
            sample_index: 0,
            prompt_logprobs: None,
            prompt_logprobs_start: 1,
        },
        samples: 2,
        beam: None,
        text: TextOptions {
            skip_special_tokens: true,
            stop: StopStrings::new(stop.iter().copied()).expect("valid stop strings"),
            include_stop_str_in_output: false,
        },
        num_speculative_tokens: None,
    }
}

/// Runs `request` to the end; the deltas per sample.
fn run(
    engine: &mut Engine,
    tokenizer: &Arc<Tokenizer>,
    request: TextRequest,
) -> Vec<Vec<RequestDelta>> {
    let mut outputs = OutputProcessor::new(tokenizer.clone());
    let ids = outputs.add(engine, request, |k| k).expect("admitted");
    let mut deltas: HashMap<usize, Vec<RequestDelta>> = HashMap::new();
    while !outputs.is_empty() {
        let events = engine.step().expect("the step runs");
        outputs.process(engine, events, |_, &k, o| {
            if let RequestOutput::Delta(d) = o {
                deltas.entry(k).or_default().push(d);
            }
        });
    }
    assert!(!engine.has_unfinished(), "nothing left running");
    (0..ids.len())
        .map(|k| deltas.remove(&k).unwrap_or_default())
        .collect()
}

fn text(deltas: &[RequestDelta]) -> String {
    deltas.iter().map(|d| d.text.as_str()).collect()
}

fn tokens(deltas: &[RequestDelta]) -> Vec<u32> {
    deltas
        .iter()
        .filter_map(|d| d.token.as_ref())
        .map(|t| t.token.0)
        .collect()
}

#[test]
fn samples_are_their_decoded_tokens_and_a_stop_string_cuts_and_ends_one() {
    let (mut engine, tok) = engine();
    let free = run(&mut engine, &tok, request(&tok, &[]));
    assert_eq!(free.len(), 2);
    for sample in &free {
        assert_eq!(tokens(sample).len(), MAX_TOKENS);
        assert_eq!(
            text(sample),
            tok.decode(&tokens(sample), true).expect("decodes")
        );
        assert_eq!(
            sample.last().and_then(|d| d.finish.clone()),
            Some(Finish::Length)
        );
    }
    assert_ne!(
        tokens(&free[0]),
        tokens(&free[1]),
        "siblings sample their own streams"
    );

    // A stop string from the middle of sample 0's text (on char boundaries).
    let whole = text(&free[0]);
    let chars: Vec<(usize, char)> = whole.char_indices().collect();
    assert!(chars.len() >= 8, "enough text to cut: {whole:?}");
    let (from, to) = (chars[chars.len() / 2].0, chars[chars.len() / 2 + 2].0);
    let stop = &whole[from..to];
    let cut = &whole[..whole.find(stop).expect("present")];
    let stopped = run(&mut engine, &tok, request(&tok, &[stop]));
    assert_eq!(text(&stopped[0]), cut);
    assert_eq!(
        stopped[0].last().and_then(|d| d.finish.clone()),
        Some(Finish::Stop)
    );
    let n = tokens(&stopped[0]).len();
    assert_eq!(
        tokens(&stopped[0]),
        tokens(&free[0])[..n].to_vec(),
        "same seed, same tokens"
    );
    assert!(n < MAX_TOKENS, "the stop ended it before max_tokens");
}
