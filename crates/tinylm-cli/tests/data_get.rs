//! `tinylm data get` against a loopback Hugging Face Hub (`HF_ENDPOINT`), with the
//! real client: files arrive and tokenize into `.npy` files `tinylm train` takes, a
//! second run is served from the cache, a dropped connection is resumed (or, when it
//! keeps dropping, is an error that leaves no file under the final name), and a
//! missing file is an error naming its URL and status.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use flate2::write::GzEncoder;

/// The commit the loopback Hub reports for every repository.
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A loopback stand-in for the Hub's file routes, as `hf-hub` reads them:
/// `/datasets/{repo}/resolve/main/{file}` answers `Range` requests with `206`,
/// `Content-Range`, `ETag` and `X-Repo-Commit`; a `.gz` file is an LFS file, which
/// the Hub redirects to its CDN (`302` with `X-Linked-Etag`, then `/cdn/{file}`
/// serves the bytes); any other path is `404`. Every connection answers one request.
struct Hub {
    endpoint: String,
    state: Arc<State>,
}

struct State {
    endpoint: String,
    /// `{repo}/{file}` → bytes.
    files: HashMap<String, Vec<u8>>,
    /// `(file, n)`: the next `n` responses carrying `file`'s bytes stop halfway and
    /// close the connection.
    drops: Mutex<(String, usize)>,
    /// `path range` of every request, in order.
    requests: Mutex<Vec<String>>,
}

impl Hub {
    fn start(files: HashMap<String, Vec<u8>>, drop_file: &str, drops: usize) -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State {
            endpoint: endpoint.clone(),
            files,
            drops: Mutex::new((drop_file.to_string(), drops)),
            requests: Mutex::new(Vec::new()),
        });
        let server = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let state = server.clone();
                std::thread::spawn(move || state.answer(stream.unwrap()));
            }
        });
        Hub { endpoint, state }
    }

    fn requests(&self) -> Vec<String> {
        self.state.requests.lock().unwrap().clone()
    }

    /// From now on every transfer completes.
    fn stop_dropping(&self) {
        self.state.drops.lock().unwrap().1 = 0;
    }
}

impl State {
    fn answer(&self, mut stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut range = None;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap() == 0 || header.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("range") {
                    range = Some(value.trim().to_string());
                }
            }
        }
        self.requests
            .lock()
            .unwrap()
            .push(format!("{path} {}", range.as_deref().unwrap_or("-")));
        let resolve = path
            .strip_prefix("/datasets/")
            .and_then(|p| p.split_once("/resolve/main/"))
            .map(|(repo, file)| format!("{repo}/{file}"));
        match (resolve, path.strip_prefix("/cdn/")) {
            (Some(key), _) if self.files.contains_key(&key) => {
                let etag = format!("\"etag-{}\"", key.replace('/', "-"));
                if key.ends_with(".gz") {
                    let location = format!("{}/cdn/{key}", self.endpoint);
                    let head = format!(
                        "HTTP/1.1 302 Found\r\nLocation: {location}\r\nX-Repo-Commit: {COMMIT}\r\nX-Linked-Etag: {etag}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    stream.write_all(head.as_bytes()).unwrap();
                } else {
                    let extra = format!("ETag: {etag}\r\nX-Repo-Commit: {COMMIT}\r\n");
                    self.send_range(&mut stream, &key, range.as_deref(), &extra);
                }
            }
            (None, Some(key)) if self.files.contains_key(key) => {
                self.send_range(&mut stream, key, range.as_deref(), "");
            }
            _ => {
                let body = "Entry not found";
                let head = format!(
                    "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(head.as_bytes()).unwrap();
            }
        }
    }

    /// `206` with the bytes of `Range: bytes=a-` or `bytes=a-b` (the whole file
    /// without a range), or half of them and a closed connection while a drop is due.
    fn send_range(&self, stream: &mut TcpStream, key: &str, range: Option<&str>, extra: &str) {
        let data = &self.files[key];
        let (start, end) = match range.and_then(|r| r.strip_prefix("bytes=")) {
            Some(r) => {
                let (a, b) = r.split_once('-').unwrap();
                let end = if b.is_empty() {
                    data.len()
                } else {
                    b.parse::<usize>().unwrap() + 1
                };
                (a.parse::<usize>().unwrap(), end.min(data.len()))
            }
            None => (0, data.len()),
        };
        let body = &data[start..end];
        let head = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{}/{}\r\n{extra}Connection: close\r\n\r\n",
            body.len(),
            end - 1,
            data.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        let mut drops = self.drops.lock().unwrap();
        if body.len() > 1 && key.ends_with(&drops.0) && drops.1 > 0 {
            drops.1 -= 1;
            let _ = stream.write_all(&body[..body.len() / 2]);
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return;
        }
        let _ = stream.write_all(body);
    }
}

/// `n` short stories, each followed by `<|endoftext|>`.
fn stories(n: usize, seed: u64) -> String {
    let names = ["Lily", "Tom", "Mia", "Ben", "Sue"];
    let things = ["ball", "cat", "tree", "cake", "boat", "dog"];
    let mut state = seed;
    let mut pick = |items: &[&'static str]| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        items[(state >> 33) as usize % items.len()]
    };
    (0..n)
        .map(|_| {
            let (name, thing) = (pick(&names), pick(&things));
            format!(
                "{name} had a {thing}. {name} saw a big {}. The end.\n<|endoftext|>\n",
                pick(&things)
            )
        })
        .collect()
}

fn gzip(text: &str) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text.as_bytes()).unwrap();
    gz.finish().unwrap()
}

/// The two datasets' files: TinyStories as plain text, the OWT sample gzipped.
fn files() -> HashMap<String, Vec<u8>> {
    [
        (
            "roneneldan/TinyStories/TinyStoriesV2-GPT4-train.txt",
            stories(3000, 1).into_bytes(),
        ),
        (
            "roneneldan/TinyStories/TinyStoriesV2-GPT4-valid.txt",
            stories(300, 2).into_bytes(),
        ),
        (
            "stanford-cs336/owt-sample/owt_train.txt.gz",
            gzip(&stories(2000, 3)),
        ),
        (
            "stanford-cs336/owt-sample/owt_valid.txt.gz",
            gzip(&stories(200, 4)),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// `tinylm ARGS` with the Hub at `hub` and its cache in `dir/hf`, run in `dir`.
fn tinylm(hub: &Hub, dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tinylm"));
    for proxy in [
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ] {
        command.env_remove(proxy);
    }
    command
        .args(args)
        .current_dir(dir)
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HOME", dir.join("hf"))
        .output()
        .expect("runs tinylm")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// [`tinylm`], asserted to exit 0; all the process said.
fn succeeded(hub: &Hub, dir: &Path, args: &[&str]) -> String {
    let out = tinylm(hub, dir, args);
    assert!(out.status.success(), "{}", text(&out));
    text(&out)
}

/// Requests for file bytes (not the one-byte metadata probes).
fn body_requests(hub: &Hub) -> Vec<String> {
    hub.requests()
        .into_iter()
        .filter(|r| !r.ends_with("bytes=0-0"))
        .collect()
}

#[test]
fn tinystories_arrive_tokenize_and_train_then_come_from_the_cache() {
    let hub = Hub::start(files(), "", 0);
    let dir = tempfile::tempdir().unwrap();
    let get = [
        "data",
        "get",
        "tinystories",
        "--tokenize",
        "--vocab-size",
        "300",
    ];
    let said = succeeded(&hub, dir.path(), &get);
    let data = dir.path().join("data/tinystories");
    let train_txt = std::fs::read_to_string(data.join("TinyStoriesV2-GPT4-train.txt")).unwrap();
    assert_eq!(train_txt, stories(3000, 1));
    for file in [
        "tokenizer/vocab.json",
        "tokenizer/merges.txt",
        "train.npy",
        "valid.npy",
    ] {
        assert!(data.join(file).is_file(), "{file}: {said}");
    }
    let fetched = hub.requests().len();
    assert!(fetched >= 4, "{:?}", hub.requests());

    let train = [
        "train",
        "--train-data",
        "data/tinystories/train.npy",
        "--val-data",
        "data/tinystories/valid.npy",
        "--tokenizer",
        "data/tinystories/tokenizer",
        "--out-dir",
        "run",
        "--vocab-size",
        "300",
        "--context-length",
        "16",
        "--d-model",
        "32",
        "--num-layers",
        "1",
        "--num-heads",
        "2",
        "--d-ff",
        "64",
        "--batch-size",
        "4",
        "--steps",
        "5",
        "--eval-interval",
        "5",
        "--eval-batches",
        "2",
        "--threads",
        "2",
    ];
    succeeded(&hub, dir.path(), &train);
    assert!(dir.path().join("run/checkpoint.safetensors").is_file());

    // The second run asks the Hub for nothing.
    let said = succeeded(&hub, dir.path(), &get);
    assert!(
        said.contains("TinyStoriesV2-GPT4-train.txt: in the cache"),
        "{said}"
    );
    assert_eq!(hub.requests().len(), fetched, "{:?}", hub.requests());
}

#[test]
fn a_compressed_dataset_is_decompressed_and_a_dropped_download_resumed() {
    // The training file's first transfer stops halfway; the client resumes it.
    let hub = Hub::start(files(), "owt_train.txt.gz", 1);
    let dir = tempfile::tempdir().unwrap();
    succeeded(&hub, dir.path(), &["data", "get", "owt", "--out", "owt"]);
    let train = std::fs::read_to_string(dir.path().join("owt/owt_train.txt")).unwrap();
    assert_eq!(train, stories(2000, 3));
    let size = files()["stanford-cs336/owt-sample/owt_train.txt.gz"].len();
    let requests = body_requests(&hub);
    let resumed = format!(
        "/cdn/stanford-cs336/owt-sample/owt_train.txt.gz bytes={}-",
        size / 2
    );
    assert!(requests.contains(&resumed), "{requests:?}");
    // Decompressed once: the second run neither downloads nor decompresses.
    let before = hub.requests().len();
    let out = tinylm(&hub, dir.path(), &["data", "get", "owt", "--out", "owt"]);
    assert!(
        text(&out).contains("owt_train.txt: decompressed already"),
        "{}",
        text(&out)
    );
    assert_eq!(hub.requests().len(), before);
}

#[test]
fn a_download_that_keeps_breaking_is_an_error_and_the_next_run_resumes_it() {
    let hub = Hub::start(files(), "TinyStoriesV2-GPT4-train.txt", 100);
    let dir = tempfile::tempdir().unwrap();
    let get = ["data", "get", "tinystories"];
    let out = tinylm(&hub, dir.path(), &get);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let url = format!(
        "{}/datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-train.txt",
        hub.endpoint
    );
    assert!(
        text(&out).contains(&format!(
            "downloading TinyStoriesV2-GPT4-train.txt from {url}"
        )) && text(&out).contains("response body closed before all bytes were read")
            && text(&out).contains("run the command again to resume"),
        "{}",
        text(&out)
    );
    assert!(!dir
        .path()
        .join("data/tinystories/TinyStoriesV2-GPT4-train.txt")
        .exists());
    // Once the server behaves, the next run continues from the bytes received.
    hub.stop_dropping();
    let before = body_requests(&hub).len();
    succeeded(&hub, dir.path(), &get);
    let resumed = &body_requests(&hub)[before];
    let from: usize = resumed
        .rsplit_once("bytes=")
        .unwrap()
        .1
        .trim_end_matches('-')
        .parse()
        .unwrap();
    assert!(from > 0, "{resumed}");
    let train = std::fs::read_to_string(
        dir.path()
            .join("data/tinystories/TinyStoriesV2-GPT4-train.txt"),
    );
    assert_eq!(train.unwrap(), stories(3000, 1));
}

#[test]
fn a_missing_file_names_its_url_and_status() {
    let mut files = files();
    files.remove("stanford-cs336/owt-sample/owt_valid.txt.gz");
    let hub = Hub::start(files, "", 0);
    let dir = tempfile::tempdir().unwrap();
    let out = tinylm(&hub, dir.path(), &["data", "get", "owt"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let url = format!(
        "{}/datasets/stanford-cs336/owt-sample/resolve/main/owt_valid.txt.gz",
        hub.endpoint
    );
    assert!(
        text(&out).contains(&format!("{url}: status code 404")) && !text(&out).contains("resume"),
        "{}",
        text(&out)
    );
    assert!(!dir.path().join("data/owt/owt_valid.txt").exists());
}
