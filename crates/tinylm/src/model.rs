//! The Transformer LM: one orchestration of forward and backward over the kernel
//! interface ([`Backend`]), llm.c style. Parameters and gradients are flat buffers in
//! the [`ParamLayout`], owned by the backend (host memory on the CPU, device memory
//! on a GPU) for the model's whole life; activations are allocated once per `(B, T)`
//! and reused. Only token ids go in and logits or the loss come out: a training
//! step ([`Model::train_step`]) is queued whole, and its loss and gradient norm are
//! read later ([`Model::step_stats`]), so a GPU never waits for the host.
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

use crate::config::{Ffn, ModelConfig, Norm, Positional};
use crate::kernels::cpu::rope::rope_tables;
use crate::kernels::{
    AdamWParams, AdamWStep, AttnShape, Backend, BufKind, Buffer, Cpu, Float, MatMul, Span,
    StepStats,
};
use crate::optim::AdamW;
use crate::params::ParamLayout;
use crate::{Error, Result};
use std::ops::Range;

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
    /// Single-token activations for [`Model::decode_step`].
    decode_acts: Option<Activations<B::Buf, B::Ids>>,
    /// Host copy of the last logits [`Model::forward`] or [`Model::decode_step`] returned.
    host_logits: Vec<F>,
    /// Whether `acts` holds a `forward_loss` (logits replaced by their gradient).
    loss_ready: bool,
    /// Statistics of the training steps in flight, slot `k % 2` for step `k`, so
    /// step `k + 1` can be queued while step `k`'s are on their way to the host.
    step_stats: [B::Stats; 2],
    /// Training steps queued by [`Model::train_step`], and of those, read by
    /// [`Model::step_stats`].
    steps_launched: u64,
    steps_read: u64,
    /// Statistics read at once: [`Model::forward_loss`], [`Model::grad_norm`] and
    /// the clipping of [`Model::adamw_step`].
    stats: B::Stats,
    backend: B,
}

/// Keys and values of every position decoded so far, per layer, for generation,
/// in buffers of the model's backend.
pub struct KvCache<Buf = Vec<f32>> {
    len: usize,
    context_length: usize,
    d_model: usize,
    /// Per layer `(context_length, 3C)`: rows of `[q | k | v]` after RoPE (the `q`
    /// part is scratch), so attention reads the cache like a full pass's `qkv`.
    qkv: Vec<Buf>,
}

impl KvCache {
    /// An empty CPU cache for a model of this configuration.
    pub fn new(config: &ModelConfig) -> Self {
        Self::with_backend::<f32, Cpu>(&Cpu, config).expect("host allocation")
    }
}

impl<Buf: Buffer> KvCache<Buf> {
    /// An empty cache in `backend`'s buffers.
    pub fn with_backend<F: Float, B: Backend<F, Buf = Buf>>(
        backend: &B,
        config: &ModelConfig,
    ) -> Result<Self> {
        let size = config.context_length * 3 * config.d_model;
        Ok(KvCache {
            len: 0,
            context_length: config.context_length,
            d_model: config.d_model,
            qkv: (0..config.num_layers)
                .map(|_| backend.alloc(size, BufKind::Activations))
                .collect::<Result<_>>()?,
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
        self.len = 0;
    }
}

/// One block's activations, `N` rows. Buffers an ablation does not use are empty.
struct LayerActs<Buf> {
    /// `(N, C)`, `(N)`: pre-norm `ln1(x)`; post-norm `ln1(r1)` (= the FFN input).
    ln1: Buf,
    rstd1: Buf,
    /// `(N, 3C)` queries (after RoPE), keys (after RoPE), values; empty when decoding
    /// (they live in the [`KvCache`]).
    qkv: Buf,
    /// `(B, H, Tq, T)` attention probabilities.
    att: Buf,
    /// `(N, C)` attention output before `output_proj`.
    atty: Buf,
    /// `(N, C)` first residual sum `x + attn`.
    r1: Buf,
    /// `(N, C)`, `(N)`: pre-norm `ln2(r1)`; post-norm keeps only `rstd2` of `ln2(r2)`.
    ln2: Buf,
    rstd2: Buf,
    /// `(N, F)` `W1 x`, `W3 x` (SwiGLU only), and the gated product.
    h1: Buf,
    h3: Buf,
    gate: Buf,
    /// `(N, C)` second residual sum before post-norm's `ln2` (post-norm only).
    r2: Buf,
}

/// Everything a forward pass writes, for one `(B, T)`.
struct Activations<Buf, Ids> {
    b: usize,
    t: usize,
    /// `(B, T)` input and target token ids.
    ids: Ids,
    targets: Ids,
    /// `num_layers + 1` of `(N, C)`: the embedding output and every block's output.
    resid: Vec<Buf>,
    layers: Vec<LayerActs<Buf>>,
    /// `(N, C)`, `(N)`: `ln_final` (pre-norm only).
    lnf: Buf,
    lnf_rstd: Buf,
    /// `(N, V)` logits, or their gradient after `forward_loss`.
    logits: Buf,
}

/// Backward scratch for one `(B, T)`.
struct GradActivations<Buf> {
    /// `(N, C)` gradient flowing down the residual stream, and a second `(N, C)`.
    dresid: Buf,
    dtmp: Buf,
    /// `(N, 3C)`, `(B, H, T, T)`, `(N, C)`.
    dqkv: Buf,
    datt: Buf,
    datty: Buf,
    /// `(N, F)` each (`dh3` empty for SiLU).
    dh1: Buf,
    dh3: Buf,
    dgate: Buf,
}

impl<Buf: Buffer, Ids> Activations<Buf, Ids> {
    /// Buffers for `b` sequences of `t` queries attending `keys` positions
    /// (`keys = t` for a full pass, `context_length` for decoding).
    fn new<F: Float, B: Backend<F, Buf = Buf, Ids = Ids>>(
        be: &B,
        c: &ModelConfig,
        b: usize,
        t: usize,
        keys: usize,
        decode: bool,
    ) -> Result<Self> {
        let n = b * t;
        let (d, f) = (c.d_model, c.d_ff);
        let pre = c.norm == Norm::Pre;
        let post = c.norm == Norm::Post;
        let has_norm = c.norm != Norm::None;
        let act = |len: usize| be.alloc(len, BufKind::Activations);
        let act_if = |cond: bool, len: usize| act(if cond { len } else { 0 });
        let stat_if = |cond: bool, len: usize| be.alloc(if cond { len } else { 0 }, BufKind::Full);
        let layers = (0..c.num_layers)
            .map(|_| {
                Ok(LayerActs {
                    ln1: act_if(has_norm, n * d)?,
                    rstd1: stat_if(has_norm, n)?,
                    qkv: act_if(!decode, n * 3 * d)?,
                    att: act(b * c.num_heads * t * keys)?,
                    atty: act(n * d)?,
                    r1: act(n * d)?,
                    ln2: act_if(pre, n * d)?,
                    rstd2: stat_if(has_norm, n)?,
                    h1: act(n * f)?,
                    h3: act_if(c.ffn == Ffn::Swiglu, n * f)?,
                    gate: act(n * f)?,
                    r2: act_if(post, n * d)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Activations {
            b,
            t,
            ids: be.alloc_ids(n)?,
            targets: be.alloc_ids(n)?,
            resid: (0..=c.num_layers)
                .map(|_| act(n * d))
                .collect::<Result<_>>()?,
            layers,
            lnf: act_if(pre, n * d)?,
            lnf_rstd: stat_if(pre, n)?,
            logits: act(n * c.vocab_size)?,
        })
    }
}

impl<Buf: Buffer> GradActivations<Buf> {
    fn new<F: Float, B: Backend<F, Buf = Buf>>(
        be: &B,
        c: &ModelConfig,
        b: usize,
        t: usize,
    ) -> Result<Self> {
        let n = b * t;
        let (d, f) = (c.d_model, c.d_ff);
        let act = |len: usize| be.alloc(len, BufKind::Activations);
        Ok(GradActivations {
            dresid: act(n * d)?,
            dtmp: act(n * d)?,
            dqkv: act(n * 3 * d)?,
            datt: act(b * c.num_heads * t * t)?,
            datty: act(n * d)?,
            dh1: act(n * f)?,
            dh3: act(if c.ffn == Ffn::Swiglu { n * f } else { 0 })?,
            dgate: act(n * f)?,
        })
    }
}

/// Read-only view of what every pass needs: shape, layout, parameters, RoPE tables.
struct Weights<'a, Buf> {
    c: &'a ModelConfig,
    layout: &'a ParamLayout,
    params: &'a Buf,
    cos: &'a Buf,
    sin: &'a Buf,
}

impl<Buf: Buffer> Weights<'_, Buf> {
    fn get(&self, r: &Range<usize>) -> Span<'_, Buf> {
        self.params.at(r.clone())
    }

    fn gain(&self, r: &Option<Range<usize>>) -> Span<'_, Buf> {
        self.params
            .at(r.clone().expect("norm gain present when norms are on"))
    }
}

/// The fused `(3C, C)` range of `q_proj`, `k_proj`, `v_proj` in layer `l`.
fn qkv_range(layout: &ParamLayout, l: usize) -> Range<usize> {
    let lo = &layout.layers[l];
    lo.q_proj.start..lo.v_proj.end
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

    /// Zero AdamW moments in this model's backend.
    pub fn new_adamw(&self, hp: AdamWParams) -> Result<AdamW<B::Buf>> {
        let n = self.layout.total;
        Ok(AdamW {
            hp,
            m: self.backend.alloc(n, BufKind::Full)?,
            v: self.backend.alloc(n, BufKind::Full)?,
            step: 0,
        })
    }

    /// AdamW state from the host (a checkpoint's) into this model's backend.
    pub fn upload_adamw(&self, host: &AdamW) -> Result<AdamW<B::Buf>> {
        let mut opt = self.new_adamw(host.hp)?;
        self.backend.upload(opt.m.all_mut(), &host.m)?;
        self.backend.upload(opt.v.all_mut(), &host.v)?;
        opt.step = host.step;
        Ok(opt)
    }

    /// AdamW state back to the host (for a checkpoint).
    pub fn download_adamw(&self, opt: &AdamW<B::Buf>) -> Result<AdamW> {
        let mut host = AdamW::new(self.layout.total, opt.hp);
        self.backend.download(opt.m.all(), &mut host.m)?;
        self.backend.download(opt.v.all(), &mut host.v)?;
        host.step = opt.step;
        Ok(host)
    }
}

impl<F: Float, B: Backend<F, Buf = Vec<F>>> Model<F, B> {
    /// The parameters of a host-memory model.
    pub fn params(&self) -> &[F] {
        &self.params
    }

    pub fn params_mut(&mut self) -> &mut [F] {
        &mut self.params
    }

    /// Gradient of the last [`Model::backward`], in the parameter layout.
    pub fn grads(&self) -> &[F] {
        &self.grads
    }
}

impl<F: Float, B: Backend<F>> Model<F, B> {
    /// A model run by `backend`, with the given parameters (in [`ParamLayout`] order).
    pub fn with_backend(config: ModelConfig, params: &[F], backend: B) -> Result<Self> {
        config.validate()?;
        let layout = ParamLayout::new(&config);
        if params.len() != layout.total {
            return Err(Error::Invalid(format!(
                "parameter buffer has {} values, the configuration needs {}",
                params.len(),
                layout.total
            )));
        }
        for lo in &layout.layers {
            assert!(lo.k_proj.start == lo.q_proj.end && lo.v_proj.start == lo.k_proj.end);
        }
        let (cos, sin) = if config.positional == Positional::Rope {
            rope_tables(config.context_length, config.head_dim(), config.rope_theta)
        } else {
            (Vec::new(), Vec::new())
        };
        let upload = |values: &[F], kind: BufKind| -> Result<B::Buf> {
            let mut buf = backend.alloc(values.len(), kind)?;
            backend.upload(buf.all_mut(), values)?;
            Ok(buf)
        };
        Ok(Model {
            params: upload(params, BufKind::Params)?,
            grads: backend.alloc(layout.total, BufKind::Full)?,
            rope_cos: upload(&cos, BufKind::Full)?,
            rope_sin: upload(&sin, BufKind::Full)?,
            config,
            layout,
            acts: None,
            grad_acts: None,
            decode_acts: None,
            host_logits: Vec::new(),
            loss_ready: false,
            step_stats: [backend.alloc_stats()?, backend.alloc_stats()?],
            steps_launched: 0,
            steps_read: 0,
            stats: backend.alloc_stats()?,
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

    /// A host copy of the gradient of the last [`Model::backward`].
    pub fn download_grads(&self) -> Result<Vec<F>> {
        let mut host = vec![F::ZERO; self.layout.total];
        self.backend.download(self.grads.all(), &mut host)?;
        Ok(host)
    }

    /// The global L2 norm of the gradient of the last [`Model::backward`].
    pub fn grad_norm(&mut self) -> Result<f64> {
        self.backend.sum_squares(self.grads.all(), &mut self.stats);
        self.backend.send_stats(&mut self.stats);
        Ok(self.backend.read_stats(&self.stats)?.grad_norm())
    }

    /// One AdamW update (SPEC §3) of every parameter from the last gradient,
    /// clipped first to the global norm `max_norm` when given.
    pub fn adamw_step(&mut self, opt: &mut AdamW<B::Buf>, lr: f64, max_norm: Option<f64>) {
        if max_norm.is_some() {
            self.backend.sum_squares(self.grads.all(), &mut self.stats);
        }
        self.queue_adamw(opt, lr, max_norm, None);
    }

    /// Queues one whole training step on token ids and `targets (B, T)` — forward,
    /// loss, backward, the gradient's sum of squares, AdamW with learning rate `lr`
    /// and clipping to `max_norm` computed by the backend — and returns without
    /// waiting for it. [`Model::step_stats`] reads its loss and gradient norm later;
    /// at most two steps are in flight.
    #[allow(clippy::too_many_arguments)]
    pub fn train_step(
        &mut self,
        ids: &[u32],
        targets: &[u32],
        b: usize,
        t: usize,
        opt: &mut AdamW<B::Buf>,
        lr: f64,
        max_norm: Option<f64>,
    ) -> Result<()> {
        let slot = (self.steps_launched % 2) as usize;
        if self.steps_launched - self.steps_read == 2 {
            return Err(Error::Invalid(
                "two training steps are in flight: read the older one's statistics first".into(),
            ));
        }
        self.queue_loss(ids, targets, b, t, Some(slot))?;
        self.backward()?;
        let stats = &mut self.step_stats[slot];
        self.backend.sum_squares(self.grads.all(), stats);
        self.queue_adamw(opt, lr, max_norm, Some(slot));
        self.backend.send_stats(&mut self.step_stats[slot]);
        self.steps_launched += 1;
        Ok(())
    }

    /// The statistics of the oldest training step in flight ([`Model::train_step`]),
    /// when they reach the host (this waits for that step only).
    pub fn step_stats(&mut self) -> Result<StepStats> {
        if self.steps_read == self.steps_launched {
            return Err(Error::Invalid("no training step in flight".into()));
        }
        let slot = (self.steps_read % 2) as usize;
        self.steps_read += 1;
        self.backend.read_stats(&self.step_stats[slot])
    }

    /// Queues AdamW step `opt.step + 1`, clipping by the sum of squares in the
    /// statistics of step slot `slot` (`None`: the ones read at once).
    fn queue_adamw(
        &mut self,
        opt: &mut AdamW<B::Buf>,
        lr: f64,
        max_norm: Option<f64>,
        slot: Option<usize>,
    ) {
        opt.step += 1;
        let step = AdamWStep {
            lr,
            t: opt.step,
            hp: opt.hp,
            max_norm,
        };
        let stats = slot.map_or(&self.stats, |k| &self.step_stats[k]);
        self.backend.adamw(
            self.params.all_mut(),
            self.grads.all(),
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
        self.queue_loss(ids, targets, b, t, None)?;
        self.backend.send_stats(&mut self.stats);
        Ok(F::from_f64(self.backend.read_stats(&self.stats)?.loss))
    }

    /// Checks and uploads a batch, queues the forward pass and the loss with its
    /// gradient into the statistics of step slot `slot` (`None`: the ones read at once).
    fn queue_loss(
        &mut self,
        ids: &[u32],
        targets: &[u32],
        b: usize,
        t: usize,
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
            .cross_entropy(acts.logits.all_mut(), &acts.targets, true, stats);
        self.loss_ready = true;
        Ok(())
    }

    /// The gradient of the last [`Model::forward_loss`] into the model's gradient
    /// buffer (overwritten, not accumulated).
    pub fn backward(&mut self) -> Result<()> {
        if !self.loss_ready {
            return Err(Error::Invalid(
                "backward needs a forward_loss first (and no forward in between)".into(),
            ));
        }
        self.loss_ready = false;
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
        let w = Weights {
            c: &self.config,
            layout: &self.layout,
            params: &self.params,
            cos: &self.rope_cos,
            sin: &self.rope_sin,
        };
        let g = self.grad_acts.as_mut().expect("allocated above");
        backward_pass(&self.backend, &w, acts, g, &mut self.grads);
        Ok(())
    }

    /// Appends `token` at position `cache.len()` and returns the logits `(V)` for the
    /// next token, attending to everything in the cache.
    pub fn decode_step(&mut self, cache: &mut KvCache<B::Buf>, token: u32) -> Result<&[F]> {
        let c = &self.config;
        if cache.qkv.len() != c.num_layers
            || cache.d_model != c.d_model
            || cache.context_length != c.context_length
        {
            return Err(Error::Invalid(
                "KV cache was made for a different model configuration".into(),
            ));
        }
        if cache.len >= c.context_length {
            return Err(Error::Invalid(format!(
                "KV cache is full: {} positions = context_length",
                cache.len
            )));
        }
        if token as usize >= c.vocab_size {
            return Err(Error::Invalid(format!(
                "token id {token} at position {} is >= vocab_size {}",
                cache.len, c.vocab_size
            )));
        }
        if self.decode_acts.is_none() {
            let acts = Activations::new(&self.backend, c, 1, 1, c.context_length, true)
                .map_err(|e| for_shape(e, "decoding activations", 1, 1))?;
            self.decode_acts = Some(acts);
        }
        let acts = self.decode_acts.as_mut().expect("allocated above");
        self.backend.upload_ids(&mut acts.ids, &[token])?;
        let w = Weights {
            c,
            layout: &self.layout,
            params: &self.params,
            cos: &self.rope_cos,
            sin: &self.rope_sin,
        };
        forward_pass(&self.backend, &w, acts, Some(cache));
        cache.len += 1;
        self.host_logits.resize(c.vocab_size, F::ZERO);
        self.backend
            .download(acts.logits.all(), &mut self.host_logits)?;
        Ok(&self.host_logits)
    }

    /// Rejects ids outside the vocabulary (naming the position) and bad shapes.
    fn check_tokens(&self, ids: &[u32], b: usize, t: usize, what: &str) -> Result<()> {
        let c = &self.config;
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
            let acts = Activations::new(&self.backend, &self.config, b, t, t, false)
                .map_err(|e| for_shape(e, "activations", b, t))?;
            self.acts = Some(acts);
        }
        Ok(())
    }

    fn run_forward(&mut self) {
        let w = Weights {
            c: &self.config,
            layout: &self.layout,
            params: &self.params,
            cos: &self.rope_cos,
            sin: &self.rope_sin,
        };
        let acts = self.acts.as_mut().expect("prepared");
        forward_pass(&self.backend, &w, acts, None);
    }
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

/// The forward pass from `acts.ids` to `acts.logits`. With a cache, `acts` is one
/// token (`B = T = 1`) at position `cache.len()`, its keys and values are appended
/// to the cache (the caller advances `len`) and attention reads the whole cache.
fn forward_pass<F: Float, B: Backend<F>>(
    be: &B,
    w: &Weights<B::Buf>,
    acts: &mut Activations<B::Buf, B::Ids>,
    mut cache: Option<&mut KvCache<B::Buf>>,
) {
    let c = w.c;
    let (b, t) = (acts.b, acts.t);
    let (n, d, f, h) = (b * t, c.d_model, c.d_ff, c.num_heads);
    let (pre, post) = (c.norm == Norm::Pre, c.norm == Norm::Post);
    let swiglu = c.ffn == Ffn::Swiglu;
    be.embedding_forward(
        acts.resid[0].all_mut(),
        &acts.ids,
        w.get(&w.layout.token_embeddings),
    );
    for (l, la) in acts.layers.iter_mut().enumerate() {
        let lo = &w.layout.layers[l];
        let (before, after) = acts.resid.split_at_mut(l + 1);
        let (x, out) = (before[l].all(), &mut after[0]);
        let attn_in = if pre {
            be.rmsnorm_forward(la.ln1.all_mut(), la.rstd1.all_mut(), x, w.gain(&lo.ln1));
            la.ln1.all()
        } else {
            x
        };
        let q0 = cache.as_ref().map_or(0, |kv| kv.len);
        let shape = AttnShape {
            b,
            t: q0 + t,
            h,
            d: c.head_dim(),
            q0,
        };
        // `(B, T, 3C)` rows of the pass (full) or of the whole cache (decoding).
        let qkv = match cache.as_deref_mut() {
            Some(kv) => &mut kv.qkv[l],
            None => &mut la.qkv,
        };
        let rows = 3 * d * q0..3 * d * (q0 + n);
        be.matmul(
            qkv.at_mut(rows.clone()),
            attn_in,
            w.get(&qkv_range(w.layout, l)),
            MatMul::linear(n, d, 3 * d),
        );
        if c.positional == Positional::Rope {
            be.rope(qkv.at_mut(rows), w.cos.all(), w.sin.all(), shape, false);
        }
        be.attention_forward(
            la.atty.all_mut(),
            la.att.at_mut(0..b * h * shape.tq() * shape.t),
            qkv.at(0..3 * d * shape.t * b),
            shape,
        );
        be.copy(la.r1.all_mut(), x);
        be.matmul(
            la.r1.all_mut(),
            la.atty.all(),
            w.get(&lo.output_proj),
            MatMul::linear(n, d, d).accumulating(),
        );
        let y = if post {
            be.rmsnorm_forward(
                la.ln1.all_mut(),
                la.rstd1.all_mut(),
                la.r1.all(),
                w.gain(&lo.ln1),
            );
            la.ln1.all()
        } else {
            la.r1.all()
        };
        let ffn_in = if pre {
            be.rmsnorm_forward(la.ln2.all_mut(), la.rstd2.all_mut(), y, w.gain(&lo.ln2));
            la.ln2.all()
        } else {
            y
        };
        be.matmul(
            la.h1.all_mut(),
            ffn_in,
            w.get(&lo.w1),
            MatMul::linear(n, d, f),
        );
        if let Some(w3) = &lo.w3 {
            be.matmul(la.h3.all_mut(), ffn_in, w.get(w3), MatMul::linear(n, d, f));
        }
        be.swiglu_forward(la.gate.all_mut(), la.h1.all(), swiglu.then(|| la.h3.all()));
        let r2 = if post { &mut la.r2 } else { &mut *out };
        be.copy(r2.all_mut(), y);
        be.matmul(
            r2.all_mut(),
            la.gate.all(),
            w.get(&lo.w2),
            MatMul::linear(n, f, d).accumulating(),
        );
        if post {
            be.rmsnorm_forward(
                out.all_mut(),
                la.rstd2.all_mut(),
                la.r2.all(),
                w.gain(&lo.ln2),
            );
        }
    }
    let last = acts.resid[c.num_layers].all();
    let hidden = if pre {
        be.rmsnorm_forward(
            acts.lnf.all_mut(),
            acts.lnf_rstd.all_mut(),
            last,
            w.gain(&w.layout.ln_final),
        );
        acts.lnf.all()
    } else {
        last
    };
    be.matmul(
        acts.logits.all_mut(),
        hidden,
        w.get(&w.layout.lm_head),
        MatMul::linear(n, d, c.vocab_size),
    );
}

/// The backward pass of the last full forward, whose logits buffer holds
/// `∂loss/∂logits`: every parameter's gradient into `grads` (overwritten).
fn backward_pass<F: Float, B: Backend<F>>(
    be: &B,
    w: &Weights<B::Buf>,
    acts: &Activations<B::Buf, B::Ids>,
    g: &mut GradActivations<B::Buf>,
    grads: &mut B::Buf,
) {
    let c = w.c;
    let (b, t) = (acts.b, acts.t);
    let (n, d, f, v) = (b * t, c.d_model, c.d_ff, c.vocab_size);
    let (pre, post) = (c.norm == Norm::Pre, c.norm == Norm::Post);
    let layout = w.layout;
    let gain_range = |r: &Option<Range<usize>>| r.clone().expect("norm gain present");
    // Each weight matrix's gradient is written by its one product (overwritten); the
    // norm gains' and an untied embedding's gradients are only added to: zeroed here.
    let added_to = (layout.layers.iter())
        .flat_map(|l| [l.ln1.clone(), l.ln2.clone()])
        .chain([layout.ln_final.clone()])
        .flatten()
        .chain((!c.tie_embeddings).then(|| layout.token_embeddings.clone()));
    for range in added_to {
        be.fill_zero(grads.at_mut(range));
    }

    // LM head (and ln_final): dresid = ∂loss/∂(last block's output).
    let last = acts.resid[c.num_layers].all();
    let hidden = if pre { acts.lnf.all() } else { last };
    be.matmul(
        grads.at_mut(layout.lm_head.clone()),
        acts.logits.all(),
        hidden,
        MatMul::linear_dw(n, d, v),
    );
    let head = w.get(&layout.lm_head);
    if pre {
        be.matmul(
            g.dtmp.all_mut(),
            acts.logits.all(),
            head,
            MatMul::linear_dx(n, d, v),
        );
        be.rmsnorm_backward(
            g.dresid.all_mut(),
            grads.at_mut(gain_range(&layout.ln_final)),
            g.dtmp.all(),
            last,
            w.gain(&layout.ln_final),
            acts.lnf_rstd.all(),
            false,
        );
    } else {
        be.matmul(
            g.dresid.all_mut(),
            acts.logits.all(),
            head,
            MatMul::linear_dx(n, d, v),
        );
    }

    for l in (0..c.num_layers).rev() {
        let (lo, la) = (&layout.layers[l], &acts.layers[l]);
        let x = acts.resid[l].all();
        // Here dresid = ∂/∂out; post-norm: through ln2 to ∂/∂r2.
        if post {
            be.rmsnorm_backward(
                g.dtmp.all_mut(),
                grads.at_mut(gain_range(&lo.ln2)),
                g.dresid.all(),
                la.r2.all(),
                w.gain(&lo.ln2),
                la.rstd2.all(),
                false,
            );
            std::mem::swap(&mut g.dresid, &mut g.dtmp);
        }
        // r2 = y + gate W2ᵀ
        be.matmul(
            g.dgate.all_mut(),
            g.dresid.all(),
            w.get(&lo.w2),
            MatMul::linear_dx(n, f, d),
        );
        be.matmul(
            grads.at_mut(lo.w2.clone()),
            g.dresid.all(),
            la.gate.all(),
            MatMul::linear_dw(n, f, d),
        );
        let swiglu = lo.w3.is_some();
        be.swiglu_backward(
            g.dh1.all_mut(),
            swiglu.then(|| g.dh3.all_mut()),
            g.dgate.all(),
            la.h1.all(),
            swiglu.then(|| la.h3.all()),
        );
        let y = if post { la.ln1.all() } else { la.r1.all() };
        let ffn_in = if pre { la.ln2.all() } else { y };
        be.matmul(
            grads.at_mut(lo.w1.clone()),
            g.dh1.all(),
            ffn_in,
            MatMul::linear_dw(n, d, f),
        );
        if let Some(w3) = &lo.w3 {
            be.matmul(
                grads.at_mut(w3.clone()),
                g.dh3.all(),
                ffn_in,
                MatMul::linear_dw(n, d, f),
            );
        }
        // ∂/∂ffn_in, added to dresid (= ∂/∂y), through ln2 when pre-norm.
        let dx = MatMul::linear_dx(n, d, f);
        let (dffn_in, first) = if pre {
            (&mut g.dtmp, dx)
        } else {
            (&mut g.dresid, dx.accumulating())
        };
        be.matmul(dffn_in.all_mut(), g.dh1.all(), w.get(&lo.w1), first);
        if let Some(w3) = &lo.w3 {
            be.matmul(dffn_in.all_mut(), g.dh3.all(), w.get(w3), dx.accumulating());
        }
        if pre {
            be.rmsnorm_backward(
                g.dresid.all_mut(),
                grads.at_mut(gain_range(&lo.ln2)),
                g.dtmp.all(),
                la.r1.all(),
                w.gain(&lo.ln2),
                la.rstd2.all(),
                true,
            );
        }
        // Post-norm: y = ln1(r1).
        if post {
            be.rmsnorm_backward(
                g.dtmp.all_mut(),
                grads.at_mut(gain_range(&lo.ln1)),
                g.dresid.all(),
                la.r1.all(),
                w.gain(&lo.ln1),
                la.rstd1.all(),
                false,
            );
            std::mem::swap(&mut g.dresid, &mut g.dtmp);
        }
        // r1 = x + atty W_oᵀ
        be.matmul(
            g.datty.all_mut(),
            g.dresid.all(),
            w.get(&lo.output_proj),
            MatMul::linear_dx(n, d, d),
        );
        be.matmul(
            grads.at_mut(lo.output_proj.clone()),
            g.dresid.all(),
            la.atty.all(),
            MatMul::linear_dw(n, d, d),
        );
        let shape = AttnShape {
            b,
            t,
            h: c.num_heads,
            d: c.head_dim(),
            q0: 0,
        };
        be.attention_backward(
            g.dqkv.all_mut(),
            g.datt.all_mut(),
            g.datty.all(),
            la.qkv.all(),
            la.att.all(),
            shape,
        );
        if c.positional == Positional::Rope {
            be.rope(g.dqkv.all_mut(), w.cos.all(), w.sin.all(), shape, true);
        }
        let attn_in = if pre { la.ln1.all() } else { x };
        let qkv_w = qkv_range(layout, l);
        be.matmul(
            grads.at_mut(qkv_w.clone()),
            g.dqkv.all(),
            attn_in,
            MatMul::linear_dw(n, d, 3 * d),
        );
        let dx = MatMul::linear_dx(n, d, 3 * d);
        if pre {
            be.matmul(g.dtmp.all_mut(), g.dqkv.all(), w.get(&qkv_w), dx);
            be.rmsnorm_backward(
                g.dresid.all_mut(),
                grads.at_mut(gain_range(&lo.ln1)),
                g.dtmp.all(),
                x,
                w.gain(&lo.ln1),
                la.rstd1.all(),
                true,
            );
        } else {
            be.matmul(
                g.dresid.all_mut(),
                g.dqkv.all(),
                w.get(&qkv_w),
                dx.accumulating(),
            );
        }
    }
    be.embedding_backward(
        grads.at_mut(layout.token_embeddings.clone()),
        g.dresid.all(),
        &acts.ids,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Address and capacity of every buffer a training step touches.
    fn buffers(m: &Model) -> Vec<(usize, usize)> {
        let id = |v: &Vec<f32>| (v.as_ptr() as usize, v.capacity());
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
                model.forward_loss(&ids, &ids, 3, 16).unwrap();
                model.backward().unwrap();
                model.adamw_step(&mut opt, 0.01, None);
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
}
