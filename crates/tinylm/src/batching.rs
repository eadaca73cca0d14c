//! Continuous batching: many sequences decoded together by one [`Model::decode`]
//! pass per step over every active sequence. A sequence joins at the next step —
//! its prompt goes through in that pass, beside one token of each sequence that
//! is decoding — and leaves when it ends or is removed, freeing its slot (and its
//! KV cache, kept for the next sequence). A pass takes at most `context_length`
//! rows: every decoding sequence's token, then prompts — at most
//! [`Batcher::with_prefill_rows`] rows of them — a long one spread over several
//! passes if others fill the first.
//!
//! Why bound the prompts' rows: sequences that arrive together would otherwise all
//! wait for one pass over every prompt before any draws its first token; in passes
//! of a few prompts each, the first ones start to stream while the rest go in, and
//! the sequences already decoding draw a token every pass.
//!
//! An ended sequence's cache keeps the tokens it holds: a new sequence takes the
//! spare cache that shares the longest start with its prompt and prefills only the
//! rest (a client sending the same instructions, few-shot examples or conversation
//! again and again) — the positions kept are the ones a prefill would compute.
//!
//! A sequence may ask for the log-probabilities of the tokens it draws
//! ([`Request::logprobs`]): they come from the same row of logits as the draw.

use crate::generate::Sampler;
use crate::kernels::{Backend, Buffer};
use crate::logprobs::{token_logprobs, TokenLogprobs};
use crate::model::{KvCache, Model, NewTokens};
use crate::{Error, Result};
use rayon::prelude::*;

/// A sequence to decode: its prompt (at least one token), at most `max_tokens` new
/// tokens drawn by `sampler`, ending early at `eos` when given.
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: Sampler,
    pub eos: Option<u32>,
    /// `Some(k)`: each drawn token comes with its log-probability and the `k` most
    /// probable tokens' (among the ids `sampler` may draw).
    pub logprobs: Option<usize>,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The model drew the end-of-text token (which is not returned).
    EndOfText,
    /// It drew `max_tokens` tokens.
    Length,
}

/// What a step did for one sequence whose new tokens all went through its pass: the
/// token it drew, unless it drew the end of the text, and whether it ended; the
/// token's log-probabilities when its request asked for them.
#[derive(Clone, Debug, PartialEq)]
pub struct Drawn {
    pub id: u64,
    pub token: Option<u32>,
    pub finish: Option<Finish>,
    pub logprobs: Option<TokenLogprobs>,
}

struct Sequence<Buf> {
    id: u64,
    cache: KvCache<Buf>,
    /// The tokens whose keys and values `cache` holds, in order.
    cached: Vec<u32>,
    /// Tokens not yet in the cache: what is left of the prompt, or the last token
    /// drawn.
    feed: Vec<u32>,
    sampler: Sampler,
    /// Tokens it may still draw.
    left: usize,
    eos: Option<u32>,
    logprobs: Option<usize>,
}

/// The sequences decoded together, at most `slots` of them.
pub struct Batcher<Buf> {
    slots: usize,
    context_length: usize,
    /// Prompt rows a pass takes at most, beside the decoding sequences' tokens.
    prefill_rows: usize,
    sequences: Vec<Sequence<Buf>>,
    /// The KV caches of ended sequences and the tokens each holds, for the next ones.
    spare: Vec<(KvCache<Buf>, Vec<u32>)>,
}

impl<Buf: Buffer> Batcher<Buf> {
    /// Room for `slots` sequences of `model` (`1 ≤ slots ≤ context_length`, so a
    /// pass always holds every decoding sequence's token).
    pub fn new<B: Backend<f32, Buf = Buf>>(model: &Model<f32, B>, slots: usize) -> Result<Self> {
        let context_length = model.config().context_length;
        if !(1..=context_length).contains(&slots) {
            return Err(Error::Config(format!(
                "slots must be between 1 and the context length {context_length}, got {slots}"
            )));
        }
        Ok(Batcher {
            slots,
            context_length,
            prefill_rows: context_length,
            sequences: Vec::new(),
            spare: Vec::new(),
        })
    }

    /// At most `rows` prompt rows in a pass (at least 1; the default is the whole
    /// pass): the ones that do not fit go in the next passes.
    pub fn with_prefill_rows(self, rows: usize) -> Result<Self> {
        if rows == 0 {
            return Err(Error::Config(
                "a pass must take at least one prompt row, got 0".into(),
            ));
        }
        Ok(Batcher {
            prefill_rows: rows,
            ..self
        })
    }

    /// Sequences being decoded.
    pub fn len(&self) -> usize {
        self.sequences.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }

    /// Whether every slot is taken.
    pub fn is_full(&self) -> bool {
        self.sequences.len() == self.slots
    }

    /// Decodes `request` as sequence `id` from the next step on. The prompt and the
    /// new tokens must fit in the context (a sequence never slides its window), the
    /// prompt's ids in the vocabulary, and a slot must be free. Returns how many of
    /// the prompt's tokens were found in a spare cache (they are not prefilled
    /// again); all but its last at most, whose logits draw the first new token.
    pub fn add<B: Backend<f32, Buf = Buf>>(
        &mut self,
        model: &Model<f32, B>,
        id: u64,
        request: Request,
    ) -> Result<usize> {
        let Request {
            prompt,
            max_tokens,
            sampler,
            eos,
            logprobs,
        } = request;
        let vocab = model.config().vocab_size;
        if self.is_full() {
            return Err(Error::Invalid(format!(
                "all {} slots are taken",
                self.slots
            )));
        }
        if prompt.is_empty() || max_tokens == 0 {
            return Err(Error::Invalid(
                "a sequence needs a prompt token and at least one new token".into(),
            ));
        }
        if prompt.len() + max_tokens > self.context_length {
            return Err(Error::Invalid(format!(
                "{} prompt tokens + {max_tokens} new ones exceed the context length {}",
                prompt.len(),
                self.context_length
            )));
        }
        if let Some(i) = prompt.iter().position(|&t| t as usize >= vocab) {
            return Err(Error::Invalid(format!(
                "prompt token id {} at position {i} is >= vocab_size {vocab}",
                prompt[i]
            )));
        }
        let shared = |cached: &[u32]| {
            cached
                .iter()
                .zip(&prompt)
                .take_while(|(a, b)| a == b)
                .count()
        };
        let best = (0..self.spare.len())
            .map(|i| (shared(&self.spare[i].1), i))
            .max();
        let ((mut cache, mut cached), found) = match best {
            Some((found, i)) => (self.spare.swap_remove(i), found),
            None => ((model.new_cache()?, Vec::new()), 0),
        };
        let reused = found.min(prompt.len() - 1);
        cache.truncate(reused);
        cached.truncate(reused);
        self.sequences.push(Sequence {
            id,
            cache,
            cached,
            feed: prompt[reused..].to_vec(),
            sampler,
            left: max_tokens,
            eos,
            logprobs,
        });
        Ok(reused)
    }

    /// Stops decoding sequence `id` (its client left, or its text reached a stop
    /// string), freeing its slot; whether it was there.
    pub fn remove(&mut self, id: u64) -> bool {
        match self.sequences.iter().position(|s| s.id == id) {
            Some(i) => {
                let Sequence { cache, cached, .. } = self.sequences.remove(i);
                self.spare.push((cache, cached));
                true
            }
            None => false,
        }
    }

    /// One decoding pass over every sequence — each decoding one its last token,
    /// each prefilling as much of its prompt as the pass's `context_length` rows
    /// and the prefill bound leave — then a token drawn for each whose feed went
    /// through whole (in parallel). Ended sequences leave. Returns what each drew,
    /// in the order they joined.
    pub fn step<B: Backend<f32, Buf = Buf>>(
        &mut self,
        model: &mut Model<f32, B>,
    ) -> Result<Vec<Drawn>> {
        let decoding = self.sequences.iter().filter(|s| s.feed.len() == 1).count();
        let mut rows_left = (self.context_length - decoding).min(self.prefill_rows);
        let takes: Vec<usize> = (self.sequences.iter())
            .map(|s| match s.feed.len() {
                1 => 1,
                n => {
                    let take = n.min(rows_left);
                    rows_left -= take;
                    take
                }
            })
            .collect();
        let mut pass: Vec<NewTokens<Buf>> = (self.sequences.iter_mut())
            .zip(&takes)
            .filter(|(_, &take)| take > 0)
            .map(|(s, &take)| NewTokens {
                cache: &mut s.cache,
                tokens: &s.feed[..take],
            })
            .collect();
        if pass.is_empty() {
            return Ok(Vec::new());
        }
        let vocab = model.config().vocab_size;
        let logits = model.decode(&mut pass)?;
        drop(pass);
        let in_pass = (self.sequences.iter_mut())
            .zip(takes)
            .filter(|(_, take)| *take > 0);
        let drawn: Vec<Option<Drawn>> = in_pass
            .zip(logits.chunks_exact(vocab))
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|((s, take), logits)| {
                s.cached.extend(s.feed.drain(..take));
                if !s.feed.is_empty() {
                    return None; // more of its prompt goes in the next pass
                }
                let token = s.sampler.sample(logits);
                if Some(token) == s.eos {
                    return Some(Drawn {
                        id: s.id,
                        token: None,
                        finish: Some(Finish::EndOfText),
                        logprobs: None,
                    });
                }
                s.left -= 1;
                s.feed.push(token);
                let logprobs =
                    (s.logprobs).map(|k| token_logprobs(s.sampler.candidates(logits), token, k));
                Some(Drawn {
                    id: s.id,
                    token: Some(token),
                    finish: (s.left == 0).then_some(Finish::Length),
                    logprobs,
                })
            })
            .collect();
        let drawn: Vec<Drawn> = drawn.into_iter().flatten().collect();
        for d in &drawn {
            if d.finish.is_some() {
                self.remove(d.id);
            }
        }
        Ok(drawn)
    }
}
