//! A small, fast, version-stable random number generator.
//!
//! Tandem promises the same batch for the same seed on any thread count and any
//! dependency version, so it owns its generator (xoshiro256++ seeded by SplitMix64)
//! instead of relying on `rand`'s choice of algorithm. Parallel code derives one
//! independent stream per work item with [`derive_seed`].

/// SplitMix64 step: a good 64-bit mixer, used for seeding and stream derivation.
#[inline]
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Derives the seed of stream `stream` from a base seed (e.g. one stream per
/// vertex, per layer, per chunk). Different `(seed, stream)` pairs give
/// statistically independent streams.
#[inline]
pub fn derive_seed(seed: u64, stream: u64) -> u64 {
    let mut s = seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
    splitmix64(&mut s);
    splitmix64(&mut s)
}

/// The golden-ratio increment of SplitMix64.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finalizer: a bijective 64-bit mixer. With [`hash_key`],
/// [`hash_draw`] and [`uniform_below`] it is the counter-based generator of the
/// CUDA kernels (`mix64`, `hash_key`, `hash_draw`, `uniform_below` in
/// `gpu_ops/kernels/common.cuh`), bit for bit, so that a host op and its kernel
/// draw the same values where they must (negative sampling).
#[inline]
pub fn mix64(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A key for the stream `(a, b)`: distinct pairs give unrelated keys.
#[inline]
pub fn hash_key(a: u64, b: u64) -> u64 {
    mix64(mix64(a.wrapping_add(GOLDEN)) ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// Draw `i` of the stream `key`: 64 random bits, a pure function of `(key, i)`.
#[inline]
pub fn hash_draw(key: u64, i: u64) -> u64 {
    mix64(key.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// A uniform integer in `[0, bound)` from 64 random bits (the high word of
/// `bits · bound`; its bias is below `bound / 2⁶⁴`).
#[inline]
pub fn uniform_below(bits: u64, bound: u64) -> u64 {
    ((u128::from(bits) * u128::from(bound)) >> 64) as u64
}

/// xoshiro256++ generator.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator seeded from a single `u64`.
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Self { s }
    }

    /// A generator for stream `stream` of `seed` (see [`derive_seed`]).
    pub fn for_stream(seed: u64, stream: u64) -> Self {
        Self::new(derive_seed(seed, stream))
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Next 32 random bits.
    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform integer in `0..n` (Lemire's multiply-shift with rejection); `n > 0`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = (self.next_u64() as u128) * (n as u128);
        let mut lo = m as u64;
        if lo < n {
            let threshold = n.wrapping_neg() % n;
            while lo < threshold {
                m = (self.next_u64() as u128) * (n as u128);
                lo = m as u64;
            }
        }
        (m >> 64) as u64
    }

    /// Uniform `f64` in `[0, 1)`.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform `f32` in `[0, 1)`.
    #[inline]
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Standard normal sample (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Two independent standard normal samples (both outputs of Box–Muller), for
    /// bulk generation at half the transcendental cost of two [`Rng::normal`] calls.
    pub fn normal_pair(&mut self) -> (f64, f64) {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        (r * c, r * s)
    }

    /// Shuffles `xs` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            xs.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counter-based draws: `mix64` is SplitMix64's output, and a few
    /// values pinned (the SIMT test of `sample.cu`'s generator checks the same
    /// numbers from `common.cuh`, so the two cannot drift apart).
    #[test]
    fn counter_draws_are_splitmix_and_pinned() {
        for z in [0u64, 1, 0xDEAD_BEEF, u64::MAX] {
            let mut s = z.wrapping_sub(GOLDEN);
            assert_eq!(splitmix64(&mut s), mix64(z));
        }
        let key = hash_key(42, 7);
        assert_eq!(key, 0x5864_fa25_fd88_3a8a, "{key:#x}");
        assert_eq!(hash_draw(key, 0), 0x9c25_c36d_c45d_e5fc);
        assert_eq!(hash_draw(key, 999), 0x39c9_ac05_5eb1_2e6e);
        assert_eq!(uniform_below(u64::MAX, 10), 9);
        assert_eq!(uniform_below(0, 10), 0);
        assert_eq!(uniform_below(1 << 63, 7), 3);
    }

    #[test]
    fn deterministic_and_distinct_streams() {
        let a: Vec<u64> = (0..4).map(|_| Rng::new(7).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            Rng::for_stream(7, 1).next_u64(),
            Rng::for_stream(7, 2).next_u64()
        );
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = Rng::new(1);
        let mut counts = [0u32; 7];
        for _ in 0..70_000 {
            let x = r.below(7);
            counts[x as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn floats_in_unit_interval_and_normal_moments() {
        let mut r = Rng::new(3);
        let mut sum = 0.0;
        let mut sq = 0.0;
        let n = 100_000;
        for _ in 0..n {
            let f = r.next_f32();
            assert!((0.0..1.0).contains(&f));
            let z = r.normal();
            let (z1, z2) = r.normal_pair();
            sum += z + z1 + z2;
            sq += z * z + z1 * z1 + z2 * z2;
        }
        let mean = sum / (3 * n) as f64;
        let var = sq / (3 * n) as f64 - mean * mean;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "{mean} {var}"
        );
    }
}
