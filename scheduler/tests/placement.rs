//! The five placements map one task graph to devices: every task gets a device,
//! dependencies stay satisfiable (a topological order exists, and a simulated run
//! honors every edge), the layer-based policy puts the hot bottom layer on the
//! CPU, and the step-based ones put sampling and gathering where their names say.

use scheduler::{
    simulate, BatchShape, CostModel, Device, GraphBuilder, HotSplit, ModelShape, Orchestration,
    PipelineConfig, SimConfig, Step, SuperBatchPlan, SyntheticWorkload, TaskGraph, TaskKind,
};

/// Three super-batches of three batches with a hot queue, under `orchestration`.
fn graph(orchestration: Orchestration) -> TaskGraph {
    let model = ModelShape::new(32, 16, 3, 4).unwrap();
    let pipeline = PipelineConfig::new(3, 1, 4).unwrap();
    let placement = orchestration.placement();
    let mut b = GraphBuilder::new(model, pipeline, placement.as_ref());
    let split = HotSplit::new(20, 12).unwrap();
    for j in 0..3u64 {
        let bottom: Vec<Vec<u32>> = (0..3u32)
            .map(|k| (0..10).map(|i| (i * 7 + k * 3 + j as u32) % 40).collect())
            .collect();
        let plan = SuperBatchPlan::new(j, 3 * j, split, &bottom);
        let shapes: Vec<BatchShape> = plan
            .batch_hot
            .iter()
            .map(|h| BatchShape {
                seeds: 4,
                upper_dst: 20,
                upper_edges: 60,
                hot: h.len() as u64,
                cold_dst: 10 - h.len() as u64,
                cold_edges: 40,
                cold_inputs: 30,
                cached_inputs: 5,
            })
            .collect();
        b.push_super_batch(&plan, &shapes).unwrap();
    }
    b.into_graph()
}

#[test]
fn every_placement_maps_the_same_graph_and_keeps_it_acyclic() {
    let reference = graph(Orchestration::Layer);
    for o in Orchestration::ALL {
        let g = graph(o);
        let p = o.placement();
        assert_eq!(g.len(), reference.len());
        for (t, r) in g.tasks().iter().zip(reference.tasks()) {
            // Same structure ...
            assert_eq!(
                (t.kind, t.batch, t.super_batch, t.chunk),
                (r.kind, r.batch, r.super_batch, r.chunk)
            );
            assert_eq!(t.deps, r.deps);
            assert_eq!(t.est, r.est);
            // ... and a device for every task, the policy's.
            assert_eq!(t.device, p.device(t.kind), "{o}: {}", t.kind);
        }
        // Every kind appears (the hot queue included).
        for k in TaskKind::ALL {
            assert!(g.tasks().iter().any(|t| t.kind == k), "{o}: no {k}");
        }
        let order = g.topological_order().unwrap();
        let mut pos = vec![0; g.len()];
        for (i, &id) in order.iter().enumerate() {
            pos[id] = i;
        }
        for t in g.tasks() {
            for &d in &t.deps {
                assert!(pos[d] < pos[t.id], "{o}: {} before its dependency", t.id);
            }
        }
    }
}

#[test]
fn layer_based_puts_the_hot_bottom_layer_on_the_cpu() {
    let g = graph(Orchestration::Layer);
    for t in g.tasks() {
        let on_cpu = t.kind == TaskKind::HotCompute;
        assert_eq!(t.device == Device::Cpu, on_cpu, "{}", t.kind);
    }
    assert!(g.tasks().iter().any(|t| t.kind == TaskKind::HotCompute));
}

#[test]
fn step_based_placements_put_sampling_and_gathering_where_their_names_say() {
    for (o, sample, gather) in [
        (Orchestration::CpuSampleCpuGather, Device::Cpu, Device::Cpu),
        (
            Orchestration::GpuSampleCpuGather,
            Device::Accelerator,
            Device::Cpu,
        ),
        (
            Orchestration::CpuSampleGpuGather,
            Device::Cpu,
            Device::Accelerator,
        ),
        (
            Orchestration::GpuSampleGpuGather,
            Device::Accelerator,
            Device::Accelerator,
        ),
    ] {
        assert!(!o.placement().reuses_embeddings());
        for t in graph(o).tasks() {
            let want = match t.kind.step() {
                Step::Sample => sample,
                Step::Gather => gather,
                Step::Train => Device::Accelerator,
            };
            assert_eq!(t.device, want, "{o}: {}", t.kind);
        }
    }
}

#[test]
fn every_placement_runs_to_completion_honoring_every_edge() {
    let model = ModelShape::new(128, 64, 3, 10).unwrap();
    let work = SyntheticWorkload::small(60, 4).generate().unwrap();
    for o in Orchestration::ALL {
        let mut cfg = SimConfig::layer(model).unwrap();
        cfg.orchestration = o;
        cfg.record_trace = true;
        let r = simulate(&cfg, &work, CostModel::reference()).unwrap();
        let mut end = vec![f64::NAN; r.trace.len() * 2];
        for s in &r.trace {
            if s.id >= end.len() {
                end.resize(s.id + 1, f64::NAN);
            }
            end[s.id] = s.end_s;
        }
        for s in &r.trace {
            for &d in &s.deps {
                assert!(
                    end[d] <= s.start_s,
                    "{o}: task {} started before {d} ended",
                    s.id
                );
            }
        }
        let hot_tasks = r.trace.iter().filter(|s| s.kind.is_hot_chunk()).count();
        if o.placement().reuses_embeddings() {
            assert!(hot_tasks > 0 && r.totals.hot_uses > 0);
        } else {
            assert_eq!(hot_tasks, 0, "{o} computed hot embeddings");
            assert_eq!(r.totals.hot_uses, 0);
        }
        // Where sampling ran shows in the busy time.
        let cpu_sample = r
            .trace
            .iter()
            .any(|s| s.kind == TaskKind::SampleTop && s.device == Device::Cpu);
        assert_eq!(
            cpu_sample,
            o.placement().device(TaskKind::SampleTop) == Device::Cpu
        );
        assert_eq!(r.batches.len(), 60);
        assert!(r.totals.epoch_s > 0.0 && r.totals.acc_busy_fraction <= 1.0 + 1e-9);
    }
}
