//! Finite differences against the analytic gradients: [`DeviceModel::backward`]
//! for a few random coordinates of every parameter tensor, per kind, 1–3
//! layers, both projection orders (and dense against sparse layer-0 input, and a
//! fixed dropout mask); every layer's `∂X` ([`super::super::Layer::backward`]
//! with `need_dx`) for a few coordinates of its input rows.
//!
//! The loss is `L = ⟨G, out⟩` for a fixed random `G`, summed in `f64` from the
//! fp32 outputs; `∂L/∂θ ≈ (L(θ + ε) − L(θ − ε)) / 2ε`. ReLU, LeakyReLU and the
//! ELU have kinks: a coordinate whose one-sided differences disagree crossed one
//! within `±ε` and is skipped (at most a quarter of them may be; which ones does
//! not depend on the analytic gradient, so skipping cannot hide a wrong one).

use std::sync::Arc;

use cpu_ops::{AdamConfig, ModelConfig, ModelKind, Rng, SparseRows};

use super::{random_blocks, random_params, TestBlock};
use crate::model::layer::{LayerCall, LayerGrad};
use crate::model::registry::arch;
use crate::model::{DeviceModel, LayerInput, ModelLayout};
use crate::prelude::*;
use crate::HostBackend;

/// Step of the differences (parameters and inputs are O(1)).
const EPS: f64 = 4e-3;
/// Relative tolerance on the gradient.
const RTOL: f64 = 5e-3;

/// Compares finite differences of `loss` with `analytic` at coordinates `at` of
/// `values`; returns (checked, skipped at kinks).
fn compare(
    what: &str,
    values: &mut [f32],
    analytic: &[f32],
    at: &[usize],
    loss: &mut dyn FnMut(&[f32]) -> (f64, f64),
) -> (usize, usize) {
    let (l0, mag) = loss(values);
    // fp32 rounding of the outputs, seen through the ε of the differences.
    let noise = 2e-7 * mag / EPS;
    let (mut checked, mut skipped) = (0, 0);
    for &k in at {
        let orig = values[k];
        values[k] = (f64::from(orig) + EPS) as f32;
        let up_step = f64::from(values[k]) - f64::from(orig);
        let (up, _) = loss(values);
        values[k] = (f64::from(orig) - EPS) as f32;
        let down_step = f64::from(orig) - f64::from(values[k]);
        let (down, _) = loss(values);
        values[k] = orig;
        let (d_up, d_down) = ((up - l0) / up_step, (l0 - down) / down_step);
        let fd = (up - down) / (up_step + down_step);
        let an = f64::from(analytic[k]);
        let big = fd.abs().max(an.abs());
        if (d_up - d_down).abs() > 0.1 * big + 4.0 * noise {
            skipped += 1;
            continue;
        }
        let tol = RTOL * big + 0.5 * (d_up - d_down).abs() + 2.0 * noise;
        assert!(
            (fd - an).abs() <= tol,
            "{what}[{k}]: finite difference {fd:.6e} vs analytic {an:.6e} (tolerance {tol:.1e})"
        );
        checked += 1;
    }
    (checked, skipped)
}

/// Up to `n` distinct random coordinates below `len`.
fn coordinates(rng: &mut Rng, len: usize, n: usize) -> Vec<usize> {
    let mut all: Vec<usize> = (0..len).collect();
    rng.shuffle(&mut all);
    all.truncate(n);
    all
}

/// `Σ g·out` in `f64`, and `Σ |g·out|` (the scale of its rounding).
fn dot(g: &[f32], out: &[f32]) -> (f64, f64) {
    g.iter().zip(out).fold((0.0, 0.0), |(s, m), (&a, &b)| {
        let p = f64::from(a) * f64::from(b);
        (s + p, m + p.abs())
    })
}

/// One model's parameter gradients against finite differences.
fn check_model(cfg: &ModelConfig, sizes: &[usize], seed: u64, sparse: bool) {
    let dev = HostBackend::new();
    let mut rng = Rng::new(seed);
    let layout = ModelLayout::new(cfg).expect("layout");
    let mut params = random_params(&mut rng, &layout, 1.0);
    let tb: Vec<TestBlock> = random_blocks(&mut rng, sizes, 4);
    let blocks: Vec<_> = tb.iter().map(|b| b.on(&dev)).collect();
    let mut x: Vec<f32> = (0..sizes[0] * cfg.in_dim)
        .map(|_| rng.normal() as f32)
        .collect();
    if sparse {
        for v in x.iter_mut() {
            if rng.below(10) < 7 {
                *v = 0.0;
            }
        }
    }
    let xd = dev.to_device(&x).expect("x");
    let xs = SparseRows::from_dense(&x, sizes[0], cfg.in_dim).expect("sparse");
    let xs = dev.sparse_from_host(Arc::new(xs)).expect("sparse");
    let input = if sparse {
        LayerInput::Sparse(&xs)
    } else {
        LayerInput::Dense(&xd)
    };
    let rows = sizes[sizes.len() - 1];
    let g: Vec<f32> = (0..rows * cfg.num_classes)
        .map(|_| rng.normal() as f32)
        .collect();
    let (train, drop_seed) = (cfg.dropout > 0.0, 99);
    let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
    let mut dm = DeviceModel::from_params(&dev, cfg, &refs, AdamConfig::default()).expect("model");
    let fwd = dm
        .forward(&dev, &blocks, input, train, drop_seed)
        .expect("forward");
    let gd = dev.to_device(&g).expect("g");
    dm.backward(&dev, &blocks, input, &fwd, &gd)
        .expect("backward");
    let grads = dm.grads_to_host(&dev).expect("grads");
    assert!(grads.iter().flatten().any(|v| v.abs() > 1e-3), "{cfg:?}");
    let names = dm.param_names().to_vec();
    let what = format!("{cfg:?} sizes {sizes:?} sparse {sparse}");
    check_tensors(
        &what,
        &mut rng,
        &mut params,
        &grads,
        &names,
        &mut |params| {
            let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
            dm.load(&dev, &refs, None).expect("load");
            let f = dm
                .forward(&dev, &blocks, input, train, drop_seed)
                .expect("forward");
            dot(&g, &dev.to_host(f.logits(), g.len()).expect("logits"))
        },
    );
}

/// A loss evaluated at a model's tensors: `(L, Σ |terms|)`, as [`compare`] takes it.
pub(super) type TensorsLoss<'a> = dyn FnMut(&[Vec<f32>]) -> (f64, f64) + 'a;

/// Every tensor of `params` (named `names`) against finite differences at six
/// random coordinates, `loss` evaluating the model at the given tensors; at
/// most a quarter of the coordinates may sit at kinks.
pub(super) fn check_tensors(
    what: &str,
    rng: &mut Rng,
    params: &mut [Vec<f32>],
    grads: &[Vec<f32>],
    names: &[String],
    loss: &mut TensorsLoss<'_>,
) {
    let (mut checked, mut skipped) = (0, 0);
    for t in 0..params.len() {
        let at = coordinates(rng, params[t].len(), 6);
        let mut values = params[t].clone();
        let mut at_values = |v: &[f32]| {
            params[t].copy_from_slice(v);
            loss(params)
        };
        let what = format!("{what}: {}", names[t]);
        let (c, s) = compare(&what, &mut values, &grads[t], &at, &mut at_values);
        params[t] = values;
        checked += c;
        skipped += s;
    }
    assert!(
        skipped * 4 <= checked + skipped && checked > 0,
        "{what}: {skipped} of {} coordinates at kinks",
        checked + skipped
    );
}

pub(super) fn config(
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

const KINDS: [ModelKind; 3] = [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat];

#[test]
fn parameter_gradients_match_finite_differences_depth_1() {
    for kind in KINDS {
        for heads in [1, 2] {
            // d_in > d_out (project first) and d_in ≤ d_out (aggregate first).
            check_model(&config(kind, (7, 4, 3), 1, heads), &[13, 5], 1, false);
            check_model(&config(kind, (3, 4, 5), 1, heads), &[11, 7], 2, false);
        }
    }
}

#[test]
fn parameter_gradients_match_finite_differences_depth_2() {
    for kind in KINDS {
        for heads in [1, 2] {
            check_model(&config(kind, (5, 6, 3), 2, heads), &[19, 9, 5], 3, false);
            check_model(&config(kind, (9, 4, 5), 2, heads), &[17, 11, 3], 4, false);
        }
    }
}

#[test]
fn parameter_gradients_match_finite_differences_depth_3() {
    for kind in KINDS {
        check_model(&config(kind, (4, 6, 3), 3, 2), &[29, 15, 9, 5], 5, false);
        check_model(&config(kind, (11, 6, 3), 3, 3), &[27, 13, 7, 3], 6, false);
    }
}

/// A fixed dropout seed makes the training forward a deterministic function of
/// the parameters; a sparse layer-0 input always projects first.
#[test]
fn parameter_gradients_match_finite_differences_with_dropout_and_sparse_input() {
    for kind in KINDS {
        let mut cfg = config(kind, (5, 6, 3), 2, 2);
        cfg.dropout = 0.5;
        check_model(&cfg, &[19, 9, 5], 7, false);
        check_model(&config(kind, (3, 4, 4), 1, 2), &[11, 5], 8, true);
        check_model(&cfg, &[19, 9, 5], 9, true);
    }
}

/// One layer's input gradient (`need_dx`, what every layer above 0 returns to the
/// one below) against finite differences over its input rows, hidden and top.
fn check_input(cfg: &ModelConfig, ns: usize, nd: usize, seed: u64) {
    let dev = HostBackend::new();
    let mut rng = Rng::new(seed);
    let a = arch::<HostBackend>(cfg, crate::model::Head::Classify).expect("layers");
    let layer = &a.layers[0];
    let spec = *layer.spec();
    let layout = ModelLayout::new(cfg).expect("layout");
    let params = random_params(&mut rng, &layout, 1.0);
    let range = a.layer_params(0).expect("layer 0");
    let bufs: Vec<_> = params[range.clone()]
        .iter()
        .map(|t| dev.to_device(t).expect("tensor"))
        .collect();
    let b = random_blocks(&mut rng, &[ns, nd], 4).remove(0);
    let block = b.on(&dev);
    let mut x: Vec<f32> = (0..ns * spec.d_in).map(|_| rng.normal() as f32).collect();
    let g: Vec<f32> = (0..nd * spec.d_out).map(|_| rng.normal() as f32).collect();
    let gd = dev.to_device(&g).expect("g");
    let run = |x: &[f32]| {
        let xd = dev.to_device(x).expect("x");
        let call = LayerCall {
            params: &bufs,
            block: &block,
            x: LayerInput::Dense(&xd),
            num_src: ns,
            num_dst: nd,
        };
        let (out, state) = layer.forward_dyn(&dev, &call, true).expect("forward");
        let mut grads: Vec<_> = params[range.clone()]
            .iter()
            .map(|t| dev.alloc(t.len()).expect("grad"))
            .collect();
        let dx = layer
            .backward_dyn(
                &dev,
                &call,
                &state,
                LayerGrad {
                    g: &gd,
                    grads: &mut grads,
                    need_dx: true,
                    bias_done: false,
                },
            )
            .expect("backward")
            .expect("dx");
        (
            dev.to_host(&out, nd * spec.d_out).expect("out"),
            dev.to_host(&dx, ns * spec.d_in).expect("dx"),
        )
    };
    let (_, dx) = run(&x);
    // A source that no edge (nor self-loop) reads gets a zero gradient row.
    for j in 0..ns {
        let read = j < nd || b.indices.contains(&(j as u32));
        if !read {
            let row = &dx[j * spec.d_in..(j + 1) * spec.d_in];
            assert!(row.iter().all(|&v| v == 0.0), "{cfg:?}: unread source {j}");
        }
    }
    let at = coordinates(&mut rng, x.len(), 24);
    let what = format!("{cfg:?} ({ns} → {nd}): ∂X");
    let mut loss = |x: &[f32]| dot(&g, &run(x).0);
    let (checked, skipped) = compare(&what, &mut x, &dx, &at, &mut loss);
    assert!(
        skipped * 4 <= checked + skipped && checked > 0,
        "{what}: {skipped} of {} coordinates at kinks",
        checked + skipped
    );
}

#[test]
fn input_gradients_match_finite_differences() {
    for kind in KINDS {
        for heads in [1, 3] {
            for (d_in, d_out) in [(7, 3 * heads), (2, 5 * heads)] {
                // Layer 0 of two (hidden) and of one (the top).
                check_input(&config(kind, (d_in, d_out, 4), 2, heads), 23, 9, 10);
                check_input(&config(kind, (d_in, 0, d_out), 1, heads), 19, 7, 11);
            }
        }
    }
}
