//! `mono compare` on dumps written as `mono dump` writes them: equal dumps pass, one flipped
//! digest byte fails and names its launch and tensor; `mono dump` without a GPU says so.

use std::process::Command;

use executor::step::digest::{LaunchDigest, TensorDigest};
use executor::step::Dump;

fn mono() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mono"))
}

fn dump(flip: bool) -> Dump {
    let mut d = Dump::default().with_header("preset", "glm-5.2");
    for i in 0..4 {
        let mut lists: Vec<u8> = (0..64u8).map(|x| x.wrapping_mul(i as u8 + 3)).collect();
        if flip && i == 2 {
            lists[17] ^= 0x10;
        }
        d.launches.push(LaunchDigest {
            index: i,
            name: format!("layer {i} front half"),
            tensors: vec![
                TensorDigest::of("scores", &[i as u8; 32]),
                TensorDigest::of("top-k slots", &lists),
            ],
        });
    }
    d
}

#[test]
fn mono_compare_names_the_first_differing_launch_and_tensor() {
    let dir = std::env::temp_dir().join(format!("mono-digests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b, c) = (dir.join("a.dump"), dir.join("b.dump"), dir.join("c.dump"));
    std::fs::write(&a, dump(false).to_text().unwrap()).unwrap();
    std::fs::write(&b, dump(false).to_text().unwrap()).unwrap();
    std::fs::write(&c, dump(true).to_text().unwrap()).unwrap();

    let same = mono().arg("compare").arg(&a).arg(&b).output().unwrap();
    let text = String::from_utf8_lossy(&same.stdout);
    assert!(same.status.success(), "{text}");
    assert!(text.contains("equal: 4 launches, 8 tensors"), "{text}");

    let differ = mono().arg("compare").arg(&a).arg(&c).output().unwrap();
    let text = String::from_utf8_lossy(&differ.stdout);
    assert!(!differ.status.success(), "a flipped byte passed: {text}");
    assert!(
        text.contains("launch 2 (layer 2 front half), tensor top-k slots"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mono_dump_refuses_an_unknown_preset_and_names_a_missing_gpu() {
    let out = mono().args(["dump", "--preset", "glm-6"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("glm-6"), "{err}");
    if device::Device::open(0).is_err() {
        let out = mono().args(["dump", "--context", "100"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("no GPU driver") || err.contains("no GPU"),
            "{err}"
        );
    }
}
