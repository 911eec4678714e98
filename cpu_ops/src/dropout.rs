//! Inverted dropout with a seeded, thread-count-independent mask.
//!
//! Forward, with drop probability `p` and a mask `m_i ∈ {0, 1}`, `P(m_i = 1) = 1 − p`:
//! `y_i = m_i · x_i / (1 − p)`, so `E[y_i] = x_i` and evaluation needs no rescaling.
//! Backward: `dx_i = m_i · dy_i / (1 − p)`.
//!
//! `p = 0` is the identity (no random numbers are drawn); `p = 1` zeroes everything
//! (and its gradient).
//!
//! The mask is a function of `(seed, element index)` only: elements are grouped in
//! chunks of 4096, chunk `c` draws from `Rng::for_stream(seed, c)`, and element `i`
//! is kept when its 32-bit draw is `≥ round(p · 2³²)`. The same seed gives the same
//! mask on any thread count; the caller derives one seed per layer and step (e.g.
//! with [`crate::derive_seed`]). The mask is kept as bits (1 bit per element) for the
//! backward pass.

use rayon::prelude::*;

use crate::error::{CpuOpsError, Result};
use crate::real::Real;
use crate::rng::Rng;

/// Elements per random stream (a multiple of 64, so chunks own whole mask words).
const CHUNK: usize = 4096;
const WORDS_PER_CHUNK: usize = CHUNK / 64;
/// Inputs with fewer elements than this run on the calling thread.
const PARALLEL_MIN_LEN: usize = 1 << 16;

/// The mask of one dropout application, for its backward pass.
#[derive(Clone, Debug)]
pub struct DropoutMask {
    /// Bit `i % 64` of word `i / 64` is 1 when element `i` was kept.
    words: Vec<u64>,
    len: usize,
    p: f64,
}

fn check_p(p: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&p) {
        return Err(CpuOpsError::InvalidArgument {
            name: "p",
            reason: format!("dropout probability must be in [0, 1], got {p}"),
        });
    }
    Ok(())
}

/// Fills the mask words of one chunk (stream `chunk`) and applies it to `x`.
fn chunk_forward<T: Real>(
    x: &mut [T],
    words: &mut [u64],
    seed: u64,
    chunk: usize,
    threshold: u64,
    scale: T,
) {
    let mut rng = Rng::for_stream(seed, chunk as u64);
    // Keep/drop is a coin flip, so a branch on it mispredicts half the time; index a
    // two-entry table instead (branch-free).
    let factor = [T::ZERO, scale];
    for (xs, word) in x.chunks_mut(64).zip(words.iter_mut()) {
        let mut bits = 0u64;
        for (pair_idx, pair) in xs.chunks_mut(2).enumerate() {
            let r = rng.next_u64();
            for (half, v) in pair.iter_mut().enumerate() {
                let draw = (r >> (32 * half)) & 0xFFFF_FFFF;
                let keep = (draw >= threshold) as usize;
                bits |= (keep as u64) << (2 * pair_idx + half);
                *v *= factor[keep];
            }
        }
        *word = bits;
    }
}

/// Inverted dropout in place: `x_i = m_i · x_i / (1 − p)` with a mask drawn from
/// `seed` (see the module docs); returns the mask for [`DropoutMask::backward`].
/// `p` must lie in `[0, 1]`.
pub fn dropout<T: Real>(x: &mut [T], p: f64, seed: u64) -> Result<DropoutMask> {
    check_p(p)?;
    let len = x.len();
    let mut words = vec![0u64; len.div_ceil(64)];
    if p == 0.0 {
        words.fill(u64::MAX);
        return Ok(DropoutMask { words, len, p });
    }
    // p ∈ (0, 1]: threshold ∈ [1, 2³²]; a draw of 2³² never happens, so p = 1 drops all.
    let threshold = (p * 4_294_967_296.0).round() as u64;
    let scale = if p < 1.0 {
        T::from_f64(1.0 / (1.0 - p))
    } else {
        T::ZERO
    };
    if len < PARALLEL_MIN_LEN {
        for (c, (xs, ws)) in x
            .chunks_mut(CHUNK)
            .zip(words.chunks_mut(WORDS_PER_CHUNK))
            .enumerate()
        {
            chunk_forward(xs, ws, seed, c, threshold, scale);
        }
    } else {
        x.par_chunks_mut(CHUNK)
            .zip(words.par_chunks_mut(WORDS_PER_CHUNK))
            .enumerate()
            .for_each(|(c, (xs, ws))| chunk_forward(xs, ws, seed, c, threshold, scale));
    }
    Ok(DropoutMask { words, len, p })
}

impl DropoutMask {
    /// Backward in place: `dy_i = m_i · dy_i / (1 − p)`; `dy.len()` must equal the
    /// forward input's length.
    pub fn backward<T: Real>(&self, dy: &mut [T]) -> Result<()> {
        if dy.len() != self.len {
            return Err(CpuOpsError::SizeMismatch {
                what: "dropout gradient length (length of the forward input)",
                expected: self.len,
                found: dy.len(),
            });
        }
        if self.p == 0.0 {
            return Ok(());
        }
        let scale = if self.p < 1.0 {
            T::from_f64(1.0 / (1.0 - self.p))
        } else {
            T::ZERO
        };
        let factor = [T::ZERO, scale];
        let apply = |(g, word): (&mut [T], &u64)| {
            for (bit, v) in g.iter_mut().enumerate() {
                *v *= factor[((word >> bit) & 1) as usize];
            }
        };
        if dy.len() < PARALLEL_MIN_LEN {
            dy.chunks_mut(64).zip(&self.words).for_each(apply);
        } else {
            dy.par_chunks_mut(64)
                .zip(self.words.par_iter())
                .with_min_len(WORDS_PER_CHUNK)
                .for_each(apply);
        }
        Ok(())
    }

    /// Number of elements the mask covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mask covers no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The drop probability.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// Whether element `i` was kept (`false` past the end).
    pub fn is_kept(&self, i: usize) -> bool {
        i < self.len && (self.words[i / 64] >> (i % 64)) & 1 == 1
    }

    /// Number of kept elements.
    pub fn kept(&self) -> usize {
        let full = self.len / 64;
        let mut n: usize = self.words[..full]
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum();
        if !self.len.is_multiple_of(64) {
            let tail_mask = (1u64 << (self.len % 64)) - 1;
            n += (self.words[full] & tail_mask).count_ones() as usize;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p_zero_is_identity() {
        let x: Vec<f32> = (0..1000).map(|i| i as f32 - 500.0).collect();
        let mut y = x.clone();
        let m = dropout(&mut y, 0.0, 1).unwrap();
        assert_eq!(x, y);
        assert_eq!(m.kept(), 1000);
        let mut g = x.clone();
        m.backward(&mut g).unwrap();
        assert_eq!(g, x);
    }

    #[test]
    fn p_one_drops_everything() {
        let mut y = vec![1.0f64; 130];
        let m = dropout(&mut y, 1.0, 9).unwrap();
        assert!(y.iter().all(|&v| v == 0.0));
        assert_eq!(m.kept(), 0);
        let mut g = vec![1.0f64; 130];
        m.backward(&mut g).unwrap();
        assert!(g.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn deterministic_for_a_seed_and_thread_count_independent() {
        let len = 3 * PARALLEL_MIN_LEN + 77;
        let run = |threads: usize, seed: u64| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut y = vec![1.0f32; len];
            let m = pool.install(|| dropout(&mut y, 0.3, seed)).unwrap();
            (y, m.words)
        };
        let a = run(1, 42);
        assert_eq!(a, run(3, 42));
        assert_ne!(a.1, run(1, 43).1);
        // The serial path (short input) draws the same mask as the parallel one.
        let mut short = vec![1.0f32; 5000];
        let m = dropout(&mut short, 0.3, 42).unwrap();
        assert_eq!(short[..], a.0[..5000]);
        assert_eq!(m.words[..5000 / 64], a.1[..5000 / 64]);
        assert!((0..5000).all(|i| m.is_kept(i) == (a.0[i] != 0.0)));
    }

    #[test]
    fn keep_fraction_scale_and_backward() {
        for (p, len) in [
            (0.5, 200_001usize),
            (0.1, 100_003),
            (0.9, 70_001),
            (0.25, 333),
        ] {
            let x: Vec<f64> = (0..len).map(|i| (i % 17) as f64 + 1.0).collect();
            let mut y = x.clone();
            let m = dropout(&mut y, p, 7).unwrap();
            let kept = m.kept();
            let expect = (1.0 - p) * len as f64;
            let sd = (len as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (kept as f64 - expect).abs() < 5.0 * sd,
                "p={p}: kept {kept} of {len}"
            );
            let mut g = vec![1.0f64; len];
            m.backward(&mut g).unwrap();
            let scale = 1.0 / (1.0 - p);
            let mut counted = 0;
            for i in 0..len {
                if m.is_kept(i) {
                    counted += 1;
                    assert_eq!(y[i], x[i] * scale);
                    assert_eq!(g[i], scale);
                } else {
                    assert_eq!((y[i], g[i]), (0.0, 0.0));
                }
            }
            assert_eq!(counted, kept);
            assert!(!m.is_kept(len));
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let mut x = [1.0f32; 10];
        for p in [-0.1, 1.5, f64::NAN] {
            assert!(matches!(
                dropout(&mut x, p, 0),
                Err(CpuOpsError::InvalidArgument { .. })
            ));
        }
        let m = dropout(&mut x, 0.5, 0).unwrap();
        let mut g = [1.0f32; 9];
        assert!(matches!(
            m.backward(&mut g),
            Err(CpuOpsError::SizeMismatch {
                expected: 10,
                found: 9,
                ..
            })
        ));
    }
}
