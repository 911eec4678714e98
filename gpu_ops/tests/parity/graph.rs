//! Parity: aggregation, self-loops and GAT attention over blocks.

use cpu_ops::{AggregateKind, GatInputs, Rng};
use gpu_ops::{Backend, GatInputsDev};

use crate::helpers::*;

pub(crate) fn aggregate_forward_backward<B: Backend>(d: &B) {
    let mut rng = Rng::new(8);
    for (nd, ns, deg) in BLOCK_SHAPES {
        let csr = Csr::random(&mut rng, nd, ns, deg);
        let block = csr.upload(d);
        assert_eq!(d.block_shape(&block), (ns, nd, csr.indices.len()));
        for dim in DIMS {
            let x = rand_f32(&mut rng, ns * dim);
            let gy = rand_f32(&mut rng, nd * dim);
            let (dx, dgy) = (input(d, &x), input(d, &gy));
            for kind in [
                AggregateKind::Sum,
                AggregateKind::Mean,
                AggregateKind::GcnNorm,
            ] {
                let what = format!("{kind:?} {nd}x{ns} dim {dim}");
                let mut want = vec![0.0f64; nd * dim];
                cpu_ops::aggregate_forward(&csr.view(), kind, &to64(&x), dim, &mut want).unwrap();
                let mut out = output(d, &vec![f32::NAN; nd * dim]);
                d.aggregate_forward(&block, kind, &dx, dim, &mut out)
                    .unwrap();
                assert_close(
                    &format!("forward {what}"),
                    &read(d, &out, nd * dim, &what),
                    &want,
                    1e-5,
                );

                let mut want = vec![0.0f64; ns * dim];
                cpu_ops::aggregate_backward(&csr.view(), kind, &to64(&gy), dim, &mut want).unwrap();
                let mut gx = output(d, &vec![f32::NAN; ns * dim]);
                d.aggregate_backward(&block, kind, &dgy, dim, &mut gx)
                    .unwrap();
                assert_close(
                    &format!("backward {what}"),
                    &read(d, &gx, ns * dim, &what),
                    &want,
                    1e-5,
                );
            }
        }
    }
}

pub(crate) fn self_loops_append_each_destination<B: Backend>(d: &B) {
    let mut rng = Rng::new(9);
    let csr = Csr::random(&mut rng, 29, 70, 6);
    let mut indptr = vec![0u64];
    let mut indices = Vec::new();
    for i in 0..csr.num_dst() {
        indices.extend_from_slice(csr.view().neighbors(i));
        indices.push(i as u32);
        indptr.push(indices.len() as u64);
    }
    let aug = Csr {
        num_src: 70,
        indptr,
        indices,
    };
    let block = d.add_self_loops(&csr.upload(d)).unwrap();
    assert_eq!(d.block_shape(&block), (70, 29, aug.indices.len()));
    let dim = 5;
    let x = rand_f32(&mut rng, 70 * dim);
    for kind in [AggregateKind::Sum, AggregateKind::GcnNorm] {
        let mut want = vec![0.0f64; 29 * dim];
        cpu_ops::aggregate_forward(&aug.view(), kind, &to64(&x), dim, &mut want).unwrap();
        let mut out = output(d, &vec![0.0; 29 * dim]);
        d.aggregate_forward(&block, kind, &input(d, &x), dim, &mut out)
            .unwrap();
        assert_close(
            "self loops",
            &read(d, &out, 29 * dim, "self loops"),
            &want,
            1e-5,
        );
    }
}

pub(crate) fn gat_forward_backward<B: Backend>(d: &B) {
    let mut rng = Rng::new(10);
    for (nd, ns, deg) in BLOCK_SHAPES {
        for (heads, f) in [(1, 1), (3, 5), (2, 17), (1, 64)] {
            let csr = Csr::random(&mut rng, nd, ns, deg);
            let w = heads * f;
            let z = rand_f32(&mut rng, ns * w);
            let a_src: Vec<f32> = rand_f32(&mut rng, w).iter().map(|v| v * 2.0).collect();
            let a_dst: Vec<f32> = rand_f32(&mut rng, w).iter().map(|v| v * 2.0).collect();
            let g = rand_f32(&mut rng, nd * w);
            let (z64, as64, ad64) = (to64(&z), to64(&a_src), to64(&a_dst));
            let inp = GatInputs {
                heads,
                head_dim: f,
                z_src: &z64,
                a_src: &as64,
                a_dst: &ad64,
            };
            let view = csr.view();
            let fwd = cpu_ops::gat_forward(&view, &inp).unwrap();
            let grads = cpu_ops::gat_backward(&view, &inp, &fwd, &to64(&g)).unwrap();

            let block = csr.upload(d);
            let (dz, das, dad) = (input(d, &z), input(d, &a_src), input(d, &a_dst));
            let dinp = GatInputsDev {
                heads,
                head_dim: f,
                z_src: &dz,
                a_src: &das,
                a_dst: &dad,
            };
            let saved = d.gat_forward(&block, &dinp).unwrap();
            let what = format!("GAT {nd}x{ns} H={heads} F={f}");
            let e = csr.indices.len();
            assert_close(
                &format!("out {what}"),
                &down(d, &saved.out, nd * w),
                fwd.out(),
                1e-4,
            );
            assert_close(
                &format!("alpha {what}"),
                &down(d, &saved.alpha, e * heads),
                fwd.alpha(),
                1e-4,
            );
            assert_close(
                &format!("el {what}"),
                &down(d, &saved.el, ns * heads),
                fwd.el(),
                1e-4,
            );
            assert_close(
                &format!("er {what}"),
                &down(d, &saved.er, nd * heads),
                fwd.er(),
                1e-4,
            );
            let got = d
                .gat_backward(&block, &dinp, &saved, &input(d, &g))
                .unwrap();
            assert_close(
                &format!("dz {what}"),
                &down(d, &got.z_src, ns * w),
                &grads.z_src,
                1e-4,
            );
            assert_close(
                &format!("da_src {what}"),
                &down(d, &got.a_src, w),
                &grads.a_src,
                1e-4,
            );
            assert_close(
                &format!("da_dst {what}"),
                &down(d, &got.a_dst, w),
                &grads.a_dst,
                1e-4,
            );
        }
    }
}
