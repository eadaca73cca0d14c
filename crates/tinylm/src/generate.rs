//! Text generation (SPEC §4): temperature, top-k and top-p (nucleus) sampling from
//! the last position's logits, the generation loop over the model's KV cache, and
//! incremental UTF-8 decoding for streaming the text.

use crate::kernels::cpu::simd::{sum_by, vectorized};
use crate::kernels::float::exp_f32;
use crate::kernels::Backend;
use crate::model::{Model, NewTokens};
use crate::{Error, Result};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::ops::ControlFlow;
use tinylm_bpe::encode::Tokenizer;

/// Sampling settings: the temperature and nucleus a sampler starts from when its
/// caller names none.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
}

impl Sampling {
    /// `tinylm generate`'s, the quickstart's samples' and an exported model's
    /// `generation_config.json`: a little sharper than the model's distribution, the
    /// least probable 5% of it cut.
    pub const DEFAULT: Sampling = Sampling {
        temperature: 0.8,
        top_p: 0.95,
    };
    /// The model's distribution unchanged: OpenAI's completions API (`tinylm serve`)
    /// and the Python package's `Model.generate` (whose signature spells it out).
    pub const UNCHANGED: Sampling = Sampling {
        temperature: 1.0,
        top_p: 1.0,
    };
}

/// Turns next-token logits `(V,)` into a token id.
///
/// `temperature == 0` is greedy (argmax, ties to the lowest id). Otherwise the
/// distribution is `softmax(logits / temperature)` (max subtracted), truncated to the
/// `top_k` most probable tokens when set, then to the nucleus: the SMALLEST set of
/// most probable tokens whose probabilities sum to `≥ top_p`; the kept
/// probabilities are renormalized and one token is drawn with a seeded RNG.
/// Equal probabilities are ordered by lower id first, so the result is a function
/// of the logits and the seed alone. The draw walks the kept tokens in the order
/// the nucleus search leaves them (itself a function of the logits), not sorted:
/// the same distribution without the sort.
#[derive(Clone, Debug)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    top_k: Option<usize>,
    rng: ChaCha8Rng,
    /// Only ids below this are drawn ([`Sampler::vocabulary`]).
    vocabulary: usize,
    /// Scratch: one [`Ranked`] key per token, reused across calls.
    ranked: Vec<u64>,
}

/// Entries the nucleus search sorts and walks rather than halves further.
const NUCLEUS_SORTED: usize = 64;

/// A token and its probability as one `u64` whose natural order is the sampler's:
/// most probable first (`f32::total_cmp`, descending, in the high half), the lower
/// id first among equals (the low half): the nucleus search selects plain
/// integers, faster than comparing `(id, probability)` pairs with a closure.
struct Ranked;

impl Ranked {
    #[inline(always)]
    fn key(id: u32, p: f32) -> u64 {
        let bits = p.to_bits();
        // `total_cmp`'s order as an unsigned one, inverted for "larger first".
        let ascending = bits ^ (((bits as i32 >> 31) as u32) | 0x8000_0000);
        (u64::from(!ascending) << 32) | u64::from(id)
    }

    fn id(key: u64) -> u32 {
        key as u32
    }

    #[inline(always)]
    fn prob(key: u64) -> f32 {
        let ascending = !((key >> 32) as u32);
        let bits = if ascending & 0x8000_0000 != 0 {
            ascending ^ 0x8000_0000
        } else {
            !ascending
        };
        f32::from_bits(bits)
    }
}

impl Sampler {
    /// Checks `temperature ≥ 0`, `0 < top_p ≤ 1` and `top_k ≥ 1`.
    pub fn new(temperature: f32, top_p: f32, top_k: Option<usize>, seed: u64) -> Result<Self> {
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(Error::Config(format!(
                "temperature must be a finite number ≥ 0, got {temperature}"
            )));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(Error::Config(format!(
                "top_p must be in (0, 1], got {top_p}"
            )));
        }
        if top_k == Some(0) {
            return Err(Error::Config("top_k must be at least 1".into()));
        }
        Ok(Sampler {
            temperature,
            top_p,
            top_k,
            rng: ChaCha8Rng::seed_from_u64(seed),
            vocabulary: usize::MAX,
            ranked: Vec::new(),
        })
    }

    /// Draws only ids below `n` — those a tokenizer of `n` tokens can decode — from
    /// the logits of a model whose `vocab_size` is larger (trained with a tokenizer
    /// that came out smaller than the model's vocabulary).
    pub fn vocabulary(self, n: usize) -> Self {
        Sampler {
            vocabulary: n,
            ..self
        }
    }

    /// Greedy decoding: always the most probable token.
    pub fn greedy() -> Self {
        Self::new(0.0, 1.0, None, 0).expect("greedy settings are valid")
    }

    /// The truncated, renormalized distribution a non-greedy sample is drawn from:
    /// `(id, probability)` pairs, most probable first.
    pub fn distribution(&mut self, logits: &[f32]) -> Vec<(u32, f32)> {
        let scale = self.nucleus(logits);
        self.ranked.sort_unstable();
        (self.ranked.iter())
            .map(|&key| (Ranked::id(key), Ranked::prob(key) * scale))
            .collect()
    }

    /// Leaves the kept tokens' [`Ranked`] keys in `ranked`, in no particular order
    /// (probabilities not yet renormalized); returns the factor that renormalizes
    /// them.
    fn nucleus(&mut self, logits: &[f32]) -> f32 {
        let inv_t = 1.0 / self.temperature.max(f32::MIN_POSITIVE);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let ranked = &mut self.ranked;
        ranked.resize(logits.len(), 0);
        // The softmax's numerators and the keys in one vectorized pass (`exp_f32`
        // is within ~2 ulp of `exp`).
        vectorized(
            #[inline(always)]
            || {
                for ((key, &l), id) in ranked.iter_mut().zip(logits).zip(0u32..) {
                    *key = Ranked::key(id, exp_f32((l - max) * inv_t));
                }
            },
        );
        let k = self.top_k.unwrap_or(usize::MAX).min(ranked.len());
        if k < ranked.len() {
            // The k most probable, in no order (k ≥ 1: `new` refuses 0).
            ranked.select_nth_unstable(k - 1);
            ranked.truncate(k);
        }
        let kept = match self.top_p < 1.0 {
            // top-p is relative to what top-k kept (renormalized), as in Hugging Face.
            // A tiny relative tolerance keeps rounding in the sums from admitting
            // one token more than the smallest nucleus.
            true => {
                let target = self.top_p as f64 * mass(ranked) * (1.0 - 1e-6);
                let (len, kept) = nucleus_prefix(ranked, target);
                ranked.truncate(len);
                kept
            }
            false => mass(ranked),
        };
        (1.0 / kept) as f32
    }

    /// The logits `(V,)` of the ids it may draw: those below its
    /// [`Sampler::vocabulary`].
    pub fn candidates<'l>(&self, logits: &'l [f32]) -> &'l [f32] {
        &logits[..logits.len().min(self.vocabulary)]
    }

    /// Picks the next token from logits `(V,)`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let logits = self.candidates(logits);
        if self.temperature == 0.0 {
            return argmax(logits);
        }
        let u: f32 = self.rng.random();
        let scale = self.nucleus(logits);
        let mut sum = 0.0;
        for &key in &self.ranked {
            sum += Ranked::prob(key) * scale;
            if u < sum {
                return Ranked::id(key);
            }
        }
        // Rounding left the sum just below u: the last kept token.
        self.ranked.last().map_or(0, |&key| Ranked::id(key))
    }
}

/// The sum of the probabilities of `keys`.
fn mass(keys: &[u64]) -> f64 {
    vectorized(
        #[inline(always)]
        || sum_by(keys, |key| Ranked::prob(key) as f64),
    )
}

/// Moves the smallest set of most probable `keys` whose probabilities sum to at
/// least `target` (the top-p nucleus) to the front; returns its length and its sum
/// (all of `keys` when their sum falls short). A quickselect weighted by the
/// probabilities: the entries left in play are split at their median key, and the
/// search goes on in the more probable half if it (with everything more probable)
/// reaches the target, else in the less probable one — about twice a selection's
/// work over the vocabulary; the last few dozen are sorted and walked. Sorting the
/// whole nucleus instead (hundreds of a barely trained model's 2,048 tokens) took
/// most of a sample's time: 18 µs a sample at T 0.8 and top-p 0.95, 6 µs now, with
/// the vectorized softmax, on Zen 5.
fn nucleus_prefix(keys: &mut [u64], target: f64) -> (usize, f64) {
    // keys[..lo] is in the nucleus (its sum `before` < target); the cut is in lo..=hi.
    let (mut lo, mut hi, mut before) = (0, keys.len(), 0.0);
    while hi - lo > NUCLEUS_SORTED {
        let mid = lo + (hi - lo) / 2;
        keys[lo..hi].select_nth_unstable(mid - lo);
        let left = mass(&keys[lo..mid]);
        if before + left >= target {
            hi = mid;
        } else {
            (lo, before) = (mid, before + left);
        }
    }
    keys[lo..hi].sort_unstable();
    for (i, &key) in keys[lo..hi].iter().enumerate() {
        before += Ranked::prob(key) as f64;
        if before >= target {
            return (lo + i + 1, before);
        }
    }
    (hi, before)
}

/// Index of the largest logit, the lowest index among equals.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Continues `prompt` with at most `max_new_tokens` tokens drawn by `sampler`; stops
/// early at `eos` (which is not returned) or when `on_token`, called with each new
/// token as soon as it is drawn, returns `Break`. Returns the new tokens.
///
/// The model sees at most `context_length` tokens: a longer prompt keeps its last
/// ones. The prompt goes through the model in one decoding pass that fills the KV
/// cache ([`Model::decode`] of one sequence), then each new token costs one
/// [`Model::decode_step`]. When the window is full, the cache is rebuilt from the
/// last `context_length` tokens in one pass: every token is predicted from exactly
/// the last `context_length` tokens, as a full forward pass over that window would
/// (RoPE positions restart at 0 in the new window, as they do in training), at the
/// price of a pass over the whole window per token once the window slides. An
/// empty prompt starts from `eos`.
pub fn generate<B: Backend<f32>>(
    model: &mut Model<f32, B>,
    prompt: &[u32],
    max_new_tokens: usize,
    sampler: &mut Sampler,
    eos: Option<u32>,
    mut on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Vec<u32>> {
    let ctx = model.config().context_length;
    let start = start_tokens(prompt, eos, model.config().vocab_size)?;
    let mut out = Vec::new();
    if max_new_tokens == 0 {
        return Ok(out);
    }
    // `window`: the tokens the model sees; the cache holds its first `cached`.
    let mut window = start[start.len().saturating_sub(ctx)..].to_vec();
    let mut cache = model.new_cache()?;
    let mut cached = 0;
    loop {
        if window.len() > ctx {
            window.drain(..window.len() - ctx);
            cache.clear();
            cached = 0;
        }
        let tokens = &window[cached..];
        let logits = model.decode(&mut [NewTokens {
            cache: &mut cache,
            tokens,
        }])?;
        cached = window.len();
        let token = sampler.sample(logits);
        if Some(token) == eos {
            break;
        }
        out.push(token);
        window.push(token);
        if on_token(token).is_break() || out.len() == max_new_tokens {
            break;
        }
    }
    Ok(out)
}

/// What generation starts from: `prompt`, checked against the vocabulary of
/// `vocab_size` ids, or for an empty prompt `eos` (a new document).
pub fn start_tokens(prompt: &[u32], eos: Option<u32>, vocab_size: usize) -> Result<Vec<u32>> {
    if let Some((i, id)) = (prompt.iter().enumerate()).find(|&(_, &id)| id as usize >= vocab_size) {
        return Err(Error::Invalid(format!(
            "prompt token id {id} at position {i} is >= vocab_size {vocab_size}"
        )));
    }
    match (prompt.is_empty(), eos) {
        (false, _) => Ok(prompt.to_vec()),
        (true, Some(eos)) => Ok(vec![eos]),
        (true, None) => Err(Error::Invalid(
            "empty prompt and no end-of-text token to start from".into(),
        )),
    }
}

/// Turns generated ids into text as they come: each [`TextStream::push`] returns the
/// newly completed UTF-8 text, holding back the bytes of a character that a later
/// token may complete; malformed bytes become U+FFFD, as in `Tokenizer::decode`.
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
}

impl<'t> TextStream<'t> {
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        TextStream {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text it completes (often empty mid-character).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.pending
            .extend_from_slice(&self.tokenizer.decode_bytes(&[id])?);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    text.push_str(s);
                    self.pending.clear();
                    return Ok(text);
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    text.push_str(std::str::from_utf8(&self.pending[..valid]).expect("valid"));
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return Ok(text);
                        }
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// The text of the held-back bytes at the end of generation (U+FFFD for an
    /// unfinished character).
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

/// Cuts streamed text at the first occurrence of any of some stop strings (the
/// OpenAI API's `stop`): each [`StopText::push`] returns the text that can be shown
/// now — all but a tail that may be the start of a stop string — and whether a stop
/// string was reached, in which case the text ends before it.
pub struct StopText {
    stops: Vec<String>,
    held: String,
}

impl StopText {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> Self {
        StopText {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds `piece`; returns the text now safe to show, and `true` once a stop
    /// string is reached (the text then ends just before it; push no more).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        let first_stop = (self.stops.iter())
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = first_stop {
            self.held.truncate(at);
            return (std::mem::take(&mut self.held), true);
        }
        // Hold back the longest tail that begins some stop string.
        let keep_from = (self.held.char_indices())
            .map(|(i, _)| i)
            .find(|&i| (self.stops.iter()).any(|stop| stop.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let tail = self.held.split_off(keep_from);
        (std::mem::replace(&mut self.held, tail), false)
    }

    /// What is held back when the text ends without a stop string.
    pub fn finish(self) -> String {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::Ranked;

    #[test]
    fn ranked_keys_order_as_probabilities_then_ids_and_keep_both() {
        let probs = [
            0.5,
            0.0,
            1.0,
            f32::MIN_POSITIVE / 4.0,
            0.5,
            f32::INFINITY,
            f32::NAN,
            -f32::NAN,
            3e-8,
            1.0,
        ];
        let mut pairs: Vec<(u32, f32)> = (0u32..).zip(probs).collect();
        pairs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut keys: Vec<u64> = (0u32..)
            .zip(probs)
            .map(|(id, p)| Ranked::key(id, p))
            .collect();
        keys.sort_unstable();
        let back: Vec<(u32, f32)> = keys
            .iter()
            .map(|&k| (Ranked::id(k), Ranked::prob(k)))
            .collect();
        assert_eq!(format!("{back:?}"), format!("{pairs:?}"));
        for (&(_, p), &(_, q)) in back.iter().zip(&pairs) {
            assert_eq!(p.to_bits(), q.to_bits());
        }
    }
}
