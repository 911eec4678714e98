//! The trainer's compute pool: a local rayon [`ThreadPool`] sized by
//! `threads.compute`, optionally with each worker pinned to a core
//! (`threads.pin = "cores"`).
//!
//! Each trainer owns its pool and runs its work inside `pool.install`, so two
//! trainers in one process do not share (or fight over) rayon's global pool, and a
//! library user's own use of the global pool is untouched.
//!
//! # Pinning (cargo feature `hwloc`)
//! 1. Load the hwloc topology once and list its cores (those the process may use)
//!    in hwloc's logical order.
//! 2. Each worker's rayon `start_handler` binds the worker's thread (hwloc
//!    `set_cpubind` with the THREAD flag) to core `index % cores`, i.e. worker `i`
//!    to core `i`, wrapping when there are more workers than cores. A failure is
//!    recorded, not panicked on (the handler cannot return an error).
//! 3. After building, one broadcast job runs on every worker; a worker takes jobs
//!    only after its start handler returned, so every binding is then done and any
//!    recorded failure becomes this function's error.
//!
//! Without the feature, `pin = "cores"` is an error saying the build lacks `hwloc`.

use rayon::ThreadPool;

use crate::error::{Error, Result};

/// Builds the compute pool: `threads` workers (0: one per core, or
/// `RAYON_NUM_THREADS` when set), named `tandem-compute-<i>`, each bound to a
/// core when `pin_cores` (`threads.pin = "cores"`).
pub fn build_pool(threads: usize, pin_cores: bool) -> Result<ThreadPool> {
    let builder = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("tandem-compute-{i}"));
    if pin_cores {
        pinned(builder)
    } else {
        builder
            .build()
            .map_err(|e| Error::invalid_argument("threads.compute", e.to_string()))
    }
}

#[cfg(not(feature = "hwloc"))]
fn pinned(_: rayon::ThreadPoolBuilder) -> Result<ThreadPool> {
    Err(Error::invalid_argument(
        "threads.pin",
        "\"cores\" needs thread pinning, and this build lacks the `hwloc` cargo feature \
         (rebuild with `cargo build --release -p runtime --features hwloc`, which needs \
         libhwloc-dev, libudev-dev and pkg-config), or set threads.pin = \"none\"",
    ))
}

#[cfg(feature = "hwloc")]
fn pinned(builder: rayon::ThreadPoolBuilder) -> Result<ThreadPool> {
    use parking_lot::Mutex;
    use std::sync::Arc;

    let pinner = Arc::new(hwloc::CorePinner::new()?);
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let (p, f) = (Arc::clone(&pinner), Arc::clone(&failures));
    let pool = builder
        .start_handler(move |i| {
            if let Err(e) = p.bind_current_thread(i) {
                f.lock().push(e);
            }
        })
        .build()
        .map_err(|e| Error::invalid_argument("threads.compute", e.to_string()))?;
    // Every worker has run its start handler once it runs a job.
    pool.broadcast(|_| ());
    let failures = failures.lock();
    if let Some(first) = failures.first() {
        return Err(Error::invalid_argument(
            "threads.pin",
            format!(
                "{} of {} workers could not be pinned; first: {first}",
                failures.len(),
                pool.current_num_threads()
            ),
        ));
    }
    Ok(pool)
}

/// Binds the calling thread to core `core % cores` (long-lived threads outside the
/// compute pool, e.g. the hot-row workers, placed after the pool's cores).
#[cfg(feature = "hwloc")]
pub(crate) fn pin_current_thread(core: usize) -> Result<()> {
    let pinner = hwloc::CorePinner::new()?;
    pinner
        .bind_current_thread(core)
        .map_err(|e| Error::invalid_argument("threads.pin", e))
}

/// Without the `hwloc` feature there is nothing to bind with.
#[cfg(not(feature = "hwloc"))]
pub(crate) fn pin_current_thread(_core: usize) -> Result<()> {
    Err(Error::invalid_argument(
        "threads.pin",
        "this build lacks the `hwloc` cargo feature",
    ))
}

/// Core binding through hwloc (feature `hwloc`).
#[cfg(feature = "hwloc")]
pub mod hwloc {
    use hwlocality::cpu::binding::CpuBindingFlags;
    use hwlocality::cpu::cpuset::CpuSet;
    use hwlocality::object::types::ObjectType;
    use hwlocality::Topology;

    use crate::error::{Error, Result};

    /// The machine's cores and the means to bind threads to them.
    pub struct CorePinner {
        topology: Topology,
        cores: Vec<CpuSet>,
    }

    impl CorePinner {
        /// Loads the topology; an error when it cannot be loaded or lists no core.
        pub fn new() -> Result<Self> {
            let topology = Topology::new().map_err(|e| {
                Error::invalid_argument("threads.pin", format!("loading the hwloc topology: {e}"))
            })?;
            let cores: Vec<CpuSet> = topology
                .objects_with_type(ObjectType::Core)
                .filter_map(|c| c.cpuset().map(|s| s.clone_target()))
                .filter(|s| !s.is_empty())
                .collect();
            if cores.is_empty() {
                return Err(Error::invalid_argument(
                    "threads.pin",
                    "hwloc lists no core with a CPU set on this machine",
                ));
            }
            Ok(Self { topology, cores })
        }

        /// The cores, in hwloc's logical order (each a set of processing units).
        #[cfg(test)]
        pub fn cores(&self) -> &[CpuSet] {
            &self.cores
        }

        /// The core worker `worker` is bound to: `worker % cores`.
        pub fn core_for(&self, worker: usize) -> &CpuSet {
            &self.cores[worker % self.cores.len()]
        }

        /// Binds the calling thread to [`CorePinner::core_for`]`(worker)`.
        pub fn bind_current_thread(&self, worker: usize) -> std::result::Result<(), String> {
            let core = self.core_for(worker);
            self.topology
                .bind_cpu(core, CpuBindingFlags::THREAD)
                .map_err(|e| format!("binding worker {worker} to core {core}: {e}"))
        }

        /// The calling thread's current CPU binding.
        #[cfg(test)]
        pub fn current_thread_binding(&self) -> std::result::Result<CpuSet, String> {
            self.topology
                .cpu_binding(CpuBindingFlags::THREAD)
                .map_err(|e| format!("reading the thread's CPU binding: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpinned_pool_has_the_configured_size_and_names() {
        let pool = build_pool(3, false).unwrap();
        assert_eq!(pool.current_num_threads(), 3);
        let names = pool.broadcast(|_| std::thread::current().name().map(String::from));
        for (i, n) in names.iter().enumerate() {
            assert_eq!(n.as_deref(), Some(format!("tandem-compute-{i}").as_str()));
        }
    }

    #[cfg(not(feature = "hwloc"))]
    #[test]
    fn pinning_without_hwloc_is_an_error_naming_the_feature() {
        let e = build_pool(2, true).unwrap_err().to_string();
        assert!(e.contains("threads.pin") && e.contains("hwloc"), "{e}");
    }

    #[cfg(feature = "hwloc")]
    #[test]
    fn pinned_workers_report_their_core_binding() {
        let pinner = hwloc::CorePinner::new().unwrap();
        // More workers than cores exercises the wrap-around too.
        let workers = pinner.cores().len() + 1;
        let pool = build_pool(workers, true).unwrap();
        let got = pool.broadcast(|ctx| (ctx.index(), pinner.current_thread_binding()));
        assert_eq!(got.len(), workers);
        for (i, binding) in got {
            let binding = binding.unwrap();
            assert_eq!(&binding, pinner.core_for(i), "worker {i}");
        }
        // The calling thread is not a worker and stays unbound by the pool.
        let unpinned = build_pool(1, false).unwrap();
        let free = unpinned.install(|| pinner.current_thread_binding().unwrap());
        assert!(pinner.cores().iter().all(|c| free.includes(c)), "{free}");
    }
}
