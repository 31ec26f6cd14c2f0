//! The engine's own OS thread and the channels handlers use to reach it (ARCHITECTURE.md §
//! Threads).
//!
//! Handlers send [`Command`]s in (submit a group of requests, abort one, shut down); each
//! group gets one unbounded event channel out, its events tagged with the request's index
//! in the group. The thread steps the engine while anything is unfinished and sleeps on
//! the command channel otherwise.
//!
//! The thread's [`OutputProcessor`] turns each step's engine events into per-request
//! outputs (text through the detokenizer and stop strings, finish reasons, prompt scores,
//! beam hypotheses) and ends a request in the engine as soon as its stop string matches;
//! the channels carry those outputs.
//!
//! **Disconnects**: a handler that goes away (client disconnected, response dropped) drops
//! its event receiver. Before every step the thread aborts the requests whose receiver is
//! gone, so a dropped client costs at most the step in progress; aborting frees the blocks.
//!
//! **Faults**: a panic inside `Engine::step` is caught; every request in flight then ends
//! with an error, the engine is marked dead (health answers 503) and later submissions are
//! refused. An `Err` from a step ends the requests in flight with an error and goes on.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tandem_engine::beam_search::BeamParams;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::{EngineError, FinishReason, SeqId, SeqStatus};
use tandem_model::batch::AdapterId;
use tandem_model::lora::LoraAdapter;
use tandem_model::tokenizer::Tokenizer;
use tandem_text::{Finish, OutputProcessor, RequestOutput, TextOptions, TextRequest};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::engine_log::EngineLog;
use crate::metrics::{MetricsSnapshot, ServingMetrics};

mod admin;
mod kv;
mod submit_error;

pub use kv::PromptKey;
pub use submit_error::SubmitError;

/// An event of request `index` of its group.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupEvent {
    pub index: usize,
    pub event: RequestOutput,
}

/// Engine state for `/health`, refreshed after every loop turn.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineSnapshot {
    /// False once the engine thread has died or shut down.
    pub alive: bool,
    pub running: usize,
    pub waiting: usize,
    pub kv_free_blocks: usize,
    pub kv_total_blocks: usize,
    /// Requests (group members) whose events have a live receiver.
    pub in_flight: usize,
    /// Requests aborted since start because their client went away.
    pub disconnects: u64,
    /// Counters and latency histograms for `/metrics`.
    pub metrics: MetricsSnapshot,
    /// The distinct LoRA adapters of the running and of the waiting requests.
    pub adapters: [Vec<AdapterId>; 2],
}

enum Command {
    Submit {
        requests: Vec<TextRequest>,
        events: tmpsc::UnboundedSender<GroupEvent>,
        reply: oneshot::Sender<Result<Vec<SeqId>, SubmitError>>,
    },
    Abort(SeqId),
    /// Forget every cached prefix block; replies with how many were forgotten.
    ResetPrefixCache(oneshot::Sender<usize>),
    /// The step timeline as Chrome trace JSON (`None` when not recording).
    DumpTrace(oneshot::Sender<Option<String>>),
    /// Register a LoRA adapter; replies with its id or why not.
    AddAdapter(
        Box<LoraAdapter>,
        oneshot::Sender<Result<AdapterId, EngineError>>,
    ),
    /// Forget a LoRA adapter (refused while a request uses it).
    RemoveAdapter(AdapterId, oneshot::Sender<Result<(), EngineError>>),
    /// Send or receive a prompt's KV blocks.
    Kv(kv::KvCommand),
    Shutdown,
}

/// One prompt's request and how many parallel samples of it to run (`n`); the engine
/// computes the prompt once and the samples share its KV blocks.
pub type SampleGroup = (GenerationRequest, usize);

/// The handlers' side of the engine thread. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    commands: Sender<Command>,
    snapshot: Arc<Mutex<EngineSnapshot>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Submit { requests, .. } => write!(f, "Submit({} prompts)", requests.len()),
            Command::Abort(id) => write!(f, "Abort({id:?})"),
            Command::ResetPrefixCache(_) => write!(f, "ResetPrefixCache"),
            Command::DumpTrace(_) => write!(f, "DumpTrace"),
            Command::AddAdapter(..) => write!(f, "AddAdapter"),
            Command::RemoveAdapter(id, _) => write!(f, "RemoveAdapter({id:?})"),
            Command::Kv(_) => write!(f, "Kv"),
            Command::Shutdown => write!(f, "Shutdown"),
        }
    }
}

impl EngineHandle {
    /// Queues `requests` (each with its sample count), their text made with `text`, as one
    /// group: all are added or, if the engine refuses one, none. Returns the ids (prompt by
    /// prompt, samples in order; event index `i` is `ids[i]`) and the group's event
    /// receiver; dropping the receiver aborts whatever is still running.
    pub async fn submit(
        &self,
        requests: Vec<SampleGroup>,
        text: &TextOptions,
    ) -> Result<(Vec<SeqId>, tmpsc::UnboundedReceiver<GroupEvent>), SubmitError> {
        let requests = requests
            .into_iter()
            .map(|(request, samples)| TextRequest {
                request,
                samples,
                beam: None,
                text: text.clone(),
                num_speculative_tokens: None,
            })
            .collect();
        self.send(|events, reply| Command::Submit {
            requests,
            events,
            reply,
        })
        .await
    }

    /// Queues a beam search over `request.prompt` (see `Engine::add_beam_request`): its
    /// one output (index 0) is its last delta, with the hypotheses as text made with `text`;
    /// dropping the receiver aborts it.
    pub async fn submit_beam(
        &self,
        request: GenerationRequest,
        beam: BeamParams,
        text: &TextOptions,
    ) -> Result<(Vec<SeqId>, tmpsc::UnboundedReceiver<GroupEvent>), SubmitError> {
        let request = TextRequest {
            request,
            samples: 1,
            beam: Some(beam),
            text: text.clone(),
            num_speculative_tokens: None,
        };
        self.send(|events, reply| Command::Submit {
            requests: vec![request],
            events,
            reply,
        })
        .await
    }

    async fn send(
        &self,
        command: impl FnOnce(
            tmpsc::UnboundedSender<GroupEvent>,
            oneshot::Sender<Result<Vec<SeqId>, SubmitError>>,
        ) -> Command,
    ) -> Result<(Vec<SeqId>, tmpsc::UnboundedReceiver<GroupEvent>), SubmitError> {
        let (events, rx) = tmpsc::unbounded_channel();
        let (reply, reply_rx) = oneshot::channel();
        self.commands
            .send(command(events, reply))
            .map_err(|_| SubmitError::Unavailable)?;
        match reply_rx.await {
            Ok(Ok(ids)) => Ok((ids, rx)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(SubmitError::Unavailable),
        }
    }

    /// Ends a request now, without a last output to its handler (stop strings are ended
    /// by the engine thread itself). Unknown or finished ids are fine.
    pub fn abort(&self, id: SeqId) {
        // A send error means the engine is gone, which ended the request anyway.
        let _ = self.commands.send(Command::Abort(id));
    }

    /// Asks the thread to abort everything and exit.
    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
    }

    /// The latest engine state.
    pub fn snapshot(&self) -> EngineSnapshot {
        match self.snapshot.lock() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// Starts the engine thread, its outputs made into text with `tokenizer`; submissions that
/// would make more than `max_waiting` sequences wait are refused with
/// [`SubmitError::QueueFull`] (one is always admitted into an empty queue, however many
/// prompts it has). With `log_interval`, it writes the engine line (see [`crate::engine_log`]).
pub fn spawn_engine(
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    max_waiting: usize,
    log_interval: Option<Duration>,
    trace_file: Option<std::path::PathBuf>,
) -> std::io::Result<(EngineHandle, JoinHandle<()>)> {
    let (commands, rx) = mpsc::channel();
    let snapshot = Arc::new(Mutex::new(EngineSnapshot::default()));
    let mut worker = Worker {
        engine,
        outputs: OutputProcessor::new(tokenizer),
        snapshot: snapshot.clone(),
        alive: true,
        disconnects: 0,
        metrics: ServingMetrics::default(),
        max_waiting,
        outbox: Vec::new(),
        engine_log: log_interval.map(EngineLog::new),
        trace_file,
    };
    worker.publish();
    let mark_dead = MarkDead(snapshot.clone());
    let join = std::thread::Builder::new()
        .name("tandem-engine".into())
        .spawn(move || {
            // Whatever ends the loop, a panic outside a step included, /health then says so.
            let _mark_dead = mark_dead;
            worker.run(rx)
        })?;
    Ok((EngineHandle { commands, snapshot }, join))
}

/// Publishes `alive: false` when dropped: held by the engine thread, it runs however the
/// thread ends.
struct MarkDead(Arc<Mutex<EngineSnapshot>>);

impl Drop for MarkDead {
    fn drop(&mut self) {
        match self.0.lock() {
            Ok(mut g) => g.alive = false,
            Err(poisoned) => poisoned.into_inner().alive = false,
        }
    }
}

/// Where a request's events go.
struct Route {
    events: tmpsc::UnboundedSender<GroupEvent>,
    index: usize,
}

struct Worker {
    engine: Engine,
    /// Every routed request's output state, tagged with its route.
    outputs: OutputProcessor<Route>,
    snapshot: Arc<Mutex<EngineSnapshot>>,
    alive: bool,
    disconnects: u64,
    metrics: ServingMetrics,
    max_waiting: usize,
    /// A step's events, sent only after the snapshot shows the step's effects, so a
    /// handler that sees its request finish never reads a `/health` from before.
    outbox: Vec<(tmpsc::UnboundedSender<GroupEvent>, GroupEvent)>,
    engine_log: Option<EngineLog>,
    /// Where the step timeline is written (at exit and on each dump).
    trace_file: Option<std::path::PathBuf>,
}

impl Worker {
    fn run(&mut self, commands: Receiver<Command>) {
        loop {
            // Sleep while idle; otherwise take whatever arrived and step.
            let first = if self.alive && self.engine.has_unfinished() {
                commands.try_recv().ok()
            } else {
                match commands.recv_timeout(Duration::from_millis(500)) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            };
            let mut shutdown = false;
            for cmd in first
                .into_iter()
                .chain(std::iter::from_fn(|| commands.try_recv().ok()))
            {
                shutdown |= self.handle(cmd);
            }
            if shutdown {
                break;
            }
            self.drop_disconnected();
            if self.alive && self.engine.has_unfinished() {
                let steps = self.engine.scheduler().stats().num_steps;
                let answered = self.step();
                if !answered && self.engine.scheduler().stats().num_steps == steps {
                    // Nothing could be scheduled: wait briefly instead of spinning. (A call
                    // that only answers a launched step plans nothing, yet is progress.)
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            self.publish();
            if let Some(log) = self.engine_log.as_mut() {
                log.tick(&self.snapshot);
            }
        }
        self.end_all(FinishReason::Abort);
        self.alive = false;
        self.flush();
        self.dump_trace();
    }

    /// The step timeline as JSON, written to the trace file when one is set.
    fn dump_trace(&self) -> Option<String> {
        let json = self.engine.trace()?.to_chrome_json().to_string();
        if let Some(path) = &self.trace_file {
            match std::fs::write(path, &json) {
                Ok(()) => tracing::info!(path = %path.display(), "step trace written"),
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "writing the step trace")
                }
            }
        }
        Some(json)
    }

    /// Applies one command; true for shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit {
                requests,
                events,
                reply,
            } => {
                let result = self.add_group(requests, &events);
                // A handler gone before the reply leaves a closed receiver, swept next.
                let _ = reply.send(result);
                false
            }
            Command::Abort(id) => {
                self.abort(id);
                false
            }
            Command::ResetPrefixCache(reply) => {
                let _ = reply.send(self.engine.reset_prefix_cache());
                false
            }
            Command::DumpTrace(reply) => {
                let _ = reply.send(self.dump_trace());
                false
            }
            Command::AddAdapter(adapter, reply) => {
                let _ = reply.send(self.engine.add_adapter(*adapter));
                false
            }
            Command::RemoveAdapter(id, reply) => {
                let _ = reply.send(self.engine.remove_adapter(id));
                false
            }
            Command::Kv(command) => {
                self.handle_kv(command);
                false
            }
            Command::Shutdown => true,
        }
    }

    /// Whether `prompts` more may queue: refused when the engine is dead or the queue full;
    /// `Err(Unavailable)` also stands for "the client is already gone" (nothing to add).
    fn admit(
        &self,
        prompts: usize,
        events: &tmpsc::UnboundedSender<GroupEvent>,
    ) -> Result<(), SubmitError> {
        if !self.alive || events.is_closed() {
            return Err(SubmitError::Unavailable);
        }
        let waiting = self.engine.scheduler().num_waiting();
        if waiting > 0 && waiting + prompts > self.max_waiting {
            return Err(SubmitError::QueueFull(self.max_waiting));
        }
        Ok(())
    }

    /// Adds every request or none; the outputs of `ids[i]` go to `events` with index `i`.
    fn add_group(
        &mut self,
        requests: Vec<TextRequest>,
        events: &tmpsc::UnboundedSender<GroupEvent>,
    ) -> Result<Vec<SeqId>, SubmitError> {
        self.admit(requests.len(), events)?;
        let mut ids: Vec<SeqId> = Vec::with_capacity(requests.len());
        let mut prompt_lens = Vec::with_capacity(requests.len());
        for r in requests {
            let len = r.request.prompt.len();
            let first = ids.len();
            let route = |k: usize| Route {
                events: events.clone(),
                index: first + k,
            };
            match self.outputs.add(&mut self.engine, r, route) {
                Ok(added) => {
                    prompt_lens.push((len, added.len()));
                    ids.extend(added);
                }
                Err(e) => {
                    for id in ids {
                        self.outputs.abort(&mut self.engine, id);
                    }
                    return Err(SubmitError::Refused(e));
                }
            }
        }
        self.count_added(&ids, &prompt_lens);
        Ok(ids)
    }

    /// Starts the clocks of added requests; a prompt's tokens count once for its samples.
    fn count_added(&mut self, ids: &[SeqId], prompt_lens: &[(usize, usize)]) {
        let mut ids = ids.iter();
        for &(len, n) in prompt_lens {
            for (i, &id) in ids.by_ref().take(n).enumerate() {
                self.metrics
                    .on_added(id, if i == 0 { len } else { 0 }, i == 0);
            }
        }
    }

    /// Ends a routed request without telling its handler; false when it was not routed.
    fn abort(&mut self, id: SeqId) -> bool {
        if self.outputs.abort(&mut self.engine, id).is_none() {
            return false;
        }
        self.metrics.on_finished(id, &Finish::Abort);
        true
    }

    /// Aborts every request whose receiver is gone.
    fn drop_disconnected(&mut self) {
        let gone: Vec<SeqId> = self
            .outputs
            .requests()
            .filter(|(_, r)| r.events.is_closed())
            .map(|(id, _)| id)
            .collect();
        for id in gone {
            if self.abort(id) {
                self.disconnects += 1;
            }
        }
    }

    /// One engine step; true when it brought events (or ended requests).
    fn step(&mut self) -> bool {
        let started = Instant::now();
        let answered = match catch_unwind(AssertUnwindSafe(|| self.engine.step())) {
            Ok(Ok(events)) => {
                let answered = !events.is_empty();
                let scheduler = self.engine.scheduler();
                // Gone from the scheduler means finished (aborts forget their clock first).
                self.metrics.on_step(started, |id| {
                    scheduler
                        .sequence(id)
                        .is_none_or(|s| *s.status() != SeqStatus::Waiting)
                });
                let detokenize = Instant::now();
                self.dispatch(events);
                if let Some(trace) = self.engine.trace_mut() {
                    trace.add_detokenize(detokenize);
                }
                answered
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "engine step failed: ending the requests in flight");
                self.end_all(FinishReason::Error(format!("engine step failed: {e}")));
                true
            }
            Err(_) => {
                tracing::error!("the engine panicked: ending every request; /health turns 503");
                self.alive = false;
                self.end_all(FinishReason::Error("the engine panicked".into()));
                true
            }
        };
        self.flush();
        answered
    }

    /// Publishes the snapshot, then sends the events held back until it shows them.
    fn flush(&mut self) {
        self.publish();
        for (to, event) in self.outbox.drain(..) {
            let _ = to.send(event);
        }
    }

    /// Counts a step's events and queues their outputs for the handlers; a request whose
    /// handler is gone is aborted.
    fn dispatch(&mut self, events: Vec<EngineEvent>) {
        for e in &events {
            match e {
                EngineEvent::Token { seq_id, .. } => self.metrics.on_token(*seq_id),
                EngineEvent::Finished { seq_id, reason } => {
                    self.metrics
                        .on_finished(*seq_id, &Finish::from(reason.clone()));
                }
                EngineEvent::Admitted { .. } | EngineEvent::PromptLogprobs { .. } => {}
            }
        }
        let (outbox, metrics) = (&mut self.outbox, &mut self.metrics);
        let mut gone = Vec::new();
        self.outputs
            .process(&mut self.engine, events, |id, route, event| {
                if !deliver(outbox, metrics, id, route, event) {
                    gone.push(id);
                }
            });
        for id in gone {
            if self.abort(id) {
                self.disconnects += 1;
            }
        }
    }

    /// Ends every routed request with `reason`, telling its handler.
    fn end_all(&mut self, reason: FinishReason) {
        let (outbox, metrics) = (&mut self.outbox, &mut self.metrics);
        let engine = self.alive.then_some(&mut self.engine);
        self.outputs.finish_all(engine, reason, |id, route, event| {
            deliver(outbox, metrics, id, route, event);
        });
    }

    fn publish(&self) {
        let s = self.engine.scheduler();
        let snap = EngineSnapshot {
            alive: self.alive,
            running: s.num_running(),
            waiting: s.num_waiting(),
            kv_free_blocks: s.allocator().num_free(),
            kv_total_blocks: s.allocator().num_total(),
            in_flight: self.outputs.len(),
            disconnects: self.disconnects,
            metrics: self.metrics.snapshot(s.stats(), self.engine.spec_stats()),
            adapters: s.adapters_in_use().map(|set| set.into_iter().collect()),
        };
        match self.snapshot.lock() {
            Ok(mut g) => *g = snap,
            Err(poisoned) => *poisoned.into_inner() = snap,
        }
    }
}

/// Queues `event` of request `id` for its handler, counting a finish; false when the
/// request goes on but its handler is gone.
fn deliver(
    outbox: &mut Vec<(tmpsc::UnboundedSender<GroupEvent>, GroupEvent)>,
    metrics: &mut ServingMetrics,
    id: SeqId,
    route: &Route,
    event: RequestOutput,
) -> bool {
    let finished = match &event {
        RequestOutput::Delta(d) => d.finish.as_ref(),
        RequestOutput::Admitted { .. } => None,
    };
    // Stop strings and text errors end requests here; the engine's own finishes were
    // counted already (a request's clock is counted once).
    if let Some(finish) = finished {
        metrics.on_finished(id, finish);
    }
    let finished = finished.is_some();
    let event = GroupEvent {
        index: route.index,
        event,
    };
    outbox.push((route.events.clone(), event));
    finished || !route.events.is_closed()
}
