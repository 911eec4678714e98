//! Export structure without ONNX Runtime: the file decodes, declares opset 18 and
//! only the documented ops, carries the parameters, and its signature reads back.
//! Numerical parity with the model's forward pass is in `runtime/tests/onnx.rs`
//! (needs the library).

use std::collections::BTreeSet;

use cpu_ops::{ModelConfig, ModelKind};
use prost::Message;

use super::proto::ModelProto;
use super::*;

/// A model's configuration and parameter tensors (freshly initialized).
struct Model {
    cfg: ModelConfig,
    names: Vec<String>,
    params: Vec<Vec<f32>>,
}

impl Model {
    fn params(&self) -> Vec<&[f32]> {
        self.params.iter().map(Vec::as_slice).collect()
    }

    fn export(&self, opts: &ExportOptions) -> Result<Vec<u8>> {
        export(&self.cfg, &self.params(), opts)
    }
}

fn model(kind: ModelKind, layers: usize) -> Model {
    let cfg = ModelConfig {
        kind,
        in_dim: 5,
        hidden: 6,
        num_classes: 3,
        num_layers: layers,
        heads: 2,
        dropout: 0.5,
    };
    let layout = ModelLayout::new(&cfg).expect("layout");
    Model {
        names: layout.param_names(),
        params: layout.init_params(7),
        cfg,
    }
}

const DOCUMENTED_OPS: &[&str] = &[
    "MatMul",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Max",
    "Gather",
    "ScatterND",
    "Shape",
    "ConstantOfShape",
    "Concat",
    "Range",
    "Reshape",
    "Slice",
    "Unsqueeze",
    "ReduceSum",
    "ReduceMean",
    "Sqrt",
    "Reciprocal",
    "Exp",
    "LeakyRelu",
    "Relu",
    "Elu",
    "Identity",
];

#[test]
fn exported_graphs_use_opset_18_and_only_documented_ops() {
    for kind in [ModelKind::Gcn, ModelKind::Sage, ModelKind::Gat] {
        for layers in 1..=3 {
            let m = model(kind, layers);
            let bytes = m.export(&ExportOptions::default()).expect("export");
            let p = ModelProto::decode(bytes.as_slice()).expect("decode");
            assert_eq!(p.ir_version, Some(IR_VERSION));
            assert_eq!(p.opset_import.len(), 1);
            assert_eq!(p.opset_import[0].domain.as_deref(), Some(""));
            assert_eq!(p.opset_import[0].version, Some(OPSET));
            let g = p.graph.expect("graph");
            let ops: BTreeSet<&str> = g.node.iter().filter_map(|n| n.op_type.as_deref()).collect();
            for op in &ops {
                assert!(
                    DOCUMENTED_OPS.contains(op),
                    "{kind:?}: undocumented op {op}"
                );
            }
            // Every parameter is an initializer with the model's values.
            for (name, values) in m.names.iter().zip(m.params()) {
                let t = g
                    .initializer
                    .iter()
                    .find(|t| t.name.as_deref() == Some(name.as_str()))
                    .unwrap_or_else(|| panic!("{kind:?}: no initializer {name}"));
                let raw = t.raw_data.as_deref().expect("raw data");
                let got: Vec<f32> = raw
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                assert_eq!(got, values, "{name}");
                assert_eq!(t.dims.iter().product::<i64>(), values.len() as i64);
            }
            // Value names are unique (each produced once).
            let mut produced = BTreeSet::new();
            for n in &g.node {
                for o in &n.output {
                    assert!(produced.insert(o.clone()), "{o} produced twice");
                }
            }
        }
    }
}

#[test]
fn signature_reads_back() {
    for kind in [ModelKind::Gcn, ModelKind::Sage, ModelKind::Gat] {
        let m = model(kind, 3);
        let logits = m.export(&ExportOptions::default()).expect("export");
        assert_eq!(
            OnnxSignature::of(&logits).expect("signature"),
            OnnxSignature {
                output: OnnxOutput::Logits,
                num_blocks: 3,
                in_dim: 5,
                out_dim: 3,
            }
        );
        let emb = m
            .export(&ExportOptions {
                output: OnnxOutput::Embeddings,
                ..ExportOptions::default()
            })
            .expect("export");
        assert_eq!(
            OnnxSignature::of(&emb).expect("signature"),
            OnnxSignature {
                output: OnnxOutput::Embeddings,
                num_blocks: 2,
                in_dim: 5,
                out_dim: 6,
            }
        );
    }
    assert!(OnnxSignature::of(b"not a model").is_err());
}

#[test]
fn one_layer_models_have_no_embeddings_to_export() {
    let m = model(ModelKind::Sage, 1);
    let e = m
        .export(&ExportOptions {
            output: OnnxOutput::Embeddings,
            ..ExportOptions::default()
        })
        .expect_err("1 layer");
    assert!(e.to_string().contains("1-layer"), "{e}");
}

/// [`export`] takes a configuration and tensors (e.g. a device model's or a
/// checkpoint's): the same tensors give the same bytes, other tensors other
/// initializers; wrong tensors are errors naming what is wrong.
#[test]
fn export_from_a_configuration_and_tensors() {
    for kind in [ModelKind::Gcn, ModelKind::Sage, ModelKind::Gat] {
        let m = model(kind, 2);
        let params = m.params();
        let opts = ExportOptions::default();
        let bytes = export(&m.cfg, &params, &opts).expect("export");
        assert_eq!(bytes, m.export(&opts).expect("export"), "{kind:?}");
        let shifted: Vec<Vec<f32>> = m
            .params
            .iter()
            .map(|t| t.iter().map(|v| v + 0.25).collect())
            .collect();
        let refs: Vec<&[f32]> = shifted.iter().map(Vec::as_slice).collect();
        let other = export(&m.cfg, &refs, &opts).expect("export");
        assert_ne!(other, bytes, "{kind:?}");
        assert_eq!(other.len(), bytes.len(), "{kind:?}: same graph");
        let e = export(&m.cfg, &params[1..], &opts).expect_err("a tensor short");
        assert!(e.to_string().contains("parameter tensors"), "{e}");
        let mut cut = params.clone();
        cut[0] = &params[0][1..];
        assert!(export(&m.cfg, &cut, &opts).is_err());
        let bad = ModelConfig {
            num_layers: 0,
            ..m.cfg.clone()
        };
        let e = export(&bad, &params, &opts).expect_err("no layers");
        assert!(e.to_string().contains("num_layers"), "{e}");
    }
}

#[test]
fn output_kind_parses() {
    assert_eq!("logits".parse(), Ok(OnnxOutput::Logits));
    assert_eq!("embeddings".parse(), Ok(OnnxOutput::Embeddings));
    assert!("probs".parse::<OnnxOutput>().is_err());
    assert_eq!(OnnxOutput::Embeddings.to_string(), "embeddings");
}

#[test]
fn blocks_from_csr_and_their_checks() {
    // 3 destinations of 5 sources: 0 ← {1, 4}, 1 ← {}, 2 ← {0, 2, 3}.
    let b = OnnxBlock::from_csr(&[0, 2, 2, 5], &[1, 4, 0, 2, 3]);
    assert_eq!(b.src, vec![1, 4, 0, 2, 3]);
    assert_eq!(b.dst, vec![0, 0, 2, 2, 2]);
    assert_eq!(b.num_dst, 3);
    let x = vec![0.0f32; 5 * 2];
    assert_eq!(
        check_request(&x, 2, std::slice::from_ref(&b)).expect("ok"),
        3
    );
    // Too few sources for the edges.
    let e = check_request(&x[..8], 2, std::slice::from_ref(&b)).expect_err("4 sources");
    assert!(e.to_string().contains("source id 4"), "{e}");
    // x not rows of in_dim.
    assert!(check_request(&x[..9], 2, &[]).is_err());
    // Chained: block 1 has block 0's 3 destinations as sources.
    let top = OnnxBlock {
        src: vec![2],
        dst: vec![0],
        num_dst: 1,
    };
    assert_eq!(check_request(&x, 2, &[b.clone(), top]).expect("ok"), 1);
    let bad = OnnxBlock {
        src: vec![3],
        dst: vec![0],
        num_dst: 1,
    };
    let e = check_request(&x, 2, &[b.clone(), bad]).expect_err("source 3 of 3");
    assert!(e.to_string().contains("blocks[1]"), "{e}");
    let mismatched = OnnxBlock {
        src: vec![0, 1],
        dst: vec![0],
        num_dst: 1,
    };
    assert!(check_request(&x, 2, &[mismatched]).is_err());
    let too_many_dst = OnnxBlock {
        num_dst: 6,
        ..Default::default()
    };
    assert!(check_request(&x, 2, &[too_many_dst]).is_err());
}

#[test]
fn without_a_library_loading_fails_cleanly() {
    let missing = std::path::Path::new("/nonexistent/libonnxruntime.so");
    let e = load_onnx_runtime(missing).expect_err("missing library");
    assert!(matches!(e, Error::OnnxRuntime { .. }), "{e}");
}
