//! The step timeline: what every engine step did, written in the Chrome trace event format
//! (loads in Perfetto and chrome://tracing).
//!
//! A [`StepTrace`] keeps the last `capacity` steps (a ring): per step its start, the duration
//! of each part ([`Part`]: schedule, forward, sample, and detokenize when the caller adds it),
//! the counters after it (running and waiting sequences, prefill and decode tokens, KV blocks
//! in use and registered in the prefix cache), each scheduled sequence's share ([`SeqSlice`])
//! and the request marks ([`Mark`]: arrived, preempted, finished, aborted) that happened
//! before or during it. [`StepTrace::to_chrome_json`] turns the ring into:
//!
//! - process 1 ("engine"), thread 1: one `X` slice per step (category `step`) with its parts
//!   nested inside (category `part`); counters (`C`) `sequences`, `tokens` and `kv_blocks`
//!   at each step's start;
//! - process 2 ("requests"), one thread per request (`tid` = sequence id + 1, named
//!   `request N`): `queued` from arrival (or preemption) to the step that next computes it,
//!   one `prefill` or `decode` slice per step that computes it (over that step's forward
//!   part, with its token count), and instants `preempted`, `finished` (with the reason) and
//!   `aborted`.
//!
//! When tracing is off the engine holds no recorder and a step costs one branch per part
//! ([`StepClock::off`] never reads the clock).

use std::collections::VecDeque;
use std::time::Instant;

use serde_json::{json, Value};

use crate::sequence::{SeqId, SeqMap};

/// A part of an engine step, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Drafting, `Scheduler::schedule` and block copies.
    Schedule,
    /// The model's forward pass.
    Forward,
    /// Sampling, verification, `Scheduler::update` and events.
    Sample,
    /// Turning the step's tokens into text (done by the engine's caller).
    Detokenize,
}

impl Part {
    const ALL: [Part; 4] = [
        Part::Schedule,
        Part::Forward,
        Part::Sample,
        Part::Detokenize,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Part::Schedule => "schedule",
            Part::Forward => "forward",
            Part::Sample => "sample",
            Part::Detokenize => "detokenize",
        }
    }
}

/// Whether a sequence's tokens in a step computed its prompt (or recomputed its history after
/// a preemption) or generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Some of the sequence's prompt was still uncomputed when the step began.
    Prefill,
    /// The whole prompt was computed: the new token (and any speculative drafts).
    Decode,
}

impl Work {
    pub fn name(self) -> &'static str {
        match self {
            Work::Prefill => "prefill",
            Work::Decode => "decode",
        }
    }
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSlice {
    pub seq_id: SeqId,
    pub work: Work,
    /// New tokens computed for it this step.
    pub tokens: usize,
}

/// Something that happened to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkKind {
    /// Queued (added to the engine).
    Arrived,
    /// Preempted by recompute: its blocks freed, queued again.
    Preempted,
    /// Finished; the reason as a word (`stop`, `length`, `error`).
    Finished(String),
    /// Aborted by its client.
    Aborted,
}

/// A request mark at a time.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// Microseconds since the trace began.
    pub at_us: f64,
    pub seq_id: SeqId,
    pub kind: MarkKind,
}

/// Counters of the engine after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepCounters {
    pub running: usize,
    pub waiting: usize,
    /// KV blocks held by sequences.
    pub kv_blocks_in_use: usize,
    /// KV blocks registered in the prefix cache (held or free).
    pub kv_blocks_cached: usize,
}

/// One engine step as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub step: u64,
    /// Microseconds since the trace began.
    pub start_us: f64,
    /// Consecutive parts from `start_us`, in order, with their durations in microseconds.
    pub parts: Vec<(Part, f64)>,
    pub seqs: Vec<SeqSlice>,
    pub counters: StepCounters,
    /// Marks before (arrivals, aborts) and during (preemptions, finishes) this step.
    pub marks: Vec<Mark>,
}

impl StepRecord {
    /// Duration of the whole step in microseconds.
    pub fn duration_us(&self) -> f64 {
        self.parts.iter().map(|p| p.1).sum()
    }

    /// Tokens of sequences still computing their prompt.
    pub fn prefill_tokens(&self) -> usize {
        self.tokens_of(Work::Prefill)
    }

    /// Tokens of generating sequences (new tokens and verified drafts).
    pub fn decode_tokens(&self) -> usize {
        self.tokens_of(Work::Decode)
    }

    fn tokens_of(&self, work: Work) -> usize {
        let of = self.seqs.iter().filter(|s| s.work == work);
        of.map(|s| s.tokens).sum()
    }

    /// (start, duration) of the forward part in microseconds, if the step has one.
    fn forward_span(&self) -> Option<(f64, f64)> {
        let mut at = self.start_us;
        for &(part, dur) in &self.parts {
            if part == Part::Forward {
                return Some((at, dur));
            }
            at += dur;
        }
        None
    }
}

/// Times the parts of one step; reads the clock only when on.
#[derive(Debug)]
pub struct StepClock {
    start: Option<Instant>,
    ends: [Option<Instant>; 4],
}

impl StepClock {
    /// A clock that records nothing.
    pub fn off() -> StepClock {
        StepClock {
            start: None,
            ends: [None; 4],
        }
    }

    /// A clock started now.
    pub fn start() -> StepClock {
        StepClock {
            start: Some(Instant::now()),
            ends: [None; 4],
        }
    }

    /// Started when `on`, else off.
    pub fn new(on: bool) -> StepClock {
        if on {
            StepClock::start()
        } else {
            StepClock::off()
        }
    }

    /// Ends `part` now (a no-op when off).
    pub fn mark(&mut self, part: Part) {
        if self.start.is_some() {
            self.ends[part as usize] = Some(Instant::now());
        }
    }

    /// The recorded parts as (part, duration µs), in order, skipping parts never marked.
    fn parts(&self) -> Vec<(Part, f64)> {
        let Some(mut prev) = self.start else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for part in Part::ALL {
            if let Some(end) = self.ends[part as usize] {
                out.push((part, end.duration_since(prev).as_secs_f64() * 1e6));
                prev = end;
            }
        }
        out
    }
}

/// The recorder: a ring of the last `capacity` steps and the marks since the last step.
#[derive(Debug)]
pub struct StepTrace {
    origin: Instant,
    capacity: usize,
    steps: VecDeque<StepRecord>,
    /// Marks since the last recorded step (they join the next one).
    pending: Vec<Mark>,
    /// Steps dropped from the front of the ring.
    dropped: u64,
}

impl StepTrace {
    /// A recorder keeping the last `capacity` steps (at least 1).
    pub fn new(capacity: usize) -> StepTrace {
        StepTrace {
            origin: Instant::now(),
            capacity: capacity.max(1),
            steps: VecDeque::new(),
            pending: Vec::new(),
            dropped: 0,
        }
    }

    /// Microseconds since the trace began.
    pub fn now_us(&self) -> f64 {
        self.since_origin(Instant::now())
    }

    fn since_origin(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64() * 1e6
    }

    /// Records a mark now (it joins the next step).
    pub fn mark(&mut self, seq_id: SeqId, kind: MarkKind) {
        let at_us = self.now_us();
        self.pending.push(Mark {
            at_us,
            seq_id,
            kind,
        });
    }

    /// Records a step timed by `clock` (nothing when the clock is off). `marks` happened
    /// during it and are placed at its start (preemptions) or end (the rest).
    pub fn record(
        &mut self,
        step: u64,
        clock: &StepClock,
        seqs: Vec<SeqSlice>,
        counters: StepCounters,
        during: Vec<(SeqId, MarkKind)>,
    ) {
        let Some(start) = clock.start else {
            return;
        };
        let start_us = self.since_origin(start);
        let parts = clock.parts();
        let end_us = start_us + parts.iter().map(|p| p.1).sum::<f64>();
        let mut marks = std::mem::take(&mut self.pending);
        marks.extend(during.into_iter().map(|(seq_id, kind)| Mark {
            at_us: if kind == MarkKind::Preempted {
                start_us
            } else {
                end_us
            },
            seq_id,
            kind,
        }));
        if self.steps.len() == self.capacity {
            self.steps.pop_front();
            self.dropped += 1;
        }
        self.steps.push_back(StepRecord {
            step,
            start_us,
            parts,
            seqs,
            counters,
            marks,
        });
    }

    /// Adds the detokenize part (from `started` until now) to the last step, if no marks
    /// were taken since it.
    pub fn add_detokenize(&mut self, started: Instant) {
        let dur = Instant::now().duration_since(started).as_secs_f64() * 1e6;
        if !self.pending.is_empty() {
            return;
        }
        if let Some(last) = self.steps.back_mut() {
            if !last.parts.iter().any(|p| p.0 == Part::Detokenize) {
                last.parts.push((Part::Detokenize, dur));
            }
        }
    }

    /// The steps kept, oldest first.
    pub fn steps(&self) -> impl Iterator<Item = &StepRecord> {
        self.steps.iter()
    }

    /// Steps dropped from the ring so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The ring in the Chrome trace event format (see the module docs).
    pub fn to_chrome_json(&self) -> Value {
        let mut events = vec![
            meta("process_name", 1, 0, "engine"),
            meta("thread_name", 1, 1, "steps"),
            meta("process_name", 2, 0, "requests"),
        ];
        let mut requests = RequestTracks::default();
        for s in &self.steps {
            step_events(s, &mut events);
            requests.step(s, &mut events);
        }
        for m in &self.pending {
            requests.mark(m, &mut events);
        }
        events.extend(requests.names());
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {"dropped_steps": self.dropped, "steps": self.steps.len()},
        })
    }
}

/// A metadata event naming a process or thread.
fn meta(kind: &str, pid: u64, tid: u64, name: &str) -> Value {
    json!({"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
}

/// The step's slice, its parts and its counters.
fn step_events(s: &StepRecord, out: &mut Vec<Value>) {
    let c = &s.counters;
    out.push(json!({
        "name": format!("step {}", s.step), "cat": "step", "ph": "X", "pid": 1, "tid": 1,
        "ts": s.start_us, "dur": s.duration_us(),
        "args": {"step": s.step, "seqs": s.seqs.len(), "prefill_tokens": s.prefill_tokens(),
                 "decode_tokens": s.decode_tokens()},
    }));
    let mut at = s.start_us;
    for &(part, dur) in &s.parts {
        out.push(
            json!({"name": part.name(), "cat": "part", "ph": "X", "pid": 1, "tid": 1,
                        "ts": at, "dur": dur}),
        );
        at += dur;
    }
    let counter = |name: &str, args: Value| json!({"name": name, "ph": "C", "pid": 1, "tid": 1, "ts": s.start_us, "args": args});
    out.push(counter(
        "sequences",
        json!({"running": c.running, "waiting": c.waiting}),
    ));
    out.push(counter(
        "tokens",
        json!({"prefill": s.prefill_tokens(), "decode": s.decode_tokens()}),
    ));
    out.push(counter(
        "kv_blocks",
        json!({"in_use": c.kv_blocks_in_use, "cached": c.kv_blocks_cached}),
    ));
}

/// Builds the per-request tracks: open `queued` intervals and the ids seen.
#[derive(Debug, Default)]
struct RequestTracks {
    /// Request -> when its current wait began.
    queued_since: SeqMap<f64>,
    seen: Vec<SeqId>,
}

impl RequestTracks {
    fn tid(id: SeqId) -> u64 {
        id.0 + 1
    }

    fn see(&mut self, id: SeqId) {
        if !self.seen.contains(&id) {
            self.seen.push(id);
        }
    }

    /// Marks before the step, then its slices, then the marks at its end.
    fn step(&mut self, s: &StepRecord, out: &mut Vec<Value>) {
        // Finishes happen at the step's end; arrivals, aborts and preemptions before it.
        let (after, before): (Vec<&Mark>, Vec<&Mark>) = s
            .marks
            .iter()
            .partition(|m| matches!(m.kind, MarkKind::Finished(_)));
        for m in before {
            self.mark(m, out);
        }
        if let Some((fwd_start, fwd_dur)) = s.forward_span() {
            for slice in &s.seqs {
                self.see(slice.seq_id);
                let tid = Self::tid(slice.seq_id);
                if let Some(since) = self.queued_since.remove(&slice.seq_id) {
                    out.push(
                        json!({"name": "queued", "cat": "request", "ph": "X", "pid": 2,
                        "tid": tid, "ts": since, "dur": (s.start_us - since).max(0.0)}),
                    );
                }
                out.push(json!({
                    "name": slice.work.name(), "cat": "request", "ph": "X", "pid": 2,
                    "tid": tid, "ts": fwd_start, "dur": fwd_dur,
                    "args": {"step": s.step, "tokens": slice.tokens},
                }));
            }
        }
        for m in after {
            self.mark(m, out);
        }
    }

    fn mark(&mut self, m: &Mark, out: &mut Vec<Value>) {
        self.see(m.seq_id);
        let tid = Self::tid(m.seq_id);
        let instant = |name: &str, args: Value| {
            json!({"name": name, "cat": "request", "ph": "i", "s": "t", "pid": 2, "tid": tid,
                   "ts": m.at_us, "args": args})
        };
        match &m.kind {
            MarkKind::Arrived => {
                self.queued_since.insert(m.seq_id, m.at_us);
                out.push(instant("arrived", json!({})));
            }
            MarkKind::Preempted => {
                self.queued_since.insert(m.seq_id, m.at_us);
                out.push(instant("preempted", json!({})));
            }
            MarkKind::Finished(reason) => {
                self.queued_since.remove(&m.seq_id);
                out.push(instant("finished", json!({"reason": reason})));
            }
            MarkKind::Aborted => {
                self.queued_since.remove(&m.seq_id);
                out.push(instant("aborted", json!({})));
            }
        }
    }

    /// A name for every request track.
    fn names(&self) -> Vec<Value> {
        let named = self.seen.iter();
        named
            .map(|&id| {
                meta(
                    "thread_name",
                    2,
                    Self::tid(id),
                    &format!("request {}", id.0),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock_with_parts() -> StepClock {
        let mut c = StepClock::start();
        c.mark(Part::Schedule);
        c.mark(Part::Forward);
        c.mark(Part::Sample);
        c
    }

    #[test]
    fn an_off_clock_records_nothing() {
        let mut t = StepTrace::new(4);
        let mut c = StepClock::off();
        c.mark(Part::Forward);
        t.record(0, &c, Vec::new(), StepCounters::default(), Vec::new());
        assert_eq!(t.steps().count(), 0);
    }

    #[test]
    fn the_ring_keeps_the_last_steps() {
        let mut t = StepTrace::new(2);
        for step in 0..5 {
            t.record(
                step,
                &clock_with_parts(),
                Vec::new(),
                StepCounters::default(),
                Vec::new(),
            );
        }
        let kept: Vec<u64> = t.steps().map(|s| s.step).collect();
        assert_eq!(kept, vec![3, 4]);
        assert_eq!(t.dropped(), 3);
    }

    #[test]
    fn a_request_track_is_queued_then_computed_then_finished() {
        let mut t = StepTrace::new(8);
        let id = SeqId(7);
        t.mark(id, MarkKind::Arrived);
        let slice = |work, tokens| SeqSlice {
            seq_id: id,
            work,
            tokens,
        };
        let c = StepCounters::default();
        t.record(
            0,
            &clock_with_parts(),
            vec![slice(Work::Prefill, 5)],
            c,
            vec![],
        );
        let fin = vec![(id, MarkKind::Finished("length".into()))];
        t.record(1, &clock_with_parts(), vec![slice(Work::Decode, 1)], c, fin);
        let json = t.to_chrome_json();
        let names: Vec<&str> = json["traceEvents"]
            .as_array()
            .expect("an array")
            .iter()
            .filter(|e| e["pid"] == 2 && e["tid"] == 8)
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "arrived",
                "queued",
                "prefill",
                "decode",
                "finished",
                "thread_name"
            ]
        );
    }
}
