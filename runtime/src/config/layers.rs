//! The configuration's layers: a TOML file (or string), `TANDEM_` environment
//! variables and `--set key=value` arguments, applied in that order
//! ([`Override`], [`env_overrides`], [`TrainConfig::from_layers`]; the module doc
//! of `config` has the rules).

use std::path::Path;

use super::*;
use crate::error::{Error, Result};

/// One override of a configuration key: from a `TANDEM_` environment variable or a
/// `--set key=value` argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    /// Where it came from, as errors name it: the variable (`TANDEM_TRAIN__LR`) or
    /// `--set`.
    pub origin: String,
    /// The dotted key (`train.lr`).
    pub key: String,
    /// The value in TOML syntax (a bare word is taken as a string).
    pub value: String,
}

impl Override {
    /// Parses a `--set` argument `a.b.c=value`.
    pub fn from_set(assignment: &str) -> Result<Self> {
        let Some((key, raw)) = assignment.split_once('=') else {
            return Err(Error::invalid_argument(
                "--set",
                format!("`{assignment}`: expected key=value, e.g. train.epochs=5"),
            ));
        };
        let key = key.trim();
        if key.split('.').any(str::is_empty) {
            return Err(Error::invalid_argument(
                "--set",
                format!("`{key}` is not a dotted key"),
            ));
        }
        Ok(Self {
            origin: "--set".into(),
            key: key.into(),
            value: raw.trim().into(),
        })
    }

    /// The TOML value: parsed as TOML, or the raw text as a string.
    fn toml_value(&self) -> toml::Value {
        format!("v = {}", self.value)
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(self.value.clone()))
    }

    /// How errors name this override: the variable, or `--set key=value`.
    fn label(&self) -> String {
        if self.origin == "--set" {
            format!("--set {}={}", self.key, self.value)
        } else {
            self.origin.clone()
        }
    }
}

/// The prefix of configuration environment variables.
pub const ENV_PREFIX: &str = "TANDEM_";

/// The configuration overrides among `vars` (pass `std::env::vars_os()`), sorted by
/// variable name: every `TANDEM_<A>__<B>[__<C>...]=value` becomes the key `a.b[.c]`
/// (see the module doc). Variables with the prefix but no `__` are not
/// configuration and are skipped. Errors name the variable: a name or value that is
/// not UTF-8, an empty level (`TANDEM_TRAIN____LR`), or two variables that set the
/// same key (names differing only in case).
pub fn env_overrides<I, K, V>(vars: I) -> Result<Vec<Override>>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<std::ffi::OsString>,
    V: Into<std::ffi::OsString>,
{
    let mut out: Vec<Override> = Vec::new();
    for (name, value) in vars {
        let (name, value) = (name.into(), value.into());
        let Some(name) = name.to_str() else {
            if name.to_string_lossy().starts_with(ENV_PREFIX) {
                return Err(Error::invalid_argument(
                    name.to_string_lossy(),
                    "environment variable name is not UTF-8",
                ));
            }
            continue;
        };
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if !rest.contains("__") {
            continue;
        }
        let parts: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        if parts.iter().any(String::is_empty) {
            return Err(Error::invalid_argument(
                name,
                "expected TANDEM_<SECTION>__<KEY> with non-empty parts, e.g. TANDEM_TRAIN__BATCH_SIZE",
            ));
        }
        let Some(value) = value.to_str() else {
            return Err(Error::invalid_argument(name, "value is not UTF-8"));
        };
        out.push(Override {
            origin: name.into(),
            key: parts.join("."),
            value: value.trim().into(),
        });
    }
    out.sort_by(|a, b| a.origin.cmp(&b.origin));
    for (i, o) in out.iter().enumerate() {
        if let Some(first) = out[..i].iter().find(|p| p.key == o.key) {
            return Err(Error::invalid_argument(
                o.origin.clone(),
                format!("sets `{}`, which {} also sets", o.key, first.origin),
            ));
        }
    }
    Ok(out)
}

/// Applies one override to a TOML table; errors name the override.
fn apply_override(table: &mut toml::Table, o: &Override) -> Result<()> {
    let parts: Vec<&str> = o.key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(Error::invalid_argument(
            o.label(),
            format!("`{}` is not a dotted key", o.key),
        ));
    }
    let mut cur = table;
    for p in &parts[..parts.len() - 1] {
        let entry = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry.as_table_mut().ok_or_else(|| {
            Error::invalid_argument(o.label(), format!("key `{}`: `{p}` is not a table", o.key))
        })?;
    }
    cur.insert(parts[parts.len() - 1].to_string(), o.toml_value());
    Ok(())
}

impl TrainConfig {
    /// Parses a TOML string; `origin` names it in errors (a file path or "--set").
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self> {
        Self::from_layers(text, origin, &[])
    }

    /// Parses a TOML string and applies `key=value` overrides (dotted keys, values in
    /// TOML syntax; a bare word is taken as a string), then validates.
    pub fn from_toml_with_overrides(
        text: &str,
        origin: &Path,
        overrides: &[String],
    ) -> Result<Self> {
        let layers = overrides
            .iter()
            .map(|o| Override::from_set(o))
            .collect::<Result<Vec<_>>>()?;
        Self::from_layers(text, origin, &layers)
    }

    /// Parses a TOML string (`origin` names it in errors), applies `overrides` in
    /// order (environment first, then `--set`: see the module doc), folds the
    /// deprecated `train.threads` into `threads.compute`, and validates.
    pub fn from_layers(text: &str, origin: &Path, overrides: &[Override]) -> Result<Self> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| Error::format(origin, e.to_string()))?;
        Self::deserialize_table(&table).map_err(|e| Error::format(origin, e))?;
        // Which override last set each key, to name it in range errors.
        let mut set_by: Vec<(&str, String)> = Vec::new();
        for o in overrides {
            apply_override(&mut table, o)?;
            Self::deserialize_table(&table).map_err(|e| {
                Error::invalid_argument(o.label(), format!("key `{}`: {}", o.key, e.trim_end()))
            })?;
            set_by.retain(|(k, _)| *k != o.key);
            set_by.push((&o.key, o.label()));
        }
        let mut cfg = Self::deserialize_table(&table).map_err(|e| Error::format(origin, e))?;
        let named = |e: Error| match e {
            Error::InvalidArgument { name, reason } => {
                let reason = match set_by.iter().find(|(k, _)| *k == name) {
                    Some((_, label)) => format!("{reason} (set by {label})"),
                    None => reason,
                };
                Error::InvalidArgument { name, reason }
            }
            other => other,
        };
        cfg.fold_deprecated().map_err(named)?;
        cfg.validate().map_err(named)?;
        Ok(cfg)
    }

    fn deserialize_table(table: &toml::Table) -> std::result::Result<Self, String> {
        table
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| e.to_string())
    }

    /// Moves the deprecated `train.threads` into `threads.compute`.
    fn fold_deprecated(&mut self) -> Result<()> {
        if let Some(t) = self.train.threads {
            if self.threads.compute != 0 && self.threads.compute != t {
                return Err(range_err(
                    "train.threads",
                    &format!(
                        "the same value as threads.compute = {} (train.threads is its deprecated spelling)",
                        self.threads.compute
                    ),
                    t,
                ));
            }
            self.threads.compute = t;
            self.train.threads = None;
        }
        Ok(())
    }

    /// Reads a TOML file (see [`TrainConfig::from_toml_with_overrides`]).
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml_with_overrides(&text, path, overrides)
    }

    /// Reads a TOML file and applies `overrides` (see [`TrainConfig::from_layers`]).
    pub fn load_layered(path: &Path, overrides: &[Override]) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_layers(&text, path, overrides)
    }
}
