//! The benchmark tables of `docs/BENCHMARKS.md` are generated from committed `ferrattn bench`
//! JSON: the committed text must equal a fresh generation (`ferrattn bench --docs
//! docs/BENCHMARKS.md` rewrites it), so the docs cannot drift from the data.

use ferrattn_cli::bench::report::regenerate_docs;
use std::path::Path;

#[test]
fn benchmark_docs_match_their_json() {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let doc = std::fs::read_to_string(root.join("docs/BENCHMARKS.md")).expect("docs/BENCHMARKS.md");
    assert!(
        doc.contains("<!-- ferrattn-bench:begin "),
        "docs/BENCHMARKS.md has no generated section"
    );
    let fresh = regenerate_docs(&doc, root).expect("every section's JSON reads");
    assert!(
        fresh == doc,
        "docs/BENCHMARKS.md differs from its JSON; run `ferrattn bench --docs docs/BENCHMARKS.md`"
    );
}
