//! Build script of `ferrattn-ascend`.
//!
//! Without a CANN toolkit it only says so: the crate builds and runs the simulated schedule.
//! With only the AscendCL headers (`FERRATTN_ACL_INCLUDE`, a directory holding `acl/acl.h`, as
//! CI extracts them from the `torch-npu` wheel) and feature `bindgen`, it generates the bindings
//! and builds no kernel.
//! With one (`ASCEND_TOOLKIT_HOME` or `ASCEND_HOME_PATH`, else `/usr/local/Ascend/ascend-toolkit/latest`):
//! * with feature `bindgen`, regenerates the AscendCL bindings from `include/acl/acl.h` and the
//!   crate checks its checked-in signatures against them (`cfg(ferrattn_acl_bindgen)`);
//! * builds the AscendC kernel library with CMake (`ascend-kernels/amla/CMakeLists.txt`) and
//!   tells the crate where the kernel binary is (`FERRATTN_AMLA_KERNEL_BUILD`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn toolkit() -> Option<PathBuf> {
    for var in ["ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"] {
        if let Some(p) = std::env::var_os(var) {
            let p = PathBuf::from(p);
            if p.join("include/acl/acl.h").exists() {
                return Some(p);
            }
        }
    }
    let default = PathBuf::from("/usr/local/Ascend/ascend-toolkit/latest");
    default
        .join("include/acl/acl.h")
        .exists()
        .then_some(default)
}

fn main() {
    println!("cargo:rerun-if-env-changed=ASCEND_TOOLKIT_HOME");
    println!("cargo:rerun-if-env-changed=ASCEND_HOME_PATH");
    println!("cargo:rerun-if-env-changed=FERRATTN_ASCEND_SOC");
    println!("cargo:rerun-if-changed=../../ascend-kernels/amla");
    println!("cargo:rerun-if-env-changed=FERRATTN_ACL_INCLUDE");
    println!("cargo:rustc-check-cfg=cfg(ferrattn_acl_bindgen)");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Some(inc) = std::env::var_os("FERRATTN_ACL_INCLUDE") {
        bindings(&PathBuf::from(inc), &out);
        return;
    }
    let Some(home) = toolkit() else {
        println!(
            "cargo:warning=ferrattn-ascend: no CANN toolkit (ASCEND_TOOLKIT_HOME/ASCEND_HOME_PATH with include/acl/acl.h); \
             the AMLA kernel is not built and the backend runs its simulated schedule"
        );
        return;
    };
    bindings(&home.join("include"), &out);
    build_kernel(&home, &out);
}

/// Generates the AscendCL bindings from `<include>/acl/acl.h` (the entry points of
/// `acl::ENTRY_POINTS` and the enums they take). A failure is a build error: with feature
/// `bindgen` the caller asked for the check against the real headers.
#[cfg(feature = "bindgen")]
fn bindings(include: &Path, out: &Path) {
    let header = include.join("acl/acl.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let result = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("-I{}", include.display()))
        .clang_arg(format!("-I{}", include.join("acl").display()))
        .allowlist_function("acl(Init|Finalize|GetRecentErrMsg)")
        .allowlist_function("aclrt(SetDevice|ResetDevice|GetDeviceCount|CreateStream|DestroyStream|Malloc|Free|Memcpy|Memset|SynchronizeStream)")
        .allowlist_function("aclrt(BinaryLoadFromData|BinaryUnLoad|BinaryGetFunction|KernelArgsInit|KernelArgsAppend|KernelArgsFinalize|LaunchKernelWithConfig)")
        .allowlist_function("aclrt(GetHardwareSyncAddr|GetDeviceInfo)")
        .allowlist_type("aclrt(MemMallocPolicy|MemcpyKind|DevAttr)")
        .generate();
    match result {
        Ok(b) => {
            b.write_to_file(out.join("acl_bindings.rs"))
                .expect("OUT_DIR is writable");
            println!("cargo:rustc-cfg=ferrattn_acl_bindgen");
        }
        Err(e) => panic!("bindgen on {} failed: {e}", header.display()),
    }
}

#[cfg(not(feature = "bindgen"))]
fn bindings(_include: &Path, _out: &Path) {}

fn build_kernel(home: &Path, out: &Path) {
    let src = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("../../ascend-kernels/amla");
    let build = out.join("amla-kernel");
    let soc = std::env::var("FERRATTN_ASCEND_SOC").unwrap_or_else(|_| "Ascend910B1".into());
    let configure = Command::new("cmake")
        .arg("-S")
        .arg(&src)
        .arg("-B")
        .arg(&build)
        .arg(format!("-DASCEND_CANN_PACKAGE_PATH={}", home.display()))
        .arg(format!("-DSOC_VERSION={soc}"))
        .arg("-DCMAKE_BUILD_TYPE=Release")
        .status();
    let built = match configure {
        Ok(s) if s.success() => Command::new("cmake")
            .arg("--build")
            .arg(&build)
            .arg("-j")
            .status(),
        other => other,
    };
    match built {
        Ok(s) if s.success() => {
            println!("cargo:rustc-env=FERRATTN_AMLA_KERNEL_BUILD={}", build.display());
        }
        Ok(s) => println!("cargo:warning=ferrattn-ascend: AMLA kernel CMake build failed ({s}); the backend will report it"),
        Err(e) => println!("cargo:warning=ferrattn-ascend: could not run cmake ({e}); the AMLA kernel is not built"),
    }
}
