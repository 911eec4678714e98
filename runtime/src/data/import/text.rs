//! The byte-level line reader the text importers (edge lists, METIS, split files)
//! share: lines into one reused buffer, blank-separated tokens, decimal ids.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Reads a text file line by line into one reused buffer.
pub(super) struct Lines {
    path: PathBuf,
    reader: BufReader<File>,
    buf: Vec<u8>,
    line_no: u64,
    /// Bytes consumed so far (newlines included).
    bytes: u64,
}

impl Lines {
    /// Opens `path`; refuses gzip-compressed files with a hint.
    pub(super) fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let head = reader.fill_buf().map_err(|e| Error::io(path, e))?;
        if head.starts_with(&[0x1f, 0x8b]) {
            return Err(Error::format(
                path,
                "the file is gzip-compressed; decompress it first (`gunzip -k FILE`)",
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            buf: Vec::with_capacity(256),
            line_no: 0,
            bytes: 0,
        })
    }

    /// The next line without its `\n`, with its 1-based number; `None` at the end
    /// of the file.
    pub(super) fn next_line(&mut self) -> Result<Option<(u64, &[u8])>> {
        self.buf.clear();
        let got = self
            .reader
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| Error::io(&self.path, e))?;
        if got == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        self.bytes += got as u64;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        }
        Ok(Some((self.line_no, &self.buf)))
    }

    /// The line last returned by [`Lines::next_line`], with its number.
    pub(super) fn current(&self) -> (u64, &[u8]) {
        (self.line_no, &self.buf)
    }

    /// Bytes of the file consumed so far.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// 1-based number of the line last returned (0 before the first).
    pub(super) fn line_no(&self) -> u64 {
        self.line_no
    }
}

/// True for the bytes that separate tokens (space, tab, `\r`, vertical tab, form feed).
#[inline]
fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | 0x0b | 0x0c)
}

/// The first non-blank byte of `line`, if any.
pub(super) fn first_non_blank(line: &[u8]) -> Option<u8> {
    line.iter().copied().find(|&b| !is_blank(b))
}

/// Splits a line into blank-separated tokens.
pub(super) struct Tokens<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> Tokens<'a> {
    pub(super) fn new(s: &'a [u8]) -> Self {
        Self { s, pos: 0 }
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let s = self.s;
        let mut i = self.pos;
        while i < s.len() && is_blank(s[i]) {
            i += 1;
        }
        if i == s.len() {
            self.pos = i;
            return None;
        }
        let start = i;
        while i < s.len() && !is_blank(s[i]) {
            i += 1;
        }
        self.pos = i;
        Some(&s[start..i])
    }
}

/// Parses a non-negative decimal integer; `None` for anything else or overflow.
#[inline]
pub(super) fn parse_u64(tok: &[u8]) -> Option<u64> {
    if tok.is_empty() || tok.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in tok {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(d as u64)?;
    }
    Some(v)
}

/// A token for an error message: lossy UTF-8, cut at 40 characters.
pub(super) fn show(tok: &[u8]) -> String {
    let s = String::from_utf8_lossy(tok);
    if s.chars().count() > 40 {
        format!("{}...", s.chars().take(40).collect::<String>())
    } else {
        s.into_owned()
    }
}

/// Parses `tok` as an id or reports it as `what` on line `line_no`.
#[inline]
pub(super) fn id_token(path: &Path, line_no: u64, tok: &[u8], what: &str) -> Result<u64> {
    parse_u64(tok).ok_or_else(|| {
        Error::parse(
            path,
            line_no,
            format!(
                "{what} vertex id `{}` is not a non-negative integer (or exceeds 2^64 - 1)",
                show(tok)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_numbers() {
        let t: Vec<&[u8]> = Tokens::new(b"  a\tbb \r").collect();
        assert_eq!(t, vec![&b"a"[..], &b"bb"[..]]);
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"+1"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(first_non_blank(b" \t% x"), Some(b'%'));
    }
}
