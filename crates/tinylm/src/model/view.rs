//! What every pass reads ([`ModelView`]: the backend, the layout, the parameters,
//! the RoPE tables) and writes ([`PassBuffers`]), and the norm at its place in a
//! block (`ModelView::norm` and its backward counterparts).

use crate::buffers::{Activations, DecodeActivations, GradActivations};
use crate::config::{ModelConfig, Norm, Positional};
use crate::kernels::{AttnShape, Backend, Buffer, Float, MatMul, Span, SpanMut};
use crate::params::{LayerOffsets, ParamLayout};
use std::ops::Range;

/// Read-only view of what every pass needs: the backend, the shape, the layout, the
/// parameters and the RoPE tables; built by [`Model::split`].
pub(super) struct ModelView<'a, F: Float, B: Backend<F>> {
    pub(super) backend: &'a B,
    pub(super) config: &'a ModelConfig,
    pub(super) layout: &'a ParamLayout,
    pub(super) params: &'a B::Buf,
    /// RoPE tables `(context_length, D/2)` (empty without RoPE).
    pub(super) cos: &'a B::Buf,
    pub(super) sin: &'a B::Buf,
}

/// The parameters' gradient buffer as backward writes it: overwritten, or added to
/// (`add`) when a step's gradient is accumulated over micro-batches.
pub(super) struct ParamGrads<'a, Buf> {
    pub(super) buf: &'a mut Buf,
    pub(super) add: bool,
}

/// What passes write, borrowed apart from the [`ModelView`] they read.
pub(super) struct PassBuffers<'a, F: Float, B: Backend<F>> {
    pub(super) acts: &'a mut Option<Activations<B::Buf, B::Ids>>,
    pub(super) grad_acts: &'a mut Option<GradActivations<B::Buf>>,
    pub(super) decode_acts: &'a mut Option<DecodeActivations<B::Buf, B::Ids>>,
    pub(super) grads: &'a mut B::Buf,
}

impl<F: Float, B: Backend<F>> ModelView<'_, F, B> {
    /// The parameters at `range`.
    pub(super) fn get(&self, range: &Range<usize>) -> Span<'_, B::Buf> {
        self.params.at(range.clone())
    }

    /// A norm's gain `(C)`.
    pub(super) fn gain(&self, range: &Option<Range<usize>>) -> Span<'_, B::Buf> {
        self.params.at(gain_range(range))
    }

    /// Attention over `b` sequences of `t` new positions after `q0` cached ones.
    pub(super) fn attn_shape(&self, b: usize, t: usize, q0: usize) -> AttnShape {
        AttnShape {
            b,
            t: q0 + t,
            h: self.config.num_heads,
            d: self.config.head_dim(),
            q0,
        }
    }

    /// A linear layer `y (N, out) = x (N, in) · Wᵀ`, `W (out, in)` the parameters at
    /// `weight`, by `product` (a [`MatMul::linear`], accumulating for a residual add).
    pub(super) fn linear(
        &self,
        y: SpanMut<B::Buf>,
        x: Span<B::Buf>,
        weight: &Range<usize>,
        product: MatMul,
    ) {
        self.backend.matmul(y, x, self.get(weight), product);
    }

    /// Backward of a linear layer `y (N, out) = x (N, in) · Wᵀ`, `W (out, in)` the
    /// parameters at `weight`: `dx (N, in) = dy (N, out) · W` by `dx_product` (a
    /// [`MatMul::linear_dx`], accumulating where `dx` already holds another path's
    /// gradient) and `dW = dyᵀ · x` into `grads` ([`MatMul::linear_dw`], overwritten
    /// or added to).
    pub(super) fn linear_backward(
        &self,
        dx: SpanMut<B::Buf>,
        grads: &mut ParamGrads<B::Buf>,
        weight: &Range<usize>,
        dy: Span<B::Buf>,
        x: Span<B::Buf>,
        dx_product: MatMul,
    ) {
        let MatMul {
            m: n,
            k: d_out,
            n: d_in,
            ..
        } = dx_product;
        let dw_product = MatMul::linear_dw(n, d_in, d_out);
        let dw_product = match grads.add {
            true => dw_product.accumulating(),
            false => dw_product,
        };
        self.backend.matmul(dx, dy, self.get(weight), dx_product);
        (self.backend).matmul(grads.buf.at_mut(weight.clone()), dy, x, dw_product);
    }

    /// RoPE on the query and key parts of the rows `qkv (B, Tq, 3C)`, or the inverse
    /// rotation (backward) when `inverse`; nothing under NoPE.
    pub(super) fn rope(&self, qkv: SpanMut<B::Buf>, shape: AttnShape, inverse: bool) {
        if self.config.positional == Positional::Rope {
            (self.backend).rope(qkv, self.cos.all(), self.sin.all(), shape, inverse);
        }
    }
}

/// A norm gain's range (present when norms are on).
pub(super) fn gain_range(range: &Option<Range<usize>>) -> Range<usize> {
    range.clone().expect("norm gain present when norms are on")
}

/// The fused `(3C, C)` range of a layer's `q_proj`, `k_proj`, `v_proj`.
pub(super) fn qkv_range(layer: &LayerOffsets) -> Range<usize> {
    layer.q_proj.start..layer.v_proj.end
}

/// Where a layer's tensors are: one contiguous range in [`ParamLayout`] order, `ln1`
/// (or `q_proj`) first and `w3` (or `w2`) last.
pub(super) fn layer_range(layer: &LayerOffsets) -> Range<usize> {
    let first = layer.ln1.as_ref().unwrap_or(&layer.q_proj);
    let last = layer.w3.as_ref().unwrap_or(&layer.w2);
    first.start..last.end
}

/// The norm placement, for [`block_forward`] and [`block_backward`] (and `ln_final`,
/// the LM head's pre-norm): pre-norm normalizes what a sublayer reads, post-norm the
/// residual sum after it, "none" neither. In the blocks' comments, `pre(x)` and
/// `post(r)` are [`ModelView::norm`] at those places: the norm, or `x` and `r`
/// themselves where the model has no norm.
impl<F: Float, B: Backend<F>> ModelView<'_, F, B> {
    /// The norm at `place` — `Norm::Pre`: before a sublayer, on what it reads;
    /// `Norm::Post`: after a residual add, on the sum — when the model's norms sit
    /// there: `ln = rmsnorm(x)·gain` `(N, C)`, keeping `rstd (N)` for backward.
    /// Returns what comes after the place ([`ModelView::normed`]).
    pub(super) fn norm<'s>(
        &self,
        place: Norm,
        gain: &Option<Range<usize>>,
        x: Span<'s, B::Buf>,
        ln: &'s mut B::Buf,
        rstd: &mut B::Buf,
    ) -> Span<'s, B::Buf> {
        if self.config.norm == place {
            (self.backend).rmsnorm_forward(ln.all_mut(), rstd.all_mut(), x, self.gain(gain));
        }
        self.normed(place, x, ln)
    }

    /// What comes after the norm at `place` of `x`: its output `ln` when the model's
    /// norms sit there, otherwise `x` itself.
    pub(super) fn normed<'s>(
        &self,
        place: Norm,
        x: Span<'s, B::Buf>,
        ln: &'s B::Buf,
    ) -> Span<'s, B::Buf> {
        if self.config.norm == place {
            ln.all()
        } else {
            x
        }
    }

    /// Where a residual sum that the post-norm takes into `out` goes:
    /// post-norm's own buffer `sum`; otherwise the sum is the output, `out` itself.
    pub(super) fn sum_into<'s>(&self, sum: &'s mut B::Buf, out: &'s mut B::Buf) -> &'s mut B::Buf {
        if self.config.norm == Norm::Post {
            sum
        } else {
            out
        }
    }

    /// Backward of the post-norm ([`ModelView::norm`]): `dacts.dresid` holds `∂/∂(the sublayer's
    /// output)`; post-norm takes it through the norm of `sum` to `∂/∂sum` and adds the
    /// gain's gradient to `grads` (otherwise it is `∂/∂sum` already).
    pub(super) fn post_norm_backward(
        &self,
        gain: &Option<Range<usize>>,
        sum: Span<B::Buf>,
        rstd: Span<B::Buf>,
        dacts: &mut GradActivations<B::Buf>,
        grads: &mut ParamGrads<B::Buf>,
    ) {
        if self.config.norm == Norm::Post {
            self.backend.rmsnorm_backward(
                dacts.dtmp.all_mut(),
                grads.buf.at_mut(gain_range(gain)),
                dacts.dresid.all(),
                sum,
                self.gain(gain),
                rstd,
                false,
            );
            std::mem::swap(&mut dacts.dresid, &mut dacts.dtmp);
        }
    }

    /// Where the gradient of what a sublayer read goes, with the [`MatMul`] `dx` of
    /// the first product into it: pre-norm's `dtmp`, which
    /// [`ModelView::pre_norm_backward`] takes through the norm into `dresid`;
    /// otherwise `dresid` itself, added to when `add` (it holds the residual path's
    /// gradient).
    pub(super) fn dsublayer_in<'s>(
        &self,
        dresid: &'s mut B::Buf,
        dtmp: &'s mut B::Buf,
        dx: MatMul,
        add: bool,
    ) -> (&'s mut B::Buf, MatMul) {
        match self.config.norm {
            Norm::Pre => (dtmp, dx),
            _ if add => (dresid, dx.accumulating()),
            _ => (dresid, dx),
        }
    }

    /// Backward of the pre-norm ([`ModelView::norm`]) once the sublayer's input gradient is where
    /// [`ModelView::dsublayer_in`] put it: pre-norm takes `dtmp` through the norm of
    /// `x` into `dresid` (added to when `add`) and adds the gain's gradient to `grads`.
    pub(super) fn pre_norm_backward(
        &self,
        gain: &Option<Range<usize>>,
        x: Span<B::Buf>,
        rstd: Span<B::Buf>,
        dacts: &mut GradActivations<B::Buf>,
        grads: &mut ParamGrads<B::Buf>,
        add: bool,
    ) {
        if self.config.norm == Norm::Pre {
            self.backend.rmsnorm_backward(
                dacts.dresid.all_mut(),
                grads.buf.at_mut(gain_range(gain)),
                dacts.dtmp.all(),
                x,
                self.gain(gain),
                rstd,
                add,
            );
        }
    }
}
