//! ONNX export of a trained model, and serving it through ONNX Runtime.
//!
//! [`export`] writes a model — its [`ModelConfig`] and parameter tensors — as an
//! ONNX graph (opset [`OPSET`]) whose inputs are the features and the graph
//! structure of every layer's block, so one file serves a sampled mini-batch and
//! full-graph inference alike. Each layer's ops come from its own file in
//! `gpu_ops::model` ([`gpu_ops::model::LayerDef::emit`]), written over
//! [`gpu_ops::model::GraphEmitter`], which `builder.rs` implements with ONNX
//! nodes; this module declares the inputs, the parameters (initializers) and the
//! activation between layers.
//! [`OrtModel`] runs such a file through ONNX Runtime (the `ort` crate, cargo
//! feature `onnx-runtime`, library loaded at run time from a path); without the
//! feature it has the same API and reports that it was not compiled in.
//! The protobuf messages are prost types generated once from ONNX's `onnx.proto`
//! and checked in (`proto.rs`): prost (tokio-rs) is the widely kept Rust protobuf
//! crate and, with the types checked in, needs no `protoc`; `onnx-protobuf` would
//! add rust-protobuf behind a one-author wrapper of an unstated ONNX version.
//!
//! # The graph (see docs/onnx.md for the full story)
//! Inputs, for a graph of `B` blocks (`B` = layers for [`OnnxOutput::Logits`],
//! layers − 1 for [`OnnxOutput::Embeddings`]), bottom block first:
//!
//! | name | type | shape | meaning |
//! |---|---|---|---|
//! | `x` | float | `num_src_0 × in_dim` | features of block 0's sources |
//! | `src_{l}` | int64 | `num_edges_l` | local source id of each edge of block `l` |
//! | `dst_{l}` | int64 | `num_edges_l` | local destination id of each edge of block `l` |
//! | `num_dst_{l}` | int64 | `1` | destinations of block `l` |
//!
//! As in Tandem's blocks, destination `i` is source `i` and block `l`'s
//! destinations are block `l+1`'s sources (`num_src_{l+1} = num_dst_l`). Edges may
//! come in any order and repeat. Output: `logits` (`num_dst_{B-1} × num_classes`)
//! or `embeddings` (`num_dst_{B-1} × hidden`, the hidden layer below the
//! classifier after its activation). Full-graph inference passes the whole graph
//! as every block ([`OnnxBlock::full_graph`]).
//!
//! Ops (all in the default domain, opset 18): `MatMul`, `Add`, `Sub`, `Mul`,
//! `Div`, `Max`, `Gather`, `ScatterND` (`reduction` `add` and `max`, the reason for
//! opset 18), `Shape`, `ConstantOfShape`, `Concat`, `Range`, `Reshape`, `Slice`,
//! `Unsqueeze`, `ReduceSum`, `ReduceMean`, `Sqrt`, `Reciprocal`, `Exp`,
//! `LeakyRelu`, `Relu`, `Elu`, `Identity`.
//!
//! # Serving from Rust
//! ```no_run
//! use std::path::Path;
//!
//! use cpu_ops::{gather_rows_into_vec, NeighborSampler, SamplerScratch};
//! use runtime::data::{open_dataset, Verify};
//! use runtime::onnx::{OnnxBlock, OrtModel, ORT_LIB_ENV};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ds = open_dataset(Path::new("g.tds"), Verify::Default)?;
//! let lib = std::env::var_os(ORT_LIB_ENV).ok_or("set TANDEM_ORT_LIB")?;
//! let mut model = OrtModel::from_file(Path::new(&lib), Path::new("model.onnx"))?;
//!
//! // A sampled mini-batch: blocks bottom first, x = features of block 0's sources.
//! let sampler = NeighborSampler::new(vec![10, 10])?;
//! let mut scratch = SamplerScratch::new(ds.num_vertices());
//! let batch = sampler.sample(&ds.graph, &[0, 5, 42], 7, &mut scratch)?;
//! let blocks: Vec<OnnxBlock> = batch.blocks().iter().map(OnnxBlock::from_sampled).collect();
//! let x = gather_rows_into_vec(&ds.features, batch.input_ids())?;
//! let logits = model.run(&x, &blocks)?; // 3 × num_classes, in seed order
//!
//! // Full-graph inference: the whole graph as every block.
//! let full = OnnxBlock::full_graph(&ds.graph);
//! let all = model.run(ds.features.as_slice(), &[full.clone(), full])?; // n × num_classes
//! # let _ = (logits, all);
//! # Ok(())
//! # }
//! ```

mod builder;
#[allow(clippy::all, missing_docs)]
mod proto;
#[cfg(feature = "onnx-runtime")]
mod session;
#[cfg(not(feature = "onnx-runtime"))]
#[path = "session_stub.rs"]
mod session;

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use cpu_ops::{BlockView, CsrGraph, ModelConfig, ModelKind};
use gpu_ops::model::{EmitBlock, GraphEmitter, ModelLayout};
use gpu_ops::GpuOpsError;
use prost::Message;

use crate::atomic::write_file_atomically;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use builder::{Dim, GraphBuilder};
use proto::tensor_proto::DataType;
use proto::{ModelProto, OperatorSetIdProto, StringStringEntryProto};

pub use session::{load_onnx_runtime, OrtModel};

/// The ONNX opset the graphs use: 18 is the first with `ScatterND`'s `max`
/// reduction (GAT's per-destination softmax maximum). Tested with ONNX Runtime
/// 1.30 and 1.31.
pub const OPSET: i64 = 18;

/// The ONNX IR version written (IR 8 is the one released with opset 18).
pub const IR_VERSION: i64 = 8;

/// The environment variable Tandem's tests, docs and examples read the path of
/// `libonnxruntime` from (the library itself never reads the environment).
pub const ORT_LIB_ENV: &str = "TANDEM_ORT_LIB";

/// What an exported graph returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnnxOutput {
    /// `logits`: the top layer's output, `num_dst × num_classes` (all layers;
    /// node classification).
    #[default]
    Logits,
    /// `embeddings`: the output of the layer below the classifier after its
    /// activation, `num_dst × hidden` (layers − 1 blocks; needs ≥ 2 layers);
    /// for a link-prediction model, the encoder's output (all layers).
    Embeddings,
    /// `scores`: a link-prediction model's decoder scores (logits) of pairs
    /// `pair_src[i]`, `pair_dst[i]` (int64 inputs, local ids among the top
    /// block's destinations), from the encoder's output (all layers).
    Scores,
}

impl OnnxOutput {
    /// The graph output's name: `"logits"` or `"embeddings"`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnnxOutput::Logits => "logits",
            OnnxOutput::Embeddings => "embeddings",
            OnnxOutput::Scores => "scores",
        }
    }
}

impl fmt::Display for OnnxOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnnxOutput {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "logits" => Ok(OnnxOutput::Logits),
            "embeddings" => Ok(OnnxOutput::Embeddings),
            "scores" => Ok(OnnxOutput::Scores),
            _ => Err(format!(
                "`{s}`: expected `logits`, `embeddings` or `scores`"
            )),
        }
    }
}

/// Options of [`export`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// What the graph returns.
    pub output: OnnxOutput,
    /// The model's head (its parameters follow the encoder's): class logits,
    /// or a link-prediction decoder. `Trainer::export_onnx` and
    /// [`export_checkpoint`] set it from the model's configuration.
    pub head: gpu_ops::Head,
}

/// The configuration's name of a model kind (`"gcn"`, `"sage"`, `"gat"`).
pub(crate) fn kind_name(kind: ModelKind) -> &'static str {
    match kind {
        ModelKind::Gcn => "gcn",
        ModelKind::Sage => "sage",
        ModelKind::Gat => "gat",
    }
}

/// An error of laying out a model: a bad configuration keeps its `cpu_ops` error.
fn layout_err(context: &'static str) -> impl Fn(GpuOpsError) -> Error {
    move |e| Error::device(context, e)
}

/// The ONNX model (serialized `ModelProto`) computing the forward pass of a
/// model of `cfg` holding `params` (in `gpu_ops::model::ModelLayout`'s order, the
/// order of checkpoints and `DeviceModel::params`; counts and lengths are
/// checked), without dropout, as the module doc describes:
/// `gpu_ops::DeviceModel::forward(.., train = false, ..)` for
/// [`OnnxOutput::Logits`]; for [`OnnxOutput::Embeddings`], the layers below the
/// top one by one (`DeviceModel::forward_layer`, activation included). The
/// parameters are stored as initializers under the model's names
/// (`layer0.weight`, ...).
pub fn export(cfg: &ModelConfig, params: &[&[f32]], opts: &ExportOptions) -> Result<Vec<u8>> {
    let layout = ModelLayout::with_head(cfg, opts.head).map_err(layout_err("ONNX export"))?;
    layout
        .check_params(params)
        .map_err(layout_err("ONNX export: parameters"))?;
    let specs = layout.layer_specs();
    let decoder = opts.head.decoder();
    let layers = match (opts.output, decoder) {
        (OnnxOutput::Logits, None) => specs.len(),
        (OnnxOutput::Logits, Some(_)) => {
            return Err(Error::invalid_argument(
                "output",
                "a link-prediction model has no class logits: export `embeddings` or `scores`",
            ))
        }
        (OnnxOutput::Scores, None) => {
            return Err(Error::invalid_argument(
                "output",
                "`scores` are a link-prediction model's (model.task = \"link\")",
            ))
        }
        (OnnxOutput::Embeddings | OnnxOutput::Scores, Some(_)) => specs.len(),
        (OnnxOutput::Embeddings, None) if specs.len() < 2 => {
            return Err(Error::invalid_argument(
                "output",
                "a 1-layer model has no hidden layer: its embeddings are the input features",
            ))
        }
        (OnnxOutput::Embeddings, None) => specs.len() - 1,
    };
    let mut g = GraphBuilder::default();
    let mut h = g.input(
        "x",
        DataType::Float,
        &[
            Dim::Named("num_src_0".into()),
            Dim::Fixed(cfg.in_dim as i64),
        ],
    );
    let mut width = cfg.in_dim;
    for (l, spec) in specs.iter().take(layers).enumerate() {
        let edges = || Dim::Named(format!("num_edges_{l}"));
        let block = EmitBlock {
            src: g.input(&format!("src_{l}"), DataType::Int64, &[edges()]),
            dst: g.input(&format!("dst_{l}"), DataType::Int64, &[edges()]),
            num_dst: g.input(&format!("num_dst_{l}"), DataType::Int64, &[Dim::Fixed(1)]),
        };
        let layer = layout
            .layer(l)
            .ok_or_else(|| Error::invalid_argument("ONNX export", "internal: missing layer"))?;
        let range = layout.layer_params(l).map_err(layout_err("ONNX export"))?;
        // The layer's tensors as named initializers, then its ops.
        let names: Vec<String> = range
            .map(|i| {
                let p = &layout.params()[i];
                let dims: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
                g.param(&p.name, &dims, params[i])
            })
            .collect();
        h = layer.emit(&mut g, &names, &h, &block);
        if !spec.last {
            h = g.activation(layer.activation(), &h);
        }
        width = spec.d_out;
    }
    let top = layers - 1;
    match (opts.output, decoder) {
        (OnnxOutput::Scores, Some(d)) => {
            let pairs = || Dim::Named("num_pairs".into());
            let src = g.input("pair_src", DataType::Int64, &[pairs()]);
            let dst = g.input("pair_dst", DataType::Int64, &[pairs()]);
            let names: Vec<String> = layout
                .head_params()
                .map(|i| {
                    let p = &layout.params()[i];
                    let dims: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
                    g.param(&p.name, &dims, params[i])
                })
                .collect();
            let scores = d.emit(&mut g, &names, &h, &src, &dst);
            g.output(&scores, "scores", DataType::Float, &[pairs()]);
        }
        _ => g.output(
            &h,
            opts.output.as_str(),
            DataType::Float,
            &[
                Dim::Named(format!("num_dst_{top}")),
                Dim::Fixed(width as i64),
            ],
        ),
    }
    let doc = format!(
        "Tandem {} model, {} layers, output `{}`: inputs x (num_src_0 × {}), then per block l \
         (bottom first) src_l, dst_l (int64 edge lists, local ids) and num_dst_l (int64 [1]).",
        kind_name(cfg.kind),
        cfg.num_layers,
        opts.output,
        cfg.in_dim
    );
    let meta = [
        ("tandem.kind", kind_name(cfg.kind).to_string()),
        ("tandem.layers", cfg.num_layers.to_string()),
        ("tandem.blocks", layers.to_string()),
        ("tandem.in_dim", cfg.in_dim.to_string()),
        ("tandem.hidden", cfg.hidden.to_string()),
        ("tandem.num_classes", cfg.num_classes.to_string()),
        ("tandem.heads", cfg.heads.to_string()),
        ("tandem.output", opts.output.to_string()),
    ];
    let proto = ModelProto {
        ir_version: Some(IR_VERSION),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(OPSET),
        }],
        producer_name: Some("tandem".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        model_version: Some(1),
        doc_string: Some(doc.clone()),
        graph: Some(g.finish("tandem", &doc)),
        metadata_props: meta
            .into_iter()
            .map(|(k, v)| StringStringEntryProto {
                key: Some(k.into()),
                value: Some(v),
            })
            .collect(),
        ..Default::default()
    };
    Ok(proto.encode_to_vec())
}

/// [`export`] written to `path` atomically.
pub fn write(
    cfg: &ModelConfig,
    params: &[&[f32]],
    opts: &ExportOptions,
    path: &Path,
) -> Result<()> {
    let bytes = export(cfg, params, opts)?;
    write_file_atomically(path, |w| {
        std::io::Write::write_all(w, &bytes).map_err(|e| Error::io(path, e))
    })
}

/// Exports the model saved in the checkpoint at `checkpoint` to `path` (what
/// `tandem export-model` does); returns the model's configuration.
pub fn export_checkpoint(
    checkpoint: &Path,
    opts: &ExportOptions,
    path: &Path,
) -> Result<cpu_ops::ModelConfig> {
    let ckpt = Checkpoint::read(checkpoint)?;
    let (cfg, head, params) = ckpt.model_params(checkpoint)?;
    let opts = ExportOptions {
        head,
        ..opts.clone()
    };
    write(&cfg, &params, &opts, path)?;
    Ok(cfg)
}

/// One block as the graph's inputs take it: edge lists of local ids and the
/// destination count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OnnxBlock {
    /// Local source id of each edge (below the block's source count).
    pub src: Vec<i64>,
    /// Local destination id of each edge (below `num_dst`).
    pub dst: Vec<i64>,
    /// Number of destinations (the first `num_dst` sources).
    pub num_dst: usize,
}

impl OnnxBlock {
    /// The edges of a CSR block (`indptr`: `num_dst + 1` offsets, `indices`: local
    /// source ids grouped by destination), in CSR order.
    pub fn from_csr(indptr: &[u64], indices: &[u32]) -> Self {
        let num_dst = indptr.len().saturating_sub(1);
        let mut dst = Vec::with_capacity(indices.len());
        for (i, w) in indptr.windows(2).enumerate() {
            dst.extend(std::iter::repeat_n(i as i64, (w[1] - w[0]) as usize));
        }
        Self {
            src: indices.iter().map(|&j| i64::from(j)).collect(),
            dst,
            num_dst,
        }
    }

    /// The edges of a validated block view.
    pub fn from_view(block: &BlockView<'_>) -> Self {
        Self::from_csr(block.indptr(), block.indices())
    }

    /// The edges of a sampled block ([`cpu_ops::SampledBatch::blocks`]).
    pub fn from_sampled(block: &cpu_ops::Block) -> Self {
        Self::from_csr(block.indptr(), block.indices())
    }

    /// The whole graph as one block: every vertex a destination, every stored
    /// edge `(s → d)` (CSR row `d` lists `s`) an edge. Pass it once per block for
    /// full-graph inference.
    pub fn full_graph(graph: &CsrGraph) -> Self {
        Self::from_csr(graph.offsets(), graph.indices())
    }

    /// Checks the block against its source count `num_src`; returns `num_dst`.
    fn check(&self, l: usize, num_src: usize) -> Result<usize> {
        let bad = |reason: String| Err(Error::invalid_argument(format!("blocks[{l}]"), reason));
        if self.src.len() != self.dst.len() {
            return bad(format!(
                "{} source ids but {} destination ids",
                self.src.len(),
                self.dst.len()
            ));
        }
        if self.num_dst > num_src {
            return bad(format!(
                "{} destinations but only {num_src} sources (destinations are the first sources)",
                self.num_dst
            ));
        }
        for (what, ids, limit) in [
            ("source", &self.src, num_src),
            ("destination", &self.dst, self.num_dst),
        ] {
            if let Some((e, &v)) = ids
                .iter()
                .enumerate()
                .find(|&(_, &v)| v < 0 || v as u64 >= limit as u64)
            {
                return bad(format!(
                    "edge {e} has {what} id {v}, expected 0..{limit} ({what}s of the block)"
                ));
            }
        }
        Ok(self.num_dst)
    }
}

/// Checks that `x` (`rows × in_dim`) and `blocks` fit each other; returns the
/// output rows (`num_dst` of the last block).
pub(crate) fn check_request(x: &[f32], in_dim: usize, blocks: &[OnnxBlock]) -> Result<usize> {
    if in_dim == 0 || !x.len().is_multiple_of(in_dim) {
        return Err(Error::invalid_argument(
            "x",
            format!("{} values are not rows of in_dim = {in_dim}", x.len()),
        ));
    }
    let mut num_src = x.len() / in_dim;
    for (l, b) in blocks.iter().enumerate() {
        num_src = b.check(l, num_src)?;
    }
    Ok(num_src)
}

/// What an exported file expects and returns, read from its graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnnxSignature {
    /// The output (by its name).
    pub output: OnnxOutput,
    /// Blocks the graph reads (`src_0` .. `src_{B-1}`).
    pub num_blocks: usize,
    /// Columns of `x`.
    pub in_dim: usize,
    /// Columns of the output (1 for `scores`, one per pair).
    pub out_dim: usize,
}

impl OnnxSignature {
    /// Reads the signature of a file written by [`export`].
    pub fn of(bytes: &[u8]) -> Result<Self> {
        let bad = |what: String| Error::invalid_argument("ONNX model", what);
        let model =
            ModelProto::decode(bytes).map_err(|e| bad(format!("not an ONNX model: {e}")))?;
        let graph = model.graph.ok_or_else(|| bad("it has no graph".into()))?;
        let width = |v: &proto::ValueInfoProto| -> Option<usize> {
            let proto::type_proto::Value::TensorType(t) = v.r#type.as_ref()?.value.as_ref()? else {
                return None;
            };
            match t.shape.as_ref()?.dim.get(1)?.value.as_ref()? {
                proto::tensor_shape_proto::dimension::Value::DimValue(d) => {
                    usize::try_from(*d).ok()
                }
                proto::tensor_shape_proto::dimension::Value::DimParam(_) => None,
            }
        };
        let x = graph
            .input
            .iter()
            .find(|v| v.name.as_deref() == Some("x"))
            .ok_or_else(|| bad("no input `x`: not exported by Tandem".into()))?;
        let in_dim = width(x).ok_or_else(|| bad("input `x` has no fixed width".into()))?;
        let num_blocks = (0..)
            .take_while(|l| {
                graph
                    .input
                    .iter()
                    .any(|v| v.name.as_deref() == Some(format!("src_{l}").as_str()))
            })
            .count();
        let out = graph
            .output
            .first()
            .ok_or_else(|| bad("the graph has no output".into()))?;
        let name = out.name.as_deref().unwrap_or_default();
        let output = name
            .parse()
            .map_err(|e| bad(format!("output {e}: not exported by Tandem")))?;
        let out_dim = match output {
            OnnxOutput::Scores => 1,
            _ => width(out).ok_or_else(|| bad(format!("output `{name}` has no fixed width")))?,
        };
        Ok(Self {
            output,
            num_blocks,
            in_dim,
            out_dim,
        })
    }
}

#[cfg(test)]
mod tests;
