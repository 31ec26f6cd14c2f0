//! `GET /metrics` over real HTTP: Prometheus text with vLLM's names, counters that move by
//! exactly what the requests did, gauges back to zero when idle, and the API key.

mod server_common;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use server_common::*;

/// Parses the exposition into `series (name{labels}) -> value`, checking every sample line
/// has a `# TYPE` declared for its metric family before it.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut typed = Vec::new();
    let mut out = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.push(rest.split(' ').next().expect("name").to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample line has a value");
        let name = series.split('{').next().expect("name");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| typed.iter().any(|t| t == f))
            .unwrap_or(name);
        assert!(typed.iter().any(|t| t == family), "undeclared {name}");
        out.insert(series.to_string(), value.parse().expect("numeric value"));
    }
    out
}

fn metrics(addr: std::net::SocketAddr) -> HashMap<String, f64> {
    let r = get(addr, "/metrics");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r
        .header("content-type")
        .is_some_and(|v| v.starts_with("text/plain")));
    assert!(
        !r.body.contains("lora_requests_info"),
        "no adapters, no LoRA gauge"
    );
    parse(&r.body)
}

fn value(m: &HashMap<String, f64>, series: &str) -> f64 {
    *m.get(series)
        .unwrap_or_else(|| panic!("missing series {series}"))
}

#[test]
fn counters_move_by_what_the_requests_did_and_gauges_return_to_zero() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let l = "model_name=\"test-model\"";
    let before = metrics(addr);
    assert_eq!(
        value(&before, &format!("vllm:generation_tokens_total{{{l}}}")),
        0.0
    );

    // Two greedy completions of 5 tokens each (ignore_eos) and one of 3 with n = 2.
    let prompt: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7];
    for max_tokens in [5, 5] {
        let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                          "ignore_eos": true});
        let r = post(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let body = json!({"prompt": prompt, "max_tokens": 3, "n": 2, "temperature": 1.0,
                      "seed": 7, "ignore_eos": true});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    wait_health(addr, Duration::from_secs(10), idle);

    let m = metrics(addr);
    assert_eq!(
        value(&m, &format!("vllm:generation_tokens_total{{{l}}}")),
        16.0
    );
    // A prompt shared by n samples is one prompt's worth of tokens.
    assert_eq!(
        value(&m, &format!("vllm:prompt_tokens_total{{{l}}}")),
        3.0 * prompt.len() as f64
    );
    assert_eq!(
        value(
            &m,
            &format!("vllm:request_success_total{{{l},finished_reason=\"length\"}}")
        ),
        4.0
    );
    // Every request had a first token; 16 tokens over 4 requests leave 12 gaps.
    let ttft = value(
        &m,
        &format!("vllm:time_to_first_token_seconds_count{{{l}}}"),
    );
    assert_eq!(ttft, 4.0);
    assert_eq!(
        value(
            &m,
            &format!("vllm:inter_token_latency_seconds_count{{{l}}}")
        ),
        12.0
    );
    assert_eq!(
        value(
            &m,
            &format!("vllm:e2e_request_latency_seconds_count{{{l}}}")
        ),
        4.0
    );
    assert_eq!(
        value(
            &m,
            &format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"+Inf\"}}")
        ),
        4.0
    );
    // Queue time is per prompt: three requests of one prompt each.
    assert_eq!(
        value(&m, &format!("vllm:request_queue_time_seconds_count{{{l}}}")),
        3.0
    );
    let e2e_sum = value(&m, &format!("vllm:e2e_request_latency_seconds_sum{{{l}}}"));
    let queue_sum = value(&m, &format!("vllm:request_queue_time_seconds_sum{{{l}}}"));
    assert!(
        queue_sum >= 0.0 && queue_sum <= e2e_sum,
        "queue {queue_sum} e2e {e2e_sum}"
    );
    for gauge in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "tandem:kv_blocks_in_use",
    ] {
        assert_eq!(value(&m, &format!("{gauge}{{{l}}}")), 0.0, "{gauge}");
    }
    assert!(m.contains_key(&format!("vllm:num_preemptions_total{{{l}}}")));
    assert!(m.contains_key(&format!("vllm:spec_decode_num_draft_tokens_total{{{l}}}")));
}

#[test]
fn metrics_need_the_api_key_with_metrics_require_key() {
    let server = start_server(&fixture_path(), |c| {
        c.api_key = Some("k3y".into());
        c.metrics_require_key = true;
    });
    let r = get(server.addr(), "/metrics");
    assert_eq!(r.status, 401, "{}", r.body);
    let r = request(
        server.addr(),
        "GET",
        "/metrics",
        &[("authorization", "Bearer k3y")],
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("vllm:num_requests_running"));
}
