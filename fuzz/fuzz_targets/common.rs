//! Shared helper: the text parsers read files, so each input is written to a
//! per-process scratch file first.

use std::path::PathBuf;

pub fn scratch_file(name: &str, data: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir();
    let p = dir.join(format!("tandem-fuzz-{}-{name}", std::process::id()));
    std::fs::write(&p, data).expect("write scratch file");
    p
}
