//! Builds every kernel of the workspace for sm_90a and gfx950 and prints the resource table.
//! Fails on any compile error, on a `.hip` file the registry misses, and (with
//! MONO_REQUIRE_COMPILERS=1, as CI sets it) on a missing compiler.

use std::path::{Path, PathBuf};

fn hip_files(dir: &Path, root: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() && name != "target" && !name.to_string_lossy().starts_with('.') {
            hip_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "hip") {
            out.push(
                path.strip_prefix(root)
                    .unwrap_or(&path)
                    .display()
                    .to_string(),
            );
        }
    }
}

fn unregistered_of<'a>(on_disk: &'a [String], registered: &[String]) -> Vec<&'a String> {
    on_disk.iter().filter(|p| !registered.contains(p)).collect()
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap_or(root);
    let require = std::env::var("MONO_REQUIRE_COMPILERS").is_ok_and(|v| v == "1");

    let mut on_disk = Vec::new();
    hip_files(&root, &root, &mut on_disk);
    let registered: Vec<String> = executor::kernels::registry()
        .into_iter()
        .map(|e| e.path)
        .collect();
    let unregistered = unregistered_of(&on_disk, &registered);
    // Negative control: a .hip file nobody registered is reported.
    let planted = vec!["crates/nowhere/kernels/stray.hip".to_string()];
    if unregistered_of(&planted, &registered).is_empty() {
        println!("FAILED the coverage check missed a planted unregistered file");
        std::process::exit(1);
    }

    let table = executor::kernels::build_all(&executor::kernels::TARGETS, require);
    print!("{}", table.render());
    let mut failed = table.failures.len();
    for path in &unregistered {
        println!("FAILED {path}: not in executor::kernels::registry(), so nothing builds it");
        failed += 1;
    }
    let passed = table.rows.len();
    println!("kernels: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
