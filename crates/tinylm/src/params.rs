//! The parameter layout: every weight of the model as a named view into one
//! contiguous `f32` buffer, in CS336 order, with PyTorch's `(out, in)` shapes.
//! Gradients and optimizer moments use the same layout.

use crate::config::{Ffn, ModelConfig, Norm};
use crate::kernels::ParamRead;
use crate::{Error, Result};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

/// How a tensor is initialized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// N(0, 1) truncated at ±3 (embeddings).
    Embedding,
    /// N(0, σ²), σ² = 2 / (d_in + d_out), truncated at ±3σ (linear weights).
    Linear,
    /// All ones (RMSNorm gains).
    Ones,
}

/// One named tensor of the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// The CS336 / PyTorch state-dict name, e.g. `layers.0.attn.q_proj.weight`.
    pub name: String,
    /// Row-major shape; linear weights are `(out, in)`.
    pub shape: Vec<usize>,
    /// Offset of the first element in the flat buffer.
    pub offset: usize,
    pub init: Init,
}

impl ParamSpec {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// The offsets of one block's tensors (`None` where an ablation removes one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerOffsets {
    pub ln1: Option<Range<usize>>,
    pub q_proj: Range<usize>,
    pub k_proj: Range<usize>,
    pub v_proj: Range<usize>,
    pub output_proj: Range<usize>,
    pub ln2: Option<Range<usize>>,
    pub w1: Range<usize>,
    pub w2: Range<usize>,
    pub w3: Option<Range<usize>>,
}

/// All tensors of a model and where they live in the flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamLayout {
    pub specs: Vec<ParamSpec>,
    pub token_embeddings: Range<usize>,
    pub layers: Vec<LayerOffsets>,
    pub ln_final: Option<Range<usize>>,
    /// The output projection `(vocab_size, d_model)`: `lm_head.weight`, or the
    /// embedding matrix itself when embeddings are tied.
    pub lm_head: Range<usize>,
    pub total: usize,
}

impl ParamLayout {
    pub fn new(c: &ModelConfig) -> Self {
        let mut specs: Vec<ParamSpec> = Vec::new();
        let mut add = |name: String, shape: Vec<usize>, init: Init| -> Range<usize> {
            let offset = specs.last().map_or(0, |s| s.offset + s.len());
            let spec = ParamSpec {
                name,
                shape,
                offset,
                init,
            };
            let range = spec.range();
            specs.push(spec);
            range
        };
        let (d, f, v) = (c.d_model, c.d_ff, c.vocab_size);
        let has_norm = c.norm != Norm::None;
        // A tied matrix serves as the output projection, so it takes the linear init.
        let embed_init = if c.tie_embeddings {
            Init::Linear
        } else {
            Init::Embedding
        };
        let token_embeddings = add("token_embeddings.weight".into(), vec![v, d], embed_init);
        let layers = (0..c.num_layers)
            .map(|i| {
                let p = format!("layers.{i}.");
                let ln1 = has_norm.then(|| add(format!("{p}ln1.weight"), vec![d], Init::Ones));
                let q_proj = add(format!("{p}attn.q_proj.weight"), vec![d, d], Init::Linear);
                let k_proj = add(format!("{p}attn.k_proj.weight"), vec![d, d], Init::Linear);
                let v_proj = add(format!("{p}attn.v_proj.weight"), vec![d, d], Init::Linear);
                let output_proj = add(
                    format!("{p}attn.output_proj.weight"),
                    vec![d, d],
                    Init::Linear,
                );
                let ln2 = has_norm.then(|| add(format!("{p}ln2.weight"), vec![d], Init::Ones));
                let w1 = add(format!("{p}ffn.w1.weight"), vec![f, d], Init::Linear);
                let w2 = add(format!("{p}ffn.w2.weight"), vec![d, f], Init::Linear);
                let w3 = (c.ffn == Ffn::Swiglu)
                    .then(|| add(format!("{p}ffn.w3.weight"), vec![f, d], Init::Linear));
                LayerOffsets {
                    ln1,
                    q_proj,
                    k_proj,
                    v_proj,
                    output_proj,
                    ln2,
                    w1,
                    w2,
                    w3,
                }
            })
            .collect();
        let ln_final =
            (c.norm == Norm::Pre).then(|| add("ln_final.weight".into(), vec![d], Init::Ones));
        let lm_head = if c.tie_embeddings {
            token_embeddings.clone()
        } else {
            add("lm_head.weight".into(), vec![v, d], Init::Linear)
        };
        let total = specs.last().map_or(0, |s| s.offset + s.len());
        ParamLayout {
            specs,
            token_embeddings,
            layers,
            ln_final,
            lm_head,
            total,
        }
    }

    /// How a forward pass reads `spec`: a linear layer's weight (every
    /// projection's, an untied output projection's) only as a matrix product's
    /// operand; the embeddings are looked up — and, tied to the output layer,
    /// multiplied too — and the gains scale.
    pub fn read(&self, spec: &ParamSpec) -> ParamRead {
        match (spec.shape.len(), spec.range() == self.token_embeddings) {
            (2, false) => ParamRead::Operand,
            (_, true) if self.lm_head == self.token_embeddings => ParamRead::Both,
            _ => ParamRead::Values,
        }
    }

    /// The spec of the tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&ParamSpec> {
        self.specs.iter().find(|s| s.name == name)
    }

    /// A freshly initialized parameter buffer (SPEC §2 init), deterministic in `seed`.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut data = vec![0f32; self.total];
        for spec in &self.specs {
            let out = &mut data[spec.range()];
            match spec.init {
                Init::Ones => out.fill(1.0),
                Init::Embedding => fill_truncated_normal(&mut rng, out, 1.0),
                Init::Linear => {
                    let (d_out, d_in) = (spec.shape[0], spec.shape[1]);
                    let std = (2.0 / (d_in + d_out) as f64).sqrt();
                    fill_truncated_normal(&mut rng, out, std);
                }
            }
        }
        data
    }

    /// Every tensor of the layout as `(name, shape, values)` views into `buf` (a
    /// parameter, gradient or moment buffer), in CS336 order, ready for
    /// [`save_safetensors`](crate::safetensors_io::save_safetensors).
    pub fn tensors<'a>(&self, buf: &'a [f32]) -> Vec<(String, Vec<usize>, &'a [f32])> {
        assert_eq!(buf.len(), self.total, "buffer does not match the layout");
        self.specs
            .iter()
            .map(|s| (s.name.clone(), s.shape.clone(), &buf[s.range()]))
            .collect()
    }

    /// Assembles a flat buffer from tensors loaded by name (see [`load_safetensors`](crate::safetensors_io::load_safetensors)).
    /// Every tensor of the layout must be present with its exact shape and no other
    /// tensor may be: errors list each missing, extra and mis-shaped tensor and name
    /// `path`, the file they came from.
    pub fn load_buffer(&self, tensors: &Tensors, path: &Path) -> Result<Vec<f32>> {
        let shapes = tensors
            .iter()
            .map(|(name, (shape, _))| (name.as_str(), shape.as_slice()))
            .collect();
        self.check(&shapes, path)?;
        // Every tensor is present with its shape, so the file holds `total` values.
        let mut buf = vec![0f32; self.total];
        for spec in &self.specs {
            buf[spec.range()].copy_from_slice(&tensors[&spec.name].1);
        }
        Ok(buf)
    }

    /// Checks tensors by name (`name -> shape`) against the layout (see
    /// [`ParamLayout::load_buffer`]).
    pub(crate) fn check(&self, shapes: &BTreeMap<&str, &[usize]>, path: &Path) -> Result<()> {
        let mut problems = Vec::new();
        for spec in &self.specs {
            match shapes.get(spec.name.as_str()) {
                None => problems.push(format!(
                    "missing tensor '{}' of shape {:?}",
                    spec.name, spec.shape
                )),
                Some(shape) if *shape != spec.shape => problems.push(format!(
                    "tensor '{}' has shape {shape:?}, expected {:?}",
                    spec.name, spec.shape
                )),
                Some(_) => {}
            }
        }
        let tied = self.lm_head == self.token_embeddings;
        for name in shapes.keys().filter(|n| self.get(n).is_none()) {
            let hint = if tied && *name == "lm_head.weight" {
                " (tie_embeddings is true: token_embeddings.weight serves as lm_head)"
            } else {
                ""
            };
            problems.push(format!("unexpected tensor '{name}'{hint}"));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "{}: the weights do not match the model configuration: {}",
                path.display(),
                problems.join("; ")
            )))
        }
    }
}

/// The layout of `config` (a valid one) for the weights of a file of `tensors`
/// tensors (`path`). Every layer has at least six tensors, so a config that claims
/// more layers than the file has tensors is refused before its layout is built:
/// the layout's size then follows the file's, whatever a config read from the
/// file or given with it claims.
pub fn layout_for_file(config: &ModelConfig, tensors: usize, path: &Path) -> Result<ParamLayout> {
    if config.num_layers > tensors {
        return Err(Error::Invalid(format!(
            "{}: the model configuration has {} layers, but the file holds only {tensors} tensors",
            path.display(),
            config.num_layers
        )));
    }
    Ok(ParamLayout::new(config))
}

/// Named tensors as `name -> (shape, values)`.
pub type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Fills `out` with N(0, std²) samples truncated at ±3·std (rejection sampling).
fn fill_truncated_normal(rng: &mut impl RngExt, out: &mut [f32], std: f64) {
    for x in out.iter_mut() {
        *x = loop {
            // Box-Muller; u1 in (0, 1] so the log is finite.
            let u1 = 1.0 - rng.random::<f64>();
            let u2 = rng.random::<f64>();
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            if z.abs() <= 3.0 {
                break (z * std) as f32;
            }
        };
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::Positional;

    pub(crate) fn small() -> ModelConfig {
        ModelConfig {
            vocab_size: 11,
            context_length: 8,
            d_model: 8,
            num_layers: 2,
            num_heads: 2,
            d_ff: 12,
            rope_theta: 10_000.0,
            norm: Norm::Pre,
            positional: Positional::Rope,
            ffn: Ffn::Swiglu,
            tie_embeddings: false,
        }
    }

    #[test]
    fn names_shapes_and_order() {
        let layout = ParamLayout::new(&small());
        let names: Vec<&str> = layout.specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names[0], "token_embeddings.weight");
        assert_eq!(
            &names[1..10],
            &[
                "layers.0.ln1.weight",
                "layers.0.attn.q_proj.weight",
                "layers.0.attn.k_proj.weight",
                "layers.0.attn.v_proj.weight",
                "layers.0.attn.output_proj.weight",
                "layers.0.ln2.weight",
                "layers.0.ffn.w1.weight",
                "layers.0.ffn.w2.weight",
                "layers.0.ffn.w3.weight",
            ]
        );
        assert_eq!(
            names[names.len() - 2..],
            ["ln_final.weight", "lm_head.weight"]
        );
        assert_eq!(
            layout.get("layers.1.ffn.w2.weight").unwrap().shape,
            vec![8, 12]
        );
        let expected = 11 * 8 * 2 + 2 * (2 * 8 + 4 * 64 + 3 * 96) + 8;
        assert_eq!(layout.total, expected);
    }

    #[test]
    fn ablations_drop_their_tensors() {
        let mut c = small();
        c.norm = Norm::None;
        c.ffn = Ffn::Silu;
        c.tie_embeddings = true;
        let layout = ParamLayout::new(&c);
        for gone in ["ln1", "ln2", "ln_final", "w3", "lm_head"] {
            assert!(
                layout.specs.iter().all(|s| !s.name.contains(gone)),
                "{gone}"
            );
        }
        assert_eq!(layout.lm_head, layout.token_embeddings);
        c.norm = Norm::Post;
        let layout = ParamLayout::new(&c);
        assert!(layout.get("layers.0.ln1.weight").is_some());
        assert!(layout.get("ln_final.weight").is_none());
    }

    /// Every tensor of `layout`, initialized, by name.
    fn named_tensors(layout: &ParamLayout) -> Tensors {
        let params = layout.init(0);
        (layout.tensors(&params).into_iter())
            .map(|(n, s, v)| (n, (s, v.to_vec())))
            .collect()
    }

    /// The tensors of [`small`]'s layout with one missing, one mis-shaped and one
    /// extra.
    pub(crate) fn mismatched() -> (ParamLayout, Tensors) {
        let layout = ParamLayout::new(&small());
        let mut tensors = named_tensors(&layout);
        tensors.remove("layers.0.attn.k_proj.weight");
        tensors.get_mut("ln_final.weight").unwrap().0 = vec![4, 2];
        tensors.insert("extra.bias".into(), (vec![1], vec![0.0]));
        (layout, tensors)
    }

    #[test]
    fn mismatched_weights_name_every_problem() {
        let path = Path::new("w.safetensors");
        let (layout, tensors) = mismatched();
        let err = layout.load_buffer(&tensors, path).unwrap_err().to_string();
        for part in [
            "w.safetensors",
            "missing tensor 'layers.0.attn.k_proj.weight' of shape [8, 8]",
            "tensor 'ln_final.weight' has shape [4, 2], expected [8]",
            "unexpected tensor 'extra.bias'",
        ] {
            assert!(err.contains(part), "{part} not in {err}");
        }
        let mut c = small();
        c.tie_embeddings = true;
        let tied = ParamLayout::new(&c);
        let mut tensors = named_tensors(&layout);
        let err = tied.load_buffer(&tensors, path).unwrap_err().to_string();
        assert!(err.contains("tie_embeddings"), "{err}");
        tensors.remove("lm_head.weight");
        assert!(tied.load_buffer(&tensors, path).is_ok());
    }

    #[test]
    fn init_is_seeded_truncated_and_scaled() {
        let mut c = small();
        c.d_model = 64;
        c.d_ff = 128;
        c.num_heads = 4;
        let layout = ParamLayout::new(&c);
        let a = layout.init(1);
        assert_eq!(a, layout.init(1));
        assert_ne!(a, layout.init(2));
        let emb = &a[layout.token_embeddings.clone()];
        assert!(emb.iter().all(|x| x.abs() <= 3.0));
        let w1 = &a[layout.layers[0].w1.clone()];
        let std = (2.0f64 / (64 + 128) as f64).sqrt();
        let var = w1.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / w1.len() as f64;
        // Truncation at 3σ keeps ~97.3% of the variance.
        assert!(
            (var.sqrt() / std - 0.987).abs() < 0.03,
            "std {}",
            var.sqrt()
        );
        assert!(w1.iter().all(|&x| (x as f64).abs() <= 3.0 * std + 1e-6));
        assert!(a[layout.layers[0].ln1.clone().unwrap()]
            .iter()
            .all(|&x| x == 1.0));
    }
}
