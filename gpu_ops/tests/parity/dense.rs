//! Parity: dense math, activations, dropout, loss and Adam.

use cpu_ops::{
    Accumulate, Adam, AdamConfig, MatMut, MatRef, Optimizer, Rng, Transpose, WeightDecay,
};
use gpu_ops::{
    ActBackward, Activation, AdamStep, AdamTensors, Backend, DevMat, DeviceKind, LossSlot,
    XentInputs,
};

use crate::helpers::*;

pub(crate) fn gemm_all_transposes<B: Backend>(d: &B) {
    let mut rng = Rng::new(2);
    for (m, n, k) in [
        (1, 1, 1),
        (7, 5, 3),
        (33, 17, 65),
        (130, 9, 31),
        (3, 129, 200),
    ] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for acc in [false, true] {
                let a = rand_f32(&mut rng, m * k);
                let b = rand_f32(&mut rng, k * n);
                let c0 = rand_f32(&mut rng, m * n);
                let (ar, ac) = if ta { (k, m) } else { (m, k) };
                let (br, bc) = if tb { (n, k) } else { (k, n) };
                let mut want = to64(&c0);
                let t = |x| if x { Transpose::Yes } else { Transpose::No };
                let acc_ref = if acc { Accumulate::Yes } else { Accumulate::No };
                cpu_ops::gemm_reference(
                    MatRef::new(&to64(&a), ar, ac).unwrap(),
                    t(ta),
                    MatRef::new(&to64(&b), br, bc).unwrap(),
                    t(tb),
                    MatMut::new(&mut want, m, n).unwrap(),
                    acc_ref,
                )
                .unwrap();
                let (da, db) = (input(d, &a), input(d, &b));
                // Without accumulate C's old values must not be read: start from NaN.
                let start = if acc {
                    c0.clone()
                } else {
                    vec![f32::NAN; m * n]
                };
                // The operands as stored, read transposed when asked.
                let view = |buf, rows, cols, t: bool| {
                    let v = DevMat::new(buf, rows, cols);
                    if t {
                        v.t()
                    } else {
                        v
                    }
                };
                let mut dc = output(d, &start);
                d.matmul(view(&da, ar, ac, ta), view(&db, br, bc, tb), &mut dc, acc)
                    .unwrap();
                let what = format!("gemm m={m} n={n} k={k} ta={ta} tb={tb} acc={acc}");
                let got = read(d, &dc, m * n, &what);
                assert_close(&what, &got, &want, 1e-5);
            }
        }
    }
}

/// `Precision::Tf32`: products within TF32's input rounding of the exact
/// product, and (host) exactly the fp32 product of inputs rounded to TF32;
/// `Fp32` restores fp32 products. Per backend instance.
pub(crate) fn gemm_tf32<B: Backend>(d: &B) {
    assert_eq!(d.precision(), gpu_ops::Precision::Fp32);
    d.set_precision(gpu_ops::Precision::Tf32).unwrap();
    assert_eq!(d.precision(), gpu_ops::Precision::Tf32);
    let mut rng = Rng::new(21);
    let host = d.kind() == gpu_ops::DeviceKind::Host;
    for (m, n, k) in [(33, 17, 65), (130, 64, 200), (256, 256, 256)] {
        let a = rand_f32(&mut rng, m * k);
        let b = rand_f32(&mut rng, k * n);
        let product = |a: &[f32], b: &[f32]| {
            let mut want = vec![0f64; m * n];
            cpu_ops::gemm_reference(
                MatRef::new(&to64(a), m, k).unwrap(),
                Transpose::No,
                MatRef::new(&to64(b), k, n).unwrap(),
                Transpose::No,
                MatMut::new(&mut want, m, n).unwrap(),
                Accumulate::No,
            )
            .unwrap();
            want
        };
        let exact = product(&a, &b);
        let r = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| gpu_ops::round_to_tf32(x)).collect() };
        let rounded = product(&r(&a), &r(&b));
        let mut dc = output(d, &vec![f32::NAN; m * n]);
        let (da, db) = (input(d, &a), input(d, &b));
        d.matmul(
            DevMat::new(&da, m, k),
            DevMat::new(&db, k, n),
            &mut dc,
            false,
        )
        .unwrap();
        let what = format!("tf32 gemm m={m} n={n} k={k}");
        let got = read(d, &dc, m * n, &what);
        // Each input carries a relative error ≤ 2^-11: a product term ≤ 2^-10.
        assert_close(&what, &got, &exact, 4e-3);
        if host {
            assert_close(&what, &got, &rounded, 1e-5);
            let worst = got
                .iter()
                .zip(&exact)
                .map(|(&g, &w)| (f64::from(g) - w).abs())
                .fold(0f64, f64::max);
            assert!(worst > 1e-5, "{what}: no TF32 rounding seen ({worst:e})");
        }
    }
    d.set_precision(gpu_ops::Precision::Fp32).unwrap();
    let (a, b) = (rand_f32(&mut rng, 40 * 30), rand_f32(&mut rng, 30 * 20));
    let mut want = vec![0f64; 40 * 20];
    cpu_ops::gemm_reference(
        MatRef::new(&to64(&a), 40, 30).unwrap(),
        Transpose::No,
        MatRef::new(&to64(&b), 30, 20).unwrap(),
        Transpose::No,
        MatMut::new(&mut want, 40, 20).unwrap(),
        Accumulate::No,
    )
    .unwrap();
    let mut dc = output(d, &vec![f32::NAN; 40 * 20]);
    let (da, db) = (input(d, &a), input(d, &b));
    d.matmul(
        DevMat::new(&da, 40, 30),
        DevMat::new(&db, 30, 20),
        &mut dc,
        false,
    )
    .unwrap();
    assert_close("fp32 again", &read(d, &dc, 800, "fp32"), &want, 1e-5);
}

pub(crate) fn bias_add_and_grad<B: Backend>(d: &B) {
    let mut rng = Rng::new(3);
    for (rows, cols) in [(1, 1), (37, 5), (300, 17), (1029, 129)] {
        let x = rand_f32(&mut rng, rows * cols);
        let bias = rand_f32(&mut rng, cols);
        let mut want = to64(&x);
        cpu_ops::add_bias(MatMut::new(&mut want, rows, cols).unwrap(), &to64(&bias)).unwrap();
        let mut dx = output(d, &x);
        d.add_bias(&mut dx, rows, cols, &input(d, &bias)).unwrap();
        assert_close(
            "add_bias",
            &read(d, &dx, rows * cols, "add_bias"),
            &want,
            1e-6,
        );

        let old = rand_f32(&mut rng, cols);
        for acc in [false, true] {
            let mut want = to64(&old);
            let acc_ref = if acc { Accumulate::Yes } else { Accumulate::No };
            cpu_ops::bias_grad(
                MatRef::new(&to64(&x), rows, cols).unwrap(),
                &mut want,
                acc_ref,
            )
            .unwrap();
            let start = if acc {
                old.clone()
            } else {
                vec![f32::NAN; cols]
            };
            let mut db = output(d, &start);
            d.bias_grad(&input(d, &x), rows, cols, &mut db, acc)
                .unwrap();
            assert_close("bias_grad", &read(d, &db, cols, "bias_grad"), &want, 1e-5);
        }
    }
}

pub(crate) fn activations_forward_backward<B: Backend>(d: &B) {
    let mut rng = Rng::new(4);
    for n in [1, 17, 1000, 70_001] {
        let mut x: Vec<f32> = rand_f32(&mut rng, n).iter().map(|v| v * 3.0).collect();
        x[0] = 0.0; // the boundary: ReLU'(0) = 0, ELU(0) = 0
        let dy = rand_f32(&mut rng, n);
        // ReLU
        let mut want = to64(&x);
        cpu_ops::relu(&mut want);
        let mut y = output(d, &x);
        d.relu(&mut y, n).unwrap();
        let y_host = read(d, &y, n, "relu");
        assert_close("relu", &y_host, &want, 0.0);
        let mut want_g = to64(&dy);
        cpu_ops::relu_backward(&want, &mut want_g).unwrap();
        let mut g = output(d, &dy);
        d.relu_backward(&input(d, &y_host), &mut g, n).unwrap();
        assert_close(
            "relu_backward",
            &read(d, &g, n, "relu_backward"),
            &want_g,
            0.0,
        );
        // ELU
        let alpha = 0.7f32;
        let mut want = to64(&x);
        cpu_ops::elu(&mut want, f64::from(alpha)).unwrap();
        let mut y = output(d, &x);
        d.elu(&mut y, n, alpha).unwrap();
        let y_host = read(d, &y, n, "elu");
        assert_close("elu", &y_host, &want, 1e-6);
        let mut want_g = to64(&dy);
        cpu_ops::elu_backward(&to64(&y_host), &mut want_g, f64::from(alpha)).unwrap();
        let mut g = output(d, &dy);
        d.elu_backward(&input(d, &y_host), &mut g, n, alpha)
            .unwrap();
        assert_close(
            "elu_backward",
            &read(d, &g, n, "elu_backward"),
            &want_g,
            1e-6,
        );
    }
}

pub(crate) fn dropout_masks<B: Backend>(d: &B) {
    let mut rng = Rng::new(5);
    let n = 200_003;
    // No zeros in x, so a zero output means "dropped".
    let x: Vec<f32> = (0..n).map(|_| 0.5 + rng.next_f32()).collect();
    let dy = rand_f32(&mut rng, n);
    for p in [0.1f32, 0.5, 0.8] {
        let mut y = output(d, &x);
        let mask = d.dropout(&mut y, n, p, 42).unwrap();
        let yh = read(d, &y, n, "dropout");
        let scale = 1.0 / (1.0 - f64::from(p));
        let mut kept = vec![false; n];
        for i in 0..n {
            if yh[i] != 0.0 {
                kept[i] = true;
                let want = f64::from(x[i]) * scale;
                assert!(
                    (f64::from(yh[i]) - want).abs() <= 1e-6 * want,
                    "p={p} kept value {i}: {} vs {want}",
                    yh[i]
                );
            }
        }
        let frac = kept.iter().filter(|&&k| k).count() as f64 / n as f64;
        // 1 − p within 0.01: over 8 standard deviations at this n.
        assert!(
            (frac - (1.0 - f64::from(p))).abs() < 0.01,
            "p={p}: kept {frac}"
        );
        // Backward applies exactly the forward's mask and scale.
        let mut g = output(d, &dy);
        d.dropout_backward(&mask, &mut g, n).unwrap();
        let gh = read(d, &g, n, "dropout_backward");
        for i in 0..n {
            if kept[i] {
                let want = f64::from(dy[i]) * scale;
                assert!((f64::from(gh[i]) - want).abs() <= 1e-6 * want.abs().max(1e-30));
            } else {
                assert_eq!(gh[i], 0.0, "p={p} dropped gradient {i}");
            }
        }
        // Same seed, same mask; another seed, another mask.
        let mut y2 = output(d, &x);
        d.dropout(&mut y2, n, p, 42).unwrap();
        assert_eq!(bits(&read(d, &y2, n, "dropout")), bits(&yh));
        let mut y3 = output(d, &x);
        d.dropout(&mut y3, n, p, 43).unwrap();
        assert_ne!(bits(&read(d, &y3, n, "dropout")), bits(&yh));
        if d.kind() == DeviceKind::Host {
            let mut want = x.clone();
            cpu_ops::dropout(&mut want, f64::from(p), 42).unwrap();
            assert_eq!(bits(&yh), bits(&want), "host dropout is cpu_ops' dropout");
        }
    }
    // p = 0 is the identity, forward and backward.
    let mut y = output(d, &x);
    let mask = d.dropout(&mut y, n, 0.0, 7).unwrap();
    assert_eq!(bits(&read(d, &y, n, "dropout p=0")), bits(&x));
    let mut g = output(d, &dy);
    d.dropout_backward(&mask, &mut g, n).unwrap();
    assert_eq!(bits(&read(d, &g, n, "dropout p=0")), bits(&dy));
    // Out-of-range p is an error.
    let mut y = output(d, &x);
    assert!(d.dropout(&mut y, n, 1.5, 7).is_err());
    assert!(d.dropout(&mut y, n, f32::NAN, 7).is_err());
}

pub(crate) fn softmax_cross_entropy_matches<B: Backend>(d: &B) {
    let mut rng = Rng::new(6);
    for (rows, classes) in [(1, 1), (37, 7), (300, 41), (1025, 3)] {
        let logits: Vec<f32> = rand_f32(&mut rng, rows * classes)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let labels: Vec<u32> = (0..rows)
            .map(|_| rng.below(classes as u64) as u32)
            .collect();
        let mut want_g = vec![0.0f64; rows * classes];
        let want = cpu_ops::softmax_cross_entropy(
            MatRef::new(&to64(&logits), rows, classes).unwrap(),
            &labels,
            Some(MatMut::new(&mut want_g, rows, classes).unwrap()),
        )
        .unwrap();
        // The correct count from the same f32 logits (arg-max is exact).
        let correct =
            cpu_ops::accuracy_count(MatRef::new(&logits, rows, classes).unwrap(), &labels).unwrap();
        let (dl, dlab) = (input(d, &logits), input_u32(d, &labels, u32::MAX));
        let mut g = output(d, &vec![f32::NAN; rows * classes]);
        let got = d
            .softmax_cross_entropy(&dl, rows, classes, &dlab, Some(&mut g))
            .unwrap();
        assert!(
            (got.loss - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0),
            "loss {} vs {}",
            got.loss,
            want.loss
        );
        assert_eq!(got.correct, correct);
        assert_close(
            "CE gradient",
            &read(d, &g, rows * classes, "CE"),
            &want_g,
            1e-5,
        );
        let no_grad = d
            .softmax_cross_entropy(&dl, rows, classes, &dlab, None)
            .unwrap();
        assert_eq!(no_grad.correct, got.correct);
        assert!((no_grad.loss - got.loss).abs() <= 1e-12 * got.loss.abs().max(1.0));
        // A label out of range is an error.
        let mut bad = labels.clone();
        bad[rows - 1] = classes as u32;
        assert!(d
            .softmax_cross_entropy(&dl, rows, classes, &d.to_device(&bad).unwrap(), None)
            .is_err());
    }
}

pub(crate) fn adam_matches_cpu_ops<B: Backend>(d: &B) {
    let mut rng = Rng::new(7);
    for n in [1, 1001, 70_001] {
        let (lr, b1, b2, eps, wd) = (1e-2f32, 0.9f32, 0.999f32, 1e-8f32, 5e-4f32);
        let cfg = AdamConfig {
            lr: f64::from(lr),
            beta1: f64::from(b1),
            beta2: f64::from(b2),
            eps: f64::from(eps),
            weight_decay: f64::from(wd),
            decay: WeightDecay::L2,
        };
        let mut host = Adam::<f32>::new(cfg).unwrap();
        let mut p_ref = rand_f32(&mut rng, n);
        let mut p = output(d, &p_ref);
        let mut m = output(d, &vec![0.0; n]);
        let mut v = output(d, &vec![0.0; n]);
        for step in 1..=5u64 {
            let g = rand_f32(&mut rng, n);
            host.step(&mut [&mut p_ref], &[&g]).unwrap();
            let hp = AdamStep {
                lr,
                beta1: b1,
                beta2: b2,
                eps,
                weight_decay: wd,
                step,
            };
            d.adam_step(&hp, &mut p, &input(d, &g), &mut m, &mut v, n)
                .unwrap();
            let (ph, mh, vh) = (
                read(d, &p, n, "adam param"),
                read(d, &m, n, "adam m"),
                read(d, &v, n, "adam v"),
            );
            let (m_ref, v_ref) = (
                host.first_moment(0).unwrap(),
                host.second_moment(0).unwrap(),
            );
            if d.kind() == DeviceKind::Host {
                assert_eq!(bits(&ph), bits(&p_ref), "n={n} step {step}: param bits");
                assert_eq!(bits(&mh), bits(m_ref), "n={n} step {step}: m bits");
                assert_eq!(bits(&vh), bits(v_ref), "n={n} step {step}: v bits");
            } else {
                assert_close("adam param", &ph, &to64(&p_ref), 1e-5);
                assert_close("adam m", &mh, &to64(m_ref), 1e-5);
                assert_close("adam v", &vh, &to64(v_ref), 1e-5);
            }
        }
    }
    // Bad hyper-parameters are errors.
    let ok = AdamStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 1,
    };
    let (mut p, g) = (d.alloc::<f32>(4).unwrap(), d.alloc::<f32>(4).unwrap());
    let (mut m, mut v) = (d.alloc::<f32>(4).unwrap(), d.alloc::<f32>(4).unwrap());
    for bad in [
        AdamStep { step: 0, ..ok },
        AdamStep { lr: -1.0, ..ok },
        AdamStep { beta1: 1.0, ..ok },
        AdamStep {
            beta2: f32::NAN,
            ..ok
        },
        AdamStep { eps: -1e-8, ..ok },
    ] {
        assert!(
            d.adam_step(&bad, &mut p, &g, &mut m, &mut v, 4).is_err(),
            "{bad:?}"
        );
    }
}

/// The whole-model Adam (`adam_step_all`: one launch on CUDA) equals one
/// `adam_step` per tensor bit for bit, over tensors of odd and zero lengths and
/// several steps; a set guard updates nothing. The deferred loss writes the sum
/// and the correct count of `softmax_cross_entropy` into its slot, the same
/// gradient, and a sticky guard at a non-finite loss.
pub(crate) fn adam_all_and_the_deferred_loss_match_the_single_ops<B: Backend>(d: &B) {
    let mut rng = Rng::new(23);
    let lens = [1usize, 1001, 0, 70_001, 33];
    let vals =
        |rng: &mut Rng| -> Vec<Vec<f32>> { lens.iter().map(|&n| rand_f32(rng, n)).collect() };
    let up = |v: &[Vec<f32>]| -> Vec<B::Buf<f32>> { v.iter().map(|x| output(d, x)).collect() };
    let p0 = vals(&mut rng);
    let scaled = |v: Vec<Vec<f32>>, f: fn(f32) -> f32| -> Vec<Vec<f32>> {
        v.into_iter()
            .map(|t| t.into_iter().map(f).collect())
            .collect()
    };
    let m0 = scaled(vals(&mut rng), |x| 0.1 * x);
    // Second moments are non-negative.
    let v0 = scaled(vals(&mut rng), |x| 0.01 * x.abs());
    let (mut pa, mut ma, mut va) = (up(&p0), up(&m0), up(&v0));
    let (mut pb, mut mb, mut vb) = (up(&p0), up(&m0), up(&v0));
    let mut guard = d.to_device(&[0u32]).unwrap();
    for step in 1..=3u64 {
        let grads = up(&vals(&mut rng));
        let hp = AdamStep {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 5e-4,
            step,
        };
        for i in 0..lens.len() {
            d.adam_step(&hp, &mut pa[i], &grads[i], &mut ma[i], &mut va[i], lens[i])
                .unwrap();
        }
        d.adam_step_all(
            &hp,
            AdamTensors {
                params: &mut pb,
                grads: &grads,
                m: &mut mb,
                v: &mut vb,
                lens: &lens,
            },
            Some(&guard),
        )
        .unwrap();
        for i in 0..lens.len() {
            for (what, a, b) in [
                ("param", &pa[i], &pb[i]),
                ("m", &ma[i], &mb[i]),
                ("v", &va[i], &vb[i]),
            ] {
                assert_eq!(
                    bits(&read(d, a, lens[i], what)),
                    bits(&read(d, b, lens[i], what)),
                    "step {step} tensor {i}: {what}"
                );
            }
        }
    }
    let before: Vec<Vec<f32>> = (0..lens.len())
        .map(|i| read(d, &pb[i], lens[i], "p"))
        .collect();
    guard = d.to_device(&[1u32]).unwrap();
    let grads = up(&vals(&mut rng));
    let hp = AdamStep {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 4,
    };
    d.adam_step_all(
        &hp,
        AdamTensors {
            params: &mut pb,
            grads: &grads,
            m: &mut mb,
            v: &mut vb,
            lens: &lens,
        },
        Some(&guard),
    )
    .unwrap();
    for i in 0..lens.len() {
        let after = read(d, &pb[i], lens[i], "p");
        assert!(after.iter().all(|x| x.is_finite()), "tensor {i}");
        assert_eq!(
            bits(&after),
            bits(&before[i]),
            "tensor {i} moved under the guard"
        );
    }
    assert!(d
        .adam_step_all(
            &hp,
            AdamTensors {
                params: &mut pb[..2],
                grads: &grads,
                m: &mut mb,
                v: &mut vb,
                lens: &lens,
            },
            None,
        )
        .is_err());

    // The deferred loss.
    let (rows, classes) = (37usize, 7usize);
    let mut logits: Vec<f32> = rand_f32(&mut rng, rows * classes)
        .iter()
        .map(|v| v * 4.0)
        .collect();
    let labels: Vec<u32> = (0..rows)
        .map(|_| rng.below(classes as u64) as u32)
        .collect();
    let dlab = input_u32(d, &labels, u32::MAX);
    let mut g_sync = output(d, &vec![f32::NAN; rows * classes]);
    let want = d
        .softmax_cross_entropy(&input(d, &logits), rows, classes, &dlab, Some(&mut g_sync))
        .unwrap();
    let mut g = output(d, &vec![f32::NAN; rows * classes]);
    let mut slots = d.to_device(&[7u64; 6]).unwrap();
    let mut guard = d.to_device(&[0u32]).unwrap();
    d.softmax_cross_entropy_deferred(
        &XentInputs {
            logits: &input(d, &logits),
            rows,
            classes,
            labels: &dlab,
        },
        &mut g,
        LossSlot {
            out: &mut slots,
            slot: 1,
        },
        &mut guard,
    )
    .unwrap();
    let w = down(d, &slots, 6);
    assert_eq!(
        (w[0], w[1], w[4], w[5]),
        (7, 7, 7, 7),
        "only slot 1 is written"
    );
    let sum = f64::from_bits(w[2]);
    assert!(
        (sum - want.loss * rows as f64).abs() <= 1e-12 * sum.abs().max(1.0),
        "loss sum {sum} vs {}",
        want.loss * rows as f64
    );
    assert_eq!(w[3], want.correct as u64);
    assert_eq!(
        bits(&read(d, &g, rows * classes, "grad")),
        bits(&read(d, &g_sync, rows * classes, "grad"))
    );
    assert_eq!(down(d, &guard, 1), vec![0]);
    logits[5] = f32::NAN;
    d.softmax_cross_entropy_deferred(
        &XentInputs {
            logits: &input(d, &logits),
            rows,
            classes,
            labels: &dlab,
        },
        &mut g,
        LossSlot {
            out: &mut slots,
            slot: 0,
        },
        &mut guard,
    )
    .unwrap();
    assert!(f64::from_bits(down(d, &slots, 1)[0]).is_nan());
    assert_eq!(down(d, &guard, 1), vec![1], "a NaN loss sets the guard");
    logits[5] = 0.5;
    d.softmax_cross_entropy_deferred(
        &XentInputs {
            logits: &input(d, &logits),
            rows,
            classes,
            labels: &dlab,
        },
        &mut g,
        LossSlot {
            out: &mut slots,
            slot: 2,
        },
        &mut guard,
    )
    .unwrap();
    assert_eq!(down(d, &guard, 1), vec![1], "the guard is sticky");
    assert_size_mismatch(
        "a slot past the buffer",
        d.softmax_cross_entropy_deferred(
            &XentInputs {
                logits: &input(d, &logits),
                rows,
                classes,
                labels: &dlab,
            },
            &mut g,
            LossSlot {
                out: &mut slots,
                slot: 3,
            },
            &mut guard,
        ),
    );
}

/// `act_backward_bias_grad` from `dy`: the gradient equals `want_g` (the
/// unfused ops' result) bit for bit, and the bias gradient `bias_grad` of it,
/// bit for bit on the host, within float rounding of the column sums elsewhere
/// (CUDA adds in another fixed order).
fn check_act_bias<B: Backend>(
    d: &B,
    back: ActBackward<'_, B>,
    dy: &[f32],
    (rows, cols): (usize, usize),
    want_g: &B::Buf<f32>,
    what: &str,
) {
    let n = rows * cols;
    let mut g = output(d, dy);
    let mut db = output(d, &vec![f32::NAN; cols]);
    d.act_backward_bias_grad(back, &mut g, rows, cols, &mut db)
        .unwrap();
    let want = read(d, want_g, n, "unfused backward");
    assert_eq!(
        bits(&read(d, &g, n, "act_backward_bias_grad")),
        bits(&want),
        "{what}: gradient"
    );
    let mut want_db = output(d, &vec![0.0; cols]);
    d.bias_grad(want_g, rows, cols, &mut want_db, false)
        .unwrap();
    let (got, exp) = (
        read(d, &db, cols, "fused bias grad"),
        read(d, &want_db, cols, "bias grad"),
    );
    if d.kind() == DeviceKind::Host {
        assert_eq!(bits(&got), bits(&exp), "{what}: bias gradient");
    }
    for c in 0..cols {
        let l1: f32 = (0..rows).map(|r| want[r * cols + c].abs()).sum();
        let ok = if exp[c].is_nan() {
            got[c].is_nan()
        } else {
            (got[c] - exp[c]).abs() <= 1e-6 * (l1 + 1.0)
        };
        assert!(
            ok,
            "{what}: bias gradient column {c}: {} vs {}",
            got[c], exp[c]
        );
    }
}

/// The fused hidden-layer ops equal the unfused sequence bit for bit:
/// `bias_act_dropout` = add_bias, relu / elu, copy, dropout (same seed);
/// `dropout_act_backward` = dropout_backward, relu / elu backward;
/// `act_backward_bias_grad` = either backward, then `bias_grad` (the column
/// sums within rounding on CUDA). Nothing past the prefix is written; bad
/// arguments are errors.
pub(crate) fn fused_hidden_layer_ops_equal_the_unfused_ones<B: Backend>(d: &B) {
    let mut rng = Rng::new(17);
    for (rows, cols) in [(1037usize, 19usize), (64, 256), (3, 1)] {
        let n = rows * cols;
        let mut x: Vec<f32> = rand_f32(&mut rng, n).iter().map(|v| 3.0 * v).collect();
        x[0] = f32::NAN;
        let bias = rand_f32(&mut rng, cols);
        let dy = rand_f32(&mut rng, n);
        for act in [Activation::Relu, Activation::Elu { alpha: 0.7 }] {
            for p in [None, Some(0.3f32), Some(1.0)] {
                let what = format!("{rows}×{cols} {act:?} p={p:?}");
                // Unfused.
                let mut ya = output(d, &x);
                d.add_bias(&mut ya, rows, cols, &input(d, &bias)).unwrap();
                match act {
                    Activation::Relu => d.relu(&mut ya, n).unwrap(),
                    Activation::Elu { alpha } => d.elu(&mut ya, n, alpha).unwrap(),
                }
                let mut ha = output(d, &vec![0.0; n]);
                let mask_a = p.map(|p| {
                    d.copy(&ya, &mut ha, n).unwrap();
                    d.dropout(&mut ha, n, p, 99).unwrap()
                });
                // Fused.
                let mut yb = output(d, &x);
                let mut hb = output(d, &vec![0.0; n]);
                let mask_b = d
                    .bias_act_dropout(
                        &mut yb,
                        rows,
                        cols,
                        &input(d, &bias),
                        act,
                        p.map(|p| (p, 99, &mut hb)),
                    )
                    .unwrap();
                assert_eq!(mask_b.is_some(), p.is_some(), "{what}: mask");
                assert_eq!(
                    bits(&read(d, &yb, n, "bias_act_dropout x")),
                    bits(&read(d, &ya, n, "unfused activation")),
                    "{what}: activation"
                );
                let (Some(ma), Some(mb)) = (mask_a, mask_b) else {
                    // Without dropout, `out` is not touched.
                    assert!(read(d, &hb, n, "untouched out").iter().all(|&v| v == 0.0));
                    // The activation's backward alone, with the bias gradient.
                    let mut ga = output(d, &dy);
                    d.activation_backward(&ya, &mut ga, n, act).unwrap();
                    let back = ActBackward {
                        mask: None,
                        y: &yb,
                        act,
                    };
                    check_act_bias(d, back, &dy, (rows, cols), &ga, &what);
                    continue;
                };
                assert_eq!(
                    bits(&read(d, &hb, n, "bias_act_dropout out")),
                    bits(&read(d, &ha, n, "unfused dropout")),
                    "{what}: dropped"
                );
                let mut ga = output(d, &dy);
                d.dropout_backward(&ma, &mut ga, n).unwrap();
                match act {
                    Activation::Relu => d.relu_backward(&ya, &mut ga, n).unwrap(),
                    Activation::Elu { alpha } => d.elu_backward(&ya, &mut ga, n, alpha).unwrap(),
                }
                let mut gb = output(d, &dy);
                d.dropout_act_backward(&mb, &yb, &mut gb, n, act).unwrap();
                assert_eq!(
                    bits(&read(d, &gb, n, "dropout_act_backward")),
                    bits(&read(d, &ga, n, "unfused backward")),
                    "{what}: backward"
                );
                let back = ActBackward {
                    mask: Some(&mb),
                    y: &yb,
                    act,
                };
                check_act_bias(d, back, &dy, (rows, cols), &ga, &what);
            }
        }
    }
    // Bad arguments.
    let mut x = d.to_device(&[1.0f32; 6]).unwrap();
    let bias = d.to_device(&[0.5f32; 3]).unwrap();
    let mut short = d.to_device(&[0.0f32; 5]).unwrap();
    let bad_alpha = Activation::Elu { alpha: f32::NAN };
    assert!(d
        .bias_act_dropout(&mut x, 2, 3, &bias, bad_alpha, None)
        .is_err());
    assert!(d
        .bias_act_dropout(&mut x, 3, 3, &bias, Activation::Relu, None)
        .is_err());
    let relu = Activation::Relu;
    assert!(d
        .bias_act_dropout(&mut x, 2, 3, &bias, relu, Some((0.5, 1, &mut short)))
        .is_err());
    assert!(d
        .bias_act_dropout(&mut x, 2, 3, &bias, relu, Some((1.5, 1, &mut short)))
        .is_err());
}
