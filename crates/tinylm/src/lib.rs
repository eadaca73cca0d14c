//! tinylm: a decoder-only Transformer LM (Stanford CS336 assignment 1) with
//! hand-written forward and backward kernels, its training loop and generation.

pub mod accounting;
pub mod batching;
pub mod buffers;
pub mod checkpoint;
pub mod compare;
pub mod config;
pub mod data;
pub mod device;
pub mod distributed;
pub mod error;
pub mod export;
pub mod files;
pub mod generate;
pub mod kernels;
pub mod logprobs;
pub mod model;
pub mod optim;
pub mod params;
pub mod plot;
pub mod safetensors_io;
pub mod sweep;
pub mod text;
pub mod train;
pub mod weights;

pub use config::ModelConfig;
pub use error::{Error, Result};
pub use model::{KvCache, Model, NewTokens};
