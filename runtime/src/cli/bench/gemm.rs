//! GEMM throughput of the dense layers against the machine's fp32 FMA peak, both
//! measured in the same run.
//!
//! For each layer shape `X: m × k`, `W: k × n` it times the three products a dense
//! layer runs ([`cpu_ops::matmul`] forward, [`cpu_ops::matmul_tn`] weight gradient,
//! [`cpu_ops::matmul_nt`] input gradient; `2·m·k·n` flops each) on rayon's pool, and
//! a register-resident FMA loop (12 independent accumulators, one loop per rayon
//! thread) at the widest width the CPU has (AVX-512, else AVX2+FMA, else scalar).
//!
//! Protocol (for shared, noisy machines, where other processes take cores away for
//! part of the run):
//! 1. before each shape, and once at the end, sample the FMA peak (3 short loops);
//! 2. per shape and product: one untimed call, then `reps` timed calls; report the
//!    best and the median;
//! 3. the peak is the highest sample (the machine's own limit); the lowest is
//!    reported too: a wide gap means the cores were shared and medians are noisy.
//!
//! Fractions of peak are best-time GFLOP/s over peak GFLOP/s.

use std::fmt;
use std::time::{Duration, Instant};

use cpu_ops::{matmul, matmul_nt, matmul_tn, Accumulate, MatMut, MatRef, Rng};

use crate::error::{Error, Result};

/// A dense layer's shape: input `m × k` times weight `k × n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmShape {
    /// Rows (vertices in the batch).
    pub m: usize,
    /// Input features.
    pub k: usize,
    /// Output features.
    pub n: usize,
}

/// The layer shapes Tandem's models run (GraphSAGE/GCN hidden 256 on 25k- and
/// 200k-row blocks, the 2000-dim WordNet input layer, the 47-class output layer).
pub const LAYER_SHAPES: [GemmShape; 6] = [
    GemmShape {
        m: 25_000,
        k: 128,
        n: 256,
    },
    GemmShape {
        m: 25_000,
        k: 256,
        n: 256,
    },
    GemmShape {
        m: 200_000,
        k: 100,
        n: 256,
    },
    GemmShape {
        m: 4_000,
        k: 2_000,
        n: 256,
    },
    GemmShape {
        m: 1_024,
        k: 256,
        n: 47,
    },
    GemmShape {
        m: 25_000,
        k: 256,
        n: 64,
    },
];

/// Which of a dense layer's three products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmOp {
    /// `Y = X·W` (`m × n`).
    Forward,
    /// `dW = Xᵀ·dY` (`k × n`, reduction over `m`).
    WeightGrad,
    /// `dX = dY·Wᵀ` (`m × k`, reduction over `n`).
    InputGrad,
}

impl GemmOp {
    /// All three, in pass order.
    pub const ALL: [GemmOp; 3] = [GemmOp::Forward, GemmOp::WeightGrad, GemmOp::InputGrad];

    fn label(self) -> &'static str {
        match self {
            GemmOp::Forward => "X·W",
            GemmOp::WeightGrad => "Xᵀ·dY",
            GemmOp::InputGrad => "dY·Wᵀ",
        }
    }
}

/// One timed product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmResult {
    /// The layer shape.
    pub shape: GemmShape,
    /// The product.
    pub op: GemmOp,
    /// GFLOP/s of the fastest repetition.
    pub best_gflops: f64,
    /// GFLOP/s of the median repetition.
    pub median_gflops: f64,
}

/// The measured fp32 FMA peak.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FmaPeak {
    /// The instruction set of the widest loop: `"avx512"`, `"avx2"` or `"scalar"`.
    pub isa: &'static str,
    /// GFLOP/s of the widest loop on all rayon threads (the highest sample).
    pub gflops: f64,
    /// The lowest sample (equal to `gflops` on a quiet machine).
    pub min_gflops: f64,
}

/// What [`bench_gemm`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmReport {
    /// Rayon threads used.
    pub threads: usize,
    /// Timed repetitions per product.
    pub reps: usize,
    /// The FMA peak over the run's samples.
    pub peak: FmaPeak,
    /// One entry per shape and product.
    pub results: Vec<GemmResult>,
}

impl fmt::Display for GemmReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fp32 FMA peak ({}, {}): {:.1} GFLOP/s (samples down to {:.1})",
            self.peak.isa,
            crate::trace::fmt_count(self.threads, "thread"),
            self.peak.gflops,
            self.peak.min_gflops
        )?;
        writeln!(f, "GEMM, best and median of {} reps:", self.reps)?;
        writeln!(
            f,
            "{:>20} {:>6} {:>9} {:>9} {:>7}",
            "shape m×k×n", "op", "best", "median", "%peak"
        )?;
        for r in &self.results {
            let s = r.shape;
            writeln!(
                f,
                "{:>20} {:>6} {:>9.1} {:>9.1} {:>6.1}%",
                format!("{}×{}×{}", s.m, s.k, s.n),
                r.op.label(),
                r.best_gflops,
                r.median_gflops,
                100.0 * r.best_gflops / self.peak.gflops
            )?;
        }
        Ok(())
    }
}

/// Measures GEMM throughput for `shapes` (`reps ≥ 1` timed calls per product) and
/// the fp32 FMA peak, on rayon's current pool.
pub fn bench_gemm(shapes: &[GemmShape], reps: usize) -> Result<GemmReport> {
    if reps == 0 {
        return Err(Error::invalid_argument("reps", "must be at least 1"));
    }
    let mut peaks = Vec::with_capacity(shapes.len() + 1);
    let mut results = Vec::with_capacity(shapes.len() * 3);
    for (idx, &shape) in shapes.iter().enumerate() {
        peaks.push(fma_peak());
        let GemmShape { m, k, n } = shape;
        let mut rng = Rng::new(idx as u64);
        let mut fill =
            |len: usize| -> Vec<f32> { (0..len).map(|_| rng.next_f32() - 0.5).collect() };
        let x = fill(m * k);
        let w = fill(k * n);
        let dy = fill(m * n);
        let mut y = vec![0.0f32; m * n];
        let mut dw = vec![0.0f32; k * n];
        let mut dx = vec![0.0f32; m * k];
        let ctx = |e| Error::cpu_ops(format!("bench_gemm {m}×{k}×{n}"), e);
        let view = |d, r, c| MatRef::new(d, r, c).map_err(ctx);
        let flops = 2.0 * m as f64 * k as f64 * n as f64;
        for op in GemmOp::ALL {
            let mut run = || -> Result<()> {
                match op {
                    GemmOp::Forward => matmul(
                        view(&x, m, k)?,
                        view(&w, k, n)?,
                        MatMut::new(&mut y, m, n).map_err(ctx)?,
                        Accumulate::No,
                    ),
                    GemmOp::WeightGrad => matmul_tn(
                        view(&x, m, k)?,
                        view(&dy, m, n)?,
                        MatMut::new(&mut dw, k, n).map_err(ctx)?,
                        Accumulate::No,
                    ),
                    GemmOp::InputGrad => matmul_nt(
                        view(&dy, m, n)?,
                        view(&w, k, n)?,
                        MatMut::new(&mut dx, m, k).map_err(ctx)?,
                        Accumulate::No,
                    ),
                }
                .map_err(ctx)
            };
            run()?;
            let mut times = Vec::with_capacity(reps);
            for _ in 0..reps {
                let start = Instant::now();
                run()?;
                times.push(start.elapsed().max(Duration::from_nanos(1)));
            }
            times.sort();
            results.push(GemmResult {
                shape,
                op,
                best_gflops: flops / times[0].as_secs_f64() / 1e9,
                median_gflops: flops / times[times.len() / 2].as_secs_f64() / 1e9,
            });
        }
        std::hint::black_box((&y, &dw, &dx));
    }
    peaks.push(fma_peak());
    let peak = FmaPeak {
        isa: peaks[0].isa,
        gflops: peaks.iter().map(|p| p.gflops).fold(0.0, f64::max),
        min_gflops: peaks
            .iter()
            .map(|p| p.min_gflops)
            .fold(f64::INFINITY, f64::min),
    };
    Ok(GemmReport {
        threads: rayon::current_num_threads(),
        reps,
        peak,
        results,
    })
}

/// Loop trips per thread of the FMA loops (each trip: 12 vector FMAs).
const FMA_ITERS: u64 = 20_000_000;

/// Samples the fp32 FMA peak on rayon's pool: three runs of ~40 ms.
pub fn fma_peak() -> FmaPeak {
    let widest = Width::detect();
    let runs: Vec<f64> = (0..3).map(|_| run_fma(widest)).collect();
    FmaPeak {
        isa: widest.name(),
        gflops: runs.iter().copied().fold(0.0, f64::max),
        min_gflops: runs.iter().copied().fold(f64::INFINITY, f64::min),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Width {
    Avx512,
    Avx2,
    Scalar,
}

impl Width {
    fn detect() -> Width {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                return Width::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Width::Avx2;
            }
        }
        Width::Scalar
    }

    fn name(self) -> &'static str {
        match self {
            Width::Avx512 => "avx512",
            Width::Avx2 => "avx2",
            Width::Scalar => "scalar",
        }
    }

    fn lanes(self) -> u64 {
        match self {
            Width::Avx512 => 16,
            Width::Avx2 => 8,
            Width::Scalar => 1,
        }
    }
}

/// One FMA loop per rayon thread at `width` (which the CPU must support);
/// returns GFLOP/s over the wall time of all of them.
fn run_fma(width: Width) -> f64 {
    let start = Instant::now();
    let sums = rayon::broadcast(|_| fma_loop(width, FMA_ITERS));
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    std::hint::black_box(sums);
    let flops = rayon::current_num_threads() as f64
        * FMA_ITERS as f64
        * ACCUMULATORS as f64
        * width.lanes() as f64
        * 2.0;
    flops / secs / 1e9
}

/// Independent FMA chains per loop: more than latency × ports (4 × 2 on Zen 4/5,
/// Intel's cores) so the FMA units never wait.
const ACCUMULATORS: usize = 12;

fn fma_loop(width: Width, iters: u64) -> f32 {
    // The multiplier and addend come through black_box so the loop cannot be folded.
    let a = std::hint::black_box(0.999_999_9f32);
    let b = std::hint::black_box(1e-7f32);
    match width {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Width::Avx512 is only chosen when `avx512f` was detected at run time.
        Width::Avx512 => unsafe { x86::fma_avx512(iters, a, b) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Width::Avx2 is only chosen when `avx2` and `fma` were detected at
        // run time.
        Width::Avx2 => unsafe { x86::fma_avx2(iters, a, b) },
        _ => {
            let mut acc = [0.0f32; ACCUMULATORS];
            for _ in 0..iters {
                for x in acc.iter_mut() {
                    *x = x.mul_add(a, b);
                }
            }
            acc.iter().sum()
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::ACCUMULATORS;

    /// `iters × 12` AVX-512 FMAs (`vfmadd213ps` on 12 zmm accumulators); returns a
    /// checksum. Inline assembly rather than `_mm512_*` intrinsics, which need Rust
    /// 1.89 (written when the workspace's MSRV was 1.85).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    pub(super) unsafe fn fma_avx512(iters: u64, a: f32, b: f32) -> f32 {
        let out: f32;
        // SAFETY: the caller guarantees AVX-512F. The block only touches the
        // registers it names (zmm0-zmm13, declared clobbered through the C ABI's
        // caller-saved set, plus its operands) and no memory.
        unsafe {
            std::arch::asm!(
                "vbroadcastss zmm12, xmm14",
                "vbroadcastss zmm13, xmm15",
                "vpxord zmm0, zmm0, zmm0",
                "vmovaps zmm1, zmm0",
                "vmovaps zmm2, zmm0",
                "vmovaps zmm3, zmm0",
                "vmovaps zmm4, zmm0",
                "vmovaps zmm5, zmm0",
                "vmovaps zmm6, zmm0",
                "vmovaps zmm7, zmm0",
                "vmovaps zmm8, zmm0",
                "vmovaps zmm9, zmm0",
                "vmovaps zmm10, zmm0",
                "vmovaps zmm11, zmm0",
                "2:",
                "vfmadd213ps zmm0, zmm12, zmm13",
                "vfmadd213ps zmm1, zmm12, zmm13",
                "vfmadd213ps zmm2, zmm12, zmm13",
                "vfmadd213ps zmm3, zmm12, zmm13",
                "vfmadd213ps zmm4, zmm12, zmm13",
                "vfmadd213ps zmm5, zmm12, zmm13",
                "vfmadd213ps zmm6, zmm12, zmm13",
                "vfmadd213ps zmm7, zmm12, zmm13",
                "vfmadd213ps zmm8, zmm12, zmm13",
                "vfmadd213ps zmm9, zmm12, zmm13",
                "vfmadd213ps zmm10, zmm12, zmm13",
                "vfmadd213ps zmm11, zmm12, zmm13",
                "dec rcx",
                "jnz 2b",
                // Checksum: the sum of the 12 accumulators' first lanes.
                "vaddps zmm0, zmm0, zmm1",
                "vaddps zmm2, zmm2, zmm3",
                "vaddps zmm4, zmm4, zmm5",
                "vaddps zmm6, zmm6, zmm7",
                "vaddps zmm8, zmm8, zmm9",
                "vaddps zmm10, zmm10, zmm11",
                "vaddps zmm0, zmm0, zmm2",
                "vaddps zmm4, zmm4, zmm6",
                "vaddps zmm8, zmm8, zmm10",
                "vaddps zmm0, zmm0, zmm4",
                "vaddps zmm0, zmm0, zmm8",
                "vzeroupper",
                inout("rcx") iters.max(1) => _,
                in("xmm14") a,
                in("xmm15") b,
                lateout("xmm0") out,
                clobber_abi("C"),
                options(nomem, nostack),
            );
        }
        out * 16.0
    }

    /// `iters × 12` dependent-by-column `_mm256_fmadd_ps`; returns a checksum.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma_avx2(iters: u64, a: f32, b: f32) -> f32 {
        let va = _mm256_set1_ps(a);
        let vb = _mm256_set1_ps(b);
        let mut acc = [_mm256_setzero_ps(); ACCUMULATORS];
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, va, vb);
            }
        }
        let mut s = _mm256_setzero_ps();
        for x in acc {
            s = _mm256_add_ps(s, x);
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds 8 f32 and the store has no alignment requirement.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), s) };
        lanes.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_report_has_every_product_and_prints() {
        let shapes = [
            GemmShape {
                m: 300,
                k: 33,
                n: 17,
            },
            GemmShape { m: 5, k: 1, n: 2 },
        ];
        let report = bench_gemm(&shapes, 2).unwrap();
        assert_eq!(report.results.len(), 6);
        assert!(report.peak.gflops > 0.0);
        assert!(report
            .results
            .iter()
            .all(|r| r.best_gflops >= r.median_gflops));
        let text = report.to_string();
        assert!(
            text.contains("300×33×17") && text.contains("Xᵀ·dY"),
            "{text}"
        );
        assert!(bench_gemm(&shapes, 0).is_err());
    }

    #[test]
    fn fma_loops_agree() {
        let widest = Width::detect();
        let scalar = fma_loop(Width::Scalar, 1000) / ACCUMULATORS as f32;
        let wide = fma_loop(widest, 1000) / (ACCUMULATORS as u64 * widest.lanes()) as f32;
        assert!((scalar - wide).abs() < 1e-6, "{scalar} {wide}");
    }
}
