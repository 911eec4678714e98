//! The trainer's configuration from Python: `None` (the defaults), a dict of
//! sections (`{"model": {"kind": "gat"}}`) or a TOML file's path, then
//! overrides of dotted keys (`{"train.lr": 0.01}`). Everything goes through
//! `TrainConfig::from_layers`, as `tandem train --config FILE --set KEY=VALUE`
//! does: the same keys, validation and messages.

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use runtime::config::{Override, TrainConfig};
use runtime::{ConfigProblem, Error};

use crate::errors::{to_py, IntoPy};

/// How errors name a dict given as the configuration.
pub(crate) const DICT_ORIGIN: &str = "<config dict>";
/// How errors name the overrides.
pub(crate) const OVERRIDES_ORIGIN: &str = "overrides";

/// A config error at `key` of `origin`: `found` is not a TOML value.
fn not_toml(origin: &str, key: &str, found: &Bound<'_, PyAny>) -> PyErr {
    let found = found
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "an object".into());
    to_py(Error::Config {
        origin: origin.into(),
        key: key.into(),
        problem: ConfigProblem::BadValue {
            expected: "a bool, int, float, str, list or dict".into(),
            found,
        },
    })
}

/// A Python value as TOML (`key` names it in errors).
fn toml_value(v: &Bound<'_, PyAny>, origin: &str, key: &str) -> PyResult<toml::Value> {
    if v.is_instance_of::<PyBool>() {
        return Ok(toml::Value::Boolean(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        return v
            .extract::<i64>()
            .map(toml::Value::Integer)
            .map_err(|_| not_toml(origin, key, v));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(toml::Value::Float(v.extract()?));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(toml::Value::String(v.extract()?));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        return Ok(toml::Value::Table(toml_table(d, origin, key)?));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items: PyResult<Vec<toml::Value>> = v
            .try_iter()?
            .enumerate()
            .map(|(i, x)| toml_value(&x?, origin, &format!("{key}[{i}]")))
            .collect();
        return Ok(toml::Value::Array(items?));
    }
    // os.PathLike (a dataset path, say) as its string.
    if let Ok(p) = v.extract::<PathBuf>() {
        return Ok(toml::Value::String(p.display().to_string()));
    }
    Err(not_toml(origin, key, v))
}

/// A dict of sections as a TOML table; keys must be strings.
fn toml_table(d: &Bound<'_, PyDict>, origin: &str, prefix: &str) -> PyResult<toml::Table> {
    let mut t = toml::Table::new();
    for (k, v) in d.iter() {
        let k: String = k.extract().map_err(|_| not_toml(origin, prefix, &k))?;
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        t.insert(k, toml_value(&v, origin, &key)?);
    }
    Ok(t)
}

/// The overrides of `overrides` (a dict of dotted keys) and `kwargs` (keys with
/// `__` between levels, as `TANDEM_` variables: `train__lr=0.01`), in that
/// order.
pub(crate) fn overrides(
    overrides: Option<&Bound<'_, PyDict>>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Vec<Override>> {
    let mut out = Vec::new();
    for (d, dunder) in [(overrides, false), (kwargs, true)] {
        let Some(d) = d else { continue };
        for (k, v) in d.iter() {
            let k: String = k
                .extract()
                .map_err(|_| not_toml(OVERRIDES_ORIGIN, "", &k))?;
            let key = if dunder { k.replace("__", ".") } else { k };
            let value = toml_value(&v, OVERRIDES_ORIGIN, &key)?;
            out.push(Override {
                origin: OVERRIDES_ORIGIN.into(),
                key,
                value: value.to_string(),
            });
        }
    }
    Ok(out)
}

/// The configuration from `config` (`None`, a dict, or a path) and `layers`.
pub(crate) fn train_config(
    config: Option<&Bound<'_, PyAny>>,
    layers: &[Override],
) -> PyResult<TrainConfig> {
    match config {
        None => TrainConfig::from_layers("", Path::new("built-in defaults"), layers).py_err(),
        Some(c) if c.is_none() => {
            TrainConfig::from_layers("", Path::new("built-in defaults"), layers).py_err()
        }
        Some(c) => {
            if let Ok(d) = c.cast::<PyDict>() {
                let text = toml::to_string(&toml_table(d, DICT_ORIGIN, "")?)
                    .map_err(|e| to_py(Error::invalid_argument("config", e.to_string())))?;
                return TrainConfig::from_layers(&text, Path::new(DICT_ORIGIN), layers).py_err();
            }
            let path: PathBuf = c.extract().map_err(|_| {
                to_py(Error::invalid_argument(
                    "config",
                    "expected None, a dict of sections or the path of a TOML file",
                ))
            })?;
            TrainConfig::load_layered(&path, layers).py_err()
        }
    }
}
