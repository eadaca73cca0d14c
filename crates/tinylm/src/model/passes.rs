//! The passes over every block: forward, decoding (over KV caches) and backward.

use super::block::{block_backward, block_forward, Attention};
use super::cache::NewTokens;
use super::products::Linear;
use super::view::{ModelView, ParamGrads};
use crate::buffers::{Activations, DecodeActivations, GradActivations};
use crate::config::Norm;
use crate::kernels::{Backend, Buffer, Float};

/// The forward pass from `acts.ids` to `acts.logits`.
pub(super) fn forward_pass<F: Float, B: Backend<F>>(
    model: &ModelView<F, B>,
    acts: &mut Activations<B::Buf, B::Ids>,
) {
    let (be, config, layout) = (model.backend, model.config, model.layout);
    let (b, t) = (acts.b, acts.t);
    let shape = model.attn_shape(b, t, 0);
    be.embedding_forward(
        acts.resid[0].all_mut(),
        &acts.ids,
        model.get(&layout.token_embeddings),
    );
    for (l, (layer, layer_acts)) in layout.layers.iter().zip(&mut acts.layers).enumerate() {
        let (before, after) = acts.resid.split_at_mut(l + 1);
        let (x, out) = (before[l].all(), &mut after[0]);
        block_forward(model, layer, layer_acts, x, out, Attention::Full(shape));
    }
    let last = acts.resid[config.num_layers].all();
    let hidden = model.norm(
        Norm::Pre,
        &layout.ln_final,
        last,
        &mut acts.lnf,
        &mut acts.lnf_rstd,
    );
    let head = Linear::LmHead.forward(config, b * t);
    model.linear(acts.logits.all_mut(), hidden, &layout.lm_head, head);
}

/// A decoding pass: from `acts.ids` — the new tokens of `sequences`, one sequence's
/// after another's — through every block (one set of block buffers, reused), each
/// sequence's new keys and values appended to its cache (the caller advances the
/// caches' lengths), to `acts.logits (S, V)` of each sequence's last new row.
pub(super) fn decode_pass<F: Float, B: Backend<F>>(
    model: &ModelView<F, B>,
    acts: &mut DecodeActivations<B::Buf, B::Ids>,
    sequences: &mut [NewTokens<B::Buf>],
) {
    let (be, config, layout) = (model.backend, model.config, model.layout);
    let c = config.d_model;
    be.embedding_forward(
        acts.resid[0].all_mut(),
        &acts.ids,
        model.get(&layout.token_embeddings),
    );
    for (l, layer) in layout.layers.iter().enumerate() {
        let [x, out] = &mut acts.resid;
        let attention = Attention::Cached {
            sequences: &mut *sequences,
            layer: l,
        };
        block_forward(model, layer, &mut acts.layer, x.all(), out, attention);
        acts.resid.swap(0, 1);
    }
    let mut end = 0;
    for (s, seq) in sequences.iter().enumerate() {
        end += seq.tokens.len();
        let last_row = acts.resid[0].at((end - 1) * c..end * c);
        be.copy(acts.last.at_mut(s * c..(s + 1) * c), last_row);
    }
    let hidden = model.norm(
        Norm::Pre,
        &layout.ln_final,
        acts.last.all(),
        &mut acts.lnf,
        &mut acts.lnf_rstd,
    );
    let head = Linear::LmHead.forward(config, sequences.len());
    model.linear(acts.logits.all_mut(), hidden, &layout.lm_head, head);
}

/// The backward pass of the last full forward, whose logits buffer holds
/// `∂loss/∂logits`: every parameter's gradient into `grads` (overwritten, or added
/// to with `grads.add`).
pub(super) fn backward_pass<F: Float, B: Backend<F>>(
    model: &ModelView<F, B>,
    acts: &Activations<B::Buf, B::Ids>,
    dacts: &mut GradActivations<B::Buf>,
    grads: &mut ParamGrads<B::Buf>,
) {
    let (be, config, layout) = (model.backend, model.config, model.layout);
    let n = acts.b * acts.t;
    // Each weight matrix's gradient is written by its one product (overwritten); the
    // norm gains' and an untied embedding's gradients are only added to: zeroed here.
    let added_to = (layout.layers.iter())
        .flat_map(|l| [l.ln1.clone(), l.ln2.clone()])
        .chain([layout.ln_final.clone()])
        .flatten()
        .chain((!config.tie_embeddings).then(|| layout.token_embeddings.clone()));
    if !grads.add {
        for range in added_to {
            be.fill_zero(grads.buf.at_mut(range));
        }
    }

    // LM head (and ln_final): dresid = ∂loss/∂(last block's output).
    let last = acts.resid[config.num_layers].all();
    let hidden = model.normed(Norm::Pre, last, &acts.lnf);
    let dx = Linear::LmHead.dx(config, n);
    let (dhidden, dx) = model.dsublayer_in(&mut dacts.dresid, &mut dacts.dtmp, dx, false);
    let dlogits = acts.logits.all();
    model.linear_backward(
        dhidden.all_mut(),
        grads,
        &layout.lm_head,
        dlogits,
        hidden,
        dx,
    );
    let lnf = &layout.ln_final;
    model.pre_norm_backward(lnf, last, acts.lnf_rstd.all(), dacts, grads, false);

    let shape = model.attn_shape(acts.b, acts.t, 0);
    for (l, layer) in layout.layers.iter().enumerate().rev() {
        let x = acts.resid[l].all();
        block_backward(model, layer, &acts.layers[l], x, dacts, grads, shape);
    }
    be.embedding_backward(
        grads.buf.at_mut(layout.token_embeddings.clone()),
        dacts.dresid.all(),
        &acts.ids,
    );
}
