//! The timing model behaves as the paper argues (SIMULATED numbers throughout).

use ferrattn_ascend::config::{Ascend910, MMAD_EFFICIENCY_FIT};
use ferrattn_ascend::sim::repro::{repro_performance, SK};
use ferrattn_ascend::{simulate, Variant};

#[test]
fn fitted_constant_reproduces_the_public_point() {
    // the one public measurement: 86.8 % FU (614 TFLOP/s), batch 96, Sq 2, Sk 16384
    let r = simulate(96, 2, 16384, Variant::Amla);
    assert!(
        (r.fu_pct - 86.8).abs() < 0.3,
        "FU {:.2} % with mmad_efficiency {MMAD_EFFICIENCY_FIT}",
        r.fu_pct
    );
    assert!((r.tflops - 614.0).abs() < 3.0, "{:.1} TFLOP/s", r.tflops);
    assert!(r.provenance.starts_with("simulated"));
    assert!(r.to_string().contains("SIMULATED"));
    // Cube-bound: MMAD is the busiest pipe and dominates the critical path (section 4.1)
    let mmad = r
        .pipes
        .iter()
        .find(|p| p.core == "cube" && p.pipe == "MMAD")
        .unwrap()
        .busy_pct;
    assert!(
        r.pipes.iter().all(|p| p.busy_pct <= mmad + 1e-9),
        "{:?}",
        r.pipes
    );
    let mmad_path: f64 = r
        .critical_path
        .iter()
        .filter(|c| c.pipe == "MMAD")
        .map(|c| c.pct)
        .sum();
    assert!(mmad_path > 60.0, "{:?}", r.critical_path);
}

#[test]
fn amla_beats_base_and_fu_rises_with_sk_and_sq() {
    let rep = repro_performance();
    assert_eq!(rep.rows.len(), 12);
    for r in &rep.rows {
        assert!(
            r.amla_us < r.base_us,
            "Sq {} Sk {}: AMLA {:.1} us vs Base {:.1} us",
            r.sq,
            r.sk,
            r.amla_us,
            r.base_us
        );
    }
    for sq in [1, 2] {
        let fu: Vec<f64> = rep
            .rows
            .iter()
            .filter(|r| r.sq == sq)
            .map(|r| r.amla_fu_pct)
            .collect();
        assert_eq!(fu.len(), SK.len());
        assert!(
            fu.windows(2).all(|w| w[1] > w[0]),
            "Sq {sq}: FU not rising with Sk: {fu:?}"
        );
    }
    for sk in SK {
        let at = |sq| {
            rep.rows
                .iter()
                .find(|r| r.sq == sq && r.sk == sk)
                .unwrap()
                .amla_fu_pct
        };
        assert!(
            at(2) > at(1),
            "Sk {sk}: FU Sq 2 {:.1} <= Sq 1 {:.1}",
            at(2),
            at(1)
        );
    }
    assert!(rep.to_string().contains("SIMULATED"));
}

#[test]
fn base_is_held_up_by_its_vector_stage() {
    // section 3.1: [V2] moving O between GM and UB is Base's bottleneck
    let r = simulate(96, 2, 16384, Variant::Base);
    let v2: f64 = r
        .critical_path
        .iter()
        .filter(|c| c.stage == "V2")
        .map(|c| c.pct)
        .sum();
    assert!(v2 > 20.0, "{:?}", r.critical_path);
    let a = simulate(96, 2, 16384, Variant::Amla);
    assert!(a.critical_path.iter().all(|c| c.stage != "V2"));
}

#[test]
fn slower_hbm_makes_it_memory_bound() {
    // the block-size inequality (section 4.2): at a quarter of the HBM bandwidth K loads dominate
    let mut hw = Ascend910::paper();
    hw.hbm_bytes_per_s_per_die /= 4.0;
    let slow = ferrattn_ascend::sim::timing::simulate(&hw, 96, 2, 16384, Variant::Amla);
    assert!(slow.fu_pct < 60.0, "{slow}");
    let busy = |pipe| {
        slow.pipes
            .iter()
            .find(|p| p.core == "cube" && p.pipe == pipe)
            .unwrap()
            .busy_pct
    };
    assert!(busy("MTE2") > 80.0 && busy("MTE2") > busy("MMAD"), "{slow}");
}

#[test]
fn ragged_and_small_batches_use_fewer_cores() {
    let r = ferrattn_ascend::sim::timing::simulate_lengths(
        &Ascend910::paper(),
        1,
        &[4096, 1024, 512],
        Variant::Amla,
    );
    assert_eq!(r.core_pairs_used, 3);
    let full = simulate(3, 1, 4096, Variant::Amla);
    assert!(
        (r.duration_us - full.duration_us).abs() / full.duration_us < 0.05,
        "longest sequence sets the time"
    );
}

#[test]
#[cfg(feature = "svg")]
fn timeline_svg_is_written_and_labelled() {
    use ferrattn_ascend::timeline_svg;
    let r = simulate(96, 2, 4096, Variant::Amla);
    let dir = std::env::temp_dir().join(format!("ferrattn-ascend-timeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("amla.svg");
    timeline_svg(&r, 4, &path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.contains("SIMULATED"));
    assert!(svg.matches("<rect").count() > 100, "bars drawn");
    // every text element says something, and every pipe row is named
    let texts: Vec<&str> = svg
        .split("<text")
        .skip(1)
        .map(|t| t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()].trim())
        .collect();
    assert!(
        texts.iter().all(|t| !t.is_empty()),
        "empty labels: {texts:?}"
    );
    for row in [
        "Cube MTE2",
        "Cube MTE1",
        "Cube MMAD",
        "Cube FixP",
        "Vec0 MTE2",
        "Vec0 VEC",
        "Vec0 MTE3",
        "Vec1 MTE2",
        "Vec1 VEC",
        "Vec1 MTE3",
    ] {
        assert_eq!(
            texts.iter().filter(|t| **t == row).count(),
            1,
            "{row}: {texts:?}"
        );
    }
    // the caption names exactly the colours of the bars drawn
    let caption = texts.iter().find(|t| t.starts_with("SIMULATED")).unwrap();
    for (stage, colour, hex) in [
        ("C1", "blue", "#1F77B4"),
        ("V1", "orange", "#FF7F0E"),
        ("C2", "green", "#2CA02C"),
        ("V2", "red", "#D62728"),
        ("last V", "purple", "#9467BD"),
    ] {
        let drawn = svg.contains(&format!("fill=\"{hex}\""));
        let named = caption.contains(&format!("{stage} {colour}"));
        assert_eq!(
            drawn, named,
            "{stage} {colour}: drawn {drawn}, named {named}: {caption}"
        );
    }
    assert!(
        caption.contains("C1 blue, V1 orange, C2 green"),
        "{caption}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
