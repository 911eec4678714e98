//! Layer 0 from host rows ([`layer0_rows`]) for every kind, and the fused CPU
//! GraphSAGE kernel ([`cpu_ops::SageHotKernel`], what the runtime's CPU workers
//! run for hot vertices) against the generic SAGE layer on the host backend.

use cpu_ops::{
    gather_rows_into_vec, BlockView, FeatureMatrix, HostArray, HotRequest, ModelConfig, ModelInput,
    ModelKind, NeighborSampler, Rng, SageHotKernel, SamplerScratch, ALL_NEIGHBORS,
};

use super::random_graph;
use crate::model::{layer0_rows, DeviceModel, Layer0, ModelLayout};
use crate::prelude::*;
use crate::HostBackend;

fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// Layer 0's tensors of `cfg` from `seed`, with a random (non-zero) bias.
fn layer0_tensors(cfg: &ModelConfig, seed: u64) -> Vec<Vec<f32>> {
    let layout = ModelLayout::new(cfg).expect("layout");
    let range = layout.layer_params(0).expect("layer 0");
    let mut t = layout.init_params(seed)[range].to_vec();
    let mut rng = Rng::new(seed ^ 0xb1a5);
    let bias = layout.layer(0).expect("layer 0").bias();
    for b in t[bias].iter_mut() {
        *b = rng.next_f32() - 0.5;
    }
    t
}

/// The fused kernel against `layer0_rows` over the one-hop block the sampler
/// draws for the same destinations and seed: odd widths both ways round (the
/// kernel always aggregates first, the layer projects first when `d_in > d_out`),
/// fanouts from 1 to all neighbors, hidden (ReLU) and top (no activation) layers.
#[test]
fn fused_sage_kernel_matches_the_generic_layer() {
    let n = 613;
    let g = random_graph(n, 7001, 17);
    let dev = HostBackend::new();
    let mut rng = Rng::new(4);
    let mut case = 0u64;
    for (d_in, d_out) in [(7, 13), (13, 7), (33, 9), (16, 16)] {
        let f = FeatureMatrix::new(HostArray::from_vec(random(&mut rng, n * d_in)), n, d_in)
            .expect("features");
        let mut ids: Vec<u32> = (0..n as u32).collect();
        rng.shuffle(&mut ids);
        ids.truncate(101);
        for relu in [true, false] {
            let cfg = ModelConfig {
                kind: ModelKind::Sage,
                in_dim: d_in,
                hidden: d_out,
                num_classes: if relu { 3 } else { d_out },
                num_layers: if relu { 2 } else { 1 },
                heads: 1,
                dropout: 0.0,
            };
            let tensors = layer0_tensors(&cfg, case);
            let mut kernel = SageHotKernel::new(&tensors, d_in, d_out).expect("kernel");
            for fanout in [1, 5, 12, ALL_NEIGHBORS] {
                case += 1;
                let seed = 100 + case;
                let mut got = vec![f32::NAN; ids.len() * d_out];
                let req = HotRequest {
                    graph: &g,
                    features: (&f).into(),
                    dst: &ids,
                    fanout,
                    seed,
                    relu,
                };
                kernel.compute(req, &mut got).expect("fused kernel");
                let sampler = NeighborSampler::new(vec![fanout]).expect("sampler");
                let mut scratch = SamplerScratch::new(n);
                let batch = sampler
                    .sample(&g, &ids, seed, &mut scratch)
                    .expect("sample");
                let x = gather_rows_into_vec(&f, batch.input_ids()).expect("gather");
                let b = &batch.blocks()[0];
                let view = BlockView::new(b.num_src(), b.indptr(), b.indices()).expect("view");
                let want = layer0_rows(&dev, &cfg, &tensors, &view, ModelInput::Dense(&x))
                    .expect("generic layer");
                assert_eq!(got.len(), want.len());
                let what = format!("{d_in}→{d_out} relu {relu} fanout {fanout}");
                for (k, (&a, &w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{what}[{k}]: fused {a}, generic {w}"
                    );
                }
                if relu {
                    assert!(got.iter().all(|&v| v >= 0.0), "{what}: ReLU");
                }
                assert!(got.iter().any(|&v| v != 0.0), "{what}: all zero");
            }
        }
    }
}

/// `layer0_rows` with a model's layer-0 tensors is `forward_layer(0, ..)` of that
/// model, bit for bit, for every kind (the hot rows of GCN and GAT).
#[test]
fn layer0_rows_is_forward_layer_with_those_weights() {
    let g = random_graph(301, 2500, 3);
    let dev = HostBackend::new();
    let graph = dev.load_graph(&g, Default::default()).expect("graph");
    for (kind, in_dim) in [
        (ModelKind::Sage, 9),
        (ModelKind::Sage, 29),
        (ModelKind::Gcn, 9),
        (ModelKind::Gcn, 29),
        (ModelKind::Gat, 15),
    ] {
        let cfg = ModelConfig {
            kind,
            in_dim,
            hidden: 14,
            num_classes: 3,
            num_layers: 2,
            heads: 2,
            dropout: 0.5,
        };
        let dm = DeviceModel::new(&dev, &cfg, 8, Default::default()).expect("model");
        let seeds: Vec<u32> = (0..31).map(|i| i * 5 + 1).collect();
        let batch = dev.sample(&graph, &seeds, &[6, 6], 2).expect("sample");
        let (ns, nd, _) = dev.block_shape(&batch.blocks[0]);
        let x = random(&mut Rng::new(in_dim as u64), ns * in_dim);
        let xd = dev.to_device(&x).expect("x");
        let want = dm
            .forward_layer(&dev, 0, &batch.blocks[0], &xd)
            .expect("forward_layer");
        let want = dev.to_host(&want, nd * 14).expect("rows");
        let params = dm.params_to_host(&dev).expect("params");
        let tensors = params[dm.layer_params(0).expect("range")].to_vec();
        let (indptr, indices) = dev.block_to_host(&batch.blocks[0]).expect("csr");
        let view = BlockView::new(ns, &indptr, &indices).expect("view");
        let got = layer0_rows(&dev, &cfg, &tensors, &view, ModelInput::Dense(&x)).expect("rows");
        assert_eq!(got, want, "{kind:?} {in_dim}");
        // Wrong tensors are errors, not garbage.
        assert!(layer0_rows(&dev, &cfg, &tensors[1..], &view, ModelInput::Dense(&x)).is_err());
        assert!(layer0_rows(&dev, &cfg, &tensors, &view, ModelInput::Dense(&x[1..])).is_err());
    }
}

/// A kept [`Layer0`] with newer weights gives what a fresh one with those
/// weights gives; wrong weights are refused and leave the old ones.
#[test]
fn layer0_keeps_its_weights_until_replaced() {
    let g = random_graph(97, 700, 6);
    let dev = HostBackend::new();
    let graph = dev.load_graph(&g, Default::default()).expect("graph");
    let cfg = ModelConfig {
        kind: ModelKind::Gat,
        in_dim: 7,
        hidden: 9,
        num_classes: 2,
        num_layers: 2,
        heads: 3,
        dropout: 0.0,
    };
    let batch = dev
        .sample(&graph, &[3, 1, 4, 15, 9, 26], &[5, 5], 1)
        .expect("sample");
    let (ns, nd, _) = dev.block_shape(&batch.blocks[0]);
    let x = dev.to_device(&random(&mut Rng::new(2), ns * 7)).expect("x");
    let (old, new) = (layer0_tensors(&cfg, 1), layer0_tensors(&cfg, 2));
    let mut kept = Layer0::new(&dev, &cfg, &old).expect("layer 0");
    assert_eq!(kept.spec().d_out, 9);
    let before = dev
        .to_host(
            &kept.forward(&dev, &batch.blocks[0], &x).expect("rows"),
            nd * 9,
        )
        .expect("rows");
    kept.set_weights(&dev, &new).expect("newer weights");
    let fresh = Layer0::new(&dev, &cfg, &new).expect("layer 0");
    let rows = |l: &Layer0<HostBackend>| {
        dev.to_host(
            &l.forward(&dev, &batch.blocks[0], &x).expect("rows"),
            nd * 9,
        )
        .expect("rows")
    };
    let after = rows(&kept);
    assert_eq!(after, rows(&fresh));
    assert_ne!(after, before);
    assert!(kept.set_weights(&dev, &new[..3]).is_err());
    let mut short = new.clone();
    short[1].pop();
    assert!(kept.set_weights(&dev, &short).is_err());
    assert_eq!(rows(&kept), after);
}
