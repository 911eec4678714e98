//! Stable-toolchain fuzzing smoke tests: thousands of seeded mutations of valid
//! inputs fed to every reader and parser. Each must return `Ok` or an error, never
//! panic. (The cargo-fuzz targets in `fuzz/` explore the same entry points with
//! coverage guidance where a nightly toolchain exists.)

use std::path::Path;

use cpu_ops::Rng;
use runtime::data::{generate_sbm, SbmOptions};
use runtime::data::{parse_dataset_bytes, write_dataset, Dataset, Verify};

fn small_dataset() -> Dataset {
    generate_sbm(&SbmOptions {
        num_vertices: 60,
        num_edges: 200,
        num_classes: 3,
        homophily: 0.8,
        feature_dim: 4,
        signal: 0.5,
        split: "0.5,0.2,rest".parse().expect("valid split"),
        seed: 1,
        ..SbmOptions::default()
    })
    .expect("generate")
}

/// Applies one random mutation: flip bits, overwrite a run, truncate, or insert.
pub fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    if bytes.is_empty() {
        bytes.push(rng.next_u32() as u8);
        return;
    }
    match rng.below(5) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(bytes.len() as u64) as usize;
                bytes[i] ^= 1 << rng.below(8);
            }
        }
        1 => {
            let i = rng.below(bytes.len() as u64) as usize;
            let k = (1 + rng.below(8) as usize).min(bytes.len() - i);
            for b in &mut bytes[i..i + k] {
                *b = rng.next_u32() as u8;
            }
        }
        2 => {
            let k = rng.below(bytes.len() as u64) as usize;
            bytes.truncate(k);
        }
        3 => {
            let i = rng.below(bytes.len() as u64 + 1) as usize;
            bytes.insert(i, rng.next_u32() as u8);
        }
        _ => {
            // Interesting integers at a random 8-byte-aligned spot (sizes, offsets).
            let vals = [0u64, 1, u32::MAX as u64, u64::MAX, 1 << 40, 4096];
            let i = (rng.below(bytes.len() as u64) as usize) & !7;
            let v = vals[rng.below(vals.len() as u64) as usize].to_le_bytes();
            let k = 8.min(bytes.len() - i);
            bytes[i..i + k].copy_from_slice(&v[..k]);
        }
    }
}

#[test]
fn dataset_reader_never_panics_on_mutations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("d.tds");
    write_dataset(&p, &small_dataset()).expect("write");
    let good = std::fs::read(&p).expect("read");
    let mut rng = Rng::new(42);
    let mut parsed = 0;
    for _ in 0..3000 {
        let mut b = good.clone();
        for _ in 0..1 + rng.below(3) {
            mutate(&mut rng, &mut b);
        }
        // The header checksum rejects most mutations; re-seal half of them so the
        // deeper checks (sizes, CSR, labels) see corrupt data too.
        if rng.below(2) == 0 && b.len() >= 16 {
            reseal_header(&mut b);
        }
        if parse_dataset_bytes(Path::new("m.tds"), &b, Verify::Full).is_ok() {
            parsed += 1;
        }
    }
    // Mutations in padding bytes are harmless, so some parse; most must not.
    assert!(parsed < 3000, "{parsed}");
}

/// Recomputes the header checksum over whatever the header now says.
fn reseal_header(b: &mut [u8]) {
    let hl = u32::from_le_bytes([b[12], b[13], b[14], b[15]]) as usize;
    if hl >= 8 && hl <= b.len() {
        let sum = xxh3(&b[..hl - 8]);
        b[hl - 8..hl].copy_from_slice(&sum.to_le_bytes());
    }
}

fn xxh3(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Mutates `seed_input` `iters` times and feeds each result to `parse` through a
/// file (the text parsers read paths).
fn mutate_through_file(seed_input: &[u8], iters: usize, seed: u64, mut parse: impl FnMut(&Path)) {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("input");
    let mut rng = Rng::new(seed);
    for _ in 0..iters {
        let mut b = seed_input.to_vec();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut b);
        }
        std::fs::write(&p, &b).expect("write");
        parse(&p);
    }
}

const METIS: &[u8] = b"% the METIS manual's example, with edge weights
7 11 001
5 1 3 2 2 1
1 1 3 2 4 1
5 3 4 2 2 2 1 2
2 1 3 2 6 2 7 5
1 1 3 3 6 2
5 2 4 2 7 6
6 6 4 5
";

#[test]
fn metis_parser_never_panics_on_mutations() {
    let mut ok = 0;
    mutate_through_file(METIS, 3000, 7, |p| {
        if let Ok(g) = runtime::data::read_metis(p) {
            g.validate().expect("valid CSR");
            ok += 1;
        }
    });
    assert!(ok < 3000);
}

#[test]
fn edge_list_parser_never_panics_on_mutations() {
    let input = b"# SNAP style\n0 1\n1 2\t7\n2 0\n% another comment\n5 3\n4294967296 1\n";
    for (i, (directed, relabel)) in [(false, false), (true, false), (false, true), (true, true)]
        .into_iter()
        .enumerate()
    {
        let opts = runtime::data::GraphImportOptions {
            directed,
            relabel,
            ..Default::default()
        };
        mutate_through_file(input, 800, i as u64, |p| {
            if let Ok(g) = runtime::data::read_edge_list(p, &opts) {
                g.graph.validate().expect("valid CSR");
            }
        });
    }
}

#[test]
fn npy_readers_never_panic_on_mutations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seeds = [
        ("f.npy", {
            let p = dir.path().join("f.npy");
            runtime::data::npy::write_f32_matrix(&p, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2)
                .expect("w");
            std::fs::read(&p).expect("r")
        }),
        ("i.npy", {
            let p = dir.path().join("i.npy");
            runtime::data::npy::write_i64(&p, &[2, 3], [0i64, 1, 2, 1, 2, 0]).expect("w");
            std::fs::read(&p).expect("r")
        }),
        ("b.npy", {
            let p = dir.path().join("b.npy");
            runtime::data::npy::write_bool(&p, &[1, 0, 1, 1]).expect("w");
            std::fs::read(&p).expect("r")
        }),
    ];
    for (i, (_, bytes)) in seeds.iter().enumerate() {
        mutate_through_file(bytes, 1000, 100 + i as u64, |p| {
            if let Ok(m) = runtime::data::npy::read_f32_matrix(p) {
                assert_eq!(m.as_slice().len(), m.num_rows() * m.dim());
            }
            let _ = runtime::data::npy::read_labels(p);
            if let Ok(mask) = runtime::data::npy::read_mask(p) {
                assert!(mask.iter().all(|&b| b <= 1));
            }
            if let Ok((v, r, c)) = runtime::data::npy::read_index_matrix(p) {
                assert_eq!(v.len(), r * c);
            }
        });
    }
}
