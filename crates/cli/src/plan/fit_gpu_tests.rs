//! The GPU fit on synthetic measurements: step times that a known profile's roofline gives
//! for the steps `--calibrate --device cuda` times; the fit must recover the profile.

use super::*;
use crate::plan::calibrate_gpu::{
    DECODE_BATCHES, KV_BATCH, KV_LONG, PREFILL_CHUNKS, SHORT, SPLIT, STEPS,
};
use crate::plan::hardware::{builtin, DeviceKind};
use crate::plan::step_times::{decode_work, prefill_work};

/// Llama-3.2-1B's shapes (16 layers, 2048 wide, 8 KV heads of 64, 8192-wide FFN, tied
/// 128256-token vocabulary).
fn llama_1b() -> ModelShape {
    let (h, kv, ff, layers, vocab) = (2048, 512, 8192, 16, 128_256);
    let layer = h * (2 * h + 2 * kv) + 3 * h * ff;
    let bytes = ((layers * layer + vocab * h) * 2) as f64;
    ModelShape {
        num_layers: layers,
        windows: vec![None; layers],
        hidden_size: h,
        num_heads: 32,
        head_dim: 64,
        kv_dim: kv,
        vocab_size: vocab,
        context_len: 131_072,
        layer_params: layers * layer,
        lm_head_params: vocab * h,
        expert_params: 0,
        expert_stored_bytes: 0.0,
        experts: 0,
        experts_picked: 0,
        stored_bytes: bytes,
        stored_bytes_per_step: bytes,
    }
}

/// A GPU unlike its datasheet: less bandwidth, lower product rates (compute-bound from 256
/// tokens per product on this model), its own overheads and attention rates.
fn known() -> HardwareProfile {
    let point = |tokens, flops| RatePoint { tokens, flops };
    HardwareProfile {
        name: "known".into(),
        kind: DeviceKind::Gpu,
        source: "test".into(),
        threads: 1,
        bandwidth: 3.9e12,
        matmul: vec![
            point(1, 1.2e13),
            point(4, 4.8e13),
            point(16, 1.9e14),
            point(64, 4.5e14),
            point(256, 5.5e14),
            point(1024, 6.0e14),
            point(4096, 6.2e14),
        ],
        attention_flops: 4e13,
        prefill_attention_flops: 8e13,
        step_overhead_s: 2.5e-4,
        layer_overhead_s: 1.5e-5,
        memory_bytes: 141e9,
    }
}

/// The steps `--calibrate --device cuda` times (on a model of 4096 tokens or more), as `hw`
/// runs them.
fn synthetic(hw: &HardwareProfile, shape: &ModelShape) -> GpuSteps {
    let r = Roofline {
        shape,
        hw,
        kv_dtype: KvDtype::F16,
    };
    let timed = |work: Vec<SeqWork>| TimedStep {
        secs: r.step(&work).time_s,
        work,
    };
    let mut products: Vec<TimedStep> = DECODE_BATCHES
        .iter()
        .map(|&b| timed(decode_work(b, SHORT, STEPS)))
        .collect();
    products.extend(PREFILL_CHUNKS.iter().map(|&n| timed(prefill_work(1, n))));
    let long = PREFILL_CHUNKS[2];
    GpuSteps {
        decode_one: timed(decode_work(1, SHORT, STEPS)),
        kv_short: timed(decode_work(KV_BATCH, SHORT, STEPS)),
        kv_long: timed(decode_work(KV_BATCH, KV_LONG, STEPS)),
        prefill_long: timed(prefill_work(1, long)),
        prefill_split: timed(prefill_work(long / SPLIT, SPLIT)),
        products,
        host_s: Some(hw.step_overhead_s),
    }
}

fn close(got: f64, want: f64, rel: f64) -> bool {
    (got / want - 1.0).abs() <= rel
}

/// Every measured step, as the fitted profile predicts it, within `rel`.
fn assert_reproduces(fitted: &HardwareProfile, shape: &ModelShape, m: &GpuSteps, rel: f64) {
    let r = Roofline {
        shape,
        hw: fitted,
        kv_dtype: KvDtype::F16,
    };
    let all = [
        &m.decode_one,
        &m.kv_short,
        &m.kv_long,
        &m.prefill_long,
        &m.prefill_split,
    ];
    for s in all.into_iter().chain(&m.products) {
        let t = r.step(&s.work).time_s;
        assert!(
            close(t, s.secs, rel),
            "{} tokens: predicted {t}, measured {}",
            s.tokens(),
            s.secs
        );
    }
}

#[test]
fn the_fit_recovers_the_profile_that_produced_the_step_times() {
    let (shape, want) = (llama_1b(), known());
    let m = synthetic(&want, &shape);
    let base = builtin("h200").expect("built in");
    let fitted = fit(&base, &shape, KvDtype::F16, &m);
    let got = &fitted.profile;
    assert!(fitted.notes.is_empty(), "{:?}", fitted.notes);
    assert!(
        close(got.bandwidth, want.bandwidth, 1e-3),
        "{}",
        got.bandwidth
    );
    assert!(close(got.step_overhead_s, want.step_overhead_s, 1e-3));
    assert!(close(got.layer_overhead_s, want.layer_overhead_s, 1e-2));
    assert!(close(
        got.prefill_attention_flops,
        want.prefill_attention_flops,
        1e-2
    ));
    // Where the products are compute-bound, their rate; elsewhere the datasheet's (at most
    // the rate of more tokens per product).
    let tokens: Vec<usize> = got.matmul.iter().map(|p| p.tokens).collect();
    assert_eq!(tokens, [1, 4, 16, 64, 256, 1024, 4096]);
    for n in [256.0, 1024.0, 4096.0] {
        let (g, w) = (got.matmul_flops(n), want.matmul_flops(n));
        assert!(close(g, w, 1e-2), "{n} tokens: {g} vs {w}");
    }
    assert_eq!(got.matmul_flops(1.0), base.matmul_flops(1.0));
    assert!(got.matmul.windows(2).all(|w| w[0].flops <= w[1].flops));
    got.check().expect("a valid profile");
    assert_reproduces(got, &shape, &m, 1e-3);
    // Unmeasured host part: the datasheet's per-step overhead, the rest per layer.
    let no_host = GpuSteps {
        host_s: None,
        ..m.clone()
    };
    let fit = fit_gpu_notes(&base, &shape, &no_host);
    assert!(close(fit.profile.overhead_s(16), want.overhead_s(16), 1e-3));
    assert_eq!(fit.profile.step_overhead_s, base.step_overhead_s);
    assert_eq!(fit.notes.len(), 1, "{:?}", fit.notes);
}

fn fit_gpu_notes(base: &HardwareProfile, shape: &ModelShape, m: &GpuSteps) -> GpuFit {
    fit(base, shape, KvDtype::F16, m)
}

#[test]
fn slow_attention_is_fitted_as_an_attention_rate_not_as_bandwidth() {
    // Decode attention slower than reading its K/V: the steps at a long context show the
    // attention rate, and the bandwidth comes from the one-sequence steps.
    let shape = llama_1b();
    let want = HardwareProfile {
        attention_flops: 4e12,
        ..known()
    };
    let m = synthetic(&want, &shape);
    let fitted = fit(
        &builtin("h200").expect("built in"),
        &shape,
        KvDtype::F16,
        &m,
    );
    assert_eq!(fitted.notes.len(), 1, "{:?}", fitted.notes);
    assert!(fitted.notes[0].contains("attention"), "{:?}", fitted.notes);
    assert!(close(fitted.profile.attention_flops, 4e12, 1e-2));
    assert_reproduces(&fitted.profile, &shape, &m, 1e-2);
}
