//! The fused kernel's generator: a launch of two stages builds for both targets in the fused CTA
//! shape (every stage's decoder reached through one switch), the front stages are calls only beside
//! other stages, and bad stage lists are refused.

use device::optional_compiler;
use executor::fused::{fused_source, CtaShape, FusedSourceError, ENTRY};
use mailbox::trace::traced;
use mailbox::{Stage, StageKernel};

/// A stage whose tasks each write their order to `out[args[0]]`: the smallest decoder that uses a
/// team, a descriptor and its argument struct.
const ECHO_H: &str = r#"#pragma once
struct echo_args { u32* out; };
template <class Team>
MONO_DEV bool echo_decode(const Team& team, const mbx_task& t, mbx_ctx& c, const echo_args& a, u8* smem) {
  (void)c; (void)smem;
  if (team.leader()) a.out[t.args[0]] = t.order;
  team.sync();
  return true;
}
"#;

/// A second stage that splits the CTA into warpgroup teams, each syncing on its own barrier.
const SPLIT_H: &str = r#"#pragma once
struct split_args { u32* out; };
template <class Team>
MONO_DEV bool split_decode(const Team& team, const mbx_task& t, mbx_ctx& c, const split_args& a, u8* smem) {
  (void)c;
  const auto part = team.template split<128>();
  u32* words = (u32*)smem;
  if (part.leader()) words[team.template index<128>()] = t.args[0];
  part.sync();
  const bool ok = part.all(words[team.template index<128>()] == t.args[0]);
  team.sync();
  if (team.leader()) a.out[t.args[1]] = ok;
  return true;
}
"#;

fn stage(
    stage: Stage,
    include: &'static str,
    text: &'static str,
    args: &'static str,
    decoder: &'static str,
) -> StageKernel {
    StageKernel {
        stage,
        include,
        headers: vec![(include, text)],
        args_type: args,
        decoder,
        defines: Default::default(),
    }
}

/// The split stage under the stage id `id`.
fn split_stage(id: Stage) -> StageKernel {
    stage(id, "split.h", SPLIT_H, "split_args", "split_decode")
}

fn two_stages() -> Vec<StageKernel> {
    vec![
        stage(
            Stage::Synthetic,
            "echo.h",
            ECHO_H,
            "echo_args",
            "echo_decode",
        ),
        split_stage(Stage::Linear),
    ]
}

#[test]
fn a_two_stage_launch_builds_for_both_targets_in_the_fused_shape() {
    let mut built = 0;
    for target in ["sm_90a", "gfx950"] {
        let shape = CtaShape::for_target(target).expect("a shape for every CI target");
        let source = fused_source("fused_test", &two_stages(), shape).expect("a valid stage list");
        let Some(compiler) = optional_compiler(target).unwrap_or_else(|e| panic!("{target}: {e}"))
        else {
            continue;
        };
        // With the task trace on too: its stamps are in the one task loop every launch runs.
        for (what, source) in [("", source.clone()), (" traced", traced(source))] {
            let compiled = compiler
                .compile(&source)
                .unwrap_or_else(|e| panic!("{target}{what}: {e}"));
            let entry = compiled
                .resources
                .iter()
                .find(|r| r.kernel == ENTRY)
                .unwrap_or_else(|| {
                    panic!("{target}{what}: no {ENTRY} in {:?}", compiled.resources)
                });
            assert_eq!(entry.spills, 0, "{target}{what}: {entry:?}");
        }
        built += 1;
    }
    println!("fused test kernel built for {built} targets");
}

#[test]
fn bad_stage_lists_are_refused() {
    let shape = CtaShape::for_target("sm_90a").unwrap();
    assert_eq!(
        fused_source("x", &[], shape).unwrap_err(),
        FusedSourceError::NoStages
    );
    let mut twice = two_stages();
    twice.push(twice[0].clone());
    assert_eq!(
        fused_source("x", &twice, shape).unwrap_err(),
        FusedSourceError::DuplicateStage(Stage::Synthetic)
    );
    let mut clash = two_stages();
    clash[0].defines.insert("PAGE".into(), "64".into());
    clash[1].defines.insert("PAGE".into(), "32".into());
    assert!(matches!(
        fused_source("x", &clash, shape).unwrap_err(),
        FusedSourceError::ConflictingDefine { .. }
    ));
}

#[test]
fn the_switch_reaches_every_stage_decoder() {
    let shape = CtaShape::for_target("sm_90a").unwrap();
    let flat = fused_source("x", &two_stages(), shape)
        .unwrap()
        .flatten()
        .unwrap();
    for (case, decoder) in [
        ("MBX_STAGE_SYNTHETIC", "echo_decode"),
        ("MBX_STAGE_LINEAR", "split_decode"),
    ] {
        assert!(
            flat.contains(&format!("case {case}: return {decoder}(team, t, c, a")),
            "{flat}"
        );
    }
}

/// In a launch with other stages (a full-indexer layer), the indexer's, select's and the linear
/// tile's decoders are called through wrappers (calls on NVIDIA) and the others stay inlined; a
/// launch of the front stages alone, or one without them, inlines them all. The wrapped launch
/// builds for both targets.
#[test]
fn front_stages_are_calls_only_beside_other_stages() {
    let mixed = vec![
        stage(Stage::Select, "echo.h", ECHO_H, "echo_args", "echo_decode"),
        split_stage(Stage::Linear),
    ];
    let no_front = vec![
        split_stage(Stage::Linear),
        stage(Stage::Mla, "echo.h", ECHO_H, "echo_args", "echo_decode"),
    ];
    let alone = vec![
        stage(Stage::Indexer, "echo.h", ECHO_H, "echo_args", "echo_decode"),
        split_stage(Stage::Select),
    ];
    let shape = CtaShape::for_target("sm_90a").unwrap();
    let flat =
        |stages: &[StageKernel]| fused_source("x", stages, shape).unwrap().flatten().unwrap();
    let m = flat(&mixed);
    assert!(
        m.contains("case MBX_STAGE_SELECT: return mono_call_0(team, t, c, a0"),
        "{m}"
    );
    assert!(
        m.contains("bool mono_call_0(") && m.contains("return echo_decode(team"),
        "{m}"
    );
    assert!(
        m.contains("case MBX_STAGE_LINEAR: return mono_call_1(team, t, c, a1")
            && m.contains("return split_decode(team"),
        "{m}"
    );
    let n = flat(&no_front);
    assert!(!n.contains("mono_call_"), "{n}");
    let a = flat(&alone);
    assert!(!a.contains("mono_call_"), "{a}");
    assert!(
        a.contains("case MBX_STAGE_INDEXER: return echo_decode(team"),
        "{a}"
    );
    for target in ["sm_90a", "gfx950"] {
        let shape = CtaShape::for_target(target).unwrap();
        let Some(compiler) = optional_compiler(target).unwrap_or_else(|e| panic!("{target}: {e}"))
        else {
            continue;
        };
        let source = fused_source("fused_calls", &mixed, shape).unwrap();
        compiler
            .compile(&source)
            .unwrap_or_else(|e| panic!("{target}: {e}"));
    }
}
