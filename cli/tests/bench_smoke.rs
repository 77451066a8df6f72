//! CI smoke of `ferrattn bench`: the quick suite on the CPU and the simulated 910 runs to the end
//! on a machine without a GPU, within a time limit, and its JSON says what ran and what did not.

use ferrattn_cli::bench::report::BenchReport;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn quick_suite_runs_the_cpu_and_simulated_rows() {
    let out = std::env::temp_dir().join(format!("ferrattn-bench-smoke-{}", std::process::id()));
    let t0 = Instant::now();
    let st = Command::new(env!("CARGO_BIN_EXE_ferrattn"))
        .args([
            "bench",
            "--suite",
            "quick",
            "--backend",
            "cpu,ascend",
            "--out",
        ])
        .arg(&out)
        .status()
        .expect("ferrattn runs");
    let took = t0.elapsed();
    assert!(
        st.success(),
        "ferrattn bench --suite quick exited with {st}"
    );
    // CI runs on two cores; the quick CPU part takes about 15 s there
    assert!(took < Duration::from_secs(180), "quick suite took {took:?}");
    let rep = BenchReport::read(&out.join("bench.json")).expect("bench.json");
    assert!(rep.failures().is_empty());
    for algo in ["lean", "turbo", "amla", "turboquant"] {
        assert!(
            rep.rows
                .iter()
                .any(|r| r.backend == "cpu" && r.algorithm == algo && r.time.is_some()),
            "no timed cpu row for {algo}"
        );
    }
    let sim: Vec<_> = rep.rows.iter().filter(|r| r.backend == "ascend").collect();
    assert!(
        !sim.is_empty() && sim.iter().all(|r| r.simulated),
        "910 rows are labelled simulated"
    );
    assert!(rep
        .rows
        .iter()
        .filter(|r| r.backend == "cpu")
        .all(|r| !r.simulated));
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(md.contains("SIMULATED"));
    let _ = std::fs::remove_dir_all(&out);
}
