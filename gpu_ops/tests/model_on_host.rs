//! [`gpu_ops::DeviceModel`] on the host backend against [`cpu_ops::Model`]: the same
//! initial parameters, batch, dropout seed and Adam settings must give the same
//! logits, loss, gradients and updated parameters (to f32 rounding: the device model
//! composes the ops in its own order).

use cpu_ops::{
    AdamConfig, BlockView, BuildOptions, CsrGraph, FeatureMatrix, MatMut, MatRef, Model,
    ModelConfig, ModelKind, NeighborSampler, Optimizer, Rng, SamplerScratch,
};
use gpu_ops::{Backend, DeviceModel, HostBackend};

fn rand_f32(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.next_f32() * 2.0 - 1.0).collect()
}

#[track_caller]
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}[{k}]: got {g}, want {w} (scale {scale})"
        );
    }
}

fn run(kind: ModelKind) {
    let mut rng = Rng::new(21);
    let n = 600;
    let edges: Vec<(u32, u32)> = (0..4000)
        .map(|_| (rng.below(n as u64) as u32, rng.below(n as u64) as u32))
        .collect();
    let g = CsrGraph::from_edges(n, &edges, BuildOptions::UNDIRECTED).unwrap();
    let (in_dim, classes) = (13, 5);
    let feats = FeatureMatrix::new(rand_f32(&mut rng, n * in_dim).into(), n, in_dim).unwrap();
    let cfg = ModelConfig {
        kind,
        in_dim,
        hidden: 12,
        num_classes: classes,
        num_layers: 3,
        heads: 3,
        dropout: 0.3,
    };
    let mut host = Model::<f32>::new(&cfg, 5).unwrap();
    let adam = AdamConfig {
        lr: f64::from(1e-2f32),
        weight_decay: f64::from(5e-4f32),
        ..AdamConfig::default()
    };
    let mut opt = cpu_ops::Adam::<f32>::new(adam).unwrap();
    let d = HostBackend::new();
    let mut dm = DeviceModel::from_host(&d, &host, adam).unwrap();
    let sampler = NeighborSampler::new(vec![5, 4, 3]).unwrap();
    let mut scratch = SamplerScratch::new(n);
    for step in 0..3u64 {
        let seeds: Vec<u32> = (step as u32 * 40..step as u32 * 40 + 37).collect();
        let labels: Vec<u32> = seeds.iter().map(|&s| s % classes as u32).collect();
        let batch = sampler
            .sample(&g, &seeds, 100 + step, &mut scratch)
            .unwrap();
        let views: Vec<BlockView<'_>> = batch
            .blocks()
            .iter()
            .map(|b| BlockView::new(b.num_src(), b.indptr(), b.indices()).unwrap())
            .collect();
        let x = cpu_ops::gather_rows_into_vec(&feats, batch.input_ids()).unwrap();
        // Host reference.
        let fwd = host.forward(&views, &x, true, 7 + step).unwrap();
        let rows = seeds.len();
        let mut gl = vec![0.0f32; rows * classes];
        let ce = cpu_ops::softmax_cross_entropy(
            MatRef::new(fwd.logits(), rows, classes).unwrap(),
            &labels,
            Some(MatMut::new(&mut gl, rows, classes).unwrap()),
        )
        .unwrap();
        let grads = host.backward(&views, &fwd, &gl).unwrap();
        // Device model on the host backend.
        let blocks: Vec<_> = batch
            .blocks()
            .iter()
            .map(|b| {
                d.block_from_host(b.num_src(), b.indptr(), b.indices())
                    .unwrap()
            })
            .collect();
        let dx = d.to_device(&x).unwrap();
        let dfwd = dm.forward(&d, &blocks, &dx, true, 7 + step).unwrap();
        let what = format!("{kind:?} step {step}");
        assert_close(
            &format!("logits {what}"),
            &d.to_host(dfwd.logits(), rows * classes).unwrap(),
            fwd.logits(),
            1e-4,
        );
        let dl = d.to_device(&labels).unwrap();
        let mut dgl = d.alloc(rows * classes).unwrap();
        let stats = d
            .softmax_cross_entropy(dfwd.logits(), rows, classes, &dl, Some(&mut dgl))
            .unwrap();
        assert!(
            (stats.loss - ce.loss).abs() < 1e-5 * ce.loss.max(1.0),
            "{what}: loss"
        );
        dm.backward(&d, &blocks, &dx, &dfwd, &dgl).unwrap();
        let dgrads = dm.grads_to_host(&d).unwrap();
        let names = host.param_names();
        for ((name, got), want) in names.iter().zip(&dgrads).zip(&grads) {
            assert_close(&format!("grad {name} {what}"), got, want, 1e-3);
        }
        // One Adam step each.
        let grefs: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
        opt.step(&mut host.params_mut(), &grefs).unwrap();
        dm.step(&d).unwrap();
        for ((name, got), want) in names
            .iter()
            .zip(dm.params_to_host(&d).unwrap())
            .zip(host.params())
        {
            assert_close(&format!("param {name} {what}"), &got, want, 1e-3);
        }
    }
}

#[test]
fn gcn_matches_the_host_model() {
    run(ModelKind::Gcn);
}

#[test]
fn sage_matches_the_host_model() {
    run(ModelKind::Sage);
}

#[test]
fn gat_matches_the_host_model() {
    run(ModelKind::Gat);
}
