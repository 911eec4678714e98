//! Arbitrary bytes as a SNAP edge list, with and without relabelling and
//! symmetrization: an error or a valid CSR, never a panic.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use runtime::data::{read_edge_list, GraphImportOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let p = common::scratch_file("edges.txt", body);
    let opts = GraphImportOptions {
        directed: flags & 1 != 0,
        relabel: flags & 2 != 0,
        ..GraphImportOptions::default()
    };
    if let Ok(g) = read_edge_list(&p, &opts) {
        g.graph.validate().expect("parsed graph validates");
    }
});
