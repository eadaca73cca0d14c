//! The Transformer LM: one orchestration of forward and backward over the kernel
//! interface ([`Backend`]), llm.c style. Parameters and gradients are flat buffers in
//! the [`ParamLayout`]; activations are allocated once per `(B, T)` and reused.
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
use crate::kernels::{AttnShape, Backend, Cpu, Float, MatMul};
use crate::params::ParamLayout;
use crate::{Error, Result};
use std::ops::Range;

/// A Transformer LM with its parameters, gradients and activation buffers, in `f32`
/// (or `f64`, for gradient checks — the same code), run by backend `B`.
pub struct Model<F: Float = f32, B: Backend<F> = Cpu> {
    config: ModelConfig,
    layout: ParamLayout,
    params: Vec<F>,
    grads: Vec<F>,
    /// RoPE tables `(context_length, D/2)`.
    rope_cos: Vec<F>,
    rope_sin: Vec<F>,
    /// Activations of the last full pass, kept for backward.
    acts: Option<Activations<F>>,
    /// Gradient scratch for backward, same `(B, T)` as `acts`.
    grad_acts: Option<GradActivations<F>>,
    /// Single-token activations for [`Model::decode_step`].
    decode_acts: Option<Activations<F>>,
    /// Whether `acts` holds a `forward_loss` (logits replaced by their gradient).
    loss_ready: bool,
    backend: B,
}

/// Keys and values of every position decoded so far, per layer, for generation.
pub struct KvCache<F: Float = f32> {
    len: usize,
    context_length: usize,
    d_model: usize,
    /// Per layer `(context_length, 3C)`: rows of `[q | k | v]` after RoPE (the `q`
    /// part is scratch), so attention reads the cache like a full pass's `qkv`.
    qkv: Vec<Vec<F>>,
}

impl KvCache<f32> {
    /// An empty cache for a model of this configuration.
    pub fn new(config: &ModelConfig) -> Self {
        Self::with_config(config)
    }
}

impl<F: Float> KvCache<F> {
    /// An empty cache in any precision.
    pub fn with_config(config: &ModelConfig) -> Self {
        let size = config.context_length * 3 * config.d_model;
        KvCache {
            len: 0,
            context_length: config.context_length,
            d_model: config.d_model,
            qkv: (0..config.num_layers)
                .map(|_| vec![F::ZERO; size])
                .collect(),
        }
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
struct LayerActs<F> {
    /// `(N, C)`, `(N)`: pre-norm `ln1(x)`; post-norm `ln1(r1)` (= the FFN input).
    ln1: Vec<F>,
    rstd1: Vec<F>,
    /// `(N, 3C)` queries (after RoPE), keys (after RoPE), values; empty when decoding
    /// (they live in the [`KvCache`]).
    qkv: Vec<F>,
    /// `(B, H, Tq, T)` attention probabilities.
    att: Vec<F>,
    /// `(N, C)` attention output before `output_proj`.
    atty: Vec<F>,
    /// `(N, C)` first residual sum `x + attn`.
    r1: Vec<F>,
    /// `(N, C)`, `(N)`: pre-norm `ln2(r1)`; post-norm keeps only `rstd2` of `ln2(r2)`.
    ln2: Vec<F>,
    rstd2: Vec<F>,
    /// `(N, F)` `W1 x`, `W3 x` (SwiGLU only), and the gated product.
    h1: Vec<F>,
    h3: Vec<F>,
    gate: Vec<F>,
    /// `(N, C)` second residual sum before post-norm's `ln2` (post-norm only).
    r2: Vec<F>,
}

/// Everything a forward pass writes, for one `(B, T)`.
struct Activations<F> {
    b: usize,
    t: usize,
    ids: Vec<u32>,
    targets: Vec<u32>,
    /// `num_layers + 1` of `(N, C)`: the embedding output and every block's output.
    resid: Vec<Vec<F>>,
    layers: Vec<LayerActs<F>>,
    /// `(N, C)`, `(N)`: `ln_final` (pre-norm only).
    lnf: Vec<F>,
    lnf_rstd: Vec<F>,
    /// `(N, V)` logits, or their gradient after `forward_loss`.
    logits: Vec<F>,
}

/// Backward scratch for one `(B, T)`.
struct GradActivations<F> {
    /// `(N, C)` gradient flowing down the residual stream, and a second `(N, C)`.
    dresid: Vec<F>,
    dtmp: Vec<F>,
    /// `(N, 3C)`, `(B, H, T, T)`, `(N, C)`.
    dqkv: Vec<F>,
    datt: Vec<F>,
    datty: Vec<F>,
    /// `(N, F)` each (`dh3` empty for SiLU).
    dh1: Vec<F>,
    dh3: Vec<F>,
    dgate: Vec<F>,
}

fn zeros<F: Float>(len: usize) -> Vec<F> {
    vec![F::ZERO; len]
}

impl<F: Float> Activations<F> {
    /// Buffers for `b` sequences of `t` queries attending `keys` positions
    /// (`keys = t` for a full pass, `context_length` for decoding).
    fn new(c: &ModelConfig, b: usize, t: usize, keys: usize, decode: bool) -> Self {
        let n = b * t;
        let (d, f) = (c.d_model, c.d_ff);
        let pre = c.norm == Norm::Pre;
        let post = c.norm == Norm::Post;
        let has_norm = c.norm != Norm::None;
        let if_ = |cond: bool, len: usize| zeros(if cond { len } else { 0 });
        let layers = (0..c.num_layers)
            .map(|_| LayerActs {
                ln1: if_(has_norm, n * d),
                rstd1: if_(has_norm, n),
                qkv: if_(!decode, n * 3 * d),
                att: zeros(b * c.num_heads * t * keys),
                atty: zeros(n * d),
                r1: zeros(n * d),
                ln2: if_(pre, n * d),
                rstd2: if_(has_norm, n),
                h1: zeros(n * f),
                h3: if_(c.ffn == Ffn::Swiglu, n * f),
                gate: zeros(n * f),
                r2: if_(post, n * d),
            })
            .collect();
        Activations {
            b,
            t,
            ids: vec![0; n],
            targets: vec![0; n],
            resid: (0..=c.num_layers).map(|_| zeros(n * d)).collect(),
            layers,
            lnf: if_(pre, n * d),
            lnf_rstd: if_(pre, n),
            logits: zeros(n * c.vocab_size),
        }
    }
}

impl<F: Float> GradActivations<F> {
    fn new(c: &ModelConfig, b: usize, t: usize) -> Self {
        let n = b * t;
        let (d, f) = (c.d_model, c.d_ff);
        GradActivations {
            dresid: zeros(n * d),
            dtmp: zeros(n * d),
            dqkv: zeros(n * 3 * d),
            datt: zeros(b * c.num_heads * t * t),
            datty: zeros(n * d),
            dh1: zeros(n * f),
            dh3: zeros(if c.ffn == Ffn::Swiglu { n * f } else { 0 }),
            dgate: zeros(n * f),
        }
    }
}

/// Read-only view of what every pass needs: shape, layout, parameters, RoPE tables.
struct Weights<'a, F> {
    c: &'a ModelConfig,
    layout: &'a ParamLayout,
    params: &'a [F],
    cos: &'a [F],
    sin: &'a [F],
}

impl<F: Float> Weights<'_, F> {
    fn get(&self, r: &Range<usize>) -> &[F] {
        &self.params[r.clone()]
    }

    fn gain(&self, r: &Option<Range<usize>>) -> &[F] {
        &self.params[r.clone().expect("norm gain present when norms are on")]
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
        config.validate()?;
        let params = ParamLayout::new(&config).init(seed);
        Model::with_params(config, params)
    }

    /// A model with the given parameters (in [`ParamLayout`] order).
    pub fn from_params(config: ModelConfig, params: Vec<f32>) -> Result<Model> {
        Model::with_params(config, params)
    }
}

impl<F: Float> Model<F> {
    /// A CPU model in any precision with the given parameters (in [`ParamLayout`] order).
    pub fn with_params(config: ModelConfig, params: Vec<F>) -> Result<Self> {
        Model::with_backend(config, params, Cpu)
    }
}

impl<F: Float, B: Backend<F>> Model<F, B> {
    /// A model run by `backend`, with the given parameters (in [`ParamLayout`] order).
    pub fn with_backend(config: ModelConfig, params: Vec<F>, backend: B) -> Result<Self> {
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
        let (rope_cos, rope_sin) = if config.positional == Positional::Rope {
            rope_tables(config.context_length, config.head_dim(), config.rope_theta)
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(Model {
            grads: vec![F::ZERO; layout.total],
            config,
            layout,
            params,
            rope_cos,
            rope_sin,
            acts: None,
            grad_acts: None,
            decode_acts: None,
            loss_ready: false,
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

    /// Parameters to update and the gradient to update them with.
    pub fn params_and_grads_mut(&mut self) -> (&mut [F], &[F]) {
        (&mut self.params, &self.grads)
    }

    /// An empty KV cache for [`Model::decode_step`].
    pub fn new_cache(&self) -> KvCache<F> {
        KvCache::with_config(&self.config)
    }

    /// Logits `(B, T, V)` for token ids `(B, T)`, `1 ≤ T ≤ context_length`.
    pub fn forward(&mut self, ids: &[u32], b: usize, t: usize) -> Result<&[F]> {
        self.check_tokens(ids, b, t, "token id")?;
        let acts = self.prepare(b, t);
        acts.ids.copy_from_slice(ids);
        self.loss_ready = false;
        self.run_forward();
        Ok(&self.acts.as_ref().expect("prepared").logits)
    }

    /// Mean cross-entropy over the `B·T` positions of predicting `targets (B, T)`
    /// from `ids (B, T)`; keeps what [`Model::backward`] needs. The logits buffer then
    /// holds the loss gradient, so read logits with [`Model::forward`] instead.
    pub fn forward_loss(&mut self, ids: &[u32], targets: &[u32], b: usize, t: usize) -> Result<F> {
        self.check_tokens(ids, b, t, "token id")?;
        self.check_tokens(targets, b, t, "target id")?;
        let acts = self.prepare(b, t);
        acts.ids.copy_from_slice(ids);
        acts.targets.copy_from_slice(targets);
        self.run_forward();
        let acts = self.acts.as_mut().expect("prepared");
        let loss = self
            .backend
            .cross_entropy(&mut acts.logits, &acts.targets, true);
        self.loss_ready = true;
        Ok(loss)
    }

    /// The gradient of the last [`Model::forward_loss`] into [`Model::grads`]
    /// (overwritten, not accumulated).
    pub fn backward(&mut self) -> Result<()> {
        if !self.loss_ready {
            return Err(Error::Invalid(
                "backward needs a forward_loss first (and no forward in between)".into(),
            ));
        }
        self.loss_ready = false;
        let acts = self.acts.as_mut().expect("loss_ready implies activations");
        let (b, t) = (acts.b, acts.t);
        if self
            .grad_acts
            .as_ref()
            .is_none_or(|g| g.dresid.len() != b * t * self.config.d_model)
        {
            self.grad_acts = Some(GradActivations::new(&self.config, b, t));
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
    pub fn decode_step(&mut self, cache: &mut KvCache<F>, token: u32) -> Result<&[F]> {
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
        let acts = self
            .decode_acts
            .get_or_insert_with(|| Activations::new(c, 1, 1, c.context_length, true));
        acts.ids[0] = token;
        let w = Weights {
            c,
            layout: &self.layout,
            params: &self.params,
            cos: &self.rope_cos,
            sin: &self.rope_sin,
        };
        forward_pass(&self.backend, &w, acts, Some(cache));
        cache.len += 1;
        Ok(&acts.logits)
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

    /// The activations for `(b, t)`, reallocated only when the shape changes.
    fn prepare(&mut self, b: usize, t: usize) -> &mut Activations<F> {
        if self.acts.as_ref().is_none_or(|a| (a.b, a.t) != (b, t)) {
            self.acts = Some(Activations::new(&self.config, b, t, t, false));
        }
        self.acts.as_mut().expect("just set")
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

/// The forward pass from `acts.ids` to `acts.logits`. With a cache, `acts` is one
/// token (`B = T = 1`) at position `cache.len()`, its keys and values are appended
/// to the cache (the caller advances `len`) and attention reads the whole cache.
fn forward_pass<F: Float, B: Backend<F>>(
    be: &B,
    w: &Weights<F>,
    acts: &mut Activations<F>,
    mut cache: Option<&mut KvCache<F>>,
) {
    let c = w.c;
    let (b, t) = (acts.b, acts.t);
    let (n, d, f, h) = (b * t, c.d_model, c.d_ff, c.num_heads);
    let (pre, post) = (c.norm == Norm::Pre, c.norm == Norm::Post);
    let swiglu = c.ffn == Ffn::Swiglu;
    be.embedding_forward(
        &mut acts.resid[0],
        &acts.ids,
        w.get(&w.layout.token_embeddings),
    );
    for (l, la) in acts.layers.iter_mut().enumerate() {
        let lo = &w.layout.layers[l];
        let (before, after) = acts.resid.split_at_mut(l + 1);
        let (x, out) = (&before[l][..], &mut after[0][..]);
        let attn_in: &[F] = if pre {
            be.rmsnorm_forward(&mut la.ln1, &mut la.rstd1, x, w.gain(&lo.ln1));
            &la.ln1
        } else {
            x
        };
        let (qkv, shape) = match cache.as_deref_mut() {
            Some(kv) => {
                let pos = kv.len;
                let shape = AttnShape {
                    b: 1,
                    t: pos + 1,
                    h,
                    d: c.head_dim(),
                    q0: pos,
                };
                (&mut kv.qkv[l][..(pos + 1) * 3 * d], shape)
            }
            None => {
                let shape = AttnShape {
                    b,
                    t,
                    h,
                    d: c.head_dim(),
                    q0: 0,
                };
                (&mut la.qkv[..], shape)
            }
        };
        let new_rows = &mut qkv[shape.q0 * 3 * d..];
        be.matmul(
            new_rows,
            attn_in,
            w.get(&qkv_range(w.layout, l)),
            MatMul::linear(n, d, 3 * d),
        );
        if c.positional == Positional::Rope {
            be.rope(new_rows, w.cos, w.sin, shape, false);
        }
        let att = &mut la.att[..b * h * shape.tq() * shape.t];
        be.attention_forward(&mut la.atty, att, qkv, shape);
        be.copy(&mut la.r1, x);
        be.matmul(
            &mut la.r1,
            &la.atty,
            w.get(&lo.output_proj),
            MatMul::linear(n, d, d).accumulating(),
        );
        let y: &[F] = if post {
            be.rmsnorm_forward(&mut la.ln1, &mut la.rstd1, &la.r1, w.gain(&lo.ln1));
            &la.ln1
        } else {
            &la.r1
        };
        let ffn_in: &[F] = if pre {
            be.rmsnorm_forward(&mut la.ln2, &mut la.rstd2, y, w.gain(&lo.ln2));
            &la.ln2
        } else {
            y
        };
        be.matmul(&mut la.h1, ffn_in, w.get(&lo.w1), MatMul::linear(n, d, f));
        if let Some(w3) = &lo.w3 {
            be.matmul(&mut la.h3, ffn_in, w.get(w3), MatMul::linear(n, d, f));
        }
        be.swiglu_forward(&mut la.gate, &la.h1, swiglu.then_some(&la.h3[..]));
        let r2: &mut [F] = if post { &mut la.r2 } else { out };
        be.copy(r2, y);
        be.matmul(
            r2,
            &la.gate,
            w.get(&lo.w2),
            MatMul::linear(n, f, d).accumulating(),
        );
        if post {
            be.rmsnorm_forward(out, &mut la.rstd2, &la.r2, w.gain(&lo.ln2));
        }
    }
    let last = &acts.resid[c.num_layers];
    let hidden: &[F] = if pre {
        be.rmsnorm_forward(
            &mut acts.lnf,
            &mut acts.lnf_rstd,
            last,
            w.gain(&w.layout.ln_final),
        );
        &acts.lnf
    } else {
        last
    };
    be.matmul(
        &mut acts.logits,
        hidden,
        w.get(&w.layout.lm_head),
        MatMul::linear(n, d, c.vocab_size),
    );
}

/// The backward pass of the last full forward, whose logits buffer holds
/// `∂loss/∂logits`: every parameter's gradient into `grads` (overwritten).
fn backward_pass<F: Float, B: Backend<F>>(
    be: &B,
    w: &Weights<F>,
    acts: &Activations<F>,
    g: &mut GradActivations<F>,
    grads: &mut [F],
) {
    let c = w.c;
    let (b, t) = (acts.b, acts.t);
    let (n, d, f, v) = (b * t, c.d_model, c.d_ff, c.vocab_size);
    let (pre, post) = (c.norm == Norm::Pre, c.norm == Norm::Post);
    let layout = w.layout;
    let gain_range = |r: &Option<Range<usize>>| r.clone().expect("norm gain present");
    grads.fill(F::ZERO);

    // LM head (and ln_final): dresid = ∂loss/∂(last block's output).
    let last = &acts.resid[c.num_layers];
    let hidden: &[F] = if pre { &acts.lnf } else { last };
    be.matmul(
        &mut grads[layout.lm_head.clone()],
        &acts.logits,
        hidden,
        MatMul::linear_dw(n, d, v),
    );
    let head = w.get(&layout.lm_head);
    if pre {
        be.matmul(&mut g.dtmp, &acts.logits, head, MatMul::linear_dx(n, d, v));
        be.rmsnorm_backward(
            &mut g.dresid,
            &mut grads[gain_range(&layout.ln_final)],
            &g.dtmp,
            last,
            w.gain(&layout.ln_final),
            &acts.lnf_rstd,
            false,
        );
    } else {
        be.matmul(
            &mut g.dresid,
            &acts.logits,
            head,
            MatMul::linear_dx(n, d, v),
        );
    }

    for l in (0..c.num_layers).rev() {
        let (lo, la) = (&layout.layers[l], &acts.layers[l]);
        let x = &acts.resid[l];
        // Here dresid = ∂/∂out; post-norm: through ln2 to ∂/∂r2.
        if post {
            be.rmsnorm_backward(
                &mut g.dtmp,
                &mut grads[gain_range(&lo.ln2)],
                &g.dresid,
                &la.r2,
                w.gain(&lo.ln2),
                &la.rstd2,
                false,
            );
            std::mem::swap(&mut g.dresid, &mut g.dtmp);
        }
        // r2 = y + gate W2ᵀ
        be.matmul(
            &mut g.dgate,
            &g.dresid,
            w.get(&lo.w2),
            MatMul::linear_dx(n, f, d),
        );
        be.matmul(
            &mut grads[lo.w2.clone()],
            &g.dresid,
            &la.gate,
            MatMul::linear_dw(n, f, d),
        );
        let h3 = lo.w3.as_ref().map(|_| &la.h3[..]);
        let dh3 = lo.w3.as_ref().map(|_| &mut g.dh3[..]);
        be.swiglu_backward(&mut g.dh1, dh3, &g.dgate, &la.h1, h3);
        let y: &[F] = if post { &la.ln1 } else { &la.r1 };
        let ffn_in: &[F] = if pre { &la.ln2 } else { y };
        be.matmul(
            &mut grads[lo.w1.clone()],
            &g.dh1,
            ffn_in,
            MatMul::linear_dw(n, d, f),
        );
        if let Some(w3) = &lo.w3 {
            be.matmul(
                &mut grads[w3.clone()],
                &g.dh3,
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
        be.matmul(dffn_in, &g.dh1, w.get(&lo.w1), first);
        if let Some(w3) = &lo.w3 {
            be.matmul(dffn_in, &g.dh3, w.get(w3), dx.accumulating());
        }
        if pre {
            be.rmsnorm_backward(
                &mut g.dresid,
                &mut grads[gain_range(&lo.ln2)],
                &g.dtmp,
                &la.r1,
                w.gain(&lo.ln2),
                &la.rstd2,
                true,
            );
        }
        // Post-norm: y = ln1(r1).
        if post {
            be.rmsnorm_backward(
                &mut g.dtmp,
                &mut grads[gain_range(&lo.ln1)],
                &g.dresid,
                &la.r1,
                w.gain(&lo.ln1),
                &la.rstd1,
                false,
            );
            std::mem::swap(&mut g.dresid, &mut g.dtmp);
        }
        // r1 = x + atty W_oᵀ
        be.matmul(
            &mut g.datty,
            &g.dresid,
            w.get(&lo.output_proj),
            MatMul::linear_dx(n, d, d),
        );
        be.matmul(
            &mut grads[lo.output_proj.clone()],
            &g.dresid,
            &la.atty,
            MatMul::linear_dw(n, d, d),
        );
        let shape = AttnShape {
            b,
            t,
            h: c.num_heads,
            d: c.head_dim(),
            q0: 0,
        };
        be.attention_backward(&mut g.dqkv, &mut g.datt, &g.datty, &la.qkv, &la.att, shape);
        if c.positional == Positional::Rope {
            be.rope(&mut g.dqkv, w.cos, w.sin, shape, true);
        }
        let attn_in: &[F] = if pre { &la.ln1 } else { x };
        let qkv_w = qkv_range(layout, l);
        be.matmul(
            &mut grads[qkv_w.clone()],
            &g.dqkv,
            attn_in,
            MatMul::linear_dw(n, d, 3 * d),
        );
        let dx = MatMul::linear_dx(n, d, 3 * d);
        if pre {
            be.matmul(&mut g.dtmp, &g.dqkv, w.get(&qkv_w), dx);
            be.rmsnorm_backward(
                &mut g.dresid,
                &mut grads[gain_range(&lo.ln1)],
                &g.dtmp,
                x,
                w.gain(&lo.ln1),
                &la.rstd1,
                true,
            );
        } else {
            be.matmul(&mut g.dresid, &g.dqkv, w.get(&qkv_w), dx.accumulating());
        }
    }
    be.embedding_backward(
        &mut grads[layout.token_embeddings.clone()],
        &g.dresid,
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
            let step = |model: &mut Model| {
                model.forward_loss(&ids, &ids, 3, 16).unwrap();
                model.backward().unwrap();
                let (p, g) = model.params_and_grads_mut();
                p.iter_mut().zip(g).for_each(|(p, g)| *p -= 0.01 * g);
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
