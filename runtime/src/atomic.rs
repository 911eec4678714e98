//! Atomic file and directory output: write under a temporary name in the target's
//! directory, flush and sync, then rename over the target. A failure or panic
//! part-way leaves the target untouched and removes the temporary.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary path beside `target`, unique within this process.
fn temp_path_for(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = format!(".{name}.tmp-{}-{n}", std::process::id());
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.join(tmp),
        _ => PathBuf::from(tmp),
    }
}

/// Removes the temporary on drop unless disarmed.
struct TempGuard {
    path: PathBuf,
    is_dir: bool,
    armed: bool,
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = if self.is_dir {
                fs::remove_dir_all(&self.path)
            } else {
                fs::remove_file(&self.path)
            };
        }
    }
}

/// Writes `path` atomically: `write` fills a buffered writer on a temporary file,
/// which is synced and renamed over `path` only if `write` succeeds.
pub fn write_file_atomically<F>(path: &Path, write: F) -> Result<()>
where
    F: FnOnce(&mut BufWriter<File>) -> Result<()>,
{
    let tmp = temp_path_for(path);
    let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut guard = TempGuard {
        path: tmp.clone(),
        is_dir: false,
        armed: true,
    };
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write(&mut w)?;
    w.flush().map_err(|e| Error::io(&tmp, e))?;
    let file = w
        .into_inner()
        .map_err(|e| Error::io(&tmp, e.into_error()))?;
    file.sync_all().map_err(|e| Error::io(&tmp, e))?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    guard.armed = false;
    Ok(())
}

/// Creates directory `dir` atomically: `fill` writes files into a temporary
/// directory, which then replaces `dir` (an existing `dir` is removed only after the
/// new one is complete).
pub fn write_dir_atomically<F>(dir: &Path, fill: F) -> Result<()>
where
    F: FnOnce(&Path) -> Result<()>,
{
    let tmp = temp_path_for(dir);
    fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut guard = TempGuard {
        path: tmp.clone(),
        is_dir: true,
        armed: true,
    };
    fill(&tmp)?;
    if dir.exists() {
        let old = temp_path_for(dir);
        fs::rename(dir, &old).map_err(|e| Error::io(dir, e))?;
        if let Err(e) = fs::rename(&tmp, dir) {
            let _ = fs::rename(&old, dir);
            return Err(Error::io(dir, e));
        }
        let _ = fs::remove_dir_all(&old);
    } else {
        fs::rename(&tmp, dir).map_err(|e| Error::io(dir, e))?;
    }
    guard.armed = false;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_write_leaves_nothing_behind() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("x.bin");
        let r = write_file_atomically(&target, |w| {
            w.write_all(b"partial").unwrap();
            Err(Error::invalid_argument("test", "injected failure"))
        });
        assert!(r.is_err());
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
    }

    #[test]
    fn successful_write_replaces_target() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("x.bin");
        fs::write(&target, b"old").unwrap();
        write_file_atomically(&target, |w| {
            w.write_all(b"new").map_err(|e| Error::io(&target, e))
        })
        .unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn dir_replaced_only_when_complete() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("out");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), b"1").unwrap();
        let r = write_dir_atomically(&target, |tmp| {
            fs::write(tmp.join("a"), b"x").unwrap();
            Err(Error::invalid_argument("test", "injected"))
        });
        assert!(r.is_err());
        assert!(target.join("keep").exists());
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
        write_dir_atomically(&target, |tmp| {
            fs::write(tmp.join("a"), b"x").map_err(|e| Error::io(tmp, e))
        })
        .unwrap();
        assert!(target.join("a").exists() && !target.join("keep").exists());
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
