//! The plan as text for people: a summary of the KV cache, the workload (at a request rate,
//! its steady state), prefix hits, speculation and the crossover, then tables by batch size,
//! context and length.

use std::fmt::Write as _;

use super::rate::{req_per_s, RateReport};
use super::report::Plan;

fn mb(b: f64) -> String {
    format!("{:.1} MB", b / 1e6)
}

impl Plan {
    /// The report for people.
    pub fn text(&self) -> String {
        self.summary() + &self.tables()
    }

    /// The KV cache, the workload's costs and what caching and speculation save.
    fn summary(&self) -> String {
        let mut o = String::new();
        let s = &self.shape;
        let h = &self.hardware;
        let _ = writeln!(
            o,
            "model     {}: {} layers, hidden {}, {} heads of {}, KV width {}; weights {} ({} read per step)",
            self.model, s.num_layers, s.hidden_size, s.num_heads, s.head_dim, s.kv_dim,
            mb(s.resident_weight_bytes(h.bytes_per_weight())), mb(self.weight_bytes_per_step)
        );
        let rates: Vec<String> = h
            .matmul
            .iter()
            .map(|p| format!("{}:{:.0}", p.tokens, p.flops / 1e9))
            .collect();
        let _ = writeln!(
            o,
            "hardware  {} ({}): {:.1} GB/s, matmul GFLOP/s by tokens [{}], attention {:.0} GFLOP/s, overhead {:.2} ms/step",
            h.name, h.source, h.bandwidth / 1e9, rates.join(" "), h.attention_flops / 1e9,
            h.overhead_s(s.num_layers) * 1e3
        );
        let c = &self.capacity;
        let _ =
            writeln!(
            o,
            "KV cache  {}: {} B per token (K+V), {} B per slot; {} -> {} blocks x {} = {} tokens",
            c.kv_dtype, c.kv_bytes_per_token, c.slot_bytes, mb(c.budget_bytes as f64),
            c.num_blocks, c.block_size, c.capacity_tokens
        );
        let preempt = c
            .preemption_from
            .map_or("never (the sequence cap binds first)".into(), |n| {
                format!("from {n} requests")
            });
        let _ = writeln!(
            o,
            "          the longest request ({}+{} tokens) holds {} blocks ({}); {} fit at once; preemption {preempt}",
            self.prompt_lens.iter().max().unwrap_or(&self.prompt_len),
            self.gen_lens.iter().max().unwrap_or(&self.gen_len),
            c.blocks_per_request, mb(c.bytes_per_request as f64),
            c.max_concurrent_requests
        );
        let w = &self.workload;
        let d = &w.decode_step;
        let _ = writeln!(
            o,
            "workload  {} requests of {:?}+{:?} tokens: TTFT {:.1} ms (longest prompt {:.1}), ITL {:.2} ms, {:.1} output tok/s",
            self.concurrency, self.prompt_lens, self.gen_lens, w.ttft_ms, w.ttft_ms_max, w.itl_ms,
            w.output_tok_per_s
        );
        let _ = writeln!(
            o,
            "          decode step: weights {}, KV {}, {:.2} GFLOP -> {:.2} ms ({})",
            mb(d.weight_bytes),
            mb(d.kv_bytes),
            d.flops / 1e9,
            d.time_s * 1e3,
            if d.compute_bound {
                "compute-bound"
            } else {
                "bandwidth-bound"
            }
        );
        let p = &w.prefill_chunk;
        let _ = writeln!(
            o,
            "          first prefill step: {} tokens, {:.2} GFLOP -> {:.2} ms ({})",
            p.tokens,
            p.flops / 1e9,
            p.time_s * 1e3,
            if p.compute_bound {
                "compute-bound"
            } else {
                "bandwidth-bound"
            }
        );
        if let Some(rate) = &self.rate {
            o.push_str(&rate.text());
        }
        let hit = &self.workload_with_prefix_hit;
        let _ = writeln!(
            o,
            "prefix    {:.0}% of each prompt cached: TTFT {:.1} -> {:.1} ms, {:.1} -> {:.1} tok/s",
            self.prefix_hit * 100.0,
            w.ttft_ms,
            hit.ttft_ms,
            w.output_tok_per_s,
            hit.output_tok_per_s
        );
        let _ = writeln!(
            o,
            "speculate n-gram, {} drafts accepted at {:.0}%: decode x{:.2} alone, x{:.2} at {} requests",
            self.num_speculative_tokens, self.acceptance * 100.0, self.speculation_speedup.0,
            self.speculation_speedup.1, self.concurrency
        );
        let cross = self
            .crossover_batch
            .map_or("beyond 4096".into(), |b| b.to_string());
        let _ = writeln!(o, "crossover decode turns compute-bound at batch {cross}");
        o
    }

    /// The tables by batch size, context and length, and the validation when it ran.
    fn tables(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "\nbatch  decode ms/step  decode tok/s  prefill tok/s  (context {})",
            self.prompt_len + self.gen_len / 2
        );
        for (d, p) in self.decode_by_batch.iter().zip(&self.prefill_by_batch) {
            let _ = writeln!(
                o,
                "{:>5}  {:>14.2}  {:>12.1}  {:>13.1}  {}",
                d.batch,
                d.step_ms,
                d.tok_per_s,
                p.tok_per_s,
                if d.compute_bound {
                    "compute"
                } else {
                    "bandwidth"
                }
            );
        }
        let _ = writeln!(
            o,
            "\ncontext  decode ms/step at batch {}",
            self.workload_batch()
        );
        for d in &self.decode_by_context {
            let _ = writeln!(o, "{:>7}  {:>8.2}", d.context, d.step_ms);
        }
        let _ = writeln!(o, "\ntokens  score ms  generate ms  generate/score");
        for g in &self.score_vs_generate {
            let _ = writeln!(
                o,
                "{:>6}  {:>8.1}  {:>11.1}  {:>14.1}",
                g.tokens, g.score_ms, g.generate_ms, g.ratio
            );
        }
        if let Some(v) = &self.validation {
            o.push_str(&v.text());
        }
        o
    }

    fn workload_batch(&self) -> usize {
        self.decode_by_context.first().map_or(1, |c| c.batch)
    }
}

impl RateReport {
    /// The report's lines for people.
    pub fn text(&self) -> String {
        let s = &self.saturation;
        let most = format!(
            "{} ({:.1} output tok/s, decode batch {:.1}, limited by the {})",
            req_per_s(s.request_rate),
            s.output_tok_per_s,
            s.decode_batch,
            s.limited_by
        );
        let Some(st) = &self.steady else {
            return format!(
                "rate      {} (Poisson) is more than the engine sustains: the queue grows \
                 without bound: at most {most}\n",
                req_per_s(self.request_rate)
            );
        };
        let mut o = format!(
            "rate      {} (Poisson), {:.0}% of the most the engine sustains: {most}\n",
            req_per_s(self.request_rate),
            self.utilisation * 100.0
        );
        o += &format!(
            "          steady state: {:.2} requests in the engine, decode steps of {:.1} sequences, \
             {:.0} prefill tokens/step ({:.0}% of the budget's room), busy {:.0}%\n",
            st.concurrency,
            st.decode_batch,
            st.prefill_tokens_per_step,
            st.prefill_utilisation * 100.0,
            st.busy * 100.0
        );
        o += &format!(
            "          TTFT {:.1} ms (queued {:.1}, longest prompt {:.1}), ITL {:.2} ms, {:.3} s per \
             request, {:.1} output tok/s\n",
            st.ttft_ms,
            st.queue_ms,
            st.ttft_ms_max,
            st.itl_ms,
            st.latency_ms / 1e3,
            st.output_tok_per_s
        );
        o += &format!(
            "          KV in use {:.0} of {} tokens ({:.1} MB); chance of preemption {:.2}%\n",
            st.kv_tokens_in_use,
            st.kv_capacity_tokens,
            st.kv_bytes_in_use / 1e6,
            st.preemption_risk * 100.0
        );
        if st.preemption {
            o += "          WARNING: the steady state needs more KV than the pool holds: requests \
                  will be preempted\n";
        }
        o
    }
}
