//! WordNet 3.0 as a node-classification dataset: synsets are vertices, pointers
//! are edges, the lexicographer file is the label and the gloss gives the features.
//!
//! # Input format (`wndb(5WN)`)
//!
//! [`import_wordnet`] reads `data.noun`, `data.verb`, `data.adj` and `data.adv` from
//! one directory (Debian's `wordnet-base` installs them in `/usr/share/wordnet`).
//! Each file starts with license lines that begin with two spaces; every other line
//! is one synset:
//!
//! ```text
//! synset_offset lex_filenum ss_type w_cnt word lex_id [word lex_id...] p_cnt
//!     [ptr_symbol synset_offset pos source/target...] [frames] | gloss
//! ```
//!
//! | field            | form                                                  |
//! |------------------|-------------------------------------------------------|
//! | `synset_offset`  | 8-digit decimal; the synset's key within its file     |
//! | `lex_filenum`    | 2-digit decimal, 0..=44: the **label**                |
//! | `ss_type`        | `n`, `v`, `a`, `s` (adjective satellite) or `r`; must match the file |
//! | `w_cnt`          | 2-digit **hexadecimal** word count, then that many `word lex_id` pairs (`lex_id` 1 hex digit) |
//! | `p_cnt`          | 3-digit decimal pointer count, then that many pointers |
//! | pointer          | symbol, 8-digit target offset, target `pos` (`n`/`v`/`a`/`s`/`r`; `s` lives in `data.adj`), 4 hex digits source/target |
//! | frames           | `data.verb` only: 2-digit decimal `f_cnt`, then `+ f_num w_num` triples |
//! | gloss            | everything after the first `|`                        |
//!
//! In the real files `synset_offset` is the line's byte offset; the importer only
//! uses it as a key (unique per file, looked up by pointers), so hand-written files
//! may use small numbers. Empty lines are skipped; `\r\n` line ends are accepted.
//!
//! # What comes out
//!
//! 1. Vertices: the synsets of the noun, verb, adjective and adverb files in that
//!    order, each file's synsets sorted by offset. Deterministic.
//! 2. Edges: one per pointer (all symbols, lexical and semantic alike), then
//!    symmetrized, deduplicated and stripped of self-loops
//!    ([`BuildOptions::UNDIRECTED`]).
//! 3. Labels: `lex_filenum`, [`NUM_CLASSES`] = 45 classes (`noun.Tops` = 3,
//!    `verb.motion` = 38, …).
//! 4. Features: a binary bag of words of the glosses, `feature_dim` columns; see
//!    below.
//! 5. Split: [`SplitSpec::apply`] on the labels with the options' seed.
//!
//! # Tokenization and vocabulary
//!
//! - The whole gloss (definition and quoted examples) is lowercased and cut into
//!   maximal runs of ASCII letters; every other byte separates tokens. So an
//!   apostrophe splits `someone's` into `someone` and `s`, and a hyphen splits
//!   `well-known`. Single letters are tokens like any other.
//! - Every maximal run of ASCII digits becomes the one token `0`: "(1809-1865)" and
//!   "in 1066" both contribute `0`. Numbers mark the glosses of people (life dates),
//!   times and quantities; single numbers would be too rare to enter the vocabulary.
//! - No stop words are dropped. In WordNet the function words carry the part of
//!   speech, which the labels follow: `of` is in 53% of noun glosses but 21% of verb
//!   and 15% of adverb ones, `in` in 61% of adverb glosses and 18-25% of the others,
//!   `he` in 23% of adverb and 7% of verb glosses (their examples) but 2% of noun
//!   ones. Test accuracy of softmax regression on the features alone (WordNet 3.0,
//!   2,000 columns, 100 training vertices per class, split seed 0): all tokens
//!   0.433 (a nearest class centroid: 0.286); without single letters 0.426; without single letters and ~110 English
//!   stop words 0.383, with 4,265 instead of 1,195 all-zero rows; without the
//!   number token 0.430.
//! - The vocabulary is the `feature_dim` tokens with the highest document frequency
//!   (number of glosses containing them), ties broken by byte order; column `j` is
//!   the `j`-th token in that order. Row `v` has 1.0 in the columns of the tokens its
//!   gloss contains, 0.0 elsewhere. If there are fewer distinct tokens than
//!   `feature_dim`, the last columns are all zero.
//!
//! # Errors
//!
//! A missing or unreadable file is [`Error::Io`] naming it. A bad line is
//! [`Error::Parse`] with the file, the 1-based line number (license lines counted)
//! and what was expected: a malformed number or hex count, `lex_filenum` above 44,
//! an `ss_type` or pointer `pos` that is unknown or does not fit the file, a line
//! that ends early, a missing `|`, a repeated synset offset, or a pointer to an
//! offset that is no synset of the target file.
//!
//! # Cost
//!
//! The features are dense `f32`: 117,659 × 2,000 × 4 bytes = 941 MB at the defaults,
//! which dominates the memory and much of the time of an import.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use cpu_ops::{BuildOptions, CsrGraph, FeatureMatrix};

use crate::data::dataset::{Amount, Dataset, SplitSpec};
use crate::error::{Error, Result};
use crate::progress::{Meter, NoProgress, Progress};

/// Number of classes: WordNet 3.0 has 45 lexicographer files, numbered 0..=44.
pub const NUM_CLASSES: u32 = 45;

/// The token every run of digits becomes.
const NUMBER_TOKEN: &[u8] = b"0";

/// Options of [`import_wordnet`].
#[derive(Clone, Debug, PartialEq)]
pub struct WordNetOptions {
    /// Directory holding `data.noun`, `data.verb`, `data.adj` and `data.adv`.
    pub dir: PathBuf,
    /// Number of feature columns (vocabulary size); at least 1.
    pub feature_dim: usize,
    /// Train/validation/test split.
    pub split: SplitSpec,
    /// Seed of the split.
    pub seed: u64,
}

impl Default for WordNetOptions {
    /// `/usr/share/wordnet`, 2000 features, split `100/class,0.1,rest`, seed 0.
    fn default() -> Self {
        Self {
            dir: PathBuf::from("/usr/share/wordnet"),
            feature_dim: 2000,
            split: SplitSpec {
                train: Amount::PerClass(100),
                val: Amount::Fraction(0.1),
                test: Amount::Rest,
            },
            seed: 0,
        }
    }
}

/// One data file: its name, the `ss_type`s it may hold, whether lines carry frames.
struct DataFile {
    name: &'static str,
    ss_types: &'static [u8],
    frames: bool,
}

/// The four files in vertex order.
const DATA_FILES: [DataFile; 4] = [
    DataFile {
        name: "data.noun",
        ss_types: b"n",
        frames: false,
    },
    DataFile {
        name: "data.verb",
        ss_types: b"v",
        frames: true,
    },
    DataFile {
        name: "data.adj",
        ss_types: b"as",
        frames: false,
    },
    DataFile {
        name: "data.adv",
        ss_types: b"r",
        frames: false,
    },
];

/// Index into [`DATA_FILES`] of the file holding synsets of pointer `pos`.
fn file_of_pos(pos: u8) -> Option<usize> {
    match pos {
        b'n' => Some(0),
        b'v' => Some(1),
        b'a' | b's' => Some(2),
        b'r' => Some(3),
        _ => None,
    }
}

/// Imports WordNet from `opts.dir` (see the module documentation for the format,
/// the graph and the features) and draws the split.
///
/// Errors: [`Error::Io`] for a missing or unreadable file, [`Error::Parse`] for a
/// bad line, [`Error::InvalidArgument`] for `feature_dim` 0 or too large, and the
/// errors of [`SplitSpec::apply`].
pub fn import_wordnet(opts: &WordNetOptions) -> Result<Dataset> {
    import_wordnet_with(opts, &NoProgress)
}

/// [`import_wordnet`], reporting to `progress` the phases `"reading"` (bytes of
/// the four data files, after each), `"parsing"` (files), `"graph"` and
/// `"features"` (one unit each).
pub fn import_wordnet_with(opts: &WordNetOptions, progress: &dyn Progress) -> Result<Dataset> {
    if opts.feature_dim == 0 {
        return Err(Error::invalid_argument("feature_dim", "must be at least 1"));
    }
    let paths: Vec<PathBuf> = DATA_FILES.iter().map(|f| opts.dir.join(f.name)).collect();
    let sizes: Vec<u64> = paths
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .map(|m| m.len())
                .map_err(|e| Error::io(p, e))
        })
        .collect::<Result<_>>()?;
    let reading = Meter::new(progress, "reading", sizes.iter().sum());
    let contents: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| {
            let c = std::fs::read(p).map_err(|e| Error::io(p, e))?;
            reading.add(c.len() as u64);
            Ok(c)
        })
        .collect::<Result<_>>()?;
    reading.finish();
    let parsing = Meter::new(progress, "parsing", DATA_FILES.len() as u64);
    let parsed: Vec<ParsedFile<'_>> = (0..DATA_FILES.len())
        .map(|k| {
            let f = parse_file(&paths[k], &DATA_FILES[k], &contents[k]);
            parsing.add(1);
            f
        })
        .collect::<Result<_>>()?;
    parsing.finish();
    let building = Meter::new(progress, "graph", 1);

    // Vertex ids: files in order, each sorted by offset (done by `parse_file`).
    let mut base = vec![0usize; parsed.len() + 1];
    for (k, f) in parsed.iter().enumerate() {
        base[k + 1] = base[k] + f.synsets.len();
    }
    let n = base[parsed.len()];
    if n > u32::MAX as usize {
        return Err(Error::format(
            &opts.dir,
            format!("{n} synsets do not fit u32 vertex ids"),
        ));
    }

    let num_pointers: usize = parsed.iter().map(|f| f.pointers.len()).sum();
    let mut edges: Vec<(u32, u32)> = Vec::with_capacity(num_pointers);
    for (k, f) in parsed.iter().enumerate() {
        for (i, s) in f.synsets.iter().enumerate() {
            let src = (base[k] + i) as u32;
            for p in &f.pointers[s.pointers.clone()] {
                let t = p.file as usize;
                let j = parsed[t]
                    .synsets
                    .binary_search_by_key(&p.offset, |s| s.offset)
                    .map_err(|_| {
                        Error::parse(
                            &paths[k],
                            s.line,
                            format!(
                                "pointer to {} {:08}: {} has no synset at offset {:08}",
                                p.pos as char, p.offset, DATA_FILES[t].name, p.offset
                            ),
                        )
                    })?;
                edges.push((src, (base[t] + j) as u32));
            }
        }
    }
    let graph = CsrGraph::from_edges(n, &edges, BuildOptions::UNDIRECTED)
        .map_err(|e| Error::cpu_ops("WordNet pointers", e))?;
    drop(edges);
    building.finish();
    let featuring = Meter::new(progress, "features", 1);

    let synsets = || parsed.iter().flat_map(|f| f.synsets.iter());
    let labels: Vec<u32> = synsets().map(|s| s.label as u32).collect();
    let glosses: Vec<&[u8]> = synsets().map(|s| s.gloss).collect();
    let (_vocab, values) = gloss_features(&glosses, opts.feature_dim)?;
    let features = FeatureMatrix::new(values.into(), n, opts.feature_dim)
        .map_err(|e| Error::cpu_ops("WordNet features", e))?;

    featuring.finish();
    let masks = opts.split.apply(&labels, NUM_CLASSES, opts.seed)?;
    Dataset::from_parts(
        "wordnet".into(),
        graph,
        features,
        labels,
        NUM_CLASSES,
        masks,
    )
}

/// One synset line, borrowing its gloss from the file contents.
struct Synset<'a> {
    offset: u32,
    label: u8,
    /// 1-based line number.
    line: u64,
    /// Its pointers: `ParsedFile::pointers[start..end]`.
    pointers: Range<usize>,
    gloss: &'a [u8],
}

/// A pointer, not yet resolved to a vertex id.
struct Pointer {
    /// Index into [`DATA_FILES`] of the target.
    file: u8,
    /// The `pos` character as written.
    pos: u8,
    offset: u32,
}

/// The synsets of one file, sorted by offset, and their pointers.
struct ParsedFile<'a> {
    synsets: Vec<Synset<'a>>,
    pointers: Vec<Pointer>,
}

/// Parses one data file; `path` is for messages only.
fn parse_file<'a>(path: &Path, file: &DataFile, bytes: &'a [u8]) -> Result<ParsedFile<'a>> {
    let mut out = ParsedFile {
        synsets: Vec::new(),
        pointers: Vec::new(),
    };
    let mut fields: Vec<&'a [u8]> = Vec::new();
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        if line.is_empty() || line.starts_with(b"  ") {
            continue;
        }
        let s = parse_line(
            path,
            i as u64 + 1,
            file,
            line,
            &mut fields,
            &mut out.pointers,
        )?;
        out.synsets.push(s);
    }
    out.synsets.sort_by_key(|s| s.offset);
    if let Some(w) = out.synsets.windows(2).find(|w| w[0].offset == w[1].offset) {
        let (first, again) = if w[0].line < w[1].line {
            (&w[0], &w[1])
        } else {
            (&w[1], &w[0])
        };
        return Err(Error::parse(
            path,
            again.line,
            format!(
                "synset offset {:08} repeats the synset of line {}; expected unique offsets",
                again.offset, first.line
            ),
        ));
    }
    Ok(out)
}

/// Parses one synset line, appending its pointers to `pointers`.
fn parse_line<'a>(
    path: &Path,
    line_no: u64,
    file: &DataFile,
    line: &'a [u8],
    fields: &mut Vec<&'a [u8]>,
    pointers: &mut Vec<Pointer>,
) -> Result<Synset<'a>> {
    let (head, gloss) = match line.iter().position(|&b| b == b'|') {
        Some(bar) => (&line[..bar], Some(&line[bar + 1..])),
        None => (line, None),
    };
    fields.clear();
    fields.extend(
        head.split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty()),
    );
    let mut c = Fields {
        path,
        line: line_no,
        fields,
        next: 0,
        has_bar: gloss.is_some(),
    };

    let offset = c.decimal(8, "the synset offset")?;
    let label = c.decimal(2, "lex_filenum")?;
    if label >= NUM_CLASSES {
        return Err(c.error(format!(
            "lex_filenum {label} is out of range; expected 0..={}",
            NUM_CLASSES - 1
        )));
    }
    let ss_type = c.next("ss_type")?;
    if ss_type.len() != 1 || !file.ss_types.contains(&ss_type[0]) {
        return Err(c.error(format!(
            "ss_type `{}` does not belong in {}; expected {}",
            String::from_utf8_lossy(ss_type),
            file.name,
            one_of(file.ss_types)
        )));
    }
    let w_cnt = c.hex(2, "w_cnt")?;
    for _ in 0..w_cnt {
        c.next("a word")?;
        c.hex(1, "the word's lex_id")?;
    }
    let p_cnt = c.decimal(3, "p_cnt")?;
    let start = pointers.len();
    for _ in 0..p_cnt {
        c.next("a pointer symbol")?;
        let offset = c.decimal(8, "the pointer's synset offset")?;
        let pos = c.next("the pointer's pos")?;
        let file = match pos {
            [p] => file_of_pos(*p),
            _ => None,
        };
        let Some(file) = file else {
            return Err(c.error(format!(
                "unknown pointer pos `{}`; expected one of n, v, a, s, r",
                String::from_utf8_lossy(pos)
            )));
        };
        c.hex(4, "the pointer's source/target")?;
        pointers.push(Pointer {
            file: file as u8,
            pos: pos[0],
            offset,
        });
    }
    let end = pointers.len();
    if file.frames {
        let f_cnt = c.decimal(2, "f_cnt (verb frame count)")?;
        for _ in 0..f_cnt {
            let plus = c.next("`+` of a verb frame")?;
            if plus != b"+" {
                return Err(c.error(format!(
                    "expected `+` of a verb frame, found `{}`",
                    String::from_utf8_lossy(plus)
                )));
            }
            c.decimal(2, "the frame's f_num")?;
            c.hex(2, "the frame's w_num")?;
        }
    }
    if let Some(extra) = c.fields.get(c.next) {
        return Err(c.error(format!(
            "unexpected field `{}` after the {}; expected `|` and the gloss",
            String::from_utf8_lossy(extra),
            if file.frames { "frames" } else { "pointers" }
        )));
    }
    let Some(gloss) = gloss else {
        return Err(c.error("missing `|` and the gloss at the end of the synset"));
    };
    Ok(Synset {
        offset,
        label: label as u8,
        line: line_no,
        pointers: start..end,
        gloss,
    })
}

/// `a or s`, `n`, … for messages.
fn one_of(chars: &[u8]) -> String {
    chars
        .iter()
        .map(|&c| format!("`{}`", c as char))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// A cursor over the whitespace-separated fields before the `|` of one line.
struct Fields<'p, 'f, 'a> {
    path: &'p Path,
    line: u64,
    fields: &'f [&'a [u8]],
    next: usize,
    has_bar: bool,
}

impl<'a> Fields<'_, '_, 'a> {
    fn error(&self, what: impl Into<String>) -> Error {
        Error::parse(self.path, self.line, what)
    }

    /// The next field; `what` names it for the message when the line ends early.
    fn next(&mut self, what: &str) -> Result<&'a [u8]> {
        match self.fields.get(self.next) {
            Some(f) => {
                self.next += 1;
                Ok(f)
            }
            None if self.has_bar => Err(self.error(format!(
                "truncated synset: `|` comes where {what} was expected"
            ))),
            None => Err(self.error(format!("truncated line: it ends where {what} was expected"))),
        }
    }

    /// The next field as a `digits`-digit number in `radix`.
    fn number(&mut self, digits: usize, radix: u32, what: &str) -> Result<u32> {
        let f = self.next(what)?;
        let ok = f.len() == digits && f.iter().all(|&b| (b as char).is_digit(radix));
        // `digits` is at most 8, so the value fits u32.
        let value = ok.then(|| {
            f.iter().fold(0u32, |v, &b| {
                v * radix + (b as char).to_digit(radix).unwrap_or(0)
            })
        });
        value.ok_or_else(|| {
            self.error(format!(
                "expected {what} as {digits} {} digit{}, found `{}`",
                if radix == 16 {
                    "hexadecimal"
                } else {
                    "decimal"
                },
                if digits == 1 { "" } else { "s" },
                String::from_utf8_lossy(f)
            ))
        })
    }

    fn decimal(&mut self, digits: usize, what: &str) -> Result<u32> {
        self.number(digits, 10, what)
    }

    fn hex(&mut self, digits: usize, what: &str) -> Result<u32> {
        self.number(digits, 16, what)
    }
}

/// Calls `f` with each token of `text` (see the module doc): lowercase runs of ASCII
/// letters, and [`NUMBER_TOKEN`] for each run of digits.
fn for_each_token(text: &[u8], mut f: impl FnMut(&[u8])) {
    let mut word: Vec<u8> = Vec::with_capacity(32);
    let mut in_number = false;
    for &b in text {
        if b.is_ascii_alphabetic() {
            word.push(b.to_ascii_lowercase());
            in_number = false;
            continue;
        }
        if !word.is_empty() {
            f(&word);
            word.clear();
        }
        if b.is_ascii_digit() {
            if !in_number {
                f(NUMBER_TOKEN);
            }
            in_number = true;
        } else {
            in_number = false;
        }
    }
    if !word.is_empty() {
        f(&word);
    }
}

/// The binary bag-of-words matrix (`glosses.len() × dim`, row-major) and its
/// vocabulary (column `j` is `vocab[j]`).
fn gloss_features(glosses: &[&[u8]], dim: usize) -> Result<(Vec<Vec<u8>>, Vec<f32>)> {
    // 1. Intern tokens; each document keeps its distinct token ids.
    let mut ids: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut tokens: Vec<Vec<u8>> = Vec::new();
    let mut doc_tokens: Vec<u32> = Vec::new();
    let mut doc_start: Vec<usize> = Vec::with_capacity(glosses.len() + 1);
    doc_start.push(0);
    for gloss in glosses {
        let from = doc_tokens.len();
        for_each_token(gloss, |t| {
            let id = match ids.get(t) {
                Some(&id) => id,
                None => {
                    let id = tokens.len() as u32;
                    ids.insert(t.to_vec(), id);
                    tokens.push(t.to_vec());
                    id
                }
            };
            doc_tokens.push(id);
        });
        doc_tokens[from..].sort_unstable();
        let mut keep = from;
        for r in from..doc_tokens.len() {
            if r == from || doc_tokens[r] != doc_tokens[keep - 1] {
                doc_tokens[keep] = doc_tokens[r];
                keep += 1;
            }
        }
        doc_tokens.truncate(keep);
        doc_start.push(keep);
    }
    drop(ids);

    // 2. Document frequencies; the vocabulary is the `dim` most frequent tokens,
    //    ties broken by byte order.
    let mut df = vec![0u32; tokens.len()];
    for &id in &doc_tokens {
        df[id as usize] += 1;
    }
    let mut order: Vec<u32> = (0..tokens.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| {
        df[b as usize]
            .cmp(&df[a as usize])
            .then_with(|| tokens[a as usize].cmp(&tokens[b as usize]))
    });
    order.truncate(dim);
    let mut column = vec![u32::MAX; tokens.len()];
    for (j, &id) in order.iter().enumerate() {
        column[id as usize] = j as u32;
    }

    // 3. The dense matrix.
    let too_large = || {
        Error::invalid_argument(
            "feature_dim",
            format!(
                "{} rows × {dim} features do not fit in memory",
                glosses.len()
            ),
        )
    };
    let len = glosses
        .len()
        .checked_mul(dim)
        .filter(|&l| l <= isize::MAX as usize / 4)
        .ok_or_else(too_large)?;
    let mut values: Vec<f32> = Vec::new();
    values.try_reserve_exact(len).map_err(|_| too_large())?;
    values.resize(len, 0.0);
    for (v, row) in values.chunks_exact_mut(dim).enumerate() {
        for &id in &doc_tokens[doc_start[v]..doc_start[v + 1]] {
            let j = column[id as usize];
            if j != u32::MAX {
                row[j as usize] = 1.0;
            }
        }
    }
    let vocab = order
        .iter()
        .map(|&id| tokens[id as usize].clone())
        .collect();
    Ok((vocab, values))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    const NOUN: &str = concat!(
        "  1 This is a license line; it may hold | and 0123 digits.  \n",
        "  2 Another license line.  \n",
        "00000100 03 n 01 entity 0 002 ~ 00000200 n 0000 ~ 00000200 n 0000 ",
        "| that which is perceived; \"the entity exists\"  \n",
        "00000300 17 n 01 rock 0 000 | a solid mineral from 1850 to 1900  \n",
        "00000200 05 n 02 animal 0 beast 0 003 @ 00000100 n 0000 @ 00000200 n 0000 ",
        "+ 00000050 v 0101 | a living organism that can move  \n",
    );
    const VERB: &str = concat!(
        "  1 license  \n",
        "00000050 38 v 01 move 0 001 + 00000200 n 0101 02 + 01 00 + 08 01 ",
        "| change location; \"the animal can move\"  \n",
    );
    const ADJ: &str = concat!(
        "  1 license  \n",
        "00000010 00 a 01 big 0 001 & 00000020 s 0000 | above average in size  \n",
        "00000020 00 s 01 huge(a) 0 001 & 00000010 a 0000 | extremely big  \n",
    );
    const ADV: &str = concat!(
        "  1 license  \n",
        "00000007 02 r 01 quickly 0 001 \\ 00000010 a 0101 | with speed; \"it's 2 fast\"  \n",
    );

    /// Rewrites the text of one fixture file.
    type Edit<'a> = (&'a str, &'a dyn Fn(&str) -> String);

    /// Writes the tiny WordNet, with `edit` applied to the named file's text.
    fn fixture(edit: Option<Edit<'_>>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("data.noun", NOUN),
            ("data.verb", VERB),
            ("data.adj", ADJ),
            ("data.adv", ADV),
        ] {
            let text = match edit {
                Some((n, f)) if n == name => f(text),
                _ => text.to_string(),
            };
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    fn options(dir: &Path, feature_dim: usize) -> WordNetOptions {
        WordNetOptions {
            dir: dir.to_path_buf(),
            feature_dim,
            split: "1/class,0,rest".parse().unwrap(),
            seed: 7,
        }
    }

    /// Imports the fixture with `from` replaced by `to` in `file`; expects a parse
    /// error and returns (file name, line, message).
    fn parse_error(file: &str, from: &str, to: &str) -> (String, u64, String) {
        let dir = fixture(Some((file, &|t: &str| {
            assert!(t.contains(from), "fixture {file} lacks `{from}`");
            t.replacen(from, to, 1)
        })));
        match import_wordnet(&options(dir.path(), 8)) {
            Err(Error::Parse { path, line, what }) => {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, line, what)
            }
            other => panic!("expected a parse error, got {other:?}"),
        }
    }

    fn assert_parse_error(file: &str, from: &str, to: &str, line: u64, needle: &str) {
        let (name, l, what) = parse_error(file, from, to);
        assert_eq!((name.as_str(), l), (file, line), "{what}");
        assert!(what.contains(needle), "`{what}` should mention `{needle}`");
    }

    #[test]
    fn wordnet_tiny_graph_labels_and_order() {
        let dir = fixture(None);
        let ds = import_wordnet(&options(dir.path(), 8)).unwrap();
        assert_eq!(ds.name, "wordnet");
        assert_eq!(ds.num_classes, 45);
        // noun 100, 200, 300 (sorted though 300 comes first in the file), verb 50,
        // adj 10, 20 (satellite), adv 7.
        assert_eq!(ds.labels.as_slice(), &[3, 5, 17, 38, 0, 0, 2]);
        // Pointers: 100→200 twice, 200→100, 200→200 (self), 200→v50, v50→200,
        // a10→s20 (pos `s`), s20→a10, r7→a10.
        let rows: Vec<Vec<u32>> = (0..7).map(|v| ds.graph.neighbors(v).to_vec()).collect();
        assert_eq!(
            rows,
            vec![
                vec![1],
                vec![0, 3],
                vec![],
                vec![1],
                vec![5, 6],
                vec![4],
                vec![4]
            ]
        );
        assert_eq!(ds.graph.num_edges(), 8);
        ds.validate().unwrap();
    }

    #[test]
    fn wordnet_import_reports_its_phases() {
        let dir = fixture(None);
        let rec = crate::progress::testing::Recorder::default();
        let ds = import_wordnet_with(&options(dir.path(), 8), &rec).unwrap();
        assert_eq!(ds, import_wordnet(&options(dir.path(), 8)).unwrap());
        let bytes = (NOUN.len() + VERB.len() + ADJ.len() + ADV.len()) as u64;
        assert_eq!(
            rec.check(),
            vec![
                ("reading".to_string(), bytes),
                ("parsing".to_string(), 4),
                ("graph".to_string(), 1),
                ("features".to_string(), 1),
            ]
        );
    }

    #[test]
    fn wordnet_tiny_features() {
        let dir = fixture(None);
        let ds = import_wordnet(&options(dir.path(), 8)).unwrap();
        // Document frequency 2: 0 (numbers), a, can, move, that, the; then the
        // frequency-1 tokens alphabetically: above, animal, ...
        let vocab = ["0", "a", "can", "move", "that", "the", "above", "animal"];
        let expect: [&[&str]; 7] = [
            &["that", "the"],                  // that which is perceived; "the entity exists"
            &["a", "can", "move", "that"],     // a living organism that can move
            &["0", "a"],                       // a solid mineral from 1850 to 1900
            &["animal", "can", "move", "the"], // change location; "the animal can move"
            &["above"],                        // above average in size
            &[],                               // extremely big
            &["0"],                            // with speed; "it's 2 fast"
        ];
        assert_eq!(ds.features.dim(), 8);
        for (v, words) in expect.iter().enumerate() {
            let want: Vec<f32> = vocab
                .iter()
                .map(|w| words.contains(w) as u8 as f32)
                .collect();
            assert_eq!(ds.features.row(v), &want[..], "row {v}");
        }
    }

    #[test]
    fn wordnet_vocabulary_ties_and_spare_columns() {
        let glosses: [&[u8]; 3] = [b"b a a", b"c b", b"B-52 d'e"];
        let (vocab, values) = gloss_features(&glosses, 7).unwrap();
        let vocab: Vec<&[u8]> = vocab.iter().map(|t| &t[..]).collect();
        let want: [&[u8]; 6] = [b"b", b"0", b"a", b"c", b"d", b"e"];
        assert_eq!(vocab, want);
        #[rustfmt::skip]
        assert_eq!(values, [
            1., 0., 1., 0., 0., 0., 0.,
            1., 0., 0., 1., 0., 0., 0.,
            1., 1., 0., 0., 1., 1., 0.,
        ]);
    }

    #[test]
    fn wordnet_tokens() {
        let mut got = Vec::new();
        for_each_token(b"Someone's well-known (1809-1865) ABC3d x\xc3\xa9y", |t| {
            got.push(String::from_utf8(t.to_vec()).unwrap())
        });
        let want = [
            "someone", "s", "well", "known", "0", "0", "abc", "0", "d", "x", "y",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn wordnet_split_and_determinism() {
        let dir = fixture(None);
        let a = import_wordnet(&options(dir.path(), 8)).unwrap();
        let b = import_wordnet(&options(dir.path(), 8)).unwrap();
        assert_eq!(a, b);
        // One training vertex per class present: classes 0 (two), 2, 3, 5, 17, 38.
        assert_eq!(a.train_ids().len(), 6);
        assert!(a.val_ids().is_empty());
        assert_eq!(a.test_ids().len(), 1);
        let [tr, va, te] = options(dir.path(), 8)
            .split
            .apply(a.labels.as_slice(), 45, 7)
            .unwrap();
        assert_eq!(
            (
                a.train_mask.as_slice(),
                a.val_mask.as_slice(),
                a.test_mask.as_slice()
            ),
            (&tr[..], &va[..], &te[..])
        );
    }

    #[test]
    fn wordnet_crlf_and_empty_lines_accepted() {
        let dir = fixture(Some(("data.adj", &|t: &str| {
            t.replace('\n', "\r\n") + "\r\n"
        })));
        let ds = import_wordnet(&options(dir.path(), 8)).unwrap();
        assert_eq!(ds.num_vertices(), 7);
        assert_eq!(ds.graph.neighbors(5), &[4]);
    }

    #[test]
    fn wordnet_bad_numbers() {
        assert_parse_error("data.noun", "03 n 01 entity", "03 n 0g entity", 3, "w_cnt");
        assert_parse_error("data.noun", "00000100 03", "0000100 03", 3, "synset offset");
        assert_parse_error(
            "data.noun",
            "00000100 03",
            "00000100 45",
            3,
            "lex_filenum 45",
        );
        assert_parse_error("data.noun", "entity 0 002", "entity 0 2", 3, "p_cnt");
        assert_parse_error("data.noun", "entity 0 002", "entity x 002", 3, "lex_id");
        assert_parse_error("data.adv", "0101 |", "01z1 |", 2, "source/target");
        assert_parse_error("data.verb", "+ 08 01", "+ 08 1", 2, "w_num");
    }

    #[test]
    fn wordnet_bad_pointers() {
        // An offset that is no synset of the target file.
        let (file, line, what) = parse_error("data.noun", "@ 00000100 n", "@ 00000999 n");
        assert_eq!((file.as_str(), line), ("data.noun", 5));
        assert!(
            what.contains("00000999") && what.contains("data.noun"),
            "{what}"
        );
        // A synset that exists, but in another file than `pos` names.
        let (file, line, what) = parse_error("data.adv", "00000010 a", "00000010 r");
        assert_eq!((file.as_str(), line), ("data.adv", 2));
        assert!(what.contains("data.adv has no synset"), "{what}");
        assert_parse_error(
            "data.noun",
            "@ 00000100 n",
            "@ 00000100 x",
            5,
            "unknown pointer pos `x`",
        );
    }

    #[test]
    fn wordnet_truncated_and_missing_bar() {
        // Ends in the middle of a pointer.
        assert_parse_error(
            "data.noun",
            "@ 00000200 n 0000 + 00000050 v 0101 | a living organism that can move",
            "@",
            5,
            "truncated line: it ends where the pointer's synset offset",
        );
        // `|` before all words are there.
        assert_parse_error(
            "data.noun",
            "animal 0 beast 0 003",
            "animal 0 | beast 0 003",
            5,
            "`|` comes where a word",
        );
        // All fields there, no gloss.
        assert_parse_error(
            "data.noun",
            "000 | a solid mineral from 1850 to 1900",
            "000",
            4,
            "missing `|`",
        );
        // Gloss text without the `|`.
        assert_parse_error(
            "data.noun",
            "000 | a solid",
            "000 a solid",
            4,
            "unexpected field `a` after the pointers; expected `|`",
        );
        // A verb without frames, and a frame without its `+`.
        assert_parse_error(
            "data.verb",
            "0101 02 + 01 00 + 08 01 |",
            "0101 |",
            2,
            "f_cnt",
        );
        assert_parse_error("data.verb", "+ 08 01", "08 01 01", 2, "`+`");
    }

    #[test]
    fn wordnet_bad_types_and_duplicates() {
        assert_parse_error(
            "data.verb",
            "38 v 01",
            "38 n 01",
            2,
            "`n` does not belong in data.verb",
        );
        assert_parse_error("data.noun", "03 n 01", "03 s 01", 3, "expected `n`");
        assert_parse_error("data.adj", "00 s 01", "00 q 01", 3, "expected `a` or `s`");
        // Offset 300 (line 4) reused by the synset on line 5.
        assert_parse_error(
            "data.noun",
            "00000200 05",
            "00000300 05",
            5,
            "repeats the synset of line 4",
        );
    }

    #[test]
    fn wordnet_missing_file_and_bad_options() {
        let dir = fixture(None);
        std::fs::remove_file(dir.path().join("data.adv")).unwrap();
        match import_wordnet(&options(dir.path(), 8)) {
            Err(e @ Error::Io { .. }) => {
                let Error::Io { path, .. } = &e else {
                    unreachable!()
                };
                assert_eq!(path, &dir.path().join("data.adv"));
                assert!(e.to_string().contains("data.adv"), "{e}");
            }
            other => panic!("expected an I/O error, got {other:?}"),
        }
        let dir = fixture(None);
        assert!(matches!(
            import_wordnet(&options(dir.path(), 0)),
            Err(Error::InvalidArgument { .. })
        ));
        let mut opts = options(dir.path(), 8);
        opts.split = "0.8,0.8,rest".parse().unwrap();
        assert!(matches!(
            import_wordnet(&opts),
            Err(Error::Dataset {
                problem: crate::DatasetProblem::Split { .. },
                ..
            })
        ));
    }

    /// Nearest class centroid (Euclidean) on the features alone: test accuracy.
    fn centroid_accuracy(ds: &Dataset) -> f64 {
        let (c, dim) = (ds.num_classes as usize, ds.features.dim());
        let mut centroid = vec![0f64; c * dim];
        let mut count = vec![0f64; c];
        for v in ds.train_ids() {
            let l = ds.labels[v as usize] as usize;
            count[l] += 1.0;
            for (s, &x) in centroid[l * dim..(l + 1) * dim]
                .iter_mut()
                .zip(ds.features.row(v as usize))
            {
                *s += x as f64;
            }
        }
        for (l, row) in centroid.chunks_exact_mut(dim).enumerate() {
            row.iter_mut().for_each(|s| *s /= count[l].max(1.0));
        }
        let norm: Vec<f64> = centroid
            .chunks_exact(dim)
            .map(|r| r.iter().map(|x| x * x).sum())
            .collect();
        let test = ds.test_ids();
        let mut nz = Vec::new();
        let correct = test
            .iter()
            .filter(|&&v| {
                nz.clear();
                let row = ds.features.row(v as usize);
                nz.extend((0..dim).filter(|&j| row[j] != 0.0));
                let score = |l: usize| {
                    norm[l] - 2.0 * nz.iter().map(|&j| centroid[l * dim + j]).sum::<f64>()
                };
                let best = (1..c).fold(0, |b, l| if score(l) < score(b) { l } else { b });
                best == ds.labels[v as usize] as usize
            })
            .count();
        correct as f64 / test.len() as f64
    }

    /// The real WordNet 3.0 of Debian's `wordnet-base`.
    #[test]
    fn wordnet_real_counts() {
        let opts = WordNetOptions::default();
        if !opts.dir.join("data.noun").exists() {
            let why = format!(
                "{} is missing (apt-get install wordnet-base)",
                opts.dir.join("data.noun").display()
            );
            if std::env::var("TANDEM_REQUIRE_WORDNET").as_deref() == Ok("1") {
                panic!("TANDEM_REQUIRE_WORDNET=1 but {why}");
            }
            eprintln!("skipping wordnet_real_counts: {why}");
            return;
        }
        let t = Instant::now();
        let ds = import_wordnet(&opts).unwrap();
        let secs = t.elapsed().as_secs_f64();
        let n = ds.num_vertices();
        let isolated = (0..n as u32).filter(|&v| ds.graph.degree(v) == 0).count();
        let acc = centroid_accuracy(&ds);
        eprintln!(
            "wordnet: imported in {secs:.2} s; {}; {isolated} isolated; \
             nearest-centroid test accuracy on features alone {acc:.3}",
            ds.summary()
        );
        assert_eq!(n, 117_659);
        assert_eq!(ds.graph.num_edges(), 367_578);
        assert_eq!(isolated, 1_009);
        assert_eq!(ds.num_classes, 45);
        let mut per_class = [0usize; 45];
        ds.labels.iter().for_each(|&l| per_class[l as usize] += 1);
        assert!(per_class.iter().all(|&k| k > 0), "{per_class:?}");
        assert_eq!(ds.features.dim(), 2000);
        let train_want: usize = per_class.iter().map(|&k| k.min(100)).sum();
        assert_eq!(ds.train_ids().len(), train_want);
        assert_eq!(ds.val_ids().len(), 11_766);
        // Vertex 0 is `entity` (offset 00001740, noun.Tops).
        assert_eq!(ds.labels[0], 3);
        assert!(acc > 0.2, "features look uninformative: {acc}");
    }
}
