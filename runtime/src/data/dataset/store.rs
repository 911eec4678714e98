//! The Tandem dataset file (`.tds`): one file that maps straight into memory.
//!
//! Layout (all integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `TANDEMDS` |
//! | 8..12 | format version (`u32`: 1, or 2 for a file with an edge split) |
//! | 12..16 | header length in bytes, checksum included (`u32`) |
//! | 16..24 | number of vertices `n` (`u64`) |
//! | 24..32 | number of stored edges `m` (`u64`) |
//! | 32..40 | feature dimension `d` (`u64`) |
//! | 40..48 | number of classes (`u64`) |
//! | 48..52 | number of sections `S` (`u32`: 7 in version 1, 15 in version 2) |
//! | 52..56 | name length in bytes (`u32`, at most 1024) |
//! | 56..96 | version 2 only: flags (`u32`, bit 0 = symmetric edge split, other bits 0), reserved `u32` (0), training, validation and test positives `t`, `v`, `w` (`u64` each), fixed negatives per validation and per test positive `kv`, `kw` (`u32` each, 0 = none) |
//! | .. | `S` section records of 32 bytes: kind `u32`, reserved `u32`, byte offset `u64`, byte length `u64`, xxh3-64 checksum `u64` |
//! | .. | dataset name, UTF-8 |
//! | .. | xxh3-64 of every header byte before it (`u64`) |
//!
//! Sections, each starting on a 4096-byte boundary, in kind order: CSR offsets
//! (`u64 × (n+1)`), neighbor ids (`u32 × m`), features (`f32 × n·d`, row-major),
//! labels (`u32 × n`), train/val/test masks (`u8 × n` each); in version 2 then the
//! edge split, `u32` vertex ids each: training sources and destinations (`t` each),
//! validation (`v` each), test (`w` each), validation negatives (`v·kv`, row-major)
//! and test negatives (`w·kw`). An empty section has length 0.
//!
//! A dataset without an edge split is written as version 1, byte for byte as
//! before the edge split existed, so older readers open it; this reader opens
//! both versions.
//!
//! Opening maps the file and checks the header checksum, every size against the
//! header and the file length, the CSR invariants, label range, masks and the edge
//! split ([`super::EdgeSplit::validate`]). Section checksums are verified for
//! everything but the features by default ([`Verify::Default`]); [`Verify::Full`]
//! also hashes the features, which reads the whole file. The edge split's arrays
//! are views of the mapping, as the others are. Writing goes through a temporary
//! file and a rename.

#[cfg(target_endian = "big")]
compile_error!(
    "the .tds store maps little-endian data directly; big-endian hosts are not supported"
);

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use cpu_ops::{CsrGraph, FeatureMatrix, HostArray};
use memmap2::Mmap;
use xxhash_rust::xxh3::xxh3_64;

use super::{Dataset, EdgeList, EdgeSplit};
use crate::atomic::write_file_atomically;
use crate::error::{Error, Result};

/// First eight bytes of every dataset file.
pub const MAGIC: &[u8; 8] = b"TANDEMDS";
/// The newest format version this build writes; it reads every version up to it.
/// (A dataset without an edge split is written as version 1.)
pub const FORMAT_VERSION: u32 = 2;

const ALIGN: u64 = 4096;
/// Sections of a version 1 file (no edge split).
const NODE_SECTIONS: usize = 7;
/// Sections of a version 2 file (with an edge split).
const NUM_SECTIONS: usize = 15;
const SECTION_RECORD: usize = 32;
/// Fixed header bytes of version 1 and of version 2.
const FIXED_HEADER_V1: usize = 56;
const FIXED_HEADER_V2: usize = 96;
const MAX_NAME: usize = 1024;
/// Bit 0 of the version 2 flags: the edge split is symmetric.
const FLAG_SYMMETRIC: u32 = 1;
const SECTION_NAMES: [&str; NUM_SECTIONS] = [
    "offsets",
    "indices",
    "features",
    "labels",
    "train_mask",
    "val_mask",
    "test_mask",
    "edges.train.src",
    "edges.train.dst",
    "edges.val.src",
    "edges.val.dst",
    "edges.test.src",
    "edges.test.dst",
    "edges.val_neg",
    "edges.test_neg",
];
/// Bytes per element of each section.
const ELEM_SIZES: [u64; NUM_SECTIONS] = [8, 4, 4, 4, 1, 1, 1, 4, 4, 4, 4, 4, 4, 4, 4];

/// How much of the file [`open_dataset`] hashes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Verify {
    /// Header, sizes, structure, and checksums of all sections but the features.
    #[default]
    Default,
    /// Everything in `Default` plus the feature checksum (reads the whole file).
    Full,
}

#[derive(Clone, Copy, Debug)]
struct Section {
    offset: u64,
    len: u64,
    checksum: u64,
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Writes `ds` to `path` atomically (temporary file, then rename): version 1
/// without an edge split, version 2 with one (layout in the module doc).
pub fn write_dataset(path: &Path, ds: &Dataset) -> Result<()> {
    ds.validate()?;
    ds.check_features()?;
    if ds.name.len() > MAX_NAME {
        return Err(Error::invalid_argument(
            "name",
            format!("{} bytes, at most {MAX_NAME}", ds.name.len()),
        ));
    }
    let mut blobs: Vec<&[u8]> = vec![
        bytemuck::cast_slice(ds.graph.offsets().as_slice()),
        bytemuck::cast_slice(ds.graph.indices().as_slice()),
        bytemuck::cast_slice(ds.features.as_slice()),
        bytemuck::cast_slice(ds.labels.as_slice()),
        ds.train_mask.as_slice(),
        ds.val_mask.as_slice(),
        ds.test_mask.as_slice(),
    ];
    let (version, fixed) = match &ds.edges {
        None => (1u32, FIXED_HEADER_V1),
        Some(e) => {
            for list in [&e.train, &e.val, &e.test] {
                blobs.push(bytemuck::cast_slice(list.src.as_slice()));
                blobs.push(bytemuck::cast_slice(list.dst.as_slice()));
            }
            for neg in [&e.val_neg, &e.test_neg] {
                blobs.push(
                    neg.as_ref()
                        .map_or(&[][..], |a| bytemuck::cast_slice(a.as_slice())),
                );
            }
            (2u32, FIXED_HEADER_V2)
        }
    };
    let header_len = fixed + blobs.len() * SECTION_RECORD + ds.name.len() + 8;
    let mut pos = align_up(header_len as u64);
    let mut sections = Vec::with_capacity(blobs.len());
    for b in &blobs {
        sections.push(Section {
            offset: pos,
            len: b.len() as u64,
            checksum: xxh3_64(b),
        });
        pos = align_up(pos + b.len() as u64);
    }
    let mut h = Vec::with_capacity(header_len);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&(header_len as u32).to_le_bytes());
    h.extend_from_slice(&(ds.num_vertices() as u64).to_le_bytes());
    h.extend_from_slice(&(ds.graph.num_edges() as u64).to_le_bytes());
    h.extend_from_slice(&(ds.features.dim() as u64).to_le_bytes());
    h.extend_from_slice(&(ds.num_classes as u64).to_le_bytes());
    h.extend_from_slice(&(blobs.len() as u32).to_le_bytes());
    h.extend_from_slice(&(ds.name.len() as u32).to_le_bytes());
    if let Some(e) = &ds.edges {
        let flags = if e.symmetric { FLAG_SYMMETRIC } else { 0 };
        h.extend_from_slice(&flags.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        for list in [&e.train, &e.val, &e.test] {
            h.extend_from_slice(&(list.len() as u64).to_le_bytes());
        }
        for k in [
            e.val_negatives_per_positive(),
            e.test_negatives_per_positive(),
        ] {
            // The header field is a u32; more negatives per positive is refused.
            let k = u32::try_from(k.unwrap_or(0)).map_err(|_| {
                Error::invalid_argument("edges", "more than 2^32 - 1 negatives per positive")
            })?;
            h.extend_from_slice(&k.to_le_bytes());
        }
    }
    debug_assert_eq!(h.len(), fixed);
    for (kind, s) in sections.iter().enumerate() {
        h.extend_from_slice(&(kind as u32).to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&s.offset.to_le_bytes());
        h.extend_from_slice(&s.len.to_le_bytes());
        h.extend_from_slice(&s.checksum.to_le_bytes());
    }
    h.extend_from_slice(ds.name.as_bytes());
    let hsum = xxh3_64(&h);
    h.extend_from_slice(&hsum.to_le_bytes());
    debug_assert_eq!(h.len(), header_len);

    write_file_atomically(path, |w| {
        let io = |e| Error::io(path, e);
        w.write_all(&h).map_err(io)?;
        let mut written = h.len() as u64;
        for (s, b) in sections.iter().zip(&blobs) {
            write_zeros(w, s.offset - written).map_err(io)?;
            w.write_all(b).map_err(io)?;
            written = s.offset + s.len;
        }
        write_zeros(w, align_up(written) - written).map_err(io)?;
        Ok(())
    })
}

fn write_zeros(w: &mut impl Write, n: u64) -> std::io::Result<()> {
    const Z: [u8; 4096] = [0; 4096];
    let mut left = n;
    while left > 0 {
        let k = left.min(Z.len() as u64) as usize;
        w.write_all(&Z[..k])?;
        left -= k as u64;
    }
    Ok(())
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> u32 {
        let v = u32::from_le_bytes(
            self.bytes[self.pos..self.pos + 4]
                .try_into()
                .unwrap_or([0; 4]),
        );
        self.pos += 4;
        v
    }
    fn u64(&mut self) -> u64 {
        let v = u64::from_le_bytes(
            self.bytes[self.pos..self.pos + 8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        self.pos += 8;
        v
    }
}

/// Opens a dataset file, memory-mapping its sections. See the module docs for what
/// is checked; every failure names the file and what was wrong.
pub fn open_dataset(path: &Path, verify: Verify) -> Result<Dataset> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the map is read-only. Tandem writes datasets only through a temporary
    // file and a rename, so a file it opened is never modified in place; a user who
    // truncates the file under a running process gets SIGBUS, as with any mmap reader.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    parse_mapped(path, Arc::new(map), verify)
}

/// Parses a dataset from an in-memory image (used by the fuzz target and tests).
pub fn parse_dataset_bytes(path: &Path, bytes: &[u8], verify: Verify) -> Result<Dataset> {
    let mut anon =
        memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(|e| Error::io(path, e))?;
    anon[..bytes.len()].copy_from_slice(bytes);
    let map = anon.make_read_only().map_err(|e| Error::io(path, e))?;
    parse_mapped_len(path, Arc::new(map), bytes.len(), verify)
}

fn parse_mapped(path: &Path, map: Arc<Mmap>, verify: Verify) -> Result<Dataset> {
    let len = map.len();
    parse_mapped_len(path, map, len, verify)
}

fn parse_mapped_len(
    path: &Path,
    map: Arc<Mmap>,
    file_len: usize,
    verify: Verify,
) -> Result<Dataset> {
    let bad = |what: String| Error::format(path, what);
    let bytes = &map[..file_len];
    if bytes.len() < 16 {
        return Err(bad(format!(
            "file is {} bytes, too short for a Tandem dataset header",
            bytes.len()
        )));
    }
    if &bytes[0..8] != MAGIC {
        return Err(bad(format!(
            "not a Tandem dataset: magic is {:?}, expected {:?}",
            String::from_utf8_lossy(&bytes[0..8]),
            std::str::from_utf8(MAGIC).unwrap_or("TANDEMDS")
        )));
    }
    let mut r = Reader { bytes, pos: 8 };
    let version = r.u32();
    let (fixed, num_sections) = match version {
        1 => (FIXED_HEADER_V1, NODE_SECTIONS),
        2 => (FIXED_HEADER_V2, NUM_SECTIONS),
        _ => {
            return Err(bad(format!(
                "format version {version}, this build reads versions 1 to {FORMAT_VERSION}"
            )))
        }
    };
    let header_len = r.u32() as usize;
    let min_header = fixed + num_sections * SECTION_RECORD + 8;
    if header_len < min_header || header_len > min_header + MAX_NAME {
        return Err(bad(format!(
            "header length {header_len} is outside {min_header}..={}",
            min_header + MAX_NAME
        )));
    }
    if bytes.len() < header_len {
        return Err(bad(format!(
            "file is truncated: {} bytes, the header alone needs {header_len}",
            bytes.len()
        )));
    }
    let stored_sum = u64::from_le_bytes(
        bytes[header_len - 8..header_len]
            .try_into()
            .map_err(|_| bad("header checksum unreadable".into()))?,
    );
    if xxh3_64(&bytes[..header_len - 8]) != stored_sum {
        return Err(bad("header checksum mismatch: the header is corrupt".into()));
    }
    let n = r.u64();
    let m = r.u64();
    let d = r.u64();
    let num_classes = r.u64();
    let stored_sections = r.u32() as usize;
    let name_len = r.u32() as usize;
    if stored_sections != num_sections {
        return Err(bad(format!(
            "{stored_sections} sections, expected {num_sections} in format version {version}"
        )));
    }
    if fixed + num_sections * SECTION_RECORD + name_len + 8 != header_len {
        return Err(bad(format!(
            "name length {name_len} disagrees with header length {header_len}"
        )));
    }
    if n > u32::MAX as u64 {
        return Err(bad(format!("{n} vertices exceed the u32 vertex-id range")));
    }
    if num_classes == 0 || num_classes > u32::MAX as u64 {
        return Err(bad(format!(
            "num_classes is {num_classes}, expected 1..=2^32-1"
        )));
    }
    // Version 2: the edge split's sizes.
    let (mut symmetric, mut parts, mut per_positive) = (false, [0u64; 3], [0u64; 2]);
    if version == 2 {
        let flags = r.u32();
        let reserved = r.u32();
        if flags & !FLAG_SYMMETRIC != 0 || reserved != 0 {
            return Err(bad(format!(
                "edge split flags {flags:#x} / reserved {reserved:#x}: only bit 0 (symmetric) \
                 may be set"
            )));
        }
        symmetric = flags & FLAG_SYMMETRIC != 0;
        for p in &mut parts {
            *p = r.u64();
        }
        for k in &mut per_positive {
            *k = r.u32() as u64;
        }
    }
    let [t, v, w] = parts;
    let counts: [Option<u64>; NUM_SECTIONS] = [
        n.checked_add(1),
        Some(m),
        n.checked_mul(d),
        Some(n),
        Some(n),
        Some(n),
        Some(n),
        Some(t),
        Some(t),
        Some(v),
        Some(v),
        Some(w),
        Some(w),
        v.checked_mul(per_positive[0]),
        w.checked_mul(per_positive[1]),
    ];
    let mut sections = [Section {
        offset: 0,
        len: 0,
        checksum: 0,
    }; NUM_SECTIONS];
    for (k, sec) in sections.iter_mut().enumerate().take(num_sections) {
        let kind = r.u32() as usize;
        let _reserved = r.u32();
        let s = Section {
            offset: r.u64(),
            len: r.u64(),
            checksum: r.u64(),
        };
        let name = SECTION_NAMES[k];
        if kind != k {
            return Err(bad(format!(
                "section record {k} has kind {kind}, expected {k} ({name})"
            )));
        }
        let expected = counts[k]
            .and_then(|c| c.checked_mul(ELEM_SIZES[k]))
            .ok_or_else(|| bad(format!("section {name}: size overflows (n = {n}, d = {d})")))?;
        if s.len != expected {
            return Err(bad(format!(
                "section {name} is {} bytes, expected {expected} from the header sizes \
                 (n = {n}, edges = {m}, dim = {d}{})",
                s.len,
                if version == 2 {
                    format!(
                        ", split edges = {t}/{v}/{w}, negatives per positive = {}/{}",
                        per_positive[0], per_positive[1]
                    )
                } else {
                    String::new()
                }
            )));
        }
        if !s.offset.is_multiple_of(ALIGN) || s.offset < header_len as u64 {
            return Err(bad(format!(
                "section {name} starts at byte {}, expected a {ALIGN}-aligned offset after the header",
                s.offset
            )));
        }
        let end = s.offset.saturating_add(s.len);
        if end > bytes.len() as u64 {
            return Err(bad(format!(
                "file is truncated: section {name} ends at byte {end}, the file has {} bytes",
                bytes.len()
            )));
        }
        *sec = s;
    }
    let name = std::str::from_utf8(&bytes[r.pos..r.pos + name_len])
        .map_err(|_| bad("dataset name is not UTF-8".into()))?
        .to_string();
    for (k, s) in sections.iter().enumerate().take(num_sections) {
        if k == 2 && verify != Verify::Full {
            continue;
        }
        let sum = xxh3_64(&bytes[s.offset as usize..(s.offset + s.len) as usize]);
        if sum != s.checksum {
            return Err(bad(format!(
                "section {} checksum mismatch: the data is corrupt",
                SECTION_NAMES[k]
            )));
        }
    }
    let sec = |k: usize| sections[k].offset as usize;
    let ctx = |what: &str| format!("{}: section {what}", path.display());
    let offsets = HostArray::<u64>::from_mapped(Arc::clone(&map), sec(0), (n + 1) as usize)
        .map_err(|e| Error::cpu_ops(ctx("offsets"), e))?;
    let indices = HostArray::<u32>::from_mapped(Arc::clone(&map), sec(1), m as usize)
        .map_err(|e| Error::cpu_ops(ctx("indices"), e))?;
    let graph =
        CsrGraph::new(offsets, indices).map_err(|e| Error::cpu_ops(ctx("offsets/indices"), e))?;
    let feat = HostArray::<f32>::from_mapped(Arc::clone(&map), sec(2), (n * d) as usize)
        .map_err(|e| Error::cpu_ops(ctx("features"), e))?;
    let features = FeatureMatrix::new(feat, n as usize, d as usize)
        .map_err(|e| Error::cpu_ops(ctx("features"), e))?;
    let labels = HostArray::<u32>::from_mapped(Arc::clone(&map), sec(3), n as usize)
        .map_err(|e| Error::cpu_ops(ctx("labels"), e))?;
    let mask = |k: usize| {
        HostArray::<u8>::from_mapped(Arc::clone(&map), sec(k), n as usize)
            .map_err(|e| Error::cpu_ops(ctx(SECTION_NAMES[k]), e))
    };
    // Lengths were checked against `counts` above; sizes are in bytes there.
    let ids = |k: usize| {
        HostArray::<u32>::from_mapped(
            Arc::clone(&map),
            sec(k),
            (sections[k].len / ELEM_SIZES[k]) as usize,
        )
        .map_err(|e| Error::cpu_ops(ctx(SECTION_NAMES[k]), e))
    };
    let edges = if version == 2 {
        let list = |k: usize| -> Result<EdgeList> {
            Ok(EdgeList {
                src: ids(k)?,
                dst: ids(k + 1)?,
            })
        };
        let neg = |k: usize, per: u64| (per > 0).then(|| ids(k)).transpose();
        Some(EdgeSplit {
            train: list(7)?,
            val: list(9)?,
            test: list(11)?,
            val_neg: neg(13, per_positive[0])?,
            test_neg: neg(14, per_positive[1])?,
            symmetric,
        })
    } else {
        None
    };
    let ds = Dataset {
        name,
        graph,
        features,
        labels,
        num_classes: num_classes as u32,
        train_mask: mask(4)?,
        val_mask: mask(5)?,
        test_mask: mask(6)?,
        edges,
    };
    ds.validate().map_err(|e| bad(e.to_string()))?;
    if verify == Verify::Full {
        ds.check_features().map_err(|e| bad(e.to_string()))?;
    }
    Ok(ds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpu_ops::BuildOptions;

    pub(crate) fn tiny() -> Dataset {
        let g = CsrGraph::from_edges(
            5,
            &[(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)],
            BuildOptions::UNDIRECTED,
        )
        .unwrap();
        Dataset {
            name: "tiny".into(),
            graph: g,
            features: FeatureMatrix::new(
                (0..15).map(|x| x as f32 * 0.5).collect::<Vec<_>>().into(),
                5,
                3,
            )
            .unwrap(),
            labels: vec![0, 1, 2, 0, 1].into(),
            num_classes: 3,
            train_mask: vec![1, 1, 0, 0, 0].into(),
            val_mask: vec![0, 0, 1, 0, 0].into(),
            test_mask: vec![0, 0, 0, 1, 1].into(),
            edges: None,
        }
    }

    #[test]
    fn round_trip_maps_sections() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.tds");
        let ds = tiny();
        write_dataset(&p, &ds).unwrap();
        let back = open_dataset(&p, Verify::Full).unwrap();
        assert_eq!(back, ds);
        assert!(back.features.data().is_mapped());
        assert!(back.graph.indices().is_mapped());
        assert_eq!(std::fs::metadata(&p).unwrap().len() % ALIGN, 0);
    }

    fn expect_err(bytes: &[u8], needle: &str) {
        let err = parse_dataset_bytes(Path::new("bad.tds"), bytes, Verify::Full).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("bad.tds"), "{msg}");
        assert!(msg.contains(needle), "expected `{needle}` in: {msg}");
    }

    fn tiny_bytes() -> Vec<u8> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.tds");
        write_dataset(&p, &tiny()).unwrap();
        std::fs::read(&p).unwrap()
    }

    /// Rewrites a header field and fixes the header checksum, so the reader gets
    /// past the checksum and must catch the inconsistency itself.
    fn patch_header(bytes: &mut [u8], at: usize, val: &[u8]) {
        bytes[at..at + val.len()].copy_from_slice(val);
        let hl = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        let sum = xxh3_64(&bytes[..hl - 8]);
        bytes[hl - 8..hl].copy_from_slice(&sum.to_le_bytes());
    }

    #[test]
    fn bad_inputs_give_named_errors() {
        let good = tiny_bytes();
        expect_err(&good[..10], "too short");
        let mut b = good.clone();
        b[0] = b'X';
        expect_err(&b, "magic");
        let mut b = good.clone();
        patch_header(&mut b, 8, &7u32.to_le_bytes());
        expect_err(&b, "format version 7");
        let mut b = good.clone();
        b[20] ^= 1;
        expect_err(&b, "header checksum mismatch");
        expect_err(&good[..good.len() - 4096], "truncated");
        let mut b = good.clone();
        patch_header(&mut b, 24, &11u64.to_le_bytes());
        expect_err(&b, "section indices is 40 bytes, expected 44");
        // Corrupt a feature byte: caught by Full verification only.
        let feat_off =
            u64::from_le_bytes(b[56 + 2 * 32 + 8..56 + 2 * 32 + 16].try_into().unwrap()) as usize;
        let mut b = good.clone();
        b[feat_off] ^= 0x40;
        expect_err(&b, "section features checksum mismatch");
        assert!(parse_dataset_bytes(Path::new("x"), &b, Verify::Default).is_ok());
    }

    #[test]
    fn label_out_of_range_is_caught_even_with_valid_checksums() {
        let mut ds = tiny();
        ds.labels = vec![0, 1, 2, 0, 1].into();
        let good = {
            let d = tempfile::tempdir().unwrap();
            let p = d.path().join("t.tds");
            write_dataset(&p, &ds).unwrap();
            std::fs::read(&p).unwrap()
        };
        // Patch num_classes to 2 so label 2 is out of range.
        let mut b = good;
        patch_header(&mut b, 40, &2u64.to_le_bytes());
        expect_err(&b, "labels[2] = 2 is not below num_classes 2");
    }

    #[test]
    fn bad_csr_caught_with_valid_checksums() {
        let mut b = tiny_bytes();
        let idx_off = u64::from_le_bytes(b[56 + 32 + 8..56 + 32 + 16].try_into().unwrap()) as usize;
        b[idx_off..idx_off + 4].copy_from_slice(&99u32.to_le_bytes());
        let sum = xxh3_64(&b[idx_off..idx_off + 40]);
        let rec = 56 + 32 + 24;
        b[rec..rec + 8].copy_from_slice(&sum.to_le_bytes());
        patch_header(&mut b, 0, MAGIC);
        expect_err(&b, "vertex id 99");
    }

    /// `tiny` with an edge split: the 5-cycle is the training graph, three chords
    /// are held out, with fixed negatives.
    pub(crate) fn tiny_link() -> Dataset {
        let mut ds = tiny();
        ds.name = "tiny link".into();
        ds.edges = Some(EdgeSplit {
            train: EdgeList::new(vec![0, 1, 2, 3, 0], vec![1, 2, 3, 4, 4]),
            val: EdgeList::new(vec![0], vec![2]),
            test: EdgeList::new(vec![1, 2], vec![3, 4]),
            val_neg: Some(vec![3, 4].into()),
            test_neg: Some(vec![0, 0].into()),
            symmetric: true,
        });
        ds.validate().unwrap();
        ds
    }

    fn bytes_of(ds: &Dataset) -> Vec<u8> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.tds");
        write_dataset(&p, ds).unwrap();
        std::fs::read(&p).unwrap()
    }

    fn header_u32(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn node_datasets_stay_version_1_and_edge_splits_are_version_2() {
        let v1 = tiny_bytes();
        assert_eq!((header_u32(&v1, 8), header_u32(&v1, 48)), (1, 7));
        assert_eq!(header_u32(&v1, 12) as usize, 56 + 7 * 32 + 4 + 8);
        // The first section follows the header at the first page boundary.
        assert_eq!(u64::from_le_bytes(v1[64..72].try_into().unwrap()), 4096);
        let v2 = bytes_of(&tiny_link());
        assert_eq!((header_u32(&v2, 8), header_u32(&v2, 48)), (2, 15));
        assert_eq!(header_u32(&v2, 56), FLAG_SYMMETRIC);
        let sizes: Vec<u64> = (0..3)
            .map(|i| u64::from_le_bytes(v2[64 + 8 * i..72 + 8 * i].try_into().unwrap()))
            .collect();
        assert_eq!(sizes, [5, 1, 2]);
        assert_eq!((header_u32(&v2, 88), header_u32(&v2, 92)), (2, 1));
    }

    #[test]
    fn edge_split_round_trips_bit_for_bit_and_maps() {
        let d = tempfile::tempdir().unwrap();
        for ds in [tiny_link(), {
            let mut ds = tiny_link();
            let e = ds.edges.as_mut().unwrap();
            (e.val_neg, e.test_neg, e.symmetric) = (None, None, false);
            // Directed: the graph holds the training edges one way only.
            ds.graph = CsrGraph::from_edges(
                5,
                &e.train.iter().collect::<Vec<_>>(),
                BuildOptions::DIRECTED,
            )
            .unwrap();
            ds
        }] {
            let p = d.path().join("a.tds");
            write_dataset(&p, &ds).unwrap();
            let back = open_dataset(&p, Verify::Full).unwrap();
            assert_eq!(back, ds);
            let e = back.edges.as_ref().unwrap();
            assert!(e.train.src.is_mapped() && e.test.dst.is_mapped());
            assert!(e.val_neg.as_ref().is_none_or(|a| a.is_mapped()));
            // Writing what was read gives the same bytes.
            let q = d.path().join("b.tds");
            write_dataset(&q, &back).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), std::fs::read(&q).unwrap());
        }
    }

    #[test]
    fn bad_edge_sections_give_named_errors() {
        let good = bytes_of(&tiny_link());
        let record = |k: usize| 96 + k * 32;
        let offset = |b: &[u8], k: usize| {
            u64::from_le_bytes(b[record(k) + 8..record(k) + 16].try_into().unwrap()) as usize
        };
        // A flipped id in the validation sources.
        let mut b = good.clone();
        b[offset(&good, 9)] ^= 1;
        expect_err(&b, "section edges.val.src checksum mismatch");
        // Header sizes that disagree with the sections.
        let mut b = good.clone();
        patch_header(&mut b, 72, &2u64.to_le_bytes());
        expect_err(&b, "section edges.val.src is 4 bytes, expected 8");
        let mut b = good.clone();
        patch_header(&mut b, 56, &2u32.to_le_bytes());
        expect_err(&b, "edge split flags 0x2");
        // A test edge that is a training edge, with valid checksums.
        let mut b = good.clone();
        let at = offset(&good, 12);
        b[at..at + 4].copy_from_slice(&2u32.to_le_bytes());
        let sum = xxh3_64(&b[at..at + 8]);
        b[record(12) + 24..record(12) + 32].copy_from_slice(&sum.to_le_bytes());
        patch_header(&mut b, 0, MAGIC);
        expect_err(
            &b,
            "edges.test[0]: (1, 2) is also training edge edges.train[1]",
        );
        // Version 3 is refused by name.
        let mut b = good;
        patch_header(&mut b, 8, &3u32.to_le_bytes());
        expect_err(&b, "format version 3, this build reads versions 1 to 2");
    }

    #[test]
    fn writer_refuses_invalid_dataset_and_leaves_no_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.tds");
        let mut ds = tiny();
        ds.labels = vec![0, 1, 5, 0, 1].into();
        assert!(write_dataset(&p, &ds).is_err());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
