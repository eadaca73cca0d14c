//! The Transformer LM: one orchestration of forward and backward over the kernel
//! interface ([`Backend`]), llm.c style. Parameters and gradients are flat buffers in
//! the [`ParamLayout`], owned by the backend (host memory on the CPU, device memory
//! on a GPU) for the model's whole life; activations are allocated once per `(B, T)`
//! and reused. Only token ids go in and logits or the loss come out: a training
//! step is queued whole — [`Model::accumulate_gradient`] for each micro-batch, then
//! [`Model::optimizer_step`] — and its loss and gradient norm are read later
//! ([`Model::step_stats`]), so a GPU never waits for the host.
//!
//! Shapes: `B` sequences of `T` tokens, `N = B·T` rows, `C = d_model`, `F = d_ff`,
//! `H` heads of `D` channels, `V = vocab_size`. One block (pre-norm, the default):
//!
//! ```text
//! x ─┬─ ln1 ─ qkv = ·W_qkvᵀ ─ RoPE ─ attention ─ ·W_oᵀ ─(+)─ r1 ─┬─ ln2 ─ W1,W3 ─ SwiGLU ─ ·W2ᵀ ─(+)─ out
//!    └──────────────────────────────────────────────────────┘    └──────────────────────────────┘
//! ```
//! Post-norm moves the norms after the adds (`r1 → ln1 → y`, `r2 → ln2 → out`, no
//! `ln_final`); "none" drops them. `q_proj`, `k_proj`, `v_proj` are adjacent in the
//! layout, so they are one `(3C, C)` matrix and one product.
//!
//! `block_forward` is this diagram as kernel calls, left to right, and
//! `block_backward` the same right to left. Where the norms sit is behind
//! `ModelView::norm` at two places — `Norm::Pre` (what a sublayer reads: `ln(x)` or
//! `x`) and `Norm::Post` (what follows a residual add: `ln(r)` or `r`) — and its
//! backward counterparts. [`transformer_block`] runs one block on its own.
//!
//! Files: this one holds the model's state and bookkeeping (buffers, the step, the
//! checks); `passes.rs` the passes over every block (forward, decoding, backward);
//! `block.rs` one block, forward and backward; `view.rs` what the passes read and
//! write and the norm at its place; `cache.rs` the KV cache.

mod block;
mod cache;
mod passes;
pub mod products;
mod view;

use crate::buffers::{self, Activations, DecodeActivations, GradActivations, LayerActs, PassShape};
use crate::config::{ModelConfig, Positional};
use crate::kernels::cpu::rope::rope_tables;
use crate::kernels::{
    AdamWParams, AdamWStep, Backend, BatchPart, BufKind, Buffer, Collective, Cpu, Float, HostBuf,
    StepStats,
};
use crate::optim::AdamW;
use crate::params::ParamLayout;
use crate::{Error, Result};
use std::ops::Range;

use block::{block_forward, Attention};
pub use cache::{KvCache, NewTokens};
use passes::{backward_pass, decode_pass, forward_pass};
use view::{layer_range, ModelView, ParamGrads, PassBuffers};

/// A Transformer LM with its parameters, gradients and activation buffers, in `f32`
/// (or `f64`, for gradient checks — the same code), run by backend `B`.
pub struct Model<F: Float = f32, B: Backend<F> = Cpu> {
    config: ModelConfig,
    layout: ParamLayout,
    params: B::Buf,
    grads: B::Buf,
    /// RoPE tables `(context_length, D/2)`.
    rope_cos: B::Buf,
    rope_sin: B::Buf,
    /// Activations of the last full pass, kept for backward.
    acts: Option<Activations<B::Buf, B::Ids>>,
    /// Gradient scratch for backward, same `(B, T)` as `acts`.
    grad_acts: Option<GradActivations<B::Buf>>,
    /// The last decoding pass's activations ([`Model::decode`]).
    decode_acts: Option<DecodeActivations<B::Buf, B::Ids>>,
    /// Host copy of the last logits [`Model::forward`] or [`Model::decode`] returned.
    host_logits: Vec<F>,
    /// Whether `acts` holds a `forward_loss` (logits replaced by their gradient).
    loss_ready: bool,
    /// Statistics of the training steps in flight, slot `k % 2` for step `k`, so
    /// step `k + 1` can be queued while step `k`'s are on their way to the host.
    step_stats: [B::Stats; 2],
    /// Training steps queued by [`Model::optimizer_step`], and of those, read by
    /// [`Model::step_stats`].
    steps_launched: u64,
    steps_read: u64,
    /// Statistics read at once: the loss of [`Model::forward_loss`].
    stats: B::Stats,
    backend: B,
}

impl Model<f32> {
    /// A freshly initialized model (SPEC §2 init from `seed`).
    pub fn new(config: ModelConfig, seed: u64) -> Result<Model> {
        Model::init_with_backend(config, seed, Cpu)
    }

    /// A model with the given parameters (in [`ParamLayout`] order).
    pub fn from_params(config: ModelConfig, params: Vec<f32>) -> Result<Model> {
        Model::with_params(config, params)
    }
}

impl<F: Float> Model<F> {
    /// A CPU model in any precision with the given parameters (in [`ParamLayout`] order).
    pub fn with_params(config: ModelConfig, params: Vec<F>) -> Result<Self> {
        Model::with_backend(config, &params, Cpu)
    }
}

impl<B: Backend<f32>> Model<f32, B> {
    /// A freshly initialized model (SPEC §2 init from `seed`) run by `backend`.
    pub fn init_with_backend(config: ModelConfig, seed: u64, backend: B) -> Result<Self> {
        config.validate()?;
        let params = ParamLayout::new(&config).init(seed);
        Model::with_backend(config, &params, backend)
    }

    /// Zero AdamW moments for every parameter, in this model's backend.
    pub fn new_adamw(&self, hp: AdamWParams) -> Result<AdamW<B::Buf>> {
        self.new_adamw_for(hp, 0..self.layout.total)
    }

    /// Zero AdamW moments for the parameters `covers` (a ZeRO-1 shard).
    pub fn new_adamw_for(&self, hp: AdamWParams, covers: Range<usize>) -> Result<AdamW<B::Buf>> {
        let [m, v] = buffers::moments(&self.backend, covers.len())?;
        Ok(AdamW {
            hp,
            covers,
            m,
            v,
            step: 0,
        })
    }

    /// AdamW state back to the host (for a checkpoint), covering what `opt` covers.
    pub fn download_adamw(&self, opt: &AdamW<B::Buf>) -> Result<AdamW> {
        let mut host = AdamW::new(opt.covers.len(), opt.hp);
        host.covers = opt.covers.clone();
        self.backend.download(opt.m.all(), &mut host.m)?;
        self.backend.download(opt.v.all(), &mut host.v)?;
        host.step = opt.step;
        Ok(host)
    }
}

impl<F: Float, B: Backend<F, Buf = HostBuf<F>>> Model<F, B> {
    /// The parameters of a host-memory model.
    pub fn params(&self) -> &[F] {
        &self.params
    }

    pub fn params_mut(&mut self) -> &mut [F] {
        &mut self.params
    }

    /// Gradient of the last [`Model::backward`], in the parameter layout (empty
    /// before the first).
    pub fn grads(&self) -> &[F] {
        &self.grads
    }
}

impl<F: Float, B: Backend<F>> Model<F, B> {
    /// A model run by `backend`, with the given parameters (in [`ParamLayout`] order).
    pub fn with_backend(config: ModelConfig, params: &[F], backend: B) -> Result<Self> {
        Model::with_backend_from(config, backend, |backend, layout| {
            if params.len() != layout.total {
                return Err(Error::Invalid(format!(
                    "parameter buffer has {} values, the configuration needs {}",
                    params.len(),
                    layout.total
                )));
            }
            let mut buf = buffers::parameters(backend, layout)?;
            backend.upload(buf.all_mut(), params)?;
            Ok(buf)
        })
    }

    /// A model run by `backend` whose parameter buffer (`total` values in the
    /// [`ParamLayout`] given) `params` makes: [`buffers::parameters`] filled, e.g.
    /// straight from a checkpoint file, or a file mapped ([`Backend::map_params`]).
    pub fn with_backend_from(
        config: ModelConfig,
        backend: B,
        params: impl FnOnce(&B, &ParamLayout) -> Result<B::Buf>,
    ) -> Result<Self> {
        config.validate()?;
        backend.check_model(&config)?;
        let layout = ParamLayout::new(&config);
        for layer in &layout.layers {
            assert!(
                layer.k_proj.start == layer.q_proj.end && layer.v_proj.start == layer.k_proj.end
            );
        }
        let params = params(&backend, &layout)?;
        assert_eq!(
            params.len(),
            layout.total,
            "a parameter buffer of the layout"
        );
        let [mut rope_cos, mut rope_sin] = buffers::rope_tables(&backend, &config)?;
        if config.positional == Positional::Rope {
            let (cos, sin) =
                rope_tables(config.context_length, config.head_dim(), config.rope_theta);
            backend.upload(rope_cos.all_mut(), &cos)?;
            backend.upload(rope_sin.all_mut(), &sin)?;
        }
        let [first, second, stats] = buffers::statistics(&backend)?;
        Ok(Model {
            params,
            // Allocated by the first backward pass: a model that only runs forward
            // (generation, evaluation) holds no gradient.
            grads: backend.alloc(buffers::GRADIENTS, 0, BufKind::Full)?,
            rope_cos,
            rope_sin,
            config,
            layout,
            acts: None,
            grad_acts: None,
            decode_acts: None,
            host_logits: Vec::new(),
            loss_ready: false,
            step_stats: [first, second],
            steps_launched: 0,
            steps_read: 0,
            stats,
            backend,
        })
    }

    /// The backend running the kernels.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The parameter buffer (in [`ParamLayout`] order), where the backend keeps it.
    pub fn param_buffer(&self) -> &B::Buf {
        &self.params
    }

    /// A host copy of the parameters (in [`ParamLayout`] order).
    pub fn download_params(&self) -> Result<Vec<F>> {
        let mut host = vec![F::ZERO; self.layout.total];
        self.backend.download(self.params.all(), &mut host)?;
        Ok(host)
    }

    /// Replaces every parameter (in [`ParamLayout`] order).
    pub fn upload_params(&mut self, params: &[F]) -> Result<()> {
        if params.len() != self.layout.total {
            return Err(Error::Invalid(format!(
                "parameter buffer has {} values, the configuration needs {}",
                params.len(),
                self.layout.total
            )));
        }
        self.backend.upload(self.params.all_mut(), params)
    }

    /// A host copy of the gradient of the last [`Model::backward`] (empty before
    /// the first).
    pub fn download_grads(&self) -> Result<Vec<F>> {
        let mut host = vec![F::ZERO; self.grads.len()];
        self.backend.download(self.grads.all(), &mut host)?;
        Ok(host)
    }

    /// The gradient buffer at its full size (zeros), unless it is already.
    fn allocate_grads(&mut self) -> Result<()> {
        if self.grads.len() != self.layout.total {
            self.grads = buffers::gradients(&self.backend, &self.layout)?;
        }
        Ok(())
    }

    /// Queues one micro-batch `(B, T)` of the training step being built — forward,
    /// the loss weighted as `part` of the step's batch, backward — into the step's
    /// gradient: its first micro-batch (`!part.accumulate`) overwrites the gradient and
    /// the loss, the others add to them. [`Model::optimizer_step`] ends the step.
    pub fn accumulate_gradient(
        &mut self,
        ids: &[u32],
        targets: &[u32],
        b: usize,
        t: usize,
        part: BatchPart,
    ) -> Result<()> {
        if !part.accumulate && self.steps_launched - self.steps_read == 2 {
            return Err(Error::Invalid(
                "two training steps are in flight: read the older one's statistics first".into(),
            ));
        }
        let slot = (self.steps_launched % 2) as usize;
        self.queue_loss(ids, targets, b, t, part, Some(slot))?;
        self.run_backward(part.accumulate)
    }

    /// Ends the training step [`Model::accumulate_gradient`] built: the gradient summed
    /// over the ranks of `ranks` (each rank's is its share of the batch's mean), its
    /// sum of squares, AdamW with learning rate `lr` and clipping to `max_norm` on the
    /// parameters `opt` covers — under ZeRO-1 a shard, whose gradient alone is
    /// reduced to this rank and whose update every rank then gathers — and the
    /// step's statistics sent. Returns without waiting.
    pub fn optimizer_step(
        &mut self,
        opt: &mut AdamW<B::Buf>,
        lr: f64,
        max_norm: Option<f64>,
        ranks: Option<&dyn Collective<B::Buf, B::Stats>>,
    ) -> Result<()> {
        self.allocate_grads()?;
        let slot = (self.steps_launched % 2) as usize;
        let sharded = opt.covers != (0..self.layout.total);
        match ranks {
            Some(ranks) if sharded => ranks.reduce_scatter_sum(self.grads.all_mut())?,
            Some(ranks) => ranks.all_reduce_sum(self.grads.all_mut())?,
            None if sharded => {
                return Err(Error::Invalid(
                    "the optimizer state is a shard, but no ranks to gather it from".into(),
                ))
            }
            None => {}
        }
        let stats = &mut self.step_stats[slot];
        self.backend
            .sum_squares(self.grads.at(opt.covers.clone()), stats);
        if let (Some(ranks), true) = (ranks, sharded) {
            ranks.all_reduce_sum_squares(stats)?;
        }
        self.queue_adamw(opt, lr, max_norm, slot);
        if let (Some(ranks), true) = (ranks, sharded) {
            ranks.all_gather(self.params.all_mut())?;
        }
        self.backend.send_stats(&mut self.step_stats[slot]);
        self.steps_launched += 1;
        Ok(())
    }

    /// The statistics of the oldest training step in flight
    /// ([`Model::optimizer_step`]), when they reach the host (this waits for that
    /// step only).
    pub fn step_stats(&mut self) -> Result<StepStats> {
        if self.steps_read == self.steps_launched {
            return Err(Error::Invalid("no training step in flight".into()));
        }
        let slot = (self.steps_read % 2) as usize;
        self.steps_read += 1;
        self.backend.read_stats(&self.step_stats[slot])
    }

    /// Queues AdamW step `opt.step + 1`, clipping by the sum of squares in the
    /// statistics of step slot `slot`.
    fn queue_adamw(
        &mut self,
        opt: &mut AdamW<B::Buf>,
        lr: f64,
        max_norm: Option<f64>,
        slot: usize,
    ) {
        opt.step += 1;
        let step = AdamWStep {
            lr,
            t: opt.step,
            hp: opt.hp,
            max_norm,
        };
        let stats = &self.step_stats[slot];
        self.backend.adamw(
            self.params.at_mut(opt.covers.clone()),
            self.grads.at(opt.covers.clone()),
            opt.m.all_mut(),
            opt.v.all_mut(),
            &step,
            stats,
        );
    }

    /// An empty KV cache for [`Model::decode_step`].
    pub fn new_cache(&self) -> Result<KvCache<B::Buf>> {
        KvCache::with_backend(&self.backend, &self.config)
    }

    /// Logits `(B, T, V)` for token ids `(B, T)`, `1 ≤ T ≤ context_length`.
    pub fn forward(&mut self, ids: &[u32], b: usize, t: usize) -> Result<&[F]> {
        self.check_tokens(ids, b, t, "token id")?;
        self.prepare(b, t)?;
        let acts = self.acts.as_mut().expect("prepared");
        self.backend.upload_ids(&mut acts.ids, ids)?;
        self.loss_ready = false;
        self.run_forward();
        let logits = &self.acts.as_ref().expect("prepared").logits;
        self.host_logits.resize(logits.len(), F::ZERO);
        self.backend.download(logits.all(), &mut self.host_logits)?;
        Ok(&self.host_logits)
    }

    /// Mean cross-entropy over the `B·T` positions of predicting `targets (B, T)`
    /// from `ids (B, T)`; keeps what [`Model::backward`] needs. The logits buffer then
    /// holds the loss gradient, so read logits with [`Model::forward`] instead.
    pub fn forward_loss(&mut self, ids: &[u32], targets: &[u32], b: usize, t: usize) -> Result<F> {
        self.queue_loss(ids, targets, b, t, BatchPart::whole(b * t), None)?;
        self.backend.send_stats(&mut self.stats);
        Ok(F::from_f64(self.backend.read_stats(&self.stats)?.loss))
    }

    /// Checks and uploads a batch, queues the forward pass and the loss with its
    /// gradient, weighted as `part` of a batch, into the statistics of step slot
    /// `slot` (`None`: the ones read at once).
    fn queue_loss(
        &mut self,
        ids: &[u32],
        targets: &[u32],
        b: usize,
        t: usize,
        part: BatchPart,
        slot: Option<usize>,
    ) -> Result<()> {
        self.check_tokens(ids, b, t, "token id")?;
        self.check_tokens(targets, b, t, "target id")?;
        self.prepare(b, t)?;
        let acts = self.acts.as_mut().expect("prepared");
        self.backend.upload_ids(&mut acts.ids, ids)?;
        self.backend.upload_ids(&mut acts.targets, targets)?;
        self.run_forward();
        let acts = self.acts.as_mut().expect("prepared");
        let stats = match slot {
            Some(k) => &mut self.step_stats[k],
            None => &mut self.stats,
        };
        self.backend
            .cross_entropy(acts.logits.all_mut(), &acts.targets, true, part, stats);
        self.loss_ready = true;
        Ok(())
    }

    /// The gradient of the last [`Model::forward_loss`] into the model's gradient
    /// buffer (overwritten, not accumulated).
    pub fn backward(&mut self) -> Result<()> {
        self.run_backward(false)
    }

    /// The gradient of the last loss into the gradient buffer, added to it with `add`.
    fn run_backward(&mut self, add: bool) -> Result<()> {
        if !self.loss_ready {
            return Err(Error::Invalid(
                "backward needs a forward_loss first (and no forward in between)".into(),
            ));
        }
        self.loss_ready = false;
        self.allocate_grads()?;
        let acts = self.acts.as_ref().expect("loss_ready implies activations");
        let (b, t) = (acts.b, acts.t);
        if self
            .grad_acts
            .as_ref()
            .is_none_or(|g| g.dresid.len() != b * t * self.config.d_model)
        {
            self.grad_acts = Some(
                GradActivations::new(&self.backend, &self.config, b, t)
                    .map_err(|e| for_shape(e, "backward scratch", b, t))?,
            );
        }
        let (model, bufs) = self.split();
        let acts = bufs.acts.as_ref().expect("loss_ready implies activations");
        let dacts = bufs.grad_acts.as_mut().expect("allocated above");
        let mut grads = ParamGrads {
            buf: bufs.grads,
            add,
        };
        backward_pass(&model, acts, dacts, &mut grads);
        Ok(())
    }

    /// Appends `token` at position `cache.len()` and returns the logits `(V)` for the
    /// next token, attending to everything in the cache: [`Model::decode`] of one
    /// sequence and one token.
    pub fn decode_step(&mut self, cache: &mut KvCache<B::Buf>, token: u32) -> Result<&[F]> {
        self.decode(&mut [NewTokens {
            cache,
            tokens: &[token],
        }])
    }

    /// One forward pass over the new tokens of several sequences, each appended to its
    /// own KV cache at its own position: every matrix product runs once over all
    /// `N = Σ tokens` rows, attention per sequence over its cache. Returns the logits
    /// `(S, V)` for the token after each sequence's last new one. A prompt goes
    /// through in one pass (its positions attend causally among themselves), a
    /// decoded token as one row; both can share a pass.
    pub fn decode(&mut self, sequences: &mut [NewTokens<B::Buf>]) -> Result<&[F]> {
        let c = &self.config;
        if sequences.is_empty() {
            return Err(Error::Invalid("a decoding pass needs a sequence".into()));
        }
        for (s, seq) in sequences.iter().enumerate() {
            let cache = &seq.cache;
            if cache.qkv.len() != c.num_layers
                || cache.d_model != c.d_model
                || cache.context_length != c.context_length
            {
                return Err(Error::Invalid(
                    "KV cache was made for a different model configuration".into(),
                ));
            }
            if seq.tokens.is_empty() {
                return Err(Error::Invalid(format!("sequence {s} has no new token")));
            }
            if cache.len + seq.tokens.len() > c.context_length {
                return Err(Error::Invalid(format!(
                    "KV cache is full: {} positions + {} new > context_length {}",
                    cache.len,
                    seq.tokens.len(),
                    c.context_length
                )));
            }
            if let Some(i) = (seq.tokens.iter()).position(|&id| id as usize >= c.vocab_size) {
                return Err(Error::Invalid(format!(
                    "token id {} at position {} is >= vocab_size {}",
                    seq.tokens[i],
                    cache.len + i,
                    c.vocab_size
                )));
            }
        }
        let ids: Vec<u32> = sequences.iter().flat_map(|s| s.tokens).copied().collect();
        let (rows, seqs) = (ids.len(), sequences.len());
        if (self.decode_acts.as_ref()).is_none_or(|a| (a.rows, a.sequences) != (rows, seqs)) {
            // Free the old shape's buffers before allocating the new ones.
            self.decode_acts = None;
            let acts = DecodeActivations::new(&self.backend, c, rows, seqs)
                .map_err(|e| for_shape(e, "decoding activations", seqs, rows))?;
            self.decode_acts = Some(acts);
        }
        let (model, bufs) = self.split();
        let acts = bufs.decode_acts.as_mut().expect("allocated above");
        model.backend.upload_ids(&mut acts.ids, &ids)?;
        decode_pass(&model, acts, sequences);
        for seq in sequences.iter_mut() {
            seq.cache.len += seq.tokens.len();
        }
        let logits = &self.decode_acts.as_ref().expect("allocated above").logits;
        self.host_logits.resize(logits.len(), F::ZERO);
        self.backend.download(logits.all(), &mut self.host_logits)?;
        Ok(&self.host_logits)
    }

    /// Rejects ids outside the vocabulary (naming the position) and bad shapes.
    fn check_tokens(&self, ids: &[u32], b: usize, t: usize, what: &str) -> Result<()> {
        let c = &self.config;
        check_shape(c, b, t)?;
        if ids.len() != b * t {
            return Err(Error::Invalid(format!(
                "{} {what}s do not form a ({b}, {t}) batch",
                ids.len()
            )));
        }
        if let Some(i) = ids.iter().position(|&id| id as usize >= c.vocab_size) {
            return Err(Error::Invalid(format!(
                "{what} {} at position ({}, {}) is >= vocab_size {}",
                ids[i],
                i / t,
                i % t,
                c.vocab_size
            )));
        }
        Ok(())
    }

    /// Allocates the activations for `(b, t)` when the shape changes.
    fn prepare(&mut self, b: usize, t: usize) -> Result<()> {
        if self.acts.as_ref().is_none_or(|a| (a.b, a.t) != (b, t)) {
            // Free the old shape's buffers before allocating the new ones.
            self.acts = None;
            let acts = Activations::new(&self.backend, &self.config, PassShape::full(b, t))
                .map_err(|e| for_shape(e, "activations", b, t))?;
            self.acts = Some(acts);
        }
        Ok(())
    }

    fn run_forward(&mut self) {
        let (model, bufs) = self.split();
        forward_pass(&model, bufs.acts.as_mut().expect("prepared"));
    }

    /// The view every pass reads, and beside it, borrowed apart, what passes write.
    fn split(&mut self) -> (ModelView<'_, F, B>, PassBuffers<'_, F, B>) {
        let model = ModelView {
            backend: &self.backend,
            config: &self.config,
            layout: &self.layout,
            params: &self.params,
            cos: &self.rope_cos,
            sin: &self.rope_sin,
        };
        let bufs = PassBuffers {
            acts: &mut self.acts,
            grad_acts: &mut self.grad_acts,
            decode_acts: &mut self.decode_acts,
            grads: &mut self.grads,
        };
        (model, bufs)
    }
}

/// Rejects a batch of `b` sequences of `t` positions unless `1 ≤ t ≤ context_length`
/// and `b ≥ 1`.
fn check_shape(c: &ModelConfig, b: usize, t: usize) -> Result<()> {
    if b == 0 || t == 0 {
        return Err(Error::Invalid(format!(
            "batch {b} x sequence {t}: both must be positive"
        )));
    }
    if t > c.context_length {
        return Err(Error::Invalid(format!(
            "sequence length {t} exceeds context_length {}",
            c.context_length
        )));
    }
    Ok(())
}

/// A device error of an allocation for `(b, t)`, saying which buffers and shape did
/// not fit (a smaller batch may).
fn for_shape(e: Error, what: &str, b: usize, t: usize) -> Error {
    match e {
        Error::Device(msg) => Error::Device(format!(
            "{msg} (allocating the {what} of a batch of {b} x {t} tokens; a smaller batch may fit)"
        )),
        e => e,
    }
}
/// One Transformer block's forward on the CPU, by the code a [`Model`] runs for each
/// of its layers: the output `(B, T, C)` for `x (B, T, C)` at positions `0..T`.
/// `config` gives the shape and the ablations (its `num_layers` and `vocab_size`
/// are not used); RoPE's tables cover `context_length` positions, so
/// `T ≤ context_length`. `weights` is the layer's tensors in one buffer in
/// [`ParamLayout`] order, as a model's parameters hold them: `ln1`, `attn.q_proj`,
/// `attn.k_proj`, `attn.v_proj`, `attn.output_proj`, `ln2`, `ffn.w1`, `ffn.w2`,
/// `ffn.w3` (each `.weight`, PyTorch `(out, in)` shapes; the norms and `w3` only
/// where the configuration has them).
pub fn transformer_block(
    config: &ModelConfig,
    weights: &[f32],
    x: &[f32],
    b: usize,
    t: usize,
) -> Result<Vec<f32>> {
    // The block is layer 0 of a one-layer model with a one-token vocabulary.
    let config = ModelConfig {
        num_layers: 1,
        vocab_size: 1,
        ..config.clone()
    };
    config.validate()?;
    let layout = ParamLayout::new(&config);
    let block = layer_range(&layout.layers[0]);
    if weights.len() != block.len() {
        let tensors: Vec<String> = (layout.specs.iter())
            .filter_map(|s| {
                let name = s.name.strip_prefix("layers.0.")?;
                Some(format!("{name} {:?}", s.shape))
            })
            .collect();
        return Err(Error::Invalid(format!(
            "the block's weights have {} values, expected {} = {}",
            weights.len(),
            block.len(),
            tensors.join(" + ")
        )));
    }
    check_shape(&config, b, t)?;
    let d = config.d_model;
    if x.len() != b * t * d {
        return Err(Error::Invalid(format!(
            "x has {} values, expected (B, T, C) = ({b}, {t}, {d}): {}",
            x.len(),
            b * t * d
        )));
    }
    let mut params = vec![0.0; layout.total];
    params[block].copy_from_slice(weights);
    let mut one_layer = Model::from_params(config, params)?;
    let (model, _) = one_layer.split();
    let mut acts = LayerActs::new(model.backend, model.config, PassShape::full(b, t))?;
    let (x, mut out) = (HostBuf::from(x.to_vec()), HostBuf::from(vec![0.0; x.len()]));
    let layer = &model.layout.layers[0];
    let shape = model.attn_shape(b, t, 0);
    block_forward(
        &model,
        layer,
        &mut acts,
        x.all(),
        &mut out,
        Attention::Full(shape),
    );
    Ok(out.into_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Ffn, Norm};

    /// Address and capacity of every buffer a training step touches.
    fn buffers(m: &Model) -> Vec<(usize, usize)> {
        let id = |v: &HostBuf<f32>| (v.as_ptr() as usize, v.len());
        let a = m.acts.as_ref().unwrap();
        let g = m.grad_acts.as_ref().unwrap();
        let mut all = vec![id(&m.params), id(&m.grads), id(&a.lnf), id(&a.logits)];
        all.push((a.ids.as_ptr() as usize, a.ids.capacity()));
        all.extend(a.resid.iter().map(id));
        for l in &a.layers {
            for v in [
                &l.ln1, &l.rstd1, &l.qkv, &l.att, &l.atty, &l.r1, &l.ln2, &l.rstd2, &l.h1, &l.h3,
                &l.gate, &l.r2,
            ] {
                all.push(id(v));
            }
        }
        for v in [
            &g.dresid, &g.dtmp, &g.dqkv, &g.datt, &g.datty, &g.dh1, &g.dh3, &g.dgate,
        ] {
            all.push(id(v));
        }
        // dresid and dtmp swap roles in post-norm: compare as a set.
        all.sort();
        all
    }

    #[test]
    fn training_steps_reuse_every_buffer() {
        for norm in [Norm::Pre, Norm::Post] {
            let c = ModelConfig {
                vocab_size: 32,
                context_length: 16,
                d_model: 16,
                num_layers: 2,
                num_heads: 2,
                d_ff: 32,
                norm,
                ..ModelConfig::tinystories()
            };
            let mut model = Model::new(c, 0).unwrap();
            let ids: Vec<u32> = (0..3 * 16).map(|i| i % 32).collect();
            let mut opt = model.new_adamw(Default::default()).unwrap();
            let mut step = |model: &mut Model| {
                let part = BatchPart::whole(3 * 16);
                model.accumulate_gradient(&ids, &ids, 3, 16, part).unwrap();
                model
                    .optimizer_step(&mut opt, 0.01, Some(1.0), None)
                    .unwrap();
                model.step_stats().unwrap();
            };
            step(&mut model);
            let before = buffers(&model);
            for _ in 0..3 {
                step(&mut model);
            }
            assert_eq!(buffers(&model), before);
            // Only a new shape reallocates.
            model.forward(&ids[..16], 1, 16).unwrap();
            assert!(model.acts.as_ref().is_some_and(|a| a.b == 1));
        }
    }

    /// The public one-block forward, on the embedding output and then on block 0's
    /// output, gives exactly what each block of a full forward wrote.
    #[test]
    fn transformer_block_is_the_models_block() {
        for (norm, positional, ffn) in [
            (Norm::Pre, Positional::Rope, Ffn::Swiglu),
            (Norm::Post, Positional::Rope, Ffn::Silu),
            (Norm::None, Positional::None, Ffn::Swiglu),
        ] {
            let c = ModelConfig {
                vocab_size: 32,
                context_length: 16,
                d_model: 16,
                num_layers: 2,
                num_heads: 2,
                d_ff: 24,
                norm,
                positional,
                ffn,
                ..ModelConfig::tinystories()
            };
            let mut model = Model::new(c.clone(), 1).unwrap();
            let (b, t) = (2, 5);
            let ids: Vec<u32> = (0..b * t).map(|i| (7 * i % 32) as u32).collect();
            model.forward(&ids, b, t).unwrap();
            let acts = model.acts.as_ref().unwrap();
            for (l, layer) in model.layout.layers.iter().enumerate() {
                let prefix = format!("layers.{l}.");
                let specs = model.layout.specs.iter();
                let len: usize = (specs.filter(|s| s.name.starts_with(&prefix)))
                    .map(|s| s.len())
                    .sum();
                assert_eq!(layer_range(layer).len(), len);
                let weights = &model.params[layer_range(layer)];
                let out = transformer_block(&c, weights, &acts.resid[l], b, t).unwrap();
                assert_eq!(out, &acts.resid[l + 1][..], "layer {l}, {norm:?}");
            }
            let weights = &model.params[layer_range(&model.layout.layers[0])];
            let x = &acts.resid[0];
            let err = |r: Result<Vec<f32>>| r.unwrap_err().to_string();
            let short = err(transformer_block(&c, &weights[1..], x, b, t));
            assert!(short.contains("q_proj.weight [16, 16]"), "{short}");
            assert!(err(transformer_block(&c, weights, x, b, t + 1)).contains("(B, T, C)"));
            assert!(err(transformer_block(&c, weights, x, 1, 17)).contains("context_length"));
        }
    }
}
