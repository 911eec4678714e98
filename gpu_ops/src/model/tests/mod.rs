//! [`DeviceModel`] on the host backend against [`cpu_ops::Model`]: the same logits,
//! gradients and Adam updates for every kind, depth and projection order.
//!
//! Submodules: `init` (initialization and layout, also against the host model),
//! `sparse` (sparse input against dense input), `layer0` (layer 0 from host rows,
//! and the fused CPU SAGE kernel against the generic layer).

mod init;
mod layer0;
mod sparse;

use cpu_ops::{
    softmax_cross_entropy, Adam, AdamConfig, BlockView, BuildOptions, CsrGraph, MatMut, MatRef,
    Model, ModelConfig, ModelKind, NeighborSampler, Optimizer, Rng, SamplerScratch,
};

use super::DeviceModel;
use crate::prelude::*;
use crate::HostBackend;

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
            "{what}[{i}]: device {x} vs host {y} (scale {scale})"
        );
    }
}

/// One training step of both models on the same sampled batch; compares logits,
/// gradients and updated parameters.
fn check(kind: ModelKind, layers: usize, in_dim: usize, hidden: usize, dropout: f32) {
    let g = random_graph(300, 2400, 7);
    let classes = 5;
    let cfg = ModelConfig {
        kind,
        in_dim,
        hidden,
        num_classes: classes,
        num_layers: layers,
        heads: 2,
        dropout,
    };
    let mut host = Model::<f32>::new(&cfg, 11).expect("model");
    let adam = AdamConfig {
        lr: 0.01,
        weight_decay: 5e-4,
        ..AdamConfig::default()
    };
    let dev = HostBackend::new();
    let mut dm = DeviceModel::from_host(&dev, &host, adam).expect("device model");

    let seeds: Vec<u32> = (0..40).map(|i| i * 7).collect();
    let sampler = NeighborSampler::new(vec![4; layers]).expect("sampler");
    let mut scratch = SamplerScratch::new(g.num_vertices());
    let batch = sampler.sample(&g, &seeds, 3, &mut scratch).expect("sample");
    let mut rng = Rng::new(5);
    let n_in = batch.input_ids().len();
    let x: Vec<f32> = (0..n_in * in_dim).map(|_| rng.normal() as f32).collect();
    let labels: Vec<u32> = (0..seeds.len())
        .map(|_| rng.below(classes as u64) as u32)
        .collect();

    // Host reference.
    let views: Vec<BlockView<'_>> = batch
        .blocks()
        .iter()
        .map(|b| BlockView::new(b.num_src(), b.indptr(), b.indices()).expect("view"))
        .collect();
    let fwd = host.forward(&views, &x, true, 99).expect("host forward");
    let mut grad = vec![0f32; seeds.len() * classes];
    softmax_cross_entropy(
        MatRef::new(fwd.logits(), seeds.len(), classes).expect("logits"),
        &labels,
        Some(MatMut::new(&mut grad, seeds.len(), classes).expect("grad")),
    )
    .expect("loss");
    let grads = host.backward(&views, &fwd, &grad).expect("host backward");
    let mut opt = Adam::new(adam).expect("adam");
    let refs: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
    opt.step(&mut host.params_mut(), &refs).expect("step");

    // Device.
    let blocks: Vec<_> = batch
        .blocks()
        .iter()
        .map(|b| {
            dev.block_from_host(b.num_src(), b.indptr(), b.indices())
                .expect("block")
        })
        .collect();
    let xd = dev.to_device(&x).expect("x");
    let dfwd = dm
        .forward(&dev, &blocks, &xd, true, 99)
        .expect("device forward");
    let logits = dev
        .to_host(dfwd.logits(), seeds.len() * classes)
        .expect("logits");
    close("logits", &logits, fwd.logits(), 1e-4);
    let gd = dev.to_device(&grad).expect("grad");
    dm.backward(&dev, &blocks, &xd, &dfwd, &gd)
        .expect("device backward");
    let dgrads = dm.grads_to_host(&dev).expect("grads");
    for ((name, a), b) in host.param_names().iter().zip(&dgrads).zip(&grads) {
        close(&format!("grad {name}"), a, b, 1e-3);
    }
    dm.step(&dev).expect("device step");
    assert_eq!(dm.version(), 1);
    let params = dm.params_to_host(&dev).expect("params");
    for ((name, a), b) in host.param_names().iter().zip(&params).zip(host.params()) {
        close(&format!("param {name}"), a, b, 1e-4);
    }
}

#[test]
fn sage_matches_host_model() {
    check(ModelKind::Sage, 2, 12, 16, 0.0); // aggregate first in layer 0
    check(ModelKind::Sage, 3, 40, 16, 0.5); // project first, dropout
}

#[test]
fn gcn_matches_host_model() {
    check(ModelKind::Gcn, 2, 12, 16, 0.0);
    check(ModelKind::Gcn, 3, 40, 16, 0.5);
}

#[test]
fn gat_matches_host_model() {
    check(ModelKind::Gat, 2, 12, 16, 0.0);
    check(ModelKind::Gat, 3, 40, 16, 0.5);
    check(ModelKind::Gat, 1, 9, 8, 0.0);
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
    let host = Model::<f32>::new(&cfg, 1).expect("model");
    let dev = HostBackend::new();
    let mut dm = DeviceModel::from_host(
        &dev,
        &host,
        AdamConfig {
            lr: 0.01,
            ..AdamConfig::default()
        },
    )
    .expect("device model");
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
    let first = dm
        .train_step(&dev, &batch.blocks, &xd, &labels, 0)
        .expect("step")
        .loss;
    let mut last = first;
    for k in 1..30 {
        last = dm
            .train_step(&dev, &batch.blocks, &xd, &labels, k)
            .expect("step")
            .loss;
    }
    assert!(last < first * 0.7, "loss {first} -> {last}");
    assert_eq!(dm.version(), 30);
    // Every buffer of a step is an output its op overwrites: none is zeroed
    // (on CUDA a zeroed allocation is a memset).
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let cfg = ModelConfig {
            kind,
            heads: 2,
            dropout: 0.3,
            ..cfg
        };
        let host = Model::<f32>::new(&cfg, 1).expect("model");
        let mut dm = DeviceModel::from_host(&dev, &host, AdamConfig::default()).expect("model");
        let before = dev.transfer_stats();
        dm.train_step(&dev, &batch.blocks, &xd, &labels, 0)
            .expect("step");
        let fills = dev.transfer_stats().since(&before).zero_fills;
        assert_eq!(fills, 0, "{kind:?}: {fills} zeroed buffers in a train step");
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
    let host = Model::<f32>::new(&cfg, 4).expect("model");
    let dev = HostBackend::new();
    let adam = AdamConfig::default();
    let mut whole = DeviceModel::from_host(&dev, &host, adam).expect("device model");
    let mut split = DeviceModel::from_host(&dev, &host, adam).expect("device model");
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
        .train_step(&dev, &batch.blocks, &xd, &labels, 3)
        .expect("step");
    let b = split
        .forward_backward(&dev, &batch.blocks, &xd, &labels, 3)
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
    let host = Model::<f32>::new(&cfg, 1).expect("model");
    let dev = HostBackend::new();
    let dm = DeviceModel::from_host(&dev, &host, AdamConfig::default()).expect("model");
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

/// Trains one step with layer 0's outputs at `positions` replaced by `rows`
/// (`None`: plain); returns (logits, gradients).
#[allow(clippy::too_many_arguments)]
fn hot_step(
    dev: &HostBackend,
    dm: &mut DeviceModel<HostBackend>,
    blocks: &[<HostBackend as crate::DeviceCore>::Block],
    x: &<HostBackend as crate::DeviceCore>::Buf<f32>,
    grad: &[f32],
    rows: usize,
    classes: usize,
    hot: Option<(&[u32], &[f32])>,
    mode: super::HotGrad,
) -> (Vec<f32>, Vec<Vec<f32>>) {
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
        .forward_hot(dev, blocks, x, true, 99, hr.as_ref())
        .expect("forward");
    let logits = dev.to_host(fwd.logits(), rows * classes).expect("logits");
    let gd = dev.to_device(grad).expect("grad");
    dm.backward(dev, blocks, x, &fwd, &gd).expect("backward");
    (logits, dm.grads_to_host(dev).expect("grads"))
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
    let host = Model::<f32>::new(&cfg, 13).expect("model");
    let dev = HostBackend::new();
    let mut dm = DeviceModel::from_host(&dev, &host, AdamConfig::default()).expect("dm");
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
    let n = seeds.len();
    let (l_plain, g_plain) = hot_step(
        &dev,
        &mut dm,
        &blocks,
        &xd,
        &grad,
        n,
        classes,
        None,
        super::HotGrad::Constant,
    );
    let (hr, cr, ar) = (rows_of(&hot), rows_of(&cold), rows_of(&all));
    let (l_hot, g_hot) = hot_step(
        &dev,
        &mut dm,
        &blocks,
        &xd,
        &grad,
        n,
        classes,
        Some((&hot, &hr)),
        super::HotGrad::Constant,
    );
    let (_, g_cold) = hot_step(
        &dev,
        &mut dm,
        &blocks,
        &xd,
        &grad,
        n,
        classes,
        Some((&cold, &cr)),
        super::HotGrad::Constant,
    );
    let (_, g_all) = hot_step(
        &dev,
        &mut dm,
        &blocks,
        &xd,
        &grad,
        n,
        classes,
        Some((&all, &ar)),
        super::HotGrad::Constant,
    );
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
    let (_, g_agg) = hot_step(
        &dev,
        &mut dm,
        &blocks,
        &xd,
        &grad,
        n,
        classes,
        Some((&hot, &hr)),
        super::HotGrad::Aggregate,
    );
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
    let (l_stale, _) = hot_step(
        &dev,
        &mut dm,
        &blocks,
        &xd,
        &grad,
        n,
        classes,
        Some((&hot, &stale)),
        super::HotGrad::Constant,
    );
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
    let host = Model::<f32>::new(&cfg, 1).expect("model");
    let dev = HostBackend::new();
    let dm = DeviceModel::from_host(&dev, &host, AdamConfig::default()).expect("dm");
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
