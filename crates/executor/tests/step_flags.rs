//! `mono step`'s GPU flags: values the GPU step could not run with are refused on every machine,
//! before any device is opened, naming the flag; the CPU reference step says which of the given
//! flags it does not use.

use std::process::{Command, Output};

fn mono_step(flags: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mono"))
        .arg("step")
        .args(flags)
        .output()
        .expect("mono runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn flags_the_gpu_step_cannot_run_with_are_refused() {
    for (flags, says) in [
        (&["--steps", "0"][..], "--steps must be at least 1"),
        (&["--requests", "0"][..], "--requests must be at least 1"),
        (
            &["--tp", "3"][..],
            "--tp 3: supported TP degrees are [1, 2, 4, 8]",
        ),
        (
            &["--tp", "8", "--rank", "8"][..],
            "--rank 8 is not a rank of --tp 8",
        ),
        (
            &["--cpu", "--rank", "1"][..],
            "--rank 1 is not a rank of --tp 1",
        ),
        (&["--rows", "0"][..], "--rows must be at least 1"),
        (
            &["--layers", "7"][..],
            "--layers 7: invalid config: `num_hidden_layers` 7 layers asked of a model of 6",
        ),
        (
            &["--preset", "nope"][..],
            "unknown preset `nope`; valid presets: glm-5, glm-5.2, tiny",
        ),
        (
            &["--numerics", "transformers-fp32"][..],
            "--numerics transformers-fp32 picks the CPU reference step's switches",
        ),
        (
            &["--context", "999999999"][..],
            "--context 999999999 + --rows 1 is past max_position_embeddings",
        ),
    ] {
        let o = mono_step(flags);
        assert!(!o.status.success(), "{flags:?} ran: {}", text(&o));
        assert!(text(&o).contains(says), "{flags:?}: {}", text(&o));
        // Refused before a device was looked for: nothing is said of one.
        assert!(!text(&o).contains("GPU"), "{flags:?}: {}", text(&o));
    }
    let empty = std::env::temp_dir().join(format!("mono-step-flags-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let o = mono_step(&["--weights", empty.to_str().unwrap()]);
    std::fs::remove_dir_all(&empty).unwrap();
    assert!(!o.status.success(), "ran: {}", text(&o));
    assert!(text(&o).contains("holds no checkpoint"), "{}", text(&o));
    assert!(!text(&o).contains("GPU"), "{}", text(&o));
}

#[test]
fn the_cpu_step_names_the_gpu_flags_it_does_not_use() {
    let o = mono_step(&[
        "--cpu", "--steps", "2", "--tp", "8", "--rank", "7", "--layers", "2",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("--steps 2, --tp 8, --rank 7, --layers 2 apply to the GPU step only"),
        "{}",
        text(&o)
    );
    let switched = mono_step(&["--cpu", "--numerics", "transformers-fp32"]);
    assert!(switched.status.success(), "{}", text(&switched));
    assert!(
        text(&switched).contains("TransformersFp32"),
        "{}",
        text(&switched)
    );
    let plain = mono_step(&["--cpu"]);
    assert!(plain.status.success(), "{}", text(&plain));
    assert!(!text(&plain).contains("GPU step only"), "{}", text(&plain));
}
