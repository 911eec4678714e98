//! `model.task` and `[link]` resolved for a dataset into the run's task
//! (`crate::task`): what the session batches and evaluates and what the
//! executors train against. Bad combinations are refused here, before
//! anything is loaded, with one line naming the key or field.

use std::sync::Arc;

use crate::config::{ExcludeKind, NegativeSamplerKind, TaskKind, TrainConfig};
use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::task::link::{Exclude, LinkTask, NegativeDist};
use crate::task::Task;

/// The task `cfg` asks for on `ds`.
pub(crate) fn task(cfg: &TrainConfig, ds: &Dataset) -> Result<Task> {
    if cfg.model.task == TaskKind::Node {
        return Ok(Task::Node);
    }
    let Some(split) = &ds.edges else {
        return Err(Error::invalid_argument(
            "model.task",
            format!(
                "\"link\" needs a dataset with an edge split (train/val/test edges), and `{}` has \
                 none: make one with `tandem generate sbm --edge-split 0.85,0.05,0.1`, `tandem \
                 import edgelist --edge-split ...` or DatasetBuilder::edge_split",
                ds.name
            ),
        ));
    };
    let l = &cfg.link;
    let n = ds.num_vertices();
    if l.negatives as usize > n {
        return Err(Error::config_value(
            "link.negatives",
            format!("at most the vertex count ({n})"),
            l.negatives.to_string(),
        ));
    }
    if split.train.is_empty() {
        return Err(Error::invalid_argument(
            "edges.train",
            "the link task needs training edges: the split has none",
        ));
    }
    let cdf = match l.negative_sampler {
        NegativeSamplerKind::Uniform => None,
        NegativeSamplerKind::Degree => {
            let degrees: Vec<u32> = (0..n as u32).map(|v| ds.graph.degree(v) as u32).collect();
            Some(Arc::new(
                cpu_ops::negative_cdf(&degrees, 0.75)
                    .map_err(|e| Error::cpu_ops("link.negative_sampler", e))?,
            ))
        }
    };
    let dist = NegativeDist {
        num_vertices: n,
        cdf,
    };
    let exclude = match (l.exclude, split.symmetric) {
        (ExcludeKind::None, _) => Exclude::None,
        (ExcludeKind::SelfEdges, _) | (ExcludeKind::Auto, false) => Exclude::SelfEdges,
        (ExcludeKind::Reverse, _) | (ExcludeKind::Auto, true) => Exclude::Reverse,
    };
    Ok(Task::Link(LinkTask {
        src: split.train.src.clone(),
        dst: split.train.dst.clone(),
        negatives: l.negatives as usize,
        dist,
        exclude,
    }))
}
