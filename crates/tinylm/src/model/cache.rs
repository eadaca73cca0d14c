//! A sequence's keys and values for decoding ([`KvCache`]), and its part of a
//! decoding pass ([`NewTokens`]).

use crate::buffers::{self};
use crate::config::ModelConfig;
use crate::kernels::{Backend, Buffer, Cpu, Float, HostBuf};
use crate::Result;

/// Keys and values of every position decoded so far, per layer, for generation,
/// in buffers of the model's backend ([`BufKind::Cache`](crate::kernels::BufKind::Cache): bf16 where attention's
/// products round to bf16).
pub struct KvCache<Buf = HostBuf<f32>> {
    pub(super) len: usize,
    pub(super) context_length: usize,
    pub(super) d_model: usize,
    /// Per layer `(context_length, 3C)`: rows of `[q | k | v]` after RoPE (the `q`
    /// part is scratch), so attention reads the cache like a full pass's `qkv`.
    pub(super) qkv: Vec<Buf>,
}

impl KvCache {
    /// An empty CPU cache for a model of this configuration.
    pub fn new(config: &ModelConfig) -> Self {
        Self::with_backend::<f32, Cpu>(&Cpu, config).expect("host allocation")
    }
}

/// One sequence's part of a decoding pass ([`Model::decode`](super::Model::decode)): its KV cache and the
/// tokens appended to it (at positions `cache.len()..`).
pub struct NewTokens<'a, Buf = HostBuf<f32>> {
    pub cache: &'a mut KvCache<Buf>,
    pub tokens: &'a [u32],
}

impl<Buf: Buffer> KvCache<Buf> {
    /// An empty cache in `backend`'s buffers.
    pub fn with_backend<F: Float, B: Backend<F, Buf = Buf>>(
        backend: &B,
        config: &ModelConfig,
    ) -> Result<Self> {
        Ok(KvCache {
            len: 0,
            context_length: config.context_length,
            d_model: config.d_model,
            qkv: buffers::kv_cache(backend, config)?,
        })
    }

    /// Positions decoded so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most positions it holds (`context_length`).
    pub fn capacity(&self) -> usize {
        self.context_length
    }

    /// Forgets every position (keeps the memory).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Keeps the first `len` positions (if it holds more) and forgets the rest.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}
