//! Shared helpers of the parity tests: random data, padded buffers, tolerant
//! comparison, random blocks.

use cpu_ops::{BlockView, Rng};
use gpu_ops::{Backend, Elem, GpuOpsError};

/// Extra elements every buffer gets past what the op needs.
pub(crate) const PAD: usize = 5;
/// What output padding holds, and must still hold after the op.
pub(crate) const SENTINEL: f32 = -7777.25;

pub(crate) fn rand_f32(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.next_f32() * 2.0 - 1.0).collect()
}

pub(crate) fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// An input buffer: `v` followed by `PAD` NaNs.
pub(crate) fn input<B: Backend>(d: &B, v: &[f32]) -> B::Buf<f32> {
    let mut p = v.to_vec();
    p.extend([f32::NAN; PAD]);
    d.to_device(&p).unwrap()
}

/// An integer input buffer: `v` followed by `PAD` copies of `pad`.
pub(crate) fn input_u32<B: Backend>(d: &B, v: &[u32], pad: u32) -> B::Buf<u32> {
    let mut p = v.to_vec();
    p.extend([pad; PAD]);
    d.to_device(&p).unwrap()
}

/// An output buffer: `v` followed by `PAD` sentinels.
pub(crate) fn output<B: Backend>(d: &B, v: &[f32]) -> B::Buf<f32> {
    let mut p = v.to_vec();
    p.extend([SENTINEL; PAD]);
    d.to_device(&p).unwrap()
}

/// The first `n` values of an output buffer, after checking its padding survived.
pub(crate) fn read<B: Backend>(d: &B, b: &B::Buf<f32>, n: usize, what: &str) -> Vec<f32> {
    let all = d.to_host(b, n + PAD).unwrap();
    assert!(
        all[n..].iter().all(|&x| x == SENTINEL),
        "{what}: wrote past its {n} values"
    );
    all[..n].to_vec()
}

pub(crate) fn down<B: Backend, T: Elem>(d: &B, b: &B::Buf<T>, n: usize) -> Vec<T> {
    d.to_host(b, n).unwrap()
}

/// `|got − want| ≤ tol · max(1, max |want|)` element-wise.
#[track_caller]
pub(crate) fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= tol * scale,
            "{what}[{k}]: got {g}, want {w} (tolerance {})",
            tol * scale
        );
    }
}

pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[track_caller]
pub(crate) fn assert_size_mismatch<T>(what: &str, r: gpu_ops::Result<T>) {
    match r {
        Err(GpuOpsError::SizeMismatch { .. }) => {}
        Err(e) => panic!("{what}: expected SizeMismatch, got {e:?}"),
        Ok(_) => panic!("{what}: expected SizeMismatch, got Ok"),
    }
}

/// A random block's CSR: about a quarter of the destinations have no edges; a
/// source may appear twice in one list (it then counts twice).
pub(crate) struct Csr {
    pub(crate) num_src: usize,
    pub(crate) indptr: Vec<u64>,
    pub(crate) indices: Vec<u32>,
}

impl Csr {
    pub(crate) fn random(rng: &mut Rng, num_dst: usize, num_src: usize, max_deg: u64) -> Self {
        let mut indptr = vec![0u64];
        let mut indices = Vec::new();
        for _ in 0..num_dst {
            let deg = if rng.below(4) == 0 {
                0
            } else {
                1 + rng.below(max_deg)
            };
            for _ in 0..deg {
                indices.push(rng.below(num_src as u64) as u32);
            }
            indptr.push(indices.len() as u64);
        }
        Self {
            num_src,
            indptr,
            indices,
        }
    }

    pub(crate) fn num_dst(&self) -> usize {
        self.indptr.len() - 1
    }

    pub(crate) fn view(&self) -> BlockView<'_> {
        BlockView::new(self.num_src, &self.indptr, &self.indices).unwrap()
    }

    pub(crate) fn upload<B: Backend>(&self, d: &B) -> B::Block {
        d.block_from_host(self.num_src, &self.indptr, &self.indices)
            .unwrap()
    }
}

/// Shapes with odd sizes: `(num_dst, num_src, max_deg)`.
pub(crate) const BLOCK_SHAPES: [(usize, usize, u64); 4] =
    [(1, 1, 1), (37, 91, 7), (64, 64, 12), (203, 517, 9)];
/// Row widths, odd and around SIMD widths.
pub(crate) const DIMS: [usize; 6] = [1, 3, 16, 17, 33, 129];
