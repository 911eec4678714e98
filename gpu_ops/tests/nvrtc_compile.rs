//! NVRTC compile check of every CUDA kernel (`gpu_ops/kernels/*.cu`), for the GPU
//! machines' architectures (compute capability 9.0, H100/H200) and 8.0 (A100). Needs
//! libnvrtc, not a GPU: `.ci/nvrtc` fetches the pinned NVRTC 13.0 wheel and prints the
//! `LD_LIBRARY_PATH` to use.
//!
//! Without libnvrtc (or without the `cuda` feature) each test prints `skipped: ...`
//! and passes, unless `TANDEM_REQUIRE_NVRTC=1`, which the CI sets after installing
//! NVRTC: then a missing library is a failure.

use gpu_ops::{CudaBackend, GpuOpsError};

/// Architectures the kernels must compile for.
const ARCHS: [(u32, u32); 2] = [(9, 0), (8, 0)];

/// The kernel files (`gpu_ops/kernels/*.cu`).
const FILES: [&str; 7] = [
    "math.cu",
    "features.cu",
    "scan.cu",
    "sample.cu",
    "aggregate.cu",
    "attention.cu",
    "link.cu",
];

fn required() -> bool {
    std::env::var("TANDEM_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
}

/// `Some(result)`, or `None` after printing why the check is skipped.
fn or_skip<T>(r: gpu_ops::Result<T>) -> Option<gpu_ops::Result<T>> {
    match r {
        Err(GpuOpsError::Unavailable { reason, .. }) if !required() => {
            println!("skipped: {reason}");
            None
        }
        other => Some(other),
    }
}

#[test]
fn every_kernel_compiles() {
    for cc in ARCHS {
        let Some(r) = or_skip(CudaBackend::compile_kernels(cc)) else {
            return;
        };
        // A compile error prints NVRTC's log (GpuOpsError::Compile's Display).
        let files = r.unwrap_or_else(|e| panic!("compute_{}{}: {e}", cc.0, cc.1));
        let names: Vec<&str> = files.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(names, FILES, "compute_{}{}", cc.0, cc.1);
        for (file, ptx_bytes) in &files {
            assert!(*ptx_bytes > 0, "{file}: empty PTX");
        }
    }
}

/// The PTX targets the requested architecture, and its ISA version is one the GPU
/// machines' CUDA 13.0 driver loads (PTX ISA 9.0; a newer NVRTC would emit a newer
/// version the driver refuses).
#[test]
fn ptx_targets_the_architecture_and_a_loadable_isa() {
    let src = "#include \"common.cuh\"\n\
               extern \"C\" __global__ void twice(float* x, u64 n) {\n\
                   for (u64 i = thread_index(); i < n; i += thread_count()) x[i] *= 2.0f;\n\
               }\n";
    for cc in ARCHS {
        let Some(r) = or_skip(CudaBackend::compile_source("twice.cu", src, cc)) else {
            return;
        };
        let ptx = r.unwrap_or_else(|e| panic!("{e}"));
        let target = format!(".target sm_{}{}", cc.0, cc.1);
        assert!(ptx.contains(&target), "no `{target}` in:\n{ptx}");
        assert!(
            ptx.contains(".entry twice("),
            "unmangled entry point:\n{ptx}"
        );
        let version = ptx
            .lines()
            .find_map(|l| l.trim().strip_prefix(".version "))
            .expect("PTX without a .version line");
        let (major, minor) = version.trim().split_once('.').expect("version x.y");
        let v = (major.parse::<u32>().unwrap(), minor.parse::<u32>().unwrap());
        assert!(
            v <= (9, 0),
            "PTX ISA {version} is newer than the CUDA 13.0 driver's 9.0"
        );
    }
}

#[test]
fn a_broken_kernel_is_a_compile_error_with_the_log() {
    let src = "#include \"common.cuh\"\n\
               extern \"C\" __global__ void broken(float* x) {\n\
                   x[0] = undefined_name;\n\
               }\n";
    let Some(r) = or_skip(CudaBackend::compile_source("broken.cu", src, (9, 0))) else {
        return;
    };
    match r {
        Err(GpuOpsError::Compile { kernel, log }) => {
            assert_eq!(kernel, "broken.cu");
            assert!(log.contains("undefined_name"), "log: {log}");
            // Line numbers are the file's own, despite the pasted header.
            assert!(log.contains("broken.cu(3)"), "log: {log}");
        }
        other => panic!("expected a Compile error, got {other:?}"),
    }
}

/// The kernels launched with 1,024-thread blocks (the scan tiles and the passes
/// fused into them) carry `__launch_bounds__(1024)` into the PTX (`.maxntid`), so
/// ptxas keeps them within the 64 registers a thread such a block allows.
#[test]
fn scan_tile_kernels_are_bounded_to_their_block() {
    let files = [
        (
            "scan.cu",
            include_str!("../kernels/scan.cu"),
            &["scan_u32_tiles", "scan_u64_tiles"][..],
        ),
        (
            "sample.cu",
            include_str!("../kernels/sample.cu"),
            &["sample_count_scan", "unique_flag_scan"][..],
        ),
    ];
    for (file, src, kernels) in files {
        let Some(r) = or_skip(CudaBackend::compile_source(file, src, (9, 0))) else {
            return;
        };
        let ptx = r.unwrap_or_else(|e| panic!("{e}"));
        for k in kernels {
            let entry = ptx
                .find(&format!(".entry {k}("))
                .unwrap_or_else(|| panic!("{file}: no entry {k}"));
            let body = &ptx[entry..];
            let head = &body[..body.find('{').expect("entry body")];
            assert!(head.contains(".maxntid 1024"), "{file} {k}: {head}");
        }
    }
}
