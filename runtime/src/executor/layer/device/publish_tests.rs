//! The asynchronous publication of layer 0 (`engine/pinned.rs`) on the host
//! backend: what a resolved publication holds (the parameters at its version,
//! whatever happened to them after the call), what it costs the issuing thread
//! (downloads, no synchronization), and the pool's reuse rule.

use std::sync::Arc;

use cpu_ops::{ModelConfig, ModelKind};
use gpu_ops::HostBackend;
use scheduler::{Device, StepBased};

use super::{LayerDevice, LayerEngine, LayerState};
use crate::data::generate::{generate_sbm, SbmOptions};
use crate::engine::{DeviceEngine, EngineOptions, ModelState};
use crate::executor::step::device::{train_sampled, HostSampler};
use crate::executor::BatchRef;

fn engine() -> LayerEngine<HostBackend> {
    let ds = Arc::new(
        generate_sbm(&SbmOptions {
            num_vertices: 600,
            num_edges: 3000,
            num_classes: 3,
            feature_dim: 12,
            ..SbmOptions::default()
        })
        .unwrap(),
    );
    let model = ModelConfig {
        kind: ModelKind::Sage,
        in_dim: 12,
        hidden: 8,
        num_classes: 3,
        num_layers: 2,
        heads: 1,
        dropout: 0.0,
    };
    let fanouts = vec![4, 4];
    let engine = DeviceEngine::new(
        HostBackend::new(),
        &ds,
        &model,
        EngineOptions::for_tests(fanouts),
    )
    .unwrap();
    LayerEngine::new(engine, LayerState::default())
}

/// One optimizer step on a batch (device sampling and gather): layer 0's
/// parameters change in place.
fn step(e: &mut LayerEngine<HostBackend>, k: u64) {
    let e = &mut e.engine;
    let p = StepBased::new(Device::Accelerator, Device::Accelerator);
    let seeds: Vec<u32> = (0..32).map(|i| (i * 7 + k as u32 * 3) % 600).collect();
    let s = HostSampler::default()
        .sample_placed(e, p, &seeds, k, &[])
        .unwrap();
    let before = ModelState::transfer_stats(e);
    let batch = BatchRef::for_seeds(&seeds, k);
    train_sampled(e, p, s, batch, true, None, before).unwrap();
}

fn bits(t: &[Vec<f32>]) -> Vec<Vec<u32>> {
    t.iter()
        .map(|v| v.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn a_resolved_publication_holds_its_version_even_after_the_weights_moved_on() {
    let mut e = engine();
    step(&mut e, 0);
    let want = e.layer0_params().unwrap();
    let version = LayerDevice::version(&e);
    let before = LayerDevice::transfer_stats(&e);
    let pending = e.publish_layer0().unwrap();
    // The issuing thread: one download per tensor (SAGE's layer 0 has three),
    // no synchronization, no wait.
    let issued = LayerDevice::transfer_stats(&e).since(&before);
    assert_eq!(
        (issued.downloads, issued.syncs, issued.event_waits),
        (3, 0, 0),
        "{issued:?}"
    );
    let floats: usize = want.iter().map(Vec::len).sum();
    assert_eq!(issued.download_bytes, 4 * floats as u64);
    // The parameters change after the call (two optimizer steps, in place).
    step(&mut e, 1);
    step(&mut e, 2);
    assert_eq!(LayerDevice::version(&e), version + 2);
    assert_ne!(bits(&e.layer0_params().unwrap()), bits(&want));
    // Resolved on another thread: the weights at the publication's version.
    let got = std::thread::spawn(move || pending.resolve())
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(bits(&got), bits(&want));
    // The resolution waited for an event, not for the stream.
    let after = LayerDevice::transfer_stats(&e);
    let resolved = after.since(&before);
    assert_eq!(resolved.event_waits, 1, "{resolved:?}");
}

#[test]
fn a_pinned_set_is_reused_after_its_resolution_never_before() {
    let mut e = engine();
    let v0 = e.layer0_params().unwrap();
    let p0 = e.publish_layer0().unwrap();
    assert_eq!(e.publish_sets_made(), 1);
    step(&mut e, 0);
    let v1 = e.layer0_params().unwrap();
    // p0 is not resolved: p1 gets a set of its own.
    let p1 = e.publish_layer0().unwrap();
    assert_eq!(e.publish_sets_made(), 2);
    assert!(e.publish_pool_addresses(0).is_empty());
    assert_eq!(bits(&p0.resolve().unwrap()), bits(&v0));
    // p0's set is back; the next publication takes it, and p1's stays with p1.
    let freed = e.publish_pool_addresses(0);
    assert_eq!(freed.len(), 1);
    step(&mut e, 1);
    let v2 = e.layer0_params().unwrap();
    let p2 = e.publish_layer0().unwrap();
    assert_eq!(e.publish_sets_made(), 2, "a free set was not reused");
    assert!(e.publish_pool_addresses(0).is_empty());
    // p2 wrote p0's buffers, not p1's: p1 still reads its own version.
    assert_eq!(bits(&p1.resolve().unwrap()), bits(&v1));
    assert_eq!(bits(&p2.resolve().unwrap()), bits(&v2));
    let mut pool = e.publish_pool_addresses(0);
    pool.sort_unstable();
    assert_eq!(pool.len(), 2);
    assert!(pool.contains(&freed[0]));
    // A publication dropped unresolved (a newer one replaced it) gives its set
    // back too, and steady publication allocates nothing more.
    for k in 2..6 {
        step(&mut e, k);
        drop(e.publish_layer0().unwrap());
        let want = e.layer0_params().unwrap();
        assert_eq!(
            bits(&e.publish_layer0().unwrap().resolve().unwrap()),
            bits(&want)
        );
    }
    assert_eq!(e.publish_sets_made(), 2);
    let mut again = e.publish_pool_addresses(0);
    again.sort_unstable();
    assert_eq!(again, pool);
}
