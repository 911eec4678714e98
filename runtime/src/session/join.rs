//! A session joining a data-parallel job ([`Trainer::set_communicator`]): the
//! checks every rank agrees on, the partitioned feature store, and the executor
//! wrapped as one rank (`executor/step/data_parallel.rs`); what evaluation keeps
//! of the job ([`Dist`]).

use std::sync::Arc;

use super::{evaluate, Spent, Trainer};
use crate::config::{DistFeatures, DistFullEval, DistReduce};
use crate::dist::features::PartitionedFeatures;
use crate::dist::{Communicator, Solo};
use crate::engine::sparse_rows_where;
use crate::error::{Error, Result};
use crate::executor::step::data_parallel::nccl_lacks;
use crate::executor::DistSetup;

/// A trainer's part in a distributed job ([`Trainer::set_communicator`]), as
/// evaluation needs it (the executor keeps the training side).
pub(super) struct Dist {
    pub(super) comm: Arc<dyn Communicator>,
    /// `dist.features = "partitioned"` with more than one rank.
    pub(super) features: Option<Arc<PartitionedFeatures>>,
    /// Full-graph evaluation is sharded over the ranks (`dist.full_eval`).
    pub(super) shard_full_eval: bool,
    /// The sharded evaluation's block and GCN input scale, made by the first
    /// evaluation (the graph, this rank's range and the model kind are fixed).
    pub(super) shard_block: Option<evaluate::ShardBlock>,
}

impl Dist {
    pub(super) fn solo() -> Self {
        Self {
            comm: Arc::new(Solo),
            features: None,
            shard_full_eval: false,
            shard_block: None,
        }
    }

    pub(super) fn ranks(&self) -> usize {
        self.comm.size()
    }
}

impl Trainer {
    /// Makes this trainer rank `comm.rank()` of a data-parallel job of
    /// `comm.size()` ranks (see [`crate::dist`]); collective: every rank calls it,
    /// with the same configuration and dataset (checked: a rank whose
    /// configuration or dataset shape differs is an error on every rank). With
    /// `dist.features = "partitioned"` each rank from then on reads only its own
    /// feature rows and fills its remote-row cache here.
    ///
    /// Each rank trains its share of every batch on its device and the
    /// gradients are summed over the communicator on the host
    /// (`executor/step/data_parallel.rs`); `policy = "auto"` keeps its starting
    /// placement (`gpu-sample-gpu-gather`) instead of measuring, so that every
    /// rank runs the same one. With partitioned features every batch's input
    /// rows are gathered on the host through the exchange and uploaded; the
    /// device never loads the whole feature matrix.
    ///
    /// With `dist.reduce = "nccl"` (or `"auto"` finding NCCL and a GPU on
    /// every rank) the gradients are summed on the device instead
    /// (`docs/distributed.md`, "NCCL").
    ///
    /// Errors (on every rank alike): more than one rank with layer-based
    /// orchestration (not built yet), or a trainer that already trained with
    /// another communicator. `dist.reduce = "nccl"` on a rank without NCCL or a
    /// GPU is an error on that rank. A failure after the ranks agreed leaves
    /// the trainer unusable (build a new one).
    pub fn set_communicator(&mut self, comm: Arc<dyn Communicator>) -> Result<()> {
        self.join(comm, false)
    }

    /// [`Trainer::set_communicator`]; `host_copy_reduce` sums the gradients on
    /// the device through host copies (the step `dist.reduce = "nccl"` takes,
    /// checkable on the host backend).
    pub(super) fn join(
        &mut self,
        comm: Arc<dyn Communicator>,
        host_copy_reduce: bool,
    ) -> Result<()> {
        if self.cfg.dist.reduce == DistReduce::Nccl {
            // Decided on each rank alone, before any collective: every rank
            // has the same configuration, and a rank that lacks NCCL fails the
            // job (its error printed, the others stopped) instead of hanging it.
            if let Some(why) = nccl_lacks(self.state_ref()?.device_kind()) {
                return Err(Error::invalid_argument(
                    "dist.reduce",
                    format!(
                        "\"nccl\": {why}; dist.reduce = \"mpi\" or \"auto\" sums the \
                         gradients over MPI"
                    ),
                ));
            }
        }
        let distributed = comm.size() > 1;
        if distributed && self.cfg.orchestration.reuses_embeddings() {
            return Err(Error::invalid_argument(
                "orchestration.policy",
                format!(
                    "distributed training ({} ranks) runs step-based placements: \
                     layer-based orchestration (policy = \"layer\" with hot_ratio > 0) \
                     across ranks is not built yet",
                    comm.size()
                ),
            ));
        }
        if self.dist.ranks() > 1 || self.steps() > 0 && distributed {
            return Err(Error::invalid_argument(
                "communicator",
                "set it once, before training: the ranks must start from the same weights",
            ));
        }
        // Every rank must train the same configuration on the same graph.
        let ds = &self.ds;
        let fingerprint = format!(
            "{}|{}|{}|{}|{}",
            self.cfg.to_toml(),
            ds.num_vertices(),
            ds.graph.num_edges(),
            ds.features.dim(),
            ds.num_classes
        );
        if !crate::dist::ranks_agree(&*comm, xxhash_rust::xxh3::xxh3_64(fingerprint.as_bytes()))? {
            return Err(Error::Dist {
                what: format!(
                    "rank {}: the ranks disagree on the configuration or the dataset's shape \
                     (every rank must load the same config file and dataset)",
                    comm.rank()
                ),
            });
        }
        let features = if distributed && self.cfg.dist.features == DistFeatures::Partitioned {
            let channel = comm.duplicate()?;
            let cache = self.cfg.dist.remote_cache_rows;
            let parts = match &self.cfg.dist.partition_file {
                Some(path) => Some(crate::dist::read_partition_file(
                    path,
                    ds.num_vertices(),
                    comm.size(),
                )?),
                None => None,
            };
            // Sparse input rows: this rank's own rows only (never another
            // rank's); dense ones travel as bfloat16 when the device stores
            // bfloat16 rows.
            let local = if self.state_ref()?.sparse_input() {
                let (rank, ranks, n) = (comm.rank(), comm.size(), ds.num_vertices());
                let own = crate::dist::share(n, rank, ranks);
                let p = parts.as_deref();
                let keep = |v| crate::dist::features::owned_by(p, &own, rank, v);
                let pool = Arc::clone(&self.pool);
                Some(Arc::new(
                    pool.install(|| sparse_rows_where(&ds.features, keep))?,
                ))
            } else {
                None
            };
            let bf16 = self.cfg.device.feature_dtype == gpu_ops::FeatureDtype::Bf16;
            let pool = Arc::clone(&self.pool);
            let pf = pool.install(|| {
                PartitionedFeatures::new(ds, channel, cache, parts, local.as_deref(), bf16)
            })?;
            Some((Arc::new(pf), local))
        } else {
            None
        };
        let (features, local_sparse) = match features {
            Some((f, l)) => (Some(f), l),
            None => (None, None),
        };
        if distributed {
            if self.cfg.orchestration.is_auto() {
                // Ranks measuring placements each on their own could choose
                // differently; every rank keeps the starting placement.
                self.device_note.push_str(&format!(
                    "; policy = \"auto\" keeps {} on every rank of a distributed job",
                    scheduler::Orchestration::GpuSampleGpuGather
                ));
            }
            let exec = std::mem::replace(&mut self.exec, Box::new(Spent));
            self.exec = exec.distribute(DistSetup {
                comm: Arc::clone(&comm),
                features: features.clone(),
                local_sparse,
                reduce: self.cfg.dist.reduce,
                host_copy_reduce,
            })?;
            self.exec.set_tracer(&self.tracer, self.acc_track);
        }
        let shard_full_eval = distributed
            && match self.cfg.dist.full_eval {
                DistFullEval::Sharded => true,
                DistFullEval::Replicated => false,
                DistFullEval::Auto => {
                    // One rank per machine has local rank 0.
                    let mut machines = [f64::from(u8::from(comm.local_rank() == 0))];
                    comm.all_reduce_sum_f64(&mut machines)?;
                    machines[0] > 1.0
                }
            };
        self.dist = Dist {
            comm,
            features,
            shard_full_eval,
            shard_block: None,
        };
        Ok(())
    }
}
