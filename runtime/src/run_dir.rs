//! A run's output directory (`tandem train --out DIR`): the effective
//! configuration, per-epoch metrics and checkpoints side by side.
//!
//! ```text
//! DIR/config.toml      the effective configuration (file, TANDEM_ variables, --set)
//! DIR/metrics.jsonl    one JSON object per epoch (see `epoch_json`)
//! DIR/checkpoint.tck   the latest checkpoint (crate::checkpoint)
//! ```
//! Every file is replaced atomically, so a crash never leaves half a file:
//! `metrics.jsonl` is rewritten whole after each epoch (it is small).
//!
//! A directory that already holds an earlier run's metrics or checkpoint is
//! refused unless the run resumes: then the earlier metrics of the epochs before
//! the resumed one are kept and later ones dropped (they belonged to a run that went
//! past the checkpoint).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::atomic::write_file_atomically;
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::session::control::EpochStats;

/// File name of the effective configuration.
pub const CONFIG_FILE: &str = "config.toml";
/// File name of the per-epoch metrics.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// File name of the checkpoint.
pub const CHECKPOINT_FILE: &str = "checkpoint.tck";

/// The JSON line of an epoch (no newline). Non-finite numbers become `null`.
pub fn epoch_json(s: &EpochStats) -> String {
    serde_json::to_string(s)
        .unwrap_or_else(|e| format!("{{\"epoch\":{},\"error\":\"{e}\"}}", s.epoch))
}

/// An open run directory (see the module doc).
#[derive(Debug)]
pub struct RunDir {
    dir: PathBuf,
    lines: Vec<String>,
}

impl RunDir {
    /// Creates `dir` (and its parents) if needed and writes `config.toml`.
    /// `resume_epoch` is the epoch a resumed run continues from (`None` for a new
    /// run, which refuses a directory holding an earlier run's outputs).
    pub fn create(dir: &Path, cfg: &TrainConfig, resume_epoch: Option<usize>) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let metrics = dir.join(METRICS_FILE);
        let mut lines = Vec::new();
        match resume_epoch {
            None => {
                for name in [METRICS_FILE, CHECKPOINT_FILE] {
                    let p = dir.join(name);
                    if p.exists() {
                        return Err(Error::invalid_argument(
                            "--out",
                            format!(
                                "{} holds an earlier run ({name}): choose another directory, remove it, or pass --resume",
                                dir.display()
                            ),
                        ));
                    }
                }
            }
            Some(epoch) if metrics.exists() => {
                let text = std::fs::read_to_string(&metrics).map_err(|e| Error::io(&metrics, e))?;
                for (i, line) in text.lines().enumerate() {
                    if line.trim().is_empty() {
                        continue;
                    }
                    let bad = |what: String| Error::parse(&metrics, i as u64 + 1, what);
                    let v: serde_json::Value =
                        serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
                    let e = v.get("epoch").and_then(serde_json::Value::as_u64);
                    let e =
                        e.ok_or_else(
                            || bad("expected an object with an integer \"epoch\"".into()),
                        )?;
                    if e < epoch as u64 {
                        lines.push(line.to_string());
                    }
                }
            }
            Some(_) => {}
        }
        let config = dir.join(CONFIG_FILE);
        let text = cfg.to_toml();
        write_file_atomically(&config, |w| {
            w.write_all(text.as_bytes())
                .map_err(|e| Error::io(&config, e))
        })?;
        let run = Self {
            dir: dir.to_path_buf(),
            lines,
        };
        run.write_metrics()?;
        Ok(run)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Where the checkpoint goes.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.dir.join(CHECKPOINT_FILE)
    }

    /// Appends an epoch to `metrics.jsonl` (rewriting it atomically).
    pub fn record(&mut self, stats: &EpochStats) -> Result<()> {
        self.lines.push(epoch_json(stats));
        self.write_metrics()
    }

    fn write_metrics(&self) -> Result<()> {
        let path = self.dir.join(METRICS_FILE);
        write_file_atomically(&path, |w| {
            for l in &self.lines {
                writeln!(w, "{l}").map_err(|e| Error::io(&path, e))?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(epoch: usize) -> EpochStats {
        EpochStats {
            epoch,
            loss: 1.0 / (epoch + 1) as f64,
            train_acc: 0.5,
            val_acc: (epoch % 2 == 1).then_some(0.75),
            test_acc: None,
            val_metrics: Vec::new(),
            test_metrics: Vec::new(),
            train_secs: 0.25,
            eval_secs: 0.0,
            batches: 4,
            steps: 4 * (epoch as u64 + 1),
            orchestration: None,
            calibrating: false,
            auto_choice: None,
            skipped_batches: 0,
        }
    }

    fn records(dir: &Path) -> Vec<EpochStats> {
        std::fs::read_to_string(dir.join(METRICS_FILE))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn writes_config_and_one_line_per_epoch_and_resumes() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("a/run");
        let cfg = TrainConfig::default();
        let mut run = RunDir::create(&out, &cfg, None).unwrap();
        for e in 0..3 {
            run.record(&stats(e)).unwrap();
        }
        let text = std::fs::read_to_string(out.join(CONFIG_FILE)).unwrap();
        assert_eq!(TrainConfig::from_toml(&text, Path::new("c")).unwrap(), cfg);
        let r = records(&out);
        assert_eq!(r.len(), 3);
        assert_eq!(r[1], stats(1));
        assert_eq!(r[0].val_acc, None);
        // Only our three files, no temporaries.
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 2);

        // A new run may not mix with the earlier one.
        let e = RunDir::create(&out, &cfg, None).unwrap_err().to_string();
        assert!(e.contains("earlier run") && e.contains("--resume"), "{e}");

        // Resuming at epoch 1 keeps epoch 0 and drops the rest.
        let mut run = RunDir::create(&out, &cfg, Some(1)).unwrap();
        assert_eq!(records(&out).len(), 1);
        run.record(&stats(1)).unwrap();
        assert_eq!(
            records(&out).iter().map(|r| r.epoch).collect::<Vec<_>>(),
            vec![0, 1]
        );

        // A damaged metrics file is an error naming the file and line.
        std::fs::write(out.join(METRICS_FILE), "{\"epoch\":0}\n[1]\n").unwrap();
        let e = RunDir::create(&out, &cfg, Some(1)).unwrap_err().to_string();
        assert!(e.contains("metrics.jsonl:2"), "{e}");
    }

    #[test]
    fn non_finite_numbers_become_null() {
        let mut s = stats(0);
        s.loss = f64::NAN;
        let line = epoch_json(&s);
        assert!(line.contains("\"loss\":null"), "{line}");
    }
}
