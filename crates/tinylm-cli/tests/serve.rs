//! `tinylm serve` on loopback, one server per test, each guard and limit against
//! what it stops: the API key, the body, prompt, `max_tokens` and queue limits, the
//! time limit, a client that stops reading, idle connections, the shutdown at
//! SIGTERM; `/health`, `/metrics` and the access log against what was sent; the
//! log-probabilities against `tinylm forward`'s logits; `/tokenize` and
//! `/detokenize` against the tokenizer.

#[allow(dead_code)]
mod server;

use serde_json::{json, Value};
use server::{bearer, completion, fixture, generated, streamed_text, tinylm, Connection, Server};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const KEY: &str = "test-key-4d1f";

fn short() -> Vec<u8> {
    completion(json!({"prompt": "Once upon a time", "max_tokens": 2}))
}

/// The metrics once `want` holds of them (requests are counted when their
/// responses end, just after the client has read them), 10 s at most.
fn metrics_when(
    server: &Server,
    key: Option<&str>,
    want: impl Fn(&std::collections::BTreeMap<String, f64>) -> bool,
) -> std::collections::BTreeMap<String, f64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = server.metrics(key);
        if want(&metrics) || Instant::now() > deadline {
            return metrics;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_key_guards_every_api_route_but_the_page_and_health() {
    for (flags, env) in [
        (vec!["--api-key", KEY], vec![]),
        (vec![], vec![("TINYLM_API_KEY", KEY)]),
    ] {
        let server = Server::start(&flags, &env);
        server.wait_for_line("API key required", Duration::from_secs(1));
        let (right, wrong) = (bearer(KEY), bearer("test-key-4d1e"));
        let routes = [
            ("GET", "/v1/models", Vec::new()),
            ("POST", "/v1/completions", short()),
            ("POST", "/tokenize", br#"{"content": "Once"}"#.to_vec()),
            ("POST", "/detokenize", br#"{"tokens": [40, 41]}"#.to_vec()),
            ("GET", "/metrics", Vec::new()),
        ];
        for (method, path, body) in &routes {
            for headers in [
                vec![],
                vec![("Authorization", wrong.as_str())],
                vec![("Authorization", "Basic dGVzdC1rZXktNGQxZg==")],
                vec![("Authorization", "Bearer")],
            ] {
                let r = server.request(method, path, &headers, body);
                assert_eq!(r.status, 401, "{method} {path} {headers:?}: {}", r.text());
                assert_eq!(r.error_code(), "invalid_api_key");
                assert_eq!(r.header("www-authenticate"), Some("Bearer"));
            }
            let r = server.request(method, path, &[("Authorization", &right)], body);
            assert_eq!(r.status, 200, "{method} {path}: {}", r.text());
        }
        for path in ["/", "/health"] {
            assert_eq!(server.request("GET", path, &[], b"").status, 200, "{path}");
        }
    }
    // Without a key every route is open.
    let server = Server::start(&[], &[]);
    assert_eq!(
        server
            .request("POST", "/v1/completions", &[], &short())
            .status,
        200
    );
    assert!(!server
        .lines()
        .iter()
        .any(|l| l.contains("API key required")));
}

#[test]
fn a_server_beyond_loopback_without_a_key_says_so_at_start() {
    let warning = "WARNING: listening on 0.0.0.0:";
    let open = Server::start(&["--host", "0.0.0.0"], &[]);
    let line = open.wait_for_line(warning, Duration::from_secs(1));
    assert!(line.contains("without an API key"), "{line}");
    drop(open);
    let keyed = Server::start(&["--host", "0.0.0.0", "--api-key", KEY], &[]);
    let quiet = Server::start(&[], &[]);
    for server in [keyed, quiet] {
        assert!(!server.lines().iter().any(|l| l.contains("WARNING")));
    }
}

/// A completion request padded with spaces to `bytes` bytes.
fn padded(bytes: usize) -> Vec<u8> {
    let mut body = short();
    let end = body.pop().unwrap();
    body.resize(bytes - 1, b' ');
    body.push(end);
    body
}

#[test]
fn each_limit_refuses_with_its_status() {
    let server = Server::start(
        &[
            "--max-body-bytes",
            "2000",
            "--max-prompt-tokens",
            "20",
            "--max-completion-tokens",
            "10",
        ],
        &[],
    );
    // The body: declared longer than the limit, or sent in chunks past it.
    let r = server.request("POST", "/v1/completions", &[], &padded(2001));
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (413, "request_too_large"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("--max-body-bytes"));
    let mut chunked = server.connect();
    let head = "POST /v1/completions HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n";
    let stream = chunked.reader.get_mut();
    stream.write_all(head.as_bytes()).unwrap();
    for part in padded(2400).chunks(300) {
        let _ = stream.write_all(format!("{:x}\r\n", part.len()).as_bytes());
        let _ = stream.write_all(part);
        let _ = stream.write_all(b"\r\n");
    }
    let _ = stream.write_all(b"0\r\n\r\n");
    let r = chunked.read_response(None).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(
        server
            .request("POST", "/v1/completions", &[], &padded(2000))
            .status,
        200
    );
    // Prompt tokens, all the request's prompts together.
    let ids = |n: usize| (0..n as u32).map(|i| 65 + i % 20).collect::<Vec<_>>();
    for (prompt, status) in [
        (json!(ids(21)), 400),
        (json!([ids(12), ids(9)]), 400),
        (json!(ids(20)), 200),
        (json!([ids(12), ids(8)]), 200),
    ] {
        let body = completion(json!({"prompt": prompt, "max_tokens": 2}));
        let r = server.request("POST", "/v1/completions", &[], &body);
        assert_eq!(r.status, status, "{prompt}: {}", r.text());
        if status == 400 {
            assert_eq!(r.error_code(), "prompt_too_long");
            assert_eq!(r.json()["error"]["param"], "prompt");
        }
    }
    // max_tokens.
    for (max_tokens, status) in [(11, 400), (10, 200)] {
        let body = completion(json!({"prompt": "Once", "max_tokens": max_tokens}));
        let r = server.request("POST", "/v1/completions", &[], &body);
        assert_eq!(r.status, status, "{}", r.text());
        if status == 400 {
            assert_eq!(r.json()["error"]["param"], "max_tokens");
            assert!(r.text().contains("--max-completion-tokens"));
        }
    }
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let server = Server::start(&["--slots", "1", "--max-queue", "1"], &[]);
    // Three choices never fit in one slot and one place in the queue.
    let three = completion(json!({"prompt": "Once", "max_tokens": 2, "n": 3}));
    let r = server.request("POST", "/v1/completions", &[], &three);
    assert_eq!(
        (r.status, r.json()["error"]["param"].as_str()),
        (400, Some("n"))
    );
    // Two choices of a long stream: one decodes, one waits — a third request is
    // refused until they end (tried again in the rare case that they ended first).
    let holding = completion(
        json!({"prompt": "Once", "max_tokens": 250, "n": 2, "stream": true, "ignore_eos": true}),
    );
    let mut refused = None;
    for _ in 0..3 {
        let mut holder = server.connect();
        holder
            .write("POST", "/v1/completions", &[], &holding)
            .unwrap();
        assert_eq!(holder.read_head().unwrap().0, 200);
        assert!(!holder.read_chunk().unwrap().is_empty());
        let r = server.request("POST", "/v1/completions", &[], &short());
        while !holder.read_chunk().unwrap().is_empty() {}
        match r.status {
            429 => {
                refused = Some(r);
                break;
            }
            200 => continue,
            status => panic!("{status}: {}", r.text()),
        }
    }
    let r = refused.expect("a request came in while the queue was full");
    assert_eq!(r.error_code(), "queue_full");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.text().contains("--max-queue 1"), "{}", r.text());
    // Room again.
    assert_eq!(
        server
            .request("POST", "/v1/completions", &[], &short())
            .status,
        200
    );
}

#[test]
fn a_request_past_its_time_limit_ends_and_frees_its_slots() {
    let server = Server::start(&["--slots", "1", "--request-timeout", "0.1"], &[]);
    // 64 choices of 250 tokens one after the other: far more than 0.1 s.
    let long = json!({"prompt": "Once", "max_tokens": 250, "n": 64, "ignore_eos": true});
    let started = Instant::now();
    let r = server.request("POST", "/v1/completions", &[], &completion(long.clone()));
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (408, "request_timeout"),
        "{}",
        r.text()
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let mut streamed = long;
    streamed["stream"] = true.into();
    let r = server.request("POST", "/v1/completions", &[], &completion(streamed));
    assert_eq!(r.status, 200);
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "request_timeout", "{events:?}");
    // The slot and the queue are free again.
    assert_eq!(
        server
            .request("POST", "/v1/completions", &[], &short())
            .status,
        200
    );
    let metrics = metrics_when(&server, None, |m| m["tinylm_slots_busy"] == 0.0);
    assert_eq!(metrics["tinylm_slots_busy"], 0.0);
    assert_eq!(metrics["tinylm_queue_depth"], 0.0);
}

/// Reads `stream` until the server closes it; `Err` if it is still open after
/// `timeout`.
fn read_until_closed(stream: &mut TcpStream, timeout: Duration) -> Result<usize, String> {
    stream.set_read_timeout(Some(timeout)).unwrap();
    let (mut total, mut buf) = (0, vec![0; 1 << 16]);
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(total),
            Err(e) => return Err(format!("still open after {timeout:?}: {e}")),
        }
    }
}

#[test]
fn a_client_that_stops_reading_is_dropped_and_the_others_go_on() {
    let server = Server::start(
        &[
            "--slots",
            "4",
            "--stream-buffer",
            "64",
            "--idle-timeout",
            "1",
        ],
        &[],
    );
    // A stream of ~2 MB (log-probabilities make each event large) that its
    // client never reads, through a small receive buffer.
    let stalled = Connection::open(&server.address);
    let mut socket = stalled.reader.into_inner();
    let size: libc::c_int = 4096;
    // SAFETY: setsockopt on an open socket with a c_int option value.
    let set = unsafe {
        use std::os::fd::AsRawFd;
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0);
    let flood = completion(
        json!({"prompt": "Once", "max_tokens": 250, "n": 6, "stream": true, "logprobs": 20, "ignore_eos": true}),
    );
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
        flood.len()
    );
    socket.write_all(head.as_bytes()).unwrap();
    socket.write_all(&flood).unwrap();
    let line = server.wait_for_line("the client stopped reading", Duration::from_secs(30));
    let tokens: usize = line
        .split("after ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(tokens < 250, "{line}");
    // Another client streams meanwhile and gets its whole text.
    let want = generated("The little dog", 40);
    let body = completion(
        json!({"prompt": "The little dog", "max_tokens": 40, "temperature": 0, "stream": true}),
    );
    let r = server.request("POST", "/v1/completions", &[], &body);
    assert_eq!(streamed_text(&r.events()).0, want);
    // The stalled connection, still unread, is closed once a write has waited
    // the idle time.
    let closed = "the client has not read what it was sent for 1.0 s (--idle-timeout)";
    server.wait_for_line(closed, Duration::from_secs(20));
    let metrics = metrics_when(&server, None, |m| m["tinylm_slots_busy"] == 0.0);
    assert_eq!(metrics["tinylm_slots_busy"], 0.0);
    drop(socket);
}

#[test]
fn idle_and_half_sent_connections_are_closed() {
    let server = Server::start(&["--idle-timeout", "0.5"], &[]);
    let started = Instant::now();
    // Nothing sent.
    let mut silent = TcpStream::connect(&server.address).unwrap();
    read_until_closed(&mut silent, Duration::from_secs(10)).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400));
    // Half a head.
    let mut half = TcpStream::connect(&server.address).unwrap();
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    read_until_closed(&mut half, Duration::from_secs(10)).unwrap();
    // A body that never comes: 408.
    let mut short_body = server.connect();
    let head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"";
    short_body
        .reader
        .get_mut()
        .write_all(head.as_bytes())
        .unwrap();
    let r = short_body.read_response(None).unwrap();
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (408, "request_timeout")
    );
    // A kept-alive connection after its answer.
    let mut kept = server.connect();
    assert_eq!(kept.send("GET", "/health", &[], b"").unwrap().status, 200);
    read_until_closed(kept.reader.get_mut(), Duration::from_secs(10)).unwrap();
}

/// A streaming completion of `request` on a new connection to `server`: the
/// connection, its head read (200), and the stream's first chunk.
fn started_stream(server: &Server, request: Value) -> (Connection, Vec<u8>) {
    let mut connection = server.connect();
    connection
        .write("POST", "/v1/completions", &[], &completion(request))
        .unwrap();
    assert_eq!(connection.read_head().unwrap().0, 200);
    let first = connection.read_chunk().unwrap();
    (connection, first)
}

/// The events of a stream whose head and first chunk were read: to its end, which
/// must come within 30 s.
fn rest_of_stream(connection: &mut Connection, first: Vec<u8>) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut body = first;
    loop {
        let chunk = connection.read_chunk().unwrap();
        if chunk.is_empty() {
            break;
        }
        body.extend(chunk);
        assert!(
            Instant::now() < deadline,
            "the stream has not ended after 30 s"
        );
    }
    server::events_of(&String::from_utf8(body).unwrap())
}

#[test]
fn sigterm_lets_open_streams_finish_then_exits_0() {
    let mut server = Server::start(&["--slots", "2"], &[]);
    let (mut connection, first) = started_stream(
        &server,
        json!({"prompt": "Once", "max_tokens": 200, "n": 4, "stream": true, "ignore_eos": true}),
    );
    server.terminate();
    let events = rest_of_stream(&mut connection, first);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let finished = (events.iter())
        .filter(|e| e.contains("\"finish_reason\":\"length\""))
        .count();
    assert_eq!(finished, 4, "{events:?}");
    assert!(server.wait(Duration::from_secs(10)).success());
    server.wait_for_line("stopping: no new connections", Duration::from_secs(5));
    server.wait_for_line("stopped", Duration::from_secs(5));
    assert!(TcpStream::connect(&server.address).is_err());
}

#[test]
fn sigterm_ends_streams_that_outlast_the_shutdown_bound() {
    let flags = [
        "--slots",
        "1",
        "--max-queue",
        "128",
        "--shutdown-timeout",
        "0.5",
    ];
    let mut server = Server::start(&flags, &[]);
    // 128 choices of 250 tokens one after the other: far more than 0.5 s.
    let (mut connection, first) = started_stream(
        &server,
        json!({"prompt": "Once", "max_tokens": 250, "n": 128, "stream": true, "ignore_eos": true}),
    );
    let stopped = Instant::now();
    server.terminate();
    // No new connection once the signal is seen, while the stream goes on.
    std::thread::sleep(Duration::from_millis(300));
    assert!(TcpStream::connect(&server.address).is_err());
    let events = rest_of_stream(&mut connection, first);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["type"], "unavailable_error", "{error}");
    assert!(server.wait(Duration::from_secs(10)).success());
    assert!(stopped.elapsed() < Duration::from_secs(5));
}

#[test]
fn health_metrics_and_the_access_log_count_what_was_sent() {
    let server = Server::start(&[], &[]);
    let r = server.request("GET", "/health", &[], b"");
    assert_eq!((r.status, r.json()), (200, json!({"status": "ok"})));
    let prompt = "Once upon a time";
    let prompt_tokens = fixture().tokenizer.encode(prompt).len();
    let body = json!({"prompt": prompt, "max_tokens": 10, "ignore_eos": true});
    let r = server.request("POST", "/v1/completions", &[], &completion(body.clone()));
    assert_eq!(r.json()["usage"]["completion_tokens"], 10);
    let mut streamed = body;
    streamed["stream"] = true.into();
    assert_eq!(
        server
            .request("POST", "/v1/completions", &[], &completion(streamed))
            .status,
        200
    );
    assert_eq!(
        server
            .request("POST", "/v1/completions", &[], b"{not json")
            .status,
        400
    );
    assert_eq!(server.request("GET", "/v1/nothing", &[], b"").status, 404);
    assert_eq!(
        server.request("GET", "/v1/completions", &[], b"").status,
        405
    );
    let requests = |route: &str, status: u16| {
        format!("tinylm_requests_total{{route=\"{route}\",status=\"{status}\"}}")
    };
    let want = [
        (requests("/health", 200), 1.0),
        (requests("/v1/completions", 200), 2.0),
        (requests("/v1/completions", 400), 1.0),
        (requests("/v1/completions", 405), 1.0),
        (requests("unmatched", 404), 1.0),
        (
            "tinylm_prompt_tokens_total".into(),
            2.0 * prompt_tokens as f64,
        ),
        ("tinylm_generated_tokens_total".into(), 20.0),
        ("tinylm_time_to_first_token_seconds_count".into(), 2.0),
        ("tinylm_time_per_token_seconds_count".into(), 18.0),
        ("tinylm_slots_busy".into(), 0.0),
        ("tinylm_queue_depth".into(), 0.0),
        ("tinylm_slots".into(), 8.0),
    ];
    let metrics = metrics_when(&server, None, |m| {
        want.iter().all(|(k, v)| m.get(k) == Some(v))
    });
    for (name, value) in &want {
        assert_eq!(metrics.get(name), Some(value), "{name} in {metrics:?}");
    }
    let inf = "tinylm_time_to_first_token_seconds_bucket{le=\"+Inf\"}";
    assert_eq!(metrics[inf], 2.0);
    let r = server.request("GET", "/metrics", &[], b"");
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    // One access line per request, with its tokens.
    // Every request above but the scrapes.
    let logged = |l: &&String| l.starts_with("access: ") && !l.contains(" /metrics ");
    let count = |lines: &[String]| lines.iter().filter(logged).count();
    let lines = server.lines_when(|lines| count(lines) == 6, Duration::from_secs(10));
    let access: Vec<&String> = lines.iter().filter(logged).collect();
    assert_eq!(access.len(), 6, "{access:?}");
    let line = format!(
        "access: POST /v1/completions 200 prompt_tokens={prompt_tokens} completion_tokens=10 ms="
    );
    assert_eq!(
        access.iter().filter(|l| l.starts_with(&line)).count(),
        2,
        "{access:?}"
    );
    for start in [
        "access: GET /health 200 ",
        "access: GET unmatched 404 ",
        "access: GET /v1/completions 405 ",
    ] {
        assert_eq!(
            access.iter().filter(|l| l.starts_with(start)).count(),
            1,
            "{start} in {access:?}"
        );
    }
}

/// The log-softmax of `row` at `id`, in f64.
fn log_softmax(row: &[f32], id: u32) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row[id as usize] as f64 - max - sum.ln()
}

#[test]
fn logprobs_are_those_of_tinylm_forward_s_logits() {
    let f = fixture();
    let server = Server::start(&["--precision", "fp32"], &[]);
    let prompt = "Once upon a time, a little";
    let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "echo": true, "logprobs": 5, "ignore_eos": true});
    let r = server.request("POST", "/v1/completions", &[], &completion(body.clone()));
    assert_eq!(r.status, 200, "{}", r.text());
    let choice = &r.json()["choices"][0];
    let logprobs = &choice["logprobs"];
    let text = choice["text"].as_str().unwrap();
    let names: Vec<&str> = logprobs["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let prompt_ids = f.tokenizer.encode(prompt);
    assert_eq!(names.len(), prompt_ids.len() + 12);
    // Token names back to ids, through the tokenizer's vocabulary.
    let vocab = f.tokenizer.vocab_size() as u32;
    let id_of = |name: &str| {
        (0..vocab)
            .find(|&id| server_token_name(id) == name)
            .unwrap()
    };
    let ids: Vec<u32> = names.iter().map(|n| id_of(n)).collect();
    assert_eq!(ids[..prompt_ids.len()], prompt_ids[..]);
    // Offsets: where each token's text starts.
    let offsets: Vec<usize> = logprobs["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(
        offsets.windows(2).all(|w| w[0] <= w[1]) && *offsets.last().unwrap() < text.chars().count()
    );
    assert!(text.starts_with(prompt));
    // `tinylm forward` on the same ids, in f32.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ids.npy");
    let logits_path = dir.path().join("logits.npy");
    let as_i64: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    tinylm_bpe::npy::write(&input, &[as_i64.len()], &as_i64).unwrap();
    tinylm(&[
        "forward",
        "--weights",
        f.checkpoint.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--logits-out",
        logits_path.to_str().unwrap(),
        "--precision",
        "fp32",
        "--threads",
        "1",
    ]);
    let logits = tinylm_bpe::npy::MappedNpy::open(&logits_path).unwrap();
    let v = 512;
    let row = |i: usize| -> Vec<f32> { (0..v).map(|j| logits.f32_at(i * v + j)).collect() };
    let token_logprobs = logprobs["token_logprobs"].as_array().unwrap();
    let top_logprobs = logprobs["top_logprobs"].as_array().unwrap();
    assert!(token_logprobs[0].is_null() && top_logprobs[0].is_null());
    for i in 1..ids.len() {
        let previous = row(i - 1);
        let want = log_softmax(&previous, ids[i]);
        let got = token_logprobs[i].as_f64().unwrap();
        assert!((got - want).abs() < 1e-4, "token {i}: {got} vs {want}");
        // The five most probable (and the chosen one), each with its value.
        let top = top_logprobs[i].as_object().unwrap();
        let mut order: Vec<u32> = (0..v as u32).collect();
        order.sort_by(|&a, &b| {
            previous[b as usize]
                .total_cmp(&previous[a as usize])
                .then(a.cmp(&b))
        });
        for &id in &order[..5] {
            let lp = top[&server_token_name(id)].as_f64().unwrap();
            assert!((lp - log_softmax(&previous, id)).abs() < 1e-4);
        }
        assert!(top.len() == 5 || top.len() == 6);
        if i >= prompt_ids.len() {
            // Greedy: the chosen token is the most probable.
            assert_eq!(ids[i], order[0], "token {i}");
        }
    }
    // Streamed, the chunks carry the same numbers for the new tokens.
    let mut streamed = body;
    streamed["stream"] = true.into();
    let r = server.request("POST", "/v1/completions", &[], &completion(streamed));
    let mut from_stream = Vec::new();
    for event in r.events().iter().filter(|e| *e != "[DONE]") {
        let chunk: Value = serde_json::from_str(event).unwrap();
        let lp = &chunk["choices"][0]["logprobs"];
        if let Some(values) = lp["token_logprobs"].as_array() {
            from_stream.extend(values.iter().cloned());
        }
    }
    assert_eq!(from_stream[..], token_logprobs[..]);
    // Scoring alone: max_tokens 0 with echo.
    let score = json!({"prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 0});
    let r = server.request("POST", "/v1/completions", &[], &completion(score));
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["text"], prompt);
    assert_eq!(
        choice["logprobs"]["token_logprobs"].as_array().unwrap()[..],
        token_logprobs[..prompt_ids.len()]
    );
    for bad in [json!(21), json!(-1), json!("5")] {
        let body = completion(json!({"prompt": prompt, "max_tokens": 2, "logprobs": bad}));
        let r = server.request("POST", "/v1/completions", &[], &body);
        assert_eq!(
            (r.status, r.json()["error"]["param"].as_str()),
            (400, Some("logprobs"))
        );
    }
}

/// A token's name in `logprobs`: its text, or `bytes:` and its bytes' escapes.
fn server_token_name(id: u32) -> String {
    let bytes = fixture().tokenizer.decode_bytes(&[id]).unwrap();
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let escapes: String = e.as_bytes().iter().map(|b| format!("\\x{b:02x}")).collect();
            format!("bytes:{escapes}")
        }
    }
}

#[test]
fn tokenize_and_detokenize_are_the_tokenizer_s() {
    let f = fixture();
    let server = Server::start(&[], &[]);
    let text = "Once upon a time, Lily saw a big dog. \u{1F415}";
    let ids = f.tokenizer.encode(text);
    let post =
        |path: &str, body: Value| server.request("POST", path, &[], body.to_string().as_bytes());
    let r = post("/tokenize", json!({"content": text}));
    assert_eq!(r.json(), json!({ "tokens": ids }));
    let r = post("/tokenize", json!({"content": text, "with_pieces": true}));
    let mut bytes = Vec::new();
    for (token, &id) in r.json()["tokens"].as_array().unwrap().iter().zip(&ids) {
        assert_eq!(token["id"], id);
        match &token["piece"] {
            Value::String(piece) => bytes.extend(piece.as_bytes()),
            Value::Array(list) => bytes.extend(list.iter().map(|b| b.as_u64().unwrap() as u8)),
            other => panic!("{other}"),
        }
    }
    assert_eq!(bytes, text.as_bytes());
    let r = post("/detokenize", json!({ "tokens": ids }));
    assert_eq!(r.json(), json!({ "content": text }));
    let r = server.request("POST", "/detokenize", &[], br#"{"tokens": [1, 512]}"#);
    assert_eq!(r.status, 400);
    assert!(r.text().contains("token 512 at position 1"), "{}", r.text());
    assert_eq!(
        server
            .request("POST", "/tokenize", &[], br#"{"text": 1}"#)
            .status,
        400
    );
}
