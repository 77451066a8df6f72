//! The kernel build's decisions (build_support.rs, shared with build.rs), tested without a build:
//! where nvcc is looked for, when the NVRTC-only path is taken, and what gets embedded.

#[path = "../build_support.rs"]
mod support;
use support::build_support::*;

use std::path::Path;

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ferrattn-build-logic-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn no_nvcc_anywhere_means_sources_only_with_the_places_looked_in() {
    let ws = tmpdir("empty");
    let c = find_nvcc(
        None,
        None,
        Some(ws.to_str().unwrap()),
        Some("/nonexistent-cuda"),
        &ws,
    )
    .unwrap();
    match c {
        NvccChoice::Absent(why) => {
            assert!(
                why.contains("PATH") && why.contains("/nonexistent-cuda/bin/nvcc"),
                "{why}"
            )
        }
        NvccChoice::Found(p) if p == Path::new("/usr/local/cuda/bin/nvcc") => {
            eprintln!("this machine has /usr/local/cuda; the absent case cannot be shown here")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn nvcc_is_found_on_path_and_in_the_wheel_venv_and_the_opt_out_wins() {
    let ws = tmpdir("found");
    let bin = ws.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("nvcc"), "#!/bin/sh\n").unwrap();
    let path = bin.to_str().unwrap();
    assert_eq!(
        find_nvcc(None, None, Some(path), None, &ws).unwrap(),
        NvccChoice::Found(bin.join("nvcc"))
    );
    // FERRATTN_NO_NVCC=1 forces the NVRTC-only build even with nvcc present
    assert!(matches!(
        find_nvcc(None, Some("1"), Some(path), None, &ws).unwrap(),
        NvccChoice::Absent(_)
    ));
    assert!(matches!(
        find_nvcc(None, Some("0"), Some(path), None, &ws).unwrap(),
        NvccChoice::Found(_)
    ));
    // the layout scripts/install-nvcc.sh creates
    let venv = ws.join(".venv-nvcc/lib/python3.11/site-packages/nvidia/cu13/bin");
    std::fs::create_dir_all(&venv).unwrap();
    std::fs::write(venv.join("nvcc"), "").unwrap();
    let found = find_nvcc(None, None, Some("/nonexistent"), Some("/nonexistent"), &ws).unwrap();
    if found != NvccChoice::Found("/usr/local/cuda/bin/nvcc".into()) {
        assert_eq!(found, NvccChoice::Found(venv.join("nvcc")));
    }
}

#[test]
fn an_nvcc_env_that_names_nothing_is_an_error_not_a_fallback() {
    let ws = tmpdir("env");
    let e = find_nvcc(Some("/no/such/nvcc"), None, None, None, &ws).unwrap_err();
    assert!(e.contains("/no/such/nvcc"), "{e}");
}

#[test]
fn common_header_is_inlined_for_nvrtc_and_generated_rs_embeds_both() {
    let src = "// k\n#include \"common.cuh\"\nextern \"C\" __global__ void k() {}\n";
    let out = inline_common(src, "namespace ferrattn { int x; }");
    assert!(out.contains("namespace ferrattn { int x; }") && !out.contains("#include"));
    let rs = generated_rs(
        &[
            (
                "a".into(),
                Some("/o/a.fatbin".into()),
                "/o/a.nvrtc.cu".into(),
            ),
            ("b".into(), None, "/o/b.nvrtc.cu".into()),
        ],
        "note \"quoted\"",
    );
    assert!(rs.contains("fatbin: Some(include_bytes!(\"/o/a.fatbin\"))"));
    assert!(rs.contains("name: \"b\", fatbin: None, source: include_str!(\"/o/b.nvrtc.cu\")"));
    assert!(rs.contains(r#"BUILD_NOTE: &str = "note \"quoted\"""#));
}
