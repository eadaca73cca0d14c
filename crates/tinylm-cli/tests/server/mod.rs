//! What the `tinylm serve` suites share (`tests/serve.rs`, `tests/serve_soak.rs`):
//! a small model and its tokenizer, the server as a child process on loopback, and
//! a plain HTTP/1.1 client over a socket — the suites send what no client library
//! sends (malformed bodies, wrong keys, half-read streams, silence).

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tinylm::params::ParamLayout;
use tinylm::{checkpoint, ModelConfig};
use tinylm_bpe::encode::Tokenizer;
use tinylm_bpe::files::Bpe;

/// The served model's name.
pub const NAME: &str = "tiny";
/// The model's context.
pub const CONTEXT: usize = 256;

/// A tokenizer of 512 tokens trained on the start of the TinyStories sample, and
/// a model of random weights (2 layers, d_model 64) that records it.
pub struct Fixture {
    _dir: tempfile::TempDir,
    pub checkpoint: PathBuf,
    pub tokenizer_dir: PathBuf,
    pub tokenizer: Tokenizer,
}

pub fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("corpus.txt");
        let stories = tinylm_corpus::tinystories();
        let end = stories
            .char_indices()
            .nth(200_000)
            .map_or(stories.len(), |(i, _)| i);
        std::fs::write(&text, &stories[..end]).unwrap();
        let specials = ["<|endoftext|>".to_string()];
        let (vocab, merges) = tinylm_bpe::train::train_bpe(&text, 512, &specials).unwrap();
        let tokenizer_dir = dir.path().join("tok");
        tinylm_bpe::files::save_tokenizer(&tokenizer_dir, &vocab, &merges).unwrap();
        let config = ModelConfig {
            vocab_size: 512,
            context_length: CONTEXT,
            d_model: 64,
            num_layers: 2,
            num_heads: 4,
            d_ff: 128,
            ..ModelConfig::tinystories()
        };
        let meta = BTreeMap::from([(
            "tokenizer".to_string(),
            serde_json::to_string(&tokenizer_dir).unwrap(),
        )]);
        let checkpoint = dir.path().join("checkpoint.safetensors");
        let params = ParamLayout::new(&config).init(7);
        checkpoint::save(&checkpoint, &config, &params, None, &meta).unwrap();
        let bpe = Bpe::load(&tokenizer_dir).unwrap();
        let tokenizer =
            (Tokenizer::new(bpe.vocab, &bpe.merges, &specials).unwrap()).with_pattern(bpe.pattern);
        Fixture {
            _dir: dir,
            checkpoint,
            tokenizer_dir,
            tokenizer,
        }
    })
}

/// `tinylm ARGS`' standard output; panics with its standard error on failure.
pub fn tinylm(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tinylm"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// What `tinylm generate` writes after `prompt`, greedy, `max_tokens` at most.
pub fn generated(prompt: &str, max_tokens: usize) -> String {
    let f = fixture();
    let out = tinylm(&[
        "generate",
        "--checkpoint",
        f.checkpoint.to_str().unwrap(),
        "--prompt",
        prompt,
        "--max-tokens",
        &max_tokens.to_string(),
        "--temperature",
        "0",
        "--threads",
        "1",
    ]);
    let text = out.strip_suffix('\n').unwrap_or(&out);
    text.strip_prefix(prompt).unwrap().to_string()
}

/// A `tinylm serve` process on loopback and the lines it writes to stderr.
pub struct Server {
    child: Child,
    pub address: String,
    lines: Arc<(Mutex<Vec<String>>, Condvar)>,
}

impl Server {
    /// The fixture's model served on a free port with `flags` (one thread unless
    /// they say otherwise); `env` is set for the process.
    pub fn start(flags: &[&str], env: &[(&str, &str)]) -> Server {
        let f = fixture();
        let mut command = Command::new(env!("CARGO_BIN_EXE_tinylm"));
        command
            .args(["serve", "--checkpoint", f.checkpoint.to_str().unwrap()])
            .args(["--port", "0", "--name", NAME])
            .args(flags)
            .env_remove("TINYLM_API_KEY")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if !flags.contains(&"--threads") {
            command.args(["--threads", "1"]);
        }
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let writer = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let (list, seen) = &*writer;
                list.lock().unwrap().push(line);
                seen.notify_all();
            }
        });
        let mut server = Server {
            child,
            address: String::new(),
            lines,
        };
        let line = server.wait_for_line("serving tiny at http://", Duration::from_secs(60));
        let start = line.find("http://").unwrap() + "http://".len();
        let end = start + line[start..].find('/').unwrap();
        server.address = line[start..end].to_string();
        server
    }

    /// The first stderr line containing `text`, waiting up to `timeout`.
    pub fn wait_for_line(&self, text: &str, timeout: Duration) -> String {
        let lines = self.lines_when(|lines| lines.iter().any(|l| l.contains(text)), timeout);
        let found = lines.iter().find(|l| l.contains(text));
        found
            .unwrap_or_else(|| panic!("no line with {text:?} in:\n{}", lines.join("\n")))
            .clone()
    }

    /// The stderr lines once `want` holds of them, or after `timeout`.
    pub fn lines_when(&self, want: impl Fn(&[String]) -> bool, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let (list, seen) = &*self.lines;
        let mut lines = list.lock().unwrap();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if want(&lines) || left.is_zero() {
                return lines.clone();
            }
            lines = seen.wait_timeout(lines, left).unwrap().0;
        }
    }

    /// Every stderr line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.0.lock().unwrap().clone()
    }

    /// A new connection to the server.
    pub fn connect(&self) -> Connection {
        Connection::open(&self.address)
    }

    /// One request on a connection of its own.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.connect().send(method, path, headers, body).unwrap()
    }

    /// `GET /metrics`'s samples, by name with labels (`name{label="…"}`).
    pub fn metrics(&self, key: Option<&str>) -> BTreeMap<String, f64> {
        let bearer = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> = bearer
            .iter()
            .map(|b| ("Authorization", b.as_str()))
            .collect();
        let response = self.request("GET", "/metrics", &headers, b"");
        assert_eq!(response.status, 200, "{}", response.text());
        (response.text().lines())
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (name, value) = l.rsplit_once(' ').unwrap();
                (name.to_string(), value.parse().unwrap())
            })
            .collect()
    }

    /// The server's resident memory, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) },
            0
        );
    }

    /// Waits for the process to exit, `timeout` at most.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response: status, headers (names in lower case), body.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }

    /// A stream's `data:` events, `[DONE]` included, as text.
    pub fn events(&self) -> Vec<String> {
        events_of(&self.text())
    }

    /// An error's `error.code`, or its `error.type` when it has no code.
    pub fn error_code(&self) -> String {
        let error = &self.json()["error"];
        let code = error["code"].as_str().or(error["type"].as_str());
        code.unwrap_or_else(|| panic!("not an error: {}", self.text()))
            .to_string()
    }
}

/// The `data:` events of an event stream's text.
pub fn events_of(text: &str) -> Vec<String> {
    (text.split("\n\n"))
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// The text a completion's stream adds up to, choice 0's, and its last finish reason.
pub fn streamed_text(events: &[String]) -> (String, Option<String>) {
    let (mut text, mut finish) = (String::new(), None);
    for event in events.iter().filter(|e| *e != "[DONE]") {
        let chunk: Value = serde_json::from_str(event).unwrap();
        assert!(chunk.get("error").is_none(), "an error event: {event}");
        for choice in chunk["choices"].as_array().unwrap() {
            text += choice["text"].as_str().unwrap();
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    (text, finish)
}

/// An HTTP/1.1 connection (keep-alive).
pub struct Connection {
    pub reader: BufReader<TcpStream>,
}

impl Connection {
    pub fn open(address: &str) -> Connection {
        let stream = TcpStream::connect(address).unwrap();
        // Every answer of the suites comes within seconds; a guard that is
        // missing makes some wait far longer, and this fails them.
        let timeout = Duration::from_secs(30);
        stream.set_read_timeout(Some(timeout)).unwrap();
        Connection {
            reader: BufReader::new(stream),
        }
    }

    /// Writes a request (with `Content-Length`) without reading the answer.
    pub fn write(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<()> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n",
            body.len()
        );
        if !body.is_empty() {
            head += "Content-Type: application/json\r\n";
        }
        for (name, value) in headers {
            head += &format!("{name}: {value}\r\n");
        }
        head += "\r\n";
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)
    }

    /// A request and its whole answer.
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        self.write(method, path, headers, body)?;
        self.read_response(None)
    }

    /// The status and headers of the next answer.
    pub fn read_head(&mut self) -> std::io::Result<(u16, Vec<(String, String)>)> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
        }
        Ok((status, headers))
    }

    /// The next chunk of a chunked body (empty at its end).
    pub fn read_chunk(&mut self) -> std::io::Result<Vec<u8>> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let size = usize::from_str_radix(line.trim(), 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
        let mut chunk = vec![0; size + 2];
        self.reader.read_exact(&mut chunk)?;
        chunk.truncate(size);
        Ok(chunk)
    }

    /// The next answer, whole; with `pause`, a chunked body is read one chunk at a
    /// time with that pause between chunks (a slow reader).
    pub fn read_response(&mut self, pause: Option<Duration>) -> std::io::Result<Response> {
        let (status, headers) = self.read_head()?;
        let find = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let mut body = Vec::new();
        if let Some(length) = find("content-length") {
            body.resize(length.parse().unwrap(), 0);
            self.reader.read_exact(&mut body)?;
        } else if find("transfer-encoding").as_deref() == Some("chunked") {
            loop {
                let chunk = self.read_chunk()?;
                if chunk.is_empty() {
                    break;
                }
                body.extend(chunk);
                if let Some(pause) = pause {
                    std::thread::sleep(pause);
                }
            }
        } else {
            self.reader.read_to_end(&mut body)?;
        }
        Ok(Response {
            status,
            headers,
            body,
        })
    }
}

/// A completion request's JSON body.
pub fn completion(request: Value) -> Vec<u8> {
    let mut request = request;
    request["model"] = NAME.into();
    serde_json::to_vec(&request).unwrap()
}

/// `("Authorization", "Bearer KEY")`.
pub fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}
