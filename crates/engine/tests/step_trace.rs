//! The step timeline under a mixed workload (chunked prefill, preemption in a tiny pool,
//! aborts of running and waiting requests, n-gram speculation, prefix-cache hits) on the
//! weightless `FakeRunner`: the Chrome trace JSON is written, parsed back and checked.
//!
//! - step slices never overlap and their parts tile them;
//! - each step's `tokens` counter (prefill + decode) equals the tokens the runner was handed
//!   for that step (a wrapper around the runner counts them independently), never more than
//!   the budget;
//! - every request has one track, in order: arrived, queued, computed slices (each preemption
//!   followed by a new queued slice), and exactly one final mark (finished or aborted); its
//!   slices do not overlap; a finished request computed at least its prompt and all but its
//!   last output token.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::speculative::{NgramProposer, SpeculativeConfig};
use tandem_engine::{RequestParams, SchedulerConfig};
use tandem_model::batch::{BlockId, ForwardBatch, TokenId};
use tandem_model::fake_runner::FakeRunner;
use tandem_model::logits::Logits;
use tandem_model::runner::{KvGeometry, ModelRunner};
use tandem_model::{ModelConfig, Result as ModelResult};

const VOCAB: usize = 16;
const CONTEXT: usize = 64;
const BLOCK: usize = 4;
const BUDGET: usize = 7;
/// Holds the longest request but not all of them at once: preemption happens.
const BLOCKS: usize = CONTEXT / BLOCK + 2;

/// A runner that counts the tokens of every forward pass it is handed.
#[derive(Debug)]
struct Counting {
    inner: FakeRunner,
    batches: Arc<Mutex<Vec<usize>>>,
}

impl ModelRunner for Counting {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn kv_geometry(&self) -> KvGeometry {
        self.inner.kv_geometry()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> ModelResult<Logits> {
        self.batches
            .lock()
            .expect("not poisoned")
            .push(batch.tokens.len());
        self.inner.forward(batch)
    }
    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> ModelResult<()> {
        self.inner.copy_blocks(copies)
    }
    fn cached_logits(&mut self, table: &[BlockId], positions: Range<usize>) -> ModelResult<Logits> {
        self.inner.cached_logits(table, positions)
    }
    fn model_identity(&self) -> u64 {
        self.inner.model_identity()
    }
    fn describe(&self) -> String {
        "counting fake".into()
    }
}

fn engine(batches: Arc<Mutex<Vec<usize>>>) -> Engine {
    let mut c = SchedulerConfig::new(BLOCKS, BLOCK, CONTEXT);
    c.max_num_batched_tokens = BUDGET;
    c.long_prefill_token_threshold = BUDGET;
    c.enable_prefix_caching = true;
    let inner = FakeRunner::new(VOCAB, CONTEXT, BLOCKS, BLOCK, 0x7a11);
    let runner = Counting { inner, batches };
    let mut engine = Engine::new(Box::new(runner), c, 3).expect("the pool matches");
    let mut spec = SpeculativeConfig::default();
    (spec.num_tokens, spec.max_batch_size) = (3, 64);
    (spec.draft_cost, spec.verify_cost) = (0.0, 0.0);
    let ngram = NgramProposer::new(1, 3).expect("n-gram sizes");
    engine
        .enable_speculation(spec, Box::new(ngram))
        .expect("a valid speculative config");
    engine.enable_trace(100_000);
    engine
}

fn request(i: usize) -> GenerationRequest {
    // Repetitive prompts (n-gram drafts find matches), some sharing a prefix (cache hits).
    let len = 5 + (i * 7) % 23;
    let prompt = (0..len)
        .map(|p| TokenId(((p % (3 + i % 4)) + usize::from(i.is_multiple_of(3))) as u32 % 16))
        .collect();
    GenerationRequest {
        prompt,
        sampling: SamplingParams::greedy(),
        limits: RequestParams {
            max_tokens: 8 + (i * 5) % 17,
            ignore_eos: true,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    }
}

/// What the workload did, to check the trace against.
#[derive(Debug, Default)]
struct Workload {
    prompt_len: HashMap<u64, usize>,
    outputs: HashMap<u64, usize>,
    aborted: Vec<u64>,
}

fn run(engine: &mut Engine) -> Workload {
    let mut w = Workload::default();
    let add = |engine: &mut Engine, w: &mut Workload, i: usize| {
        let r = request(i);
        let len = r.prompt.len();
        let id = engine.add_request(r).expect("a valid request");
        w.prompt_len.insert(id.0, len);
        id
    };
    let mut next = 0;
    let mut running_victim = None;
    for step in 0.. {
        if step % 3 == 0 && next < 12 {
            let id = add(engine, &mut w, next);
            next += 1;
            if next == 5 {
                // Aborted while still waiting.
                engine.abort(id).expect("live");
                w.aborted.push(id.0);
            }
            if next == 3 {
                running_victim = Some(id);
            }
        }
        if step == 12 {
            let id = running_victim.take().expect("added by now");
            engine.abort(id).expect("still running");
            w.aborted.push(id.0);
        }
        if next == 12 && !engine.has_unfinished() {
            break;
        }
        for e in engine.step().expect("the step runs") {
            if let EngineEvent::Token { seq_id, .. } = e {
                *w.outputs.entry(seq_id.0).or_default() += 1;
            }
        }
    }
    w
}

fn f(e: &Value, k: &str) -> f64 {
    e[k].as_f64().unwrap_or_else(|| panic!("{k} in {e}"))
}

#[test]
fn a_mixed_workload_writes_a_complete_ordered_trace() {
    let batches = Arc::new(Mutex::new(Vec::new()));
    let mut engine = engine(batches.clone());
    let w = run(&mut engine);
    let stats = engine.scheduler().stats();
    assert!(stats.num_preemptions > 0, "the workload preempts");
    assert!(
        stats.prefix_cache_hits > 0,
        "the workload hits the prefix cache"
    );
    let spec = engine.speculation().expect("on").stats();
    assert!(spec.num_accepted_tokens > 0, "drafts were accepted");
    let text = engine
        .trace()
        .expect("recording")
        .to_chrome_json()
        .to_string();
    let trace: Value = serde_json::from_str(&text).expect("the trace is JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let batches = batches.lock().expect("not poisoned").clone();
    check_steps(events, &batches);
    check_requests(events, &w);
}

fn check_steps(events: &[Value], batches: &[usize]) {
    let steps: Vec<&Value> = events.iter().filter(|e| e["cat"] == "step").collect();
    assert_eq!(
        steps.len(),
        batches.len(),
        "one step slice per forward pass"
    );
    let tokens: Vec<&Value> = events.iter().filter(|e| e["name"] == "tokens").collect();
    let parts: Vec<&Value> = events.iter().filter(|e| e["cat"] == "part").collect();
    let mut at = 0.0;
    for (i, s) in steps.iter().enumerate() {
        let (ts, dur) = (f(s, "ts"), f(s, "dur"));
        assert!(ts >= at, "step {i} starts before the previous one ends");
        at = ts + dur;
        let mine: Vec<&&Value> = parts.iter().filter(|p| f(p, "ts") >= ts).collect();
        let mut edge = ts;
        for p in mine.iter().take(3) {
            assert!((f(p, "ts") - edge).abs() < 1e-3, "parts tile step {i}");
            edge += f(p, "dur");
        }
        assert!(
            (edge - at).abs() < 1e-3,
            "step {i}: parts end with the step"
        );
        let c = &tokens[i]["args"];
        let used = (f(c, "prefill") + f(c, "decode")) as usize;
        assert_eq!(
            used, batches[i],
            "step {i}: tokens counted = tokens computed"
        );
        assert!(used <= BUDGET, "step {i} within the budget");
        assert_eq!(f(tokens[i], "ts"), ts);
    }
    let chunked = events
        .iter()
        .any(|e| e["name"] == "prefill" && e["args"]["tokens"].as_u64() == Some(BUDGET as u64));
    assert!(chunked, "some prompt was chunked at the budget");
    let verified = events
        .iter()
        .any(|e| e["name"] == "decode" && e["args"]["tokens"].as_u64() > Some(1));
    assert!(verified, "some decode step verified drafts");
}

fn check_requests(events: &[Value], w: &Workload) {
    let mut tracks: HashMap<u64, Vec<&Value>> = HashMap::new();
    for e in events.iter().filter(|e| e["pid"] == 2 && e["ph"] != "M") {
        let tid = e["tid"].as_u64().expect("tid");
        tracks.entry(tid - 1).or_default().push(e);
    }
    assert_eq!(tracks.len(), w.prompt_len.len(), "one track per request");
    for (id, track) in &tracks {
        let names: Vec<&str> = track
            .iter()
            .map(|e| e["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names[0], "arrived", "request {id}: {names:?}");
        let last = names[names.len() - 1];
        let aborted = w.aborted.contains(id);
        assert_eq!(
            last,
            if aborted { "aborted" } else { "finished" },
            "{id}: {names:?}"
        );
        let ends = names.iter().filter(|n| ["aborted", "finished"].contains(n));
        assert_eq!(ends.count(), 1, "request {id} ends once");
        // Waiting (after arrival or preemption) is always followed by a queued slice before
        // the next computed one.
        let mut waiting = true;
        let mut end = 0.0;
        let mut computed = 0;
        for (n, e) in names.iter().zip(track) {
            assert!(
                f(e, "ts") >= end,
                "request {id}: {n} overlaps what came before"
            );
            end = f(e, "ts") + e["dur"].as_f64().unwrap_or(0.0);
            match *n {
                "arrived" | "preempted" => waiting = true,
                "queued" => waiting = false,
                "prefill" | "decode" => {
                    assert!(!waiting, "request {id}: {n} while waiting: {names:?}");
                    computed += e["args"]["tokens"].as_u64().expect("tokens") as usize;
                }
                _ => {}
            }
        }
        if !aborted {
            let need = w.prompt_len[id] + w.outputs[id] - 1;
            assert!(
                computed >= need,
                "request {id}: {computed} tokens computed < {need}"
            );
            assert!(names.contains(&"decode"), "request {id} decoded");
        }
    }
    let preempted = tracks.values().flatten().any(|e| e["name"] == "preempted");
    assert!(preempted, "a preemption appears on a track");
}

#[test]
fn without_a_recorder_nothing_is_recorded() {
    let mut c = SchedulerConfig::new(BLOCKS, BLOCK, CONTEXT);
    c.max_num_batched_tokens = BUDGET;
    let runner = FakeRunner::new(VOCAB, CONTEXT, BLOCKS, BLOCK, 1);
    let mut engine = Engine::new(Box::new(runner), c, 3).expect("the pool matches");
    engine.add_request(request(1)).expect("valid");
    while engine.has_unfinished() {
        engine.step().expect("runs");
    }
    assert!(engine.trace().is_none());
}
