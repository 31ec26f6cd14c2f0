//! Disaggregated prefill through the engine over the real CPU model: one engine computes a
//! prompt and exports its cached blocks (`Engine::export_prefix`), another imports them
//! (`Engine::import_prefix`), and a request for the prompt on the second engine adopts them
//! from its prefix cache and generates bitwise what it generates alone, with or without a
//! LoRA adapter. A payload that does not fit is refused and changes nothing; an import into
//! a busy pool takes only free blocks; no block leaks.

use std::path::Path;

use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::error::EngineError;
use tandem_engine::kv_transfer::KvPayload;
use tandem_engine::sampler::SamplingParams;
use tandem_engine::RequestParams;
use tandem_model::batch::{AdapterId, TokenId};
use tandem_model::kv_store::KvDtype;
use tandem_model::lora::load_peft_adapter;

mod cpu_engine;
use cpu_engine::{config, cpu_engine_with, hf_fixture, request_under};

/// An engine over the Llama fixture with the PEFT fixture as adapter 0: `num_blocks` blocks
/// of 16 tokens, prefills chunked at 24 tokens.
fn engine(num_blocks: usize, dtype: KvDtype, caching: bool) -> Engine {
    engine_scaled(num_blocks, dtype, caching, 1.0)
}

/// [`engine`] with adapter 0's corrections scaled by `scale`.
fn engine_scaled(num_blocks: usize, dtype: KvDtype, caching: bool, scale: f32) -> Engine {
    let mut model = hf_fixture("llama_tied");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/lora/llama_tied");
    let mut adapter = load_peft_adapter(&dir, &model.config).expect("adapter");
    adapter.scale_all(scale);
    model.add_adapter(adapter).expect("adapter 0");
    let mut c = config(&model.config, num_blocks, 24, 16);
    c.enable_prefix_caching = caching;
    cpu_engine_with(model, c, Some(dtype), 7)
}

fn prompt(len: u32) -> Vec<TokenId> {
    (0..len)
        .map(|j| TokenId((j * 37 + 11) % 300 + 10))
        .collect()
}

/// A prompt sharing no block with [`prompt`]'s.
fn other_prompt(len: u32) -> Vec<TokenId> {
    (0..len).map(|j| TokenId((j * 13 + 5) % 300 + 10)).collect()
}

fn request(prompt: &[TokenId], adapter: Option<AdapterId>, max_tokens: usize) -> GenerationRequest {
    let sampling = SamplingParams {
        temperature: 0.8,
        seed: Some(5),
        logprobs: true,
        ..SamplingParams::default()
    };
    request_under(prompt, sampling, max_tokens, adapter)
}

/// Tokens, logprob bits and cached prompt tokens of one request run to its end.
fn run(engine: &mut Engine, req: GenerationRequest) -> (Vec<TokenId>, Vec<u32>, usize) {
    engine.add_request(req).expect("valid");
    let mut out = (Vec::new(), Vec::new(), 0);
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            match e {
                EngineEvent::Token { token, logprob, .. } => {
                    out.0.push(token);
                    out.1.push(logprob.expect("asked").to_bits());
                }
                EngineEvent::Admitted { cached_tokens, .. } => out.2 = cached_tokens,
                EngineEvent::Finished { reason, .. } => assert!(!reason.is_failure(), "{reason:?}"),
                EngineEvent::PromptLogprobs { .. } => {}
            }
        }
    }
    assert!(engine.scheduler().allocator().is_idle(), "every block back");
    out
}

/// The prefill side: computes `prompt` (one token out) and exports its cached blocks.
fn prefill(prompt: &[TokenId], adapter: Option<AdapterId>, dtype: KvDtype) -> KvPayload {
    prefill_from(prompt, adapter, dtype, 0)
}

/// [`prefill`] of the blocks from `skip` on.
fn prefill_from(
    prompt: &[TokenId],
    adapter: Option<AdapterId>,
    dtype: KvDtype,
    skip: u32,
) -> KvPayload {
    let mut p = engine(32, dtype, true);
    run(&mut p, request(prompt, adapter, 1));
    let payload = p
        .export_prefix(prompt, (None, adapter), skip)
        .expect("export");
    KvPayload::decode(payload.into_bytes()).expect("the wire form decodes")
}

#[test]
fn a_request_continues_from_imported_blocks_as_it_runs_alone() {
    for (len, adapter, dtype) in [
        (70, None, KvDtype::F32),
        (70, Some(AdapterId(0)), KvDtype::F16),
        (64, None, KvDtype::F16),
    ] {
        let p = prompt(len);
        let alone = run(&mut engine(32, dtype, true), request(&p, adapter, 8));
        let payload = prefill(&p, adapter, dtype);
        let usable = (len as usize - 1) / 16;
        assert_eq!(
            payload.num_blocks(),
            usable,
            "every block a request can adopt"
        );
        let mut d = engine(32, dtype, true);
        // Other work first, so that the imported blocks land at other block ids.
        run(&mut d, request(&other_prompt(40), None, 3));
        let added = d
            .import_prefix(&p, (None, adapter), &payload)
            .expect("import");
        let usable = (len as usize - 1) / 16;
        assert_eq!(added, usable, "len {len}: the blocks a request can adopt");
        assert!(
            d.scheduler().allocator().is_idle(),
            "imported blocks wait cached-free"
        );
        let again = d.export_prefix(&p, (None, adapter), 0).expect("export");
        for i in 0..usable {
            assert!(
                again.block(i) == payload.block(i),
                "block {i} is stored as sent"
            );
        }
        let got = run(&mut d, request(&p, adapter, 8));
        assert_eq!(
            got.2,
            usable * 16,
            "len {len}: the imported blocks are adopted"
        );
        assert_eq!(
            (got.0, got.1),
            (alone.0, alone.1),
            "len {len} {adapter:?} {dtype:?}"
        );
    }
}

#[test]
fn blocks_are_keyed_under_the_receiving_request() {
    let p = prompt(70);
    let payload = prefill(&p, None, KvDtype::F32);
    let mut d = engine(32, KvDtype::F32, true);
    d.import_prefix(&p, (Some("tenant a"), None), &payload)
        .expect("import");
    let other_salt = RequestParams {
        cache_salt: Some("tenant b".into()),
        ..request(&p, None, 1).limits
    };
    let req = GenerationRequest {
        limits: other_salt,
        ..request(&p, None, 1)
    };
    assert_eq!(run(&mut d, req).2, 0, "another salt does not see them");
    assert_eq!(
        run(&mut d, request(&p, Some(AdapterId(0)), 1)).2,
        0,
        "nor an adapter"
    );
}

#[test]
fn an_import_into_a_busy_pool_takes_only_free_blocks() {
    let p = prompt(70);
    let payload = prefill(&p, None, KvDtype::F32);
    let alone = run(&mut engine(7, KvDtype::F32, true), request(&p, None, 8));
    let mut d = engine(7, KvDtype::F32, true);
    d.add_request(request(&other_prompt(60), None, 4))
        .expect("valid");
    while d.scheduler().num_waiting() > 0 || d.scheduler().allocator().num_free() > 3 {
        d.step().expect("step");
    }
    let free = d.scheduler().allocator().num_free();
    let added = d.import_prefix(&p, (None, None), &payload).expect("import");
    assert_eq!(added, free, "as many blocks as were free");
    d.scheduler()
        .allocator()
        .check_invariants()
        .expect("allocator invariants");
    while d.has_unfinished() {
        d.step().expect("step");
    }
    let got = run(&mut d, request(&p, None, 8));
    assert_eq!(got.2, added * 16);
    assert_eq!((got.0, got.1), (alone.0, alone.1));
}

#[test]
fn payloads_that_do_not_fit_are_refused_and_change_nothing() {
    let p = prompt(70);
    let payload = prefill(&p, None, KvDtype::F32);
    let mut d = engine(32, KvDtype::F16, true);
    let refused = |d: &mut Engine, prompt: &[TokenId], adapter, payload: &KvPayload, why: &str| {
        let e = d
            .import_prefix(prompt, (None, adapter), payload)
            .expect_err(why);
        assert!(
            matches!(&e, EngineError::KvTransfer(m) if m.contains(why)),
            "{e}"
        );
        assert_eq!(d.scheduler().allocator().num_registered(), 0, "{why}");
        assert!(d.scheduler().allocator().is_idle(), "{why}");
    };
    refused(&mut d, &p, None, &payload, "dtype");
    let mut d = engine(32, KvDtype::F32, true);
    refused(&mut d, &p[..63], None, &payload, "full blocks");
    refused(&mut d, &p, Some(AdapterId(3)), &payload, "adapter 3");
    let mut off = engine(32, KvDtype::F32, false);
    refused(&mut off, &p, None, &payload, "prefix cache");
    let under_adapter = prefill(&p, Some(AdapterId(0)), KvDtype::F32);
    refused(&mut d, &p, None, &under_adapter, "another model");
    refused(&mut d, &p, Some(AdapterId(0)), &payload, "another model");
    let mut other_weights = engine_scaled(32, KvDtype::F32, true, 0.5);
    refused(
        &mut other_weights,
        &p,
        Some(AdapterId(0)),
        &under_adapter,
        "another model",
    );
    assert_eq!(d.import_prefix(&p, (None, None), &payload), Ok(4));
}

#[test]
fn a_payload_may_skip_the_blocks_the_receiver_holds() {
    let p = prompt(70);
    let alone = run(&mut engine(32, KvDtype::F32, true), request(&p, None, 8));
    let tail = prefill_from(&p, None, KvDtype::F32, 2);
    assert_eq!((tail.first_block(), tail.num_blocks()), (2, 2));
    let mut gap = engine(32, KvDtype::F32, true);
    assert_eq!(
        gap.import_prefix(&p, (None, None), &tail),
        Ok(0),
        "blocks 0 and 1 are missing"
    );
    assert_eq!(gap.scheduler().allocator().num_registered(), 0);
    assert!(gap.scheduler().allocator().is_idle());

    let mut d = engine(32, KvDtype::F32, true);
    run(&mut d, request(&p[..40], None, 1));
    assert_eq!(d.cached_prefix(&p, (None, None)), (2, 4));
    assert_eq!(d.import_prefix(&p, (None, None), &tail), Ok(2));
    assert_eq!(d.cached_prefix(&p, (None, None)), (4, 4));
    let got = run(&mut d, request(&p, None, 8));
    assert_eq!(got.2, 64);
    assert_eq!((got.0, got.1), (alone.0, alone.1));
}

#[test]
fn a_prompt_shorter_than_a_block_moves_nothing() {
    for len in [1, 15, 16, 17] {
        let p = prompt(len);
        let payload = prefill(&p, None, KvDtype::F32);
        let adoptable = (len as usize - 1) / 16;
        assert_eq!(payload.num_blocks(), adoptable, "len {len}");
        let mut d = engine(32, KvDtype::F32, true);
        assert_eq!(d.import_prefix(&p, (None, None), &payload), Ok(adoptable));
        d.scheduler()
            .allocator()
            .check_invariants()
            .expect("allocator invariants");
    }
}
