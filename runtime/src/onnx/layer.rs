//! One model layer as ONNX ops, mirroring `cpu_ops::model` (same formulas, same
//! order of projection and aggregation, same degree conventions), so an exported
//! graph computes what `Model::forward_input` computes up to fp32 rounding.
//!
//! Every aggregation is "gather the source rows of the edges, combine them into
//! their destination rows": `Gather(rows, src)` then `ScatterND(zeros, dst[:, None],
//! messages, reduction)`. That needs no sorted edges and no CSR, so the same graph
//! runs a sampled block and the whole graph.

use cpu_ops::{LayerSpec, ModelKind, GAT_NEGATIVE_SLOPE};

use super::builder::{Attr, GraphBuilder};

/// The graph values of one block: edge lists (`int64 [E]`) and the destination
/// count (`int64 [1]`).
pub(crate) struct BlockValues {
    pub(crate) src: String,
    pub(crate) dst: String,
    pub(crate) num_dst: String,
}

/// Values of a block derived once per layer.
struct Edges<'a> {
    b: &'a BlockValues,
    /// `dst` as `[E, 1]`, the index form `ScatterND` wants.
    dst_idx: String,
}

impl<'a> Edges<'a> {
    fn new(g: &mut GraphBuilder, b: &'a BlockValues) -> Self {
        let dst_idx = g.unsqueeze(&b.dst, 1);
        Self { b, dst_idx }
    }

    /// Number of edges into each destination, as `float [num_dst]`.
    fn in_degree(&self, g: &mut GraphBuilder) -> String {
        let ones = ones_like_edges(g, &self.b.dst);
        let zeros = g.filled(&self.b.num_dst, &[], 0.0);
        g.scatter_rows(&zeros, &self.dst_idx, &ones, "add")
    }

    /// `Σ_{e→i} y_{src(e)}` for every destination `i`: `num_dst × width`.
    fn sum(&self, g: &mut GraphBuilder, y: &str, width: usize) -> String {
        let msg = g.gather_rows(y, &self.b.src);
        let zeros = g.filled(&self.b.num_dst, &[width as i64], 0.0);
        g.scatter_rows(&zeros, &self.dst_idx, &msg, "add")
    }
}

/// `float` ones, one per edge of `edge_list`.
fn ones_like_edges(g: &mut GraphBuilder, edge_list: &str) -> String {
    let e = g.op("Shape", &[edge_list], vec![], "num_edges");
    g.filled(&e, &[], 1.0)
}

/// `x` (a `[rows]` vector) as a column `[rows, 1]` to scale rows with.
fn column(g: &mut GraphBuilder, x: &str) -> String {
    g.unsqueeze(x, 1)
}

/// Emits layer `l` reading `h` (`num_src × spec.d_in`) over `block`; returns its
/// output (`num_dst × spec.d_out`), after the activation below the top layer.
/// `params` are the layer's tensors in `Model::layer_params` order, `names` theirs.
pub(crate) fn emit(
    g: &mut GraphBuilder,
    kind: ModelKind,
    spec: &LayerSpec,
    params: &[Vec<f32>],
    names: &[String],
    h: &str,
    block: &BlockValues,
) -> String {
    let out = match kind {
        ModelKind::Sage => sage(g, spec, params, names, h, block),
        ModelKind::Gcn => gcn(g, spec, params, names, h, block),
        ModelKind::Gat => gat(g, spec, params, names, h, block),
    };
    if spec.last {
        return out;
    }
    match kind {
        ModelKind::Gat => g.op("Elu", &[&out], vec![("alpha", Attr::Float(1.0))], "elu"),
        ModelKind::Gcn | ModelKind::Sage => g.unary("Relu", &out),
    }
}

fn dims(rows: usize, cols: usize) -> [i64; 2] {
    [rows as i64, cols as i64]
}

/// `out_i = x_i·W_self + mean_{j∈N(i)} x_j·W_neigh + b` (an isolated destination's
/// mean is 0): `A_mean (X·W_neigh)` when `d_in > d_out`, else `(A_mean X)·W_neigh`.
fn sage(
    g: &mut GraphBuilder,
    spec: &LayerSpec,
    params: &[Vec<f32>],
    names: &[String],
    h: &str,
    block: &BlockValues,
) -> String {
    let (d_in, d_out) = (spec.d_in, spec.d_out);
    let w_self = g.param(&names[0], &dims(d_in, d_out), &params[0]);
    let w_neigh = g.param(&names[1], &dims(d_in, d_out), &params[1]);
    let bias = g.param(&names[2], &[d_out as i64], &params[2]);
    let e = Edges::new(g, block);
    let deg = e.in_degree(g);
    let clamped = g.max_scalar(&deg, 1.0);
    let inv = g.unary("Reciprocal", &clamped);
    let inv = column(g, &inv);
    let neigh = if d_in > d_out {
        let p = g.matmul(h, &w_neigh);
        let s = e.sum(g, &p, d_out);
        g.mul(&s, &inv)
    } else {
        let s = e.sum(g, h, d_in);
        let m = g.mul(&s, &inv);
        g.matmul(&m, &w_neigh)
    };
    let x_dst = g.first_rows(h, &block.num_dst);
    let own = g.matmul(&x_dst, &w_self);
    let out = g.add(&neigh, &own);
    g.add(&out, &bias)
}

/// `out = Â X W + b` over the augmented block (destination `i` also reads itself):
/// `Â_ij = 1/√(d̃_out(j)·d̃_in(i))` per edge, with `d̃_in(i) = |N(i)| + 1` and
/// `d̃_out(j)` = the augmented edges reading `j` (its reads in the block, plus 1
/// if `j < num_dst`). `Â (X·W)` when `d_in > d_out`, else `(Â X)·W`.
fn gcn(
    g: &mut GraphBuilder,
    spec: &LayerSpec,
    params: &[Vec<f32>],
    names: &[String],
    h: &str,
    block: &BlockValues,
) -> String {
    let (d_in, d_out) = (spec.d_in, spec.d_out);
    let w = g.param(&names[0], &dims(d_in, d_out), &params[0]);
    let bias = g.param(&names[1], &[d_out as i64], &params[1]);
    // The augmented edge list: the block's edges, then a self-loop per destination.
    let loops = g.arange(&block.num_dst);
    let aug = BlockValues {
        src: g.concat0(&block.src, &loops),
        dst: g.concat0(&block.dst, &loops),
        num_dst: block.num_dst.clone(),
    };
    let e = Edges::new(g, &aug);
    // d̃_out over all sources (clamped to 1 for sources no edge reads, as cpu_ops).
    let num_src = g.rows_of(h);
    let ones = ones_like_edges(g, &aug.src);
    let zeros = g.filled(&num_src, &[], 0.0);
    let src_idx = g.unsqueeze(&aug.src, 1);
    let d_out_deg = g.scatter_rows(&zeros, &src_idx, &ones, "add");
    let d_out_deg = g.max_scalar(&d_out_deg, 1.0);
    let src_w = g.unary("Sqrt", &d_out_deg);
    let src_w = g.unary("Reciprocal", &src_w);
    let src_w = column(g, &src_w);
    // d̃_in ≥ 1 always (the self-loop).
    let d_in_deg = e.in_degree(g);
    let dst_w = g.unary("Sqrt", &d_in_deg);
    let dst_w = g.unary("Reciprocal", &dst_w);
    let dst_w = column(g, &dst_w);
    let norm_agg = |g: &mut GraphBuilder, y: &str, width: usize| {
        let scaled = g.mul(y, &src_w);
        let s = e.sum(g, &scaled, width);
        g.mul(&s, &dst_w)
    };
    let out = if d_in > d_out {
        let p = g.matmul(h, &w);
        norm_agg(g, &p, d_out)
    } else {
        let a = norm_agg(g, h, d_in);
        g.matmul(&a, &w)
    };
    g.add(&out, &bias)
}

/// `z = X·W`; per head, edge scores `LeakyReLU_{0.2}(a_src·z_j + a_dst·z_i)`,
/// softmax over each destination's in-edges (minus the per-destination max,
/// by scatter-max), `o_i = Σ α z_j`; `o + b`, heads concatenated (hidden) or
/// averaged (top). A destination without edges gets `b` (its `o` is 0).
fn gat(
    g: &mut GraphBuilder,
    spec: &LayerSpec,
    params: &[Vec<f32>],
    names: &[String],
    h: &str,
    block: &BlockValues,
) -> String {
    let (heads, f) = (spec.heads, spec.head_dim);
    let width = heads * f;
    let w = g.param(&names[0], &dims(spec.d_in, width), &params[0]);
    let a_src = g.param(&names[1], &dims(heads, f), &params[1]);
    let a_dst = g.param(&names[2], &dims(heads, f), &params[2]);
    let bias_dims: Vec<i64> = if spec.last {
        dims(heads, f).to_vec()
    } else {
        vec![width as i64]
    };
    let bias = g.param(&names[3], &bias_dims, &params[3]);
    let e = Edges::new(g, block);
    let z = g.matmul(h, &w);
    let z3 = g.reshape(&z, &[0, heads as i64, f as i64]);
    let score = |g: &mut GraphBuilder, a: &str| {
        let p = g.mul(&z3, a);
        g.reduce("ReduceSum", &p, 2)
    };
    let el = score(g, &a_src);
    let er = score(g, &a_dst);
    let el_e = g.gather_rows(&el, &block.src);
    let er_e = g.gather_rows(&er, &block.dst);
    let u = g.add(&el_e, &er_e);
    let s = g.op(
        "LeakyRelu",
        &[&u],
        vec![("alpha", Attr::Float(GAT_NEGATIVE_SLOPE as f32))],
        "leaky_relu",
    );
    let lowest = g.filled(&block.num_dst, &[heads as i64], f32::NEG_INFINITY);
    let m = g.scatter_rows(&lowest, &e.dst_idx, &s, "max");
    let m_e = g.gather_rows(&m, &block.dst);
    let shifted = g.sub(&s, &m_e);
    let p = g.unary("Exp", &shifted);
    let zeros = g.filled(&block.num_dst, &[heads as i64], 0.0);
    let den = g.scatter_rows(&zeros, &e.dst_idx, &p, "add");
    let den_e = g.gather_rows(&den, &block.dst);
    let alpha = g.div(&p, &den_e);
    let alpha = g.unsqueeze(&alpha, 2);
    let z_e = g.gather_rows(&z3, &block.src);
    let msg = g.mul(&z_e, &alpha);
    let zeros = g.filled(&block.num_dst, &[heads as i64, f as i64], 0.0);
    let o = g.scatter_rows(&zeros, &e.dst_idx, &msg, "add");
    if spec.last {
        let ob = g.add(&o, &bias);
        g.reduce("ReduceMean", &ob, 1)
    } else {
        let o = g.reshape(&o, &[0, width as i64]);
        g.add(&o, &bias)
    }
}
