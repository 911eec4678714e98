//! Choosing hot vertices by the PCIe bytes they save per CPU microsecond, and
//! sizing the set by the CPU's measured throughput.
//!
//! A hot vertex `v` computed on the CPU saves the accelerator its layer-0 row:
//! the feature rows of `v` and of its sampled neighbors need not cross PCIe for
//! `v` — but a row that another (cold) destination of the batch also samples, or
//! that the device cache holds, crosses anyway (or never did). Ranking by touch
//! counts (GNNLab's pre-sampling) or degree ignores both and the CPU cost, which
//! grows with the neighbors drawn. Here, per vertex:
//!
//! 1. **Uses.** `out_uses[v]`: pre-sampled batches that need `v`'s layer-0 row
//!    (`Touch::BottomOutputs`); `in_uses[u]`: batches that read `u`'s feature row
//!    (`Touch::BottomInputs`). Both from the same pre-sampling run.
//! 2. **Draws.** `v` draws `k_v = min(deg v, fanout)` of its `deg v` neighbors, so
//!    neighbor `u` is read for `v` in a share `k_v / deg v` of `v`'s uses, i.e.
//!    `out_uses[v] · k_v / deg v` batches.
//! 3. **Exclusive share** of `u` for `v`: `min(1, out_uses[v] · k_v / deg v /
//!    in_uses[u])`, the fraction of `u`'s reads that come through `v` (1 for a
//!    neighbor only `v` reaches, near 0 for a row every batch reads anyway); `v`'s
//!    own row counts with `min(1, out_uses[v] / in_uses[v])`; a cached row
//!    saves nothing.
//! 4. **Bytes saved per use**: `row_bytes · (own + k_v / deg v · Σ_u exclusive(u))`,
//!    summed over `u`'s uncached neighbors.
//! 5. **CPU cost per use** (µs): `fixed_us + per_row_us · (k_v + 1)`, from the
//!    measured kernel (`tandem bench hot`: the projection and draw are per row,
//!    the aggregation per feature row read).
//! 6. **Value** = bytes saved per use / CPU cost per use (bytes per CPU µs). The
//!    hot order is by value, highest first ([`pcie_value_order`]); a vertex of
//!    value 0 (nothing saved) is never hot.
//! 7. **Size** ([`size_by_throughput`]): take vertices in that order while the
//!    CPU time they need per super-batch, `Σ cost · out_uses / batches ·
//!    super_batch`, fits `workers · super-batch time` (both measured); the
//!    epoch-time monitor ([`ShareController`](crate::ShareController)) then
//!    corrects the share from the measured epoch time.

use cpu_ops::CsrGraph;

use crate::error::{invalid, Result};

/// The measured CPU cost of one hot row (step 5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowCost {
    /// µs per row whatever its neighbors (draw, projection, epilogue).
    pub fixed_us: f64,
    /// µs per feature row read (the aggregation).
    pub per_row_us: f64,
}

impl RowCost {
    /// `tandem bench hot` at 512 columns, bf16 rows, hidden 256 (2-core
    /// machine, 2026-11-26; docs/performance.md): about 6 µs of draw and
    /// projection per row and 0.14 µs per feature row read. Only the ratio of
    /// the two terms orders vertices ([`pcie_values`]); `hotness = "pcie"`
    /// ranks with it.
    pub const REFERENCE: RowCost = RowCost {
        fixed_us: 6.0,
        per_row_us: 0.14,
    };

    /// [`RowCost::REFERENCE`] scaled to a layer 0 of `d_in` input columns stored
    /// in `value_bytes` bytes each and `d_out` output columns: the fixed term by
    /// the projection's multiply-adds (`d_in · d_out`, compute-bound), the
    /// per-row term by the bytes one feature row reads (`d_in · value_bytes`,
    /// bandwidth-bound). Deterministic, so the hot set does not depend on the
    /// machine's timing; only the ratio of the terms orders vertices, and it
    /// moves with `d_out` and the row dtype (a wide projection makes the
    /// per-vertex cost matter less than the neighbors it reads). A zero shape
    /// gives the reference.
    pub fn for_layer(d_in: usize, d_out: usize, value_bytes: usize) -> RowCost {
        const REF_IN: f64 = 512.0;
        const REF_OUT: f64 = 256.0;
        const REF_VALUE_BYTES: f64 = 2.0;
        if d_in == 0 || d_out == 0 || value_bytes == 0 {
            return Self::REFERENCE;
        }
        let (d_in, d_out, vb) = (d_in as f64, d_out as f64, value_bytes as f64);
        RowCost {
            fixed_us: Self::REFERENCE.fixed_us * (d_in * d_out) / (REF_IN * REF_OUT),
            per_row_us: Self::REFERENCE.per_row_us * (d_in * vb) / (REF_IN * REF_VALUE_BYTES),
        }
    }
}

/// What [`pcie_values`] needs besides the graph.
#[derive(Clone, Copy, Debug)]
pub struct ValueInputs<'a> {
    /// Per vertex: pre-sampled batches needing its layer-0 row (step 1).
    pub out_uses: &'a [u32],
    /// Per vertex: pre-sampled batches reading its feature row (step 1).
    pub in_uses: &'a [u32],
    /// Per vertex: whether the device cache holds its feature row.
    pub cached: &'a [bool],
    /// The bottom layer's fanout.
    pub fanout: u32,
    /// Bytes of one feature row as the device stores it.
    pub row_bytes: u64,
    /// The CPU's cost per row.
    pub cost: RowCost,
}

/// Step 6 for every vertex: PCIe bytes saved per CPU µs (0 for a vertex no
/// batch needs). Fails when a per-vertex slice is not one entry per vertex or a
/// cost is not finite and positive.
pub fn pcie_values(graph: &CsrGraph, inp: &ValueInputs<'_>) -> Result<Vec<f64>> {
    let n = graph.num_vertices();
    for (name, len) in [
        ("out_uses", inp.out_uses.len()),
        ("in_uses", inp.in_uses.len()),
        ("cached", inp.cached.len()),
    ] {
        if len != n {
            return Err(invalid(name, format!("one entry per vertex ({n})"), len));
        }
    }
    let RowCost {
        fixed_us,
        per_row_us,
    } = inp.cost;
    if !(fixed_us.is_finite() && per_row_us.is_finite() && fixed_us >= 0.0 && per_row_us >= 0.0)
        || fixed_us + per_row_us <= 0.0
    {
        return Err(invalid(
            "row cost",
            "finite, non-negative µs, not both 0",
            format!("{fixed_us} + {per_row_us}/row"),
        ));
    }
    if inp.fanout == 0 {
        return Err(invalid("fanout", "at least 1", 0));
    }
    let exclusive = |through: f64, u: usize| -> f64 {
        if inp.cached[u] {
            return 0.0;
        }
        match inp.in_uses[u] {
            0 => 1.0,
            reads => (through / f64::from(reads)).min(1.0),
        }
    };
    let offsets = graph.offsets().as_slice();
    let indices = graph.indices().as_slice();
    Ok((0..n)
        .map(|v| {
            let uses = f64::from(inp.out_uses[v]);
            if uses == 0.0 {
                return 0.0;
            }
            let row = &indices[offsets[v] as usize..offsets[v + 1] as usize];
            let deg = row.len();
            let k = deg.min(inp.fanout as usize);
            let drawn = if deg == 0 { 0.0 } else { k as f64 / deg as f64 };
            let through = uses * drawn;
            let neighbors: f64 = row.iter().map(|&u| exclusive(through, u as usize)).sum();
            let rows = exclusive(uses, v) + drawn * neighbors;
            let bytes = inp.row_bytes as f64 * rows;
            bytes / (fixed_us + per_row_us * (k + 1) as f64)
        })
        .collect())
}

/// Step 6's order: vertices of positive value, highest first (ties by id).
pub fn pcie_value_order(values: &[f64]) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..values.len() as u32)
        .filter(|&v| values[v as usize] > 0.0)
        .collect();
    ids.sort_by(|&a, &b| {
        values[b as usize]
            .total_cmp(&values[a as usize])
            .then(a.cmp(&b))
    });
    ids
}

/// Step 7: how many of `order` the CPU keeps up with: the longest prefix whose
/// CPU time per super-batch, `Σ cost(v) · out_uses[v] · super_batch / batches`,
/// is at most `workers · super_batch_us`. `batches` is the number of pre-sampled
/// batches the uses were counted over.
pub fn size_by_throughput(
    graph: &CsrGraph,
    order: &[u32],
    inp: &ValueInputs<'_>,
    batches: u64,
    super_batch: usize,
    workers: usize,
    super_batch_us: f64,
) -> Result<usize> {
    if batches == 0 {
        return Err(invalid("batches", "at least 1 pre-sampled batch", 0));
    }
    if !(super_batch_us.is_finite() && super_batch_us >= 0.0) {
        return Err(invalid(
            "super-batch time",
            "finite, non-negative µs",
            super_batch_us,
        ));
    }
    let budget = workers as f64 * super_batch_us;
    let per_sb = super_batch as f64 / batches as f64;
    let mut spent = 0.0;
    for (i, &v) in order.iter().enumerate() {
        let k = graph.degree(v).min(inp.fanout as usize);
        let cost = inp.cost.fixed_us + inp.cost.per_row_us * (k + 1) as f64;
        spent += cost * f64::from(inp.out_uses[v as usize]) * per_sb;
        if spent > budget {
            return Ok(i);
        }
    }
    Ok(order.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpu_ops::BuildOptions;

    /// Vertex 0 has 10 private leaves (10..20, only it reaches them); vertex 1 has
    /// 10 neighbors (20..30) that every batch reads anyway; vertex 2 has 10
    /// private leaves (30..40) that the device cache holds. Vertex 3 has 40
    /// private leaves (40..80): more bytes saved than vertex 0, at a higher CPU cost.
    fn graph() -> CsrGraph {
        let mut e = Vec::new();
        for u in 10..20 {
            e.push((u, 0));
        }
        for u in 20..30 {
            e.push((u, 1));
        }
        for u in 30..40 {
            e.push((u, 2));
        }
        for u in 40..80 {
            e.push((u, 3));
        }
        CsrGraph::from_edges(80, &e, BuildOptions::DIRECTED).unwrap()
    }

    fn inputs<'a>(
        out_uses: &'a [u32],
        in_uses: &'a [u32],
        cached: &'a [bool],
        fanout: u32,
        cost: RowCost,
    ) -> ValueInputs<'a> {
        ValueInputs {
            out_uses,
            in_uses,
            cached,
            fanout,
            row_bytes: 1000,
            cost,
        }
    }

    #[test]
    fn the_vertex_whose_neighbors_only_it_needs_comes_first() {
        let g = graph();
        // 100 pre-sampled batches; 0..4 are each needed in 10 of them.
        let mut out_uses = vec![0u32; 80];
        out_uses[..4].fill(10);
        let mut in_uses = vec![0u32; 80];
        in_uses[..4].fill(10);
        in_uses[10..20].fill(10); // only through vertex 0 (fanout 10 takes them all)
        in_uses[20..30].fill(100); // every batch
        in_uses[30..40].fill(10);
        in_uses[40..80].fill(10 * 10 / 40); // vertex 3 draws 10 of 40
        let mut cached = vec![false; 80];
        cached[30..40].fill(true);
        let cost = RowCost {
            fixed_us: 5.0,
            per_row_us: 0.5,
        };
        let inp = inputs(&out_uses, &in_uses, &cached, 10, cost);
        let v = pcie_values(&g, &inp).unwrap();
        // Vertex 0: own row + 10 private rows = 11 000 bytes per use, 5 + 0.5·11
        // = 10.5 µs. Vertex 1: own + 10 × 0.1. Vertex 2: own only (cached
        // leaves). Vertex 3: own + 10/40 × 40 × min(1, 2.5/2) = 11 rows, same cost.
        assert!((v[0] - 11_000.0 / 10.5).abs() < 1e-6, "{v:?}");
        assert!((v[1] - 2_000.0 / 10.5).abs() < 1e-6, "{v:?}");
        assert!((v[2] - 1_000.0 / 10.5).abs() < 1e-6, "{v:?}");
        assert!((v[3] - 11_000.0 / 10.5).abs() < 1e-6, "{v:?}");
        assert_eq!(v[10], 0.0, "no batch needs a leaf's layer-0 row");
        assert_eq!(pcie_value_order(&v), vec![0, 3, 1, 2]);

        // A fanout of 40: vertex 3 reads all its 41 rows, costs 2.4x as much CPU
        // time and saves 3.7x the bytes, so it comes first.
        let mut in40 = in_uses.clone();
        in40[40..80].fill(10);
        let inp40 = ValueInputs {
            in_uses: &in40,
            ..inputs(&out_uses, &in_uses, &cached, 40, cost)
        };
        let v40 = pcie_values(&g, &inp40).unwrap();
        assert!((v40[3] - 41_000.0 / 25.5).abs() < 1e-6, "{v40:?}");
        assert_eq!(pcie_value_order(&v40)[0], 3);

        // The same, but every batch reads vertex 3's leaves anyway (they are some
        // cold vertices' neighbors too): computing it saves a tenth of them, and
        // the vertex whose neighbors only it needs is first again (a degree or
        // touch-count order would still put vertex 3 first).
        let mut shared = in40.clone();
        shared[40..80].fill(100);
        let vs = pcie_values(
            &g,
            &ValueInputs {
                in_uses: &shared,
                ..inp40
            },
        )
        .unwrap();
        assert!((vs[3] - 5_000.0 / 25.5).abs() < 1e-6, "{vs:?}");
        assert_eq!(pcie_value_order(&vs), vec![0, 3, 1, 2]);
    }

    #[test]
    fn the_set_is_sized_by_the_cpu_time_a_super_batch_leaves() {
        let g = graph();
        let out_uses = {
            let mut u = vec![0u32; 80];
            u[..4].fill(10);
            u
        };
        let in_uses = vec![10u32; 80];
        let cached = vec![false; 80];
        let cost = RowCost {
            fixed_us: 5.0,
            per_row_us: 0.5,
        };
        let inp = inputs(&out_uses, &in_uses, &cached, 10, cost);
        let order = [0u32, 3, 1, 2];
        // 100 batches counted; super-batches of 10: each vertex is needed once per
        // super-batch and costs 10.5 µs.
        let size =
            |workers, us| size_by_throughput(&g, &order, &inp, 100, 10, workers, us).unwrap();
        assert_eq!(size(1, 10.0), 0);
        assert_eq!(size(1, 10.5), 1);
        assert_eq!(size(1, 30.0), 2);
        assert_eq!(size(2, 21.0), 4);
        assert_eq!(size(4, 1e9), 4);
        assert!(size_by_throughput(&g, &order, &inp, 0, 10, 1, 1.0).is_err());
    }

    #[test]
    fn the_row_cost_scales_with_the_layer_shape() {
        assert_eq!(RowCost::for_layer(512, 256, 2), RowCost::REFERENCE);
        assert_eq!(RowCost::for_layer(0, 256, 2), RowCost::REFERENCE);
        let f32_rows = RowCost::for_layer(512, 256, 4);
        assert_eq!(f32_rows.fixed_us, RowCost::REFERENCE.fixed_us);
        assert_eq!(f32_rows.per_row_us, 2.0 * RowCost::REFERENCE.per_row_us);
        let narrow = RowCost::for_layer(100, 64, 4);
        let ratio = |c: RowCost| c.fixed_us / c.per_row_us;
        // The per-vertex term shrinks with the projection's width, the
        // per-neighbor one with the row's bytes: 64 / 256 · 2 / 4 of the ratio.
        let want = ratio(RowCost::REFERENCE) * (64.0 / 256.0) * (2.0 / 4.0);
        assert!((ratio(narrow) - want).abs() < 1e-9 * want, "{narrow:?}");
        assert!((narrow.fixed_us - 6.0 * 100.0 * 64.0 / (512.0 * 256.0)).abs() < 1e-12);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let g = graph();
        let z = vec![0u32; 80];
        let c = vec![false; 80];
        let ok = RowCost {
            fixed_us: 1.0,
            per_row_us: 0.0,
        };
        assert!(pcie_values(&g, &inputs(&z[..79], &z, &c, 5, ok)).is_err());
        assert!(pcie_values(&g, &inputs(&z, &z, &c[..3], 5, ok)).is_err());
        assert!(pcie_values(&g, &inputs(&z, &z, &c, 0, ok)).is_err());
        let zero = RowCost {
            fixed_us: 0.0,
            per_row_us: 0.0,
        };
        assert!(pcie_values(&g, &inputs(&z, &z, &c, 5, zero)).is_err());
        let nan = RowCost {
            fixed_us: f64::NAN,
            per_row_us: 1.0,
        };
        assert!(pcie_values(&g, &inputs(&z, &z, &c, 5, nan)).is_err());
        assert_eq!(
            pcie_values(&g, &inputs(&z, &z, &c, 5, ok)).unwrap(),
            vec![0.0; 80]
        );
    }
}
