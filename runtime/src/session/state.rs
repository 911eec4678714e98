//! The session's state as a checkpoint (save, load, restore: a resumed run is
//! bit-identical to an uninterrupted one) and as an ONNX model.

use std::path::Path;

use super::Trainer;
use crate::checkpoint::{Checkpoint, DatasetShape, TensorState};
use crate::error::Result;

impl Trainer {
    /// The trainer's state as a [`Checkpoint`].
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        let state = self.state_ref()?;
        let steps = state.version();
        let params = state.params_to_host()?;
        let [m, v] = if steps == 0 {
            [Vec::new(), Vec::new()]
        } else {
            state.moments_to_host()?
        };
        let moment = |all: &[Vec<f32>], i: usize| all.get(i).cloned().unwrap_or_default();
        let tensors = params
            .into_iter()
            .zip(state.param_names())
            .enumerate()
            .map(|(i, (values, name))| TensorState {
                name,
                values,
                m: moment(&m, i),
                v: moment(&v, i),
            })
            .collect();
        Ok(Checkpoint {
            config_toml: self.cfg.to_toml(),
            dataset: DatasetShape::of(&self.ds),
            position: self.pos,
            steps,
            tensors,
        })
    }

    /// Saves the configuration, position (epoch, batch), optimizer step count,
    /// parameters and Adam moments to `path`, atomically (format:
    /// [`crate::Checkpoint`]).
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        self.checkpoint()?.write(path)
    }

    /// Loads a checkpoint written by [`Trainer::save_checkpoint`]: parameters,
    /// Adam state, step count and position. The model shape and the dataset's sizes
    /// must match; a checkpoint taken inside an epoch also needs the same
    /// `train.seed` and `train.batch_size`. Continuing with the same configuration
    /// gives bit-identical results to a run that never stopped. On error the
    /// trainer is unchanged.
    pub fn load_checkpoint(&mut self, path: &Path) -> Result<()> {
        let c = Checkpoint::read(path)?;
        self.restore(c, path)
    }

    /// [`Trainer::load_checkpoint`] from a checkpoint in memory (`origin` names it
    /// in errors).
    pub fn restore(&mut self, c: Checkpoint, origin: &Path) -> Result<()> {
        let state = self.state_ref()?;
        let lens: Vec<usize> = state.params_to_host()?.iter().map(Vec::len).collect();
        let params: Vec<(String, usize)> = state.param_names().into_iter().zip(lens).collect();
        c.check_fits(origin, &self.cfg, &DatasetShape::of(&self.ds), &params)?;
        let values: Vec<&[f32]> = c.tensors.iter().map(|t| t.values.as_slice()).collect();
        let zeros: Vec<Vec<f32>> = params.iter().map(|(_, n)| vec![0.0; *n]).collect();
        let (m, v): (Vec<&[f32]>, Vec<&[f32]>) = if c.steps == 0 {
            let z: Vec<&[f32]> = zeros.iter().map(Vec::as_slice).collect();
            (z.clone(), z)
        } else {
            c.tensors
                .iter()
                .map(|t| (t.m.as_slice(), t.v.as_slice()))
                .unzip()
        };
        self.state()?.load_state(&values, &m, &v, c.steps)?;
        self.pos = c.position;
        self.stop_requested = false;
        self.embeddings = None;
        self.logits = None;
        Ok(())
    }

    /// Writes the model at the current weights to `path` as an ONNX graph,
    /// atomically ([`crate::onnx`]; `opts` picks logits or embeddings). The file
    /// serves sampled blocks and full-graph inference alike.
    pub fn export_onnx(&self, path: &Path, opts: &crate::onnx::ExportOptions) -> Result<()> {
        let state = self.state_ref()?;
        let params = state.params_to_host()?;
        let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
        let opts = crate::onnx::ExportOptions {
            head: self.cfg.head(),
            ..opts.clone()
        };
        crate::onnx::write(state.model_config(), &refs, &opts, path)
    }
}
