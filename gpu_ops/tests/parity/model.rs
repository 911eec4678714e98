//! The model written once over the op families: one training step of
//! [`DeviceModel`] on a backend against the same step on the host backend, for
//! every kind and both projection orders (CUDA: within fp32 reordering; the
//! host backend: bit for bit, two models being deterministic).

use cpu_ops::{AdamConfig, ModelConfig, ModelKind, NeighborSampler, Rng, SamplerScratch};
use gpu_ops::prelude::*;
use gpu_ops::{DeviceKind, DeviceModel, HostBackend};

use crate::helpers::{assert_close, bits, to64};
use crate::sampling::random_graph;

pub(crate) fn device_model_step_matches_the_host_backend<B: Backend>(d: &B) {
    let host = HostBackend::new();
    let mut rng = Rng::new(12);
    let g = random_graph(&mut rng, 401, 3001);
    let seeds: Vec<u32> = (0..47).map(|i| i * 7 + 3).collect();
    let sampler = NeighborSampler::new(vec![5, 4]).unwrap();
    let mut scratch = SamplerScratch::new(g.num_vertices());
    let batch = sampler.sample(&g, &seeds, 9, &mut scratch).unwrap();
    let classes = 5;
    let labels: Vec<u32> = seeds.iter().map(|&s| s % classes as u32).collect();
    for (kind, in_dim) in [
        (ModelKind::Sage, 11),
        (ModelKind::Sage, 37),
        (ModelKind::Gcn, 11),
        (ModelKind::Gcn, 37),
        (ModelKind::Gat, 19),
    ] {
        let cfg = ModelConfig {
            kind,
            in_dim,
            hidden: 16,
            num_classes: classes,
            num_layers: 2,
            heads: 2,
            // Dropout draws differ between backends (same distribution only).
            dropout: 0.0,
        };
        let n_in = batch.input_ids().len();
        let x: Vec<f32> = (0..n_in * in_dim).map(|_| rng.normal() as f32).collect();
        let adam = AdamConfig {
            lr: 0.01,
            ..AdamConfig::default()
        };
        let step = |m: &mut DeviceModel<B>| {
            let blocks: Vec<B::Block> = batch
                .blocks()
                .iter()
                .map(|b| {
                    d.block_from_host(b.num_src(), b.indptr(), b.indices())
                        .unwrap()
                })
                .collect();
            let xd = d.to_device(&x).unwrap();
            let ld = d.to_device(&labels).unwrap();
            let loss = m
                .train_step(d, &blocks, &xd, gpu_ops::Target::Labels(&ld), 1)
                .unwrap()
                .loss;
            let h0 = m.forward_layer(d, 0, &blocks[0], &xd).unwrap();
            let nd0 = batch.blocks()[0].num_dst();
            (loss, d.to_host(&h0, nd0 * 16).unwrap())
        };
        let mut dm = DeviceModel::new(d, &cfg, 4, adam).unwrap();
        let (loss, h0) = step(&mut dm);
        let mut hm = DeviceModel::new(&host, &cfg, 4, adam).unwrap();
        let blocks: Vec<_> = batch
            .blocks()
            .iter()
            .map(|b| {
                host.block_from_host(b.num_src(), b.indptr(), b.indices())
                    .unwrap()
            })
            .collect();
        let xh = host.to_device(&x).unwrap();
        let lh = host.to_device(&labels).unwrap();
        let want_loss = hm
            .train_step(&host, &blocks, &xh, gpu_ops::Target::Labels(&lh), 1)
            .unwrap()
            .loss;
        let want_h0 = hm.forward_layer(&host, 0, &blocks[0], &xh).unwrap();
        let want_h0 = host.to_host(&want_h0, h0.len()).unwrap();
        let what = format!("{kind:?} {in_dim}");
        let (grads, want_grads) = (
            dm.grads_to_host(d).unwrap(),
            hm.grads_to_host(&host).unwrap(),
        );
        let (params, want_params) = (
            dm.params_to_host(d).unwrap(),
            hm.params_to_host(&host).unwrap(),
        );
        if d.kind() == DeviceKind::Host {
            assert_eq!(loss.to_bits(), want_loss.to_bits(), "{what}: loss");
            assert_eq!(bits(&h0), bits(&want_h0), "{what}: layer 0");
            for (a, b) in grads.iter().zip(&want_grads) {
                assert_eq!(bits(a), bits(b), "{what}: gradients");
            }
            assert_eq!(params, want_params, "{what}: parameters");
            continue;
        }
        assert!(
            (loss - want_loss).abs() <= 1e-4 * want_loss.abs().max(1.0),
            "{what}: loss {loss} vs {want_loss}"
        );
        assert_close(&format!("{what}: layer 0"), &h0, &to64(&want_h0), 1e-4);
        for ((name, a), b) in hm.param_names().iter().zip(&grads).zip(&want_grads) {
            assert_close(&format!("{what}: grad {name}"), a, &to64(b), 1e-3);
        }
        for ((name, a), b) in hm.param_names().iter().zip(&params).zip(&want_params) {
            assert_close(&format!("{what}: param {name}"), a, &to64(b), 1e-4);
        }
    }
}
