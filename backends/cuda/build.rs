//! Builds the CUDA kernels of `cuda-kernels/` into images embedded in this crate.
//!
//! With nvcc (`$NVCC`, PATH, `$CUDA_HOME`, `/usr/local/cuda`, or `./.venv-nvcc` from
//! `scripts/install-nvcc.sh`): a fatbin per kernel file, sm_90a SASS + compute_80 PTX. Without:
//! only the sources, which the backend compiles with NVRTC at first use. The sources are embedded
//! in both cases (NVRTC is also the fallback for a GPU the fatbin has no code for). A kernel that
//! nvcc rejects fails the build: a broken kernel must not silently fall back to run time.
//!
//! The compile lives here rather than in the facade's build.rs so that the backend crate is
//! self-contained: its own GPU tests and benchmark reach the kernels, and the facade only calls
//! `ferrattn_cuda::CudaBackend::new(0)`.

use std::path::PathBuf;
use std::process::Command;

include!("build_support.rs");
use build_support::*;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest.join("../..").canonicalize().unwrap();
    let kernels = workspace.join("cuda-kernels");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for v in [NVCC_ENV, NO_NVCC_ENV, "PATH", "CUDA_HOME"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    println!("cargo:rerun-if-changed={}", kernels.display());
    println!("cargo:rerun-if-changed=build_support.rs");
    mark_gpu_tests_ignored_without_a_driver();

    let choice = find_nvcc(
        std::env::var(NVCC_ENV).ok().as_deref(),
        std::env::var(NO_NVCC_ENV).ok().as_deref(),
        std::env::var("PATH").ok().as_deref(),
        std::env::var("CUDA_HOME").ok().as_deref(),
        &workspace,
    )
    .unwrap_or_else(|e| panic!("ferrattn-cuda build: {e}"));

    let common =
        std::fs::read_to_string(kernels.join("common.cuh")).expect("cuda-kernels/common.cuh");
    println!(
        "cargo:rerun-if-changed={}",
        kernels.join("common.cuh").display()
    );
    // headers of one kernel family (every *.cuh but common.cuh), inlined after common.cuh
    let mut headers: Vec<(String, String)> = std::fs::read_dir(&kernels)
        .expect("cuda-kernels/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "cuh")
                && p.file_name().is_some_and(|n| n != "common.cuh")
        })
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    headers.sort();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .expect("cuda-kernels/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();

    let mut images = Vec::new();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f.file_stem().unwrap().to_string_lossy().to_string();
        let mut src = inline_common(&std::fs::read_to_string(f).unwrap(), &common);
        for (h, text) in &headers {
            src = inline_header(&src, h, text);
        }
        let src_path = out.join(format!("{name}.nvrtc.cu"));
        std::fs::write(&src_path, src).unwrap();
        let fatbin = match &choice {
            NvccChoice::Found(nvcc) => {
                let fb = out.join(format!("{name}.fatbin"));
                let status = Command::new(nvcc)
                    .args(NVCC_FLAGS)
                    .arg(format!("-I{}", kernels.display()))
                    .arg("-o")
                    .arg(&fb)
                    .arg(f)
                    .status()
                    .unwrap_or_else(|e| {
                        panic!("ferrattn-cuda build: cannot run {}: {e}", nvcc.display())
                    });
                assert!(
                    status.success(),
                    "ferrattn-cuda build: nvcc failed on {} ({status})",
                    f.display()
                );
                Some(fb)
            }
            NvccChoice::Absent(_) => None,
        };
        images.push((name, fatbin, src_path));
    }
    let note = match &choice {
        NvccChoice::Found(p) => {
            let v = Command::new(p)
                .arg("--version")
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .last()
                        .unwrap_or("")
                        .to_string()
                })
                .unwrap_or_default();
            format!(
                "fatbin from {} ({v}): {}",
                p.display(),
                NVCC_FLAGS[3..].join(" ")
            )
        }
        NvccChoice::Absent(why) => format!("sources only, compiled by NVRTC at first use: {why}"),
    };
    if let NvccChoice::Absent(why) = &choice {
        println!(
            "cargo:warning=ferrattn-cuda: {why}; kernels will be compiled by NVRTC at run time"
        );
    }
    std::fs::write(out.join("kernels.rs"), generated_rs(&images, &note)).unwrap();
}

/// GPU tests carry `#[cfg_attr(ferrattn_no_gpu, ignore = ...)]`: built where no CUDA driver
/// library exists (CI, laptops) they are reported as ignored with the reason rather than as
/// passed. Binaries built here and carried to a GPU machine run them with `--include-ignored`;
/// each test still checks for a usable GPU at run time.
fn mark_gpu_tests_ignored_without_a_driver() {
    println!("cargo::rustc-check-cfg=cfg(ferrattn_no_gpu)");
    println!("cargo:rerun-if-env-changed=LD_LIBRARY_PATH");
    let mut dirs: Vec<PathBuf> = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/nvidia/lib64",
        "/usr/local/cuda/compat",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    if let Ok(paths) = std::env::var("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&paths));
    }
    let found = dirs
        .iter()
        .any(|d| d.join("libcuda.so.1").exists() || d.join("libcuda.so").exists());
    if !found {
        println!("cargo:rustc-cfg=ferrattn_no_gpu");
    }
}
