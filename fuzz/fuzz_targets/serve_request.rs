//! A request body of `tinylm serve`, from any client on the network: the JSON of
//! `POST /v1/completions` (`CompletionRequest::parse`, then `check` against a
//! small model's description and the server's limits, and the admission of its
//! choices), of `POST /tokenize` and of `POST /detokenize`. A refusal is a 4xx
//! with OpenAI's error object and a message; an accepted completion keeps every
//! limit — prompts non-empty, their ids in the tokenizer, each prompt and
//! `max_tokens` within the context, all prompts within `max_prompt_tokens`,
//! `max_tokens` within its cap (0 only with `echo`), `n` and `logprobs` within
//! theirs — and its choices build the engine's jobs; tokenized text decodes back.
//! Parsing and checking allocate at most 64 bytes per input byte beyond 1 MiB.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use tinylm_bpe::encode::Tokenizer;
use tinylm_fuzz::{within, Bound};
use tinylm_serve::limits::{Admission, Limits};
use tinylm_serve::request::{CompletionRequest, ServedModel, MAX_LOGPROBS};
use tinylm_serve::tokens::{ConversionRequest, DetokenizeRequest, TokenizeRequest};
use tinylm_serve::ApiError;

const BOUND: Bound = Bound {
    per_byte: 64,
    fixed: 1 << 20,
};
const SLOTS: usize = 4;

/// A model of context 64 whose tokenizer has the 256 bytes, `th`, `the`, ` t` and
/// `<|endoftext|>`.
fn model() -> &'static ServedModel {
    static MODEL: OnceLock<ServedModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let mut vocab: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        vocab.extend([b"th".to_vec(), b"the".to_vec(), b" t".to_vec()]);
        let merges = vec![
            (b"t".to_vec(), b"h".to_vec()),
            (b"th".to_vec(), b"e".to_vec()),
            (b" ".to_vec(), b"t".to_vec()),
        ];
        let specials = ["<|endoftext|>".to_string()];
        let tokenizer = Tokenizer::new(vocab, &merges, &specials).expect("a small tokenizer");
        let eos = tokenizer.encode(&specials[0])[0];
        ServedModel {
            name: "tiny".into(),
            context_length: 64,
            tokenizer,
            eos,
            created: 0,
        }
    })
}

fn limits() -> Limits {
    Limits {
        max_prompt_tokens: 100,
        max_completion_tokens: 40,
        max_queue: 8,
        ..Limits::defaults(model().context_length, SLOTS)
    }
}

/// A refusal: a 4xx with OpenAI's error object and a message.
fn refusal(e: &ApiError) {
    assert!(e.status().is_client_error(), "{e:?}");
    let message = e.body()["error"]["message"].as_str().map(str::to_string);
    assert!(message.is_some_and(|m| !m.is_empty()), "{e:?}");
}

fn completion(data: &[u8]) {
    let (model, limits) = (model(), limits());
    let checked = within("parse and check", data.len(), BOUND, || {
        CompletionRequest::parse(data).and_then(|r| r.check(model, &limits))
    });
    let completion = match checked {
        Ok(completion) => completion,
        Err(e) => return refusal(&e),
    };
    let ctx = model.context_length;
    let vocab = model.tokenizer.vocab_size();
    assert!(!completion.prompts.is_empty());
    assert!((1..=128).contains(&completion.n));
    assert!(completion.max_tokens <= limits.max_completion_tokens);
    assert!(completion.max_tokens >= 1 || completion.echo);
    assert!(completion.logprobs.is_none_or(|k| k <= MAX_LOGPROBS));
    let mut total = 0;
    for prompt in &completion.prompts {
        assert!(!prompt.ids.is_empty());
        assert!(prompt.ids.iter().all(|&id| (id as usize) < vocab));
        assert!(prompt.ids.len() + completion.max_tokens <= ctx);
        total += prompt.ids.len();
    }
    assert!(total <= limits.max_prompt_tokens);
    assert_eq!(completion.prompt_tokens(), total);
    let choices = completion.choices();
    assert_eq!(choices, completion.prompts.len() * completion.n);
    for index in [0, choices - 1] {
        let choice = completion.choice(index, model);
        assert_eq!(choice.prompt, completion.prompts[index / completion.n].ids);
        assert_eq!(choice.echo.is_some(), completion.echo);
        assert_eq!(choice.max_tokens, completion.max_tokens);
    }
    match Admission::new(SLOTS, limits.max_queue).admit(choices) {
        Ok(tickets) => assert_eq!(tickets.len(), choices),
        Err(e) => {
            refusal(&e);
            assert!(choices > SLOTS + limits.max_queue);
        }
    }
}

fn tokenize(data: &[u8]) {
    let tokenizer = &model().tokenizer;
    let request = within("tokenize", data.len(), BOUND, || TokenizeRequest::parse(data));
    let request = match request {
        Ok(request) => request,
        Err(e) => return refusal(&e),
    };
    let (answer, n) = request.answer(tokenizer).expect("any text tokenizes");
    let tokens = answer["tokens"].as_array().expect("a list of tokens");
    assert_eq!(tokens.len(), n);
    let mut bytes = Vec::new();
    for token in tokens {
        let id = token.as_u64().or_else(|| token["id"].as_u64()).expect("an id");
        bytes.extend(tokenizer.decode_bytes(&[id as u32]).expect("an id of the tokenizer"));
    }
    assert_eq!(bytes, request.content.as_bytes());
}

fn detokenize(data: &[u8]) {
    let tokenizer = &model().tokenizer;
    let request = within("detokenize", data.len(), BOUND, || DetokenizeRequest::parse(data));
    let request = match request {
        Ok(request) => request,
        Err(e) => return refusal(&e),
    };
    match request.answer(tokenizer) {
        Ok((answer, n)) => {
            assert!(answer["content"].is_string());
            assert_eq!(n, request.tokens.len());
        }
        Err(e) => {
            refusal(&e);
            let vocab = tokenizer.vocab_size();
            assert!(request.tokens.iter().any(|&id| id as usize >= vocab));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    completion(data);
    tokenize(data);
    detokenize(data);
});
