//! [`DeviceModel`] on the host backend. The model is pinned end to end by
//! `runtime/tests/golden.rs` (losses and weights recorded bit for bit); here, layer
//! by layer and step by step:
//!
//! - `reference`: plain scalar forwards of one layer of each kind, and the model
//!   composed from them, against the model within fp32 rounding;
//! - `gradcheck`: finite differences of the loss against
//!   [`DeviceModel::backward`] for every parameter, and against every layer's
//!   input gradient;
//! - `init`: initialization, names, shapes and layer specs (DGL's, spelled out);
//! - `sparse`: sparse input against the dense rows it holds;
//! - `layer0`: layer 0 from host rows, and the fused CPU SAGE kernel against the
//!   generic layer;
//! - `link`: the link head (finite differences through both decoders, the
//!   decoder's tensors, link steps, node labels unchanged, the decoder's export);
//! - this file: Adam's update against `cpu_ops::Adam`, determinism over thread
//!   counts, dropout, training, split steps, errors, and hot rows.

mod gradcheck;
mod init;
mod layer0;
mod link;
mod reference;
mod sparse;

use cpu_ops::{
    Adam, AdamConfig, BuildOptions, CsrGraph, ModelConfig, ModelKind, NeighborSampler, Optimizer,
    Rng, SamplerScratch,
};

use super::{DeviceModel, ModelLayout, Target};
use crate::prelude::*;
use crate::{HostBackend, HostBlock, LossSlot};

pub(super) fn random_graph(n: usize, m: usize, seed: u64) -> CsrGraph {
    let mut rng = Rng::new(seed);
    let edges: Vec<(u32, u32)> = (0..m)
        .map(|_| (rng.below(n as u64) as u32, rng.below(n as u64) as u32))
        .collect();
    CsrGraph::from_edges(n, &edges, BuildOptions::UNDIRECTED).expect("graph")
}

pub(super) fn close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}[{i}]: {x} vs {y} (scale {scale})"
        );
    }
}

/// A block on the host: `num_src` sources, `indptr.len() − 1` destinations.
pub(super) struct TestBlock {
    pub(super) num_src: usize,
    pub(super) indptr: Vec<u64>,
    pub(super) indices: Vec<u32>,
}

impl TestBlock {
    pub(super) fn num_dst(&self) -> usize {
        self.indptr.len() - 1
    }

    /// Destination `i`'s sources, in edge order (repeats included).
    pub(super) fn neighbors(&self, i: usize) -> &[u32] {
        &self.indices[self.indptr[i] as usize..self.indptr[i + 1] as usize]
    }

    /// The block on the host backend.
    pub(super) fn on(&self, dev: &HostBackend) -> HostBlock {
        dev.block_from_host(self.num_src, &self.indptr, &self.indices)
            .expect("block")
    }
}

/// Chained random blocks, `sizes[l]` sources and `sizes[l + 1]` destinations for
/// block `l`: about a quarter of the destinations isolated, up to `max_deg`
/// sources each, drawn with repeats (so some sources are read twice, some never).
pub(super) fn random_blocks(rng: &mut Rng, sizes: &[usize], max_deg: u64) -> Vec<TestBlock> {
    sizes
        .windows(2)
        .map(|w| {
            let (num_src, num_dst) = (w[0], w[1]);
            let mut indptr = vec![0u64];
            let mut indices = Vec::new();
            for _ in 0..num_dst {
                if rng.below(4) != 0 {
                    for _ in 0..1 + rng.below(max_deg) {
                        indices.push(rng.below(num_src as u64) as u32);
                    }
                }
                indptr.push(indices.len() as u64);
            }
            TestBlock {
                num_src,
                indptr,
                indices,
            }
        })
        .collect()
}

/// Every tensor of `layout` uniform in `(−scale, scale)`, biases included (they
/// start at zero otherwise).
pub(super) fn random_params(rng: &mut Rng, layout: &ModelLayout, scale: f32) -> Vec<Vec<f32>> {
    layout
        .params()
        .iter()
        .map(|p| {
            (0..p.len)
                .map(|_| (rng.next_f32() * 2.0 - 1.0) * scale)
                .collect()
        })
        .collect()
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|t| t.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// [`DeviceModel::step`] is `cpu_ops::Adam` (L2 decay) applied to the model's
/// gradients, bit for bit, over two steps (moments and bias correction), for
/// every kind.
#[test]
fn step_is_adam_on_the_gradients() {
    let g = random_graph(300, 2400, 7);
    let dev = HostBackend::new();
    // The device takes fp32 hyper-parameters: the host optimizer gets the same.
    let f32s = |v: f64| f64::from(v as f32);
    let d = AdamConfig::default();
    let adam = AdamConfig {
        lr: f32s(0.01),
        weight_decay: f32s(5e-4),
        beta1: f32s(d.beta1),
        beta2: f32s(d.beta2),
        eps: f32s(d.eps),
        decay: d.decay,
    };
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let cfg = ModelConfig {
            kind,
            in_dim: 12,
            hidden: 16,
            num_classes: 5,
            num_layers: 2,
            heads: 2,
            dropout: 0.5,
        };
        let mut dm = DeviceModel::new(&dev, &cfg, 11, adam).expect("model");
        let mut host = Adam::<f32>::new(adam).expect("adam");
        let mut want = dm.params_to_host(&dev).expect("params");
        let seeds: Vec<u32> = (0..40).map(|i| i * 7).collect();
        let sampler = NeighborSampler::new(vec![4, 4]).expect("sampler");
        let mut scratch = SamplerScratch::new(g.num_vertices());
        let batch = sampler.sample(&g, &seeds, 3, &mut scratch).expect("sample");
        let blocks: Vec<_> = batch
            .blocks()
            .iter()
            .map(|b| {
                dev.block_from_host(b.num_src(), b.indptr(), b.indices())
                    .expect("block")
            })
            .collect();
        let mut rng = Rng::new(5);
        let n_in = batch.input_ids().len();
        let x: Vec<f32> = (0..n_in * 12).map(|_| rng.normal() as f32).collect();
        let xd = dev.to_device(&x).expect("x");
        let labels: Vec<u32> = seeds.iter().map(|&s| s % 5).collect();
        let labels = dev.to_device(&labels).expect("labels");
        for step in 1..=2u64 {
            dm.forward_backward(&dev, &blocks, &xd, Target::Labels(&labels), step)
                .expect("forward and backward");
            let grads = dm.grads_to_host(&dev).expect("grads");
            assert!(grads.iter().flatten().any(|&v| v != 0.0));
            dm.step(&dev).expect("step");
            assert_eq!(dm.version(), step);
            let refs: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
            let mut mine: Vec<&mut [f32]> = want.iter_mut().map(Vec::as_mut_slice).collect();
            host.step(&mut mine, &refs).expect("host step");
            let got = dm.params_to_host(&dev).expect("params");
            assert_eq!(bits(&got), bits(&want), "{kind:?} step {step}");
        }
    }
}

/// Logits and gradients are the same bits on 1 and 3 threads (every kernel sums
/// in an order that does not depend on the thread count), with dropout.
#[test]
fn logits_and_gradients_do_not_depend_on_the_thread_count() {
    let mut rng = Rng::new(31);
    let sizes = [3001, 900, 251];
    let tb = random_blocks(&mut rng, &sizes, 20);
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let cfg = ModelConfig {
            kind,
            in_dim: 64,
            hidden: 48,
            num_classes: 10,
            num_layers: 2,
            heads: 3,
            dropout: 0.3,
        };
        let x: Vec<f32> = (0..sizes[0] * 64).map(|_| rng.normal() as f32).collect();
        let g: Vec<f32> = (0..sizes[2] * 10).map(|_| rng.normal() as f32).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            pool.install(|| {
                let dev = HostBackend::new();
                let mut dm = DeviceModel::new(&dev, &cfg, 7, AdamConfig::default()).expect("model");
                let blocks: Vec<_> = tb.iter().map(|b| b.on(&dev)).collect();
                let xd = dev.to_device(&x).expect("x");
                let fwd = dm.forward(&dev, &blocks, &xd, true, 5).expect("forward");
                let logits = dev.to_host(fwd.logits(), g.len()).expect("logits");
                let gd = dev.to_device(&g).expect("grad");
                dm.backward(&dev, &blocks, &xd, &fwd, &gd)
                    .expect("backward");
                let grads = dm.grads_to_host(&dev).expect("grads");
                (bits(&[logits]), bits(&grads))
            })
        };
        assert!(run(1) == run(3), "{kind:?}");
    }
}

/// Dropout runs only in training, follows its seed, and acts on hidden
/// representations only (a one-layer model ignores it).
#[test]
fn dropout_runs_only_in_training_and_follows_the_seed() {
    let dev = HostBackend::new();
    let mut rng = Rng::new(41);
    let sizes = [60, 30, 12];
    let tb = random_blocks(&mut rng, &sizes, 6);
    let blocks: Vec<_> = tb.iter().map(|b| b.on(&dev)).collect();
    let x: Vec<f32> = (0..sizes[0] * 8).map(|_| rng.normal() as f32).collect();
    let xd = dev.to_device(&x).expect("x");
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let mut cfg = ModelConfig {
            kind,
            in_dim: 8,
            hidden: 16,
            num_classes: 4,
            num_layers: 2,
            heads: 2,
            dropout: 0.0,
        };
        let no_drop = DeviceModel::new(&dev, &cfg, 3, AdamConfig::default()).expect("model");
        cfg.dropout = 0.5;
        let m = DeviceModel::new(&dev, &cfg, 3, AdamConfig::default()).expect("model");
        let logits = |m: &DeviceModel<HostBackend>, b: &[HostBlock], train, seed| {
            let f = m.forward(&dev, b, &xd, train, seed).expect("forward");
            dev.to_host(f.logits(), f.rows() * 4).expect("logits")
        };
        let eval = logits(&m, &blocks, false, 1);
        assert_eq!(
            eval,
            logits(&m, &blocks, false, 2),
            "{kind:?}: eval ignores the seed"
        );
        assert_eq!(eval, logits(&no_drop, &blocks, true, 1), "{kind:?}: p = 0");
        let train = logits(&m, &blocks, true, 1);
        assert_eq!(train, logits(&m, &blocks, true, 1), "{kind:?}: seeded");
        assert_ne!(train, eval, "{kind:?}: dropout changes training logits");
        assert_ne!(
            train,
            logits(&m, &blocks, true, 2),
            "{kind:?}: the seed matters"
        );
        let one = ModelConfig {
            num_layers: 1,
            ..cfg.clone()
        };
        let m1 = DeviceModel::new(&dev, &one, 3, AdamConfig::default()).expect("model");
        let b1 = &blocks[..1];
        let rows = |train| {
            let f = m1.forward(&dev, b1, &xd, train, 1).expect("forward");
            dev.to_host(f.logits(), f.rows() * 4).expect("logits")
        };
        assert_eq!(rows(true), rows(false), "{kind:?}: one layer");
    }
}

#[test]
fn train_step_lowers_the_loss() {
    let g = random_graph(200, 1600, 3);
    let cfg = ModelConfig {
        kind: ModelKind::Sage,
        in_dim: 8,
        hidden: 16,
        num_classes: 3,
        num_layers: 2,
        heads: 1,
        dropout: 0.0,
    };
    let dev = HostBackend::new();
    let adam = AdamConfig {
        lr: 0.01,
        ..AdamConfig::default()
    };
    let seeds: Vec<u32> = (0..64).collect();
    let batch = dev
        .sample(
            &dev.load_graph(&g, Default::default()).expect("graph"),
            &seeds,
            &[5, 5],
            1,
        )
        .expect("sample");
    let n_in = dev.block_shape(&batch.blocks[0]).0;
    let mut rng = Rng::new(2);
    let x: Vec<f32> = (0..n_in * 8).map(|_| rng.normal() as f32).collect();
    let xd = dev.to_device(&x).expect("x");
    let labels = dev
        .to_device(&seeds.iter().map(|&s| s % 3).collect::<Vec<u32>>())
        .expect("labels");
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let cfg = ModelConfig {
            kind,
            heads: 2,
            ..cfg
        };
        let mut dm = DeviceModel::new(&dev, &cfg, 1, adam).expect("device model");
        let first = dm
            .train_step(&dev, &batch.blocks, &xd, Target::Labels(&labels), 0)
            .expect("step")
            .loss;
        let mut last = first;
        for k in 1..100 {
            last = dm
                .train_step(&dev, &batch.blocks, &xd, Target::Labels(&labels), k)
                .expect("step")
                .loss;
        }
        assert!(last < first * 0.7, "{kind:?}: loss {first} -> {last}");
        assert_eq!(dm.version(), 100);
    }
    // Every buffer of a step is an output its op overwrites: none is zeroed
    // (on CUDA a zeroed allocation is a memset).
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let cfg = ModelConfig {
            kind,
            heads: 2,
            dropout: 0.3,
            ..cfg
        };
        let mut dm = DeviceModel::new(&dev, &cfg, 1, AdamConfig::default()).expect("model");
        let before = dev.transfer_stats();
        dm.train_step(&dev, &batch.blocks, &xd, Target::Labels(&labels), 0)
            .expect("step");
        let fills = dev.transfer_stats().since(&before).zero_fills;
        assert_eq!(fills, 0, "{kind:?}: {fills} zeroed buffers in a train step");
    }
}

/// The deferred step (no read) trains exactly as `train_step` (same loss sums,
/// same weights bit for bit); a non-finite input sets the sticky guard, so that
/// batch and every step queued after it leave the weights alone until
/// `rewind_skipped` moves the version back and clears it.
#[test]
fn a_deferred_step_equals_train_step_and_a_nan_freezes_the_weights_until_rewound() {
    let g = random_graph(200, 1600, 7);
    let dev = HostBackend::new();
    let seeds: Vec<u32> = (0..48).collect();
    let batch = dev
        .sample(
            &dev.load_graph(&g, Default::default()).expect("graph"),
            &seeds,
            &[4, 4],
            1,
        )
        .expect("sample");
    let n_in = dev.block_shape(&batch.blocks[0]).0;
    let mut rng = Rng::new(4);
    let x: Vec<f32> = (0..n_in * 8).map(|_| rng.normal() as f32).collect();
    let xd = dev.to_device(&x).expect("x");
    let mut bad = x.clone();
    bad[3] = f32::NAN; // row 0 is seed 0's own row: its logits become NaN
    let bad = dev.to_device(&bad).expect("bad x");
    let labels = dev
        .to_device(&seeds.iter().map(|&s| s % 3).collect::<Vec<u32>>())
        .expect("labels");
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let cfg = ModelConfig {
            kind,
            in_dim: 8,
            hidden: 16,
            num_classes: 3,
            num_layers: 2,
            heads: 2,
            dropout: 0.2,
        };
        let mut sync = DeviceModel::new(&dev, &cfg, 1, AdamConfig::default()).expect("model");
        let mut lag = DeviceModel::new(&dev, &cfg, 1, AdamConfig::default()).expect("model");
        let mut slots = dev.alloc::<u64>(2 * 4).expect("slots");
        let before = dev.transfer_stats();
        for k in 0..4u64 {
            lag.train_step_deferred(
                &dev,
                &batch.blocks,
                &xd,
                Target::Labels(&labels),
                k,
                LossSlot {
                    out: &mut slots,
                    slot: k as usize,
                },
            )
            .expect("deferred step");
        }
        assert_eq!(
            dev.transfer_stats().since(&before).syncs,
            0,
            "{kind:?}: a deferred step synchronized"
        );
        let words = dev.to_host(&slots, 8).expect("slots");
        for k in 0..4u64 {
            let s = sync
                .train_step(&dev, &batch.blocks, &xd, Target::Labels(&labels), k)
                .expect("step");
            let sum = f64::from_bits(words[2 * k as usize]);
            assert_eq!(sum, s.loss * seeds.len() as f64, "{kind:?} batch {k}");
            assert_eq!(words[2 * k as usize + 1], s.correct as u64, "{kind:?}");
        }
        let (ps, pl) = (
            sync.params_to_host(&dev).expect("params"),
            lag.params_to_host(&dev).expect("params"),
        );
        assert_eq!(ps, pl, "{kind:?}: weights differ");
        assert_eq!((sync.version(), lag.version()), (4, 4));
        // A NaN at the next batch: it and the two queued after it are skipped.
        let good = pl;
        lag.train_step_deferred(
            &dev,
            &batch.blocks,
            &bad,
            Target::Labels(&labels),
            4,
            LossSlot {
                out: &mut slots,
                slot: 0,
            },
        )
        .expect("nan step");
        for k in 5..7u64 {
            lag.train_step_deferred(
                &dev,
                &batch.blocks,
                &xd,
                Target::Labels(&labels),
                k,
                LossSlot {
                    out: &mut slots,
                    slot: 1,
                },
            )
            .expect("step after the nan");
        }
        let words = dev.to_host(&slots, 4).expect("slots");
        assert!(
            f64::from_bits(words[0]).is_nan(),
            "{kind:?}: the loss is not NaN"
        );
        assert!(f64::from_bits(words[2]).is_finite(), "{kind:?}");
        assert_eq!(
            lag.params_to_host(&dev).expect("params"),
            good,
            "{kind:?}: moved"
        );
        assert_eq!(lag.version(), 7);
        lag.rewind_skipped(&dev, 3).expect("rewind");
        assert_eq!(lag.version(), 4);
        // Training goes on from there exactly as the synchronous model does.
        lag.train_step_deferred(
            &dev,
            &batch.blocks,
            &xd,
            Target::Labels(&labels),
            9,
            LossSlot {
                out: &mut slots,
                slot: 3,
            },
        )
        .expect("step after the rewind");
        sync.train_step(&dev, &batch.blocks, &xd, Target::Labels(&labels), 9)
            .expect("step");
        assert_eq!(
            lag.params_to_host(&dev).expect("params"),
            sync.params_to_host(&dev).expect("params"),
            "{kind:?}: after the rewind"
        );
        assert_eq!(lag.version(), 5);
    }
}

/// The deferred step with historical rows (the layer path's) trains
/// exactly as `train_step_hot` with the same rows, in both backward modes, and
/// reads nothing.
#[test]
fn a_deferred_hot_step_equals_train_step_hot() {
    let g = random_graph(200, 1600, 8);
    let dev = HostBackend::new();
    let seeds: Vec<u32> = (0..40).collect();
    let graph = dev.load_graph(&g, Default::default()).expect("graph");
    let batch = dev.sample(&graph, &seeds, &[4, 4], 3).expect("sample");
    let n_in = dev.block_shape(&batch.blocks[0]).0;
    let n_mid = dev.block_shape(&batch.blocks[1]).0;
    let mut rng = Rng::new(5);
    let x: Vec<f32> = (0..n_in * 8).map(|_| rng.normal() as f32).collect();
    let xd = dev.to_device(&x).expect("x");
    let labels = dev
        .to_device(&seeds.iter().map(|&s| s % 3).collect::<Vec<u32>>())
        .expect("labels");
    // Every third of layer 1's sources past the seeds takes a historical row.
    let positions: Vec<u32> = (seeds.len() as u32..n_mid as u32).step_by(3).collect();
    let hidden = 16;
    let rows: Vec<f32> = (0..positions.len() * hidden)
        .map(|_| rng.normal().abs() as f32)
        .collect();
    let (pd, rd) = (
        dev.to_device(&positions).expect("positions"),
        dev.to_device(&rows).expect("rows"),
    );
    let cfg = ModelConfig {
        kind: ModelKind::Sage,
        in_dim: 8,
        hidden,
        num_classes: 3,
        num_layers: 2,
        heads: 1,
        dropout: 0.2,
    };
    for grad in [super::HotGrad::Constant, super::HotGrad::Aggregate] {
        let hot = super::HotRows {
            positions: &pd,
            rows: &rd,
            n: positions.len(),
            grad,
        };
        let mut sync = DeviceModel::new(&dev, &cfg, 1, AdamConfig::default()).expect("model");
        let mut lag = DeviceModel::new(&dev, &cfg, 1, AdamConfig::default()).expect("model");
        let mut slots = dev.alloc::<u64>(2 * 3).expect("slots");
        let before = dev.transfer_stats();
        for k in 0..3u64 {
            let step = super::DeferredStep {
                hot: Some(&hot),
                dest: LossSlot {
                    out: &mut slots,
                    slot: k as usize,
                },
            };
            lag.train_step_hot_deferred(&dev, &batch.blocks, &xd, Target::Labels(&labels), k, step)
                .expect("deferred hot step");
        }
        let syncs = dev.transfer_stats().since(&before).syncs;
        assert_eq!(syncs, 0, "{grad:?}: a deferred step synchronized");
        let words = dev.to_host(&slots, 6).expect("slots");
        for k in 0..3u64 {
            let s = sync
                .train_step_hot(
                    &dev,
                    &batch.blocks,
                    &xd,
                    Target::Labels(&labels),
                    k,
                    Some(&hot),
                )
                .expect("step");
            let sum = f64::from_bits(words[2 * k as usize]);
            assert_eq!(sum, s.loss * seeds.len() as f64, "{grad:?} batch {k}");
            assert_eq!(words[2 * k as usize + 1], s.correct as u64, "{grad:?}");
        }
        assert_eq!(
            sync.params_to_host(&dev).expect("params"),
            lag.params_to_host(&dev).expect("params"),
            "{grad:?}: weights differ"
        );
        assert_eq!((sync.version(), lag.version()), (3, 3));
    }
}

#[test]
fn a_split_step_equals_train_step_and_set_grads_replaces_the_gradients() {
    let g = random_graph(200, 1600, 5);
    let cfg = ModelConfig {
        kind: ModelKind::Sage,
        in_dim: 6,
        hidden: 8,
        num_classes: 3,
        num_layers: 2,
        heads: 1,
        dropout: 0.3,
    };
    let dev = HostBackend::new();
    let adam = AdamConfig::default();
    let mut whole = DeviceModel::new(&dev, &cfg, 4, adam).expect("device model");
    let mut split = DeviceModel::new(&dev, &cfg, 4, adam).expect("device model");
    let seeds: Vec<u32> = (0..50).collect();
    let graph = dev.load_graph(&g, Default::default()).expect("graph");
    let batch = dev.sample(&graph, &seeds, &[4, 4], 9).expect("sample");
    let n_in = dev.block_shape(&batch.blocks[0]).0;
    let mut rng = Rng::new(8);
    let x: Vec<f32> = (0..n_in * 6).map(|_| rng.normal() as f32).collect();
    let xd = dev.to_device(&x).expect("x");
    let labels = dev
        .to_device(&seeds.iter().map(|&s| s % 3).collect::<Vec<u32>>())
        .expect("labels");
    let a = whole
        .train_step(&dev, &batch.blocks, &xd, Target::Labels(&labels), 3)
        .expect("step");
    let b = split
        .forward_backward(&dev, &batch.blocks, &xd, Target::Labels(&labels), 3)
        .expect("forward and backward");
    assert_eq!(a, b);
    assert_eq!(split.version(), 0, "no step yet");
    // Gradients round-trip through the host unchanged (what a data-parallel
    // all-reduce of one rank does), then the step matches train_step's.
    let flat: Vec<f32> = split
        .grads_to_host(&dev)
        .expect("grads")
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(flat.len(), split.num_values());
    assert!(flat.iter().any(|&v| v != 0.0));
    split.set_grads(&dev, &flat).expect("set grads");
    split.step(&dev).expect("step");
    assert_eq!(
        split.params_to_host(&dev).expect("params"),
        whole.params_to_host(&dev).expect("params")
    );
    // Replaced gradients are what the step uses.
    let doubled: Vec<f32> = flat.iter().map(|v| 2.0 * v).collect();
    split.set_grads(&dev, &doubled).expect("set grads");
    let back: Vec<f32> = split
        .grads_to_host(&dev)
        .expect("grads")
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(back, doubled);
    let err = split.set_grads(&dev, &flat[1..]).unwrap_err().to_string();
    assert!(err.contains("flat gradient"), "{err}");

    // The device-resident data-parallel step's parts: weighting, counting
    // non-finite values, zeroing (NaN included) and a one-rank sum.
    let grads = |m: &DeviceModel<HostBackend>| -> Vec<f32> {
        m.grads_to_host(&dev)
            .unwrap()
            .into_iter()
            .flatten()
            .collect()
    };
    split.scale_grads(&dev, 0.25).unwrap();
    let quarter: Vec<f32> = doubled.iter().map(|v| v * 0.25).collect();
    assert_eq!(grads(&split), quarter);
    assert_eq!(split.nonfinite_grads(&dev).unwrap(), 0);
    let mut poisoned = flat.clone();
    poisoned[3] = f32::NAN;
    poisoned[flat.len() - 1] = f32::NEG_INFINITY;
    split.set_grads(&dev, &poisoned).unwrap();
    assert_eq!(split.nonfinite_grads(&dev).unwrap(), 2);
    split.scale_grads(&dev, 0.0).unwrap();
    assert!(grads(&split).iter().all(|&v| v == 0.0));
    struct Identity;
    impl crate::GradReduce<HostBackend> for Identity {
        fn describe(&self) -> String {
            "one rank".into()
        }
        fn all_reduce_sum(
            &self,
            dev: &HostBackend,
            bufs: &mut [crate::HostBuf<f32>],
            lens: &[usize],
        ) -> crate::Result<()> {
            crate::check_reduce_args(dev, bufs, lens)
        }
    }
    split.set_grads(&dev, &flat).unwrap();
    split.reduce_grads(&dev, &Identity).unwrap();
    assert_eq!(grads(&split), flat);
    // NCCL is the CUDA backend's: the host backend says so.
    let err = match dev.nccl_reduce(0, 1, &crate::NcclId([0; 128])) {
        Ok(_) => panic!("the host backend joined an NCCL communicator"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("host backend has none"), "{err}");
}

#[test]
fn mismatched_blocks_are_errors() {
    let cfg = ModelConfig {
        kind: ModelKind::Gcn,
        in_dim: 4,
        hidden: 8,
        num_classes: 2,
        num_layers: 2,
        heads: 1,
        dropout: 0.0,
    };
    let dev = HostBackend::new();
    let dm = DeviceModel::new(&dev, &cfg, 1, AdamConfig::default()).expect("model");
    let b = dev.block_from_host(3, &[0, 1, 2], &[2, 0]).expect("block");
    let x = dev.to_device(&[0f32; 12]).expect("x");
    // One block for a two-layer model.
    assert!(dm
        .forward(&dev, std::slice::from_ref(&b), &x, false, 0)
        .is_err());
    // Input too short for num_src × in_dim.
    let b2 = dev.block_from_host(2, &[0, 1], &[1]).expect("block");
    let short = dev.to_device(&[0f32; 5]).expect("x");
    assert!(dm.forward(&dev, &[b, b2], &short, false, 0).is_err());
}

/// A batch that steps train on, with and without hot rows: the blocks, the
/// input `x`, and the gradient `grad` of the `rows × classes` logits.
struct StepBatch<'a> {
    dev: &'a HostBackend,
    blocks: &'a [<HostBackend as crate::DeviceCore>::Block],
    x: &'a <HostBackend as crate::DeviceCore>::Buf<f32>,
    grad: &'a [f32],
    rows: usize,
    classes: usize,
}

impl StepBatch<'_> {
    /// Trains one step of `dm` with layer 0's outputs at `positions` replaced by
    /// `rows` (`hot`, `None`: plain); returns (logits, gradients).
    fn step(
        &self,
        dm: &mut DeviceModel<HostBackend>,
        hot: Option<(&[u32], &[f32])>,
        mode: super::HotGrad,
    ) -> (Vec<f32>, Vec<Vec<f32>>) {
        let dev = self.dev;
        let bufs = hot.map(|(p, r)| {
            (
                dev.to_device(p).expect("positions"),
                dev.to_device(r).expect("rows"),
                p.len(),
            )
        });
        let hr = bufs.as_ref().map(|(p, r, n)| super::HotRows {
            positions: p,
            rows: r,
            n: *n,
            grad: mode,
        });
        let fwd = dm
            .forward_hot(dev, self.blocks, self.x, true, 99, hr.as_ref())
            .expect("forward");
        let logits = dev
            .to_host(fwd.logits(), self.rows * self.classes)
            .expect("logits");
        let gd = dev.to_device(self.grad).expect("grad");
        dm.backward(dev, self.blocks, self.x, &fwd, &gd)
            .expect("backward");
        (logits, dm.grads_to_host(dev).expect("grads"))
    }
}

/// Historical embeddings equal to the fresh layer-0 outputs leave the logits
/// unchanged; layer 0's gradients then split by linearity: the gradient with hot
/// set `P` plus the gradient with its complement equals the plain gradient (each
/// counts only its cold rows), with every row hot it is zero, and layers above are
/// untouched. Perturbed hot rows change the logits (the rows are really used).
fn check_hot(kind: ModelKind, in_dim: usize, hidden: usize) {
    let g = random_graph(300, 2400, 9);
    let classes = 4;
    let cfg = ModelConfig {
        kind,
        in_dim,
        hidden,
        num_classes: classes,
        num_layers: 2,
        heads: 2,
        dropout: 0.5,
    };
    let dev = HostBackend::new();
    let mut dm = DeviceModel::new(&dev, &cfg, 13, AdamConfig::default()).expect("dm");
    let seeds: Vec<u32> = (0..30).map(|i| i * 9).collect();
    let sampler = NeighborSampler::new(vec![4, 4]).expect("sampler");
    let mut scratch = SamplerScratch::new(g.num_vertices());
    let batch = sampler.sample(&g, &seeds, 4, &mut scratch).expect("sample");
    let mut rng = Rng::new(6);
    let n_in = batch.input_ids().len();
    let x: Vec<f32> = (0..n_in * in_dim).map(|_| rng.normal() as f32).collect();
    let grad: Vec<f32> = (0..seeds.len() * classes)
        .map(|_| rng.normal() as f32 * 0.1)
        .collect();
    let blocks: Vec<_> = batch
        .blocks()
        .iter()
        .map(|b| {
            dev.block_from_host(b.num_src(), b.indptr(), b.indices())
                .expect("block")
        })
        .collect();
    let xd = dev.to_device(&x).expect("x");
    let nd0 = batch.blocks()[0].num_dst();
    let fresh = dm.forward_layer(&dev, 0, &blocks[0], &xd).expect("layer 0");
    let fresh = dev.to_host(&fresh, nd0 * hidden).expect("fresh");
    let rows_of = |pos: &[u32]| -> Vec<f32> {
        pos.iter()
            .flat_map(|&p| {
                fresh[p as usize * hidden..(p as usize + 1) * hidden]
                    .iter()
                    .copied()
            })
            .collect()
    };
    // Hot: every third destination (seeds included) — a mix of positions.
    let hot: Vec<u32> = (0..nd0 as u32).filter(|p| p % 3 == 1).collect();
    let cold: Vec<u32> = (0..nd0 as u32).filter(|p| p % 3 != 1).collect();
    let all: Vec<u32> = (0..nd0 as u32).collect();
    let batch = StepBatch {
        dev: &dev,
        blocks: &blocks,
        x: &xd,
        grad: &grad,
        rows: seeds.len(),
        classes,
    };
    let (l_plain, g_plain) = batch.step(&mut dm, None, super::HotGrad::Constant);
    let (hr, cr, ar) = (rows_of(&hot), rows_of(&cold), rows_of(&all));
    let (l_hot, g_hot) = batch.step(&mut dm, Some((&hot, &hr)), super::HotGrad::Constant);
    let (_, g_cold) = batch.step(&mut dm, Some((&cold, &cr)), super::HotGrad::Constant);
    let (_, g_all) = batch.step(&mut dm, Some((&all, &ar)), super::HotGrad::Constant);
    close("logits with fresh hot rows", &l_hot, &l_plain, 1e-5);
    let layer0 = dm.layer_params(0).expect("layer 0");
    for i in 0..g_plain.len() {
        let name = &dm.param_names()[i];
        if layer0.contains(&i) {
            let sum: Vec<f32> = g_hot[i]
                .iter()
                .zip(&g_cold[i])
                .map(|(a, b)| a + b)
                .collect();
            close(
                &format!("{name}: hot + complement"),
                &sum,
                &g_plain[i],
                1e-4,
            );
            assert!(g_all[i].iter().all(|&v| v.abs() < 1e-6), "{name}: all hot");
            let diff = g_hot[i]
                .iter()
                .zip(&g_plain[i])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff > 1e-6, "{name}: hot rows changed nothing");
        } else {
            close(
                &format!("{name}: above layer 0"),
                &g_hot[i],
                &g_plain[i],
                1e-5,
            );
        }
    }
    // Aggregate mode: fresh hot rows keep their gradient, which flows through the
    // accelerator's own layer 0, so every gradient is the plain one.
    let (_, g_agg) = batch.step(&mut dm, Some((&hot, &hr)), super::HotGrad::Aggregate);
    for (i, (a, b)) in g_agg.iter().zip(&g_plain).enumerate() {
        close(
            &format!("{}: aggregate mode", dm.param_names()[i]),
            a,
            b,
            1e-5,
        );
    }
    // Stale rows are really used.
    let stale: Vec<f32> = hr.iter().map(|v| v + 0.5).collect();
    let (l_stale, _) = batch.step(&mut dm, Some((&hot, &stale)), super::HotGrad::Constant);
    assert!(
        l_stale
            .iter()
            .zip(&l_plain)
            .any(|(a, b)| (a - b).abs() > 1e-4),
        "stale hot rows left the logits unchanged"
    );
}

#[test]
fn hot_rows_replace_layer0_outputs_and_get_no_gradient() {
    check_hot(ModelKind::Sage, 12, 16); // aggregate first
    check_hot(ModelKind::Sage, 40, 16); // project first
    check_hot(ModelKind::Gcn, 12, 16);
    check_hot(ModelKind::Gcn, 40, 16);
    check_hot(ModelKind::Gat, 12, 16);
}

#[test]
fn hot_rows_are_checked() {
    let cfg = ModelConfig {
        kind: ModelKind::Sage,
        in_dim: 4,
        hidden: 8,
        num_classes: 3,
        num_layers: 1,
        heads: 1,
        dropout: 0.0,
    };
    let dev = HostBackend::new();
    let dm = DeviceModel::new(&dev, &cfg, 1, AdamConfig::default()).expect("dm");
    let block = dev.block_from_host(2, &[0, 1, 2], &[1, 0]).expect("block");
    let x = dev.to_device(&[0f32; 8]).expect("x");
    let pos = dev.to_device(&[0u32]).expect("pos");
    let rows = dev.to_device(&[0f32; 3]).expect("rows");
    let hot = super::HotRows {
        positions: &pos,
        rows: &rows,
        n: 1,
        grad: super::HotGrad::Constant,
    };
    let e = dm
        .forward_hot(&dev, &[block], &x, false, 0, Some(&hot))
        .err()
        .expect("1-layer model refuses hot rows");
    assert!(e.to_string().contains("layers"), "{e}");
}
