//! LoRA adapters against PEFT: each adapter in fixtures/lora (written by
//! scripts/make_lora_fixtures.py: random A and B on the HF fixtures, with per-module ranks and
//! alphas, rsLoRA, one layer only, Phi-3's fused projections, Gemma 3) must give the logits
//! transformers + PEFT gave, within 1e-3; Mixtral's adapter must also fit its GGUF conversion,
//! whose q and k rows llama.cpp permuted. In a batch, a sequence's logits do not depend on the
//! adapters of its neighbours (bitwise, under both the exact and the int8 kernels), and a
//! sequence without an adapter gets the base model's logits.

use std::path::{Path, PathBuf};

use tandem_kernels::Isa;
use tandem_model::batch::{AdapterId, BlockId, ForwardBatch, OutputSelection, SeqSpan, TokenId};
use tandem_model::kv_store::{KvDtype, KvStore};
use tandem_model::loader::{load_gguf_model, load_model};
use tandem_model::lora::{load_peft_adapter, LoraDtype};
use tandem_model::transformer::Model;
use tandem_model::ModelError;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// (input ids, reference logits) of the fixture in `dir`.
fn sequences(dir: &Path) -> Vec<(Vec<TokenId>, Vec<f32>)> {
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference.json");
    let r: serde_json::Value = serde_json::from_str(&text).expect("json");
    let seqs = r["sequences"].as_array().expect("sequences");
    seqs.iter()
        .map(|s| {
            let ids = s["input_ids"].as_array().expect("ids");
            let ids = ids.iter().map(|v| TokenId(v.as_u64().expect("id") as u32));
            let bytes = std::fs::read(dir.join(s["logits_file"].as_str().expect("file")));
            let logits = (bytes.expect("logits").chunks_exact(4))
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (ids.collect(), logits)
        })
        .collect()
}

fn hf_model(base: &str, isa: Isa) -> Model {
    let loaded = load_model(&fixtures().join("hf").join(base)).expect("base model");
    Model::with_kernels(loaded.host, 2, isa)
}

/// The model with the adapter of fixture `name` registered as adapter 0.
fn adapted(mut model: Model, name: &str) -> Model {
    let adapter = load_peft_adapter(&fixtures().join("lora").join(name), &model.config);
    let id = model.add_adapter(adapter.expect("adapter")).expect("add");
    assert_eq!(id, AdapterId(0));
    model
}

/// Logits of every position of each `(ids, adapter)` sequence, run together in one batch.
fn batch_logits(model: &mut Model, seqs: &[(&[TokenId], Option<AdapterId>)]) -> Vec<Vec<f32>> {
    let blocks: Vec<usize> = seqs.iter().map(|(ids, _)| ids.len().div_ceil(16)).collect();
    let kv = KvStore::with_dtype(&model.config, 16, blocks.iter().sum(), KvDtype::F32);
    let mut kv = kv.expect("kv");
    let (mut spans, mut tokens, mut next_block) = (Vec::new(), Vec::new(), 0u32);
    for (&(ids, adapter), &n) in seqs.iter().zip(&blocks) {
        spans.push(SeqSpan {
            start: tokens.len(),
            len: ids.len(),
            num_cached: 0,
            block_table: (next_block..next_block + n as u32).map(BlockId).collect(),
            adapter,
        });
        tokens.extend_from_slice(ids);
        next_block += n as u32;
    }
    let batch = ForwardBatch {
        tokens,
        seqs: spans.clone(),
        output: OutputSelection::All,
    };
    let logits = model.forward(&batch, &mut kv).expect("forward");
    let v = model.config.vocab_size;
    let all = logits.as_slice();
    spans
        .iter()
        .map(|s| all[s.start * v..(s.start + s.len) * v].to_vec())
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn assert_matches_peft(model: &mut Model, name: &str) {
    for (i, (ids, want)) in sequences(&fixtures().join("lora").join(name))
        .iter()
        .enumerate()
    {
        let got = batch_logits(model, &[(ids, Some(AdapterId(0)))]).remove(0);
        let diff = max_abs_diff(&got, want);
        eprintln!("{name} seq {i}: max |Δlogit| vs PEFT = {diff:.2e}");
        assert!(diff <= 1e-3, "{name} seq {i}: max |Δlogit| = {diff}");
    }
}

#[test]
fn adapters_match_peft() {
    for name in ["llama_tied", "qwen2", "qwen3", "gemma3", "phi3", "mixtral"] {
        let mut model = adapted(hf_model(name, Isa::best_exact()), name);
        assert_matches_peft(&mut model, name);
    }
}

#[test]
fn an_adapter_follows_the_gguf_permutation_of_q_and_k() {
    let path = fixtures().join("gguf_arch/mixtral.gguf");
    let model = Model::with_kernels(
        load_gguf_model(&path).expect("load").0,
        2,
        Isa::best_exact(),
    );
    let mut model = adapted(model, "mixtral");
    assert_matches_peft(&mut model, "mixtral");
}

/// Two adapters and the base model in one batch, in every order: each sequence's logits are
/// bitwise those it gets alone, and the base sequence's are the base model's (transformers'
/// reference within 1e-3).
#[test]
fn neighbours_with_other_adapters_change_nothing() {
    for isa in [Isa::best_exact(), Isa::best()] {
        let mut model = adapted(hf_model("llama_tied", isa), "llama_tied");
        let second = load_peft_adapter(&fixtures().join("lora/llama_tied"), &model.config);
        let mut second = second.expect("adapter");
        second.scale_all(-0.5);
        assert_eq!(model.add_adapter(second).expect("add"), AdapterId(1));
        let base = sequences(&fixtures().join("hf/llama_tied"));
        let (a, b) = (&base[0].0, &base[1].0);
        let runs = [
            (&a[..], Some(AdapterId(0))),
            (&b[..], None),
            (&a[..], Some(AdapterId(1))),
            (&b[..], Some(AdapterId(0))),
        ];
        let alone: Vec<Vec<f32>> = runs
            .iter()
            .map(|r| batch_logits(&mut model, &[*r]).remove(0))
            .collect();
        assert_ne!(alone[0], alone[2], "the two adapters differ");
        let diff = max_abs_diff(&alone[1], &base[1].1);
        assert!(
            diff <= 1e-3 || isa != Isa::best_exact(),
            "base rows: {diff}"
        );
        for order in [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2]] {
            let together = batch_logits(&mut model, &order.map(|i| runs[i]));
            for (k, &i) in order.iter().enumerate() {
                assert!(
                    together[k] == alone[i],
                    "{isa}: run {i} changed in order {order:?}"
                );
            }
        }
    }
}

fn load_error(name: &str, base: &str) -> String {
    let model = hf_model(base, Isa::best_exact());
    match load_peft_adapter(&fixtures().join("lora").join(name), &model.config) {
        Err(e @ ModelError::Adapter { .. }) => e.to_string(),
        other => panic!("{name} on {base}: expected an adapter error, got {other:?}"),
    }
}

#[test]
fn an_adapter_for_another_model_is_refused() {
    // llama_tied's adapter targets the MLP, which is a mixture of experts in Mixtral.
    let e = load_error("llama_tied", "mixtral");
    assert!(
        e.contains("gate_proj") || e.contains("up_proj") || e.contains("down_proj"),
        "{e}"
    );
    // Qwen3's q projection is 128 wide (4 heads of 32), Llama's 64.
    let e = load_error("qwen3", "llama_tied");
    assert!(e.contains("expected A r x"), "{e}");
}

/// A copy of adapter fixture `name` whose `adapter_config.json` has `key` set to `value`.
fn with_setting(name: &str, key: &str, value: serde_json::Value) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tandem-lora-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let from = fixtures().join("lora").join(name);
    std::fs::copy(
        from.join("adapter_model.safetensors"),
        dir.join("adapter_model.safetensors"),
    )
    .expect("copy");
    let text = std::fs::read_to_string(from.join("adapter_config.json")).expect("config");
    let mut cfg: serde_json::Value = serde_json::from_str(&text).expect("json");
    cfg[key] = value;
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).expect("write");
    dir
}

#[test]
fn settings_tandem_does_not_implement_are_refused_by_name() {
    use serde_json::json;
    let model = hf_model("llama_tied", Isa::best_exact());
    let cases = [
        ("use_dora", json!(true), "use_dora"),
        ("bias", json!("all"), "bias"),
        ("modules_to_save", json!(["lm_head"]), "modules_to_save"),
        ("fan_in_fan_out", json!(true), "fan_in_fan_out"),
        ("peft_type", json!("IA3"), "IA3"),
        ("r", json!(8), "rank 4, the config says 8"),
        ("r", json!(0), "`r`"),
        ("lora_alpha", json!("big"), "lora_alpha"),
        (
            "rank_pattern",
            json!({"down_proj": "two"}),
            "rank_pattern.down_proj",
        ),
        ("use_rslora", json!("true"), "use_rslora"),
        (
            "alora_invocation_tokens",
            json!([1, 2]),
            "alora_invocation_tokens",
        ),
        ("a_future_setting", json!({"on": true}), "a_future_setting"),
        (
            "init_lora_weights",
            json!("pissa_niter_4"),
            "residual base model",
        ),
        (
            "target_modules",
            json!(["q_proj", "k_proj"]),
            "leave its module out",
        ),
        ("layers_to_transform", json!([1]), "leave its module out"),
        (
            "exclude_modules",
            json!("model\\.layers\\.0\\..*"),
            "leave its module out",
        ),
        ("lora_alpha", json!(1e300), "not a scale"),
    ];
    for (key, value, needle) in cases {
        let dir = with_setting("llama_tied", key, value.clone());
        let e = load_peft_adapter(&dir, &model.config)
            .expect_err(key)
            .to_string();
        assert!(e.contains(needle), "{key} = {value}: {e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn a_batch_naming_an_unregistered_adapter_is_refused() {
    let mut model = hf_model("llama_tied", Isa::best_exact());
    let mut kv = KvStore::with_dtype(&model.config, 16, 1, KvDtype::F32).expect("kv");
    let mut batch =
        ForwardBatch::single(vec![TokenId(1)], 0, vec![BlockId(0)], OutputSelection::All);
    batch.seqs[0].adapter = Some(AdapterId(0));
    let e = model
        .forward(&batch, &mut kv)
        .expect_err("no adapter is registered");
    assert!(matches!(e, ModelError::Batch(_)), "{e}");
}

/// PEFT's reading of the settings, checked against PEFT's own logits: `lora_alpha` defaults to
/// 8 (the fixture's value), and pattern keys are regexes matched against the end of a
/// module's name (so `(o)_proj` is the fixture's `o_proj`, and a key naming layer 0's module
/// leaves layer 1's at the default alpha, which changes the logits).
#[test]
fn settings_are_read_as_peft_reads_them() {
    use serde_json::json;
    let same = [
        ("lora_alpha", json!(null)),
        ("alpha_pattern", json!({"(o)_proj": 3})),
        (
            "target_modules",
            json!("model\\.layers\\.\\d+\\.(self_attn|mlp)\\.[a-z_]+"),
        ),
        ("target_modules", json!("all-linear")),
        ("layers_to_transform", json!([0, 1])),
        ("layers_to_transform", json!([])),
        // The first matching key wins, in the file's order (not sorted: `l` < `o`).
        (
            "alpha_pattern",
            json!({"o_proj": 3, "layers\\.0\\.self_attn\\.o_proj": 99}),
        ),
    ];
    for (key, value) in same {
        let dir = with_setting("llama_tied", key, value.clone());
        let mut model = hf_model("llama_tied", Isa::best_exact());
        let adapter =
            load_peft_adapter(&dir, &model.config).unwrap_or_else(|e| panic!("{key}: {e}"));
        model.add_adapter(adapter).expect("add");
        assert_matches_peft(&mut model, "llama_tied");
        std::fs::remove_dir_all(&dir).ok();
    }
    let dir = with_setting(
        "llama_tied",
        "alpha_pattern",
        json!({"layers\\.0\\.self_attn\\.o_proj": 3}),
    );
    let mut model = hf_model("llama_tied", Isa::best_exact());
    model
        .add_adapter(load_peft_adapter(&dir, &model.config).expect("loads"))
        .expect("add");
    let (ids, want) = &sequences(&fixtures().join("lora/llama_tied"))[0];
    let got = batch_logits(&mut model, &[(ids, Some(AdapterId(0)))]).remove(0);
    assert!(
        max_abs_diff(&got, want) > 1e-2,
        "layer 1's o_proj has the default alpha now"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `LoraDtype::Bf16` (vLLM's `--lora-dtype bfloat16`) rounds the matrices once: the logits
/// move off PEFT's f32 ones, but by a small fraction of what the adapter changes, and a
/// sequence's logits stay bitwise its own whatever runs beside it.
#[test]
fn bf16_adapters_round_once_and_stay_close_to_peft() {
    for name in ["llama_tied", "qwen2", "phi3"] {
        let mut model = hf_model(name, Isa::best_exact());
        let dir = fixtures().join("lora").join(name);
        let f32_adapter = load_peft_adapter(&dir, &model.config).expect("adapter");
        let bf16 = f32_adapter.clone().with_dtype(LoraDtype::Bf16);
        assert!(bf16.bytes() < f32_adapter.bytes(), "{name}: fewer bytes");
        assert_ne!(bf16.digest(), f32_adapter.digest());
        assert_eq!(model.add_adapter(f32_adapter).expect("add"), AdapterId(0));
        assert_eq!(model.add_adapter(bf16).expect("add"), AdapterId(1));
        for (ids, want) in sequences(&dir) {
            let base = batch_logits(&mut model, &[(&ids, None)]).remove(0);
            let exact = batch_logits(&mut model, &[(&ids, Some(AdapterId(0)))]).remove(0);
            let rounded = batch_logits(&mut model, &[(&ids, Some(AdapterId(1)))]).remove(0);
            let (effect, error) = (max_abs_diff(&base, &want), max_abs_diff(&rounded, &want));
            eprintln!("{name}: adapter effect {effect:.2e}, bf16 error {error:.2e}");
            assert!(exact != rounded, "{name}: bf16 rounds");
            assert!(
                error <= 0.05 * effect,
                "{name}: bf16 error {error} of {effect}"
            );
            let together = batch_logits(&mut model, &[(&ids, None), (&ids, Some(AdapterId(1)))]);
            assert!(
                together[1] == rounded,
                "{name}: a neighbour changed a bf16 row"
            );
        }
    }
}
