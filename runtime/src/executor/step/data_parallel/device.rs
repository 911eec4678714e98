//! The data-parallel step's device halves: a rank's gradients to the host
//! for the all-reduce and the summed ones back ([`batch_gradients`],
//! [`apply_gradients`]), or the device-resident sum and step
//! ([`reduce_and_step`] over a [`GradReduce`] from [`grad_reduce`]).

use gpu_ops::{Backend, GradReduce};

use super::reduce::{CopyReduce, ReduceOn};
use crate::engine::{dev_err, DeviceEngine};
use crate::error::Result;

/// One rank's part of a data-parallel step ([`DeviceEngine::batch_gradients`]).
pub struct BatchGradients {
    /// Loss × rows (NaN when the loss or a gradient is not finite).
    pub loss_sum: f64,
    /// Correct predictions.
    pub correct: usize,
    /// Every parameter's gradient, concatenated in parameter order (`None`
    /// when not finite).
    pub flat: Option<Vec<f32>>,
}

/// The gradient sum of the device-resident data-parallel step over `on`
/// (collective for NCCL: every rank calls it), and one line naming the
/// transport.
pub(crate) fn grad_reduce<B: Backend>(
    e: &DeviceEngine<B>,
    on: ReduceOn,
) -> Result<(Box<dyn GradReduce<B>>, String)> {
    let r: Box<dyn GradReduce<B>> = match on {
        ReduceOn::Nccl { rank, ranks, id } => e
            .dev
            .nccl_reduce(rank, ranks, &id)
            .map_err(dev_err("joining the NCCL communicator"))?,
        ReduceOn::HostCopy(comm) => Box::new(CopyReduce::new(comm)),
    };
    let line = r.describe();
    Ok((r, line))
}

/// The downloaded gradients of a step run without its update: (loss × rows,
/// correct, gradients flattened in parameter order), the gradients `None`
/// and the loss NaN when either is not finite.
pub(crate) fn batch_gradients<B: Backend>(
    e: &DeviceEngine<B>,
    stats: gpu_ops::LossStats,
    rows: usize,
) -> Result<BatchGradients> {
    let mut loss_sum = stats.loss * rows as f64;
    let flat = if loss_sum.is_finite() {
        let flat: Vec<f32> = e
            .model
            .grads_to_host(&e.dev)
            .map_err(dev_err("downloading the gradients"))?
            .into_iter()
            .flatten()
            .collect();
        if flat.iter().all(|g| g.is_finite()) {
            Some(flat)
        } else {
            loss_sum = f64::NAN;
            None
        }
    } else {
        None
    };
    Ok(BatchGradients {
        loss_sum,
        correct: stats.correct,
        flat,
    })
}

/// Replaces the gradients with `flat` (the ranks' sum, in
/// [`batch_gradients`]' layout) and takes one optimizer step.
pub(crate) fn apply_gradients<B: Backend>(e: &mut DeviceEngine<B>, flat: &[f32]) -> Result<()> {
    e.model
        .set_grads(&e.dev, flat)
        .map_err(dev_err("uploading the summed gradients"))?;
    e.model.step(&e.dev).map_err(dev_err("optimizer step"))
}

/// The device-resident second half: every gradient × `weight` (this rank's
/// share of the batch; 0 for a rank without rows), summed over the ranks on
/// the device, then one optimizer step. Returns `false`, with no step, when
/// the sum holds a NaN or infinity (the same answer on every rank).
pub(crate) fn reduce_and_step<B: Backend>(
    e: &mut DeviceEngine<B>,
    reduce: &dyn GradReduce<B>,
    weight: f32,
) -> Result<bool> {
    let dev = &*e.dev;
    e.model
        .scale_grads(dev, weight)
        .map_err(dev_err("weighting the gradients"))?;
    e.model
        .reduce_grads(dev, reduce)
        .map_err(dev_err("summing the gradients over the ranks"))?;
    let bad = e
        .model
        .nonfinite_grads(dev)
        .map_err(dev_err("checking the summed gradients"))?;
    if bad > 0 {
        return Ok(false);
    }
    e.model.step(dev).map_err(dev_err("optimizer step"))?;
    Ok(true)
}
