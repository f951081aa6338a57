//! Build checks skipped for a missing compiler, counted per process and summed up when it exits.
//!
//! A test that returns early without its compiler passes, and the test harness hides what it
//! printed, so a run on a machine without compilers would look as checked as one with them. Each
//! skip is therefore written straight to stderr (past the harness's capture), and when the
//! process exits one line says how many checks were skipped and why:
//! `compile checks skipped: 2 (1 for gfx950: clang not found; 1 for sm_90a: NVRTC not found); ...`.

use std::io::Write;
use std::sync::{Mutex, Once, PoisonError};

static SKIPS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static SUMMARY_AT_EXIT: Once = Once::new();

extern "C" {
    /// The C library's exit hook (POSIX and the Windows CRT): the summary must come after the
    /// test harness's own, which ends the process.
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

/// Records a build check skipped because the compiler for `target` is missing, and says so on
/// stderr now and in the summary at exit.
pub fn record_skipped_check(target: &str, reason: &dyn std::fmt::Display) {
    let reason = reason.to_string();
    let _ = writeln!(
        std::io::stderr(),
        "compile check skipped (set MONO_REQUIRE_COMPILERS=1 to fail instead): {target}: {reason}"
    );
    // The summary keeps the reason's headline ("clang not found"), not its advice.
    let headline = reason.split(": ").next().unwrap_or_default();
    SKIPS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(format!("{target}: {headline}"));
    SUMMARY_AT_EXIT.call_once(|| {
        // SAFETY: `summary` is an `extern "C" fn()` that neither unwinds nor touches state that
        // exit tears down before the hooks run (a static mutex, the unbuffered stderr).
        unsafe {
            atexit(summary);
        }
    });
}

/// Build checks skipped so far in this process, one `target: reason headline` each.
pub fn skipped_checks() -> Vec<String> {
    SKIPS.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// The summary line for `skips`: the count, then how many each distinct reason skipped.
pub fn skip_summary(skips: &[String]) -> String {
    let mut distinct: Vec<(&str, usize)> = Vec::new();
    for skip in skips {
        match distinct.iter_mut().find(|(s, _)| s == skip) {
            Some((_, n)) => *n += 1,
            None => distinct.push((skip, 1)),
        }
    }
    let reasons: Vec<String> = distinct
        .iter()
        .map(|(skip, n)| format!("{n} for {skip}"))
        .collect();
    format!(
        "compile checks skipped: {} ({}); set MONO_REQUIRE_COMPILERS=1 to fail instead",
        skips.len(),
        reasons.join("; ")
    )
}

extern "C" fn summary() {
    let skips = skipped_checks();
    let _ = writeln!(std::io::stderr(), "{}", skip_summary(&skips));
}

#[cfg(test)]
mod tests {
    use super::skip_summary;

    #[test]
    fn the_summary_counts_each_reason() {
        let skips = ["gfx950: no clang", "sm_90a: no NVRTC", "gfx950: no clang"].map(String::from);
        assert_eq!(
            skip_summary(&skips),
            "compile checks skipped: 3 (2 for gfx950: no clang; 1 for sm_90a: no NVRTC); \
             set MONO_REQUIRE_COMPILERS=1 to fail instead"
        );
    }
}
