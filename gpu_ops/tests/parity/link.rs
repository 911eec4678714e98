//! Parity: link prediction's ops (pair scores and their backwards, the binary
//! cross-entropy synchronous and deferred, negative sampling, edge exclusion)
//! against `cpu_ops`' twins, on odd sizes. Negatives and exclusion are exact
//! on every backend; the float ops are within rounding (bit for bit on the
//! host backend, which runs the twins themselves).

use cpu_ops::Rng;
use gpu_ops::{Backend, DeviceKind, LossSlot};

use crate::helpers::*;

/// `(rows, dim, pairs)`: odd sizes around warp widths.
const PAIR_SHAPES: [(usize, usize, usize); 4] =
    [(1, 1, 1), (13, 3, 29), (37, 17, 101), (64, 33, 255)];

fn ids(rng: &mut Rng, n: usize, below: usize) -> Vec<u32> {
    (0..n).map(|_| rng.below(below as u64) as u32).collect()
}

pub(crate) fn pair_ops_match_cpu_ops<B: Backend>(d: &B) {
    let mut rng = Rng::new(31);
    let host = d.kind() == DeviceKind::Host;
    for (rows, dim, n) in PAIR_SHAPES {
        let h = rand_f32(&mut rng, rows * dim);
        let (src, dst) = (ids(&mut rng, n, rows), ids(&mut rng, n, rows));
        let what = format!("rows {rows} dim {dim} pairs {n}");
        let (dh, ds, dd) = (input(d, &h), input_u32(d, &src, 0), input_u32(d, &dst, 0));
        let h64 = to64(&h);
        // Scores.
        let mut out = output(d, &vec![f32::NAN; n]);
        d.pair_dot(&dh, dim, &ds, &dd, n, &mut out).unwrap();
        let got = read(d, &out, n, &format!("pair_dot {what}"));
        let mut want = vec![0.0f64; n];
        cpu_ops::pair_dot(&h64, dim, &src, &dst, &mut want).unwrap();
        assert_close(&format!("pair_dot {what}"), &got, &want, 1e-5);
        if host {
            let mut exact = vec![0.0f32; n];
            cpu_ops::pair_dot(&h, dim, &src, &dst, &mut exact).unwrap();
            assert_eq!(bits(&got), bits(&exact), "pair_dot {what}: host bits");
        }
        let mut out = output(d, &vec![f32::NAN; n * dim]);
        d.pair_hadamard(&dh, dim, &ds, &dd, n, &mut out).unwrap();
        let got = read(d, &out, n * dim, &format!("pair_hadamard {what}"));
        let mut want = vec![0.0f64; n * dim];
        cpu_ops::pair_hadamard(&h64, dim, &src, &dst, &mut want).unwrap();
        assert_close(&format!("pair_hadamard {what}"), &got, &want, 1e-6);
        // Backwards add into what the gradient held.
        let g = rand_f32(&mut rng, n);
        let gz = rand_f32(&mut rng, n * dim);
        let start = rand_f32(&mut rng, rows * dim);
        for hadamard in [false, true] {
            let op = if hadamard {
                "pair_hadamard_backward"
            } else {
                "pair_dot_backward"
            };
            let mut acc = output(d, &start);
            let mut want = to64(&start);
            if hadamard {
                d.pair_hadamard_backward(&dh, dim, &ds, &dd, n, &input(d, &gz), &mut acc)
                    .unwrap();
                cpu_ops::pair_hadamard_backward(&h64, dim, &src, &dst, &to64(&gz), &mut want)
                    .unwrap();
            } else {
                d.pair_dot_backward(&dh, dim, &ds, &dd, n, &input(d, &g), &mut acc)
                    .unwrap();
                cpu_ops::pair_dot_backward(&h64, dim, &src, &dst, &to64(&g), &mut want).unwrap();
            }
            let got = read(d, &acc, rows * dim, &format!("{op} {what}"));
            assert_close(&format!("{op} {what}"), &got, &want, 1e-5);
        }
    }
    // An id past the rows: an error now (host) or at the next synchronization
    // (CUDA's fault word); the backend goes on working.
    let h = input(d, &[1.0f32; 6]);
    let (ok, bad) = (input_u32(d, &[0, 1], 0), input_u32(d, &[1, 7], 0));
    let mut out = output(d, &[0.0; 2]);
    let r = d
        .pair_dot(&h, 3, &ok, &bad, 2, &mut out)
        .and_then(|()| d.synchronize(d.stream()));
    assert!(r.is_err(), "pair id 7 of 2 rows: {r:?}");
    d.pair_dot(&h, 3, &ok, &ok, 2, &mut out).unwrap();
    assert_eq!(read(d, &out, 2, "pair_dot after a fault"), vec![3.0, 3.0]);
    assert!(d.pair_dot(&h, 0, &ok, &ok, 2, &mut out).is_err(), "dim 0");
    assert_size_mismatch("pair_dot src", d.pair_dot(&h, 3, &ok, &ok, 8, &mut out));
}

pub(crate) fn bce_matches_cpu_ops<B: Backend>(d: &B) {
    let mut rng = Rng::new(32);
    let host = d.kind() == DeviceKind::Host;
    for n in [1usize, 7, 333, 1025] {
        let logits: Vec<f32> = rand_f32(&mut rng, n).iter().map(|v| 12.0 * v).collect();
        let labels: Vec<f32> = (0..n).map(|_| rng.below(2) as f32).collect();
        let mut want_g = vec![0.0f64; n];
        let want =
            cpu_ops::bce_with_logits(&to64(&logits), &to64(&labels), Some(&mut want_g)).unwrap();
        let (dl, dy) = (input(d, &logits), input(d, &labels));
        let mut g = output(d, &vec![f32::NAN; n]);
        let got = d.bce_with_logits(&dl, &dy, n, Some(&mut g)).unwrap();
        let what = format!("bce n={n}");
        assert!(
            (got.loss - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0),
            "{what}: loss {} vs {}",
            got.loss,
            want.loss
        );
        assert_eq!(got.correct, want.correct, "{what}: correct");
        let grad = read(d, &g, n, &what);
        assert_close(&format!("{what} gradient"), &grad, &want_g, 1e-6);
        let no_grad = d.bce_with_logits(&dl, &dy, n, None).unwrap();
        assert_eq!(no_grad, got, "{what}: without the gradient");
        // Deferred: the sum and the count in the slot, no synchronization,
        // the guard untouched by a finite loss.
        let mut slots = d.alloc::<u64>(6).unwrap();
        let mut guard = d.alloc::<u32>(1).unwrap();
        let mut g2 = output(d, &vec![f32::NAN; n]);
        let before = d.transfer_stats();
        let dest = LossSlot {
            out: &mut slots,
            slot: 2,
        };
        d.bce_with_logits_deferred(&dl, &dy, n, &mut g2, dest, &mut guard)
            .unwrap();
        assert_eq!(
            d.transfer_stats().since(&before).syncs,
            0,
            "{what}: deferred synced"
        );
        let words = down(d, &slots, 6);
        let sum = f64::from_bits(words[4]);
        assert!(
            (sum / n as f64 - got.loss).abs() <= 1e-6 * got.loss.abs().max(1.0),
            "{what}: deferred sum {sum}"
        );
        assert_eq!(words[5], got.correct as u64);
        assert_eq!(&words[..4], &[0; 4], "{what}: other slots written");
        assert_eq!(down(d, &guard, 1), vec![0]);
        assert_eq!(
            bits(&read(d, &g2, n, &what)),
            bits(&grad),
            "{what}: deferred gradient"
        );
        if host {
            assert_eq!(sum, got.loss * n as f64, "{what}: host sum");
        }
        // A NaN logit: a non-finite sum sets the guard.
        let mut bad = logits.clone();
        bad[n / 2] = f32::NAN;
        let dest = LossSlot {
            out: &mut slots,
            slot: 0,
        };
        d.bce_with_logits_deferred(&input(d, &bad), &dy, n, &mut g2, dest, &mut guard)
            .unwrap();
        assert_eq!(down(d, &guard, 1), vec![1], "{what}: guard not set by NaN");
        assert!(!f64::from_bits(down(d, &slots, 1)[0]).is_finite());
    }
    let zero = d.alloc::<f32>(0).unwrap();
    let none = d.bce_with_logits(&zero, &zero, 0, None).unwrap();
    assert_eq!((none.loss, none.correct), (0.0, 0));
    let short = input(d, &[0.5f32; 2]);
    assert_size_mismatch("bce labels", d.bce_with_logits(&short, &short, 9, None));
}

pub(crate) fn negatives_are_identical_on_every_backend<B: Backend>(d: &B) {
    let mut rng = Rng::new(33);
    for nv in [1usize, 1001] {
        let degrees: Vec<u32> = (0..nv)
            .map(|v| {
                if v % 7 == 3 {
                    0
                } else {
                    rng.below(60) as u32 + 1
                }
            })
            .collect();
        let cdf = cpu_ops::negative_cdf(&degrees, 0.75).unwrap();
        let dists = [
            (d.negative_dist(&degrees, 0.0).unwrap(), None),
            (
                d.negative_dist(&degrees, 0.75).unwrap(),
                Some(cdf.as_slice()),
            ),
        ];
        for (dist, table) in &dists {
            assert_eq!(dist.num_vertices(), nv);
            assert_eq!(dist.cdf().is_some(), table.is_some());
            for (n_pos, k) in [(1usize, 1usize), (37, 3), (500, 5)] {
                let src = ids(&mut rng, n_pos, nv);
                let total = n_pos * k;
                let mut want_s = vec![0u32; total];
                let mut want_d = vec![0u32; total];
                cpu_ops::sample_negatives(nv, k, &src, 77, *table, &mut want_s, &mut want_d)
                    .unwrap();
                let ds = input_u32(d, &src, u32::MAX);
                let mut os = input_u32(d, &vec![0; total], 0xabcd);
                let mut od = input_u32(d, &vec![0; total], 0xabcd);
                d.sample_negatives(nv, k, &ds, n_pos, 77, dist, &mut os, &mut od)
                    .unwrap();
                let (gs, gd) = (down(d, &os, total + PAD), down(d, &od, total + PAD));
                let what = format!("{nv} vertices, {n_pos} × {k}, table {}", table.is_some());
                assert_eq!(&gs[..total], &want_s[..], "{what}: sources");
                assert_eq!(&gd[..total], &want_d[..], "{what}: negatives");
                assert!(
                    gs[total..].iter().chain(&gd[total..]).all(|&v| v == 0xabcd),
                    "{what}: wrote past"
                );
                if table.is_some() {
                    assert!(
                        gd[..total].iter().all(|&v| degrees[v as usize] > 0),
                        "{what}: degree 0 drawn"
                    );
                }
            }
        }
        // The distribution's vertex count is checked.
        let src = input_u32(d, &[0], 0);
        let (mut os, mut od) = (input_u32(d, &[0], 0), input_u32(d, &[0], 0));
        assert!(d
            .sample_negatives(nv + 1, 1, &src, 1, 0, &dists[0].0, &mut os, &mut od)
            .is_err());
        assert_size_mismatch(
            "negative outputs",
            d.sample_negatives(nv, 9, &src, 1, 0, &dists[1].0, &mut os, &mut od),
        );
    }
    assert!(
        d.negative_dist(&[0, 0, 0], 0.75).is_err(),
        "no vertex with an edge"
    );
    assert!(d.negative_dist(&[], 0.0).is_err(), "no vertex");
    assert!(d.negative_dist(&[1, 2], -1.0).is_err(), "negative power");
}

pub(crate) fn exclude_edges_match_cpu_ops<B: Backend>(d: &B) {
    let mut rng = Rng::new(34);
    for (num_dst, num_src, max_deg) in BLOCK_SHAPES {
        let csr = Csr::random(&mut rng, num_dst, num_src, max_deg);
        // Distinct global ids for the sources, destinations first.
        let mut pool: Vec<u32> = (0..(4 * num_src) as u32).collect();
        rng.shuffle(&mut pool);
        let global = &pool[..num_src];
        // Every third edge's pair, its reverse, and pairs of no edge.
        let mut pairs = Vec::new();
        for i in 0..num_dst {
            for &j in csr.view().neighbors(i).iter().step_by(3) {
                pairs.push((global[i], global[j as usize]));
                pairs.push((global[j as usize], global[i]));
            }
        }
        pairs.extend((0..9).map(|_| (rng.below(1 << 20) as u32, rng.below(1 << 20) as u32)));
        let keys = cpu_ops::sorted_pair_keys(&pairs);
        let want = cpu_ops::exclude_edges(&csr.view(), global, &keys).unwrap();
        let block = csr.upload(d);
        let ids = input_u32(d, global, u32::MAX);
        let excluded = d.excluded_pairs(&pairs).unwrap();
        assert_eq!(excluded.len(), keys.len());
        let out = d.exclude_edges(&block, &ids, num_dst, &excluded).unwrap();
        let what = format!("exclude_edges {num_dst} × {num_src}");
        assert_eq!(d.block_to_host(&out).unwrap(), want, "{what}");
        assert_eq!(
            d.block_shape(&out),
            (num_src, num_dst, want.1.len()),
            "{what}"
        );
        if !csr.indices.is_empty() && num_dst > 1 {
            assert!(want.1.len() < csr.indices.len(), "{what}: nothing excluded");
        }
        // Nothing to exclude: the same block.
        let none = d.excluded_pairs(&[]).unwrap();
        assert!(none.is_empty());
        let same = d.exclude_edges(&block, &ids, num_dst, &none).unwrap();
        assert_eq!(
            d.block_to_host(&same).unwrap(),
            (csr.indptr.clone(), csr.indices.clone()),
            "{what}: empty table"
        );
        assert!(d
            .exclude_edges(&block, &ids, num_dst + 1, &excluded)
            .is_err());
        // Fewer ids than sources (an unpadded buffer).
        let short = d.to_device(&global[..num_src - 1]).unwrap();
        assert_size_mismatch(
            "exclude_edges ids",
            d.exclude_edges(&block, &short, num_dst, &excluded),
        );
    }
}
