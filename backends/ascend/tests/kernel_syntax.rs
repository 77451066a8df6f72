//! The AscendC kernel compiles against the declared API subset with the host C++ compiler
//! (`ascend-kernels/include/ascendc_decls.h`, the real signatures of asc-devkit): a syntax and
//! type check. The check against the real headers is `scripts/ascend-check-headers.sh`; the
//! execution on the CPU model is the test `kernel_cpu`.

use std::path::Path;
use std::process::Command;

#[test]
fn amla_kernel_compiles_against_the_declared_ascendc_subset() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ascend-kernels");
    let out = Command::new("g++")
        .args([
            "-std=c++17",
            "-fsyntax-only",
            "-Wall",
            "-Werror",
            "-DFERRATTN_ASCENDC_DECLS",
        ])
        .arg(format!("-I{}", root.join("include").display()))
        .arg(format!("-I{}", root.join("amla").display()))
        .arg(root.join("amla/amla_decode.cpp"))
        .output()
        .expect("this test needs the system g++");
    assert!(
        out.status.success(),
        "g++ -fsyntax-only failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn kernel_params_layout_matches_the_header() {
    // AmlaParams in amla_config.h: 8 x u32, f32, u32 = 40 bytes, scale at offset 32
    assert_eq!(
        std::mem::size_of::<ferrattn_ascend::kernels::KernelParams>(),
        40
    );
    let p = ferrattn_ascend::kernels::KernelParams::default();
    let base = &p as *const _ as usize;
    assert_eq!(&p.scale as *const f32 as usize - base, 32);
    let header = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ascend-kernels/amla/amla_config.h"),
    )
    .unwrap();
    let fields: Vec<&str> = header
        .lines()
        .skip_while(|l| !l.contains("struct AmlaParams"))
        .skip(1)
        .take_while(|l| !l.contains("};"))
        .map(|l| l.trim().trim_end_matches(';').rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "batch",
            "seq_q",
            "heads",
            "max_seq_k",
            "block_k",
            "compensation",
            "causal",
            "reserved",
            "scale",
            "reserved2"
        ]
    );
}
