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
//! is kept when its 16-bit draw is `≥ round(p · 2¹⁶)` (so `p` is resolved to
//! 1/65536, far finer than any dropout rate in use, at half the draws of 32-bit).
//! The same seed gives the same mask on any thread count; the caller derives one
//! seed per layer and step (e.g. with [`crate::derive_seed`]). The mask is kept as bits (1 bit per element) for the
//! backward pass.

use rayon::prelude::*;

use crate::error::{CpuOpsError, Result};
use crate::real::{is_f32, Real};
use crate::rng::Rng;
use crate::simd::SimdLevel;

/// `x_i *= [bit i of bits] · scale` for up to 64 elements, branch-free; the AVX-512
/// path does 16 elements per zero-masked multiply when `T` is `f32`. (A dropped
/// element becomes 0; only a NaN input can tell the paths apart: the masked multiply
/// gives 0, the portable one NaN.)
fn apply_mask<T: Real>(xs: &mut [T], bits: u64, scale: T) {
    #[cfg(target_arch = "x86_64")]
    if is_f32::<T>() && SimdLevel::detected() == SimdLevel::Avx512 {
        let xs: &mut [f32] = bytemuck::cast_slice_mut(xs);
        let scale = bytemuck::cast::<T, f32>(scale);
        // SAFETY: AVX-512F support was just checked at run time.
        unsafe { apply_mask_avx512(xs, bits, scale) };
        return;
    }
    apply_mask_portable(xs, bits, scale, 0);
}

/// The portable body of [`apply_mask`] from element `from` on: a two-entry table
/// lookup instead of a branch on the coin flip.
fn apply_mask_portable<T: Real>(xs: &mut [T], bits: u64, scale: T, from: usize) {
    let factor = [T::ZERO, scale];
    for (i, v) in xs.iter_mut().enumerate().skip(from) {
        *v *= factor[((bits >> i) & 1) as usize];
    }
}

/// AVX-512 body of [`apply_mask`]: one zero-masked multiply per 16 elements.
///
/// # Safety
/// The CPU must support AVX-512F; `xs.len() <= 64`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn apply_mask_avx512(xs: &mut [f32], bits: u64, scale: f32) {
    use std::arch::x86_64::{
        _mm512_loadu_ps, _mm512_maskz_mul_ps, _mm512_set1_ps, _mm512_storeu_ps,
    };
    let s = _mm512_set1_ps(scale);
    let done = xs.len() - xs.len() % 16;
    let mut chunks = xs.chunks_exact_mut(16);
    for (k, c) in (&mut chunks).enumerate() {
        let m = ((bits >> (16 * k)) & 0xFFFF) as u16;
        // SAFETY: `c` holds exactly 16 f32s, so the unaligned 64-byte load and store
        // stay inside it.
        unsafe {
            let v = _mm512_loadu_ps(c.as_ptr());
            _mm512_storeu_ps(c.as_mut_ptr(), _mm512_maskz_mul_ps(m, v, s));
        }
    }
    apply_mask_portable(xs, bits, scale, done);
}

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
///
/// Each `next_u64` gives four 16-bit draws, so a 64-element word costs 16 draws; the
/// mask is built first (integer work only) and applied in a second, branch-free pass
/// (keep/drop is a coin flip, so a branch on it would mispredict half the time).
fn chunk_forward<T: Real>(
    x: &mut [T],
    words: &mut [u64],
    seed: u64,
    chunk: usize,
    threshold: u32,
    scale: T,
) {
    let mut rng = Rng::for_stream(seed, chunk as u64);
    for (xs, word) in x.chunks_mut(64).zip(words.iter_mut()) {
        let mut bits = 0u64;
        for q in 0..16 {
            let r = rng.next_u64();
            for lane in 0..4 {
                let draw = ((r >> (16 * lane)) & 0xFFFF) as u32;
                bits |= ((draw >= threshold) as u64) << (4 * q + lane);
            }
        }
        *word = bits;
        apply_mask(xs, bits, scale);
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
    // p ∈ (0, 1]: threshold ∈ [0, 2¹⁶]; a draw of 2¹⁶ never happens, so p = 1 drops
    // all. p below 2⁻¹⁷ rounds to 0 (keeps all), as a 16-bit draw cannot resolve it.
    let threshold = (p * 65_536.0).round() as u32;
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
        let apply = |(g, word): (&mut [T], &u64)| apply_mask(g, *word, scale);
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
    fn simd_f32_path_matches_portable_f64_path() {
        // f32 takes the AVX-512 masked multiply where the CPU has it, f64 the portable
        // loop: same mask, same values, for lengths with every kind of tail.
        for len in [
            1usize,
            15,
            16,
            17,
            63,
            64,
            65,
            4095,
            4096,
            4097,
            3 * 65_536 + 7,
        ] {
            let xs: Vec<f32> = (0..len).map(|i| (i % 13) as f32 - 6.0).collect();
            let mut a = xs.clone();
            let mut b: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
            let ma = dropout(&mut a, 0.3, 9).unwrap();
            let mb = dropout(&mut b, 0.3, 9).unwrap();
            assert_eq!(ma.kept(), mb.kept(), "len {len}");
            for i in 0..len {
                assert_eq!(ma.is_kept(i), mb.is_kept(i));
                assert!((a[i] as f64 - b[i]).abs() < 1e-5, "len {len} i {i}");
            }
            let mut ga = vec![1.0f32; len];
            let mut gb = vec![1.0f64; len];
            ma.backward(&mut ga).unwrap();
            mb.backward(&mut gb).unwrap();
            for i in 0..len {
                assert!((ga[i] as f64 - gb[i]).abs() < 1e-5);
            }
        }
    }

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
