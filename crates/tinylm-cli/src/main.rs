//! `tinylm`: the command-line tool.

mod commands;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tinylm",
    version,
    about = "Train a byte-level BPE tokenizer and a Transformer LM from scratch"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Byte-level BPE tokenizer: train, encode, decode.
    Bpe(commands::bpe::BpeArgs),
    /// Parameter count, training memory and forward-pass FLOPs of a model.
    Info(commands::info::InfoArgs),
    /// Logits, loss and gradients for given weights and token ids (check against PyTorch).
    Forward(commands::forward::ForwardArgs),
    /// Training-step throughput, where the time goes, its share of the matrix-product peak.
    Bench(commands::bench::step::BenchArgs),
    /// The matrix-product library alone on a training step's product shapes: its peak.
    BenchMatmul(commands::bench::matmul::BenchMatmulArgs),
    /// Under `mpirun -np R`: the ranks' all-reduce alone, 4 KiB to 256 MiB and the gradient.
    BenchAllreduce(commands::bench::allreduce::BenchAllreduceArgs),
    /// Train a model: AdamW, cosine schedule, checkpoints, JSONL log and loss plot.
    Train(Box<commands::train::TrainArgs>),
    /// Train one run per point of a grid and/or list of variants; summary and plots.
    Sweep(Box<commands::sweep::SweepArgs>),
    /// Compare the loss curves of many runs in one figure (SVG or PNG).
    Plot(commands::plot::PlotArgs),
    /// Validation loss and perplexity of a checkpoint on a token file.
    Eval(commands::eval::EvalArgs),
    /// Continue a prompt with a trained model, streaming the text.
    Generate(commands::generate::GenerateArgs),
    /// A model behind the OpenAI API (completions, streamed), with a page to try it.
    Serve(commands::serve::ServeArgs),
    /// From a text file to a model that writes stories: tokenizer, training, samples.
    Quickstart(commands::quickstart::QuickstartArgs),
    /// The assignment's datasets by name, from the Hugging Face Hub, tokenized on request.
    Data(commands::data::DataArgs),
    /// Export a model for Hugging Face transformers (`hf`) or llama.cpp (`gguf`).
    Export(commands::export::ExportArgs),
    /// Import a Hugging Face Llama directory as a tinylm checkpoint.
    Import(commands::import::ImportArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bpe(args) => commands::bpe::run(args),
        Command::Info(args) => commands::info::run(args),
        Command::Forward(args) => commands::forward::run(args),
        Command::Bench(args) => commands::bench::step::run(args),
        Command::BenchMatmul(args) => commands::bench::matmul::run(args),
        Command::BenchAllreduce(args) => commands::bench::allreduce::run(args),
        Command::Train(args) => commands::train::run(*args),
        Command::Sweep(args) => commands::sweep::run(*args),
        Command::Plot(args) => commands::plot::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Generate(args) => commands::generate::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Quickstart(args) => commands::quickstart::run(args),
        Command::Data(args) => commands::data::run(args),
        Command::Export(args) => commands::export::run(args),
        Command::Import(args) => commands::import::run(args),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(2);
    }
}
