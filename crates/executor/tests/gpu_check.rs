//! The step's checks on a GPU (`MONO_BACKEND=host` runs them on the CPU emulator):
//!
//! * negative control of the digests: the tiny step's layer 0 (a full-indexer layer: select
//!   publishes each row's list in the launch and a Slots task waits for it before handing the
//!   list to the attention) run twice as planned gives equal digests; with the Slots task's wait
//!   on select removed it reads the list before select wrote it, and the layer's rows differ.
//!   On the emulator's CPU threads the early read is a race the Slots task usually but not
//!   always wins, so this is a GPU test.
//!
//! `cargo test -p executor --release --test gpu_check -- --ignored --nocapture --test-threads 1`

use device::Device;
use executor::fused::layer::LaunchAt;
use executor::step::check::{wait_control, CheckScene};
use executor::step::scene::SceneRequest;
use executor::step::Comparison;
use mailbox::gpu::{DebugBound, Variant};
use model::ModelConfig;

fn variant() -> Variant {
    Variant {
        debug: Some(DebugBound {
            poll_limit: 1 << 22,
            trap: false,
        }),
        ..Variant::default()
    }
}

#[test]
#[ignore = "needs a GPU"]
fn a_launch_without_one_wait_changes_the_digests() {
    let dev = Device::open(0).expect("a GPU (or MONO_BACKEND=host)");
    let cfg = ModelConfig::preset("tiny").unwrap();
    let request = SceneRequest {
        context: 20,
        rows: 1,
    };
    let (scene, weights) = CheckScene::synthetic(&dev, &cfg, 5, &[request]).unwrap();
    let slots = mla::layout::MlaKind::Slots.kind();
    let at = [LaunchAt::Layer(0)];
    let c = wait_control(&dev, &scene, &weights, &at, 0, slots, variant()).unwrap();
    println!(
        "{}; two intact runs: {}; intact against broken: {}",
        c.removed, c.intact, c.broken
    );
    assert!(matches!(c.intact, Comparison::Equal { .. }), "{}", c.intact);
    match &c.broken {
        Comparison::Differ { launch, tensor, .. } => {
            assert_eq!(launch.0, 0);
            assert_eq!(tensor.as_deref(), Some("hidden"));
        }
        Comparison::Equal { .. } => panic!("the removed wait was not caught by the digests"),
    }
}
