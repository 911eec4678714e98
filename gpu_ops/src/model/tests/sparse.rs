//! Sparse layer-0 input: the same logits, gradients and updated weights as the
//! dense rows it holds (within fp32 rounding: the sparse products skip the
//! zeros and add in another order), for every kind and projection order; batch
//! rows gathered by device ids; full-graph inference of layer 0.

use std::sync::Arc;

use cpu_ops::{
    AdamConfig, BlockView, FeatureMatrix, HostArray, ModelConfig, ModelInput, ModelKind, Rng,
    SparseRows,
};

use super::{close, random_graph};
use crate::model::{layer0_rows, DeviceModel, LayerInput, Target};
use crate::prelude::*;
use crate::{FeatureDtype, HostBackend};

/// `n × dim` features with about `density` of the values non-zero (some rows
/// are empty, a case too).
fn sparse_features(n: usize, dim: usize, density: f64, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n * dim)
        .map(|_| {
            if rng.next_f64() < density {
                rng.normal() as f32
            } else {
                0.0
            }
        })
        .collect()
}

fn config(kind: ModelKind, in_dim: usize, hidden: usize) -> ModelConfig {
    ModelConfig {
        kind,
        in_dim,
        hidden,
        num_classes: 5,
        num_layers: 2,
        heads: 2,
        dropout: 0.3,
    }
}

/// Trains two models from the same initialization on the same sampled batch,
/// one reading dense rows gathered through the feature store, the other sparse
/// rows gathered by the same device ids; compares the batch rows, the loss, the
/// logits, every gradient and the weights after the step.
fn check(kind: ModelKind, in_dim: usize, hidden: usize) {
    let n = 257;
    let g = random_graph(n, 1900, 21);
    let values = sparse_features(n, in_dim, 0.07, in_dim as u64);
    let features =
        FeatureMatrix::new(HostArray::from_vec(values.clone()), n, in_dim).expect("features");
    let rows = SparseRows::from_dense(&values, n, in_dim).expect("sparse rows");
    let dev = HostBackend::new();
    let cfg = config(kind, in_dim, hidden);
    let adam = AdamConfig {
        lr: 0.01,
        weight_decay: 5e-4,
        ..AdamConfig::default()
    };
    let mut dense = DeviceModel::new(&dev, &cfg, 3, adam).expect("model");
    let mut sparse = DeviceModel::new(&dev, &cfg, 3, adam).expect("model");

    let graph = dev.load_graph(&g, Default::default()).expect("graph");
    let seeds: Vec<u32> = (0..37).map(|i| i * 7).collect();
    let batch = dev.sample(&graph, &seeds, &[4, 3], 5).expect("sample");
    let n_in = dev.block_shape(&batch.blocks[0]).0;
    let store = dev
        .load_features(&features, &[], 0, FeatureDtype::F32)
        .expect("store");
    let mut x = dev.alloc_uninit(n_in * in_dim).expect("x");
    dev.gather(&store, &batch.src_ids[0], n_in, &mut x)
        .expect("dense gather");
    let all = dev.sparse_from_host(Arc::new(rows)).expect("sparse");
    let xs = dev
        .sparse_gather(&all, &batch.src_ids[0], n_in)
        .expect("sparse gather");
    assert_eq!(
        xs.rows().to_dense(),
        dev.to_host(&x, n_in * in_dim).expect("x"),
        "gathered rows"
    );

    let labels = dev
        .to_device(&seeds.iter().map(|&s| s % 5).collect::<Vec<u32>>())
        .expect("labels");
    let fd = dense
        .forward(&dev, &batch.blocks, &x, true, 9)
        .expect("dense forward");
    let fs = sparse
        .forward(&dev, &batch.blocks, LayerInput::Sparse(&xs), true, 9)
        .expect("sparse forward");
    let rows_out = seeds.len() * 5;
    close(
        &format!("{kind:?} logits"),
        &dev.to_host(fs.logits(), rows_out).expect("logits"),
        &dev.to_host(fd.logits(), rows_out).expect("logits"),
        1e-5,
    );
    let a = dense
        .train_step(&dev, &batch.blocks, &x, Target::Labels(&labels), 9)
        .expect("dense step");
    let b = sparse
        .train_step(
            &dev,
            &batch.blocks,
            LayerInput::Sparse(&xs),
            Target::Labels(&labels),
            9,
        )
        .expect("sparse step");
    assert!(
        (a.loss - b.loss).abs() <= 1e-6 * a.loss.abs().max(1.0),
        "{a:?} {b:?}"
    );
    let names = dense.param_names().to_vec();
    let (gd, gs) = (
        dense.grads_to_host(&dev).expect("grads"),
        sparse.grads_to_host(&dev).expect("grads"),
    );
    for ((name, d), s) in names.iter().zip(&gd).zip(&gs) {
        close(&format!("{kind:?} grad {name}"), s, d, 1e-4);
    }
    assert!(gd[0].iter().any(|&v| v != 0.0), "layer 0 trains");
    let (pd, ps) = (
        dense.params_to_host(&dev).expect("params"),
        sparse.params_to_host(&dev).expect("params"),
    );
    for ((name, d), s) in names.iter().zip(&pd).zip(&ps) {
        close(&format!("{kind:?} param {name}"), s, d, 1e-5);
    }

    // Full-graph inference of layer 0 reads the sparse matrix whole.
    let full = dev
        .block_from_host(n, g.offsets().as_slice(), g.indices().as_slice())
        .expect("full block");
    let xd = dev.to_device(&values).expect("all rows");
    let hd = dense.forward_layer(&dev, 0, &full, &xd).expect("dense");
    let hs = dense
        .forward_layer(&dev, 0, &full, LayerInput::Sparse(&all))
        .expect("sparse");
    close(
        &format!("{kind:?} full-graph layer 0"),
        &dev.to_host(&hs, n * hidden).expect("h"),
        &dev.to_host(&hd, n * hidden).expect("h"),
        1e-5,
    );

    // Layer 0 from host rows, dense or sparse, with the model's own weights.
    let b0 = dev.block_to_host(&batch.blocks[0]).expect("block 0");
    let view = BlockView::new(n_in, &b0.0, &b0.1).expect("view");
    let tensors: Vec<Vec<f32>> = pd[dense.layer_params(0).expect("range")].to_vec();
    let host_x = dev.to_host(&x, n_in * in_dim).expect("x");
    let from_dense =
        layer0_rows(&dev, &cfg, &tensors, &view, ModelInput::Dense(&host_x)).expect("dense rows");
    let from_sparse = layer0_rows(&dev, &cfg, &tensors, &view, ModelInput::Sparse(xs.rows()))
        .expect("sparse rows");
    close(
        &format!("{kind:?} layer0_rows"),
        &from_sparse,
        &from_dense,
        1e-5,
    );
}

#[test]
fn sparse_input_trains_as_the_dense_rows_it_holds() {
    check(ModelKind::Sage, 11, 16); // dense aggregates first, sparse projects first
    check(ModelKind::Sage, 41, 16); // both project first
    check(ModelKind::Gcn, 11, 16);
    check(ModelKind::Gcn, 41, 16);
    check(ModelKind::Gat, 23, 16);
}

#[test]
fn sparse_input_of_the_wrong_shape_is_an_error() {
    let dev = HostBackend::new();
    let cfg = config(ModelKind::Sage, 6, 8);
    let dm = DeviceModel::new(&dev, &cfg, 1, AdamConfig::default()).expect("model");
    let block = dev.block_from_host(3, &[0, 1, 2], &[2, 0]).expect("block");
    let wide = SparseRows::from_dense(&[1.0; 21], 3, 7).expect("rows");
    let wide = dev.sparse_from_host(Arc::new(wide)).expect("sparse");
    let e = dm
        .forward_layer(&dev, 0, &block, LayerInput::Sparse(&wide))
        .unwrap_err()
        .to_string();
    assert!(e.contains("sparse input columns"), "{e}");
    let few = SparseRows::from_dense(&[1.0; 12], 2, 6).expect("rows");
    let few = dev.sparse_from_host(Arc::new(few)).expect("sparse");
    let e = dm
        .forward_layer(&dev, 0, &block, LayerInput::Sparse(&few))
        .unwrap_err()
        .to_string();
    assert!(e.contains("sparse input rows"), "{e}");
}
