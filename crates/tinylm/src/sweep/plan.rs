//! A sweep's plan: the axes of a grid (`lr_max=1e-4,3e-4`), the named variants
//! (`no-norm,silu`, `wide:d_model=768,num_heads=12`), and the points they span,
//! each a run directory named by its values with its whole configuration.

use crate::config::Ablation;
use crate::train::{resolve_config, TrainConfig};
use crate::{Error, ModelConfig, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// The most runs a sweep plans (each a whole configuration), checked before any
/// is made.
pub const MAX_POINTS: usize = 10_000;

/// Keys a sweep sets itself: a grid or a variant may not.
const RESERVED: [&str; 3] = ["out_dir", "resume", "model"];

/// A value of an axis: its text (as given, or as JSON writes it) names the run.
#[derive(Clone, Debug, PartialEq)]
pub struct AxisValue {
    pub text: String,
    pub value: Value,
}

impl AxisValue {
    /// A value given as text: a JSON number, boolean or null when it reads as one,
    /// else the text itself (`none`, `silu`, a path).
    pub fn parse(text: &str) -> AxisValue {
        let value = match serde_json::from_str::<Value>(text) {
            Ok(v) if !(v.is_object() || v.is_array()) => v,
            _ => Value::String(text.to_string()),
        };
        AxisValue {
            text: text.to_string(),
            value,
        }
    }

    /// A value given as JSON.
    pub fn of(value: Value) -> AxisValue {
        let text = match &value {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        AxisValue { text, value }
    }
}

/// One axis of a grid: a configuration key and its values.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The key as given (`lr_max`, `d_model`): the summary's column and the run
    /// names' spelling.
    pub name: String,
    /// The configuration key it sets (`lr_max`, `model.d_model`).
    pub key: String,
    pub values: Vec<AxisValue>,
}

impl Axis {
    /// An axis from `KEY=V1,V2,...`; the error names the key or the spec.
    pub fn parse(spec: &str) -> Result<Axis> {
        let Some((name, values)) = spec.split_once('=') else {
            return Err(Error::Config(format!(
                "grid axis `{spec}`: expected KEY=V1,V2,..."
            )));
        };
        let values: Vec<AxisValue> = match values.trim() {
            "" => Vec::new(),
            values => values
                .split(',')
                .map(|v| AxisValue::parse(v.trim()))
                .collect(),
        };
        Axis::new(name.trim(), values)
    }

    /// An axis over `values` of the key `name` (a training key, or a model key bare
    /// or as `model.<key>`); an unknown key, no values, or one given twice is an error.
    pub fn new(name: &str, values: Vec<AxisValue>) -> Result<Axis> {
        let key = config_key(name)?;
        if values.is_empty() {
            return Err(Error::Config(format!("grid axis `{name}` has no values")));
        }
        for (i, v) in values.iter().enumerate() {
            if values[..i].iter().any(|w| w.value == v.value) {
                return Err(Error::Config(format!(
                    "grid axis `{name}` lists {} twice",
                    v.text
                )));
            }
        }
        Ok(Axis {
            name: name.to_string(),
            key,
            values,
        })
    }
}

/// A named variant of the base configuration: an ablation, `baseline` (nothing
/// changed), or keys of its own.
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    pub name: String,
    /// `(configuration key, value)` pairs it sets.
    pub keys: Vec<(String, Value)>,
    /// The ablation applied after the keys.
    pub ablation: Option<Ablation>,
}

impl Variant {
    /// Variants from a `--list` value: `NAME:KEY=V,KEY=V` (one variant with keys of
    /// its own), or comma-separated preset names (`baseline`, `no-norm`,
    /// `post-norm`, `nope`, `silu`).
    pub fn parse_list(spec: &str) -> Result<Vec<Variant>> {
        let Some((name, keys)) = spec.split_once(':') else {
            return spec.split(',').map(|n| Variant::preset(n.trim())).collect();
        };
        let keys = keys
            .split(',')
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) => Ok((k.trim().to_string(), AxisValue::parse(v.trim()).value)),
                None => Err(Error::Config(format!(
                    "variant `{spec}`: expected NAME:KEY=VALUE,KEY=VALUE, got `{pair}`"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(vec![Variant::new(name.trim(), keys)?])
    }

    /// The preset `name`: `baseline` or an ablation.
    pub fn preset(name: &str) -> Result<Variant> {
        let ablation = match name {
            "baseline" => None,
            name => Some(Ablation::parse(name).ok_or_else(|| {
                let known: Vec<&str> = Ablation::ALL.iter().map(|a| a.name()).collect();
                Error::Config(format!(
                    "unknown variant `{name}` (presets: baseline, {}; or NAME:KEY=VALUE,...)",
                    known.join(", ")
                ))
            })?),
        };
        Ok(Variant {
            name: name.to_string(),
            keys: Vec::new(),
            ablation,
        })
    }

    /// The variant `name` setting `keys` (each a training or model key).
    pub fn new(name: &str, keys: Vec<(String, Value)>) -> Result<Variant> {
        if name.is_empty() {
            return Err(Error::Config("a variant needs a name".into()));
        }
        let keys = keys
            .into_iter()
            .map(|(k, v)| Ok((config_key(&k)?, v)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Variant {
            name: name.to_string(),
            keys,
            ablation: None,
        })
    }
}

/// One run of a sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Its directory's name: the variant, then `key=value` per axis, joined by `,`.
    pub name: String,
    /// `(column, value)`: the variant (column `variant`) and each axis's value.
    pub values: Vec<(String, String)>,
    pub config: TrainConfig,
}

/// Every point of the grid `axes` × `variants` (the variants outermost, the last
/// axis innermost) over the base configuration `base` (a JSON table of training
/// keys, the model's under `model`), each in its directory under `out`. A value
/// that does not make a valid configuration is an error naming its key and value.
pub fn points(base: &Value, axes: &[Axis], variants: &[Variant], out: &Path) -> Result<Vec<Point>> {
    if axes.is_empty() && variants.is_empty() {
        return Err(Error::Config(
            "nothing to sweep: give a grid axis (KEY=V1,V2) or a list of variants".into(),
        ));
    }
    for (i, axis) in axes.iter().enumerate() {
        if axes[..i].iter().any(|a| a.key == axis.key) {
            return Err(Error::Config(format!(
                "grid axis `{}` is given twice",
                axis.name
            )));
        }
    }
    for (i, v) in variants.iter().enumerate() {
        if variants[..i].iter().any(|w| w.name == v.name) {
            return Err(Error::Config(format!(
                "variant `{}` is given twice",
                v.name
            )));
        }
    }
    let count = (axes.iter())
        .try_fold(variants.len().max(1), |n, axis| {
            n.checked_mul(axis.values.len())
        })
        .filter(|&n| n <= MAX_POINTS);
    if count.is_none() {
        return Err(Error::Config(format!(
            "the sweep has more than {MAX_POINTS} runs: give fewer values or variants"
        )));
    }
    let given = |keys: &[(&str, &Value)], dir: &str| {
        let mut given = base.clone();
        for (key, value) in keys {
            match key.split_once('.') {
                Some((outer, inner)) => given[outer][inner] = (*value).clone(),
                None => given[*key] = (*value).clone(),
            }
        }
        given["out_dir"] = Value::String(out.join(dir).to_string_lossy().into_owned());
        resolve_config(given, &|key| format!("`{key}`"))
    };
    // The base alone, so that its own faults are not blamed on a value.
    given(&[], "base")
        .map_err(|e| Error::Config(format!("the base configuration: {}", message(e))))?;
    for axis in axes {
        for v in &axis.values {
            given(&[(&axis.key, &v.value)], "check").map_err(|e| {
                Error::Config(format!(
                    "grid axis `{}`: value `{}`: {}",
                    axis.name,
                    v.text,
                    message(e)
                ))
            })?;
        }
    }

    let baseline = [Variant {
        name: String::new(),
        keys: Vec::new(),
        ablation: None,
    }];
    let variants = if variants.is_empty() {
        &baseline[..]
    } else {
        variants
    };
    let mut out_points = Vec::new();
    for variant in variants {
        for combination in combinations(axes) {
            let mut values = Vec::new();
            let mut names = Vec::new();
            if !variant.name.is_empty() {
                values.push(("variant".to_string(), variant.name.clone()));
                names.push(variant.name.clone());
            }
            let mut keys: Vec<(&str, &Value)> =
                variant.keys.iter().map(|(k, v)| (k.as_str(), v)).collect();
            for (axis, v) in axes.iter().zip(&combination) {
                values.push((axis.name.clone(), v.text.clone()));
                names.push(format!("{}={}", axis.name, v.text));
                keys.push((&axis.key, &v.value));
            }
            let name = dir_name(&names.join(","));
            let context = |e: Error| Error::Config(format!("run `{name}`: {}", message(e)));
            let mut config = given(&keys, &name).map_err(context)?.config;
            if let Some(ablation) = variant.ablation {
                ablation.apply(&mut config.model);
                config.validate().map_err(context)?;
            }
            out_points.push(Point {
                name,
                values,
                config,
            });
        }
    }
    Ok(out_points)
}

/// An error's message without the `invalid configuration` its wrapper adds again.
fn message(e: Error) -> String {
    match e {
        Error::Config(message) => message,
        e => e.to_string(),
    }
}

/// Every combination of one value per axis, the last axis changing fastest.
fn combinations(axes: &[Axis]) -> Vec<Vec<&AxisValue>> {
    axes.iter().fold(vec![Vec::new()], |done, axis| {
        done.iter()
            .flat_map(|prefix| {
                axis.values.iter().map(move |v| {
                    let mut next = prefix.clone();
                    next.push(v);
                    next
                })
            })
            .collect()
    })
}

/// `name` as a directory name: path separators and spaces replaced.
fn dir_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '/' | '\\' | ' ' | '\t' => '_',
            c => c,
        })
        .collect()
}

/// The configuration key `name` sets: a training key as it is, a model key bare or
/// as `model.<key>` as `model.<key>`; an unknown or reserved key is an error naming it.
pub fn config_key(name: &str) -> Result<String> {
    let training = keys_of(&TrainConfig::default());
    let model = keys_of(&ModelConfig::tinystories());
    let bare = name.strip_prefix("model.").unwrap_or(name);
    if RESERVED.contains(&name) {
        return Err(Error::Config(format!(
            "`{name}` cannot be swept: the sweep sets it for each run"
        )));
    }
    if name.starts_with("model.") || !training.contains_key(name) {
        if model.contains_key(bare) {
            return Ok(format!("model.{bare}"));
        }
        let training: Vec<&str> = training
            .keys()
            .map(String::as_str)
            .filter(|k| !RESERVED.contains(k))
            .collect();
        let model: Vec<&str> = model.keys().map(String::as_str).collect();
        return Err(Error::Config(format!(
            "unknown key `{name}` (training keys: {}; model keys: {})",
            training.join(", "),
            model.join(", ")
        )));
    }
    Ok(name.to_string())
}

/// The keys of a configuration's JSON table.
fn keys_of(config: &impl serde::Serialize) -> Map<String, Value> {
    match serde_json::to_value(config).expect("serializes") {
        Value::Object(keys) => keys,
        _ => unreachable!("a configuration is a table"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"train_data": "t.npy", "model": {"d_model": 64, "num_heads": 4, "d_ff": 128}})
    }

    #[test]
    fn keys_are_training_keys_or_model_keys_bare_or_prefixed() {
        assert_eq!(config_key("lr_max").unwrap(), "lr_max");
        assert_eq!(config_key("d_model").unwrap(), "model.d_model");
        assert_eq!(config_key("model.norm").unwrap(), "model.norm");
        for bad in ["lr", "model.lr_max", "resume", "model"] {
            assert!(
                config_key(bad)
                    .unwrap_err()
                    .to_string()
                    .contains(&format!("`{bad}`")),
                "{bad}"
            );
        }
    }

    #[test]
    fn points_span_variants_then_axes_and_are_named_by_their_values() {
        let axes = [
            Axis::parse("lr_max=1e-3,3e-3").unwrap(),
            Axis::new(
                "d_model",
                vec![AxisValue::of(json!(32)), AxisValue::of(json!(64))],
            )
            .unwrap(),
        ];
        let variants = Variant::parse_list("baseline,silu").unwrap();
        let points = points(&base(), &axes, &variants, Path::new("sweep")).unwrap();
        let names: Vec<&str> = points.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "baseline,lr_max=1e-3,d_model=32",
                "baseline,lr_max=1e-3,d_model=64",
                "baseline,lr_max=3e-3,d_model=32",
                "baseline,lr_max=3e-3,d_model=64",
                "silu,lr_max=1e-3,d_model=32",
                "silu,lr_max=1e-3,d_model=64",
                "silu,lr_max=3e-3,d_model=32",
                "silu,lr_max=3e-3,d_model=64",
            ]
        );
        let p = &points[5];
        assert_eq!(p.config.out_dir, Path::new("sweep").join(&p.name));
        assert_eq!((p.config.lr_max, p.config.model.d_model), (1e-3, 64));
        // silu's d_ff follows the point's d_model; the baseline keeps the base's.
        assert_eq!(
            (p.config.model.ffn, p.config.model.d_ff),
            (crate::config::Ffn::Silu, 256)
        );
        assert_eq!(points[1].config.model.d_ff, 128);
        let columns: Vec<&str> = p.values.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(columns, ["variant", "lr_max", "d_model"]);
    }

    #[test]
    fn text_values_read_as_json_scalars_else_as_strings() {
        assert_eq!(AxisValue::parse("1e-3").value, json!(1e-3));
        assert_eq!(AxisValue::parse("true").value, json!(true));
        assert_eq!(AxisValue::parse("post").value, json!("post"));
        assert_eq!(AxisValue::parse("[1]").value, json!("[1]"));
        assert_eq!(AxisValue::of(json!("none")).text, "none");
        assert_eq!(AxisValue::of(json!(0.001)).text, "0.001");
    }

    #[test]
    fn a_grid_of_more_than_max_points_runs_is_refused_before_planning() {
        let ten = |key: &str| Axis::parse(&format!("{key}={}", "1,2,3,4,5,6,7,8,9,10")).unwrap();
        let axes: Vec<Axis> = ["seed", "steps", "batch_size", "warmup_steps"]
            .map(ten)
            .into();
        assert_eq!(
            points(&base(), &axes, &[], Path::new("s")).unwrap().len(),
            MAX_POINTS
        );
        let mut more = axes.clone();
        more.push(ten("eval_interval"));
        for variants in [vec![], Variant::parse_list("baseline,silu").unwrap()] {
            let err = points(&base(), &more, &variants, Path::new("s"));
            assert!(err
                .unwrap_err()
                .to_string()
                .contains("more than 10000 runs"));
        }
    }

    #[test]
    fn a_point_that_makes_no_valid_model_is_named() {
        // 48 is not a multiple of 5 heads: only the ablation-free point is valid.
        let axes = [Axis::parse("num_heads=4,5").unwrap()];
        let err = points(&base(), &axes, &[], Path::new("s"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`num_heads`: value `5`") && err.contains("divisible"),
            "{err}"
        );
    }
}
