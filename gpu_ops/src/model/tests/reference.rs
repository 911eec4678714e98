//! Plain scalar references, written here from the definitions (DGL's layers), in
//! `f64`: one layer of each kind — GraphSAGE-mean, GCN with self-loops and
//! symmetric normalization, GAT with per-head attention — and the model around
//! them (activation between layers, dropout of hidden representations seeded
//! `derive_seed(seed, l)`). [`DeviceModel`] on the host backend must agree within
//! fp32 rounding on small random blocks of odd sizes (isolated destinations,
//! unread sources, repeated edges), for hidden and top layers, both projection
//! orders, dense and sparse input.

use std::sync::Arc;

use cpu_ops::{
    derive_seed, dropout, AdamConfig, LayerSpec, ModelConfig, ModelKind, Rng, SparseRows,
    GAT_NEGATIVE_SLOPE,
};

use super::{random_blocks, random_params, TestBlock};
use crate::model::{DeviceModel, LayerInput, ModelLayout};
use crate::prelude::*;
use crate::HostBackend;

/// `x·W` for row `x` (`d_in`) and `W` (`d_in × n`, row-major), column `k`.
fn dot_col(x: &[f64], w: &[f64], n: usize, k: usize) -> f64 {
    x.iter().enumerate().map(|(c, v)| v * w[c * n + k]).sum()
}

/// GraphSAGE-mean: `out_i = x_i·W_self + mean_{j∈N(i)} x_j·W_neigh + b` (an
/// isolated destination's mean is 0).
fn sage(b: &TestBlock, x: &[f64], p: &[Vec<f64>], spec: &LayerSpec) -> Vec<f64> {
    let (d_in, d_out) = (spec.d_in, spec.d_out);
    let (w_self, w_neigh, bias) = (&p[0], &p[1], &p[2]);
    let row = |j: usize| &x[j * d_in..(j + 1) * d_in];
    let mut out = vec![0.0; b.num_dst() * d_out];
    for i in 0..b.num_dst() {
        let nb = b.neighbors(i);
        for k in 0..d_out {
            let mean = if nb.is_empty() {
                0.0
            } else {
                nb.iter()
                    .map(|&j| dot_col(row(j as usize), w_neigh, d_out, k))
                    .sum::<f64>()
                    / nb.len() as f64
            };
            out[i * d_out + k] = dot_col(row(i), w_self, d_out, k) + mean + bias[k];
        }
    }
    out
}

/// GCN on the block with a self-loop added to every destination:
/// `out_i = Σ_{j∈N(i)∪{i}} x_j·W / √(d̃_out(j)·d̃_in(i)) + b`, with `d̃_in(i) =
/// |N(i)| + 1` and `d̃_out(j)` the edges reading `j`, its self-loop included.
fn gcn(b: &TestBlock, x: &[f64], p: &[Vec<f64>], spec: &LayerSpec) -> Vec<f64> {
    let (d_in, d_out) = (spec.d_in, spec.d_out);
    let (w, bias) = (&p[0], &p[1]);
    let row = |j: usize| &x[j * d_in..(j + 1) * d_in];
    let nd = b.num_dst();
    let d_out_of =
        |j: usize| b.indices.iter().filter(|&&s| s as usize == j).count() + usize::from(j < nd);
    let mut out = vec![0.0; nd * d_out];
    for i in 0..nd {
        let d_in_i = (b.neighbors(i).len() + 1) as f64;
        let reads: Vec<usize> = b
            .neighbors(i)
            .iter()
            .map(|&j| j as usize)
            .chain([i])
            .collect();
        for k in 0..d_out {
            let s: f64 = reads
                .iter()
                .map(|&j| dot_col(row(j), w, d_out, k) / (d_out_of(j) as f64 * d_in_i).sqrt())
                .sum();
            out[i * d_out + k] = s + bias[k];
        }
    }
    out
}

/// GAT with `spec.heads` heads of width `f = spec.head_dim`: `z = X·W`; per head,
/// edge `j → i` scores `LeakyReLU_{0.2}(a_src·z_j + a_dst·z_i)`, softmax over the
/// edges into `i`, `o_i = Σ α z_j` (0 without edges). Hidden: `o + b`, heads
/// concatenated; top (`spec.last`): the mean over heads of `o_h + b_h`.
fn gat(b: &TestBlock, x: &[f64], p: &[Vec<f64>], spec: &LayerSpec) -> Vec<f64> {
    let (d_in, heads, f, last) = (spec.d_in, spec.heads, spec.head_dim, spec.last);
    let (w, a_src, a_dst, bias) = (&p[0], &p[1], &p[2], &p[3]);
    let hf = heads * f;
    let z: Vec<f64> = (0..b.num_src)
        .flat_map(|j| {
            let xj = &x[j * d_in..(j + 1) * d_in];
            (0..hf).map(move |c| dot_col(xj, w, hf, c))
        })
        .collect();
    let zh = |j: usize, h: usize| &z[j * hf + h * f..j * hf + (h + 1) * f];
    let dot = |a: &[f64], v: &[f64]| -> f64 { a.iter().zip(v).map(|(p, q)| p * q).sum() };
    let leaky = |u: f64| if u > 0.0 { u } else { GAT_NEGATIVE_SLOPE * u };
    let nd = b.num_dst();
    let mut o = vec![0.0; nd * hf];
    for i in 0..nd {
        let nb = b.neighbors(i);
        if nb.is_empty() {
            continue;
        }
        for h in 0..heads {
            let (asrc, adst) = (&a_src[h * f..(h + 1) * f], &a_dst[h * f..(h + 1) * f]);
            let er = dot(adst, zh(i, h));
            let s: Vec<f64> = nb
                .iter()
                .map(|&j| leaky(dot(asrc, zh(j as usize, h)) + er))
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (&j, a) in nb.iter().zip(&e) {
                for c in 0..f {
                    o[i * hf + h * f + c] += a / sum * zh(j as usize, h)[c];
                }
            }
        }
    }
    if !last {
        for i in 0..nd {
            for c in 0..hf {
                o[i * hf + c] += bias[c];
            }
        }
        return o;
    }
    let mut out = vec![0.0; nd * f];
    for i in 0..nd {
        for c in 0..f {
            out[i * f + c] = (0..heads)
                .map(|h| o[i * hf + h * f + c] + bias[h * f + c])
                .sum::<f64>()
                / heads as f64;
        }
    }
    out
}

/// Layer `l` of `layout` over `b` from `x` (`num_src × d_in`) with the layer's
/// tensors `p`: the output before the activation.
pub(super) fn layer(
    layout: &ModelLayout,
    l: usize,
    b: &TestBlock,
    x: &[f64],
    p: &[Vec<f64>],
) -> Vec<f64> {
    let s = layout.layer_specs()[l];
    match layout.config().kind {
        ModelKind::Sage => sage(b, x, p, &s),
        ModelKind::Gcn => gcn(b, x, p, &s),
        ModelKind::Gat => gat(b, x, p, &s),
    }
}

/// The activation between layers: ReLU, ELU (`α = 1`) for GAT.
pub(super) fn activate(kind: ModelKind, h: &mut [f64]) {
    for v in h.iter_mut() {
        *v = match kind {
            ModelKind::Gat if *v <= 0.0 => v.exp_m1(),
            ModelKind::Gcn | ModelKind::Sage => v.max(0.0),
            ModelKind::Gat => *v,
        };
    }
}

/// The model's forward: every layer, the activation below the top, and with
/// `dropout` (training) the hidden representation entering layer `l ≥ 1` dropped
/// with seed `derive_seed(seed, l)`. Returns every layer's output (after its
/// activation below the top; the logits last).
pub(super) fn model(
    layout: &ModelLayout,
    blocks: &[TestBlock],
    x: &[f64],
    params: &[Vec<f64>],
    dropout_seed: Option<u64>,
) -> Vec<Vec<f64>> {
    let cfg = layout.config();
    let mut outs: Vec<Vec<f64>> = Vec::new();
    for (l, b) in blocks.iter().enumerate() {
        let mut h = outs.last().cloned().unwrap_or_else(|| x.to_vec());
        if let (true, Some(seed)) = (l > 0, dropout_seed) {
            dropout(&mut h, f64::from(cfg.dropout), derive_seed(seed, l as u64)).expect("dropout");
        }
        let range = layout.layer_params(l).expect("layer");
        let mut out = layer(layout, l, b, &h, &params[range]);
        if !layout.layer_specs()[l].last {
            activate(cfg.kind, &mut out);
        }
        outs.push(out);
    }
    outs
}

/// `got` (fp32) within `tol` of `want`, relative to the largest `|want|` (at
/// least 1); returns the largest relative difference.
pub(super) fn assert_near(what: &str, got: &[f32], want: &[f64], tol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let mut worst = 0.0f64;
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (f64::from(g) - w).abs() / scale;
        assert!(
            d <= tol,
            "{what}[{k}]: model {g} vs reference {w} (scale {scale})"
        );
        worst = worst.max(d);
    }
    worst
}

pub(super) fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
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

/// One layer alone ([`DeviceModel::forward_layer`]) against the reference, as a
/// hidden layer (layer 0 of two: activation, GAT heads concatenated) and as the
/// top (one layer: no activation, GAT heads averaged), `d_in` above and below
/// `d_out`, dense and sparse input.
#[test]
fn one_layer_matches_the_scalar_reference() {
    let dev = HostBackend::new();
    let mut rng = Rng::new(51);
    let mut worst = 0.0f64;
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let heads_list: &[usize] = if kind == ModelKind::Gat {
            &[1, 2, 3]
        } else {
            &[1]
        };
        for &heads in heads_list {
            // (d_in, d_out): project first (d_in > d_out) and aggregate first.
            for (d_in, d_out) in [(13, 3 * heads), (5, 7 * heads), (9, 9)] {
                for last in [false, true] {
                    if !last && d_out % heads != 0 {
                        continue; // GAT's hidden width is a multiple of the heads
                    }
                    let cfg = if last {
                        config(kind, (d_in, 0, d_out), 1, heads)
                    } else {
                        config(kind, (d_in, d_out, 5), 2, heads)
                    };
                    let layout = ModelLayout::new(&cfg).expect("layout");
                    let params = random_params(&mut rng, &layout, 0.7);
                    let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
                    let dm = DeviceModel::from_params(&dev, &cfg, &refs, AdamConfig::default())
                        .expect("model");
                    let (ns, nd) = (17 + rng.below(9) as usize, 3 + rng.below(9) as usize);
                    let b = &random_blocks(&mut rng, &[ns, nd], 5)[0];
                    let mut x: Vec<f32> = (0..ns * d_in).map(|_| rng.normal() as f32).collect();
                    // Some zeros, for the sparse input (a row of its own empty).
                    for (k, v) in x.iter_mut().enumerate() {
                        if k / d_in == 2 || rng.below(3) == 0 {
                            *v = 0.0;
                        }
                    }
                    let range = layout.layer_params(0).expect("layer 0");
                    let p64: Vec<Vec<f64>> = params[range].iter().map(|t| to64(t)).collect();
                    let mut want = layer(&layout, 0, b, &to64(&x), &p64);
                    if !last {
                        activate(kind, &mut want);
                    }
                    let what = format!("{kind:?} heads {heads} {d_in}→{d_out} last {last}");
                    let block = b.on(&dev);
                    let xd = dev.to_device(&x).expect("x");
                    let got = dm.forward_layer(&dev, 0, &block, &xd).expect("layer");
                    let got = dev.to_host(&got, nd * d_out).expect("rows");
                    worst = worst.max(assert_near(&what, &got, &want, 1e-5));
                    let sx = SparseRows::from_dense(&x, ns, d_in).expect("sparse");
                    let sx = dev.sparse_from_host(Arc::new(sx)).expect("sparse");
                    let got = dm
                        .forward_layer(&dev, 0, &block, LayerInput::Sparse(&sx))
                        .expect("sparse layer");
                    let got = dev.to_host(&got, nd * d_out).expect("rows");
                    let w = assert_near(&format!("{what} sparse"), &got, &want, 1e-5);
                    worst = worst.max(w);
                }
            }
        }
    }
    eprintln!("one layer against the reference: worst relative difference {worst:.2e}");
}

/// A block without edges: SAGE gives `x_i·W_self + b`, GCN `x_i·W + b` (the
/// self-loop alone, norm 1), GAT the bias alone.
#[test]
fn a_block_without_edges_gives_the_self_or_bias_path() {
    let dev = HostBackend::new();
    let mut rng = Rng::new(3);
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let cfg = config(kind, (4, 0, 6), 1, 2);
        let layout = ModelLayout::new(&cfg).expect("layout");
        let params = random_params(&mut rng, &layout, 0.5);
        let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
        let dm = DeviceModel::from_params(&dev, &cfg, &refs, AdamConfig::default()).expect("dm");
        let b = TestBlock {
            num_src: 5,
            indptr: vec![0; 4],
            indices: Vec::new(),
        };
        let x: Vec<f32> = (0..20).map(|_| rng.normal() as f32).collect();
        let (x64, p) = (to64(&x), params.iter().map(|t| to64(t)).collect::<Vec<_>>());
        let want: Vec<f64> = (0..3)
            .flat_map(|i| (0..6).map(move |k| (i, k)))
            .map(|(i, k)| {
                let own = |w: &[f64]| dot_col(&x64[i * 4..(i + 1) * 4], w, 6, k);
                match kind {
                    ModelKind::Sage => own(&p[0]) + p[2][k],
                    ModelKind::Gcn => own(&p[0]) + p[1][k],
                    ModelKind::Gat => (p[3][k] + p[3][6 + k]) / 2.0,
                }
            })
            .collect();
        assert_eq!(
            layer(&layout, 0, &b, &x64, &p),
            want,
            "{kind:?}: the reference"
        );
        let xd = dev.to_device(&x).expect("x");
        let got = dm.forward_layer(&dev, 0, &b.on(&dev), &xd).expect("layer");
        let got = dev.to_host(&got, 3 * 6).expect("rows");
        assert_near(&format!("{kind:?} without edges"), &got, &want, 1e-6);
    }
}

/// The whole model (1–3 layers, with and without training dropout) against the
/// reference composed from the layers; inference layer by layer
/// ([`DeviceModel::forward_layer`]) gives the forward's logits bit for bit.
#[test]
fn model_forward_matches_the_composed_reference() {
    let dev = HostBackend::new();
    let mut rng = Rng::new(77);
    let sizes = [43, 23, 13, 7];
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        for layers in 1..=3 {
            for (in_dim, hidden) in [(11, 6), (5, 12)] {
                let mut cfg = config(kind, (in_dim, hidden, 5), layers, 3);
                cfg.dropout = 0.4;
                let layout = ModelLayout::new(&cfg).expect("layout");
                let params = random_params(&mut rng, &layout, 0.6);
                let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
                let dm = DeviceModel::from_params(&dev, &cfg, &refs, AdamConfig::default())
                    .expect("model");
                let tb = random_blocks(&mut rng, &sizes[..=layers], 4);
                let blocks: Vec<_> = tb.iter().map(|b| b.on(&dev)).collect();
                let x: Vec<f32> = (0..sizes[0] * in_dim)
                    .map(|_| rng.normal() as f32)
                    .collect();
                let xd = dev.to_device(&x).expect("x");
                let p64: Vec<Vec<f64>> = params.iter().map(|t| to64(t)).collect();
                let rows = sizes[layers] * 5;
                let what = format!("{kind:?} × {layers}, {in_dim} → {hidden}");
                for train in [false, true] {
                    let seed = 1234;
                    let fwd = dm.forward(&dev, &blocks, &xd, train, seed).expect("fwd");
                    let got = dev.to_host(fwd.logits(), rows).expect("logits");
                    let outs = model(&layout, &tb, &to64(&x), &p64, train.then_some(seed));
                    let want = outs.last().expect("logits");
                    assert_near(&format!("{what} train {train}"), &got, want, 1e-5);
                    if train && layers > 1 {
                        let plain = model(&layout, &tb, &to64(&x), &p64, None);
                        assert!(
                            plain.last() != outs.last(),
                            "{what}: dropout changed nothing"
                        );
                    }
                }
                // Layer-wise inference, as full-graph evaluation runs it.
                let mut h = xd;
                for (l, b) in blocks.iter().enumerate() {
                    h = dm.forward_layer(&dev, l, b, &h).expect("layer");
                }
                let eval = dm
                    .forward(&dev, &blocks, &dev.to_device(&x).expect("x"), false, 0)
                    .expect("eval");
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                assert_eq!(
                    bits(dev.to_host(&h, rows).expect("h")),
                    bits(dev.to_host(eval.logits(), rows).expect("logits")),
                    "{what}: layer by layer"
                );
            }
        }
    }
}
