//! Backend parity: every [`Backend`] op against the plain `cpu_ops` reference (the
//! scalar twins, in `f64` where one exists) on random inputs with odd sizes.
//!
//! Each test is written once as a generic function over `B: Backend`; the
//! `parity_tests!` macro instantiates all of them per backend (`mod host`, and
//! `mod cuda`, whose tests print `skipped: <reason>` and pass when no GPU or CUDA
//! library is available).
//!
//! Floating-point results are compared with a tolerance relative to the largest
//! reference value (a device sums in other orders); copies, counts, sampling
//! structure and relabelling are compared exactly. Where the host backend must be
//! exact (Adam against `cpu_ops::Adam`, sampling and dropout against `cpu_ops` for
//! the same seed) the test checks bits when `kind()` is `Host`.
//!
//! Every op gets buffers longer than it needs: inputs are padded with NaN (reading
//! past the prefix would poison the result) and outputs with a sentinel that must
//! survive (writing past the prefix would overwrite it).

// The cases, by op family, in `tests/parity/` (a crate root finds its modules
// beside it, hence the paths).
#[path = "parity/dense.rs"]
mod dense;
#[path = "parity/errors.rs"]
mod errors;
#[path = "parity/graph.rs"]
mod graph;
#[path = "parity/helpers.rs"]
mod helpers;
#[path = "parity/link.rs"]
mod link;
#[path = "parity/memory.rs"]
mod memory;
#[path = "parity/model.rs"]
mod model;
#[path = "parity/rows.rs"]
mod rows;
#[path = "parity/sampling.rs"]
mod sampling;
#[path = "parity/sparse.rs"]
mod sparse;

use dense::*;
use errors::*;
use graph::*;
use link::*;
use memory::*;
use model::*;
use rows::*;
use sampling::*;
use sparse::*;

/// Instantiates every test of the submodules for one backend:
/// `parity_tests!(Type, constructor)`, the constructor returning
/// `gpu_ops::Result<Type>`. Every test builds its own backend (tests run in
/// parallel, and a backend reports a device-side error at its next
/// synchronization, whichever test makes it; compiled kernels are cached per
/// process, so this costs a context bind and module loads); if that fails, the
/// test prints `skipped: <reason>` and passes.
macro_rules! parity_tests {
    ($B:ty, $new:expr) => {
        fn dev() -> Option<$B> {
            match $new {
                Ok(d) => Some(d),
                Err(reason) => {
                    println!("skipped: {reason}");
                    None
                }
            }
        }

        /// Two backends on two threads: one keeps failing a gather on the
        /// device, the other never sees that error.
        #[test]
        fn two_backends_on_two_threads_keep_their_own_errors() {
            if let (Some(a), Some(b)) = (dev(), dev()) {
                super::two_backends_keep_their_own_errors(&a, &b);
            }
        }

        parity_tests!(@each
            round_trip,
            upload_pinned_at_offsets,
            download_pinned_orders_on_its_stream,
            events_time_forward,
            gemm_all_transposes,
            gemm_tf32,
            bias_add_and_grad,
            activations_forward_backward,
            dropout_masks,
            fused_hidden_layer_ops_equal_the_unfused_ones,
            softmax_cross_entropy_matches,
            adam_matches_cpu_ops,
            adam_all_and_the_deferred_loss_match_the_single_ops,
            aggregate_forward_backward,
            self_loops_append_each_destination,
            gat_forward_backward,
            index_select_and_put_rows,
            gather_through_the_cache,
            widen_bf16_is_exact,
            widen_bf16_at_is_exact,
            count_nonfinite_counts_nan_and_inf,
            scale_is_one_product_per_value,
            update_cache_stays_in_budget,
            sampling_structure,
            queued_batches_resolve_to_sampled_ones_in_one_read,
            top_layers_read_ahead_equal_hop_by_hop,
            sample_hop_reproduces_sample,
            sample_hop_skip_mask,
            queued_hops_equal_sample_hop,
            sample_hop_errors,
            unique_relabel_contract,
            malformed_blocks_are_errors,
            too_short_buffers_are_size_mismatch,
            sparse_rows_gather_and_products,
            device_model_step_matches_the_host_backend,
            pair_ops_match_cpu_ops,
            bce_matches_cpu_ops,
            negatives_are_identical_on_every_backend,
            exclude_edges_match_cpu_ops,
        );
    };
    (@each $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if let Some(d) = dev() {
                    super::$name(&d);
                }
            }
        )*
    };
}

mod host {
    parity_tests!(
        gpu_ops::HostBackend,
        Ok::<_, gpu_ops::GpuOpsError>(gpu_ops::HostBackend::new())
    );
}

mod cuda {
    parity_tests!(gpu_ops::CudaBackend, gpu_ops::CudaBackend::new(0));
}
