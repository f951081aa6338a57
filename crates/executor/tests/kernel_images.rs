//! `mono kernels --only ... --out DIR`: the chosen sources alone, each image written where a
//! disassembler can take it, with the line tables that name each instruction's source line.

use executor::kernels::{build, BuildChoice, TARGETS};
use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mono-images-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_choice_that_matches_no_source_is_a_failure() {
    let choice = BuildChoice {
        only: vec!["no_such_kernel".into()],
        images: None,
    };
    let table = build(&TARGETS, false, &choice);
    assert!(table.rows.is_empty());
    assert_eq!(table.failures.len(), 1, "{:?}", table.failures);
    assert!(
        table.failures[0].contains("no_such_kernel"),
        "{:?}",
        table.failures
    );
}

#[test]
fn images_of_the_chosen_source_are_written_with_line_tables() {
    let require = std::env::var("MONO_REQUIRE_COMPILERS").is_ok_and(|v| v == "1");
    let dir = scratch("epoch");
    let choice = BuildChoice {
        only: vec!["mailbox/kernels/epoch".into()],
        images: Some(dir.clone()),
    };
    let table = build(&TARGETS, require, &choice);
    assert!(table.failures.is_empty(), "{:?}", table.failures);
    for row in &table.rows {
        assert_eq!(
            row.path, "crates/mailbox/kernels/epoch.hip",
            "only the chosen source"
        );
    }
    let mut written = 0;
    for (target, extension, line_section) in [
        ("sm_90a", "cubin", &b".nv_debug_line_sass"[..]),
        ("gfx950", "hsaco", &b".debug_line"[..]),
    ] {
        if table.skipped.iter().any(|s| s.starts_with(target)) {
            eprintln!("no compiler for {target}: its image is not checked");
            continue;
        }
        let path = dir
            .join(target)
            .join(format!("crates-mailbox-kernels-epoch.{extension}"));
        let image = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            image.starts_with(b"\x7fELF"),
            "{} is an ELF image",
            path.display()
        );
        assert!(
            contains(&image, line_section),
            "{} carries its line tables",
            path.display()
        );
        written += 1;
    }
    // The search can fail: bytes without the section's name give nothing. (The check itself
    // fails on the sm_90a image when NVRTC builds without --generate-line-info.)
    assert!(!contains(b"\x7fELF .text .symtab", b".debug_line"));
    let _ = std::fs::remove_dir_all(&dir);
    if require {
        assert_eq!(
            written, 2,
            "both targets' images with MONO_REQUIRE_COMPILERS=1"
        );
    }
}
