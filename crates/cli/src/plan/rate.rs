//! `tandem plan --request-rate R`: the steady state of an open workload, requests arriving as
//! a Poisson process at `R` per second, on the step cost of [`super::cost`].
//!
//! The engine is seen one mean step at a time. With `x = R T` requests arriving per step of
//! `T` seconds, each needing `g = mean output - 1` decode steps and `P` new prompt tokens,
//! a step carries on average `b = x g` decodes (Little's law over the decode phase) and
//! `p = x P` prefill tokens, in the `room = budget - b` the decodes leave. A decoding
//! request sees its own decode beside the others (`1 + b` sequences at the context decodes
//! hold on average, interpolated between whole batches) and the prefill of a Poisson number
//! of prompts, at most `room` tokens (the mean number such that `p` go in on average; the
//! prompts as long as the one a prefill token belongs to, `E[P^2] / E[P]`). `T(x)` is
//! [`Roofline::step`]'s mean over those steps; the operating point solves `x / T(x) = R` by
//! bisection on `x`. The highest `x / T(x)` before the prefill fills the room or the decodes
//! fill the KV pool (or the sequence cap) is the saturation rate: above it the queue grows
//! without bound.
//!
//! Time to first token: the rest of the step running when the request arrives (while the
//! engine is busy; `E[T^2] / 2E[T]`), the wait in the prefill lane (M/G/1,
//! Pollaczek-Khinchine: `room` tokens per full step), the prompt's own chunks beside `b`
//! decodes ([`report::time_to_first_token`]) and the other prompts that came in the same step.
//! A request's time in the engine is its TTFT plus `g` steps; the mean number of requests in
//! the engine is `R` times that (Little's law). `rate_sim.rs` holds this to an event
//! simulation of the scheduler on the same step cost: within a few percent up to 60% of the
//! saturation rate, and near it for one length of prompt and output; prompts longer than the
//! token budget come out about a tenth optimistic from mid load, lengths that vary widely up
//! to a quarter pessimistic near saturation, and a CPU (a prefill step costs a dozen decode
//! steps, long steps gather arrivals that make the next steps long too) optimistic by up to
//! half near saturation.

use serde::Serialize;

use super::cost::{Roofline, SeqWork};
use super::report::{time_to_first_token, Capacity};
use super::PlanInputs;

/// Points of the scan for the saturation rate (and the bracket of the operating point).
const SCAN: usize = 256;
/// Bisection steps for the operating point and the peak.
const BISECT: usize = 100;

/// The steady state at a request rate, and the highest rate the engine sustains.
#[derive(Debug, Clone, Serialize)]
pub struct RateReport {
    /// Requests per second, arriving as a Poisson process.
    pub request_rate: f64,
    /// False when the rate exceeds `saturation.request_rate`: the queue grows without bound.
    pub stable: bool,
    /// `request_rate / saturation.request_rate`.
    pub utilisation: f64,
    pub saturation: Saturation,
    /// The operating point (absent when not stable).
    pub steady: Option<SteadyState>,
}

/// The highest sustainable request rate for this workload on this hardware.
#[derive(Debug, Clone, Serialize)]
pub struct Saturation {
    pub request_rate: f64,
    /// `request_rate x` the mean output length.
    pub output_tok_per_s: f64,
    /// Sequences in each decode step there.
    pub decode_batch: f64,
    pub step_ms: f64,
    /// What stops a higher rate: "token budget" (decodes and prefill fill
    /// --max-num-batched-tokens), "KV cache" (the decodes fill the pool), "sequence cap"
    /// (--max-num-seqs) or "step time" (the throughput peaks before either).
    pub limited_by: String,
}

/// The engine at the operating point (means over time and over the workload's lengths).
#[derive(Debug, Clone, Serialize)]
pub struct SteadyState {
    /// Requests in the engine, waiting for prefill included (rate x latency).
    pub concurrency: f64,
    /// Sequences in the decode step a decoding request sees (itself included).
    pub decode_batch: f64,
    /// Prefill tokens per step, and the share of the budget's room for prefill they use.
    pub prefill_tokens_per_step: f64,
    pub prefill_utilisation: f64,
    /// Share of the time the engine is running a step (1 - e^-concurrency, as for Poisson
    /// arrivals to a batch that grows with them).
    pub busy: f64,
    /// Time to first token, mean and for the longest prompt; its part spent queued.
    pub ttft_ms: f64,
    pub ttft_ms_max: f64,
    pub queue_ms: f64,
    /// Mean decode step (inter-token latency).
    pub itl_ms: f64,
    /// Mean time a request spends in the engine.
    pub latency_ms: f64,
    /// `request_rate x` the mean output length.
    pub output_tok_per_s: f64,
    /// KV pool in use (tokens and bytes) against its capacity.
    pub kv_tokens_in_use: f64,
    pub kv_bytes_in_use: f64,
    pub kv_capacity_tokens: usize,
    /// True when the mean KV in use exceeds the pool: requests will be preempted.
    pub preemption: bool,
    /// Chance that more requests hold KV than the pool fits at once (their number taken as
    /// Poisson around its mean); 0 when the sequence cap binds first.
    pub preemption_risk: f64,
}

impl RateReport {
    /// The steady state of `i`'s workload arriving at `rate` requests per second.
    pub fn solve(i: &PlanInputs, capacity: &Capacity, rate: f64) -> RateReport {
        let r = Roofline {
            shape: &i.shape,
            hw: &i.hw,
            kv_dtype: i.kv_dtype,
        };
        let m = Lane::new(&r, i, capacity);
        let (x_peak, limited_by) = m.peak();
        let t_peak = m.step_s(x_peak);
        let sat_rate = x_peak / t_peak;
        let saturation = Saturation {
            request_rate: sat_rate,
            output_tok_per_s: sat_rate * m.mean_gen,
            decode_batch: 1.0 + x_peak * m.gen_left,
            step_ms: t_peak * 1e3,
            limited_by: limited_by.into(),
        };
        let stable = rate < sat_rate;
        RateReport {
            request_rate: rate,
            stable,
            utilisation: rate / sat_rate,
            saturation,
            steady: stable.then(|| m.steady(rate, m.operating_point(rate, x_peak))),
        }
    }

    /// Requests running at once for the rest of the plan: the mean in the engine, or the
    /// most the pool holds when the rate is not sustainable.
    pub fn concurrency(&self, capacity: &Capacity) -> usize {
        match &self.steady {
            Some(s) => (s.concurrency.round() as usize).max(1),
            None => capacity.max_concurrent_requests.max(1),
        }
    }
}

/// Requests per second for people: two decimals, or three significant digits below 0.01.
pub fn req_per_s(rate: f64) -> String {
    if rate >= 0.01 {
        format!("{rate:.2} req/s")
    } else {
        format!("{rate:.2e} req/s")
    }
}

/// The workload's means and the engine's limits, with the cost model.
struct Lane<'a> {
    r: &'a Roofline<'a>,
    i: &'a PlanInputs,
    capacity: &'a Capacity,
    /// Context of the decoding sequences (see [`decode_context`]).
    mean_ctx: f64,
    /// Mean prompt tokens computed (not found in the prefix cache), and cached.
    prompt_new: f64,
    prompt_cached: f64,
    /// The prompt a prefill token belongs to, on average (`E[P^2] / E[P]` of the computed
    /// tokens): the length of the prompts that make up a step's prefill.
    piece: f64,
    mean_prompt: f64,
    mean_gen: f64,
    /// Decode steps per request: mean output - 1 (the first token comes with the prefill).
    gen_left: f64,
    budget: f64,
}

impl<'a> Lane<'a> {
    fn new(r: &'a Roofline<'a>, i: &'a PlanInputs, capacity: &'a Capacity) -> Lane<'a> {
        let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len().max(1) as f64;
        let cached: Vec<usize> = i
            .prompt_lens
            .iter()
            .map(|&p| cached_tokens(p, i.prefix_hit))
            .collect();
        let computed: Vec<usize> = i
            .prompt_lens
            .iter()
            .zip(&cached)
            .map(|(p, c)| p - c)
            .collect();
        let squares: Vec<usize> = computed.iter().map(|n| n * n).collect();
        let mean_prompt = mean(&i.prompt_lens);
        let mean_gen = mean(&i.gen_lens);
        Lane {
            r,
            i,
            capacity,
            mean_ctx: decode_context(i),
            prompt_new: mean_prompt - mean(&cached),
            prompt_cached: mean(&cached),
            piece: mean(&squares) / mean(&computed),
            mean_prompt,
            mean_gen,
            gen_left: (mean_gen - 1.0).max(0.0),
            budget: i.max_num_batched_tokens as f64,
        }
    }

    /// The budget's room for prefill beside the mean decodes at `x` arrivals per step.
    fn room(&self, x: f64) -> f64 {
        (self.budget - x * self.gen_left).max(1.0)
    }

    /// Mean seconds of a step at `x` arrivals per step, as a decoding request sees it.
    fn step_s(&self, x: f64) -> f64 {
        self.step_times(x).iter().map(|&(w, t)| w * t).sum()
    }

    /// The kinds of step at `x` arrivals per step, as a decoding request sees them: their
    /// chances and seconds.
    fn step_times(&self, x: f64) -> Vec<(f64, f64)> {
        let decodes = 1.0 + x * self.gen_left;
        let room = self.room(x);
        let m = self.prompts_per_step(x * self.prompt_new, room);
        self.prefill_tokens(m, room, 0)
            .into_iter()
            .filter(|&(w, _)| w > 1e-12)
            .map(|(w, tokens)| {
                let pieces = self.chunk(tokens);
                (w, by_batch(decodes, |n| self.step(n, &pieces)))
            })
            .collect()
    }

    /// The step that computes a prompt: its own tokens, the other prompts that came with it
    /// (Poisson, `m` on average) and the others' decodes; seconds more than its own alone.
    fn company_s(&self, x: f64) -> f64 {
        let others = x * self.gen_left;
        let room = self.room(x);
        let m = self.prompts_per_step(x * self.prompt_new, room);
        let alone = self.prefill_tokens(0.0, room, 1);
        let with = self.prefill_tokens(m, room, 1);
        let mean = |d: Vec<(f64, f64)>| -> f64 {
            d.iter()
                .filter(|&&(w, _)| w > 1e-12)
                .map(|&(w, tokens)| {
                    let pieces = self.chunk(tokens);
                    w * by_batch(others, |n| self.step(n, &pieces))
                })
                .sum()
        };
        (mean(with) - mean(alone)).max(0.0)
    }

    /// Prefill tokens of a step and their chances: `extra + k` prompts, `k` Poisson with
    /// mean `m`, at most `room` tokens.
    fn prefill_tokens(&self, m: f64, room: f64, extra: usize) -> Vec<(f64, f64)> {
        if !m.is_finite() {
            return vec![(1.0, room)];
        }
        let p = self.piece;
        let whole = (room / p).ceil() as usize;
        let (mut out, mut pk, mut below) = (Vec::with_capacity(whole + 1), (-m).exp(), 0.0);
        for k in 0..whole.saturating_sub(extra) {
            out.push((pk, ((k + extra) as f64 * p).min(room)));
            below += pk;
            pk *= m / (k + 1) as f64;
        }
        out.push(((1.0 - below).max(0.0), room));
        out
    }

    /// The mean number of prompts arriving per step such that `prefill` tokens go in on
    /// average (what the room cuts off waits for the next steps, which raises it above
    /// `prefill / prompt`).
    fn prompts_per_step(&self, prefill: f64, room: f64) -> f64 {
        let mean = |m: f64| {
            self.prefill_tokens(m, room, 0)
                .iter()
                .map(|(w, t)| w * t)
                .sum::<f64>()
        };
        if prefill >= room * (1.0 - 1e-9) {
            return f64::INFINITY;
        }
        let p = self.piece;
        let (mut lo, mut hi) = (prefill / p, 2.0 * prefill / p + 1.0);
        while mean(hi) < prefill {
            hi *= 2.0;
        }
        for _ in 0..BISECT {
            let mid = (lo + hi) / 2.0;
            if mean(mid) < prefill {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (lo + hi) / 2.0
    }

    /// A prefill chunk of `tokens` tokens: part of one prompt (its middle, on average) or,
    /// when larger than a prompt, whole prompts and a part of the next.
    fn chunk(&self, tokens: f64) -> Vec<SeqWork> {
        let prompt = |new: f64, cached: f64| SeqWork {
            cached,
            new,
            rows: 1.0,
        };
        if tokens <= 0.0 {
            return Vec::new();
        }
        if tokens <= self.piece {
            let middle = self.prompt_cached + (self.piece - tokens) / 2.0;
            return vec![prompt(tokens, middle)];
        }
        let whole = (tokens / self.piece).floor();
        let mut pieces = vec![prompt(self.piece, self.prompt_cached); whole as usize];
        let rest = tokens - whole * self.piece;
        if rest > 1e-9 {
            pieces.push(prompt(rest, self.prompt_cached));
        }
        pieces
    }

    fn step(&self, decodes: usize, chunk: &[SeqWork]) -> f64 {
        let d = SeqWork {
            cached: self.mean_ctx,
            new: 1.0,
            rows: 1.0,
        };
        let mut seqs = vec![d; decodes];
        seqs.extend_from_slice(chunk);
        self.r.step(&seqs).time_s
    }

    /// The most arrivals per step the engine admits, and what binds there: the prefill lane
    /// reaching its room, or the decodes filling the pool (or the sequence cap).
    fn x_max(&self) -> (f64, &'static str) {
        let by_budget = self.budget / (self.gen_left + self.prompt_new);
        let seqs = self.capacity.max_concurrent_requests as f64;
        let pool_binds = self.capacity.preemption_from.is_some();
        if self.gen_left > 0.0 && seqs / self.gen_left < by_budget {
            let name = if pool_binds {
                "KV cache"
            } else {
                "sequence cap"
            };
            return (seqs / self.gen_left, name);
        }
        (by_budget, "token budget")
    }

    /// Arrivals per step at the highest sustainable rate, and what limits it.
    fn peak(&self) -> (f64, &'static str) {
        let (x_max, limit) = self.x_max();
        let rate = |x: f64| x / self.step_s(x);
        let grid = |k: usize| x_max * k as f64 / SCAN as f64;
        let best = (1..=SCAN)
            .max_by(|&a, &b| rate(grid(a)).total_cmp(&rate(grid(b))))
            .unwrap_or(SCAN);
        if best == SCAN {
            return (x_max, limit);
        }
        // A peak inside: narrow it down between its neighbours (the rate is unimodal there).
        let (mut lo, mut hi) = (grid(best - 1), grid(best + 1));
        for _ in 0..BISECT {
            let (a, b) = (lo + (hi - lo) / 3.0, hi - (hi - lo) / 3.0);
            if rate(a) < rate(b) {
                lo = a;
            } else {
                hi = b;
            }
        }
        ((lo + hi) / 2.0, "step time")
    }

    /// The smallest `x` with `x / T(x) = rate` (below the peak).
    fn operating_point(&self, rate: f64, x_peak: f64) -> f64 {
        let f = |x: f64| x / self.step_s(x) - rate;
        let grid = |k: usize| x_peak * k as f64 / SCAN as f64;
        let first = (1..=SCAN).find(|&k| f(grid(k)) >= 0.0).unwrap_or(SCAN);
        let (mut lo, mut hi) = (grid(first - 1), grid(first));
        for _ in 0..BISECT {
            let mid = (lo + hi) / 2.0;
            if f(mid) < 0.0 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (lo + hi) / 2.0
    }

    /// Latencies, concurrency and memory at `x` arrivals per step.
    fn steady(&self, rate: f64, x: f64) -> SteadyState {
        let i = self.i;
        let steps = self.step_times(x);
        let t: f64 = steps.iter().map(|&(w, t)| w * t).sum();
        // Arriving while a step runs, a request waits for its end: long steps are more
        // likely hit (E[T^2] / 2E[T]).
        let residual = steps.iter().map(|&(w, t)| w * t * t).sum::<f64>() / (2.0 * t);
        let others = x * self.gen_left;
        let room = self.room(x);
        let prefill = x * self.prompt_new;
        let rho = prefill / room;
        // The prefill lane: each prompt's service time and the M/G/1 wait before it.
        // While prompts queue, the steps are full: a prompt is served at `room` tokens per
        // step of a full budget.
        let full = by_batch(1.0 + others, |n| self.step(n, &self.chunk(room)));
        let service: Vec<f64> = i
            .prompt_lens
            .iter()
            .map(|&p| (p - cached_tokens(p, i.prefix_hit)) as f64 * full / room)
            .collect();
        let n = service.len() as f64;
        let lane = rate * service.iter().sum::<f64>() / n;
        let second_moment = service.iter().map(|s| s * s).sum::<f64>() / n;
        let queue = rate * second_moment / (2.0 * (1.0 - lane).max(1e-9));
        let own: Vec<f64> = i
            .prompt_lens
            .iter()
            .map(|&p| {
                by_batch(1.0 + others, |conc| {
                    time_to_first_token(self.r, i, conc, i.prefix_hit, p).0
                })
            })
            .collect();
        let company = self.company_s(x);
        let own: Vec<f64> = own.iter().map(|o| o + company).collect();
        let mean_own = own.iter().sum::<f64>() / own.len() as f64;
        let decoding = rate * self.gen_left * t;
        let unaligned = queue + mean_own + self.gen_left * t;
        let busy = 1.0 - (-rate * unaligned).exp();
        let align = busy * residual;
        let ttft = align + queue + mean_own;
        let latency = ttft + self.gen_left * t;
        let holding = decoding + rate * mean_own;
        let kv_tokens = decoding * self.mean_ctx + rate * mean_own * self.mean_prompt;
        let c = self.capacity;
        let slot = i.shape.kv_slot_bytes(i.kv_dtype) as f64;
        SteadyState {
            concurrency: rate * latency,
            decode_batch: 1.0 + others,
            prefill_tokens_per_step: prefill,
            prefill_utilisation: rho,
            busy: 1.0 - (-rate * latency).exp(),
            ttft_ms: ttft * 1e3,
            ttft_ms_max: (align + queue + own.iter().fold(0f64, |a, &b| a.max(b))) * 1e3,
            queue_ms: (align + queue) * 1e3,
            itl_ms: t * 1e3,
            latency_ms: latency * 1e3,
            output_tok_per_s: rate * self.mean_gen,
            kv_tokens_in_use: kv_tokens,
            kv_bytes_in_use: kv_tokens * slot,
            kv_capacity_tokens: c.capacity_tokens,
            preemption: kv_tokens > c.capacity_tokens as f64,
            preemption_risk: c.preemption_from.map_or(0.0, |n| poisson_tail(holding, n)),
        }
    }
}

/// The context a decode step's sequences hold on average: a request decodes `G - 1` steps
/// from `P` to `P + G` positions, so longer outputs weigh more (`P + G/2` weighted by
/// `G - 1`, over the workload's pairs of lengths).
fn decode_context(i: &PlanInputs) -> f64 {
    let (mut weighted, mut weight) = (0.0, 0.0);
    for &p in &i.prompt_lens {
        for &g in &i.gen_lens {
            let steps = g.saturating_sub(1) as f64;
            weighted += steps * (p as f64 + g as f64 / 2.0);
            weight += steps;
        }
    }
    if weight > 0.0 {
        weighted / weight
    } else {
        (i.prompt_len + i.gen_len / 2) as f64
    }
}

/// Prompt tokens found in the prefix cache at hit rate `hit` (one is always computed).
fn cached_tokens(prompt_len: usize, hit: f64) -> usize {
    ((prompt_len as f64 * hit) as usize).min(prompt_len - 1)
}

/// `f` at a fractional batch: linear between the whole batches either side.
fn by_batch(n: f64, f: impl Fn(usize) -> f64) -> f64 {
    let lo = n.floor().max(0.0);
    let w = n - lo;
    let a = f(lo as usize);
    if w < 1e-12 {
        a
    } else {
        a + w * (f(lo as usize + 1) - a)
    }
}

/// P(N >= n) for N Poisson with mean `mean`.
pub(super) fn poisson_tail(mean: f64, n: usize) -> f64 {
    if mean <= 0.0 {
        return 0.0;
    }
    // 1 - P(N < n), the terms summed in log space.
    let mut log_term = -mean;
    let mut below = 0.0;
    for k in 0..n {
        if k > 0 {
            log_term += mean.ln() - (k as f64).ln();
        }
        below += log_term.exp();
    }
    (1.0 - below).clamp(0.0, 1.0)
}
