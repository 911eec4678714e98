//! Arbitrary bytes as a `.npy` file through every typed reader: an error or a
//! value of the promised shape, never a panic.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use runtime::data::npy;

fuzz_target!(|data: &[u8]| {
    let p = common::scratch_file("x.npy", data);
    if let Ok(m) = npy::read_f32_matrix(&p) {
        assert_eq!(m.as_slice().len(), m.num_rows() * m.dim());
    }
    let _ = npy::read_labels(&p);
    if let Ok(mask) = npy::read_mask(&p) {
        assert!(mask.iter().all(|&b| b <= 1));
    }
    if let Ok((v, r, c)) = npy::read_index_matrix(&p) {
        assert_eq!(v.len(), r * c);
    }
});
