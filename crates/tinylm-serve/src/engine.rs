//! The model's side of the server, on a thread of its own: jobs (one per choice of
//! a request) come in over a channel, wait for a slot, decode together in a
//! [`Batcher`] — one pass per step over every sequence in a slot — and each drawn
//! token goes back to its request as text (whole characters, cut before a stop
//! string) as soon as it is drawn. A job whose request is gone (the client closed
//! the connection) leaves at the next step, freeing its slot.

use anyhow::Result;
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use tinylm::batching::{Batcher, Drawn, Finish, Request};
use tinylm::generate::{Sampler, StopText, TextStream};
use tinylm::kernels::Backend;
use tinylm::Model;
use tinylm_bpe::encode::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

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

/// What the engine tells a request about one of its choices.
#[derive(Debug)]
pub enum Event {
    /// More text.
    Text(String),
    /// The end, after `tokens` drawn tokens; `cached` of the prompt's tokens were
    /// found in the KV cache of an earlier request (not computed again).
    Done {
        finish: FinishReason,
        tokens: usize,
        cached: usize,
    },
    /// Decoding failed.
    Failed(String),
}

/// Where a request hears about its choices: `(choice index, event)`.
pub type Events = UnboundedSender<(usize, Event)>;

/// One choice of a request to decode.
pub struct Job {
    /// The request's id, for the log.
    pub request: Arc<str>,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: Sampler,
    /// Where the text ends (none with `ignore_eos`).
    pub eos: Option<u32>,
    pub stop: Vec<String>,
    pub choice: usize,
    pub events: Events,
}

/// A job in a slot, with its text so far.
struct Running<'t> {
    request: Arc<str>,
    choice: usize,
    events: Events,
    text: TextStream<'t>,
    stop: StopText,
    tokens: usize,
    /// Prompt tokens found in a spare KV cache.
    cached: usize,
}

/// Decodes the jobs `jobs` brings with `model`, `slots` at a time, until the
/// channel closes.
pub fn run<B: Backend<f32>>(
    model: &mut Model<f32, B>,
    tokenizer: &Tokenizer,
    slots: usize,
    jobs: Receiver<Job>,
) -> Result<()> {
    let mut batcher = Batcher::new(model, slots)?;
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut running: HashMap<u64, Running> = HashMap::new();
    let mut next_id = 0;
    loop {
        if batcher.is_empty() && waiting.is_empty() {
            match jobs.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => return Ok(()),
            }
        }
        waiting.extend(jobs.try_iter());
        // Requests whose client left free their slots.
        waiting.retain(|job| !job.events.is_closed());
        running.retain(|&id, job| {
            let gone = job.events.is_closed();
            if gone {
                batcher.remove(id);
                eprintln!(
                    "{} choice {}: the client left after {} tokens; its slot is free",
                    job.request, job.choice, job.tokens
                );
            }
            !gone
        });
        while !batcher.is_full() {
            let Some(job) = waiting.pop_front() else {
                break;
            };
            let request = Request {
                prompt: job.prompt,
                max_tokens: job.max_tokens,
                sampler: job.sampler,
                eos: job.eos,
            };
            let id = next_id;
            next_id += 1;
            match batcher.add(model, id, request) {
                Ok(cached) => {
                    let job = Running {
                        request: job.request,
                        choice: job.choice,
                        events: job.events,
                        text: TextStream::new(tokenizer),
                        stop: StopText::new(job.stop),
                        tokens: 0,
                        cached,
                    };
                    running.insert(id, job);
                }
                Err(e) => {
                    let _ = job.events.send((job.choice, Event::Failed(e.to_string())));
                }
            }
        }
        if batcher.is_empty() {
            continue;
        }
        match batcher.step(model) {
            Ok(drawn) => {
                for drawn in drawn {
                    deliver(drawn, &mut batcher, &mut running, tokenizer);
                }
            }
            Err(e) => {
                for (id, job) in running.drain() {
                    batcher.remove(id);
                    let failed = Event::Failed(format!("decoding failed: {e}"));
                    let _ = job.events.send((job.choice, failed));
                }
            }
        }
    }
}

/// Sends the text of a drawn token to its request (cut before a stop string, which
/// ends the job), and the end when the job ends.
fn deliver<'t, Buf: tinylm::kernels::Buffer>(
    drawn: Drawn,
    batcher: &mut Batcher<Buf>,
    running: &mut HashMap<u64, Running<'t>>,
    tokenizer: &'t Tokenizer,
) {
    let Some(job) = running.get_mut(&drawn.id) else {
        return;
    };
    let mut piece = String::new();
    if let Some(token) = drawn.token {
        job.tokens += 1;
        // The sampler draws only ids the tokenizer has.
        piece = job.text.push(token).unwrap_or_default();
    }
    if drawn.finish.is_some() {
        piece += &std::mem::replace(&mut job.text, TextStream::new(tokenizer)).finish();
    }
    let (mut text, stopped) = job.stop.push(&piece);
    let finish = match (stopped, drawn.finish) {
        (true, _) => {
            batcher.remove(drawn.id);
            Some(FinishReason::Stop)
        }
        (false, Some(Finish::EndOfText)) => Some(FinishReason::Stop),
        (false, Some(Finish::Length)) => Some(FinishReason::Length),
        (false, None) => None,
    };
    if finish.is_some() && !stopped {
        text += &std::mem::replace(&mut job.stop, StopText::new(Vec::new())).finish();
    }
    if !text.is_empty() {
        let _ = job.events.send((job.choice, Event::Text(text)));
    }
    if let Some(finish) = finish {
        let (tokens, cached) = (job.tokens, job.cached);
        let done = Event::Done {
            finish,
            tokens,
            cached,
        };
        let _ = job.events.send((job.choice, done));
        running.remove(&drawn.id);
    }
}
