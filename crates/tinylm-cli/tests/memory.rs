//! A run takes the memory `tinylm info` and the inference accounting promise, in
//! each precision a command offers: each process's peak resident memory
//! (`wait4`'s `ru_maxrss`) within ±10% of the memory model's figure plus the
//! program's own footprint. The footprint is measured: the peak of the same command
//! on one layer of the same shape, less the model's figure for it — the binary and
//! its libraries, thread stacks, and the working memory of the product libraries and
//! of the allocator, which a product of the same shape takes whatever the number of
//! layers (gemm's packing buffers in f32 training: about 100 MiB at the shape
//! below, kept by the allocator's per-thread arenas). The runs:
//! - training a 58M-parameter model in fp32 and in bf16 through steps in
//!   micro-batches, an evaluation, a checkpoint and a resume
//!   (`RunMemory::peak_resident`), the resume, which reads the checkpoint tensor by
//!   tensor into the training's buffers, within the first run's peak plus a small
//!   allowance;
//! - generating with a 50M-parameter model in fp32, bf16 and q8_0
//!   (`InferenceMemory::decoding` of one sequence), and serving it with 4 slots (of
//!   4 sequences), each KV cache nearly full.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use tinylm::accounting::{InferenceMemory, RunShape};
use tinylm::device::{backend_kind, Device};
use tinylm::kernels::{BackendKind, Precision};
use tinylm::ModelConfig;
use tinylm_bpe::npy;

/// How far a run's peak may be from the memory model's figure (plus the program's
/// footprint), either way: the model counts every buffer the run allocates, and
/// what it does not count — the allocator's slack and rounding, the pages of the
/// token files not read yet — is a few percent (the runs below measure 0.98 to
/// 1.01). A model that forgot a buffer the size of the activations or of the KV
/// caches, or counted one twice, is out by more.
const TOLERANCE: f64 = 0.10;

/// What a resumed run may hold beyond the first run's peak: reading the checkpoint
/// costs no copy of the model or its moments, only the allocator's slack (peaks
/// vary by about 20 MiB from run to run; reading the whole checkpoint first added
/// 120 MiB).
const RESUME_ALLOWANCE_MIB: u64 = 48;

/// The model whose memory is measured: 58M parameters, 232 MB in f32.
fn measured_model() -> ModelConfig {
    ModelConfig {
        vocab_size: 32_000,
        context_length: 256,
        d_model: 512,
        num_layers: 8,
        num_heads: 8,
        d_ff: 1376,
        ..ModelConfig::tinystories()
    }
}

/// Starts `tinylm args`.
fn spawn(args: &[String], stderr: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tinylm"))
        .args(args)
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Runs `tinylm args` and returns its peak resident memory in bytes.
fn peak_rss(args: &[String]) -> u64 {
    let (status, peak) = reap(spawn(args, Stdio::inherit()));
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{args:?} failed"
    );
    peak
}

/// Waits for `child`: its wait status and peak resident memory in bytes.
// The child is reaped by `wait4`, which `Child::wait` cannot replace: it alone
// returns the child's resource usage.
#[allow(clippy::zombie_processes)]
fn reap(child: Child) -> (i32, u64) {
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: waits for this child only, writing into the two locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    (status, usage.ru_maxrss as u64 * 1024) // KiB on Linux
}

/// `flag value` pairs as arguments.
fn flags<V: ToString>(pairs: &[(&str, V)]) -> Vec<String> {
    (pairs.iter())
        .flat_map(|(flag, value)| [flag.to_string(), value.to_string()])
        .collect()
}

/// `peak` within ±[`TOLERANCE`] of `predicted`.
#[track_caller]
fn assert_within_the_memory_model(what: &str, peak: u64, predicted: u64) {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let ratio = peak as f64 / predicted as f64;
    eprintln!(
        "{what}: peak {:.3} GiB, the memory model {:.3} GiB with the program ({ratio:.3} of it)",
        gib(peak),
        gib(predicted)
    );
    assert!(
        (1.0 - TOLERANCE..=1.0 + TOLERANCE).contains(&ratio),
        "{what} peaked at {:.3} GiB, {ratio:.3} of the memory model's {:.3} GiB (limits {} and {})",
        gib(peak),
        gib(predicted),
        1.0 - TOLERANCE,
        1.0 + TOLERANCE
    );
}

/// Training: the token files `t.npy` and `v.npy` of a directory.
struct Training {
    dir: tempfile::TempDir,
}

impl Training {
    fn new(vocab_size: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<u16> = (0..200_000u32)
            .map(|i| (i * 7919 % vocab_size as u32) as u16)
            .collect();
        npy::write(&dir.path().join("t.npy"), &[ids.len()], &ids).unwrap();
        npy::write(&dir.path().join("v.npy"), &[20_000], &ids[..20_000]).unwrap();
        Training { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    /// `tinylm train` of `config` in `precision` into `out`, in steps of `batch`
    /// sequences in micro-batches of `micro`, on 2 threads.
    fn args(
        &self,
        config: &ModelConfig,
        (batch, micro, steps): (usize, usize, usize),
        precision: Precision,
        out: &str,
    ) -> Vec<String> {
        let mut args = vec!["train".to_string()];
        args.extend(flags(&[
            ("--vocab-size", config.vocab_size),
            ("--context-length", config.context_length),
            ("--d-model", config.d_model),
            ("--num-layers", config.num_layers),
            ("--num-heads", config.num_heads),
            ("--d-ff", config.d_ff),
            ("--batch-size", batch),
            ("--micro-batch-size", micro),
            ("--steps", steps),
            ("--eval-batches", 2),
            ("--threads", 2),
        ]));
        args.extend(flags(&[
            ("--train-data", self.path("t.npy")),
            ("--val-data", self.path("v.npy")),
            ("--out-dir", self.path(out)),
            ("--tensorboard", "false".into()),
            ("--precision", precision.to_string()),
        ]));
        args
    }

    /// The memory model's peak for a run of `config` on `target`.
    fn predicted_peak(
        &self,
        config: &ModelConfig,
        batch: usize,
        micro: usize,
        target: BackendKind,
    ) -> u64 {
        let shape = RunShape {
            backend: target,
            ranks: 1,
            sharded: false,
            seq_len: config.context_length,
            token_files: ["t.npy", "v.npy"]
                .iter()
                .map(|name| std::fs::metadata(self.path(name)).unwrap().len())
                .sum(),
        };
        shape.memory(config, batch, micro).peak_resident()
    }
}

#[test]
fn training_evaluation_checkpoint_and_resume_stay_within_the_memory_model() {
    let config = measured_model();
    let (batch, micro) = (4, 2);
    let data = Training::new(config.vocab_size);
    for precision in [Precision::Fp32, Precision::Bf16] {
        let target = cpu_backend(precision);
        let one = ModelConfig {
            num_layers: 1,
            ..config.clone()
        };
        let out = format!("footprint-{precision}");
        let footprint = peak_rss(&data.args(&one, (batch, micro, 1), precision, &out))
            .saturating_sub(data.predicted_peak(&one, batch, micro, target));
        eprintln!(
            "{precision}: the program's own footprint {} MiB",
            footprint >> 20
        );
        let predicted = data.predicted_peak(&config, batch, micro, target) + footprint;
        let out = format!("run-{precision}");
        let first = peak_rss(&data.args(&config, (batch, micro, 2), precision, &out));
        let checkpoint = data.path(&format!("{out}/checkpoint.safetensors"));
        let mut resume = vec!["train".to_string()];
        resume.extend(flags(&[
            ("--resume", checkpoint.as_str()),
            ("--steps", "3"),
        ]));
        let resumed = peak_rss(&resume);
        assert_within_the_memory_model(&format!("{precision}: the first run"), first, predicted);
        assert_within_the_memory_model(
            &format!("{precision}: the resumed run"),
            resumed,
            predicted,
        );
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        assert!(
            resumed <= first + (RESUME_ALLOWANCE_MIB << 20),
            "{precision}: the resumed run peaked at {:.3} GiB, over the first run's {:.3} GiB + \
             {RESUME_ALLOWANCE_MIB} MiB",
            gib(resumed),
            gib(first)
        );
    }
}

/// Generation and serving: a tokenizer `tok/` and checkpoints.
struct Inference {
    data: Training,
}

impl Inference {
    fn new() -> Self {
        let data = Training::new(512);
        let text = data.dir.path().join("corpus.txt");
        std::fs::write(&text, STORY).unwrap();
        let specials = ["<|endoftext|>".to_string()];
        let (vocab, merges) = tinylm_bpe::train::train_bpe(&text, 290, &specials).unwrap();
        tinylm_bpe::files::save_tokenizer(&data.dir.path().join("tok"), &vocab, &merges).unwrap();
        Inference { data }
    }

    /// `NAME/checkpoint.safetensors`, of `config` after one training step, made by
    /// `tinylm train` (were it made here, this process's peak would count in the
    /// commands' it starts: `ru_maxrss` keeps the largest resident size of the
    /// memory a process replaced when it started a program).
    fn checkpoint(&self, name: &str, config: &ModelConfig) -> String {
        peak_rss(&self.data.args(config, (1, 1, 1), Precision::Fp32, name));
        self.data.path(&format!("{name}/checkpoint.safetensors"))
    }

    /// `tinylm COMMAND` of the checkpoint `ckpt` in `precision` on 2 threads.
    fn args(&self, command: &str, ckpt: &str, precision: Precision) -> Vec<String> {
        let mut args = vec![command.to_string()];
        args.extend(flags(&[
            ("--checkpoint", ckpt.to_string()),
            ("--tokenizer", self.data.path("tok")),
            ("--precision", precision.to_string()),
            ("--threads", "2".into()),
        ]));
        args
    }

    /// The peak of `tinylm generate` of 8 greedy tokens after a prompt that fills
    /// the rest of the context.
    fn generate(&self, ckpt: &str, precision: Precision) -> u64 {
        let mut args = self.args("generate", ckpt, precision);
        args.extend(flags(&[
            ("--prompt", STORY),
            ("--max-tokens", "8"),
            ("--temperature", "0"),
        ]));
        let out = Command::new(env!("CARGO_BIN_EXE_tinylm"))
            .args(&args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let (status, peak) = reap(out);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{args:?} failed"
        );
        peak
    }

    /// The peak of `tinylm serve` with `slots` slots through one completion of 8
    /// greedy tokens for each slot at once, each prompt filling the rest of the
    /// context; the server is then killed.
    fn serve(&self, ckpt: &str, precision: Precision, slots: usize) -> u64 {
        let mut args = self.args("serve", ckpt, precision);
        args.extend(flags(&[("--port", 0), ("--slots", slots)]));
        let mut server = spawn(&args, Stdio::piped());
        let mut stderr = BufReader::new(server.stderr.take().unwrap());
        let address = loop {
            let mut line = String::new();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "the server ended");
            if let Some(rest) = line.split("at http://").nth(1) {
                break rest.split('/').next().unwrap().to_string();
            }
        };
        let body = format!(
            r#"{{"prompt":{},"max_tokens":8,"temperature":0}}"#,
            serde_json::to_string(STORY).unwrap()
        );
        let clients: Vec<_> = (0..slots)
            .map(|_| {
                let (address, body) = (address.clone(), body.clone());
                std::thread::spawn(move || {
                    let mut stream = TcpStream::connect(&address).unwrap();
                    write!(
                        stream,
                        "POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: \
                         application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .unwrap();
                    let mut response = String::new();
                    stream.read_to_string(&mut response).unwrap();
                    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
                })
            })
            .collect();
        clients.into_iter().for_each(|c| c.join().unwrap());
        // SAFETY: signals the child this test started and has not reaped.
        unsafe { libc::kill(server.id() as i32, libc::SIGKILL) };
        reap(server).1
    }
}

/// The tokenizer's text, and a prompt of 245 of its tokens: with the 8 generated
/// after it, the KV caches are nearly full.
const STORY: &str = "Once upon a time there was a little dog. The dog liked to run in the park. \
    One day the dog saw a big red ball under a tree. He ran to the ball and played with it all \
    day long. When the sun went down, the little dog went home to sleep. Once upon a time there \
    was a little cat. The cat liked to sit in the sun. One day the cat saw a bird in the tree. \
    She looked at the bird and the bird sang a song. The cat was happy and went home to sleep.";

/// The backend a model of `precision` runs on on the CPU, as the commands choose it.
fn cpu_backend(precision: Precision) -> BackendKind {
    backend_kind(Device::Cpu, precision).unwrap()
}

#[test]
fn generation_and_serving_stay_within_the_inference_accounting() {
    // A model of 50M parameters (198 MB in f32) with a vocabulary of the
    // tokenizer's size: a decoding pass reads the embedding rows of its tokens
    // alone, and the pages of rows never read are never resident.
    let config = ModelConfig {
        vocab_size: 512,
        context_length: 256,
        d_model: 640,
        num_layers: 10,
        num_heads: 10,
        d_ff: 1728,
        ..ModelConfig::tinystories()
    };
    let one = ModelConfig {
        num_layers: 1,
        ..config.clone()
    };
    let files = Inference::new();
    let (ckpt, one_ckpt) = (
        files.checkpoint("model", &config),
        files.checkpoint("one", &one),
    );
    let decoding = |c: &ModelConfig, sequences: usize, precision: Precision| {
        InferenceMemory::decoding(c, sequences, c.context_length, cpu_backend(precision)).total()
    };
    let slots = 4;
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Q8_0] {
        let footprint =
            (files.generate(&one_ckpt, precision)).saturating_sub(decoding(&one, 1, precision));
        let peak = files.generate(&ckpt, precision);
        let predicted = decoding(&config, 1, precision) + footprint;
        eprintln!(
            "generate in {precision}: the program's own footprint {} MiB",
            footprint >> 20
        );
        assert_within_the_memory_model(&format!("generate in {precision}"), peak, predicted);

        let footprint = (files.serve(&one_ckpt, precision, slots))
            .saturating_sub(decoding(&one, slots, precision));
        let peak = files.serve(&ckpt, precision, slots);
        let predicted = decoding(&config, slots, precision) + footprint;
        eprintln!(
            "serve in {precision}: the program's own footprint {} MiB",
            footprint >> 20
        );
        assert_within_the_memory_model(&format!("serve in {precision}"), peak, predicted);
    }
}
