//! The model's side of the server, on a thread of its own: jobs (one per choice of
//! a request) come in over a channel, wait for a slot, decode together in a
//! [`Batcher`] — one pass per step over every sequence in a slot — and each drawn
//! token goes back to its request as text (whole characters, cut before a stop
//! string) as soon as it is drawn, with its log-probabilities when asked for.
//!
//! The engine never waits for a client: events go into a bounded channel per
//! request, and a request whose client left (the channel closed) or stopped reading
//! (the channel full: [`Events`]) leaves at the next step, freeing its slots, as
//! does one past its time limit or every one once the server's shutdown bound has
//! passed.

use crate::error::ApiError;
use crate::limits::Ticket;
use crate::logprobs::{prompt_entries, Entry};
use crate::request::Choice;
use crate::state::Shared;
use anyhow::Result;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;
use tinylm::batching::{Batcher, Drawn, Finish, Request};
use tinylm::generate::{StopText, TextStream};
use tinylm::kernels::Backend;
use tinylm::Model;
use tinylm_bpe::encode::Tokenizer;
use tokio::sync::mpsc::error::TrySendError;

/// Why a choice's text ended, as the API says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended the text, or a stop string was reached.
    Stop,
    /// `max_tokens` were drawn.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Why a choice stopped before its end.
#[derive(Clone, Debug)]
pub enum Failure {
    /// Decoding failed.
    Error(String),
    /// The request ran past the server's time limit.
    Timeout,
    /// The server is shutting down.
    Shutdown,
}

impl Failure {
    pub fn error(&self) -> ApiError {
        match self {
            Failure::Error(message) => ApiError::server(message.clone()),
            Failure::Timeout => ApiError::timeout(
                "the request ran past this server's time limit (--request-timeout)",
            ),
            Failure::Shutdown => ApiError::unavailable(
                "the server is shutting down: the request was ended before its last token",
            ),
        }
    }
}

/// What the engine tells a request about one of its choices.
#[derive(Debug)]
pub enum Event {
    /// More text, and the tokens whose text begins in it (when log-probabilities
    /// were asked for).
    Text {
        text: String,
        logprobs: Vec<Entry>,
    },
    /// The end, after `tokens` drawn tokens; `cached` of the prompt's tokens were
    /// found in the KV cache of an earlier request (not computed again).
    Done {
        finish: FinishReason,
        tokens: usize,
        cached: usize,
    },
    Failed(Failure),
}

/// Where a request hears about its choices: a bounded channel of `(choice, event)`.
/// A send never waits: when the channel is full, the client has not read
/// `capacity` events, the request is marked overflowed and its choices leave.
#[derive(Clone)]
pub struct Events {
    tx: tokio::sync::mpsc::Sender<(usize, Event)>,
    overflowed: Arc<AtomicBool>,
}

/// The request's end of its [`Events`].
pub struct Receiving {
    pub rx: tokio::sync::mpsc::Receiver<(usize, Event)>,
    overflowed: Arc<AtomicBool>,
    capacity: usize,
}

impl Events {
    /// A channel holding `capacity` events.
    pub fn channel(capacity: usize) -> (Events, Receiving) {
        let (tx, rx) = tokio::sync::mpsc::channel(capacity);
        let overflowed = Arc::new(AtomicBool::new(false));
        let events = Events {
            tx,
            overflowed: Arc::clone(&overflowed),
        };
        let receiving = Receiving {
            rx,
            overflowed,
            capacity,
        };
        (events, receiving)
    }

    fn send(&self, choice: usize, event: Event) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send((choice, event)) {
            self.overflowed.store(true, Ordering::Relaxed);
        }
    }

    fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// Whether the request's client left or stopped reading.
    fn is_gone(&self) -> bool {
        self.tx.is_closed() || self.overflowed()
    }
}

impl Receiving {
    /// Why the channel ended before every choice did.
    pub fn cut_short(&self) -> ApiError {
        match self.overflowed.load(Ordering::Relaxed) {
            true => ApiError::timeout(format!(
                "the client read more slowly than the text came: {} events waited (--stream-buffer); the request was ended",
                self.capacity
            )),
            false => ApiError::server("the model's thread has stopped"),
        }
    }
}

/// One choice of a request to decode.
pub struct Job {
    /// The request's id, for the log.
    pub request: Arc<str>,
    pub index: usize,
    pub choice: Choice,
    pub events: Events,
    pub arrived: Instant,
    pub deadline: Instant,
    pub ticket: Ticket,
}

/// A job in a slot, with its text so far.
struct Running<'t> {
    request: Arc<str>,
    index: usize,
    events: Events,
    text: TextStream<'t>,
    stop: StopText,
    tokens: usize,
    /// Prompt tokens found in a spare KV cache.
    cached: usize,
    arrived: Instant,
    deadline: Instant,
    last_token: Option<Instant>,
    /// Characters of the choice's text so far (the echoed prompt's included), and
    /// those sent (the rest held back before a possible stop string).
    chars: usize,
    sent: usize,
    /// Tokens with log-probabilities whose text has not begun to show.
    pending: Vec<Entry>,
    _ticket: Ticket,
}

/// The engine's state between steps.
struct Engine<'m, 't, B: Backend<f32>> {
    model: &'m mut Model<f32, B>,
    tokenizer: &'t Tokenizer,
    shared: &'m Shared,
    batcher: Batcher<B::Buf>,
    waiting: VecDeque<Job>,
    running: HashMap<u64, Running<'t>>,
    next_id: u64,
}

/// Prompt rows a decoding pass takes at most, by default: about two prompts of a
/// few dozen tokens, so that of requests that arrive together the first ones
/// stream while the others' prompts go in (see [`Batcher::with_prefill_rows`]).
pub const DEFAULT_PREFILL_ROWS: usize = 128;

/// Decodes the jobs `jobs` brings with `model`, `slots` at a time with at most
/// `prefill_rows` prompt rows a pass, until the channel closes.
pub fn run<B: Backend<f32>>(
    model: &mut Model<f32, B>,
    tokenizer: &Tokenizer,
    slots: usize,
    prefill_rows: usize,
    jobs: Receiver<Job>,
    shared: &Shared,
) -> Result<()> {
    let mut engine = Engine {
        batcher: Batcher::new(model, slots)?.with_prefill_rows(prefill_rows)?,
        model,
        tokenizer,
        shared,
        waiting: VecDeque::new(),
        running: HashMap::new(),
        next_id: 0,
    };
    loop {
        if engine.batcher.is_empty() && engine.waiting.is_empty() {
            match jobs.recv() {
                Ok(job) => engine.waiting.push_back(job),
                Err(_) => return Ok(()),
            }
        }
        engine.waiting.extend(jobs.try_iter());
        engine.drop_the_ended();
        while !engine.batcher.is_full() {
            let Some(job) = engine.waiting.pop_front() else {
                break;
            };
            engine.start(job);
        }
        let busy = &shared.metrics.busy;
        busy.store(engine.batcher.len(), Ordering::Relaxed);
        if engine.batcher.is_empty() {
            continue;
        }
        match engine.batcher.step(engine.model) {
            Ok(drawn) => {
                for drawn in drawn {
                    engine.deliver(drawn);
                }
            }
            Err(e) => {
                for (id, Running { events, index, .. }) in engine.running.drain() {
                    engine.batcher.remove(id);
                    let failed = Failure::Error(format!("decoding failed: {e}"));
                    events.send(index, Event::Failed(failed));
                }
            }
        }
        busy.store(engine.batcher.len(), Ordering::Relaxed);
    }
}

impl<'t, B: Backend<f32>> Engine<'_, 't, B> {
    /// Removes the jobs past their time limit and — once the shutdown's bound has
    /// passed — all of them, telling their requests why after their tickets are
    /// given back (so a client that hears of the end finds the room free); and
    /// those whose client left or stopped reading.
    fn drop_the_ended(&mut self) {
        let now = Instant::now();
        let ending = self.shared.is_ending();
        let failure = |deadline: Instant| match (ending, now >= deadline) {
            (true, _) => Some(Failure::Shutdown),
            (false, true) => Some(Failure::Timeout),
            (false, false) => None,
        };
        let mut failed: Vec<(Events, usize, Failure)> = Vec::new();
        self.waiting.retain(|job| match failure(job.deadline) {
            Some(failure) => {
                failed.push((job.events.clone(), job.index, failure));
                false
            }
            None => !job.events.is_gone(),
        });
        let batcher = &mut self.batcher;
        self.running.retain(|&id, job| {
            if let Some(failure) = failure(job.deadline) {
                batcher.remove(id);
                failed.push((job.events.clone(), job.index, failure));
                return false;
            }
            if job.events.is_gone() {
                batcher.remove(id);
                let why = match job.events.overflowed() {
                    true => "the client stopped reading",
                    false => "the client left",
                };
                eprintln!(
                    "{} choice {}: {why} after {} tokens; its slot is free",
                    job.request, job.index, job.tokens
                );
                return false;
            }
            true
        });
        for (events, index, failure) in failed {
            events.send(index, Event::Failed(failure));
        }
    }

    /// Puts `job` in a slot: its echoed prompt first (scored by a forward pass
    /// when log-probabilities are asked for), then its tokens from the next step.
    fn start(&mut self, job: Job) {
        let Job {
            request,
            index,
            choice,
            events,
            arrived,
            deadline,
            ticket,
        } = job;
        let mut chars = 0;
        if let Some(echo) = choice.echo {
            let logprobs = match choice.logprobs {
                None => Vec::new(),
                Some(top) => {
                    let t = choice.prompt.len();
                    match self.model.forward(&choice.prompt, 1, t) {
                        Ok(logits) => prompt_entries(&choice.prompt, logits, self.tokenizer, top),
                        Err(e) => {
                            drop(ticket);
                            let failed = Failure::Error(format!("scoring the prompt failed: {e}"));
                            return events.send(index, Event::Failed(failed));
                        }
                    }
                }
            };
            chars = echo.chars().count();
            events.send(
                index,
                Event::Text {
                    text: echo,
                    logprobs,
                },
            );
        }
        if choice.max_tokens == 0 {
            drop(ticket);
            let finish = FinishReason::Length;
            let done = Event::Done {
                finish,
                tokens: 0,
                cached: 0,
            };
            return events.send(index, done);
        }
        let batched = Request {
            prompt: choice.prompt,
            max_tokens: choice.max_tokens,
            sampler: choice.sampler,
            eos: choice.eos,
            logprobs: choice.logprobs,
        };
        let id = self.next_id;
        self.next_id += 1;
        match self.batcher.add(self.model, id, batched) {
            Ok(cached) => {
                let job = Running {
                    request,
                    index,
                    events,
                    text: TextStream::new(self.tokenizer),
                    stop: StopText::new(choice.stop),
                    tokens: 0,
                    cached,
                    arrived,
                    deadline,
                    last_token: None,
                    chars,
                    sent: chars,
                    pending: Vec::new(),
                    _ticket: ticket,
                };
                self.running.insert(id, job);
            }
            Err(e) => {
                drop(ticket);
                events.send(index, Event::Failed(Failure::Error(e.to_string())))
            }
        }
    }

    /// Sends the text of a drawn token to its request (cut before a stop string,
    /// which ends the job) with the tokens whose text begins in it, and the end
    /// when the job ends.
    fn deliver(&mut self, drawn: Drawn) {
        let Some(job) = self.running.get_mut(&drawn.id) else {
            return;
        };
        let metrics = &self.shared.metrics;
        let mut piece = String::new();
        if let Some(token) = drawn.token {
            job.tokens += 1;
            metrics.generated_tokens.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            match job.last_token {
                None => metrics.first_token.observe(now - job.arrived),
                Some(last) => metrics.per_token.observe(now - last),
            }
            job.last_token = Some(now);
            if let Some(scored) = drawn.logprobs {
                let offset = job.chars;
                let scored = Some(scored);
                job.pending.push(Entry {
                    token,
                    scored,
                    offset,
                });
            }
            // The sampler draws only ids the tokenizer has.
            piece = job.text.push(token).unwrap_or_default();
        }
        if drawn.finish.is_some() {
            let text = std::mem::replace(&mut job.text, TextStream::new(self.tokenizer));
            piece += &text.finish();
        }
        job.chars += piece.chars().count();
        let (mut text, stopped) = job.stop.push(&piece);
        let finish = match (stopped, drawn.finish) {
            (true, _) => {
                self.batcher.remove(drawn.id);
                Some(FinishReason::Stop)
            }
            (false, Some(Finish::EndOfText)) => Some(FinishReason::Stop),
            (false, Some(Finish::Length)) => Some(FinishReason::Length),
            (false, None) => None,
        };
        if finish.is_some() && !stopped {
            text += &std::mem::replace(&mut job.stop, StopText::new(Vec::new())).finish();
        }
        job.sent += text.chars().count();
        // The tokens whose text has begun to show — at the end without a stop
        // string, all of them.
        let shown = match (finish, stopped) {
            (Some(_), false) => job.pending.len(),
            _ => (job.pending).partition_point(|e| e.offset < job.sent),
        };
        let logprobs: Vec<Entry> = job.pending.drain(..shown).collect();
        let (events, index) = (job.events.clone(), job.index);
        let (tokens, cached) = (job.tokens, job.cached);
        if finish.is_some() {
            // Its ticket back before its request hears of the end.
            self.running.remove(&drawn.id);
        }
        if !text.is_empty() || !logprobs.is_empty() {
            events.send(index, Event::Text { text, logprobs });
        }
        if let Some(finish) = finish {
            let done = Event::Done {
                finish,
                tokens,
                cached,
            };
            events.send(index, done);
        }
    }
}
