//! Prints the simulated section 5 sweep and the report of the public point. SIMULATED numbers.
//! `FERRATTN_SCAN=1` scans the fitted MMAD efficiency at the public point instead.
use ferrattn_ascend::config::Ascend910;
use ferrattn_ascend::sim::{repro, timing};

fn main() {
    let mut hw = Ascend910::paper();
    if std::env::var_os("FERRATTN_SCAN").is_some() {
        for i in 0..=20 {
            hw.mmad_efficiency = 0.80 + 0.01 * i as f64;
            let r = timing::simulate(&hw, 96, 2, 16384, timing::Variant::Amla);
            println!(
                "mmad_efficiency {:.2}: FU {:.2} %",
                hw.mmad_efficiency, r.fu_pct
            );
        }
        return;
    }
    println!(
        "{}",
        timing::simulate(&hw, 96, 2, 16384, timing::Variant::Amla)
    );
    println!(
        "{}",
        timing::simulate(&hw, 96, 2, 16384, timing::Variant::Base)
    );
    println!("{}", repro::repro_performance());
}
