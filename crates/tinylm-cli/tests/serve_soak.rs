//! A soak of `tinylm serve` on loopback: requests from 32 connections at once,
//! valid ones mixed with malformed JSON, oversized bodies, wrong and missing keys,
//! prompts and `max_tokens` past the limits, clients that leave mid-stream and
//! clients that read slowly. Every valid greedy answer must be `tinylm generate`'s
//! text, every bad request its 4xx; afterwards the server has not panicked, its
//! resident memory is within [`MEMORY_BOUND_KIB`] of its size once warm, its
//! `/metrics` counts what was sent, and SIGTERM ends it with exit code 0.
//!
//! `TINYLM_SOAK_REQUESTS` sets the number of requests (default 2,000, a few
//! seconds on two cores).

#[allow(dead_code)]
mod server;

use serde_json::{json, Value};
use server::{bearer, completion, fixture, generated, streamed_text, Connection, Server};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CONNECTIONS: usize = 32;
const KEY: &str = "soak-key-0b7e";
const MAX_BODY_BYTES: usize = 8192;
const MAX_PROMPT_TOKENS: usize = 64;
const MAX_COMPLETION_TOKENS: usize = 200;
/// Tokens a client that leaves mid-stream asks for.
const LEFT_MAX_TOKENS: usize = MAX_COMPLETION_TOKENS;
/// How far the server's resident memory may stay above its size once warm, after
/// the soak: the allocator keeps some freed memory for reuse.
const MEMORY_BOUND_KIB: u64 = 16 << 10;

const PROMPTS: [&str; 8] = [
    "Once upon a time",
    "The little dog",
    "Lily and Tom went to the park",
    "One day, a big red ball",
    "The sun was",
    "Mom said",
    "There was a cat who liked to",
    "In the garden,",
];
const MAX_TOKENS: [usize; 2] = [12, 40];

/// What a request was, by the response it must get.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Whole,
    Streamed,
    SlowReader,
    LeavesMidStream,
    Malformed,
    Oversized,
    WrongKey,
    NoKey,
    PromptTooLong,
    TooManyTokens,
    Tokenize,
}

/// The mix: valid requests are half of it.
const MIX: [Kind; 16] = [
    Kind::Whole,
    Kind::Streamed,
    Kind::Malformed,
    Kind::Whole,
    Kind::SlowReader,
    Kind::WrongKey,
    Kind::Streamed,
    Kind::Oversized,
    Kind::Whole,
    Kind::LeavesMidStream,
    Kind::NoKey,
    Kind::Streamed,
    Kind::PromptTooLong,
    Kind::Tokenize,
    Kind::TooManyTokens,
    Kind::Malformed,
];

/// What the clients sent and were answered, to hold `/metrics` against.
#[derive(Default)]
struct Tally {
    /// Requests by route and status.
    requests: BTreeMap<(String, u16), u64>,
    /// Prompt tokens of the completions admitted, and tokens drawn in the
    /// completions that ran to their end.
    prompt_tokens: u64,
    completion_tokens: u64,
    left_mid_stream: u64,
    by_kind: BTreeMap<String, u64>,
}

struct Soak {
    server: Server,
    /// `tinylm generate`'s text of (prompt, max_tokens).
    expected: HashMap<(usize, usize), String>,
    tally: Mutex<Tally>,
}

impl Soak {
    fn count(&self, kind: Kind, route: &str, status: u16, prompt: u64, completion: u64) {
        let mut tally = self.tally.lock().unwrap();
        *tally
            .requests
            .entry((route.to_string(), status))
            .or_default() += 1;
        tally.prompt_tokens += prompt;
        tally.completion_tokens += completion;
        *tally.by_kind.entry(format!("{kind:?}")).or_default() += 1;
    }

    /// Sends request `n` (of all, `client` + a multiple of [`CONNECTIONS`]) of
    /// client `client` on `connection` (a new one after an answer that may close
    /// it) and checks its answer.
    fn one(&self, connection: &mut Connection, client: usize, n: usize) {
        // The client's `k`-th request: each client goes through the whole mix,
        // starting at a place of its own.
        let k = n / CONNECTIONS;
        let kind = MIX[(client * 5 + k) % MIX.len()];
        let (p, m) = (
            (client + k) % PROMPTS.len(),
            MAX_TOKENS[(client / 2 + k) % 2],
        );
        let key = bearer(KEY);
        let auth = [("Authorization", key.as_str())];
        let prompt_tokens = fixture().tokenizer.encode(PROMPTS[p]).len() as u64;
        let greedy = |stream: bool| {
            completion(json!({
                "prompt": PROMPTS[p], "max_tokens": m, "temperature": 0, "stream": stream,
                "stream_options": {"include_usage": stream},
            }))
        };
        let completions = "/v1/completions";
        match kind {
            Kind::Whole => {
                let r = connection
                    .send("POST", completions, &auth, &greedy(false))
                    .unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                let answer = r.json();
                assert_eq!(
                    answer["choices"][0]["text"],
                    self.expected[&(p, m)],
                    "{kind:?} {p} {m}"
                );
                let usage = &answer["usage"];
                assert_eq!(usage["prompt_tokens"], prompt_tokens);
                let drawn = usage["completion_tokens"].as_u64().unwrap();
                self.count(kind, completions, 200, prompt_tokens, drawn);
            }
            Kind::Streamed | Kind::SlowReader => {
                let pause = matches!(kind, Kind::SlowReader).then_some(Duration::from_millis(2));
                connection
                    .write("POST", completions, &auth, &greedy(true))
                    .unwrap();
                let r = connection.read_response(pause).unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                let events = r.events();
                assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
                assert_eq!(
                    streamed_text(&events).0,
                    self.expected[&(p, m)],
                    "{kind:?} {p} {m}"
                );
                let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
                let drawn = usage["usage"]["completion_tokens"].as_u64().unwrap();
                self.count(kind, completions, 200, prompt_tokens, drawn);
            }
            Kind::LeavesMidStream => {
                let body = completion(json!({
                    "prompt": PROMPTS[p], "max_tokens": LEFT_MAX_TOKENS, "stream": true,
                    "ignore_eos": true, "seed": n,
                }));
                connection.write("POST", completions, &auth, &body).unwrap();
                assert_eq!(connection.read_head().unwrap().0, 200);
                assert!(!connection.read_chunk().unwrap().is_empty());
                *connection = self.server.connect();
                self.count(kind, completions, 200, prompt_tokens, 0);
                self.tally.lock().unwrap().left_mid_stream += 1;
            }
            Kind::Malformed => {
                let bodies: [&[u8]; 5] = [
                    b"{not json",
                    b"[1, 2",
                    br#"{"prompt": 5}"#,
                    br#"{"prompt": "x", "max_tokens": "many"}"#,
                    b"\xff\xfe{}",
                ];
                let body = bodies[(client + n) % bodies.len()];
                let r = connection.send("POST", completions, &auth, body).unwrap();
                assert_eq!(r.status, 400, "{}", r.text());
                assert_eq!(r.json()["error"]["type"], "invalid_request_error");
                self.count(kind, completions, 400, 0, 0);
            }
            Kind::Oversized => {
                let padding = "x".repeat(MAX_BODY_BYTES);
                let body =
                    completion(json!({"prompt": PROMPTS[p], "max_tokens": 2, "user": padding}));
                let r = connection.send("POST", completions, &auth, &body).unwrap();
                assert_eq!(r.status, 413, "{}", r.text());
                *connection = self.server.connect();
                self.count(kind, completions, 413, 0, 0);
            }
            Kind::WrongKey | Kind::NoKey => {
                let wrong = bearer("soak-key-0b7f");
                let headers: Vec<(&str, &str)> = match kind {
                    Kind::WrongKey => vec![("Authorization", wrong.as_str())],
                    _ => vec![],
                };
                let r = connection
                    .send("POST", completions, &headers, &greedy(false))
                    .unwrap();
                assert_eq!(r.status, 401, "{}", r.text());
                assert_eq!(r.error_code(), "invalid_api_key");
                *connection = self.server.connect();
                self.count(kind, completions, 401, 0, 0);
            }
            Kind::PromptTooLong => {
                let ids: Vec<u32> = (0..MAX_PROMPT_TOKENS as u32 + 1)
                    .map(|i| 40 + i % 50)
                    .collect();
                let body = completion(json!({"prompt": ids, "max_tokens": 2}));
                let r = connection.send("POST", completions, &auth, &body).unwrap();
                assert_eq!(
                    (r.status, r.error_code().as_str()),
                    (400, "prompt_too_long")
                );
                self.count(kind, completions, 400, 0, 0);
            }
            Kind::TooManyTokens => {
                let body = completion(
                    json!({"prompt": PROMPTS[p], "max_tokens": MAX_COMPLETION_TOKENS + 1}),
                );
                let r = connection.send("POST", completions, &auth, &body).unwrap();
                assert_eq!(
                    (r.status, r.json()["error"]["param"].as_str()),
                    (400, Some("max_tokens"))
                );
                self.count(kind, completions, 400, 0, 0);
            }
            Kind::Tokenize => {
                let body = json!({"content": PROMPTS[p]}).to_string();
                let r = connection
                    .send("POST", "/tokenize", &auth, body.as_bytes())
                    .unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                assert_eq!(
                    r.json()["tokens"],
                    json!(fixture().tokenizer.encode(PROMPTS[p]))
                );
                self.count(kind, "/tokenize", 200, 0, 0);
            }
        }
    }
}

/// Counts a client's thread as finished when it ends, by a panic too.
struct Finished<'a>(&'a AtomicUsize);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn requests() -> usize {
    std::env::var("TINYLM_SOAK_REQUESTS")
        .map_or(2000, |n| n.parse().expect("TINYLM_SOAK_REQUESTS: a number"))
}

#[test]
fn thousands_of_requests_good_and_bad_from_32_connections() {
    let limits = [
        ("--max-body-bytes", MAX_BODY_BYTES),
        ("--max-prompt-tokens", MAX_PROMPT_TOKENS),
        ("--max-completion-tokens", MAX_COMPLETION_TOKENS),
    ];
    let mut flags: Vec<String> = [
        "--api-key",
        KEY,
        "--slots",
        "8",
        "--threads",
        "2",
        "--max-queue",
        "64",
    ]
    .map(String::from)
    .to_vec();
    for (flag, value) in limits {
        flags.extend([flag.to_string(), value.to_string()]);
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let expected = (0..PROMPTS.len())
        .flat_map(|p| MAX_TOKENS.map(|m| ((p, m), generated(PROMPTS[p], m))))
        .collect();
    let soak = Soak {
        server: Server::start(&flags, &[]),
        expected,
        tally: Mutex::new(Tally::default()),
    };
    // Warm: one request of every kind, so that the buffers of a full pass exist.
    let mut connection = soak.server.connect();
    for n in 0..MIX.len() {
        soak.one(&mut connection, 0, n * CONNECTIONS);
    }
    std::thread::sleep(Duration::from_millis(500));
    let warm_kib = soak.server.rss_kib();

    let total = requests();
    let started = Instant::now();
    let mut peak_kib = warm_kib;
    let finished = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for client in 0..CONNECTIONS {
            let (soak, finished) = (&soak, &finished);
            s.spawn(move || {
                let _done = Finished(finished);
                let mut connection = soak.server.connect();
                for n in (client..total).step_by(CONNECTIONS) {
                    soak.one(&mut connection, client, n);
                }
            });
        }
        while finished.load(Ordering::Relaxed) < CONNECTIONS {
            peak_kib = peak_kib.max(soak.server.rss_kib());
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let seconds = started.elapsed().as_secs_f64();

    // The server is well and has forgotten the clients.
    let tally = soak.tally.into_inner().unwrap();
    let key = Some(KEY);
    let requests_of = |m: &BTreeMap<String, f64>, route: &str, status: u16| {
        m.get(&format!(
            "tinylm_requests_total{{route=\"{route}\",status=\"{status}\"}}"
        ))
        .copied()
    };
    let settled = |m: &BTreeMap<String, f64>| {
        m["tinylm_slots_busy"] == 0.0
            && m["tinylm_queue_depth"] == 0.0
            && (tally.requests.iter())
                .all(|((route, status), &n)| requests_of(m, route, *status) == Some(n as f64))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut metrics = soak.server.metrics(key);
    while !settled(&metrics) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        metrics = soak.server.metrics(key);
    }
    for ((route, status), &n) in &tally.requests {
        assert_eq!(
            requests_of(&metrics, route, *status),
            Some(n as f64),
            "{route} {status}"
        );
    }
    let counted: f64 = (metrics.iter())
        .filter(|(name, _)| {
            name.starts_with("tinylm_requests_total{") && !name.contains("/metrics")
        })
        .map(|(_, &n)| n)
        .sum();
    assert_eq!(
        counted,
        tally.requests.values().sum::<u64>() as f64,
        "requests nobody sent"
    );
    assert_eq!(
        metrics["tinylm_prompt_tokens_total"],
        tally.prompt_tokens as f64
    );
    // Those that left drew some tokens before the server saw them go.
    let drawn = metrics["tinylm_generated_tokens_total"] - tally.completion_tokens as f64;
    assert!(
        drawn >= 0.0 && drawn <= (tally.left_mid_stream * LEFT_MAX_TOKENS as u64) as f64,
        "{drawn}"
    );
    assert_eq!(
        (metrics["tinylm_slots_busy"], metrics["tinylm_queue_depth"]),
        (0.0, 0.0)
    );
    let r = soak.server.request("GET", "/health", &[], b"");
    assert_eq!(r.status, 200);
    std::thread::sleep(Duration::from_millis(500));
    let after_kib = soak.server.rss_kib();
    println!(
        "{} requests from {CONNECTIONS} connections in {seconds:.1} s ({:.0} a second); {:?}; resident memory warm {} MiB, peak {} MiB, after {} MiB",
        total,
        total as f64 / seconds,
        tally.by_kind,
        warm_kib >> 10,
        peak_kib >> 10,
        after_kib >> 10,
    );
    assert!(
        after_kib <= warm_kib + MEMORY_BOUND_KIB,
        "resident memory {after_kib} KiB after the soak, {warm_kib} KiB warm"
    );
    let mut server = soak.server;
    let lines = server.lines();
    assert!(
        !lines.iter().any(|l| l.contains("panicked")),
        "{}",
        lines.join("\n")
    );
    // Some clients left while their text was still coming.
    assert!(lines.iter().any(|l| l.contains("the client left after")));
    server.terminate();
    assert!(server.wait(Duration::from_secs(30)).success());
}
