//! Build script of the facade crate: records the git commit for reproducible reports.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FERRATTN_GIT_COMMIT={commit}");
    // HEAD names a branch whose ref file moves with every commit: watching HEAD alone kept a
    // stale commit in the binaries (bench JSON of 2026-11-23 labelled 8cc092e for later commits).
    // `--git-path` resolves inside a worktree too (where `.git` is a file).
    let mut watch = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(git(&["rev-parse", "--git-path", &r]));
    }
    watch.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for p in watch.into_iter().flatten() {
        // a path that does not exist would rerun the script on every build
        if Path::new(&p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
