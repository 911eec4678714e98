//! Step 4 of the layer path's device half (`device/mod.rs`): a batch trained
//! with hot rows read from a slab in place of layer 0's outputs at their
//! positions.

use std::sync::Arc;

use cpu_ops::derive_seed;
use gpu_ops::{Backend, DeferredStep, HotGrad, HotRows, Target};

use super::{internal, reserve, upload_into, LayerEngine};
use crate::engine::{dev_err, DeviceEngine};
use crate::error::{Error, Result};
use crate::executor::BatchRef;
use crate::task::HostTarget;
use crate::trace::Direction;

/// Which hot rows a batch uses (step 4): `positions[i]` (a position among block
/// 0's destinations) takes row `rows[i]` of slab `slab`.
#[derive(Clone, Copy, Debug)]
pub struct HotUse<'a> {
    /// The slab (`super-batch % 2`).
    pub slab: usize,
    /// Distinct positions among block 0's destinations.
    pub positions: &'a [u32],
    /// Slab row of each position.
    pub rows: &'a [u32],
    /// How layer 0's backward treats the hot rows.
    pub grad: HotGrad,
}

impl<B: Backend> LayerEngine<B> {
    /// Step 4.
    pub(super) fn train_prepared_op(
        &mut self,
        key: u64,
        batch: BatchRef<'_>,
        hot: &HotUse<'_>,
        deferred: Option<usize>,
    ) -> Result<Option<(f64, usize)>> {
        let (seeds, seed) = (batch.seeds, batch.seed);
        if let Some(slot) = deferred {
            // Made now, before any work is queued for the batch.
            self.engine.losses.slot(&self.engine.dev, slot)?;
        }
        let top = self.hot.prepared.remove(&key).ok_or_else(|| {
            Error::invalid_argument(
                "prepared batch",
                format!("internal: no batch was prepared under key {key}"),
            )
        })?;
        let n_hot = hot.positions.len();
        if hot.rows.len() != n_hot {
            return Err(Error::invalid_argument(
                "hot rows",
                format!(
                    "internal: {n_hot} positions but {} slab rows",
                    hot.rows.len()
                ),
            ));
        }
        let nd = top.num_bottom;
        if let Some(&p) = hot.positions.iter().find(|&&p| p as usize >= nd) {
            return Err(Error::invalid_argument(
                "hot rows",
                format!("internal: position {p} past the {nd} bottom destinations"),
            ));
        }
        let slab_rows = self.hot.slab_rows.get(hot.slab).copied().unwrap_or(0);
        if let Some(&r) = hot.rows.iter().find(|&&r| r as usize >= slab_rows) {
            return Err(Error::invalid_argument(
                "hot rows",
                format!("internal: slab row {r} past the {slab_rows} reserved"),
            ));
        }
        let tracer = self.engine.tracer.clone();
        let acc = self.engine.acc;
        let start = self.engine.h2d;
        let dev = Arc::clone(&self.engine.dev);
        let width = self.hot_width_op();
        let mut step = tracer.slice_on(acc, "device step");
        // Positions and slab rows (the skip mask only where the hop is
        // sampled now, below).
        let skip = n_hot > 0 && hot.grad == HotGrad::Constant;
        if n_hot > 0 {
            upload_into(
                &*dev,
                &mut self.hot.positions,
                hot.positions,
                "hot positions",
            )?;
            upload_into(&*dev, &mut self.hot.rows_idx, hot.rows, "hot slab rows")?;
            self.engine.h2d += (n_hot * 8) as u64;
        }
        // The bottom hop, hot destinations skipped: sampled ahead (step 1b)
        // when it skipped the positions this batch trains with, else now.
        let mut want: Vec<u32> = if skip {
            hot.positions.to_vec()
        } else {
            Vec::new()
        };
        want.sort_unstable();
        let ahead = self.take_bottom(key)?;
        let resampled = ahead.is_some();
        let (mut block0, src0, ns0, excluded) = match ahead {
            Some(b) if b.skip == want => {
                self.hot.bottom_counts.ahead += 1;
                (b.block, b.src, b.n_src, b.excluded)
            }
            _ => {
                let mut s = tracer.slice_on(acc, "sample bottom");
                if resampled {
                    self.hot.bottom_counts.resampled += 1;
                    if let Some(a) = s.args_mut() {
                        a.extra.push(("bottom_resampled".into(), 1.0));
                    }
                }
                if skip {
                    let mut mask = vec![0u8; nd];
                    for &p in hot.positions {
                        mask[p as usize] = 1;
                    }
                    upload_into(&*dev, &mut self.hot.mask, &mask, "hot skip mask")?;
                    self.engine.h2d += nd as u64;
                }
                let bottom_dst = top.src.first().ok_or_else(|| internal("bottom ids"))?;
                dev.sample_hop(
                    &self.engine.graph,
                    bottom_dst,
                    nd,
                    self.engine.opts.fanouts[0],
                    derive_seed(seed, 0),
                    if skip { self.hot.mask.as_ref() } else { None },
                )
                .map(|(block, src, n)| (block, src, n, false))
                .map_err(dev_err("sampling the bottom hop"))?
            }
        };
        // Link prediction: the batch's own edges leave every hop. Its top
        // layers left them when they were adopted, its bottom hop when it was
        // read ahead; a hop sampled now leaves them here.
        self.hot.excludes.remove(&key);
        if !excluded {
            if let Some(ex) = self.engine.excluded(&dev, batch.exclude)? {
                block0 = DeviceEngine::<B>::exclude_block(&dev, &block0, &src0, &ex)?;
            }
        }
        let x = self.engine.gather_counted(&src0, ns0)?;
        let mut blocks = Vec::with_capacity(top.blocks.len() + 1);
        blocks.push(block0);
        blocks.extend(top.blocks);
        // Node labels go into a reused buffer; a link batch's pairs are
        // uploaded as they come.
        let pairs = match batch.target {
            HostTarget::Labels => {
                let labels = self.engine.labels_of(seeds);
                self.engine.h2d += (labels.len() * 4) as u64;
                upload_into(&*dev, &mut self.hot.labels, &labels, "labels")?;
                None
            }
            t @ HostTarget::Pairs(_) => Some(self.engine.upload_target(seeds, t)?),
        };
        let result = (|| -> Result<Option<gpu_ops::LossStats>> {
            if n_hot > 0 {
                reserve(&*dev, &mut self.hot.rows, n_hot * width, "hot rows")?;
                let slab = self.hot.slabs[hot.slab]
                    .as_ref()
                    .ok_or_else(|| internal("hot slab"))?;
                let idx = self.hot.rows_idx.as_ref().ok_or_else(|| internal("rows"))?;
                let out = self.hot.rows.as_mut().ok_or_else(|| internal("rows"))?;
                dev.index_select_rows(slab, width, idx, n_hot, out)
                    .map_err(dev_err("selecting hot rows"))?;
            }
            let labels = match &pairs {
                Some(_) => None,
                None => Some(self.hot.labels.as_ref().ok_or_else(|| internal("labels"))?),
            };
            let rows = match (n_hot > 0, &self.hot.positions, &self.hot.rows) {
                (true, Some(p), Some(r)) => Some(HotRows {
                    positions: p,
                    rows: r,
                    n: n_hot,
                    grad: hot.grad,
                }),
                _ => None,
            };
            let model = &mut self.engine.model;
            let losses = &mut self.engine.losses;
            let mut run = |target: Target<'_, B>| -> Result<Option<gpu_ops::LossStats>> {
                match deferred {
                    Some(slot) => {
                        let step = DeferredStep {
                            hot: rows.as_ref(),
                            dest: losses.slot(&*dev, slot)?,
                        };
                        model
                            .train_step_hot_deferred(&*dev, &blocks, x.layer(), target, seed, step)
                            .map(|()| None)
                    }
                    None => model
                        .train_step_hot(&*dev, &blocks, x.layer(), target, seed, rows.as_ref())
                        .map(Some),
                }
                .map_err(dev_err("training step"))
            };
            match (&pairs, labels) {
                (Some(p), _) => p.with(&mut run),
                (None, Some(l)) => run(Target::Labels(l)),
                (None, None) => Err(internal("labels")),
            }
        })();
        self.engine.recycle(x);
        self.engine.settle_gather_misses();
        step.set_transfer(Direction::HostToDevice, self.engine.h2d - start);
        Ok(result?.map(|stats| (stats.loss * batch.rows() as f64, stats.correct)))
    }
}
