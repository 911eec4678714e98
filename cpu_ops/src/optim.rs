//! Optimizers: Adam (and AdamW) and SGD with momentum, matching PyTorch's formulas.
//!
//! An optimizer steps a fixed list of parameter tensors, each a flat slice; its
//! per-parameter state (moments, momentum buffers) is keyed by position in that list
//! and created on the first step. Every later step must pass the same number of
//! tensors with the same lengths, and every gradient must match its parameter:
//! otherwise the step returns `SizeMismatch` and changes nothing.
//!
//! The step count is the **weight version** (the staleness protocol stamps every
//! historical embedding with it): [`Optimizer::version`] is 0 before the first step
//! and increases by one with every successful step.
//!
//! ## Adam (`torch.optim.Adam` / `AdamW`), step `t = 1, 2, ...`
//! 1. [`WeightDecay::L2`] (PyTorch `Adam(weight_decay=λ)`, the default):
//!    `g ← g + λ·θ`. [`WeightDecay::Decoupled`] (PyTorch `AdamW`): `θ ← θ·(1 − lr·λ)`.
//! 2. `m ← β₁·m + (1 − β₁)·g`, `v ← β₂·v + (1 − β₂)·g²`.
//! 3. `θ ← θ − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)`.
//!
//! ## SGD (`torch.optim.SGD`)
//! 1. `g ← g + λ·θ` (L2 weight decay).
//! 2. With momentum `μ > 0`: `b ← g` on the first step, else `b ← μ·b + (1 − d)·g`
//!    (dampening `d`); then `g ← g + μ·b` (Nesterov) or `g ← b`.
//! 3. `θ ← θ − lr·g`.
//!
//! Arithmetic runs in `T` with the scalar factors computed in `f64`; tensors with
//! more than 65,536 elements are updated on rayon's pool (element-wise, so the
//! result does not depend on the thread count).

use rayon::prelude::*;

use crate::error::{CpuOpsError, Result};
use crate::real::Real;

/// Tensors with fewer elements than this are updated on the calling thread.
const PARALLEL_MIN_LEN: usize = 1 << 16;
/// Elements per parallel task.
const CHUNK_LEN: usize = 1 << 14;

/// An optimizer over a fixed list of parameter tensors.
pub trait Optimizer<T: Real> {
    /// One update: `params[i]` moves along `grads[i]`. The list must match the
    /// first step's (count and lengths); on error nothing changes.
    fn step(&mut self, params: &mut [&mut [T]], grads: &[&[T]]) -> Result<()>;
    /// The weight version: the number of successful steps so far.
    fn version(&self) -> u64;
    /// The current learning rate.
    fn lr(&self) -> f64;
    /// Changes the learning rate (for schedules); it must be finite and `≥ 0`.
    fn set_lr(&mut self, lr: f64) -> Result<()>;
}

/// How weight decay `λ` enters Adam.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightDecay {
    /// L2 penalty added to the gradient, `g ← g + λθ` (PyTorch `Adam`; the default,
    /// so results compare with DGL/PyG scripts).
    #[default]
    L2,
    /// Decoupled decay `θ ← θ(1 − lr·λ)` before the update (PyTorch `AdamW`).
    Decoupled,
}

/// Adam's hyper-parameters; `Default` is PyTorch's (`lr = 1e-3`, `β = (0.9, 0.999)`,
/// `ε = 1e-8`, no weight decay).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Learning rate (`≥ 0`).
    pub lr: f64,
    /// First-moment decay `β₁ ∈ [0, 1)`.
    pub beta1: f64,
    /// Second-moment decay `β₂ ∈ [0, 1)`.
    pub beta2: f64,
    /// Denominator term `ε` (`≥ 0`).
    pub eps: f64,
    /// Weight decay `λ` (`≥ 0`).
    pub weight_decay: f64,
    /// How `λ` is applied.
    pub decay: WeightDecay,
}

impl Default for AdamConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decay: WeightDecay::L2,
        }
    }
}

/// SGD's hyper-parameters; `Default` is `lr = 0.01` and nothing else.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate (`≥ 0`).
    pub lr: f64,
    /// Momentum `μ ≥ 0` (0 disables the buffer).
    pub momentum: f64,
    /// Dampening `d ∈ [0, 1]` of the momentum update.
    pub dampening: f64,
    /// Nesterov momentum (needs `μ > 0` and `d = 0`, as in PyTorch).
    pub nesterov: bool,
    /// L2 weight decay `λ ≥ 0`.
    pub weight_decay: f64,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            lr: 0.01,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }
}

fn check_range(name: &'static str, x: f64, ok: bool, range: &str) -> Result<()> {
    if !(x.is_finite() && ok) {
        return Err(CpuOpsError::InvalidArgument {
            name,
            reason: format!("must be finite and {range}, got {x}"),
        });
    }
    Ok(())
}

fn check_lr(lr: f64) -> Result<()> {
    check_range("lr", lr, lr >= 0.0, ">= 0")
}

/// Checks `params`/`grads` against each other and against the state's lengths
/// (`None` before the first step).
fn check_shapes<T>(params: &[&mut [T]], grads: &[&[T]], state: Option<&[usize]>) -> Result<()> {
    if grads.len() != params.len() {
        return Err(CpuOpsError::SizeMismatch {
            what: "gradient tensors (one per parameter tensor)",
            expected: params.len(),
            found: grads.len(),
        });
    }
    for (p, g) in params.iter().zip(grads) {
        if g.len() != p.len() {
            return Err(CpuOpsError::SizeMismatch {
                what: "gradient length (must equal its parameter's)",
                expected: p.len(),
                found: g.len(),
            });
        }
    }
    if let Some(lens) = state {
        if lens.len() != params.len() {
            return Err(CpuOpsError::SizeMismatch {
                what: "parameter tensors (must match the first step's)",
                expected: lens.len(),
                found: params.len(),
            });
        }
        for (&len, p) in lens.iter().zip(params) {
            if p.len() != len {
                return Err(CpuOpsError::SizeMismatch {
                    what: "parameter length (must match the first step's)",
                    expected: len,
                    found: p.len(),
                });
            }
        }
    }
    Ok(())
}

/// Runs `f` over aligned chunks of a parameter, its gradient and two state
/// tensors (`s1`, `s2` may be empty, in which case `f` gets empty slices).
fn for_each_chunk<T: Real>(
    p: &mut [T],
    g: &[T],
    s1: &mut [T],
    s2: &mut [T],
    f: impl Fn(&mut [T], &[T], &mut [T], &mut [T]) + Send + Sync,
) {
    if p.len() < PARALLEL_MIN_LEN {
        f(p, g, s1, s2);
        return;
    }
    let chunks = p.len().div_ceil(CHUNK_LEN);
    let (s1, s2) = (split_state(s1, chunks), split_state(s2, chunks));
    p.par_chunks_mut(CHUNK_LEN)
        .zip(g.par_chunks(CHUNK_LEN))
        .zip(s1.into_par_iter().zip(s2.into_par_iter()))
        .for_each(|((p, g), (a, b))| f(p, g, a, b));
}

/// `s` in `chunks` chunks of `CHUNK_LEN`, or `chunks` empty slices when `s` is empty.
fn split_state<T>(s: &mut [T], chunks: usize) -> Vec<&mut [T]> {
    if s.is_empty() {
        (0..chunks).map(|_| <&mut [T]>::default()).collect()
    } else {
        s.chunks_mut(CHUNK_LEN).collect()
    }
}

/// Adam / AdamW (see the module docs for the update).
#[derive(Clone, Debug)]
pub struct Adam<T: Real = f32> {
    config: AdamConfig,
    steps: u64,
    /// First and second moments, one pair per parameter tensor.
    m: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
}

impl<T: Real> Adam<T> {
    /// An optimizer with `config`, checked: `lr, eps, weight_decay ≥ 0`,
    /// `β₁, β₂ ∈ [0, 1)`, all finite.
    pub fn new(config: AdamConfig) -> Result<Self> {
        check_lr(config.lr)?;
        let b = |x: f64| (0.0..1.0).contains(&x);
        check_range("beta1", config.beta1, b(config.beta1), "in [0, 1)")?;
        check_range("beta2", config.beta2, b(config.beta2), "in [0, 1)")?;
        check_range("eps", config.eps, config.eps >= 0.0, ">= 0")?;
        let wd = config.weight_decay;
        check_range("weight_decay", wd, wd >= 0.0, ">= 0")?;
        Ok(Self {
            config,
            steps: 0,
            m: Vec::new(),
            v: Vec::new(),
        })
    }

    /// The hyper-parameters in force.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// First-moment estimate of parameter tensor `i` (`None` before the first step).
    pub fn first_moment(&self, i: usize) -> Option<&[T]> {
        self.m.get(i).map(Vec::as_slice)
    }

    /// Second-moment estimate of parameter tensor `i` (`None` before the first step).
    pub fn second_moment(&self, i: usize) -> Option<&[T]> {
        self.v.get(i).map(Vec::as_slice)
    }

    /// Replaces the state with a saved one (checkpoints): `steps` taken and the
    /// first and second moments of each parameter tensor. `m` and `v` must be empty
    /// when `steps == 0` and otherwise hold the same number of tensors with equal
    /// lengths; on error nothing changes. The next [`Optimizer::step`] then checks
    /// the parameters against these lengths, as after a first step.
    pub fn restore_state(&mut self, steps: u64, m: Vec<Vec<T>>, v: Vec<Vec<T>>) -> Result<()> {
        if (steps == 0) != m.is_empty() {
            return Err(CpuOpsError::InvalidArgument {
                name: "steps",
                reason: format!(
                    "{steps} steps with {} moment tensors: moments exist exactly after a step",
                    m.len()
                ),
            });
        }
        if v.len() != m.len() {
            return Err(CpuOpsError::SizeMismatch {
                what: "second-moment tensors (one per first-moment tensor)",
                expected: m.len(),
                found: v.len(),
            });
        }
        for (a, b) in m.iter().zip(&v) {
            if a.len() != b.len() {
                return Err(CpuOpsError::SizeMismatch {
                    what: "second-moment length (must equal the first moment's)",
                    expected: a.len(),
                    found: b.len(),
                });
            }
        }
        self.steps = steps;
        self.m = m;
        self.v = v;
        Ok(())
    }
}

impl<T: Real> Optimizer<T> for Adam<T> {
    fn step(&mut self, params: &mut [&mut [T]], grads: &[&[T]]) -> Result<()> {
        let lens: Vec<usize> = self.m.iter().map(Vec::len).collect();
        let first = self.steps == 0;
        check_shapes(params, grads, (!first).then_some(lens.as_slice()))?;
        if first {
            self.m = params.iter().map(|p| vec![T::ZERO; p.len()]).collect();
            self.v = self.m.clone();
        }
        self.steps += 1;
        let c = self.config;
        // Step counts beyond i32 saturate the bias corrections at 1 long before.
        let t = self.steps.min(i32::MAX as u64) as i32;
        let bias1 = 1.0 - c.beta1.powi(t);
        let bias2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
        let step_size = T::from_f64(c.lr / bias1);
        let inv_bias2_sqrt = T::from_f64(1.0 / bias2_sqrt);
        let (b1, b2) = (T::from_f64(c.beta1), T::from_f64(c.beta2));
        let (one_b1, one_b2) = (T::from_f64(1.0 - c.beta1), T::from_f64(1.0 - c.beta2));
        let eps = T::from_f64(c.eps);
        let (l2, shrink) = match c.decay {
            WeightDecay::L2 => (T::from_f64(c.weight_decay), T::ONE),
            WeightDecay::Decoupled => (T::ZERO, T::from_f64(1.0 - c.lr * c.weight_decay)),
        };
        for (((p, g), m), v) in params
            .iter_mut()
            .zip(grads)
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
        {
            for_each_chunk(p, g, m, v, |p, g, m, v| {
                for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                    let g = g + l2 * *p;
                    *p *= shrink;
                    *m = b1 * *m + one_b1 * g;
                    *v = b2 * *v + one_b2 * g * g;
                    *p -= step_size * *m / (v.sqrt() * inv_bias2_sqrt + eps);
                }
            });
        }
        Ok(())
    }

    fn version(&self) -> u64 {
        self.steps
    }

    fn lr(&self) -> f64 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_lr(lr)?;
        self.config.lr = lr;
        Ok(())
    }
}

/// Stochastic gradient descent with optional (Nesterov) momentum and L2 decay.
#[derive(Clone, Debug)]
pub struct Sgd<T: Real = f32> {
    config: SgdConfig,
    steps: u64,
    /// Parameter lengths, fixed by the first step.
    lens: Vec<usize>,
    /// Momentum buffers (empty vectors when momentum is off).
    buf: Vec<Vec<T>>,
}

impl<T: Real> Sgd<T> {
    /// An optimizer with `config`, checked: `lr, momentum, weight_decay ≥ 0`,
    /// `dampening ∈ [0, 1]`, all finite; Nesterov needs momentum and no dampening.
    pub fn new(config: SgdConfig) -> Result<Self> {
        check_lr(config.lr)?;
        let (mu, d, wd) = (config.momentum, config.dampening, config.weight_decay);
        check_range("momentum", mu, mu >= 0.0, ">= 0")?;
        check_range("dampening", d, (0.0..=1.0).contains(&d), "in [0, 1]")?;
        check_range("weight_decay", wd, wd >= 0.0, ">= 0")?;
        if config.nesterov && (mu == 0.0 || d != 0.0) {
            return Err(CpuOpsError::InvalidArgument {
                name: "nesterov",
                reason: "Nesterov momentum needs momentum > 0 and dampening = 0".into(),
            });
        }
        Ok(Self {
            config,
            steps: 0,
            lens: Vec::new(),
            buf: Vec::new(),
        })
    }

    /// The hyper-parameters in force.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }
}

impl<T: Real> Optimizer<T> for Sgd<T> {
    fn step(&mut self, params: &mut [&mut [T]], grads: &[&[T]]) -> Result<()> {
        let first = self.steps == 0;
        check_shapes(params, grads, (!first).then_some(self.lens.as_slice()))?;
        let c = self.config;
        let momentum = c.momentum != 0.0;
        if first {
            self.lens = params.iter().map(|p| p.len()).collect();
            self.buf = params
                .iter()
                .map(|p| vec![T::ZERO; if momentum { p.len() } else { 0 }])
                .collect();
        }
        let lr = T::from_f64(c.lr);
        let wd = T::from_f64(c.weight_decay);
        let mu = T::from_f64(c.momentum);
        let one_d = T::from_f64(1.0 - c.dampening);
        let nesterov = c.nesterov;
        for ((p, g), b) in params.iter_mut().zip(grads).zip(self.buf.iter_mut()) {
            for_each_chunk(p, g, b, &mut [], |p, g, b, _| {
                if !momentum {
                    for (p, &g) in p.iter_mut().zip(g) {
                        let g = g + wd * *p;
                        *p -= lr * g;
                    }
                    return;
                }
                for ((p, &g), b) in p.iter_mut().zip(g).zip(b) {
                    let g = g + wd * *p;
                    *b = if first { g } else { mu * *b + one_d * g };
                    let d = if nesterov { g + mu * *b } else { *b };
                    *p -= lr * d;
                }
            });
        }
        self.steps += 1;
        Ok(())
    }

    fn version(&self) -> u64 {
        self.steps
    }

    fn lr(&self) -> f64 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_lr(lr)?;
        self.config.lr = lr;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn step1<O: Optimizer<f64>>(opt: &mut O, theta: &mut f64, g: f64) {
        let mut p = [*theta];
        opt.step(&mut [&mut p[..]], &[&[g][..]]).unwrap();
        *theta = p[0];
    }

    #[test]
    fn adam_restored_state_continues_bit_identically() {
        let cfg = AdamConfig {
            lr: 0.05,
            weight_decay: 0.01,
            ..AdamConfig::default()
        };
        let mut a = Adam::<f32>::new(cfg).unwrap();
        let mut p = vec![0.5f32, -1.0, 2.0];
        for g in [[0.1f32, -0.2, 0.3], [0.4, 0.0, -0.5]] {
            a.step(&mut [&mut p[..]], &[&g[..]]).unwrap();
        }
        let mut b = Adam::<f32>::new(cfg).unwrap();
        let (m, v) = (a.first_moment(0).unwrap(), a.second_moment(0).unwrap());
        b.restore_state(a.version(), vec![m.to_vec()], vec![v.to_vec()])
            .unwrap();
        let mut q = p.clone();
        let g = [0.3f32, 0.2, -0.1];
        a.step(&mut [&mut p[..]], &[&g[..]]).unwrap();
        b.step(&mut [&mut q[..]], &[&g[..]]).unwrap();
        assert_eq!(p, q);
        assert_eq!(a.version(), 3);
        assert_eq!(b.version(), 3);
        // Inconsistent states are refused and change nothing.
        assert!(b
            .restore_state(0, vec![vec![0.0]], vec![vec![0.0]])
            .is_err());
        assert!(b.restore_state(2, vec![], vec![]).is_err());
        assert!(b.restore_state(2, vec![vec![0.0]], vec![]).is_err());
        assert!(b
            .restore_state(2, vec![vec![0.0; 2]], vec![vec![0.0; 3]])
            .is_err());
        assert_eq!(b.version(), 3);
        // A restored state with other lengths makes the next step refuse.
        b.restore_state(1, vec![vec![0.0; 2]], vec![vec![0.0; 2]])
            .unwrap();
        assert!(b.step(&mut [&mut q[..]], &[&g[..]]).is_err());
    }

    #[test]
    fn adam_two_steps_by_hand() {
        // lr 0.1, β (0.9, 0.999), ε 1e-8, θ₀ = 1, g = 0.5 then −1.
        // t=1: m = 0.05, v = 2.5e-4, m̂ = 0.5, v̂ = 0.25, θ = 1 − 0.1·0.5/(0.5 + 1e-8).
        // t=2: m = 0.045 − 0.1 = −0.055, v = 2.4975e-4 + 1e-3 = 1.24975e-3,
        //      m̂ = −0.055/0.19, v̂ = 1.24975e-3/1.999e-3, θ += 0.1·0.28947…/(0.79069… + ε).
        let mut adam = Adam::<f64>::new(AdamConfig {
            lr: 0.1,
            ..AdamConfig::default()
        })
        .unwrap();
        assert_eq!(adam.version(), 0);
        let mut theta = 1.0;
        step1(&mut adam, &mut theta, 0.5);
        assert!((theta - (1.0 - 0.1 * 0.5 / (0.5 + 1e-8))).abs() < 1e-15);
        assert!((adam.first_moment(0).unwrap()[0] - 0.05).abs() < 1e-16);
        assert!((adam.second_moment(0).unwrap()[0] - 2.5e-4).abs() < 1e-18);
        step1(&mut adam, &mut theta, -1.0);
        let m_hat = -0.055 / 0.19;
        let v_hat: f64 = 1.24975e-3 / 1.999e-3;
        let want = 0.900000002 - 0.1 * m_hat / (v_hat.sqrt() + 1e-8);
        assert!((theta - want).abs() < 1e-14, "{theta} {want}");
        assert!((theta - 0.9366103542405654).abs() < 1e-14);
        assert_eq!(adam.version(), 2);
    }

    /// PyTorch's single-tensor Adam (torch/optim/adam.py, `_single_tensor_adam`),
    /// transcribed operation by operation.
    fn torch_adam(c: &AdamConfig, steps: &[Vec<f64>], theta: &mut [f64], decoupled: bool) {
        let n = theta.len();
        let (mut exp_avg, mut exp_avg_sq) = (vec![0.0; n], vec![0.0; n]);
        for (t, grad) in steps.iter().enumerate() {
            let step = (t + 1) as i32;
            for i in 0..n {
                let mut g = grad[i];
                if decoupled {
                    theta[i] *= 1.0 - c.lr * c.weight_decay;
                } else {
                    g += c.weight_decay * theta[i];
                }
                exp_avg[i] += (g - exp_avg[i]) * (1.0 - c.beta1); // lerp_
                exp_avg_sq[i] = exp_avg_sq[i] * c.beta2 + (1.0 - c.beta2) * g * g;
                let bias_correction1 = 1.0 - c.beta1.powi(step);
                let bias_correction2 = 1.0 - c.beta2.powi(step);
                let step_size = c.lr / bias_correction1;
                let denom = exp_avg_sq[i].sqrt() / bias_correction2.sqrt() + c.eps;
                theta[i] -= step_size * exp_avg[i] / denom;
            }
        }
    }

    #[test]
    fn adam_matches_pytorch_formula_with_weight_decay() {
        let mut rng = Rng::new(31);
        for decay in [WeightDecay::L2, WeightDecay::Decoupled] {
            let c = AdamConfig {
                lr: 0.01,
                beta1: 0.8,
                beta2: 0.99,
                eps: 1e-6,
                weight_decay: 0.05,
                decay,
            };
            // Two tensors, one large enough for the parallel path.
            let lens = [37usize, PARALLEL_MIN_LEN + 5];
            let init: Vec<Vec<f64>> = lens
                .iter()
                .map(|&n| (0..n).map(|_| rng.normal()).collect())
                .collect();
            let grads: Vec<Vec<Vec<f64>>> = (0..5)
                .map(|_| {
                    lens.iter()
                        .map(|&n| (0..n).map(|_| rng.normal()).collect())
                        .collect()
                })
                .collect();
            let mut adam = Adam::<f64>::new(c).unwrap();
            let mut params = init.clone();
            for g in &grads {
                let (a, b) = params.split_at_mut(1);
                adam.step(&mut [&mut a[0], &mut b[0]], &[&g[0], &g[1]])
                    .unwrap();
            }
            for (k, want_init) in init.iter().enumerate() {
                let mut want = want_init.clone();
                let per_step: Vec<Vec<f64>> = grads.iter().map(|g| g[k].clone()).collect();
                torch_adam(&c, &per_step, &mut want, decay == WeightDecay::Decoupled);
                for (a, b) in params[k].iter().zip(&want) {
                    assert!((a - b).abs() < 1e-12, "{decay:?}: {a} {b}");
                }
            }
            // f32 follows the f64 result closely.
            let mut adam32 = Adam::<f32>::new(c).unwrap();
            let mut p32: Vec<f32> = init[0].iter().map(|&v| v as f32).collect();
            for g in &grads {
                let g32: Vec<f32> = g[0].iter().map(|&v| v as f32).collect();
                adam32.step(&mut [&mut p32], &[&g32]).unwrap();
            }
            for (a, b) in p32.iter().zip(&params[0]) {
                assert!((*a as f64 - b).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn sgd_matches_pytorch_formula() {
        // θ = 1, lr 0.1, μ 0.9, λ 0.1, g = 1 then 2.
        // t=1: g' = 1 + 0.1 = 1.1, b = 1.1, θ = 1 − 0.11 = 0.89.
        // t=2: g' = 2 + 0.089 = 2.089, b = 0.99 + 2.089 = 3.079, θ = 0.89 − 0.3079.
        let mut sgd = Sgd::<f64>::new(SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.1,
            ..SgdConfig::default()
        })
        .unwrap();
        let mut theta = 1.0;
        step1(&mut sgd, &mut theta, 1.0);
        assert!((theta - 0.89).abs() < 1e-12);
        step1(&mut sgd, &mut theta, 2.0);
        assert!((theta - (0.89 - 0.3079)).abs() < 1e-12);
        assert_eq!(sgd.version(), 2);

        // Nesterov: t=1 b = g = 1, d = 1 + 0.9 = 1.9, θ = 1 − 0.19.
        let mut nest = Sgd::<f64>::new(SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            nesterov: true,
            ..SgdConfig::default()
        })
        .unwrap();
        let mut theta = 1.0;
        step1(&mut nest, &mut theta, 1.0);
        assert!((theta - 0.81).abs() < 1e-12);

        // Plain SGD on a large tensor (parallel path), dampening ignored without momentum.
        let mut plain = Sgd::<f32>::new(SgdConfig {
            lr: 0.5,
            dampening: 0.3,
            ..SgdConfig::default()
        })
        .unwrap();
        let n = PARALLEL_MIN_LEN * 2 + 1;
        let mut p = vec![1.0f32; n];
        let g: Vec<f32> = (0..n).map(|i| (i % 5) as f32).collect();
        plain.step(&mut [&mut p], &[&g]).unwrap();
        assert!(p.iter().zip(&g).all(|(p, g)| *p == 1.0 - 0.5 * g));

        // Dampened momentum: t=2 b = 0.9·1 + 0.7·1.
        let mut damp = Sgd::<f64>::new(SgdConfig {
            lr: 1.0,
            momentum: 0.9,
            dampening: 0.3,
            ..SgdConfig::default()
        })
        .unwrap();
        let mut theta = 0.0;
        step1(&mut damp, &mut theta, 1.0);
        step1(&mut damp, &mut theta, 1.0);
        assert!((theta - (-1.0 - 1.6)).abs() < 1e-12);
    }

    #[test]
    fn shape_errors_change_nothing() {
        let mut adam = Adam::<f32>::new(AdamConfig::default()).unwrap();
        let mut a = vec![1.0f32; 4];
        let mut b = vec![1.0f32; 3];
        let ga = vec![0.1f32; 4];
        let gb = vec![0.1f32; 3];
        // Gradient count and length.
        assert!(matches!(
            adam.step(&mut [&mut a, &mut b], &[&ga]),
            Err(CpuOpsError::SizeMismatch {
                expected: 2,
                found: 1,
                ..
            })
        ));
        assert!(matches!(
            adam.step(&mut [&mut a, &mut b], &[&ga, &ga]),
            Err(CpuOpsError::SizeMismatch {
                expected: 3,
                found: 4,
                ..
            })
        ));
        assert_eq!(adam.version(), 0);
        adam.step(&mut [&mut a, &mut b], &[&ga, &gb]).unwrap();
        let snapshot = (a.clone(), b.clone());
        // A different parameter list after the first step.
        assert!(matches!(
            adam.step(&mut [&mut a], &[&ga]),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        assert!(matches!(
            adam.step(&mut [&mut b, &mut a], &[&gb, &ga]),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        assert_eq!((a.clone(), b.clone()), snapshot);
        assert_eq!(adam.version(), 1);

        let mut sgd = Sgd::<f32>::new(SgdConfig::default()).unwrap();
        sgd.step(&mut [&mut a], &[&ga]).unwrap();
        assert!(matches!(
            sgd.step(&mut [&mut b], &[&gb]),
            Err(CpuOpsError::SizeMismatch {
                expected: 4,
                found: 3,
                ..
            })
        ));
        assert_eq!(sgd.version(), 1);
    }

    #[test]
    fn bad_hyper_parameters_are_errors() {
        let bad_adam = [
            AdamConfig {
                lr: -1.0,
                ..AdamConfig::default()
            },
            AdamConfig {
                beta1: 1.0,
                ..AdamConfig::default()
            },
            AdamConfig {
                beta2: f64::NAN,
                ..AdamConfig::default()
            },
            AdamConfig {
                weight_decay: -0.1,
                ..AdamConfig::default()
            },
        ];
        for c in bad_adam {
            assert!(matches!(
                Adam::<f32>::new(c),
                Err(CpuOpsError::InvalidArgument { .. })
            ));
        }
        assert!(Sgd::<f32>::new(SgdConfig {
            nesterov: true,
            ..SgdConfig::default()
        })
        .is_err());
        assert!(Sgd::<f32>::new(SgdConfig {
            dampening: 2.0,
            ..SgdConfig::default()
        })
        .is_err());
        let mut adam = Adam::<f32>::new(AdamConfig::default()).unwrap();
        assert!(adam.set_lr(f64::INFINITY).is_err());
        adam.set_lr(0.5).unwrap();
        assert_eq!(adam.lr(), 0.5);
    }
}
