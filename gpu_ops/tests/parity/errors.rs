//! Parity: malformed input and too-short buffers are typed errors, never panics.

use cpu_ops::{AggregateKind, FeatureMatrix};
use gpu_ops::{AdamStep, Backend, DevMat, GatInputsDev};

use crate::helpers::*;

pub(crate) fn malformed_blocks_are_errors<B: Backend>(d: &B) {
    assert!(d.block_from_host(4, &[], &[]).is_err());
    assert!(d.block_from_host(4, &[0, 1], &[4]).is_err());
    assert!(d.block_from_host(4, &[0, 2, 1], &[0, 0]).is_err());
    assert!(d.block_from_host(1, &[0, 0, 0], &[]).is_err());
    assert!(d.block_from_host(4, &[0, 3], &[0, 1]).is_err());
    assert!(d.block_from_host(4, &[1, 1], &[]).is_err());
}

pub(crate) fn too_short_buffers_are_size_mismatch<B: Backend>(d: &B) {
    let f = |n: usize| d.alloc::<f32>(n).unwrap();
    let u = |n: usize| d.alloc::<u32>(n).unwrap();
    // memory
    assert_size_mismatch("upload", d.upload(d.stream(), &[0.0f32; 5], &mut f(4)));
    assert_size_mismatch("download", d.download(d.stream(), &f(4), &mut [0.0f32; 5]));
    assert_size_mismatch("copy src", d.copy(&f(3), &mut f(5), 4));
    assert_size_mismatch("copy dst", d.copy(&f(5), &mut f(3), 4));
    assert_size_mismatch("fill_zero", d.fill_zero(&mut f(3), 4));
    // matmul 4×5 · 5×6, stored as read or transposed
    assert_size_mismatch(
        "matmul a",
        d.matmul(
            DevMat::new(&f(19), 4, 5),
            DevMat::new(&f(30), 5, 6),
            &mut f(24),
            false,
        ),
    );
    assert_size_mismatch(
        "matmul b",
        d.matmul(
            DevMat::new(&f(20), 5, 4).t(),
            DevMat::new(&f(29), 6, 5).t(),
            &mut f(24),
            false,
        ),
    );
    assert_size_mismatch(
        "matmul c",
        d.matmul(
            DevMat::new(&f(20), 4, 5),
            DevMat::new(&f(30), 6, 5).t(),
            &mut f(23),
            true,
        ),
    );
    // matmul 4×5 · 6×5: the inner sizes differ (5 ≠ 6), whatever the buffers hold
    assert_size_mismatch(
        "matmul inner",
        d.matmul(
            DevMat::new(&f(20), 4, 5),
            DevMat::new(&f(30), 6, 5),
            &mut f(24),
            false,
        ),
    );
    // graph ops on a 3 → 5 block
    let b = d.block_from_host(5, &[0, 2, 3, 3], &[4, 1, 0]).unwrap();
    for kind in [AggregateKind::Sum, AggregateKind::GcnNorm] {
        assert_size_mismatch("agg x", d.aggregate_forward(&b, kind, &f(9), 2, &mut f(6)));
        assert_size_mismatch(
            "agg out",
            d.aggregate_forward(&b, kind, &f(10), 2, &mut f(5)),
        );
        assert_size_mismatch(
            "agg gy",
            d.aggregate_backward(&b, kind, &f(5), 2, &mut f(10)),
        );
        assert_size_mismatch(
            "agg gx",
            d.aggregate_backward(&b, kind, &f(6), 2, &mut f(9)),
        );
    }
    // GAT with 2 heads of width 3 on it
    let gat = |z: &B::Buf<f32>, a_src: &B::Buf<f32>, a_dst: &B::Buf<f32>| {
        let inp = GatInputsDev {
            heads: 2,
            head_dim: 3,
            z_src: z,
            a_src,
            a_dst,
        };
        d.gat_forward(&b, &inp)
    };
    assert_size_mismatch("gat z", gat(&f(29), &f(6), &f(6)));
    assert_size_mismatch("gat a_src", gat(&f(30), &f(5), &f(6)));
    assert_size_mismatch("gat a_dst", gat(&f(30), &f(6), &f(5)));
    let (z, a_src, a_dst) = (f(30), f(6), f(6));
    let inp = GatInputsDev {
        heads: 2,
        head_dim: 3,
        z_src: &z,
        a_src: &a_src,
        a_dst: &a_dst,
    };
    let saved = d.gat_forward(&b, &inp).unwrap();
    assert_size_mismatch("gat grad_out", d.gat_backward(&b, &inp, &saved, &f(17)));
    // element-wise
    assert_size_mismatch("add_bias x", d.add_bias(&mut f(11), 3, 4, &f(4)));
    assert_size_mismatch("add_bias bias", d.add_bias(&mut f(12), 3, 4, &f(3)));
    assert_size_mismatch("bias_grad dy", d.bias_grad(&f(11), 3, 4, &mut f(4), false));
    assert_size_mismatch("bias_grad db", d.bias_grad(&f(12), 3, 4, &mut f(3), true));
    assert_size_mismatch("relu", d.relu(&mut f(3), 4));
    assert_size_mismatch("relu_backward y", d.relu_backward(&f(3), &mut f(4), 4));
    assert_size_mismatch("relu_backward dy", d.relu_backward(&f(4), &mut f(3), 4));
    assert_size_mismatch("elu", d.elu(&mut f(3), 4, 1.0));
    assert_size_mismatch("elu_backward", d.elu_backward(&f(4), &mut f(3), 4, 1.0));
    assert_size_mismatch("dropout", d.dropout(&mut f(3), 4, 0.5, 1));
    let mask = d.dropout(&mut f(8), 8, 0.5, 1).unwrap();
    assert_size_mismatch(
        "dropout_backward dy",
        d.dropout_backward(&mask, &mut f(7), 8),
    );
    assert_size_mismatch(
        "dropout_backward n",
        d.dropout_backward(&mask, &mut f(9), 9),
    );
    assert_size_mismatch(
        "CE logits",
        d.softmax_cross_entropy(&f(11), 3, 4, &u(3), None),
    );
    assert_size_mismatch(
        "CE labels",
        d.softmax_cross_entropy(&f(12), 3, 4, &u(2), None),
    );
    assert_size_mismatch(
        "CE grad",
        d.softmax_cross_entropy(&f(12), 3, 4, &u(3), Some(&mut f(11))),
    );
    let hp = AdamStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 1,
    };
    assert_size_mismatch(
        "adam p",
        d.adam_step(&hp, &mut f(3), &f(4), &mut f(4), &mut f(4), 4),
    );
    assert_size_mismatch(
        "adam g",
        d.adam_step(&hp, &mut f(4), &f(3), &mut f(4), &mut f(4), 4),
    );
    assert_size_mismatch(
        "adam m",
        d.adam_step(&hp, &mut f(4), &f(4), &mut f(3), &mut f(4), 4),
    );
    assert_size_mismatch(
        "adam v",
        d.adam_step(&hp, &mut f(4), &f(4), &mut f(4), &mut f(3), 4),
    );
    // rows and features
    assert_size_mismatch(
        "select idx",
        d.index_select_rows(&f(12), 3, &u(2), 3, &mut f(9)),
    );
    assert_size_mismatch(
        "select out",
        d.index_select_rows(&f(12), 3, &u(3), 3, &mut f(8)),
    );
    assert_size_mismatch(
        "put src",
        d.index_put_rows(
            &f(8),
            3,
            &d.to_device(&[0u32, 1, 2]).unwrap(),
            3,
            &mut f(12),
        ),
    );
    assert_size_mismatch("put idx", d.index_put_rows(&f(9), 3, &u(2), 3, &mut f(12)));
    let m = FeatureMatrix::new(vec![0.0; 20].into(), 10, 2).unwrap();
    let feats = d
        .load_features(&m, &[1, 2], 1 << 10, gpu_ops::FeatureDtype::F32)
        .unwrap();
    assert_size_mismatch("gather ids", d.gather(&feats, &u(2), 3, &mut f(6)));
    assert_size_mismatch("gather out", d.gather(&feats, &u(3), 3, &mut f(5)));
    assert_size_mismatch("relabel targets", d.unique_relabel(&u(1), 2, &u(3), 3));
    assert_size_mismatch("relabel candidates", d.unique_relabel(&u(2), 0, &u(2), 3));
}

/// `a` fails a gather with an id past its feature matrix (a device-side check on
/// CUDA, reported at the next synchronization) over and over on one thread while
/// `b` gathers valid rows on another: every one of `a`'s gathers is an error and
/// none of `b`'s is — a backend's errors are its own.
pub(crate) fn two_backends_keep_their_own_errors<B: Backend>(a: &B, b: &B) {
    let rows = 50;
    let dim = 8;
    let data: Vec<f32> = (0..rows * dim).map(|i| i as f32).collect();
    let m = FeatureMatrix::new(data.into(), rows, dim).unwrap();
    let fa = a
        .load_features(&m, &[], 0, gpu_ops::FeatureDtype::F32)
        .unwrap();
    let fb = b
        .load_features(&m, &[0, 1, 2], 3 * dim * 4, gpu_ops::FeatureDtype::F32)
        .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..50 {
                let mut out = a.alloc::<f32>(dim).unwrap();
                let bad = a.to_device(&[rows as u32]).unwrap();
                let r = a
                    .gather(&fa, &bad, 1, &mut out)
                    .and_then(|()| a.to_host(&out, dim).map(|_| ()));
                assert!(r.is_err(), "a bad gather on backend a went unnoticed");
            }
        });
        s.spawn(|| {
            for i in 0..50u32 {
                let ids = [i % rows as u32, (i * 7) % rows as u32];
                let mut out = b.alloc::<f32>(2 * dim).unwrap();
                b.gather(&fb, &b.to_device(&ids).unwrap(), 2, &mut out)
                    .expect("backend b saw an error it did not make");
                let got = b.to_host(&out, 2 * dim).expect("backend b's download");
                assert_eq!(got[0], (ids[0] as usize * dim) as f32);
            }
        });
    });
}
