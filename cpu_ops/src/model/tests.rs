//! Tests of the models: finite differences in `f64`, `f32` (SIMD) against `f64`,
//! shapes, determinism across thread counts, dropout, and a small learning run.

use super::*;
use crate::aggregate::tests::{rand_vec, random_block};
use crate::loss::softmax_cross_entropy;
use crate::matmul::{MatMut, MatRef};
use crate::optim::{Adam, AdamConfig, Optimizer};
use crate::rng::Rng;
use crate::sparse::SparseRows;

const KINDS: [ModelKind; 3] = [ModelKind::Gcn, ModelKind::Sage, ModelKind::Gat];

/// Chained random blocks: `sizes[l]` sources and `sizes[l+1]` destinations for block
/// `l` (about a quarter of destinations isolated, some sources unread).
fn random_batch(rng: &mut Rng, sizes: &[usize], max_deg: u64) -> Vec<(usize, Vec<u64>, Vec<u32>)> {
    sizes
        .windows(2)
        .map(|w| {
            let (indptr, indices) = random_block(rng, w[1], w[0], max_deg);
            (w[0], indptr, indices)
        })
        .collect()
}

fn views(batch: &[(usize, Vec<u64>, Vec<u32>)]) -> Vec<BlockView<'_>> {
    batch
        .iter()
        .map(|(n, p, i)| BlockView::new(*n, p, i).unwrap())
        .collect()
}

fn config(
    kind: ModelKind,
    dims: (usize, usize, usize),
    layers: usize,
    heads: usize,
) -> ModelConfig {
    ModelConfig {
        kind,
        in_dim: dims.0,
        hidden: dims.1,
        num_classes: dims.2,
        num_layers: layers,
        heads,
        dropout: 0.0,
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Central differences of `⟨G, logits⟩` against the analytic gradient of every
/// parameter (up to 40 sampled entries per tensor).
fn check_gradients(cfg: &ModelConfig, sizes: &[usize], seed: u64, train: bool) {
    check_gradients_with(cfg, sizes, seed, train, false);
}

/// [`check_gradients`], optionally feeding layer 0 a sparse input (about 70% zeros)
/// through [`Model::forward_input`] / [`Model::backward_input`].
fn check_gradients_with(cfg: &ModelConfig, sizes: &[usize], seed: u64, train: bool, sparse: bool) {
    let mut rng = Rng::new(seed);
    let batch = random_batch(&mut rng, sizes, 4);
    let blocks = views(&batch);
    let mut model = Model::<f64>::new(cfg, seed).unwrap();
    // Random biases and O(1) weights, so every term matters.
    for p in model.params_mut() {
        for v in p.iter_mut() {
            *v = rng.next_f64() * 2.0 - 1.0;
        }
    }
    let mut x: Vec<f64> = rand_vec(&mut rng, sizes[0] * cfg.in_dim);
    if sparse {
        for v in x.iter_mut() {
            if rng.next_f64() < 0.7 {
                *v = 0.0;
            }
        }
    }
    let sx = SparseRows::from_dense(&x, sizes[0], cfg.in_dim).unwrap();
    let input = if sparse {
        ModelInput::Sparse(&sx)
    } else {
        ModelInput::Dense(&x)
    };
    let g: Vec<f64> = rand_vec(&mut rng, sizes[sizes.len() - 1] * cfg.num_classes);
    let drop_seed = 99;
    let fwd = model
        .forward_input(&blocks, input, train, drop_seed)
        .unwrap();
    let grads = model.backward_input(&blocks, input, &fwd, &g).unwrap();
    assert_eq!(grads.len(), model.params().len());
    let loss = |m: &Model<f64>| {
        dot(
            m.forward_input(&blocks, input, train, drop_seed)
                .unwrap()
                .logits(),
            &g,
        )
    };
    let eps = 1e-6;
    let names = model.param_names();
    let mut checked = 0;
    for (t, grad) in grads.iter().enumerate() {
        assert_eq!(grad.len(), model.params()[t].len(), "{}", names[t]);
        let entries: Vec<usize> = if grad.len() <= 40 {
            (0..grad.len()).collect()
        } else {
            (0..40)
                .map(|_| rng.below(grad.len() as u64) as usize)
                .collect()
        };
        for k in entries {
            let orig = model.params()[t][k];
            model.params_mut()[t][k] = orig + eps;
            let up = loss(&model);
            model.params_mut()[t][k] = orig - eps;
            let down = loss(&model);
            model.params_mut()[t][k] = orig;
            let fd = (up - down) / (2.0 * eps);
            let an = grad[k];
            let rel = (fd - an).abs() / fd.abs().max(an.abs()).max(1e-3);
            assert!(
                rel < 1e-4,
                "{cfg:?} sizes {sizes:?} train={train}: {}[{k}] fd {fd} vs analytic {an}",
                names[t]
            );
            checked += 1;
        }
    }
    // The check must see non-trivial gradients somewhere.
    assert!(grads.iter().flatten().any(|v| v.abs() > 1e-3));
    assert!(checked > 0);
}

#[test]
fn gradients_match_finite_differences_depth_1() {
    for kind in KINDS {
        for heads in [1, 2] {
            // d_in > d_out (project first) and d_in <= d_out (aggregate first).
            check_gradients(&config(kind, (5, 4, 3), 1, heads), &[9, 5], 1, false);
            check_gradients(&config(kind, (3, 4, 4), 1, heads), &[9, 5], 2, false);
        }
    }
}

#[test]
fn gradients_match_finite_differences_depth_2() {
    for kind in KINDS {
        for heads in [1, 2] {
            check_gradients(&config(kind, (5, 6, 3), 2, heads), &[14, 8, 5], 3, false);
            check_gradients(&config(kind, (7, 4, 5), 2, heads), &[14, 8, 5], 4, false);
        }
    }
}

#[test]
fn gradients_match_finite_differences_depth_3_and_dropout() {
    for kind in KINDS {
        check_gradients(&config(kind, (4, 6, 3), 3, 2), &[24, 14, 8, 4], 5, false);
        // A fixed dropout seed makes the training forward a deterministic function.
        let mut cfg = config(kind, (5, 6, 3), 2, 2);
        cfg.dropout = 0.5;
        check_gradients(&cfg, &[14, 8, 5], 6, true);
    }
}

#[test]
fn gradients_match_finite_differences_through_sparse_input() {
    for kind in KINDS {
        // Aggregate first when dense (d_in <= d_out): the sparse path projects first.
        check_gradients_with(&config(kind, (3, 4, 4), 1, 2), &[9, 5], 7, false, true);
        let mut cfg = config(kind, (7, 4, 5), 2, 2);
        cfg.dropout = 0.5;
        check_gradients_with(&cfg, &[14, 8, 5], 8, true, true);
    }
}

/// Sparse and dense inputs holding the same matrix give the same logits and
/// gradients, relative to the largest magnitude, within `tol`.
fn check_sparse_matches_dense<T: Real>(tol: f64) {
    let mut rng = Rng::new(91);
    for layers in [1, 2] {
        let sizes: &[usize] = if layers == 1 {
            &[40, 17]
        } else {
            &[60, 30, 11]
        };
        let batch = random_batch(&mut rng, sizes, 6);
        let blocks = views(&batch);
        // Project first and aggregate first for the dense path.
        for dims in [(23, 8, 5), (6, 12, 9)] {
            for kind in KINDS {
                let mut cfg = config(kind, dims, layers, 2);
                cfg.dropout = 0.4;
                let m = Model::<T>::new(&cfg, 13).unwrap();
                let mut x: Vec<T> = rand_vec(&mut rng, sizes[0] * dims.0);
                for (r, row) in x.chunks_mut(dims.0).enumerate() {
                    for v in row.iter_mut() {
                        // Every fifth row empty, the rest about 20% dense.
                        if r % 5 == 4 || rng.next_f64() < 0.8 {
                            *v = T::ZERO;
                        }
                    }
                }
                let sx = SparseRows::from_dense(&x, sizes[0], dims.0).unwrap();
                let g: Vec<T> = rand_vec(&mut rng, sizes[layers] * dims.2);
                for train in [false, true] {
                    let what = format!("{kind:?} {dims:?} layers {layers} train {train}");
                    let fd = m
                        .forward_input(&blocks, ModelInput::Dense(&x), train, 3)
                        .unwrap();
                    let fs = m
                        .forward_input(&blocks, ModelInput::Sparse(&sx), train, 3)
                        .unwrap();
                    let close = |a: &[T], b: &[T], name: &str| {
                        assert_eq!(a.len(), b.len(), "{what} {name}");
                        let scale = b.iter().fold(1e-30f64, |s, v| s.max(v.to_f64().abs()));
                        for (k, (p, q)) in a.iter().zip(b).enumerate() {
                            let (p, q) = (p.to_f64(), q.to_f64());
                            assert!(
                                (p - q).abs() <= tol * scale,
                                "{what} {name}[{k}]: {p} vs {q}"
                            );
                        }
                    };
                    close(fs.logits(), fd.logits(), "logits");
                    let gd = m
                        .backward_input(&blocks, ModelInput::Dense(&x), &fd, &g)
                        .unwrap();
                    let gs = m
                        .backward_input(&blocks, ModelInput::Sparse(&sx), &fs, &g)
                        .unwrap();
                    for ((a, b), name) in gs.iter().zip(&gd).zip(m.param_names()) {
                        close(a, b, &name);
                    }
                }
                // Wrong shapes of a sparse input are size errors.
                let short = SparseRows::from_dense(&x[dims.0..], sizes[0] - 1, dims.0).unwrap();
                let narrow = SparseRows::from_dense(&x[..sizes[0]], sizes[0], 1).unwrap();
                for bad in [&short, &narrow] {
                    assert!(matches!(
                        m.forward_input(&blocks, ModelInput::Sparse(bad), false, 0),
                        Err(CpuOpsError::SizeMismatch { .. })
                    ));
                }
            }
        }
    }
}

#[test]
fn sparse_input_matches_dense_input_f64() {
    check_sparse_matches_dense::<f64>(1e-10);
}

#[test]
fn sparse_input_matches_dense_input_f32() {
    check_sparse_matches_dense::<f32>(1e-4);
}

/// An f32 model holding the f64 model's weights, rounded.
fn to_f32(m: &Model<f64>) -> Model<f32> {
    let mut m32 = Model::<f32>::new(m.config(), 0).unwrap();
    for (d, s) in m32.params_mut().into_iter().zip(m.params()) {
        for (a, &b) in d.iter_mut().zip(s) {
            *a = b as f32;
        }
    }
    m32
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * scale,
            "{what}[{k}]: {g} vs {w} (scale {scale})"
        );
    }
}

#[test]
fn f32_simd_model_matches_f64_model() {
    let mut rng = Rng::new(11);
    let sizes = [500, 160, 48];
    let batch = random_batch(&mut rng, &sizes, 14);
    let blocks = views(&batch);
    // (in, hidden, classes): project first below, aggregate first above, and back.
    for dims in [(37, 32, 7), (20, 48, 50)] {
        for kind in KINDS {
            let cfg = config(kind, dims, 2, 4);
            let m64 = Model::<f64>::new(&cfg, 12).unwrap();
            let m32 = to_f32(&m64);
            let x64: Vec<f64> = rand_vec(&mut rng, sizes[0] * dims.0);
            let x32: Vec<f32> = x64.iter().map(|&v| v as f32).collect();
            let g64: Vec<f64> = rand_vec(&mut rng, sizes[2] * dims.2);
            let g32: Vec<f32> = g64.iter().map(|&v| v as f32).collect();
            let f64_ = m64.forward(&blocks, &x64, false, 0).unwrap();
            let f32_ = m32.forward(&blocks, &x32, false, 0).unwrap();
            let what = format!("{kind:?} {dims:?}");
            assert_close(
                f32_.logits(),
                f64_.logits(),
                1e-4,
                &format!("logits {what}"),
            );
            let gr64 = m64.backward(&blocks, &f64_, &g64).unwrap();
            let gr32 = m32.backward(&blocks, &f32_, &g32).unwrap();
            for ((a, b), name) in gr32.iter().zip(&gr64).zip(m64.param_names()) {
                assert_close(a, b, 1e-4, &format!("grad {name} {what}"));
            }
        }
    }
}

#[test]
fn same_seed_same_weights_in_both_precisions() {
    for kind in KINDS {
        let cfg = config(kind, (9, 8, 5), 2, 2);
        let a = Model::<f64>::new(&cfg, 5).unwrap();
        let b = Model::<f32>::new(&cfg, 5).unwrap();
        for (x, y) in a.params().iter().zip(b.params()) {
            assert!(x.iter().zip(y).all(|(&p, &q)| p as f32 == q));
        }
    }
}

#[test]
fn parameters_are_initialized_as_dgl() {
    let cfg = config(ModelKind::Sage, (5, 6, 3), 2, 1);
    let m = Model::<f64>::new(&cfg, 1).unwrap();
    assert_eq!(
        m.param_names(),
        [
            "layer0.weight_self",
            "layer0.weight_neigh",
            "layer0.bias",
            "layer1.weight_self",
            "layer1.weight_neigh",
            "layer1.bias"
        ]
    );
    assert_eq!(m.num_params(), 2 * 5 * 6 + 6 + 2 * 6 * 3 + 3);
    let bound = RELU_GAIN * (6.0f64 / 11.0).sqrt();
    assert!(m.params()[0].iter().all(|v| v.abs() <= bound));
    assert!(m.params()[0].iter().any(|v| v.abs() > bound / 2.0));
    assert!(m.params()[2].iter().all(|&v| v == 0.0));
    assert_ne!(m.params()[0], m.params()[1], "independent streams");

    let gcn = Model::<f64>::new(&config(ModelKind::Gcn, (5, 6, 3), 2, 1), 1).unwrap();
    assert_eq!(
        gcn.param_names(),
        [
            "layer0.weight",
            "layer0.bias",
            "layer1.weight",
            "layer1.bias"
        ]
    );
    let bound = (6.0f64 / 11.0).sqrt();
    assert!(gcn.params()[0].iter().all(|v| v.abs() <= bound));

    // GAT: hidden 8 = 2 heads × 4; the last layer has 2 heads × 3 classes.
    let gat = Model::<f64>::new(&config(ModelKind::Gat, (5, 8, 3), 2, 2), 1).unwrap();
    let lens: Vec<usize> = gat.params().iter().map(|p| p.len()).collect();
    assert_eq!(lens, [5 * 8, 8, 8, 8, 8 * 6, 6, 6, 6]);
    assert_eq!(gat.param_names()[1], "layer0.attn_src");

    // Deterministic for a seed, different across seeds.
    let again = Model::<f64>::new(&cfg, 1).unwrap();
    assert_eq!(m.params(), again.params());
    let other = Model::<f64>::new(&cfg, 2).unwrap();
    assert_ne!(m.params(), other.params());
}

#[test]
fn invalid_configs_name_the_field() {
    let good = config(ModelKind::Gat, (5, 6, 3), 2, 2);
    assert!(Model::<f32>::new(&good, 0).is_ok());
    type Edit = Box<dyn Fn(&mut ModelConfig)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("num_layers", Box::new(|c| c.num_layers = 0)),
        ("in_dim", Box::new(|c| c.in_dim = 0)),
        ("num_classes", Box::new(|c| c.num_classes = 0)),
        ("hidden", Box::new(|c| c.hidden = 0)),
        ("hidden", Box::new(|c| c.hidden = 7)),
        ("heads", Box::new(|c| c.heads = 0)),
        ("dropout", Box::new(|c| c.dropout = 1.0)),
        ("dropout", Box::new(|c| c.dropout = -0.1)),
        ("dropout", Box::new(|c| c.dropout = f32::NAN)),
        ("in_dim", Box::new(|c| c.in_dim = usize::MAX)),
    ];
    for (field, edit) in cases {
        let mut cfg = good.clone();
        edit(&mut cfg);
        match Model::<f32>::new(&cfg, 0) {
            Err(CpuOpsError::InvalidArgument { name, .. }) => assert_eq!(name, field, "{cfg:?}"),
            other => panic!("{cfg:?}: expected an error naming {field}, got {other:?}"),
        }
    }
    // One layer needs no hidden width; heads only matter for GAT.
    let mut one = config(ModelKind::Sage, (5, 0, 3), 1, 0);
    assert!(Model::<f32>::new(&one, 0).is_ok());
    one.kind = ModelKind::Gat;
    one.heads = 3;
    assert!(Model::<f32>::new(&one, 0).is_ok());
}

#[test]
fn wrong_shapes_are_errors_not_panics() {
    let mut rng = Rng::new(21);
    let sizes = [14, 8, 5];
    let batch = random_batch(&mut rng, &sizes, 4);
    let blocks = views(&batch);
    for kind in KINDS {
        let cfg = config(kind, (5, 6, 3), 2, 2);
        let m = Model::<f32>::new(&cfg, 0).unwrap();
        let x: Vec<f32> = rand_vec(&mut rng, 14 * 5);
        let size_err = |r: Result<Forward<f32>>| matches!(r, Err(CpuOpsError::SizeMismatch { .. }));
        assert!(size_err(m.forward(&blocks, &x[1..], true, 0)), "short x");
        assert!(
            size_err(m.forward(&blocks[..1], &x, true, 0)),
            "too few blocks"
        );
        let mut three = views(&batch);
        three.extend(views(&batch[1..]));
        assert!(size_err(m.forward(&three, &x, true, 0)), "too many blocks");
        // Block 1 reads 8 sources but block 0 has 8 destinations: swap in a block
        // with the wrong source count.
        let (p, i) = random_block(&mut rng, 5, 9, 3);
        let mut bad = views(&batch[..1]);
        bad.push(BlockView::new(9, &p, &i).unwrap());
        assert!(size_err(m.forward(&bad, &x, true, 0)), "chaining");
        assert!(size_err(m.forward(&[], &x, true, 0)), "no blocks");

        let fwd = m.forward(&blocks, &x, true, 0).unwrap();
        assert_eq!(fwd.logits().len(), 5 * 3);
        let g = vec![0.1f32; 15];
        let ok = m.backward(&blocks, &fwd, &g).unwrap();
        assert!(matches!(
            m.backward(&blocks, &fwd, &g[1..]),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        // Blocks of another batch with other sizes.
        let other = random_batch(&mut rng, &[15, 8, 5], 4);
        assert!(m.backward(&views(&other), &fwd, &g).is_err());
        // A forward of another model kind.
        let other_kind = KINDS.into_iter().find(|&k| k != kind).unwrap();
        let m2 = Model::<f32>::new(&config(other_kind, (5, 6, 3), 2, 2), 0).unwrap();
        assert!(m2.backward(&blocks, &fwd, &g).is_err());

        // forward_lean keeps no input: backward refuses, backward_with_input agrees.
        let lean = m.forward_lean(&blocks, &x, true, 0).unwrap();
        assert_eq!(lean.logits(), fwd.logits());
        assert!(matches!(
            m.backward(&blocks, &lean, &g),
            Err(CpuOpsError::InvalidArgument { name: "fwd", .. })
        ));
        assert!(m.backward_with_input(&blocks, &x[1..], &lean, &g).is_err());
        assert_eq!(m.backward_with_input(&blocks, &x, &lean, &g).unwrap(), ok);
    }
}

#[test]
fn logits_and_gradients_are_identical_on_1_and_2_threads() {
    let mut rng = Rng::new(31);
    let sizes = [3000, 900, 250];
    let batch = random_batch(&mut rng, &sizes, 20);
    for kind in KINDS {
        let mut cfg = config(kind, (64, 48, 10), 2, 3);
        cfg.dropout = 0.3;
        let m = Model::<f32>::new(&cfg, 7).unwrap();
        let x: Vec<f32> = rand_vec(&mut rng, sizes[0] * 64);
        let g: Vec<f32> = rand_vec(&mut rng, sizes[2] * 10);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let blocks = views(&batch);
                let fwd = m.forward(&blocks, &x, true, 5).unwrap();
                let grads = m.backward(&blocks, &fwd, &g).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                (
                    bits(fwd.logits()),
                    grads.iter().map(|t| bits(t)).collect::<Vec<_>>(),
                )
            })
        };
        assert!(run(1) == run(2), "{kind:?}");
    }
}

#[test]
fn dropout_runs_only_in_training_and_follows_the_seed() {
    let mut rng = Rng::new(41);
    let sizes = [60, 30, 12];
    let batch = random_batch(&mut rng, &sizes, 6);
    let blocks = views(&batch);
    for kind in KINDS {
        let mut cfg = config(kind, (8, 16, 4), 2, 2);
        let x: Vec<f64> = rand_vec(&mut rng, sizes[0] * 8);
        let no_drop = Model::<f64>::new(&cfg, 3).unwrap();
        cfg.dropout = 0.5;
        let m = Model::<f64>::new(&cfg, 3).unwrap();
        let logits = |train, seed| m.forward(&blocks, &x, train, seed).unwrap().into_logits();
        let eval = logits(false, 1);
        assert_eq!(eval, logits(false, 2), "{kind:?}: eval ignores the seed");
        assert_eq!(
            eval,
            no_drop.forward(&blocks, &x, true, 1).unwrap().into_logits()
        );
        assert_eq!(logits(true, 1), logits(true, 1), "{kind:?}: seeded");
        assert_ne!(
            logits(true, 1),
            eval,
            "{kind:?}: dropout changes training logits"
        );
        assert_ne!(
            logits(true, 1),
            logits(true, 2),
            "{kind:?}: the seed matters"
        );
        // Dropout is on hidden representations only: a one-layer model ignores it.
        let mut one = cfg.clone();
        one.num_layers = 1;
        let m1 = Model::<f64>::new(&one, 3).unwrap();
        let b1 = &blocks[..1];
        assert_eq!(
            m1.forward(b1, &x, true, 1).unwrap().into_logits(),
            m1.forward(b1, &x, false, 1).unwrap().into_logits()
        );
    }
}

/// Dense reference for one layer of GCN and SAGE in f64, straight from the
/// definitions in the module doc.
#[test]
fn one_layer_matches_the_dense_definitions() {
    let mut rng = Rng::new(51);
    let (ns, nd, d_in, d_out) = (11, 6, 4, 3);
    let batch = random_batch(&mut rng, &[ns, nd], 4);
    let blocks = views(&batch);
    let b = &blocks[0];
    let x: Vec<f64> = rand_vec(&mut rng, ns * d_in);
    let row = |j: usize| &x[j * d_in..(j + 1) * d_in];
    let lin = |v: &[f64], w: &[f64], k: usize| -> f64 {
        (0..d_in).map(|c| v[c] * w[c * d_out + k]).sum()
    };
    for kind in [ModelKind::Gcn, ModelKind::Sage] {
        let mut m = Model::<f64>::new(&config(kind, (d_in, 1, d_out), 1, 1), 2).unwrap();
        for p in m.params_mut() {
            for v in p.iter_mut() {
                *v = rng.next_f64() - 0.5;
            }
        }
        let got = m.forward(&blocks, &x, false, 0).unwrap().into_logits();
        let p = m.params();
        for i in 0..nd {
            for k in 0..d_out {
                let want = match kind {
                    ModelKind::Gcn => {
                        // d̃_out(j): edges reading j plus its own self-loop.
                        let dout = |j: usize| {
                            b.indices().iter().filter(|&&s| s as usize == j).count()
                                + usize::from(j < nd)
                        };
                        let din = (b.in_degree(i) + 1) as f64;
                        let mut s = lin(row(i), p[0], k) / (dout(i) as f64 * din).sqrt();
                        for &j in b.neighbors(i) {
                            let j = j as usize;
                            s += lin(row(j), p[0], k) / (dout(j) as f64 * din).sqrt();
                        }
                        s + p[1][k]
                    }
                    _ => {
                        let nb = b.neighbors(i);
                        let mean = if nb.is_empty() {
                            0.0
                        } else {
                            nb.iter()
                                .map(|&j| lin(row(j as usize), p[1], k))
                                .sum::<f64>()
                                / nb.len() as f64
                        };
                        lin(row(i), p[0], k) + mean + p[2][k]
                    }
                };
                let v = got[i * d_out + k];
                assert!(
                    (v - want).abs() < 1e-12,
                    "{kind:?} [{i},{k}]: {v} vs {want}"
                );
            }
        }
    }
    // GAT with zero attention vectors: every head averages its neighbors, and the
    // last layer averages the heads (bias included).
    let mut m = Model::<f64>::new(&config(ModelKind::Gat, (d_in, 1, d_out), 1, 2), 2).unwrap();
    m.params_mut()[1].fill(0.0);
    m.params_mut()[2].fill(0.0);
    for v in m.params_mut()[3].iter_mut() {
        *v = rng.next_f64();
    }
    let got = m.forward(&blocks, &x, false, 0).unwrap().into_logits();
    let p = m.params();
    let w = 2 * d_out;
    for i in 0..nd {
        for k in 0..d_out {
            let mut want = 0.0;
            for h in 0..2 {
                let col = h * d_out + k;
                let nb = b.neighbors(i);
                let zsum: f64 = nb
                    .iter()
                    .map(|&j| {
                        (0..d_in)
                            .map(|c| row(j as usize)[c] * p[0][c * w + col])
                            .sum::<f64>()
                    })
                    .sum();
                let mean = if nb.is_empty() {
                    0.0
                } else {
                    zsum / nb.len() as f64
                };
                want += (mean + p[3][col]) / 2.0;
            }
            let v = got[i * d_out + k];
            assert!((v - want).abs() < 1e-12, "GAT [{i},{k}]: {v} vs {want}");
        }
    }
}

#[test]
fn adam_drives_the_training_loss_down() {
    let mut rng = Rng::new(61);
    let sizes = [150, 60, 24];
    let batch = random_batch(&mut rng, &sizes, 8);
    let blocks = views(&batch);
    let x: Vec<f32> = rand_vec(&mut rng, sizes[0] * 16);
    let labels: Vec<u32> = (0..sizes[2]).map(|_| rng.below(4) as u32).collect();
    for kind in KINDS {
        let mut cfg = config(kind, (16, 32, 4), 2, 4);
        cfg.dropout = 0.1;
        let mut m = Model::<f32>::new(&cfg, 8).unwrap();
        let mut opt = Adam::<f32>::new(AdamConfig {
            lr: 0.01,
            ..AdamConfig::default()
        })
        .unwrap();
        let loss_of = |m: &Model<f32>| {
            let logits = m.forward(&blocks, &x, false, 0).unwrap().into_logits();
            softmax_cross_entropy(MatRef::new(&logits, sizes[2], 4).unwrap(), &labels, None)
                .unwrap()
                .loss
        };
        let initial = loss_of(&m);
        for step in 0..300 {
            let fwd = m.forward(&blocks, &x, true, step).unwrap();
            let mut g = vec![0f32; sizes[2] * 4];
            softmax_cross_entropy(
                MatRef::new(fwd.logits(), sizes[2], 4).unwrap(),
                &labels,
                Some(MatMut::new(&mut g, sizes[2], 4).unwrap()),
            )
            .unwrap();
            let grads = m.backward(&blocks, &fwd, &g).unwrap();
            let grads: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
            opt.step(&mut m.params_mut(), &grads).unwrap();
        }
        let last = loss_of(&m);
        assert!(last < 0.5 * initial, "{kind:?}: loss {initial} -> {last}");
    }
}

/// Release timing on WordNet's shape: `cargo test --release -p cpu_ops
/// bench_two_layer -- --ignored --nocapture`.
#[test]
#[ignore = "timing run; use --release"]
fn bench_two_layer_wordnet_shape() {
    use crate::graph::{BuildOptions, CsrGraph};
    use crate::sampler::{NeighborSampler, SamplerScratch};
    use std::time::Instant;

    let n = 100_000usize;
    let mut rng = Rng::new(71);
    let edges: Vec<(u32, u32)> = (0..1_000_000)
        .map(|_| (rng.below(n as u64) as u32, rng.below(n as u64) as u32))
        .collect();
    let graph = CsrGraph::from_edges(n, &edges, BuildOptions::UNDIRECTED).unwrap();
    let mut seeds: Vec<u32> = (0..n as u32).collect();
    rng.shuffle(&mut seeds);
    seeds.truncate(1024);
    let sampler = NeighborSampler::new(vec![10, 10]).unwrap();
    let mut scratch = SamplerScratch::new(n);
    let batch = sampler.sample(&graph, &seeds, 1, &mut scratch).unwrap();
    let blocks: Vec<BlockView<'_>> = batch
        .blocks()
        .iter()
        .map(|b| BlockView::new(b.num_src(), b.indptr(), b.indices()).unwrap())
        .collect();
    let (in_dim, classes) = (2000, 45);
    let x: Vec<f32> = rand_vec(&mut rng, blocks[0].num_src() * in_dim);
    let g: Vec<f32> = rand_vec(&mut rng, blocks[1].num_dst() * classes);
    println!(
        "threads {}, blocks: {} -> {} ({} edges), {} -> {} ({} edges)",
        rayon::current_num_threads(),
        blocks[0].num_src(),
        blocks[0].num_dst(),
        blocks[0].num_edges(),
        blocks[1].num_src(),
        blocks[1].num_dst(),
        blocks[1].num_edges()
    );
    for kind in KINDS {
        let mut cfg = config(kind, (in_dim, 256, classes), 2, 4);
        cfg.dropout = 0.5;
        let m = Model::<f32>::new(&cfg, 1).unwrap();
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (mut tf, mut tb, mut tl) = (Vec::new(), Vec::new(), Vec::new());
        for it in 0..4 {
            let t0 = Instant::now();
            let fwd = m.forward(&blocks, &x, true, it).unwrap();
            let t1 = Instant::now();
            let grads = m.backward(&blocks, &fwd, &g).unwrap();
            let t2 = Instant::now();
            drop((fwd, grads));
            let t3 = Instant::now();
            let lean = m.forward_lean(&blocks, &x, true, it).unwrap();
            let grads = m.backward_with_input(&blocks, &x, &lean, &g).unwrap();
            let t4 = Instant::now();
            drop(grads);
            if it > 0 {
                tf.push((t1 - t0).as_secs_f64() * 1e3);
                tb.push((t2 - t1).as_secs_f64() * 1e3);
                tl.push((t4 - t3).as_secs_f64() * 1e3);
            }
        }
        let (f, b) = (median(tf), median(tb));
        println!(
            "{kind:?}: forward {f:.1} ms + backward {b:.1} ms = {:.1} ms; \
             forward_lean + backward_with_input {:.1} ms ({} params)",
            f + b,
            median(tl),
            m.num_params()
        );
    }
}

/// Release timing of a 2-layer SAGE on WordNet's shape with ~1% binary input
/// features, dense input against sparse input: `cargo test --release -p cpu_ops
/// bench_sparse_input -- --ignored --nocapture`.
#[test]
#[ignore = "timing run; use --release"]
fn bench_sparse_input_wordnet_shape() {
    use crate::graph::{BuildOptions, CsrGraph};
    use crate::sampler::{NeighborSampler, SamplerScratch};
    use std::time::Instant;

    let n = 100_000usize;
    let mut rng = Rng::new(71);
    let edges: Vec<(u32, u32)> = (0..1_000_000)
        .map(|_| (rng.below(n as u64) as u32, rng.below(n as u64) as u32))
        .collect();
    let graph = CsrGraph::from_edges(n, &edges, BuildOptions::UNDIRECTED).unwrap();
    let mut seeds: Vec<u32> = (0..n as u32).collect();
    rng.shuffle(&mut seeds);
    seeds.truncate(1024);
    let sampler = NeighborSampler::new(vec![10, 10]).unwrap();
    let mut scratch = SamplerScratch::new(n);
    let batch = sampler.sample(&graph, &seeds, 1, &mut scratch).unwrap();
    let blocks: Vec<BlockView<'_>> = batch
        .blocks()
        .iter()
        .map(|b| BlockView::new(b.num_src(), b.indptr(), b.indices()).unwrap())
        .collect();
    let (in_dim, classes) = (2000, 45);
    let ns = blocks[0].num_src();
    let x: Vec<f32> = (0..ns * in_dim)
        .map(|_| if rng.below(100) == 0 { 1.0 } else { 0.0 })
        .collect();
    let t = Instant::now();
    let sx = SparseRows::from_dense(&x, ns, in_dim).unwrap();
    let t_build = t.elapsed().as_secs_f64() * 1e3;
    let g: Vec<f32> = rand_vec(&mut rng, blocks[1].num_dst() * classes);
    println!(
        "threads {}, blocks: {} -> {} -> {}, input nnz {} (density {:.4}), from_dense {t_build:.1} ms",
        rayon::current_num_threads(),
        ns,
        blocks[0].num_dst(),
        blocks[1].num_dst(),
        sx.nnz(),
        sx.density()
    );
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for kind in KINDS {
        let mut cfg = config(kind, (in_dim, 256, classes), 2, 4);
        cfg.dropout = 0.5;
        let m = Model::<f32>::new(&cfg, 1).unwrap();
        for (name, input) in [
            ("dense ", ModelInput::Dense(&x)),
            ("sparse", ModelInput::Sparse(&sx)),
        ] {
            let (mut tf, mut tb) = (Vec::new(), Vec::new());
            for it in 0..4 {
                let t0 = Instant::now();
                let fwd = m.forward_input(&blocks, input, true, it).unwrap();
                let t1 = Instant::now();
                let grads = m.backward_input(&blocks, input, &fwd, &g).unwrap();
                let t2 = Instant::now();
                drop((fwd, grads));
                if it > 0 {
                    tf.push((t1 - t0).as_secs_f64() * 1e3);
                    tb.push((t2 - t1).as_secs_f64() * 1e3);
                }
            }
            let (f, b) = (median(tf), median(tb));
            println!(
                "{kind:?} {name}: forward {f:.1} ms + backward {b:.1} ms = {:.1} ms",
                f + b
            );
        }
    }
}

#[test]
fn hidden_output_is_the_input_of_the_layer_above() {
    // The top layer of a 2-layer model, run alone on `hidden(0)`, gives the logits.
    let mut rng = Rng::new(21);
    let sizes = [300, 90, 30];
    let batch = random_batch(&mut rng, &sizes, 9);
    let blocks = views(&batch);
    for kind in KINDS {
        let cfg = config(kind, (12, 8, 5), 2, 2);
        let full = Model::<f64>::new(&cfg, 3).unwrap();
        let x: Vec<f64> = rand_vec(&mut rng, sizes[0] * 12);
        let fwd = full.forward(&blocks, &x, false, 0).unwrap();
        let h = fwd.hidden(0).expect("layer 0 is hidden");
        assert_eq!(h.len(), sizes[1] * 8, "{kind:?}");
        assert!(fwd.hidden(1).is_none() && fwd.hidden(2).is_none());
        let mut top = Model::<f64>::new(&config(kind, (8, 8, 5), 1, 2), 0).unwrap();
        let tail = full.params().len() - top.params().len();
        for (d, s) in top.params_mut().into_iter().zip(&full.params()[tail..]) {
            d.copy_from_slice(s);
        }
        let alone = top.forward(&blocks[1..], h, false, 0).unwrap();
        assert_eq!(alone.logits(), fwd.logits(), "{kind:?}");
    }
}

#[test]
fn forward_layer_with_own_params_matches_the_full_forward() {
    for kind in [ModelKind::Gcn, ModelKind::Sage, ModelKind::Gat] {
        let cfg = ModelConfig {
            kind,
            in_dim: 6,
            hidden: 8,
            num_classes: 3,
            num_layers: 2,
            heads: 2,
            dropout: 0.0,
        };
        let model = Model::<f32>::new(&cfg, 3).unwrap();
        // 4 sources, 3 destinations.
        let (indptr, indices) = (vec![0u64, 2, 3, 5], vec![1u32, 3, 0, 2, 3]);
        let b0 = BlockView::new(4, &indptr, &indices).unwrap();
        let b1 = BlockView::new(3, &[0, 2], &[1, 2]).unwrap();
        let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
        let fwd = model
            .forward(
                &[BlockView::new(4, &indptr, &indices).unwrap(), b1],
                &x,
                false,
                0,
            )
            .unwrap();
        let own: Vec<Vec<f32>> = model.layer_params(0).unwrap().to_vec();
        let h = model
            .forward_layer_with(0, &own, &b0, ModelInput::Dense(&x))
            .unwrap();
        assert_eq!(h.as_slice(), fwd.hidden(0).unwrap(), "{kind:?}");
        // Other weights give other rows; wrong tensors are refused.
        let mut other = own.clone();
        other[0].iter_mut().for_each(|w| *w *= 2.0);
        let h2 = model
            .forward_layer_with(0, &other, &b0, ModelInput::Dense(&x))
            .unwrap();
        assert_ne!(h2, h);
        assert!(model
            .forward_layer_with(0, &own[..1], &b0, ModelInput::Dense(&x))
            .is_err());
        assert!(model.layer_params(2).is_err());
    }
}
