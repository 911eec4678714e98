//! Arbitrary bytes as a METIS graph file: an error or a valid CSR, never a panic.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = common::scratch_file("metis.graph", data);
    if let Ok(g) = runtime::data::read_metis(&p) {
        g.validate().expect("parsed graph validates");
    }
});
