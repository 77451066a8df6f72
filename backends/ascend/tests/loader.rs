//! The run-time loader without CANN: each failure is its typed error, and the backend falls
//! back to the simulation with the reason recorded. Fixture libraries are built here with the
//! system C compiler (`cc`) from `tests/fixtures/fake_ascendcl.c`.

mod common;

use common::{amla_plan, mla_inputs};
use ferrattn_ascend::device::AclLibrary;
use ferrattn_ascend::{AscendBackend, AscendError, BackendConfig};
use ferrattn_core::backend::{AmlaDecode, Availability, Device};
use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrattn-ascend-loader-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fixture(name: &str, defines: &[&str]) -> PathBuf {
    let out = scratch().join(format!("{name}.so"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_ascendcl.c");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .args(defines.iter().map(|d| format!("-D{d}")))
        .status()
        .expect("the loader tests need the system C compiler `cc`");
    assert!(status.success(), "cc failed on {}", src.display());
    out
}

fn kernel_file(name: &str, bytes: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn elf_like() -> Vec<u8> {
    let mut v = b"\x7fELF\x02\x01\x01".to_vec();
    v.resize(256, 0);
    v
}

/// The backend fell back, says why in its availability and in a result's provenance.
fn assert_falls_back(be: &AscendBackend, needle: &str) {
    match be.availability() {
        Availability::Simulated { reason } => assert!(reason.contains(needle), "{reason}"),
        other => panic!("expected Simulated, got {other:?}"),
    }
    let (p, x) = mla_inputs(1, 1, 20, 2, 32, 16, 1.0, None, false, 2);
    let out = be.run_amla(&amla_plan(&p, 16, true), &x).unwrap();
    let why = out
        .provenance
        .simulated
        .expect("simulated result must say so");
    assert!(why.contains(needle), "{why}");
}

#[test]
fn missing_library() {
    let cfg = BackendConfig {
        library: Some("/nonexistent/ascend/libascendcl.so".into()),
        ..Default::default()
    };
    let be = AscendBackend::with_config(&cfg);
    assert!(
        matches!(
            be.fallback_error(),
            Some(AscendError::LibraryNotFound { .. })
        ),
        "{:?}",
        be.fallback_error()
    );
    assert_falls_back(&be, "libascendcl.so could not be loaded");
    // a file that is not a shared library at all
    let junk = kernel_file("not-a-library.so", b"plain text");
    assert!(matches!(
        AclLibrary::open(&junk),
        Err(AscendError::LibraryNotFound { .. })
    ));
}

#[test]
fn missing_symbol() {
    let lib = fixture("nolaunch", &["OMIT_LAUNCH", "DEVICE_COUNT=1"]);
    match AclLibrary::open(&lib) {
        Err(AscendError::MissingSymbol { symbol, .. }) => {
            assert_eq!(symbol, "aclrtLaunchKernelWithConfig")
        }
        other => panic!("expected MissingSymbol, got {:?}", other.err()),
    }
    let be = AscendBackend::with_config(&BackendConfig {
        library: Some(lib),
        ..Default::default()
    });
    assert_falls_back(&be, "has no symbol aclrtLaunchKernelWithConfig");
}

#[test]
fn bad_kernel_binary() {
    let lib = fixture("onedev", &["DEVICE_COUNT=1"]);
    let acl = AclLibrary::open(&lib).expect("the full fixture resolves every symbol");
    // the loader resolves exactly the list the bindgen check compares
    assert_eq!(acl.resolved, ferrattn_ascend::acl::ENTRY_POINTS);
    let bad = kernel_file(
        "bad_kernel.o",
        b"this is not an ELF object, just some bytes padded out to pass the size check ......",
    );
    let be = AscendBackend::with_config(&BackendConfig {
        library: Some(lib.clone()),
        kernel: Some(bad),
        device_id: 0,
    });
    assert!(
        matches!(
            be.fallback_error(),
            Some(AscendError::BadKernelBinary { .. })
        ),
        "{:?}",
        be.fallback_error()
    );
    assert_falls_back(&be, "not a valid kernel binary");

    let missing = scratch().join("no_such_kernel.o");
    let be = AscendBackend::with_config(&BackendConfig {
        library: Some(lib),
        kernel: Some(missing),
        device_id: 0,
    });
    assert!(matches!(
        be.fallback_error(),
        Some(AscendError::KernelNotFound { .. })
    ));
}

#[test]
fn runtime_rejects_the_binary_with_api_and_code() {
    let lib = fixture("loadfail", &["DEVICE_COUNT=1", "LOAD_ERROR=507899"]);
    let k = kernel_file("elf_like.o", &elf_like());
    let be = AscendBackend::with_config(&BackendConfig {
        library: Some(lib),
        kernel: Some(k),
        device_id: 0,
    });
    match be.fallback_error() {
        Some(AscendError::Acl { api, code, message }) => {
            assert_eq!((*api, *code), ("aclrtBinaryLoadFromData", 507899));
            assert_eq!(
                message.as_deref(),
                Some("fake: data is not an Ascend kernel binary")
            );
        }
        other => panic!("expected Acl error, got {other:?}"),
    }
    assert_falls_back(&be, "aclrtBinaryLoadFromData failed with code 507899");
}

#[test]
fn no_device() {
    let lib = fixture("nodev", &["DEVICE_COUNT=0"]);
    let k = kernel_file("elf_like2.o", &elf_like());
    let be = AscendBackend::with_config(&BackendConfig {
        library: Some(lib),
        kernel: Some(k),
        device_id: 0,
    });
    assert!(
        matches!(
            be.fallback_error(),
            Some(AscendError::NoDevice { count: 0 })
        ),
        "{:?}",
        be.fallback_error()
    );
    assert_falls_back(&be, "reports 0 devices");
}
