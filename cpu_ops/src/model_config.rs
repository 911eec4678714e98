//! A GNN model's configuration, shared by the crates that build, train, export
//! and check models: its kind and shape ([`ModelConfig`], validated), one layer's
//! shape ([`LayerSpec`]), and the input of layer 0 ([`ModelInput`], dense or
//! sparse rows).
//!
//! The models themselves — GCN, GraphSAGE-mean and GAT, forward, backward and
//! initialization — are written once in `gpu_ops::model`, over the backend op
//! families, and run on the host backend and on CUDA alike. A model of `L`
//! layers runs on `L` blocks (bottom first): layer `l` maps block `l`'s sources
//! (`n_src × d_in`, row-major) to its destinations (`n_dst × d_out`); `d_in` is
//! `in_dim` for layer 0 and `hidden` above, `d_out` is `hidden` below the top and
//! `num_classes` at the top.

use crate::error::{CpuOpsError, Result};
use crate::real::Real;
use crate::sparse::SparseRows;

/// The input of layer 0: dense row-major values or sparse rows.
#[derive(Clone, Copy, Debug)]
pub enum ModelInput<'a, T: Real> {
    /// `num_src(blocks[0]) × in_dim` values, row-major.
    Dense(&'a [T]),
    /// `num_src(blocks[0])` rows of `in_dim` columns.
    Sparse(&'a SparseRows<T>),
}

impl<T: Real> ModelInput<'_, T> {
    /// Whether this is [`ModelInput::Sparse`].
    pub fn is_sparse(&self) -> bool {
        matches!(self, ModelInput::Sparse(_))
    }
}

/// The layer family of a model (`model.kind` in a config file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum ModelKind {
    /// `GraphConv(norm="both")` with self-loops, ReLU between layers.
    Gcn,
    /// `SAGEConv(aggregator_type="mean")`, ReLU between layers.
    #[default]
    Sage,
    /// `GATConv` with `heads` heads, ELU between layers, heads averaged at the top.
    Gat,
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Gcn => "gcn",
            Self::Sage => "sage",
            Self::Gat => "gat",
        })
    }
}

/// The shape and hyper-parameters of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Layer family.
    pub kind: ModelKind,
    /// Input feature width (at least 1).
    pub in_dim: usize,
    /// Hidden width (at least 1 when `num_layers > 1`; for GAT the concatenation of
    /// all heads, so a multiple of `heads`).
    pub hidden: usize,
    /// Number of classes: the width of the logits (at least 1).
    pub num_classes: usize,
    /// Number of layers (at least 1), one block each.
    pub num_layers: usize,
    /// Attention heads (GAT only, at least 1; ignored otherwise).
    pub heads: usize,
    /// Dropout probability on hidden representations, in `[0, 1)`.
    pub dropout: f32,
}

impl ModelConfig {
    /// Checks the fields ([`CpuOpsError::InvalidArgument`] naming the first bad
    /// one): at least one layer, `in_dim` and `num_classes` at least 1, `hidden`
    /// at least 1 with more than one layer, `dropout` in `[0, 1)`, and for GAT at
    /// least one head dividing `hidden`.
    pub fn validate(&self) -> Result<()> {
        let bad =
            |name: &'static str, reason: String| Err(CpuOpsError::InvalidArgument { name, reason });
        if self.num_layers == 0 {
            return bad("num_layers", "a model needs at least 1 layer".into());
        }
        if self.in_dim == 0 {
            return bad("in_dim", "expected at least 1".into());
        }
        if self.num_classes == 0 {
            return bad("num_classes", "expected at least 1".into());
        }
        if self.num_layers > 1 && self.hidden == 0 {
            return bad(
                "hidden",
                "expected at least 1 with more than one layer".into(),
            );
        }
        if !(self.dropout.is_finite() && (0.0..1.0).contains(&self.dropout)) {
            return bad(
                "dropout",
                format!("expected a value in [0, 1), got {}", self.dropout),
            );
        }
        if self.kind == ModelKind::Gat {
            if self.heads == 0 {
                return bad("heads", "GAT needs at least 1 head".into());
            }
            if self.num_layers > 1 && !self.hidden.is_multiple_of(self.heads) {
                return bad(
                    "hidden",
                    format!(
                        "{} is not a multiple of heads = {}",
                        self.hidden, self.heads
                    ),
                );
            }
        }
        Ok(())
    }
}

/// One layer's shape (a device model's `layer_specs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    /// Input width.
    pub d_in: usize,
    /// Output width (GAT's last layer: `num_classes`, after averaging heads).
    pub d_out: usize,
    /// GAT heads (1 otherwise).
    pub heads: usize,
    /// GAT head width `F` (`d_out` otherwise).
    pub head_dim: usize,
    /// Whether this is the top layer (logits, no activation; GAT averages heads).
    pub last: bool,
    /// Index of the layer's first tensor in the parameter list.
    pub first_param: usize,
}

impl LayerSpec {
    /// `heads × head_dim`: the width of a GAT layer's projection (`d_out` otherwise).
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> ModelConfig {
        ModelConfig {
            kind: ModelKind::Gat,
            in_dim: 5,
            hidden: 6,
            num_classes: 3,
            num_layers: 2,
            heads: 2,
            dropout: 0.5,
        }
    }

    #[test]
    fn invalid_configs_name_the_field() {
        assert!(good().validate().is_ok());
        type Edit = Box<dyn Fn(&mut ModelConfig)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("num_layers", Box::new(|c| c.num_layers = 0)),
            ("in_dim", Box::new(|c| c.in_dim = 0)),
            ("num_classes", Box::new(|c| c.num_classes = 0)),
            ("hidden", Box::new(|c| c.hidden = 0)),
            ("hidden", Box::new(|c| c.hidden = 7)),
            ("heads", Box::new(|c| c.heads = 0)),
            ("dropout", Box::new(|c| c.dropout = 1.0)),
            ("dropout", Box::new(|c| c.dropout = -0.1)),
            ("dropout", Box::new(|c| c.dropout = f32::NAN)),
        ];
        for (field, edit) in cases {
            let mut cfg = good();
            edit(&mut cfg);
            match cfg.validate() {
                Err(CpuOpsError::InvalidArgument { name, .. }) => {
                    assert_eq!(name, field, "{cfg:?}")
                }
                other => panic!("{cfg:?}: expected an error naming {field}, got {other:?}"),
            }
        }
        // One layer needs no hidden width; heads only matter for GAT.
        let mut one = ModelConfig {
            kind: ModelKind::Sage,
            hidden: 0,
            num_layers: 1,
            heads: 0,
            ..good()
        };
        assert!(one.validate().is_ok());
        one.kind = ModelKind::Gat;
        one.heads = 3;
        assert!(one.validate().is_ok());
    }

    #[test]
    fn a_layer_is_as_wide_as_its_heads() {
        let spec = LayerSpec {
            d_in: 4,
            d_out: 3,
            heads: 2,
            head_dim: 3,
            last: true,
            first_param: 0,
        };
        assert_eq!(spec.width(), 6);
    }
}
