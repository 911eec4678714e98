//! Parity: row selection and placement, the feature cache and its gather.

use std::collections::HashSet;

use cpu_ops::{FeatureMatrix, Rng};
use gpu_ops::{bf16_bits_to_f32, f32_to_bf16_bits, round_to_bf16, Backend, FeatureDtype};

use crate::helpers::*;

pub(crate) fn index_select_and_put_rows<B: Backend>(d: &B) {
    let mut rng = Rng::new(11);
    for dim in DIMS {
        let rows = 57;
        let src = rand_f32(&mut rng, rows * dim);
        let n = 101;
        let idx: Vec<u32> = (0..n).map(|_| rng.below(rows as u64) as u32).collect();
        let mut out = output(d, &vec![f32::NAN; n * dim]);
        d.index_select_rows(
            &input(d, &src),
            dim,
            &input_u32(d, &idx, u32::MAX),
            n,
            &mut out,
        )
        .unwrap();
        let got = read(d, &out, n * dim, "index_select_rows");
        for (r, &i) in idx.iter().enumerate() {
            let i = i as usize;
            assert_eq!(
                bits(&got[r * dim..(r + 1) * dim]),
                bits(&src[i * dim..(i + 1) * dim])
            );
        }
        // Put rows back into distinct places of a larger matrix.
        let dst_rows = 80;
        let mut places: Vec<u32> = (0..dst_rows as u32).collect();
        rng.shuffle(&mut places);
        let places = &places[..rows];
        let before = rand_f32(&mut rng, dst_rows * dim);
        let mut dst = output(d, &before);
        d.index_put_rows(
            &input(d, &src),
            dim,
            &input_u32(d, places, u32::MAX),
            rows,
            &mut dst,
        )
        .unwrap();
        let got = read(d, &dst, dst_rows * dim, "index_put_rows");
        let mut want = before.clone();
        for (r, &p) in places.iter().enumerate() {
            let p = p as usize;
            want[p * dim..(p + 1) * dim].copy_from_slice(&src[r * dim..(r + 1) * dim]);
        }
        assert_eq!(bits(&got), bits(&want), "index_put_rows dim {dim}");
    }
}

pub(crate) fn random_features(rng: &mut Rng, rows: usize, dim: usize) -> FeatureMatrix {
    FeatureMatrix::new(rand_f32(rng, rows * dim).into(), rows, dim).unwrap()
}

/// `m`'s rows of `ids` as a gather of `dtype` rows returns them: bfloat16 rows
/// are rounded to nearest (ties to even) and widened exactly.
fn expected_rows(m: &FeatureMatrix, ids: &[u32], dtype: FeatureDtype) -> Vec<f32> {
    let rows = cpu_ops::gather_rows_into_vec(m, ids).unwrap();
    match dtype {
        FeatureDtype::F32 => rows,
        FeatureDtype::Bf16 => rows.into_iter().map(round_to_bf16).collect(),
    }
}

pub(crate) fn gather_through_the_cache<B: Backend>(d: &B) {
    for dtype in [FeatureDtype::F32, FeatureDtype::Bf16] {
        gather_through_the_cache_as(d, dtype);
    }
}

fn gather_through_the_cache_as<B: Backend>(d: &B, dtype: FeatureDtype) {
    let mut rng = Rng::new(12);
    // 8 and 128: the CUDA kernels' 16-byte path for bfloat16 rows.
    for dim in [1, 7, 8, 100, 128, 129] {
        let rows = 500;
        let m = random_features(&mut rng, rows, dim);
        let mut hot: Vec<u32> = (0..rows as u32).collect();
        rng.shuffle(&mut hot);
        let hot = &hot[..200];
        let row_bytes = dim * dtype.value_bytes();
        // Room for 150 of the 200 hot rows (plus a few spare bytes).
        let budget = 150 * row_bytes + row_bytes / 2;
        let f = d.load_features(&m, hot, budget, dtype).unwrap();
        assert_eq!(d.feature_dim(&f), dim);
        let s = d.cache_stats(&f);
        assert_eq!(
            (s.cached_rows, s.cached_bytes, s.budget_bytes),
            (150, 150 * row_bytes, budget)
        );
        assert!(
            hot[..150].iter().all(|&v| d.is_cached(&f, v)),
            "hottest first"
        );
        assert!(
            hot[150..].iter().all(|&v| !d.is_cached(&f, v)),
            "past the budget"
        );
        for round in 0..3 {
            let n = 333 + round;
            let ids: Vec<u32> = (0..n).map(|_| rng.below(rows as u64) as u32).collect();
            let mut out = output(d, &vec![f32::NAN; n * dim]);
            d.gather(&f, &input_u32(d, &ids, u32::MAX), n, &mut out)
                .unwrap();
            let want = expected_rows(&m, &ids, dtype);
            assert_eq!(
                bits(&read(d, &out, n * dim, "gather")),
                bits(&want),
                "{dtype} dim {dim}"
            );
            let hits = ids.iter().filter(|&&v| d.is_cached(&f, v)).count() as u64;
            let s = d.cache_stats(&f);
            assert_eq!((s.hits, s.misses), (hits, n as u64 - hits), "round {round}");
            d.reset_cache_stats(&f);
            assert_eq!((d.cache_stats(&f).hits, d.cache_stats(&f).misses), (0, 0));
        }
        // An id past the matrix is an error, not a read out of bounds (on CUDA
        // a device fault, reported by the next synchronization).
        let mut out = output(d, &vec![0.0; dim]);
        assert!(d
            .gather(&f, &d.to_device(&[rows as u32]).unwrap(), 1, &mut out)
            .and_then(|()| d.synchronize(d.stream()))
            .is_err());
        // Reported once: the next call is clean.
        d.synchronize(d.stream()).unwrap();
    }
}

/// bfloat16 bits widened on the device equal the exact widening, for even and
/// odd lengths; nothing past `n` is written; a short buffer is an error.
pub(crate) fn widen_bf16_is_exact<B: Backend>(d: &B) {
    let mut rng = Rng::new(14);
    for n in [1usize, 2, 7, 1000, 1001] {
        let x = rand_f32(&mut rng, n);
        let mut halves: Vec<u16> = x.iter().map(|&v| f32_to_bf16_bits(v * 50.0)).collect();
        halves.extend([0x7FC0u16; PAD]);
        let src = d.to_device(&halves).unwrap();
        let mut out = output(d, &vec![f32::NAN; n]);
        d.widen_bf16(&src, n, &mut out).unwrap();
        let want: Vec<f32> = halves[..n].iter().map(|&b| bf16_bits_to_f32(b)).collect();
        assert_eq!(bits(&read(d, &out, n, "widen_bf16")), bits(&want), "n {n}");
    }
    let src = d.to_device(&[0u16; 3]).unwrap();
    let mut out = d.to_device(&[0f32; 3]).unwrap();
    assert!(d.widen_bf16(&src, 4, &mut out).is_err());
}

/// `widen_bf16_at` widens exactly the region asked for, at odd and even
/// offsets on either side; values outside it stay; a region past a buffer is an
/// error.
pub(crate) fn widen_bf16_at_is_exact<B: Backend>(d: &B) {
    let mut rng = Rng::new(15);
    for (src_at, out_at, n) in [
        (0usize, 0usize, 7usize),
        (1, 3, 1000),
        (3, 2, 1001),
        (2, 5, 1),
    ] {
        let x = rand_f32(&mut rng, src_at + n);
        let halves: Vec<u16> = x.iter().map(|&v| f32_to_bf16_bits(v * 50.0)).collect();
        let src = d.to_device(&halves).unwrap();
        let total = out_at + n + 2;
        let mut out = output(d, &vec![-1.5f32; total]);
        d.widen_bf16_at(&src, src_at, n, &mut out, out_at).unwrap();
        let mut want = vec![-1.5f32; total];
        for i in 0..n {
            want[out_at + i] = bf16_bits_to_f32(halves[src_at + i]);
        }
        let got = read(d, &out, total, "widen_bf16_at");
        assert_eq!(
            bits(&got),
            bits(&want),
            "src_at {src_at} out_at {out_at} n {n}"
        );
    }
    let src = d.to_device(&[0u16; 4]).unwrap();
    let mut out = d.to_device(&[0f32; 8]).unwrap();
    assert!(d.widen_bf16_at(&src, 2, 3, &mut out, 0).is_err());
    assert!(d.widen_bf16_at(&src, 0, 3, &mut out, 6).is_err());
}

/// `scale` is one rounded f32 product per value, bit for bit; nothing past `n`
/// changes; a short buffer is an error.
pub(crate) fn scale_is_one_product_per_value<B: Backend>(d: &B) {
    let mut rng = Rng::new(16);
    for (n, alpha) in [
        (1usize, 0.25f32),
        (1000, 0.3719),
        (4097, -3.0e-5),
        (10, 0.0),
    ] {
        let x: Vec<f32> = rand_f32(&mut rng, n).iter().map(|v| v * 1e3).collect();
        let mut buf = output(d, &x);
        d.scale(&mut buf, n, alpha).unwrap();
        let want: Vec<f32> = x.iter().map(|v| v * alpha).collect();
        assert_eq!(bits(&read(d, &buf, n, "scale")), bits(&want), "n {n}");
    }
    let mut short = d.to_device(&[1f32; 3]).unwrap();
    assert!(d.scale(&mut short, 4, 2.0).is_err());
}

/// `count_nonfinite` adds the scalar count of NaN and ±∞ in the prefix to what
/// the counter holds, across calls; values past `n` are not counted; a short
/// buffer is an error.
pub(crate) fn count_nonfinite_counts_nan_and_inf<B: Backend>(d: &B) {
    let mut rng = Rng::new(15);
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN];
    // The counter's second word must stay as it is.
    let mut count = d.to_device(&[7u32, 0xDEAD]).unwrap();
    let got = |count: &B::Buf<u32>| {
        let c = d.to_host(count, 2).unwrap();
        assert_eq!(c[1], 0xDEAD, "count_nonfinite wrote past count[0]");
        c[0]
    };
    let mut want = 7u32;
    for n in [1usize, 31, 1000, 70_001] {
        let mut x = rand_f32(&mut rng, n);
        // Large finite values and subnormals are finite.
        x[0] = f32::MAX;
        if n > 1 {
            x[n - 1] = f32::MIN_POSITIVE / 4.0;
        }
        for k in 0..(n / 97) {
            let at = (rng.below(n as u64)) as usize;
            x[at] = specials[k % specials.len()];
        }
        want += x.iter().filter(|v| !v.is_finite()).count() as u32;
        x.extend([f32::NAN; PAD]);
        d.count_nonfinite(&d.to_device(&x).unwrap(), n, &mut count)
            .unwrap();
        assert_eq!(got(&count), want, "n {n}");
    }
    // Nothing to count leaves the counter alone.
    let x = d.to_device(&[f32::NAN]).unwrap();
    d.count_nonfinite(&x, 0, &mut count).unwrap();
    assert_eq!(got(&count), want);
    assert!(d.count_nonfinite(&x, 2, &mut count).is_err());
    let mut empty = d.alloc::<u32>(0).unwrap();
    assert!(d.count_nonfinite(&x, 1, &mut empty).is_err());
}

pub(crate) fn update_cache_stays_in_budget<B: Backend>(d: &B) {
    for dtype in [FeatureDtype::F32, FeatureDtype::Bf16] {
        update_cache_stays_in_budget_as(d, dtype);
    }
}

fn update_cache_stays_in_budget_as<B: Backend>(d: &B, dtype: FeatureDtype) {
    let mut rng = Rng::new(13);
    let (rows, dim) = (300, 11);
    let m = random_features(&mut rng, rows, dim);
    let budget = 40 * dim * dtype.value_bytes() + 3;
    let mut f = d.load_features(&m, &[], budget, dtype).unwrap();
    assert_eq!(d.cache_stats(&f).cached_rows, 0);
    let mut model: HashSet<u32> = HashSet::new();
    for _ in 0..50 {
        let ins: Vec<u32> = (0..rng.below(30))
            .map(|_| rng.below(rows as u64) as u32)
            .collect();
        let ev: Vec<u32> = (0..rng.below(30))
            .map(|_| rng.below(rows as u64) as u32)
            .collect();
        let got = d.update_cache(&mut f, &ins, &ev).unwrap();
        for v in &ev {
            model.remove(v);
        }
        let mut cached = 0;
        for &v in &ins {
            if model.contains(&v) || (model.len() < 40 && model.insert(v)) {
                cached += 1;
            }
        }
        assert_eq!(got, cached, "entries of insert cached after the update");
        let s = d.cache_stats(&f);
        assert!(s.cached_bytes <= budget, "{} > {budget}", s.cached_bytes);
        assert_eq!(s.cached_rows, model.len());
        for v in 0..rows as u32 {
            assert_eq!(d.is_cached(&f, v), model.contains(&v), "vertex {v}");
        }
        // The rows cached by updates are the right rows.
        let ids: Vec<u32> = model.iter().copied().collect();
        let mut out = output(d, &vec![0.0; ids.len() * dim]);
        d.gather(&f, &input_u32(d, &ids, 0), ids.len(), &mut out)
            .unwrap();
        let want = expected_rows(&m, &ids, dtype);
        assert_eq!(
            bits(&read(d, &out, ids.len() * dim, "gather cached")),
            bits(&want)
        );
    }
    assert!(d.update_cache(&mut f, &[rows as u32], &[]).is_err());
    assert!(d.update_cache(&mut f, &[], &[rows as u32]).is_err());
}
