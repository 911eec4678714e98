//! The configuration's layers: a TOML file (or string), `TANDEM_` environment
//! variables and `--set key=value` arguments, applied in that order
//! ([`Override`], [`env_overrides`], [`TrainConfig::from_layers`]; the module doc
//! of `config` has the rules).

use std::path::Path;

use super::*;
use crate::error::{ConfigProblem, Error, Result};

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
    /// deprecated `train.threads` into `threads.compute`, and validates. Errors
    /// are [`Error::Config`] whose `origin` is the file, or the override that
    /// set the key.
    pub fn from_layers(text: &str, origin: &Path, overrides: &[Override]) -> Result<Self> {
        Self::from_layers_in(text, origin, None, overrides)
    }

    /// [`TrainConfig::from_layers`], with `file_dir` the folder of the file
    /// `text` came from: a relative `data.path` the text sets is taken from
    /// there (as Cargo takes a manifest's paths from its folder); one an
    /// override sets, from the current directory. Either is made absolute, so
    /// the effective configuration (printed, saved with a run) names the same
    /// file from anywhere. Without `file_dir` the text's path is kept as given.
    fn from_layers_in(
        text: &str,
        origin: &Path,
        file_dir: Option<&Path>,
        overrides: &[Override],
    ) -> Result<Self> {
        let file = origin.display().to_string();
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| syntax_error(&file, text, &e))?;
        Self::deserialize_table(&table).map_err(|e| e.with_origin(&file))?;
        // Which override last set each key, to name it in range errors.
        let mut set_by: Vec<(&str, String)> = Vec::new();
        for o in overrides {
            apply_override(&mut table, o)?;
            Self::deserialize_table(&table).map_err(|e| e.with_origin(&o.label()))?;
            set_by.retain(|(k, _)| *k != o.key);
            set_by.push((&o.key, o.label()));
        }
        let mut cfg = Self::deserialize_table(&table).map_err(|e| e.with_origin(&file))?;
        let named = |e: Error| match e {
            Error::Config {
                origin,
                key,
                problem,
            } if origin.is_empty() => {
                let origin = match set_by.iter().find(|(k, _)| *k == key) {
                    Some((_, label)) => label.clone(),
                    None => file.clone(),
                };
                Error::Config {
                    origin,
                    key,
                    problem,
                }
            }
            other => other,
        };
        cfg.fold_deprecated().map_err(named)?;
        cfg.validate().map_err(named)?;
        let path_set_by = set_by
            .iter()
            .rev()
            .find(|(k, _)| matches!(*k, "data" | "data.path"))
            .map(|(_, label)| label.clone());
        if let Some(p) = &cfg.data.path {
            let (base, origin) = match path_set_by {
                Some(label) => (Some(Path::new("")), label),
                None => (file_dir, file),
            };
            if let Some(base) = base.filter(|_| p.is_relative()) {
                cfg.data.path =
                    Some(std::path::absolute(base.join(p)).unwrap_or_else(|_| p.clone()));
            }
            cfg.data.path_origin = Some(origin);
        }
        Ok(cfg)
    }

    /// The configuration in `table`, or an [`Error::Config`] (no origin yet)
    /// naming the dotted key that failed.
    fn deserialize_table(table: &toml::Table) -> std::result::Result<Self, NoOrigin> {
        serde_path_to_error::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
            let path = e.path().to_string();
            NoOrigin(Box::new(schema_error(table, &path, e.inner().message())))
        })
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

    /// Reads a TOML file (see [`TrainConfig::from_toml_with_overrides`]); a
    /// relative `data.path` in it is taken from the file's folder (see
    /// [`TrainConfig::load_layered`]).
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let layers = overrides
            .iter()
            .map(|o| Override::from_set(o))
            .collect::<Result<Vec<_>>>()?;
        Self::load_layered(path, &layers)
    }

    /// Reads a TOML file and applies `overrides` (see [`TrainConfig::from_layers`]).
    /// A relative `data.path` in the file is taken from the file's folder, one
    /// from an override from the current directory; the configuration holds it
    /// made absolute, and [`DataConfig::path_origin`] says which layer set it.
    pub fn load_layered(path: &Path, overrides: &[Override]) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let dir = path.parent().unwrap_or(Path::new(""));
        Self::from_layers_in(&text, path, Some(dir), overrides)
    }
}

/// A configuration error whose origin is still to be named (boxed: a `Result`'s
/// error stays small).
struct NoOrigin(Box<Error>);

impl NoOrigin {
    /// The error, with `origin` (a file, or the override that failed).
    fn with_origin(self, origin: &str) -> Error {
        match *self.0 {
            Error::Config { key, problem, .. } => Error::Config {
                origin: origin.to_string(),
                key,
                problem,
            },
            other => other,
        }
    }
}

/// An [`Error::Config`] from serde's message `msg` at the dotted `path` of
/// `table` (`.` for the top level): an unknown key, or a value of the wrong type.
fn schema_error(table: &toml::Table, path: &str, msg: &str) -> Error {
    let path = path.trim_start_matches('.');
    let join = |parent: &str, child: &str| {
        if parent.is_empty() {
            child.to_string()
        } else if parent == child || parent.ends_with(&format!(".{child}")) {
            parent.to_string()
        } else {
            format!("{parent}.{child}")
        }
    };
    // serde's messages: "unknown field `x`, expected ...", "invalid type: X,
    // expected Y", "invalid value: X, expected Y", "unknown variant `x`, expected Y".
    let (key, problem) = if let Some(rest) = msg.strip_prefix("unknown field `") {
        let (name, hint) = rest.split_once('`').unwrap_or((rest, ""));
        let expected = hint.trim_start_matches(',').trim();
        (
            join(path, name),
            ConfigProblem::UnknownKey {
                expected: expected.to_string(),
            },
        )
    } else {
        let split = ["invalid type: ", "invalid value: ", "unknown variant "]
            .iter()
            .find_map(|p| msg.strip_prefix(p))
            .and_then(|rest| rest.split_once(", expected "));
        let (found, expected) = match split {
            Some((found, expected)) => (found.to_string(), expected.to_string()),
            // A custom message of the schema says "expected ..." itself; the
            // problem's display adds the word.
            None => (
                value_at(table, path),
                msg.strip_prefix("expected ").unwrap_or(msg).to_string(),
            ),
        };
        (
            path.to_string(),
            ConfigProblem::BadValue { expected, found },
        )
    };
    Error::Config {
        origin: String::new(),
        key,
        problem,
    }
}

/// The TOML text of the value at the dotted `path` of `table` (empty if none).
fn value_at(table: &toml::Table, path: &str) -> String {
    let mut parts = path.split('.');
    let Some(first) = parts.next() else {
        return String::new();
    };
    let mut cur = table.get(first);
    for p in parts {
        cur = cur.and_then(|v| v.get(p));
    }
    cur.map(|v| v.to_string()).unwrap_or_default()
}

/// An [`Error::Config`] for TOML that does not parse: line and column of the
/// parser's span in `text`.
fn syntax_error(origin: &str, text: &str, e: &toml::de::Error) -> Error {
    let at = e.span().map_or(0, |s| s.start.min(text.len()));
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Error::Config {
        origin: origin.to_string(),
        key: String::new(),
        problem: ConfigProblem::Syntax {
            line,
            column,
            what: e.message().trim().to_string(),
        },
    }
}
