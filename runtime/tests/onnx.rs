//! ONNX export served through ONNX Runtime: for GCN, SAGE and GAT with 1–3 layers,
//! the exported graph run by `ort` equals Tandem's own forward pass (no dropout)
//! on sampled blocks (random small graphs, `NeighborSampler`) and on the whole
//! graph, for logits and embeddings; on repeated edges in any order and on blocks
//! without edges; and a trained `Trainer`'s export (library and
//! `tandem export-model`) equals `Trainer::full_graph_logits` / `embedding_table`.
//!
//! The library comes from `TANDEM_ORT_LIB` (the path of `libonnxruntime.so`, ONNX
//! Runtime ≥ 1.30; `.ci/onnxruntime` fetches PyPI's). These tests skip with a
//! printed reason when it cannot be loaded (unset, missing, or a build without the
//! `onnx-runtime` feature) and fail instead when `TANDEM_REQUIRE_ORT=1`.

use std::path::PathBuf;
use std::process::Command;

use cpu_ops::{
    AdamConfig, BlockView, BuildOptions, CsrGraph, ModelConfig, ModelKind, NeighborSampler, Rng,
    SamplerScratch,
};
use gpu_ops::prelude::*;
use gpu_ops::{DeviceModel, HostBackend, ModelLayout};
use runtime::onnx::{
    export, load_onnx_runtime, ExportOptions, OnnxBlock, OnnxOutput, OrtModel, ORT_LIB_ENV,
};
use runtime::TrainerBuilder;

/// Relative tolerance: `max |ort − tandem| / max |tandem|` over an output.
const TOL: f64 = 1e-4;

/// The ONNX Runtime library to test with, or `None` (after printing why) when the
/// tests should skip; panics instead when `TANDEM_REQUIRE_ORT=1`.
fn ort_library(test: &str) -> Option<PathBuf> {
    let required = std::env::var("TANDEM_REQUIRE_ORT").as_deref() == Ok("1");
    let why = match std::env::var_os(ORT_LIB_ENV) {
        None => format!("{ORT_LIB_ENV} is not set (bash .ci/onnxruntime prints a path)"),
        Some(p) => {
            let p = PathBuf::from(p);
            match load_onnx_runtime(&p) {
                Ok(version) => {
                    eprintln!("{test}: ONNX Runtime {version} from {}", p.display());
                    return Some(p);
                }
                Err(e) => e.to_string(),
            }
        }
    };
    assert!(!required, "TANDEM_REQUIRE_ORT=1 but {why}");
    eprintln!("skip {test}: {why}");
    None
}

/// `max |got − want| / max(max |want|, 1e-6)`, after checking the lengths.
fn rel_err(got: &[f32], want: &[f32], what: &str) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-6f64, |m, &v| m.max(f64::from(v).abs()));
    let diff = got.iter().zip(want).fold(0.0f64, |m, (&a, &b)| {
        m.max((f64::from(a) - f64::from(b)).abs())
    });
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{what}: non-finite output from ONNX Runtime"
    );
    diff / scale
}

fn assert_close(got: &[f32], want: &[f32], what: &str) -> f64 {
    let e = rel_err(got, want, what);
    assert!(e <= TOL, "{what}: relative error {e:.3e} > {TOL:e}");
    e
}

/// A random directed graph with `n` vertices, some of them isolated (no in- or
/// out-edges), random degrees, and repeated vertex reads.
fn random_graph(rng: &mut Rng, n: usize) -> CsrGraph {
    let isolated = |v: u32| v % 7 == 3;
    let mut edges = Vec::new();
    for d in 0..n as u32 {
        if isolated(d) {
            continue;
        }
        for _ in 0..rng.below(9) {
            let s = rng.below(n as u64) as u32;
            if !isolated(s) {
                edges.push((s, d));
            }
        }
    }
    CsrGraph::from_edges(n, &edges, BuildOptions::DIRECTED).expect("graph")
}

fn random_values(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.next_f32() * 2.0 - 1.0) * scale)
        .collect()
}

/// A model: its configuration and parameter tensors.
struct Model {
    cfg: ModelConfig,
    params: Vec<Vec<f32>>,
}

impl Model {
    fn params(&self) -> Vec<&[f32]> {
        self.params.iter().map(Vec::as_slice).collect()
    }

    fn export(&self, opts: &ExportOptions) -> Vec<u8> {
        export(&self.cfg, &self.params(), opts).expect("export")
    }
}

/// A model with random parameters everywhere (biases too: they start at zero).
fn random_model(rng: &mut Rng, cfg: &ModelConfig) -> Model {
    let layout = ModelLayout::new(cfg).expect("layout");
    let params = layout
        .params()
        .iter()
        .map(|p| random_values(rng, p.len, 0.6))
        .collect();
    Model {
        cfg: cfg.clone(),
        params,
    }
}

fn configs() -> Vec<ModelConfig> {
    let mut out = Vec::new();
    for kind in [ModelKind::Gcn, ModelKind::Sage, ModelKind::Gat] {
        for layers in 1..=3 {
            // in_dim above and below the hidden width: both orders of projection
            // and aggregation that the layers pick.
            for (in_dim, hidden) in [(9, 6), (4, 8)] {
                out.push(ModelConfig {
                    kind,
                    in_dim,
                    hidden,
                    num_classes: 5,
                    num_layers: layers,
                    heads: 2,
                    dropout: 0.3,
                });
            }
        }
    }
    out
}

struct Case {
    graph: CsrGraph,
    features: Vec<f32>,
}

impl Case {
    fn new(rng: &mut Rng, n: usize, dim: usize) -> Self {
        let graph = random_graph(rng, n);
        let features = random_values(rng, n * dim, 1.0);
        Self { graph, features }
    }
}

/// Tandem's forward pass without dropout, on the host backend: the logits
/// ([`DeviceModel::forward`]) and the hidden layer below the classifier (the
/// layers below the top one by one, [`DeviceModel::forward_layer`], as
/// full-graph inference runs them).
fn tandem_forward(m: &Model, blocks: &[BlockView<'_>], x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let dev = HostBackend::new();
    let dm =
        DeviceModel::from_params(&dev, &m.cfg, &m.params(), AdamConfig::default()).expect("model");
    let bufs: Vec<_> = blocks
        .iter()
        .map(|b| {
            dev.block_from_host(b.num_src(), b.indptr(), b.indices())
                .expect("block")
        })
        .collect();
    let xd = dev.to_device(x).expect("x");
    let fwd = dm.forward(&dev, &bufs, &xd, false, 0).expect("forward");
    let logits = dev.to_host(fwd.logits(), fwd.rows() * m.cfg.num_classes);
    let layers = m.cfg.num_layers;
    let mut hidden = Vec::new();
    if layers >= 2 {
        let mut h = xd;
        for (l, b) in bufs[..layers - 1].iter().enumerate() {
            h = dm.forward_layer(&dev, l, b, &h).expect("layer");
        }
        let rows = blocks[layers - 2].num_dst() * m.cfg.hidden;
        hidden = dev.to_host(&h, rows).expect("hidden");
    }
    (logits.expect("logits"), hidden)
}

#[test]
fn exported_models_match_tandem_on_sampled_blocks_and_the_full_graph() {
    let Some(lib) = ort_library("onnx parity") else {
        return;
    };
    let mut rng = Rng::new(2024);
    let mut worst = 0.0f64;
    for (c, cfg) in configs().into_iter().enumerate() {
        let what = format!(
            "{:?}, {} layers, in_dim {}",
            cfg.kind, cfg.num_layers, cfg.in_dim
        );
        let case = Case::new(&mut rng, 60 + 13 * c, cfg.in_dim);
        let n = case.graph.num_vertices();
        let m = random_model(&mut rng, &cfg);
        let mut logits =
            OrtModel::from_bytes(&lib, &m.export(&ExportOptions::default())).expect("session");
        let mut embeddings = (cfg.num_layers >= 2).then(|| {
            let opts = ExportOptions {
                output: OnnxOutput::Embeddings,
                ..ExportOptions::default()
            };
            OrtModel::from_bytes(&lib, &m.export(&opts)).expect("session")
        });
        let mut check = |blocks: &[BlockView<'_>], x: &[f32], label: &str| {
            let (want, want_h) = tandem_forward(&m, blocks, x);
            let onnx_blocks: Vec<OnnxBlock> = blocks.iter().map(OnnxBlock::from_view).collect();
            let got = logits.run(x, &onnx_blocks).expect("run logits");
            worst = worst.max(assert_close(
                &got,
                &want,
                &format!("{what}, {label}, logits"),
            ));
            if let Some(e) = embeddings.as_mut() {
                let below = &onnx_blocks[..onnx_blocks.len() - 1];
                let got = e.run(x, below).expect("run embeddings");
                let w = assert_close(&got, &want_h, &format!("{what}, {label}, embeddings"));
                worst = worst.max(w);
            }
        };
        // Sampled mini-batches, fanouts small enough to leave neighbors out.
        let fanouts: Vec<u32> = [3, 2, 4][..cfg.num_layers].to_vec();
        let sampler = NeighborSampler::new(fanouts).expect("sampler");
        let mut scratch = SamplerScratch::new(n);
        for b in 0..3u64 {
            let mut seeds: Vec<u32> = (0..n as u32).collect();
            rng.shuffle(&mut seeds);
            seeds.truncate(5 + 4 * b as usize);
            let batch = sampler
                .sample(&case.graph, &seeds, b, &mut scratch)
                .expect("sample");
            let d = cfg.in_dim;
            let x: Vec<f32> = batch
                .input_ids()
                .iter()
                .flat_map(|&v| {
                    case.features[v as usize * d..(v as usize + 1) * d]
                        .iter()
                        .copied()
                })
                .collect();
            let views: Vec<BlockView<'_>> = batch
                .blocks()
                .iter()
                .map(|blk| BlockView::new(blk.num_src(), blk.indptr(), blk.indices()))
                .collect::<Result<_, _>>()
                .expect("views");
            check(&views, &x, &format!("batch {b}"));
        }
        // Full-graph inference: every block is the whole graph.
        let g = &case.graph;
        let views: Vec<BlockView<'_>> = (0..cfg.num_layers)
            .map(|_| BlockView::new(n, g.offsets(), g.indices()).expect("view"))
            .collect();
        check(&views, &case.features, "full graph");
    }
    eprintln!("onnx parity: worst relative error {worst:.3e} (tolerance {TOL:e})");
}

#[test]
fn blocks_without_edges_give_the_bias_path() {
    let Some(lib) = ort_library("onnx empty blocks") else {
        return;
    };
    let mut rng = Rng::new(5);
    for kind in [ModelKind::Gcn, ModelKind::Sage, ModelKind::Gat] {
        let cfg = ModelConfig {
            kind,
            in_dim: 3,
            hidden: 4,
            num_classes: 2,
            num_layers: 2,
            heads: 2,
            dropout: 0.0,
        };
        let m = random_model(&mut rng, &cfg);
        let mut ort =
            OrtModel::from_bytes(&lib, &m.export(&ExportOptions::default())).expect("session");
        // 4 sources, 3 then 2 destinations, no edges at all.
        let (p0, p1) = ([0u64; 4], [0u64; 3]);
        let views = [
            BlockView::new(4, &p0, &[]).expect("view"),
            BlockView::new(3, &p1, &[]).expect("view"),
        ];
        let x = random_values(&mut rng, 4 * 3, 1.0);
        let (want, _) = tandem_forward(&m, &views, &x);
        let blocks: Vec<OnnxBlock> = views.iter().map(OnnxBlock::from_view).collect();
        let got = ort.run(&x, &blocks).expect("run");
        assert_close(&got, &want, &format!("{kind:?} without edges"));
    }
}

#[test]
fn repeated_edges_in_any_order_match_the_csr_blocks() {
    let Some(lib) = ort_library("onnx repeated edges") else {
        return;
    };
    let mut rng = Rng::new(77);
    // Blocks of 30 → 20 → 8 vertices whose rows list sources with repeats.
    let sizes = [30usize, 20, 8];
    let csr: Vec<(Vec<u64>, Vec<u32>)> = sizes
        .windows(2)
        .map(|w| {
            let (num_src, num_dst) = (w[0], w[1]);
            let mut indptr = vec![0u64];
            let mut indices = Vec::new();
            for _ in 0..num_dst {
                let deg = rng.below(6);
                let first = rng.below(num_src as u64) as u32;
                for k in 0..deg {
                    // Every other neighbor repeats the first one.
                    let j = if k % 2 == 0 {
                        first
                    } else {
                        rng.below(num_src as u64) as u32
                    };
                    indices.push(j);
                }
                indptr.push(indices.len() as u64);
            }
            (indptr, indices)
        })
        .collect();
    let views: Vec<BlockView<'_>> = csr
        .iter()
        .zip(&sizes)
        .map(|((p, i), &n)| BlockView::new(n, p, i).expect("view"))
        .collect();
    for kind in [ModelKind::Gcn, ModelKind::Sage, ModelKind::Gat] {
        let cfg = ModelConfig {
            kind,
            in_dim: 7,
            hidden: 6,
            num_classes: 4,
            num_layers: 2,
            heads: 3,
            dropout: 0.0,
        };
        let m = random_model(&mut rng, &cfg);
        let x = random_values(&mut rng, sizes[0] * cfg.in_dim, 1.0);
        let (want, _) = tandem_forward(&m, &views, &x);
        // The same edges, shuffled (one permutation for src and dst).
        let blocks: Vec<OnnxBlock> = views
            .iter()
            .map(|v| {
                let b = OnnxBlock::from_view(v);
                let mut order: Vec<usize> = (0..b.src.len()).collect();
                rng.shuffle(&mut order);
                OnnxBlock {
                    src: order.iter().map(|&e| b.src[e]).collect(),
                    dst: order.iter().map(|&e| b.dst[e]).collect(),
                    num_dst: b.num_dst,
                }
            })
            .collect();
        let mut ort =
            OrtModel::from_bytes(&lib, &m.export(&ExportOptions::default())).expect("session");
        let got = ort.run(&x, &blocks).expect("run");
        let e = assert_close(&got, &want, &format!("{kind:?}, repeated shuffled edges"));
        eprintln!("onnx repeated edges: {kind:?}, relative error {e:.3e}");
    }
}

#[test]
fn requests_that_do_not_fit_are_errors() {
    let Some(lib) = ort_library("onnx request checks") else {
        return;
    };
    let cfg = ModelConfig {
        kind: ModelKind::Sage,
        in_dim: 3,
        hidden: 4,
        num_classes: 2,
        num_layers: 1,
        heads: 1,
        dropout: 0.0,
    };
    let m = random_model(&mut Rng::new(1), &cfg);
    let mut ort =
        OrtModel::from_bytes(&lib, &m.export(&ExportOptions::default())).expect("session");
    let x = vec![0.5f32; 2 * 3];
    let ok = OnnxBlock {
        src: vec![1],
        dst: vec![0],
        num_dst: 1,
    };
    assert_eq!(
        ort.run(&x, std::slice::from_ref(&ok)).expect("run").len(),
        2
    );
    assert!(ort.run(&x, &[]).is_err(), "too few blocks");
    assert!(
        ort.run(&x, &[ok.clone(), ok.clone()]).is_err(),
        "too many blocks"
    );
    let bad = OnnxBlock {
        src: vec![2],
        ..ok.clone()
    };
    let e = ort.run(&x, &[bad]).expect_err("source 2 of 2");
    assert!(e.to_string().contains("source id 2"), "{e}");
    assert!(ort.run(&x[..5], &[ok]).is_err(), "x not rows of in_dim");
    assert!(OrtModel::from_bytes(&lib, b"garbage").is_err());
}

fn trainer_toml(kind: &str) -> String {
    format!(
        r#"
[data.synthetic]
vertices = 400
edges = 2400
classes = 3
dim = 10
[model]
kind = "{kind}"
layers = 2
hidden = 8
heads = 2
[train]
epochs = 1
batch_size = 64
[threads]
compute = 1
"#
    )
}

#[test]
fn trainer_export_matches_full_graph_logits_and_embeddings() {
    let Some(lib) = ort_library("onnx trainer export") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for kind in ["gcn", "sage", "gat"] {
        let mut t = TrainerBuilder::from_toml(&trainer_toml(kind))
            .expect("config")
            .build()
            .expect("trainer");
        t.fit().expect("fit");
        let ds = t.dataset();
        let x = ds.features.as_slice().to_vec();
        let (full, dim) = (OnnxBlock::full_graph(&ds.graph), ds.features.dim());
        let logits_path = dir.path().join(format!("{kind}.onnx"));
        t.export_onnx(&logits_path, &ExportOptions::default())
            .expect("export");
        let mut ort = OrtModel::from_file(&lib, &logits_path).expect("session");
        let got = ort.run(&x, &[full.clone(), full.clone()]).expect("run");
        let want: Vec<f32> = t
            .full_graph_logits()
            .expect("logits")
            .iter()
            .copied()
            .collect();
        let e = assert_close(&got, &want, &format!("trainer {kind} logits"));
        eprintln!("onnx trainer export: {kind} logits, relative error {e:.3e}");

        let emb_path = dir.path().join(format!("{kind}-emb.onnx"));
        let opts = ExportOptions {
            output: OnnxOutput::Embeddings,
            ..ExportOptions::default()
        };
        t.export_onnx(&emb_path, &opts).expect("export");
        let mut ort = OrtModel::from_file(&lib, &emb_path).expect("session");
        let got = ort.run(&x, std::slice::from_ref(&full)).expect("run");
        let ids: Vec<u32> = (0..x.len() / dim).map(|v| v as u32).collect();
        let want = t.embedding_table().expect("embeddings");
        let want: Vec<f32> = want.gather(&ids).expect("gather").iter().copied().collect();
        let e = assert_close(&got, &want, &format!("trainer {kind} embeddings"));
        eprintln!("onnx trainer export: {kind} embeddings, relative error {e:.3e}");
    }
}

#[test]
fn cli_export_model_from_a_checkpoint() {
    // Exporting needs no ONNX Runtime; running the file does.
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("gat.toml");
    std::fs::write(&cfg, trainer_toml("gat")).expect("write config");
    let run = dir.path().join("run");
    let tandem = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(args)
            .output()
            .expect("run tandem");
        assert!(
            out.status.success(),
            "tandem {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    tandem(&[
        "train".as_ref(),
        "--config".as_ref(),
        cfg.as_os_str(),
        "--quiet-config".as_ref(),
        "--out".as_ref(),
        run.as_os_str(),
    ]);
    let ck = run.join("checkpoint.tck");
    let onnx = dir.path().join("model.onnx");
    let said = tandem(&[
        "export-model".as_ref(),
        "--checkpoint".as_ref(),
        ck.as_os_str(),
        "-o".as_ref(),
        onnx.as_os_str(),
    ]);
    assert!(said.contains("opset 18"), "{said}");
    let emb = dir.path().join("emb.onnx");
    tandem(&[
        "export-model".as_ref(),
        "--checkpoint".as_ref(),
        ck.as_os_str(),
        "-o".as_ref(),
        emb.as_os_str(),
        "--output".as_ref(),
        "embeddings".as_ref(),
    ]);
    let sig = runtime::onnx::OnnxSignature::of(&std::fs::read(&emb).expect("read")).expect("sig");
    assert_eq!(
        (sig.output, sig.num_blocks, sig.in_dim, sig.out_dim),
        (OnnxOutput::Embeddings, 1, 10, 8)
    );

    let Some(lib) = ort_library("onnx cli export") else {
        return;
    };
    // The checkpoint's model, rebuilt the way `--resume` does, gives the reference.
    let mut t = TrainerBuilder::from_toml(&trainer_toml("gat"))
        .expect("config")
        .build()
        .expect("trainer");
    t.load_checkpoint(&ck).expect("load");
    let ds = t.dataset();
    let full = OnnxBlock::full_graph(&ds.graph);
    let x = ds.features.as_slice().to_vec();
    let mut ort = OrtModel::from_file(&lib, &onnx).expect("session");
    let got = ort.run(&x, &[full.clone(), full]).expect("run");
    let want: Vec<f32> = t
        .full_graph_logits()
        .expect("logits")
        .iter()
        .copied()
        .collect();
    assert_close(&got, &want, "CLI export, GAT logits");
}
