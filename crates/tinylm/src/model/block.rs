//! One Transformer block as kernel calls: `block_forward` is the diagram of
//! [`crate::model`] left to right, `block_backward` the same right to left; and
//! [`transformer_block`], one block on its own.

use super::cache::NewTokens;
use super::products::Linear;
use super::view::{qkv_range, ModelView, ParamGrads};
use crate::buffers::{GradActivations, LayerActs};
use crate::config::Norm;
use crate::kernels::{AttnShape, Backend, Buffer, Float, Span};
use crate::params::LayerOffsets;

/// Where a block's attention finds its queries, keys and values.
pub(super) enum Attention<'a, 'c, Buf> {
    /// A full pass over `B` sequences of `T` positions: every row in `acts.qkv`.
    Full(AttnShape),
    /// A decoding pass: each sequence's new rows of `acts.qkv` (one sequence's after
    /// another's) are appended to layer `layer` of its KV cache, and attend to every
    /// position there.
    Cached {
        sequences: &'a mut [NewTokens<'c, Buf>],
        layer: usize,
    },
}

/// One block (the diagram at the top): `out (N, C)` from `x (N, C)`, keeping in
/// `acts` what backward needs; attention as `attention` says.
pub(super) fn block_forward<F: Float, B: Backend<F>>(
    model: &ModelView<F, B>,
    layer: &LayerOffsets,
    acts: &mut LayerActs<B::Buf>,
    x: Span<B::Buf>,
    out: &mut B::Buf,
    attention: Attention<B::Buf>,
) {
    let (be, config) = (model.backend, model.config);
    let c = config.d_model;
    let n = x.len / c;
    // r1 = x + attention(RoPE(pre(x)·W_qkvᵀ))·W_oᵀ, y = post(r1)
    let attn_in = model.norm(Norm::Pre, &layer.ln1, x, &mut acts.ln1, &mut acts.rstd1);
    let w_qkv = qkv_range(layer);
    let qkv_product = Linear::Qkv.forward(config, n);
    model.linear(acts.qkv.all_mut(), attn_in, &w_qkv, qkv_product);
    match attention {
        Attention::Full(shape) => {
            model.rope(acts.qkv.all_mut(), shape, false);
            be.attention_forward(
                acts.atty.all_mut(),
                acts.att.all_mut(),
                acts.qkv.all(),
                shape,
            );
        }
        Attention::Cached { sequences, layer } => {
            // Each sequence's new rows rotated and appended to its cache, then the
            // attention of all of them at once.
            let (mut row, mut shapes) = (0, Vec::with_capacity(sequences.len()));
            for seq in sequences.iter_mut() {
                let (q0, tq) = (seq.cache.len, seq.tokens.len());
                let shape = model.attn_shape(1, tq, q0);
                let rows = 3 * c * row..3 * c * (row + tq);
                model.rope(acts.qkv.at_mut(rows.clone()), shape, false);
                let kv = &mut seq.cache.qkv[layer];
                be.copy(kv.at_mut(3 * c * q0..3 * c * shape.t), acts.qkv.at(rows));
                shapes.push(shape);
                row += tq;
            }
            let caches: Vec<_> = (sequences.iter().zip(shapes))
                .map(|(seq, shape)| (seq.cache.qkv[layer].at(0..3 * c * shape.t), shape))
                .collect();
            let keeps = be.attention_keeps();
            let probs = caches.iter().map(|&(_, s)| keeps.kept_len(s)).sum();
            be.attention_forward_cached(
                acts.atty.at_mut(0..c * row),
                acts.att.at_mut(0..probs),
                &caches,
            );
        }
    }
    be.copy(acts.r1.all_mut(), x);
    let residual_add = Linear::OutputProj.forward(config, n).accumulating();
    model.linear(
        acts.r1.all_mut(),
        acts.atty.all(),
        &layer.output_proj,
        residual_add,
    );
    let y = model.norm(
        Norm::Post,
        &layer.ln1,
        acts.r1.all(),
        &mut acts.ln1,
        &mut acts.rstd1,
    );
    // out = post(y + SwiGLU(pre(y)·W1ᵀ, pre(y)·W3ᵀ)·W2ᵀ)
    let ffn_in = model.norm(Norm::Pre, &layer.ln2, y, &mut acts.ln2, &mut acts.rstd2);
    let w1_product = Linear::W1.forward(config, n);
    model.linear(acts.h1.all_mut(), ffn_in, &layer.w1, w1_product);
    if let Some(w3) = &layer.w3 {
        let w3_product = Linear::W3.forward(config, n);
        model.linear(acts.h3.all_mut(), ffn_in, w3, w3_product);
    }
    let swiglu = layer.w3.is_some();
    be.swiglu_forward(
        acts.gate.all_mut(),
        acts.h1.all(),
        swiglu.then(|| acts.h3.all()),
    );
    let r2 = model.sum_into(&mut acts.r2, out);
    be.copy(r2.all_mut(), y);
    let residual_add = Linear::W2.forward(config, n).accumulating();
    model.linear(r2.all_mut(), acts.gate.all(), &layer.w2, residual_add);
    model.norm(Norm::Post, &layer.ln2, acts.r2.all(), out, &mut acts.rstd2);
}

/// One block backward, the reverse of [`block_forward`]: `dacts.dresid` holds
/// `∂/∂out (N, C)` on entry and `∂/∂x` on return. Writes the block's weight
/// gradients into `grads` and adds its norm gains' gradients to them.
pub(super) fn block_backward<F: Float, B: Backend<F>>(
    model: &ModelView<F, B>,
    layer: &LayerOffsets,
    acts: &LayerActs<B::Buf>,
    x: Span<B::Buf>,
    dacts: &mut GradActivations<B::Buf>,
    grads: &mut ParamGrads<B::Buf>,
    shape: AttnShape,
) {
    let (be, config) = (model.backend, model.config);
    let n = shape.b * shape.t;
    // out = post(r2), r2 = y + gate·W2ᵀ
    model.post_norm_backward(&layer.ln2, acts.r2.all(), acts.rstd2.all(), dacts, grads);
    let (dgate, dr2) = (dacts.dgate.all_mut(), dacts.dresid.all());
    let dx = Linear::W2.dx(config, n);
    model.linear_backward(dgate, grads, &layer.w2, dr2, acts.gate.all(), dx);
    let swiglu = layer.w3.is_some();
    be.swiglu_backward(
        dacts.dh1.all_mut(),
        swiglu.then(|| dacts.dh3.all_mut()),
        dacts.dgate.all(),
        acts.h1.all(),
        swiglu.then(|| acts.h3.all()),
    );
    // h1 = ffn_in·W1ᵀ, h3 = ffn_in·W3ᵀ, ffn_in = pre(y)
    let y = model.normed(Norm::Post, acts.r1.all(), &acts.ln1);
    let ffn_in = model.normed(Norm::Pre, y, &acts.ln2);
    let dx = Linear::W1.dx(config, n);
    let (dffn_in, dx) = model.dsublayer_in(&mut dacts.dresid, &mut dacts.dtmp, dx, true);
    model.linear_backward(
        dffn_in.all_mut(),
        grads,
        &layer.w1,
        dacts.dh1.all(),
        ffn_in,
        dx,
    );
    if let Some(w3) = &layer.w3 {
        let dx = Linear::W3.dx(config, n).accumulating();
        model.linear_backward(dffn_in.all_mut(), grads, w3, dacts.dh3.all(), ffn_in, dx);
    }
    model.pre_norm_backward(&layer.ln2, y, acts.rstd2.all(), dacts, grads, true);
    // Here dresid = ∂/∂y. y = post(r1), r1 = x + atty·W_oᵀ
    model.post_norm_backward(&layer.ln1, acts.r1.all(), acts.rstd1.all(), dacts, grads);
    let (datty, dr1) = (dacts.datty.all_mut(), dacts.dresid.all());
    let dx = Linear::OutputProj.dx(config, n);
    model.linear_backward(datty, grads, &layer.output_proj, dr1, acts.atty.all(), dx);
    // atty = attention(qkv), qkv = RoPE(attn_in·W_qkvᵀ), attn_in = pre(x)
    be.attention_backward(
        dacts.dqkv.all_mut(),
        dacts.datt.all_mut(),
        dacts.datty.all(),
        acts.atty.all(),
        acts.qkv.all(),
        acts.att.all(),
        shape,
    );
    model.rope(dacts.dqkv.all_mut(), shape, true);
    let attn_in = model.normed(Norm::Pre, x, &acts.ln1);
    let dx = Linear::Qkv.dx(config, n);
    let (dattn_in, dx) = model.dsublayer_in(&mut dacts.dresid, &mut dacts.dtmp, dx, true);
    let w_qkv = qkv_range(layer);
    model.linear_backward(
        dattn_in.all_mut(),
        grads,
        &w_qkv,
        dacts.dqkv.all(),
        attn_in,
        dx,
    );
    model.pre_norm_backward(&layer.ln1, x, acts.rstd1.all(), dacts, grads, true);
}
