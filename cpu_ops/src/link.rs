//! Link prediction's host math: the pair decoders' row products ([`pair_dot`],
//! [`pair_hadamard`] and their backwards), the binary cross-entropy on logits
//! ([`bce_with_logits`]), negative sampling ([`sample_negatives`], uniform or by
//! a [`negative_cdf`]) and the removal of given edges from a block
//! ([`exclude_edges`]). They are the scalar twins of `gpu_ops`' link kernels
//! (`gpu_ops/kernels/link.cu`), and the host backend runs them.
//!
//! - **Pairs** index rows of a row-major `rows × dim` matrix `h` (`rows =
//!   h.len() / dim`): pair `i` is `(src[i], dst[i])`. `pair_dot` gives
//!   `⟨h[src[i]], h[dst[i]]⟩`, `pair_hadamard` the row `h[src[i]] ⊙ h[dst[i]]`;
//!   their backwards *add* into `∂h` (a row in several pairs collects all of
//!   them), pair by pair in order, the source row first.
//! - **Loss**: for a logit `x` and a label `y ∈ {0, 1}`, `ℓ = max(x, 0) − x·y +
//!   ln(1 + e^{−|x|})` (= `−y ln σ(x) − (1 − y) ln(1 − σ(x))`, with no overflow
//!   for any `x`); the loss is the mean over the batch, summed in `f64`, and
//!   `∂ℓ/∂x = (σ(x) − y) / n`. A pair counts as correct when `(x > 0) = (y > ½)`.
//! - **Negatives** ("corrupt the destination", as DGL's and PyG's samplers):
//!   positive `i` with source `src[i]` gets `k` negatives `(src[i], v)`, draw
//!   `t = i·k + j` being `v = ` [`uniform_below`]`(bits, n)` (uniform) or the
//!   inverse of an integer cumulative table at `uniform_below(bits, total)`
//!   (`∝ degree^power`), with `bits = `[`hash_draw`]`(`[`hash_key`]`(seed,
//!   NEGATIVE_STREAM), t)`. Integer arithmetic only, so a device kernel with the
//!   same generator draws the same vertices.
//! - **Exclusion**: an edge of a block (destination `i`, local source `j`) is
//!   dropped when the pair of global ids `(src_ids[i], src_ids[j])` — the
//!   destination first — is among the excluded [`pair_key`]s (sorted, searched
//!   by bisection); the other edges keep their order.

use rayon::prelude::*;

use crate::aggregate::{check_matrix, BlockView};
use crate::error::{CpuOpsError, Result};
use crate::loss::CrossEntropy;
use crate::real::Real;
use crate::rng::{hash_draw, hash_key, uniform_below};

/// The stream of [`sample_negatives`]' draws ("negative"), so a seed shared
/// with other counter-based draws never gives the same numbers.
pub const NEGATIVE_STREAM: u64 = 0x6e65_6761_7469_7665;

/// Values per parallel task of the forward products (results do not depend on
/// the split: every output is computed by one task).
const PAR_MIN_VALUES: usize = 1 << 15;

/// The key of the pair `(dst, src)` of global ids: `dst` in the high word, so
/// keys sort by destination, then source.
#[inline]
pub fn pair_key(dst: u32, src: u32) -> u64 {
    (u64::from(dst) << 32) | u64::from(src)
}

/// The keys of `pairs` (each `(destination, source)`), sorted, without repeats:
/// what [`exclude_edges`] searches.
pub fn sorted_pair_keys(pairs: &[(u32, u32)]) -> Vec<u64> {
    let mut keys: Vec<u64> = pairs.iter().map(|&(d, s)| pair_key(d, s)).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Rows of `h` (`h.len() / dim`), after checking `dim ≥ 1`, one `dst` per
/// `src`, and every id below the rows of `h` and of `also` (a gradient).
fn check_pairs<T>(
    what: &'static str,
    h: &[T],
    also: Option<usize>,
    dim: usize,
    src: &[u32],
    dst: &[u32],
) -> Result<usize> {
    if dim == 0 {
        return Err(CpuOpsError::InvalidArgument {
            name: "dim",
            reason: format!("{what}: rows need at least one column"),
        });
    }
    if dst.len() != src.len() {
        return Err(CpuOpsError::SizeMismatch {
            what: "pair destinations (one per source)",
            expected: src.len(),
            found: dst.len(),
        });
    }
    let rows = (h.len() / dim).min(also.map_or(usize::MAX, |len| len / dim));
    if let Some(&bad) = src.iter().chain(dst).find(|&&v| v as usize >= rows) {
        return Err(CpuOpsError::VertexOutOfRange {
            context: what,
            vertex: u64::from(bad),
            num_vertices: rows,
        });
    }
    Ok(rows)
}

/// `SizeMismatch` unless `len = expected`.
fn check_len(what: &'static str, len: usize, expected: usize) -> Result<()> {
    check_matrix(what, len, expected, 1)
}

fn row<T>(h: &[T], dim: usize, r: u32) -> &[T] {
    &h[r as usize * dim..(r as usize + 1) * dim]
}

/// `out[i] = ⟨h[src[i]], h[dst[i]]⟩` (summed in column order in `T`).
///
/// Errors: `dim = 0`, `dst`, `out` not one per `src`, an id not below
/// `h.len() / dim`.
pub fn pair_dot<T: Real>(
    h: &[T],
    dim: usize,
    src: &[u32],
    dst: &[u32],
    out: &mut [T],
) -> Result<()> {
    check_pairs("pair_dot ids", h, None, dim, src, dst)?;
    check_len("pair_dot output (one per pair)", out.len(), src.len())?;
    let one = |(i, o): (usize, &mut T)| {
        let (a, b) = (row(h, dim, src[i]), row(h, dim, dst[i]));
        *o = a.iter().zip(b).fold(T::ZERO, |s, (&x, &y)| s + x * y);
    };
    if out.len() * dim < PAR_MIN_VALUES {
        out.iter_mut().enumerate().for_each(one);
    } else {
        out.par_iter_mut().enumerate().for_each(one);
    }
    Ok(())
}

/// `dh[src[i]] += dscore[i]·h[dst[i]]`, then `dh[dst[i]] += dscore[i]·h[src[i]]`,
/// pair by pair in order (accumulates: `dh` keeps what it held).
///
/// Errors: those of [`pair_dot`], `dscore` not one per pair, an id not below
/// `dh.len() / dim`.
pub fn pair_dot_backward<T: Real>(
    h: &[T],
    dim: usize,
    src: &[u32],
    dst: &[u32],
    dscore: &[T],
    dh: &mut [T],
) -> Result<()> {
    check_pairs("pair_dot_backward ids", h, Some(dh.len()), dim, src, dst)?;
    check_len(
        "pair_dot_backward score gradient (one per pair)",
        dscore.len(),
        src.len(),
    )?;
    for ((&s, &d), &g) in src.iter().zip(dst).zip(dscore) {
        let (s, d) = (s as usize * dim, d as usize * dim);
        for c in 0..dim {
            dh[s + c] += g * h[d + c];
        }
        for c in 0..dim {
            dh[d + c] += g * h[s + c];
        }
    }
    Ok(())
}

/// Row `i` of `out` (`n × dim`) `= h[src[i]] ⊙ h[dst[i]]`.
///
/// Errors: those of [`pair_dot`], `out` not `n · dim` values.
pub fn pair_hadamard<T: Real>(
    h: &[T],
    dim: usize,
    src: &[u32],
    dst: &[u32],
    out: &mut [T],
) -> Result<()> {
    check_pairs("pair_hadamard ids", h, None, dim, src, dst)?;
    check_matrix(
        "pair_hadamard output (pairs × dim)",
        out.len(),
        src.len(),
        dim,
    )?;
    let one = |(i, o): (usize, &mut [T])| {
        let (a, b) = (row(h, dim, src[i]), row(h, dim, dst[i]));
        for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
            *o = x * y;
        }
    };
    if out.len() < PAR_MIN_VALUES {
        out.chunks_mut(dim).enumerate().for_each(one);
    } else {
        out.par_chunks_mut(dim).enumerate().for_each(one);
    }
    Ok(())
}

/// `dh[src[i]] += dz[i] ⊙ h[dst[i]]`, then `dh[dst[i]] += dz[i] ⊙ h[src[i]]`,
/// pair by pair in order (accumulates).
///
/// Errors: those of [`pair_dot_backward`], `dz` not `n · dim` values.
pub fn pair_hadamard_backward<T: Real>(
    h: &[T],
    dim: usize,
    src: &[u32],
    dst: &[u32],
    dz: &[T],
    dh: &mut [T],
) -> Result<()> {
    check_pairs(
        "pair_hadamard_backward ids",
        h,
        Some(dh.len()),
        dim,
        src,
        dst,
    )?;
    check_matrix(
        "pair_hadamard_backward gradient (pairs × dim)",
        dz.len(),
        src.len(),
        dim,
    )?;
    for (i, (&s, &d)) in src.iter().zip(dst).enumerate() {
        let (s, d, g) = (
            s as usize * dim,
            d as usize * dim,
            &dz[i * dim..(i + 1) * dim],
        );
        for c in 0..dim {
            dh[s + c] += g[c] * h[d + c];
        }
        for c in 0..dim {
            dh[d + c] += g[c] * h[s + c];
        }
    }
    Ok(())
}

/// `σ(x)` without overflow.
fn sigmoid<T: Real>(x: T) -> T {
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

/// Mean binary cross-entropy of `logits` against `labels` (1 positive, 0
/// negative; one per logit), the correct count, and, when `grad` is given (one
/// per logit), `(σ(x) − y) / n` written into it (the module doc's formulas).
///
/// Errors: `labels` or `grad` not one per logit.
pub fn bce_with_logits<T: Real>(
    logits: &[T],
    labels: &[T],
    grad: Option<&mut [T]>,
) -> Result<CrossEntropy> {
    let n = logits.len();
    check_len("bce_with_logits labels (one per logit)", labels.len(), n)?;
    if let Some(g) = &grad {
        check_len("bce_with_logits gradient (one per logit)", g.len(), n)?;
    }
    let half = T::from_f64(0.5);
    let (mut loss, mut correct) = (0.0f64, 0usize);
    for (&x, &y) in logits.iter().zip(labels) {
        let l = x.max(T::ZERO) - x * y + (-x.abs()).exp().ln_1p();
        loss += l.to_f64();
        correct += usize::from((x > T::ZERO) == (y > half));
    }
    if let Some(g) = grad {
        let inv_n = T::from_f64(1.0 / n.max(1) as f64);
        for ((g, &x), &y) in g.iter_mut().zip(logits).zip(labels) {
            *g = (sigmoid(x) - y) * inv_n;
        }
    }
    Ok(CrossEntropy {
        loss: if n == 0 { 0.0 } else { loss / n as f64 },
        correct,
        rows: n,
    })
}

/// The cumulative table of negative sampling `∝ degree^power`: `n + 1` integers,
/// `cdf[0] = 0`, `cdf[v + 1] − cdf[v]` vertex `v`'s weight (`degree^power` in
/// `f64`, scaled so the weights sum to about 2⁵² and rounded; a degree of 0 has
/// weight 0 for `power > 0`, 1 for `power = 0`).
///
/// Errors: `power` not finite and `≥ 0`, no vertices, more than 2³² of them,
/// or every weight 0 (no vertex with an edge).
pub fn negative_cdf(degrees: &[u32], power: f64) -> Result<Vec<u64>> {
    if !(power.is_finite() && power >= 0.0) {
        return Err(CpuOpsError::InvalidArgument {
            name: "power",
            reason: format!("the degree exponent must be finite and >= 0, got {power}"),
        });
    }
    if degrees.is_empty() || degrees.len() as u64 > 1 << 32 {
        return Err(CpuOpsError::InvalidArgument {
            name: "degrees",
            reason: format!(
                "negative sampling needs 1 to 2^32 vertices, got {}",
                degrees.len()
            ),
        });
    }
    let w: Vec<f64> = degrees.iter().map(|&d| f64::from(d).powf(power)).collect();
    let total: f64 = w.iter().sum();
    if total <= 0.0 {
        return Err(CpuOpsError::InvalidArgument {
            name: "degrees",
            reason: "every vertex has degree 0: no negative can be drawn by degree".into(),
        });
    }
    let scale = (1u64 << 52) as f64 / total;
    let mut cdf = Vec::with_capacity(w.len() + 1);
    let mut acc = 0u64;
    cdf.push(0);
    for x in w {
        acc += (x * scale).round() as u64;
        cdf.push(acc);
    }
    Ok(cdf)
}

/// The vertex of draw `bits`: `uniform_below(bits, n)` without a table, else
/// the `v` with `cdf[v] ≤ r < cdf[v + 1]` for `r = uniform_below(bits,
/// cdf[n])` (bisection; a weight-0 vertex is never the answer).
#[inline]
pub fn negative_vertex(bits: u64, num_vertices: u64, cdf: Option<&[u64]>) -> u32 {
    match cdf {
        None => uniform_below(bits, num_vertices) as u32,
        Some(cdf) => {
            let n = cdf.len() - 1;
            let r = uniform_below(bits, cdf[n]);
            let (mut lo, mut hi) = (0usize, n);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if cdf[mid] <= r {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            lo as u32
        }
    }
}

/// `k` negatives per positive (the module doc): for positive `i` and `j < k`,
/// `out_src[i·k + j] = src[i]` and `out_dst[i·k + j]` a vertex below
/// `num_vertices` drawn from `(seed, i·k + j)`, uniformly or by `cdf`
/// ([`negative_cdf`] of `num_vertices` degrees). The same arguments give the
/// same vertices.
///
/// Errors: `num_vertices` 0 or above 2³², a table of another length, outputs
/// not `src.len() · k` long.
pub fn sample_negatives(
    num_vertices: usize,
    k: usize,
    src: &[u32],
    seed: u64,
    cdf: Option<&[u64]>,
    out_src: &mut [u32],
    out_dst: &mut [u32],
) -> Result<()> {
    if num_vertices == 0 || num_vertices as u64 > 1 << 32 {
        return Err(CpuOpsError::InvalidArgument {
            name: "num_vertices",
            reason: format!("negatives are drawn from 1 to 2^32 vertices, got {num_vertices}"),
        });
    }
    if let Some(c) = cdf {
        check_len(
            "negative sampling table (num_vertices + 1 entries)",
            c.len(),
            num_vertices + 1,
        )?;
    }
    let total = src
        .len()
        .checked_mul(k)
        .ok_or(CpuOpsError::InvalidArgument {
            name: "per_positive",
            reason: format!("{} positives × {k} negatives overflow", src.len()),
        })?;
    check_len("negative sources (positives × k)", out_src.len(), total)?;
    check_len(
        "negative destinations (positives × k)",
        out_dst.len(),
        total,
    )?;
    let key = hash_key(seed, NEGATIVE_STREAM);
    for (t, (s, d)) in out_src.iter_mut().zip(out_dst.iter_mut()).enumerate() {
        *s = src[t / k];
        *d = negative_vertex(hash_draw(key, t as u64), num_vertices as u64, cdf);
    }
    Ok(())
}

/// `block` without the edges whose pair of global ids `(src_ids[i],
/// src_ids[j])` (destination `i`, local source `j`) is in `excluded` (sorted
/// [`pair_key`]s, repeats allowed): its new `(indptr, indices)`, every other
/// edge kept in order. `src_ids` holds the global id of each of the block's
/// sources (destinations first).
///
/// Errors: `src_ids` not one per source, `excluded` not sorted.
pub fn exclude_edges(
    block: &BlockView<'_>,
    src_ids: &[u32],
    excluded: &[u64],
) -> Result<(Vec<u64>, Vec<u32>)> {
    check_len(
        "exclude_edges source ids (one per source)",
        src_ids.len(),
        block.num_src(),
    )?;
    if let Some(at) = excluded.windows(2).position(|w| w[0] > w[1]) {
        return Err(CpuOpsError::InvalidArgument {
            name: "excluded",
            reason: format!("pair keys must be sorted; key {} is above the next", at),
        });
    }
    let mut indptr = Vec::with_capacity(block.num_dst() + 1);
    let mut indices = Vec::with_capacity(block.num_edges());
    indptr.push(0u64);
    for i in 0..block.num_dst() {
        let d = src_ids[i];
        let row = block.neighbors(i);
        // The keys of destination `d` (one range: keys sort by destination
        // first). Most destinations have none, and their rows are copied
        // whole; the others search their few keys per edge.
        let lo = excluded.partition_point(|&k| k < pair_key(d, 0));
        let hi = lo + excluded[lo..].partition_point(|&k| k <= pair_key(d, u32::MAX));
        let mine = &excluded[lo..hi];
        if mine.is_empty() {
            indices.extend_from_slice(row);
        } else {
            indices.extend(row.iter().filter(|&&j| {
                mine.binary_search(&pair_key(d, src_ids[j as usize]))
                    .is_err()
            }));
        }
        indptr.push(indices.len() as u64);
    }
    Ok((indptr, indices))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn rand(rng: &mut Rng, n: usize) -> Vec<f64> {
        (0..n).map(|_| rng.next_f64() * 2.0 - 1.0).collect()
    }

    /// Forward products against their definitions; backwards against the
    /// derivative of `Σ_i g_i·score_i` (bilinear, so exact up to rounding),
    /// with repeated rows and a pair of a row with itself.
    #[test]
    fn pair_products_and_their_gradients() {
        let mut rng = Rng::new(3);
        let (rows, dim) = (7, 5);
        let h = rand(&mut rng, rows * dim);
        let (src, dst) = (vec![0u32, 3, 3, 6, 2], vec![1u32, 3, 5, 0, 2]);
        let mut dot = vec![0.0; 5];
        pair_dot(&h, dim, &src, &dst, &mut dot).unwrap();
        let mut had = vec![0.0; 5 * dim];
        pair_hadamard(&h, dim, &src, &dst, &mut had).unwrap();
        for i in 0..5 {
            let (s, d) = (src[i] as usize * dim, dst[i] as usize * dim);
            let want: f64 = (0..dim).map(|c| h[s + c] * h[d + c]).sum();
            assert!((dot[i] - want).abs() < 1e-12);
            let sum: f64 = had[i * dim..(i + 1) * dim].iter().sum();
            assert!((sum - want).abs() < 1e-12);
        }
        // Finite differences of L = Σ g·dot (and Σ G ⊙ hadamard): exact for
        // a quadratic with a central step.
        let g = rand(&mut rng, 5);
        let gz = rand(&mut rng, 5 * dim);
        let mut dh = vec![1.0; rows * dim];
        pair_dot_backward(&h, dim, &src, &dst, &g, &mut dh).unwrap();
        let mut dhz = vec![1.0; rows * dim];
        pair_hadamard_backward(&h, dim, &src, &dst, &gz, &mut dhz).unwrap();
        let loss = |h: &[f64]| {
            let mut d = vec![0.0; 5];
            let mut z = vec![0.0; 5 * dim];
            pair_dot(h, dim, &src, &dst, &mut d).unwrap();
            pair_hadamard(h, dim, &src, &dst, &mut z).unwrap();
            let a: f64 = d.iter().zip(&g).map(|(x, y)| x * y).sum();
            let b: f64 = z.iter().zip(&gz).map(|(x, y)| x * y).sum();
            (a, b)
        };
        for k in 0..rows * dim {
            let (mut up, mut down) = (h.clone(), h.clone());
            up[k] += 1e-3;
            down[k] -= 1e-3;
            let (u, d) = (loss(&up), loss(&down));
            // dh started at 1: the ops add.
            assert!(((u.0 - d.0) / 2e-3 - (dh[k] - 1.0)).abs() < 1e-9, "dot {k}");
            assert!(
                ((u.1 - d.1) / 2e-3 - (dhz[k] - 1.0)).abs() < 1e-9,
                "hadamard {k}"
            );
        }
    }

    #[test]
    fn pair_arguments_are_checked() {
        let h = vec![0.0f32; 12];
        let mut out = vec![0.0f32; 2];
        assert!(pair_dot(&h, 3, &[0, 4], &[1, 1], &mut out).is_err());
        assert!(pair_dot(&h, 3, &[0, 3], &[1], &mut out).is_err());
        assert!(pair_dot(&h, 0, &[], &[], &mut []).is_err());
        assert!(pair_dot(&h, 3, &[0], &[1], &mut out).is_err());
        let mut small = vec![0.0f32; 6];
        let err = pair_dot_backward(&h, 3, &[0, 3], &[1, 1], &[1.0, 1.0], &mut small).unwrap_err();
        assert!(
            matches!(
                err,
                CpuOpsError::VertexOutOfRange {
                    vertex: 3,
                    num_vertices: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(pair_hadamard(&h, 3, &[0], &[1], &mut out).is_err());
        pair_dot(&h, 3, &[0, 3], &[1, 1], &mut out).unwrap();
    }

    /// The loss against `−y ln σ − (1 − y) ln(1 − σ)` in f64, no overflow at
    /// ±100, the gradient against finite differences, correct counts.
    #[test]
    fn bce_is_stable_and_its_gradient_is_right() {
        let x = [-100.0f64, -2.5, -0.1, 0.0, 0.3, 4.0, 100.0];
        let y = [0.0f64, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0];
        let mut g = vec![0.0; x.len()];
        let ce = bce_with_logits(&x, &y, Some(&mut g)).unwrap();
        let direct = |x: f64, y: f64| {
            let s = 1.0 / (1.0 + (-x).exp());
            -if y > 0.5 { s.ln() } else { (1.0 - s).ln() }
        };
        let want: f64 = x.iter().zip(&y).map(|(&a, &b)| direct(a, b)).sum::<f64>() / 7.0;
        assert!((ce.loss - want).abs() < 1e-9, "{} vs {want}", ce.loss);
        // x > 0 ⇔ y > ½: -100/0, -0.1/0, 0.3/1, 100/1 (0 is not > 0: wrong for y = 1).
        assert_eq!((ce.correct, ce.rows), (4, 7));
        for k in 0..x.len() {
            let mut up = x;
            up[k] += 1e-6;
            let mut down = x;
            down[k] -= 1e-6;
            let fd = (bce_with_logits(&up, &y, None).unwrap().loss
                - bce_with_logits(&down, &y, None).unwrap().loss)
                / 2e-6;
            assert!((fd - g[k]).abs() < 1e-7, "{k}: {fd} vs {}", g[k]);
        }
        let big = bce_with_logits(&[1e4f32, -1e4], &[0.0, 1.0], None).unwrap();
        assert_eq!(big.loss, 1e4);
        assert_eq!(bce_with_logits::<f32>(&[], &[], None).unwrap().loss, 0.0);
        assert!(bce_with_logits(&[1.0f32], &[], None).is_err());
    }

    /// Same seed, same draws; uniform equals the table of `power = 0`; draws
    /// follow `degree^0.75` and never pick a vertex of degree 0.
    #[test]
    fn negatives_are_deterministic_and_follow_the_degrees() {
        let n = 6;
        let degrees = [0u32, 1, 16, 0, 81, 3];
        let cdf = negative_cdf(&degrees, 0.75).unwrap();
        assert_eq!((cdf.len(), cdf[0]), (n + 1, 0));
        assert_eq!(cdf[1], 0, "degree 0 weighs 0");
        let src: Vec<u32> = (0..4000).map(|i| i % 6).collect();
        let k = 5;
        let (mut s1, mut d1) = (vec![0; 4000 * k], vec![0; 4000 * k]);
        sample_negatives(n, k, &src, 9, Some(&cdf), &mut s1, &mut d1).unwrap();
        let (mut s2, mut d2) = (vec![0; 4000 * k], vec![0; 4000 * k]);
        sample_negatives(n, k, &src, 9, Some(&cdf), &mut s2, &mut d2).unwrap();
        assert_eq!((&s1, &d1), (&s2, &d2));
        assert!(s1.iter().enumerate().all(|(t, &s)| s == src[t / k]));
        let mut count = [0usize; 6];
        for &v in &d1 {
            count[v as usize] += 1;
        }
        assert_eq!((count[0], count[3]), (0, 0));
        let w: Vec<f64> = degrees.iter().map(|&d| f64::from(d).powf(0.75)).collect();
        let total: f64 = w.iter().sum();
        for v in 0..n {
            let expect = w[v] / total * d1.len() as f64;
            let sd = expect.sqrt().max(1.0);
            assert!(
                (count[v] as f64 - expect).abs() < 5.0 * sd,
                "{v}: {} vs {expect}",
                count[v]
            );
        }
        sample_negatives(n, k, &src, 10, Some(&cdf), &mut s2, &mut d2).unwrap();
        assert_ne!(d1, d2, "another seed, other draws");
        // power 0: every vertex weighs the same, exactly the uniform draw.
        let flat = negative_cdf(&degrees, 0.0).unwrap();
        let mut du = vec![0; 4000 * k];
        sample_negatives(n, k, &src, 9, None, &mut s2, &mut du).unwrap();
        sample_negatives(n, k, &src, 9, Some(&flat), &mut s2, &mut d2).unwrap();
        assert_eq!(du, d2);
        // The table's boundaries: r = cdf[v] draws v (weights 0, 2, 0, 3).
        let small = [0u64, 0, 2, 2, 5];
        for (r, want) in [(0u64, 1u32), (1, 1), (2, 3), (3, 3), (4, 3)] {
            // The smallest 64 bits whose uniform_below(·, 5) is r.
            let bits = ((u128::from(r) << 64).div_ceil(5)) as u64;
            assert_eq!(uniform_below(bits, 5), r);
            assert_eq!(negative_vertex(bits, 4, Some(&small)), want, "r = {r}");
        }
        assert!(negative_cdf(&[0, 0], 0.75).is_err());
        assert!(negative_cdf(&[1], f64::NAN).is_err());
        assert!(negative_cdf(&[], 1.0).is_err());
        assert!(sample_negatives(5, k, &src, 9, Some(&cdf), &mut s2, &mut d2).is_err());
        assert!(sample_negatives(0, k, &src, 9, None, &mut s2, &mut d2).is_err());
        assert!(sample_negatives(n, k, &src[1..], 9, None, &mut s2, &mut d2).is_err());
    }

    #[test]
    fn excluded_edges_leave_the_block() {
        // Sources (global ids) 10, 11, 12, 13; destinations 10 and 11.
        let (indptr, indices) = (vec![0u64, 3, 6], vec![1u32, 2, 1, 0, 3, 2]);
        let view = BlockView::new(4, &indptr, &indices).unwrap();
        let ids = [10u32, 11, 12, 13];
        let keys = sorted_pair_keys(&[(10, 11), (11, 13), (11, 13), (12, 10)]);
        assert_eq!(keys.len(), 3);
        let (p, i) = exclude_edges(&view, &ids, &keys).unwrap();
        // 10 loses both edges from 11, 11 loses the one from 13.
        assert_eq!(p, vec![0, 1, 3]);
        assert_eq!(i, vec![2, 0, 2]);
        let (p, i) = exclude_edges(&view, &ids, &[]).unwrap();
        assert_eq!((p, i), (indptr.clone(), indices.clone()));
        assert!(exclude_edges(&view, &ids[..3], &keys).is_err());
        assert!(exclude_edges(&view, &ids, &[5, 4]).is_err());
    }

    /// Random blocks and pair sets (destinations with and without keys, ids
    /// at the ends of the u32 range) against a plain filter over every edge.
    #[test]
    fn exclusion_matches_a_scalar_filter_on_random_blocks() {
        let mut rng = Rng::new(11);
        for case in 0..200 {
            let (num_src, num_dst) = (2 + rng.below(40) as usize, 1 + rng.below(20) as usize);
            let num_dst = num_dst.min(num_src);
            let mut indptr = vec![0u64];
            let mut indices = Vec::new();
            for _ in 0..num_dst {
                for _ in 0..rng.below(8) {
                    indices.push(rng.below(num_src as u64) as u32);
                }
                indptr.push(indices.len() as u64);
            }
            let view = BlockView::new(num_src, &indptr, &indices).unwrap();
            let pool = [0u32, 1, 2, 3, 5, 8, u32::MAX - 1, u32::MAX];
            let ids: Vec<u32> = (0..num_src)
                .map(|i| {
                    if case % 3 == 0 {
                        pool[i % pool.len()]
                    } else {
                        rng.below(30) as u32
                    }
                })
                .collect();
            let pairs: Vec<(u32, u32)> = (0..rng.below(12))
                .map(|_| {
                    let e = rng.below(indices.len().max(1) as u64) as usize;
                    match (e < indices.len(), rng.below(2)) {
                        // An edge of the block, by its destination's row.
                        (true, 0) => {
                            let d = indptr
                                .iter()
                                .rposition(|&p| p as usize <= e)
                                .unwrap()
                                .min(num_dst - 1);
                            (ids[d], ids[indices[e] as usize])
                        }
                        _ => (rng.below(30) as u32, rng.below(30) as u32),
                    }
                })
                .collect();
            let keys = sorted_pair_keys(&pairs);
            let (p, i) = exclude_edges(&view, &ids, &keys).unwrap();
            let (mut wp, mut wi) = (vec![0u64], Vec::new());
            for d in 0..num_dst {
                for &j in &indices[indptr[d] as usize..indptr[d + 1] as usize] {
                    if !pairs.contains(&(ids[d], ids[j as usize])) {
                        wi.push(j);
                    }
                }
                wp.push(wi.len() as u64);
            }
            assert_eq!((p, i), (wp, wi), "case {case}");
        }
    }
}
