//! The layer path's device half against the engine's memory estimate
//! (`engine/memory.rs` step 8).

use std::sync::Arc;

use cpu_ops::{ModelConfig, ModelKind};
use gpu_ops::{FeatureDtype, HostBackend};

use super::{LayerDevice, LayerEngine, LayerState};
use crate::data::generate::{generate_sbm, SbmOptions};
use crate::engine::memory::{batch_block_bytes, bottom_rows, layer_bytes, LayerShape};
use crate::engine::{DeviceEngine, EngineOptions};

/// `engine/memory.rs`'s estimate of step 8 is what the layer path allocates: both slabs (with
/// their bfloat16 mirrors) and the store exactly, the scratch at most, for
/// a queue below and at the super-batch bound, fp32 and bf16 rows.
#[test]
fn the_layer_estimate_is_what_the_engine_allocates() {
    let d = Arc::new(
        generate_sbm(&SbmOptions {
            num_vertices: 1000,
            num_edges: 4000,
            feature_dim: 10,
            ..SbmOptions::default()
        })
        .unwrap(),
    );
    let model = ModelConfig {
        kind: ModelKind::Sage,
        in_dim: 10,
        hidden: 8,
        num_classes: 4,
        num_layers: 2,
        heads: 1,
        dropout: 0.0,
    };
    for dtype in [FeatureDtype::F32, FeatureDtype::Bf16] {
        // 2 batches of 64 seeds, fanouts [5, 5]: b₀ = 64 · 6 = 384, so a
        // queue is at most 768 rows; hot sets below and above that.
        for hot in [300u64, 900] {
            let engine = DeviceEngine::new(
                HostBackend::new(),
                &d,
                &model,
                EngineOptions {
                    feature_dtype: dtype,
                    ..EngineOptions::for_tests(vec![5, 5])
                },
            )
            .unwrap();
            let mut e = LayerEngine::new(engine, LayerState::default());
            let shape = LayerShape {
                width: 8,
                super_batch: 2,
                bottom_rows: bottom_rows(1000, 64, &[5, 5]),
                bf16: dtype == FeatureDtype::Bf16,
                store: true,
                batch_blocks: batch_block_bytes(1000, 0, 64, &[5, 5]),
            };
            assert_eq!(shape.bottom_rows, 384);
            let est = layer_bytes(hot, &shape);
            // The largest queue, both slabs; the hottest row kept (the
            // store at its largest), then a whole queue carried back.
            let q = hot.min(768) as usize;
            e.hot_slab_reserve(0, q).unwrap();
            e.hot_slab_reserve(1, q).unwrap();
            e.hot_keep(0, &[0], &[hot as u32 - 1]).unwrap();
            let rows: Vec<u32> = (0..q as u32).collect();
            e.hot_keep(1, &rows, &rows).unwrap();
            e.hot_carry(0, &rows, &rows).unwrap();
            let (slabs, store, scratch) = e.hot_alloc_bytes();
            assert_eq!(slabs, est.slabs, "{dtype:?} hot {hot}: slabs");
            assert_eq!(store, est.store, "{dtype:?} hot {hot}: store");
            assert!(
                scratch <= est.scratch,
                "{dtype:?} hot {hot}: {scratch} > {}",
                est.scratch
            );
            assert_eq!(est.growth, (est.slabs / 2).max(est.store));
            assert_eq!(
                est.total(),
                est.slabs + est.store + est.scratch + est.growth
            );
        }
    }
}
