//! NumPy `.npy` files: the subset Tandem exchanges with Python tools.
//!
//! Hand-written rather than `npyz`/`ndarray-npy`: it streams arbitrarily large
//! files in chunks with errors naming the file, the element and (for features)
//! the row and column, refuses every variant it does not support, and is fuzzed.
//!
//! Format (<https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html>):
//!
//! 1. magic `\x93NUMPY`, then a major and a minor version byte (1.0, 2.0 or 3.0);
//! 2. the header length: `u16` little-endian for 1.0, `u32` for 2.0 and 3.0;
//! 3. the header, a Python dict literal such as
//!    `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }`, padded with
//!    spaces and a final `\n` so the data starts on a 64-byte boundary;
//! 4. the data, `prod(shape)` elements in C (row-major) order.
//!
//! Supported: little-endian data only (`<`, or `|` for one-byte types), C order only,
//! plain dtypes (`|b1`, `|i1 <i2 <i4 <i8`, `|u1 <u2 <u4 <u8`, `<f4 <f8`). Structured
//! dtypes, big-endian data and Fortran order are refused with an error that says
//! how to convert the array in NumPy. The data must fill the rest of the file
//! exactly: missing bytes ("truncated") and trailing bytes are both errors.
//!
//! Readers convert to what a [`Dataset`](crate::data::dataset::Dataset) holds: `f32`
//! features ([`read_f32_matrix`], `<f8` is narrowed), `u32` labels
//! ([`read_labels`], any integer type, values checked), `0/1` masks
//! ([`read_mask`], bool or integer), and non-negative integer matrices
//! ([`read_index_matrix`], for `edge_index`). Every error names the file and what
//! was expected against what was found; malformed input never panics.
//!
//! Writers ([`write_f32_matrix`], [`write_i64`], [`write_bool`]) produce version 1.0
//! files that `numpy.load` reads, each written atomically.
//!
//! ```
//! use runtime::data::npy::{read_f32_matrix, write_f32_matrix};
//!
//! # fn main() -> runtime::Result<()> {
//! let path = std::env::temp_dir().join(format!("tandem-doc-{}.npy", std::process::id()));
//! write_f32_matrix(&path, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2)?; // numpy: np.load(path)
//! let m = read_f32_matrix(&path)?;
//! assert_eq!((m.num_rows(), m.dim()), (3, 2));
//! assert_eq!(m.row(2), &[5.0, 6.0]);
//! // A non-finite feature is refused, naming the file, the row and the column.
//! write_f32_matrix(&path, &[1.0, f32::NAN], 1, 2)?;
//! assert!(read_f32_matrix(&path).unwrap_err().to_string().contains("row 0, column 1"));
//! std::fs::remove_file(&path).ok();
//! # Ok(())
//! # }
//! ```

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use cpu_ops::FeatureMatrix;

use crate::atomic::write_file_atomically;
use crate::error::{Error, Result};

/// The six magic bytes every `.npy` file starts with.
pub const NPY_MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Largest header accepted when reading (numpy itself refuses more than 10,000 bytes
/// by default; this leaves room while keeping a corrupt length from allocating).
const MAX_HEADER_LEN: usize = 1 << 20;
/// Bytes converted per read when streaming the data section.
const CHUNK_BYTES: usize = 1 << 20;
/// Data alignment numpy uses when writing.
const ALIGN: usize = 64;

/// An element type of a `.npy` array, as far as Tandem supports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// `|b1`: one byte, 0 or 1.
    Bool,
    /// `|i1`.
    I8,
    /// `<i2`.
    I16,
    /// `<i4`.
    I32,
    /// `<i8`.
    I64,
    /// `|u1`.
    U8,
    /// `<u2`.
    U16,
    /// `<u4`.
    U32,
    /// `<u8`.
    U64,
    /// `<f4`.
    F32,
    /// `<f8`.
    F64,
}

impl Dtype {
    /// The `descr` string numpy writes for this type.
    pub fn descr(self) -> &'static str {
        match self {
            Self::Bool => "|b1",
            Self::I8 => "|i1",
            Self::I16 => "<i2",
            Self::I32 => "<i4",
            Self::I64 => "<i8",
            Self::U8 => "|u1",
            Self::U16 => "<u2",
            Self::U32 => "<u4",
            Self::U64 => "<u8",
            Self::F32 => "<f4",
            Self::F64 => "<f8",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::Bool | Self::I8 | Self::U8 => 1,
            Self::I16 | Self::U16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// True for the signed and unsigned integer types (not bool).
    pub fn is_integer(self) -> bool {
        !matches!(self, Self::Bool | Self::F32 | Self::F64)
    }

    /// Parses a `descr` string. `Err` carries the reason in words.
    fn parse(descr: &str) -> std::result::Result<Self, String> {
        let b = descr.as_bytes();
        if b.len() < 2 {
            return Err(format!("unsupported dtype '{descr}'"));
        }
        let (order, code) = (b[0], &b[1..]);
        let dtype = match code {
            b"b1" => Self::Bool,
            b"i1" => Self::I8,
            b"i2" => Self::I16,
            b"i4" => Self::I32,
            b"i8" => Self::I64,
            b"u1" => Self::U8,
            b"u2" => Self::U16,
            b"u4" => Self::U32,
            b"u8" => Self::U64,
            b"f4" => Self::F32,
            b"f8" => Self::F64,
            _ => {
                return Err(format!(
                    "unsupported dtype '{descr}' (supported: |b1, |i1, <i2, <i4, <i8, \
                     |u1, <u2, <u4, <u8, <f4, <f8)"
                ))
            }
        };
        match order {
            b'<' | b'|' => Ok(dtype),
            // Byte order does not matter for one-byte types.
            b'>' | b'=' if dtype.size() == 1 => Ok(dtype),
            b'>' => Err(format!(
                "big-endian dtype '{descr}' is not supported; convert with \
                 `a.astype(a.dtype.newbyteorder('<'))`"
            )),
            _ => Err(format!(
                "dtype '{descr}' has no explicit little-endian byte order ('<')"
            )),
        }
    }
}

/// The parsed header of a `.npy` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// Format version `(major, minor)`.
    pub version: (u8, u8),
    /// Element type.
    pub dtype: Dtype,
    /// True for Fortran (column-major) order, which the readers refuse.
    pub fortran_order: bool,
    /// Array shape; empty for a 0-d array.
    pub shape: Vec<usize>,
    /// Byte offset of the data in the file.
    pub data_offset: usize,
}

impl NpyHeader {
    /// Number of elements (`prod(shape)`), or `None` on overflow.
    pub fn num_elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
    }
}

/// Formats a shape the way Python prints a tuple: `(3,)`, `(3, 2)`, `()`.
fn shape_str(shape: &[usize]) -> String {
    match shape {
        [] => "()".into(),
        [a] => format!("({a},)"),
        _ => {
            let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            format!("({})", parts.join(", "))
        }
    }
}

/// An open `.npy` file positioned at the start of its data.
struct NpyReader<'a> {
    path: &'a Path,
    file: File,
    header: NpyHeader,
    count: usize,
}

impl<'a> NpyReader<'a> {
    /// Opens `path`, parses and checks the header, and checks that the data section
    /// has exactly the size the header implies.
    fn open(path: &'a Path) -> Result<Self> {
        let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let header = read_header_from(path, &mut file, file_len)?;
        if header.fortran_order {
            return Err(Error::format(
                path,
                format!(
                    "array of shape {} is in Fortran (column-major) order; only C order is \
                     supported: save `np.ascontiguousarray(a)` instead",
                    shape_str(&header.shape)
                ),
            ));
        }
        let count = header.num_elements().ok_or_else(|| {
            Error::format(
                path,
                format!(
                    "shape {} overflows the element count",
                    shape_str(&header.shape)
                ),
            )
        })?;
        let need = (count as u128) * header.dtype.size() as u128;
        let have = file_len as u128 - header.data_offset as u128;
        if have < need {
            return Err(Error::format(
                path,
                format!(
                    "truncated data: shape {} of {} needs {need} bytes after the \
                     {}-byte header, found {have}",
                    shape_str(&header.shape),
                    header.dtype.descr(),
                    header.data_offset
                ),
            ));
        }
        if have > need {
            return Err(Error::format(
                path,
                format!(
                    "{} unexpected bytes after the data: shape {} of {} needs {need} bytes \
                     after the {}-byte header, found {have}",
                    have - need,
                    shape_str(&header.shape),
                    header.dtype.descr(),
                    header.data_offset
                ),
            ));
        }
        Ok(Self {
            path,
            file,
            header,
            count,
        })
    }

    /// Errors unless the shape has `rank` dimensions; `what` describes the expected
    /// shape, e.g. `"(n, d)"`.
    fn expect_rank(&self, rank: usize, what: &str) -> Result<()> {
        let shape = &self.header.shape;
        if shape.len() != rank {
            let hint = if rank == 1 && shape.len() == 2 && shape[1] == 1 {
                " (save `a.reshape(-1)` instead)"
            } else {
                ""
            };
            return Err(Error::format(
                self.path,
                format!(
                    "expected a {rank}-D array of shape {what}, found shape {}{hint}",
                    shape_str(shape)
                ),
            ));
        }
        Ok(())
    }

    fn wrong_dtype(&self, expected: &str) -> Error {
        Error::format(
            self.path,
            format!(
                "expected dtype {expected}, found {}",
                self.header.dtype.descr()
            ),
        )
    }

    /// Streams the data: calls `f(index, element_bytes)` for every element in order.
    fn for_each(&mut self, mut f: impl FnMut(usize, &[u8]) -> Result<()>) -> Result<()> {
        let size = self.header.dtype.size();
        let per_chunk = (CHUNK_BYTES / size).max(1);
        let mut buf = vec![0u8; per_chunk.min(self.count) * size];
        let mut done = 0;
        while done < self.count {
            let k = per_chunk.min(self.count - done);
            let bytes = &mut buf[..k * size];
            self.file.read_exact(bytes).map_err(|e| {
                Error::io(self.path, e) // the size was checked; this is a real I/O error
            })?;
            for (i, el) in bytes.chunks_exact(size).enumerate() {
                f(done + i, el)?;
            }
            done += k;
        }
        Ok(())
    }

    /// Reads every element as an integer (`i128` holds all supported integer types).
    /// Errors unless the dtype is an integer type (or bool when `allow_bool`).
    fn for_each_int(
        &mut self,
        allow_bool: bool,
        expected: &str,
        mut f: impl FnMut(usize, i128) -> Result<()>,
    ) -> Result<()> {
        let dtype = self.header.dtype;
        if !(dtype.is_integer() || allow_bool && dtype == Dtype::Bool) {
            return Err(self.wrong_dtype(expected));
        }
        self.for_each(|i, b| f(i, int_value(dtype, b)))
    }
}

/// Decodes one little-endian integer (or bool) element.
fn int_value(dtype: Dtype, b: &[u8]) -> i128 {
    let a2 = |b: &[u8]| [b[0], b[1]];
    let a4 = |b: &[u8]| [b[0], b[1], b[2], b[3]];
    let a8 = |b: &[u8]| [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
    match dtype {
        Dtype::Bool | Dtype::U8 => b[0] as i128,
        Dtype::I8 => b[0] as i8 as i128,
        Dtype::I16 => i16::from_le_bytes(a2(b)) as i128,
        Dtype::U16 => u16::from_le_bytes(a2(b)) as i128,
        Dtype::I32 => i32::from_le_bytes(a4(b)) as i128,
        Dtype::U32 => u32::from_le_bytes(a4(b)) as i128,
        Dtype::I64 => i64::from_le_bytes(a8(b)) as i128,
        Dtype::U64 => u64::from_le_bytes(a8(b)) as i128,
        // Callers only pass integer dtypes.
        Dtype::F32 | Dtype::F64 => 0,
    }
}

/// Reads and checks the header of the `.npy` file at `path`.
pub fn read_header(path: &Path) -> Result<NpyHeader> {
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    read_header_from(path, &mut file, file_len)
}

fn read_header_from(path: &Path, file: &mut File, file_len: u64) -> Result<NpyHeader> {
    let truncated = |need: u64| {
        Error::format(
            path,
            format!("truncated header: needs at least {need} bytes, the file has {file_len}"),
        )
    };
    if file_len < 10 {
        let mut start = vec![0u8; file_len as usize];
        file.read_exact(&mut start)
            .map_err(|e| Error::io(path, e))?;
        if !NPY_MAGIC.starts_with(&start[..start.len().min(6)]) {
            return Err(bad_magic(path, &start));
        }
        return Err(truncated(10));
    }
    let mut pre = [0u8; 12];
    file.read_exact(&mut pre[..10])
        .map_err(|e| Error::io(path, e))?;
    if &pre[..6] != NPY_MAGIC {
        return Err(bad_magic(path, &pre[..10]));
    }
    let version = (pre[6], pre[7]);
    let (header_len, prefix) = match version {
        (1, 0) => (u16::from_le_bytes([pre[8], pre[9]]) as usize, 10usize),
        (2, 0) | (3, 0) => {
            if file_len < 12 {
                return Err(truncated(12));
            }
            file.read_exact(&mut pre[10..12])
                .map_err(|e| Error::io(path, e))?;
            let len = u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]]);
            (len as usize, 12)
        }
        (a, b) => {
            return Err(Error::format(
                path,
                format!("unsupported .npy format version {a}.{b} (expected 1.0, 2.0 or 3.0)"),
            ))
        }
    };
    let data_offset = prefix + header_len;
    if data_offset as u64 > file_len {
        return Err(truncated(data_offset as u64));
    }
    if header_len > MAX_HEADER_LEN {
        return Err(Error::format(
            path,
            format!("header length {header_len} is larger than the {MAX_HEADER_LEN} accepted"),
        ));
    }
    let mut text = vec![0u8; header_len];
    file.read_exact(&mut text).map_err(|e| Error::io(path, e))?;
    let (descr, fortran_order, shape) = parse_header_dict(&text)
        .map_err(|what| Error::format(path, format!("bad header dict: {what}")))?;
    let dtype = Dtype::parse(&descr).map_err(|what| Error::format(path, what))?;
    Ok(NpyHeader {
        version,
        dtype,
        fortran_order,
        shape,
        data_offset,
    })
}

fn bad_magic(path: &Path, found: &[u8]) -> Error {
    let shown: String = found
        .iter()
        .take(6)
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    let hint = if found.starts_with(&[0x1f, 0x8b]) {
        " (the file looks gzip-compressed: gunzip it first)"
    } else if found.starts_with(b"PK") {
        " (the file looks like a zip archive, e.g. an .npz: extract the arrays first)"
    } else {
        ""
    };
    Error::format(
        path,
        format!("bad magic: expected \\x93NUMPY, found '{shown}'{hint}; not a .npy file"),
    )
}

/// A literal value of the header dict.
#[derive(Debug)]
enum Value {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
    Other,
}

/// A tiny parser for the Python dict literal of a `.npy` header.
struct DictParser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl DictParser<'_> {
    fn skip_ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        match self.peek() {
            Some(x) if x == c => {
                self.pos += 1;
                Ok(())
            }
            Some(x) => Err(format!(
                "expected '{}' at byte {}, found '{}'",
                c as char,
                self.pos,
                x.escape_ascii()
            )),
            None => Err(format!(
                "expected '{}', found the end of the header",
                c as char
            )),
        }
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        let q = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(format!("expected a quoted string at byte {}", self.pos)),
        };
        self.pos += 1;
        let start = self.pos;
        while self.pos < self.s.len() && self.s[self.pos] != q {
            if self.s[self.pos] == b'\\' {
                return Err("escapes in header strings are not supported".into());
            }
            self.pos += 1;
        }
        if self.pos >= self.s.len() {
            return Err("unterminated string".into());
        }
        let out = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
        self.pos += 1;
        Ok(out)
    }

    fn tuple(&mut self) -> std::result::Result<Vec<usize>, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            match self.peek() {
                Some(b')') => {
                    self.pos += 1;
                    // `(3)` is an int, not a tuple; numpy never writes it.
                    return Ok(dims);
                }
                Some(c) if c.is_ascii_digit() => {
                    let start = self.pos;
                    let mut v: usize = 0;
                    while let Some(&d) = self.s.get(self.pos).filter(|d| d.is_ascii_digit()) {
                        v = v
                            .checked_mul(10)
                            .and_then(|v| v.checked_add((d - b'0') as usize))
                            .ok_or_else(|| format!("shape dimension at byte {start} overflows"))?;
                        self.pos += 1;
                    }
                    // Python 2 long suffix.
                    if matches!(self.s.get(self.pos), Some(b'L' | b'l')) {
                        self.pos += 1;
                    }
                    dims.push(v);
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(b')') => {}
                        _ => {
                            return Err(format!(
                                "expected ',' or ')' in shape at byte {}",
                                self.pos
                            ))
                        }
                    }
                }
                Some(c) => {
                    return Err(format!(
                        "expected a non-negative integer in shape at byte {}, found '{}'",
                        self.pos,
                        c.escape_ascii()
                    ))
                }
                None => return Err("unterminated shape tuple".into()),
            }
        }
    }

    fn value(&mut self) -> std::result::Result<Value, String> {
        match self.peek() {
            Some(b'\'' | b'"') => Ok(Value::Str(self.string()?)),
            Some(b'(') => Ok(Value::Tuple(self.tuple()?)),
            Some(b'T') if self.s[self.pos..].starts_with(b"True") => {
                self.pos += 4;
                Ok(Value::Bool(true))
            }
            Some(b'F') if self.s[self.pos..].starts_with(b"False") => {
                self.pos += 5;
                Ok(Value::Bool(false))
            }
            Some(b'[' | b'{') => {
                // A structured dtype (list of fields) or a nested dict.
                let mut depth = 0usize;
                while let Some(&c) = self.s.get(self.pos) {
                    self.pos += 1;
                    match c {
                        b'[' | b'{' | b'(' => depth += 1,
                        b']' | b'}' | b')' => {
                            depth -= 1;
                            if depth == 0 {
                                return Ok(Value::Other);
                            }
                        }
                        _ => {}
                    }
                }
                Err("unterminated value".into())
            }
            Some(c) => Err(format!(
                "unexpected '{}' at byte {}",
                c.escape_ascii(),
                self.pos
            )),
            None => Err("expected a value, found the end of the header".into()),
        }
    }
}

/// Parses `{'descr': ..., 'fortran_order': ..., 'shape': ..., }`.
fn parse_header_dict(text: &[u8]) -> std::result::Result<(String, bool, Vec<usize>), String> {
    let mut p = DictParser { s: text, pos: 0 };
    p.expect(b'{')?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    loop {
        if p.peek() == Some(b'}') {
            p.pos += 1;
            break;
        }
        let key = p.string()?;
        p.expect(b':')?;
        let value = p.value()?;
        match (key.as_str(), value) {
            ("descr", Value::Str(s)) => descr = Some(s),
            ("descr", _) => {
                return Err("structured dtypes are not supported (descr is not a string)".into())
            }
            ("fortran_order", Value::Bool(b)) => fortran = Some(b),
            ("fortran_order", v) => {
                return Err(format!("fortran_order is {v:?}, expected True or False"))
            }
            ("shape", Value::Tuple(t)) => shape = Some(t),
            ("shape", v) => return Err(format!("shape is {v:?}, expected a tuple of integers")),
            (k, _) => return Err(format!("unexpected key '{k}'")),
        }
        match p.peek() {
            Some(b',') => p.pos += 1,
            Some(b'}') => {}
            _ => return Err(format!("expected ',' or '}}' at byte {}", p.pos)),
        }
    }
    if p.s[p.pos..].iter().any(|c| !c.is_ascii_whitespace()) {
        return Err(format!("unexpected text after the dict at byte {}", p.pos));
    }
    match (descr, fortran, shape) {
        (Some(d), Some(f), Some(s)) => Ok((d, f, s)),
        (d, f, _) => {
            let missing = if d.is_none() {
                "descr"
            } else if f.is_none() {
                "fortran_order"
            } else {
                "shape"
            };
            Err(format!("missing key '{missing}'"))
        }
    }
}

/// Reads a 2-D float array of shape `(n, d)` (`<f4`, or `<f8` narrowed to `f32`).
pub fn read_f32_matrix(path: &Path) -> Result<FeatureMatrix> {
    let mut r = NpyReader::open(path)?;
    let dtype = r.header.dtype;
    if !matches!(dtype, Dtype::F32 | Dtype::F64) {
        return Err(r.wrong_dtype("<f4 or <f8 (float features)"));
    }
    r.expect_rank(2, "(n, d)")?;
    let (rows, cols) = (r.header.shape[0], r.header.shape[1]);
    let mut data = Vec::with_capacity(r.count);
    r.for_each(|i, b| {
        let v = match b.len() {
            4 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            _ => f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32,
        };
        if !v.is_finite() {
            // (An f64 beyond f32's range becomes an infinity here too.)
            let cols = cols.max(1);
            return Err(Error::format(
                path,
                format!(
                    "feature row {}, column {} is {v}: features must be finite numbers",
                    i / cols,
                    i % cols
                ),
            ));
        }
        data.push(v);
        Ok(())
    })?;
    FeatureMatrix::new(data.into(), rows, cols)
        .map_err(|e| Error::cpu_ops(path.display().to_string(), e))
}

/// Reads a 1-D integer array of shape `(n,)` as class labels. Any integer dtype is
/// accepted; negative values and values that do not fit `u32` (less one, so that
/// `num_classes = max + 1` fits) are errors naming the index.
pub fn read_labels(path: &Path) -> Result<Vec<u32>> {
    let mut r = NpyReader::open(path)?;
    r.expect_rank(1, "(n,)")?;
    let mut out = Vec::with_capacity(r.count);
    r.for_each_int(
        false,
        "an integer type (|i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8) for labels",
        |i, v| {
            if v < 0 {
                return Err(Error::format(
                    path,
                    format!(
                        "label {v} at index {i} is negative; expected class ids 0..num_classes"
                    ),
                ));
            }
            if v >= u32::MAX as i128 {
                return Err(Error::format(
                    path,
                    format!(
                        "label {v} at index {i} is too large (labels must be below {})",
                        u32::MAX
                    ),
                ));
            }
            out.push(v as u32);
            Ok(())
        },
    )?;
    Ok(out)
}

/// Reads a 1-D mask of shape `(n,)`: `|b1`, or an integer type holding only 0 and 1.
pub fn read_mask(path: &Path) -> Result<Vec<u8>> {
    let mut r = NpyReader::open(path)?;
    r.expect_rank(1, "(n,)")?;
    let mut out = Vec::with_capacity(r.count);
    r.for_each_int(true, "|b1 or an integer type holding 0/1 (mask)", |i, v| {
        if v != 0 && v != 1 {
            return Err(Error::format(
                path,
                format!("mask value {v} at index {i}; expected 0 or 1"),
            ));
        }
        out.push(v as u8);
        Ok(())
    })?;
    Ok(out)
}

/// Reads a 2-D array of non-negative integers (any integer dtype) of shape
/// `(rows, cols)`; returns the values row-major with the shape. Used for
/// `edge_index` (shape `(2, E)`).
pub fn read_index_matrix(path: &Path) -> Result<(Vec<u64>, usize, usize)> {
    let mut r = NpyReader::open(path)?;
    r.expect_rank(2, "(rows, cols)")?;
    let (rows, cols) = (r.header.shape[0], r.header.shape[1]);
    let mut out = Vec::with_capacity(r.count);
    r.for_each_int(
        false,
        "an integer type (|i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8)",
        |i, v| {
            if v < 0 {
                return Err(Error::format(
                    path,
                    format!(
                        "value {v} at row {}, column {} is negative; expected ids >= 0",
                        i / cols.max(1),
                        i % cols.max(1)
                    ),
                ));
            }
            out.push(v as u64);
            Ok(())
        },
    )?;
    Ok((out, rows, cols))
}

/// Reads an integer array of vertex ids of rank `rank` (1: `(E,)`, 2: `(E, k)`;
/// `what` names the shape in errors), each id below `num_vertices` (named by
/// `bound`, e.g. `the vertex count 50 (features.npy rows)`); returns the ids
/// row-major and the shape. Any integer dtype; a negative or too large id is an
/// error naming its index.
pub fn read_vertex_ids(
    path: &Path,
    rank: usize,
    what: &str,
    num_vertices: usize,
    bound: &str,
) -> Result<(Vec<u32>, Vec<usize>)> {
    let mut r = NpyReader::open(path)?;
    r.expect_rank(rank, what)?;
    let shape = r.header.shape.clone();
    let cols = if rank == 2 { shape[1].max(1) } else { 1 };
    let place = |i: usize| {
        if rank == 2 {
            format!("row {}, column {}", i / cols, i % cols)
        } else {
            format!("index {i}")
        }
    };
    let mut out = Vec::with_capacity(r.count);
    r.for_each_int(
        false,
        "an integer type (|i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8) for vertex ids",
        |i, v| {
            if v < 0 || v >= num_vertices as i128 {
                return Err(Error::format(
                    path,
                    format!(
                        "vertex id {v} at {} is not in 0..{num_vertices}: ids must be below {bound}",
                        place(i)
                    ),
                ));
            }
            out.push(v as u32);
            Ok(())
        },
    )?;
    Ok((out, shape))
}

/// Builds the header bytes (magic through the padded dict) for a version 1.0 file.
pub(crate) fn header_bytes(dtype: Dtype, shape: &[usize]) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        dtype.descr(),
        shape_str(shape)
    );
    // magic (6) + version (2) + length (2) + dict + padding + '\n' ≡ 0 (mod 64).
    let unpadded = 10 + dict.len() + 1;
    let total = unpadded.div_ceil(ALIGN) * ALIGN;
    let header_len = total - 10;
    let mut h = Vec::with_capacity(total);
    h.extend_from_slice(NPY_MAGIC);
    h.extend_from_slice(&[1, 0]);
    // Our dicts are < 200 bytes, so the 1.0 format's u16 length always suffices.
    h.extend_from_slice(&(header_len as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.resize(total - 1, b' ');
    h.push(b'\n');
    h
}

/// Writes a `.npy` file atomically: the header, then `count` elements that `fill`
/// encodes into the writer.
fn write_npy<F>(path: &Path, dtype: Dtype, shape: &[usize], fill: F) -> Result<()>
where
    F: FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
{
    write_file_atomically(path, |w| {
        w.write_all(&header_bytes(dtype, shape))
            .and_then(|_| fill(w))
            .map_err(|e| Error::io(path, e))
    })
}

/// Writes values through a small staging buffer so `write_all` is called per chunk.
fn write_le<T, const N: usize, W: Write>(
    w: &mut W,
    values: impl IntoIterator<Item = T>,
    enc: impl Fn(T) -> [u8; N],
) -> std::io::Result<usize> {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut n = 0;
    for v in values {
        buf.extend_from_slice(&enc(v));
        n += 1;
        if buf.len() >= 64 * 1024 - N {
            w.write_all(&buf)?;
            buf.clear();
        }
    }
    w.write_all(&buf)?;
    Ok(n)
}

/// `prod(shape)`, or an error naming `name` on overflow.
fn element_count(name: &str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| {
            Error::invalid_argument(name, format!("shape {} overflows", shape_str(shape)))
        })
}

fn check_count(name: &str, shape: &[usize], found: usize) -> Result<()> {
    let expected = element_count(name, shape)?;
    if expected != found {
        return Err(Error::invalid_argument(
            name,
            format!(
                "shape {} needs {expected} values, got {found}",
                shape_str(shape)
            ),
        ));
    }
    Ok(())
}

/// Writes `data` (row-major, `rows × cols` values) as a `<f4` array of shape
/// `(rows, cols)`.
pub fn write_f32_matrix(path: &Path, data: &[f32], rows: usize, cols: usize) -> Result<()> {
    check_count("data", &[rows, cols], data.len())?;
    write_npy(path, Dtype::F32, &[rows, cols], |w| {
        write_le(w, data.iter().copied(), f32::to_le_bytes).map(|_| ())
    })
}

/// Writes an `<i8` array of 1 or 2 dimensions. `values` must yield exactly
/// `prod(shape)` values in row-major order; it is streamed, not collected.
pub fn write_i64<I>(path: &Path, shape: &[usize], values: I) -> Result<()>
where
    I: IntoIterator<Item = i64>,
{
    if !(1..=2).contains(&shape.len()) {
        return Err(Error::invalid_argument(
            "shape",
            format!(
                "{} has {} dimensions, expected 1 or 2",
                shape_str(shape),
                shape.len()
            ),
        ));
    }
    let expected = element_count("shape", shape)?;
    write_npy(path, Dtype::I64, shape, |w| {
        let mut it = values.into_iter();
        let written = write_le(w, it.by_ref().take(expected), i64::to_le_bytes)?;
        if written != expected || it.next().is_some() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "shape {} needs exactly {expected} values, got {}",
                    shape_str(shape),
                    if written < expected {
                        written.to_string()
                    } else {
                        "more".into()
                    }
                ),
            ));
        }
        Ok(())
    })
}

/// Writes a 1-D `|b1` array; non-zero entries of `mask` are written as `True`.
pub fn write_bool(path: &Path, mask: &[u8]) -> Result<()> {
    write_npy(path, Dtype::Bool, &[mask.len()], |w| {
        write_le(w, mask.iter().map(|&m| (m != 0) as u8), |b| [b]).map(|_| ())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    /// A file with a hand-built header dict (padded like numpy does), then `data`.
    fn raw_npy(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut v = NPY_MAGIC.to_vec();
        v.extend_from_slice(&[1, 0]);
        let unpadded = 10 + dict.len() + 1;
        let total = unpadded.div_ceil(64) * 64;
        v.extend_from_slice(&((total - 10) as u16).to_le_bytes());
        v.extend_from_slice(dict.as_bytes());
        v.resize(total - 1, b' ');
        v.push(b'\n');
        v.extend_from_slice(data);
        v
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn err_of<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn reads_python_style_v1_header() {
        let d = tmp();
        let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let bytes = raw_npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }",
            &data,
        );
        // numpy 1.24 writes exactly this: header length 118, data at byte 128.
        assert_eq!(bytes.len(), 128 + 24);
        assert_eq!(&bytes[8..10], &[118, 0]);
        assert_eq!(bytes[127], b'\n');
        let p = write(d.path(), "x.npy", &bytes);
        let h = read_header(&p).unwrap();
        assert_eq!(h.version, (1, 0));
        assert_eq!(h.dtype, Dtype::F32);
        assert_eq!(h.shape, vec![3, 2]);
        assert_eq!(h.data_offset, 128);
        let m = read_f32_matrix(&p).unwrap();
        assert_eq!((m.num_rows(), m.dim()), (3, 2));
        assert_eq!(m.row(2), &[5.0, 6.0]);
        // Our writer produces the very same bytes.
        let q = d.path().join("y.npy");
        write_f32_matrix(&q, m.as_slice(), 3, 2).unwrap();
        assert_eq!(std::fs::read(&q).unwrap(), bytes);
    }

    #[test]
    fn reads_v2_and_v3_headers_and_f8() {
        let d = tmp();
        for major in [2u8, 3] {
            let dict = b"{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (2L, 1L)}\n";
            let mut v = NPY_MAGIC.to_vec();
            v.extend_from_slice(&[major, 0]);
            v.extend_from_slice(&(dict.len() as u32).to_le_bytes());
            v.extend_from_slice(dict);
            v.extend_from_slice(&1.5f64.to_le_bytes());
            v.extend_from_slice(&(-2.25f64).to_le_bytes());
            let p = write(d.path(), "v.npy", &v);
            let m = read_f32_matrix(&p).unwrap();
            assert_eq!(m.as_slice(), &[1.5, -2.25]);
            assert_eq!(read_header(&p).unwrap().version, (major, 0));
        }
    }

    #[test]
    fn round_trips_every_written_dtype() {
        let d = tmp();
        let p = d.path().join("f.npy");
        let vals: Vec<f32> = (0..35).map(|i| i as f32 * 0.5 - 3.0).collect();
        write_f32_matrix(&p, &vals, 7, 5).unwrap();
        let m = read_f32_matrix(&p).unwrap();
        assert_eq!((m.num_rows(), m.dim(), m.as_slice()), (7, 5, &vals[..]));
        assert_eq!(std::fs::metadata(&p).unwrap().len() % 4, 0);

        let p = d.path().join("l.npy");
        write_i64(&p, &[5], [0i64, 3, 1, 4, 2]).unwrap();
        assert_eq!(read_header(&p).unwrap().dtype, Dtype::I64);
        assert_eq!(read_labels(&p).unwrap(), vec![0, 3, 1, 4, 2]);

        let p = d.path().join("e.npy");
        write_i64(&p, &[2, 3], [0i64, 1, 2, 1, 2, 0]).unwrap();
        assert_eq!(
            read_index_matrix(&p).unwrap(),
            (vec![0, 1, 2, 1, 2, 0], 2, 3)
        );

        let p = d.path().join("m.npy");
        write_bool(&p, &[1, 0, 0, 1, 1]).unwrap();
        assert_eq!(read_header(&p).unwrap().dtype, Dtype::Bool);
        assert_eq!(read_mask(&p).unwrap(), vec![1, 0, 0, 1, 1]);

        // Empty arrays.
        let p = d.path().join("z.npy");
        write_f32_matrix(&p, &[], 0, 4).unwrap();
        assert_eq!(read_f32_matrix(&p).unwrap().num_rows(), 0);
        write_bool(&p, &[]).unwrap();
        assert!(read_mask(&p).unwrap().is_empty());

        // Count mismatches are refused before anything is written.
        assert!(write_f32_matrix(&p, &[1.0], 2, 2).is_err());
        assert!(write_i64(&p, &[3], [1i64, 2]).is_err());
        assert!(write_i64(&p, &[1], [1i64, 2]).is_err());
        assert!(write_i64(&p, &[1, 1, 1], [1i64]).is_err());
    }

    #[test]
    fn integer_label_dtypes_and_range_checks() {
        let d = tmp();
        let cases: [(&str, Vec<u8>); 8] = [
            ("|i1", vec![0, 2, 1]),
            ("|u1", vec![0, 2, 1]),
            (
                "<i2",
                [0i16, 2, 1].iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            (
                "<u2",
                [0u16, 2, 1].iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            (
                "<i4",
                [0i32, 2, 1].iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            (
                "<u4",
                [0u32, 2, 1].iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            (
                "<i8",
                [0i64, 2, 1].iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            (
                "<u8",
                [0u64, 2, 1].iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
        ];
        for (descr, data) in cases {
            let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (3,), }}");
            let p = write(d.path(), "l.npy", &raw_npy(&dict, &data));
            assert_eq!(read_labels(&p).unwrap(), vec![0, 2, 1], "{descr}");
            // 0/1 subsets of these are valid masks too.
            if descr != "|b1" {
                assert!(err_of(read_mask(&p)).contains("mask value 2 at index 1"));
            }
        }
        let neg = raw_npy(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
            &[3i64, -1]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        let p = write(d.path(), "neg.npy", &neg);
        let e = err_of(read_labels(&p));
        assert!(
            e.contains("neg.npy") && e.contains("label -1 at index 1 is negative"),
            "{e}"
        );
        let big = raw_npy(
            "{'descr': '<u8', 'fortran_order': False, 'shape': (1,), }",
            &(1u64 << 40).to_le_bytes(),
        );
        let p = write(d.path(), "big.npy", &big);
        assert!(err_of(read_labels(&p)).contains("too large"));
        let float = raw_npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
            &1f32.to_le_bytes(),
        );
        let p = write(d.path(), "fl.npy", &float);
        let e = err_of(read_labels(&p));
        assert!(
            e.contains("fl.npy")
                && e.contains("expected dtype an integer type")
                && e.contains("found <f4"),
            "{e}"
        );
    }

    #[test]
    fn masks_from_bool_and_integers() {
        let d = tmp();
        let p = write(
            d.path(),
            "m.npy",
            &raw_npy(
                "{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }",
                &[1, 0, 1, 1],
            ),
        );
        assert_eq!(read_mask(&p).unwrap(), vec![1, 0, 1, 1]);
        let p = write(
            d.path(),
            "m2.npy",
            &raw_npy(
                "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }",
                &[1, 7],
            ),
        );
        assert!(err_of(read_mask(&p)).contains("mask value 7 at index 1"));
        let p = write(
            d.path(),
            "m3.npy",
            &raw_npy(
                "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
                &[1i32, 0, 1]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<_>>(),
            ),
        );
        assert_eq!(read_mask(&p).unwrap(), vec![1, 0, 1]);
        // Bool is not accepted as labels.
        let p = write(
            d.path(),
            "m4.npy",
            &raw_npy(
                "{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }",
                &[1],
            ),
        );
        assert!(err_of(read_labels(&p)).contains("found |b1"));
    }

    #[test]
    fn wrong_dtype_shape_order_and_truncation_are_errors() {
        let d = tmp();
        let f4 = |n: usize| vec![0u8; 4 * n];
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "{'descr': '<i8', 'fortran_order': False, 'shape': (3, 2), }",
                vec![0; 48],
                "expected dtype <f4 or <f8 (float features), found <i8",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }",
                f4(6),
                "expected a 2-D array of shape (n, d), found shape (6,)",
            ),
            (
                "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 2), }",
                f4(6),
                "Fortran (column-major) order",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }",
                f4(5),
                "truncated data: shape (3, 2) of <f4 needs 24 bytes after the 128-byte header, found 20",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }",
                f4(7),
                "4 unexpected bytes after the data",
            ),
            (
                "{'descr': '>f4', 'fortran_order': False, 'shape': (3, 2), }",
                f4(6),
                "big-endian dtype '>f4' is not supported",
            ),
            (
                "{'descr': '<c8', 'fortran_order': False, 'shape': (3, 2), }",
                f4(12),
                "unsupported dtype '<c8'",
            ),
            (
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3, 2), }",
                f4(6),
                "structured dtypes are not supported",
            ),
            (
                "{'descr': '<f4', 'shape': (3, 2), }",
                f4(6),
                "bad header dict: missing key 'fortran_order'",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3, -2), }",
                f4(6),
                "bad header dict: expected a non-negative integer in shape",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), 'x': 1}",
                f4(6),
                "bad header dict",
            ),
            ("not a dict at all", f4(6), "bad header dict: expected '{'"),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2)",
                f4(6),
                "bad header dict",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }",
                f4(6),
                "overflows",
            ),
        ];
        for (dict, data, want) in cases {
            let p = write(d.path(), "bad.npy", &raw_npy(dict, &data));
            let e = err_of(read_f32_matrix(&p));
            assert!(
                e.contains("bad.npy") && e.contains(want),
                "{dict}: got `{e}`, want `{want}`"
            );
        }
        let labels2d = raw_npy(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 1), }",
            &[0; 16],
        );
        let p = write(d.path(), "l.npy", &labels2d);
        assert!(err_of(read_labels(&p))
            .contains("expected a 1-D array of shape (n,), found shape (2, 1)"));
        assert!(err_of(read_mask(&p)).contains("found shape (2, 1)"));
    }

    #[test]
    fn bad_magic_versions_and_short_files_never_panic() {
        let d = tmp();
        let good = raw_npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }",
            &[0; 4],
        );
        // Every prefix of a valid file is an error, not a panic.
        for len in 0..good.len() {
            let p = write(d.path(), "short.npy", &good[..len]);
            assert!(read_f32_matrix(&p).is_err(), "prefix {len}");
            assert!(read_header(&p).is_err() || len >= 128, "prefix {len}");
        }
        let p = write(
            d.path(),
            "gz.npy",
            &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        );
        let e = err_of(read_f32_matrix(&p));
        assert!(e.contains("bad magic") && e.contains("gzip"), "{e}");
        let p = write(d.path(), "txt.npy", b"hello world, this is text");
        assert!(err_of(read_mask(&p)).contains("bad magic: expected \\x93NUMPY, found 'hello '"));
        let mut v9 = good.clone();
        v9[6] = 9;
        let p = write(d.path(), "v9.npy", &v9);
        assert!(err_of(read_f32_matrix(&p)).contains("unsupported .npy format version 9.0"));
        let mut huge = good.clone();
        huge[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
        let p = write(d.path(), "huge.npy", &huge);
        assert!(err_of(read_f32_matrix(&p)).contains("truncated header"));
        // Random corruption of the header bytes: errors or successes, never panics.
        let mut rng = cpu_ops::Rng::new(3);
        for _ in 0..2000 {
            let mut b = good.clone();
            for _ in 0..3 {
                let i = rng.below(128) as usize;
                b[i] = rng.next_u32() as u8;
            }
            let p = write(d.path(), "fuzz.npy", &b);
            let _ = read_f32_matrix(&p);
            let _ = read_labels(&p);
            let _ = read_mask(&p);
        }
        let missing = d.path().join("nope.npy");
        assert!(err_of(read_f32_matrix(&missing)).contains("nope.npy"));
    }
}
