//! Steps 2, 3 and 5 of the layer path's device half (`device/mod.rs`): the
//! staging buffers CPU workers write hot rows into, the two slabs they are
//! installed in, and the hot-row store rows are kept in and carried from.

use std::any::Any;
use std::sync::Arc;

use gpu_ops::Backend;

use super::{internal, reserve, upload_into, LayerEngine};
use crate::engine::dev_err;
use crate::error::{Error, Result};

/// Host memory for CPU-computed hot rows that [`LayerDevice::hot_install`](super::LayerDevice::hot_install)
/// uploads: page-locked on CUDA (so the upload is asynchronous), plain memory on
/// the host backend.
pub trait HotStaging: Send {
    /// Rows it holds (each [`LayerDevice::hot_width`](super::LayerDevice::hot_width) values).
    fn capacity_rows(&self) -> usize;
    /// The host view, `capacity_rows × width` values. Waits until no upload still
    /// reads the buffer.
    fn rows_mut(&mut self) -> &mut [f32];
    /// Makes the first `rows` rows written through [`rows_mut`](Self::rows_mut)
    /// ready to upload: a staging buffer of bfloat16 feature rows narrows them
    /// (round to nearest even) into its page-locked bfloat16 half, waiting
    /// until no upload still reads it; an fp32 one has nothing to do. Call it
    /// after writing, before [`LayerDevice::hot_install`](super::LayerDevice::hot_install).
    fn seal(&mut self, rows: usize);
    /// The concrete type, for the engine that made it.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// What a [`Staging`] uploads.
enum StagingRows<B: Backend> {
    /// fp32 rows, written and uploaded in place.
    F32(B::Pinned<f32>),
    /// bfloat16 rows: written as fp32 into `wide`, narrowed into `narrow` by
    /// [`HotStaging::seal`] (`sealed` rows), uploaded from there.
    Bf16 {
        wide: Vec<f32>,
        narrow: B::Pinned<u16>,
        sealed: usize,
    },
}

/// A [`HotStaging`] of a [`LayerEngine`] on backend `B`.
pub(crate) struct Staging<B: Backend> {
    dev: Arc<B>,
    buf: StagingRows<B>,
    rows: usize,
    width: usize,
}

impl<B: Backend> HotStaging for Staging<B> {
    fn capacity_rows(&self) -> usize {
        self.rows
    }

    fn rows_mut(&mut self) -> &mut [f32] {
        match &mut self.buf {
            StagingRows::F32(buf) => self.dev.pinned_slice_mut(buf),
            StagingRows::Bf16 { wide, sealed, .. } => {
                *sealed = 0;
                wide
            }
        }
    }

    fn seal(&mut self, rows: usize) {
        if let StagingRows::Bf16 {
            wide,
            narrow,
            sealed,
        } = &mut self.buf
        {
            let n = (rows.min(self.rows)) * self.width;
            let dst = self.dev.pinned_slice_mut(narrow);
            for (d, &x) in dst[..n].iter_mut().zip(&wide[..n]) {
                *d = gpu_ops::f32_to_bf16_bits(x);
            }
            *sealed = rows.min(self.rows);
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl<B: Backend> LayerEngine<B> {
    /// Layer 0's output width.
    pub(super) fn hot_width_op(&self) -> usize {
        self.engine.model.layer_out_dim(0).unwrap_or(0)
    }

    /// Whether hot rows are staged and uploaded as bfloat16 (step 3): with
    /// bfloat16 feature rows.
    pub(super) fn hot_bf16(&self) -> bool {
        matches!(self.engine.opts.feature_dtype, gpu_ops::FeatureDtype::Bf16)
    }

    pub(super) fn new_staging_op(&self, rows: usize) -> Result<Box<dyn HotStaging>> {
        let n = rows
            .checked_mul(self.hot_width_op())
            .ok_or_else(|| Error::invalid_argument("hot staging", "size overflows"))?;
        let what = "hot-row staging (pinned host memory)";
        let buf = if self.hot_bf16() {
            StagingRows::Bf16 {
                wide: vec![0.0; n],
                narrow: self
                    .engine
                    .dev
                    .alloc_pinned::<u16>(n)
                    .map_err(dev_err(what))?,
                sealed: 0,
            }
        } else {
            StagingRows::F32(
                self.engine
                    .dev
                    .alloc_pinned::<f32>(n)
                    .map_err(dev_err(what))?,
            )
        };
        Ok(Box::new(Staging {
            dev: Arc::clone(&self.engine.dev),
            buf,
            rows,
            width: self.hot_width_op(),
        }))
    }

    /// Step 2.
    pub(super) fn hot_slab_reserve_op(&mut self, slab: usize, rows: usize) -> Result<()> {
        if slab > 1 {
            return Err(Error::invalid_argument(
                "hot slab",
                format!("internal: slab {slab} (there are 2)"),
            ));
        }
        let width = self.hot_width_op();
        let dev = Arc::clone(&self.engine.dev);
        if self.hot.copy.is_none() {
            self.hot.copy = Some(dev.new_stream().map_err(dev_err("copy stream"))?);
        }
        if self.hot.slab_rows[slab] < rows {
            let cap = rows + rows / 4;
            // Not zeroed: a batch reads only rows of chunks installed into
            // the slab (`scheduler::protocol` steps 4–7, driven by
            // `executor/layer/pipeline.rs`).
            self.hot.slabs[slab] = Some(
                dev.alloc_uninit(cap.max(1) * width)
                    .map_err(dev_err("hot-row slab"))?,
            );
            self.hot.slab_rows[slab] = cap;
            if self.hot_bf16() {
                self.hot.narrow[slab] = Some(
                    dev.alloc_uninit(cap.max(1) * width)
                        .map_err(dev_err("hot-row slab (bfloat16 mirror)"))?,
                );
            }
        }
        // Later uploads wait for every batch enqueued so far (which may still read
        // this slab's previous rows).
        let ev = dev
            .record_event(dev.stream())
            .map_err(dev_err("hot slab event"))?;
        let copy = self
            .hot
            .copy
            .as_ref()
            .ok_or_else(|| internal("copy stream"))?;
        dev.wait_event(copy, &ev)
            .map_err(dev_err("hot slab event"))?;
        Ok(())
    }

    /// Step 3.
    pub(super) fn hot_install_op(
        &mut self,
        slab: usize,
        row0: usize,
        n: usize,
        staging: &mut dyn HotStaging,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let width = self.hot_width_op();
        let st = staging
            .as_any_mut()
            .downcast_mut::<Staging<B>>()
            .ok_or_else(|| internal("a staging buffer of this engine"))?;
        if n > st.rows {
            return Err(Error::invalid_argument(
                "hot install",
                format!("internal: {n} rows from a staging buffer of {}", st.rows),
            ));
        }
        if slab > 1 || row0 + n > self.hot.slab_rows[slab] {
            return Err(Error::invalid_argument(
                "hot install",
                format!(
                    "internal: rows {row0}..{} of slab {slab} ({} rows reserved)",
                    row0 + n,
                    self.hot.slab_rows.get(slab).copied().unwrap_or(0)
                ),
            ));
        }
        let dev = Arc::clone(&self.engine.dev);
        let copy = self
            .hot
            .copy
            .as_ref()
            .ok_or_else(|| internal("copy stream"))?;
        let dst = self.hot.slabs[slab]
            .as_mut()
            .ok_or_else(|| internal("hot slab"))?;
        let bytes = match &st.buf {
            StagingRows::F32(buf) => {
                dev.upload_pinned_at(copy, buf, n * width, dst, row0 * width)
                    .map_err(dev_err("uploading hot rows"))?;
                4
            }
            StagingRows::Bf16 { narrow, sealed, .. } => {
                if n > *sealed {
                    return Err(Error::invalid_argument(
                        "hot install",
                        format!("internal: {n} rows of a staging buffer with {sealed} sealed"),
                    ));
                }
                let mirror = self.hot.narrow[slab]
                    .as_mut()
                    .ok_or_else(|| internal("hot slab (bfloat16 mirror)"))?;
                dev.upload_pinned_at(copy, narrow, n * width, mirror, row0 * width)
                    .map_err(dev_err("uploading hot rows"))?;
                2
            }
        };
        let ev = dev
            .record_event(copy)
            .map_err(dev_err("hot install event"))?;
        dev.wait_event(dev.stream(), &ev)
            .map_err(dev_err("hot install event"))?;
        if let (StagingRows::Bf16 { .. }, Some(mirror)) = (&st.buf, self.hot.narrow[slab].as_ref())
        {
            let dst = self.hot.slabs[slab]
                .as_mut()
                .ok_or_else(|| internal("hot slab"))?;
            dev.widen_bf16_at(mirror, row0 * width, n * width, dst, row0 * width)
                .map_err(dev_err("widening hot rows"))?;
        }
        self.engine.h2d += (n * width * bytes) as u64;
        Ok(())
    }

    /// Step 5: `store[vertices[i]] = slab[rows[i]]` (`keep`) or
    /// `slab[rows[i]] = store[vertices[i]]` (carry).
    pub(super) fn hot_store_copy_op(
        &mut self,
        slab: usize,
        rows: &[u32],
        vertices: &[u32],
        keep: bool,
    ) -> Result<()> {
        let what = if keep { "hot keep" } else { "hot carry" };
        let n = rows.len();
        if vertices.len() != n {
            return Err(Error::invalid_argument(
                what,
                format!("internal: {n} slab rows but {} store rows", vertices.len()),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let slab_rows = self.hot.slab_rows.get(slab).copied().unwrap_or(0);
        if let Some(&r) = rows.iter().find(|&&r| r as usize >= slab_rows) {
            return Err(Error::invalid_argument(
                what,
                format!("internal: row {r} of slab {slab} ({slab_rows} rows reserved)"),
            ));
        }
        let need = vertices.iter().max().map_or(0, |&v| v as usize + 1);
        if !keep && need > self.hot.store_rows {
            return Err(Error::invalid_argument(
                what,
                format!(
                    "internal: store row {} past the {} kept",
                    need - 1,
                    self.hot.store_rows
                ),
            ));
        }
        let width = self.hot_width_op();
        let dev = Arc::clone(&self.engine.dev);
        if need > self.hot.store_rows {
            // Grow, keeping the rows stored so far.
            let cap = need + need / 4;
            let mut grown = dev
                .alloc_uninit::<f32>(cap * width)
                .map_err(dev_err("hot-row store"))?;
            if let Some(old) = self.hot.store.as_ref() {
                let old_rows = self.hot.store_rows;
                let ids: Vec<u32> = (0..old_rows as u32).collect();
                upload_into(&*dev, &mut self.hot.copy_from, &ids, "hot store rows")?;
                let idx = self
                    .hot
                    .copy_from
                    .as_ref()
                    .ok_or_else(|| internal("rows"))?;
                dev.index_select_rows(old, width, idx, old_rows, &mut grown)
                    .map_err(dev_err("growing the hot-row store"))?;
            }
            self.hot.store = Some(grown);
            self.hot.store_rows = cap;
        }
        let (from, to) = if keep {
            (rows, vertices)
        } else {
            (vertices, rows)
        };
        upload_into(&*dev, &mut self.hot.copy_from, from, "hot copy rows")?;
        upload_into(&*dev, &mut self.hot.copy_to, to, "hot copy rows")?;
        self.engine.h2d += (n * 8) as u64;
        reserve(
            &*dev,
            &mut self.hot.copy_rows,
            n * width,
            "hot copy scratch",
        )?;
        let from_idx = self
            .hot
            .copy_from
            .as_ref()
            .ok_or_else(|| internal("rows"))?;
        let to_idx = self.hot.copy_to.as_ref().ok_or_else(|| internal("rows"))?;
        let scratch = self
            .hot
            .copy_rows
            .as_mut()
            .ok_or_else(|| internal("scratch"))?;
        let slab_buf = self.hot.slabs[slab]
            .as_mut()
            .ok_or_else(|| internal("hot slab"))?;
        let store = self.hot.store.as_mut().ok_or_else(|| internal("store"))?;
        if keep {
            dev.index_select_rows(slab_buf, width, from_idx, n, scratch)
                .map_err(dev_err(what))?;
            dev.index_put_rows(scratch, width, to_idx, n, store)
                .map_err(dev_err(what))?;
        } else {
            dev.index_select_rows(store, width, from_idx, n, scratch)
                .map_err(dev_err(what))?;
            dev.index_put_rows(scratch, width, to_idx, n, slab_buf)
                .map_err(dev_err(what))?;
        }
        Ok(())
    }
}
