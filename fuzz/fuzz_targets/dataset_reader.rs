//! Feeds arbitrary bytes to the dataset reader: it must return an error or a valid
//! dataset, never panic or read out of bounds.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use runtime::data::{parse_dataset_bytes, Verify};

fuzz_target!(|data: &[u8]| {
    if let Ok(ds) = parse_dataset_bytes(Path::new("fuzz.tds"), data, Verify::Full) {
        // A dataset that parsed must be internally consistent.
        ds.validate().expect("parsed dataset validates");
        for v in 0..ds.num_vertices() as u32 {
            let _ = ds.graph.neighbors(v);
        }
        // Edge-split ids index the graph without panicking.
        if let Some(e) = &ds.edges {
            for (s, d) in e.train.iter().chain(e.val.iter()).chain(e.test.iter()) {
                let _ = (ds.graph.neighbors(s), ds.graph.neighbors(d));
            }
            for &v in e.val_neg.iter().chain(e.test_neg.iter()).flat_map(|a| a.iter()) {
                let _ = ds.graph.neighbors(v);
            }
        }
    }
});
