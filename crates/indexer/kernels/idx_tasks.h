// The indexer stage's task functions and its decoder: what the standalone entry (indexer.hip) and
// the fused layer kernel call for a task of stage MBX_STAGE_INDEXER.
//
//   key   (IDX_KIND_KEY):   args[0] = row; writes the row's key boxes (and its cache slot).
//   query (IDX_KIND_QUERY): args[0] = row; writes the row's query boxes.
//   score (IDX_KIND_SCORE): args[0] = first run, args[1] = runs (at most one a run team of the
//                           team: IDX_RUN_THREADS); waits on its groups' query boxes and their requests' new keys,
//                           writes the runs' scores and then each run's completion box.
//
// Every function takes the team that runs it, the task, the mailbox context, the stage's args and
// the LDS it may use (IDX_LDS_BYTES), and returns false only when a debug wait gave up.
#pragma once
#include "idx_key.h"
#include "idx_query.h"
#include "idx_score.h"
#include "idx_score_ring.h"

// The team splits into run teams of IDX_RUN_THREADS; run team k scores run args[0] + k if k <
// args[1], in its own IDX_RUN_LDS_BYTES of the LDS. A task carries at most a run a run team (the
// host's RUNS_PER_SCORE_TASK): a loop over more keeps its counters live through the page loop,
// which then spills at 128 registers.
template <class Team>
MONO_DEV bool idx_score_task(const Team& team, const mbx_task& task, mbx_ctx& c, const idx_args& a, u8* smem) {
  static_assert(Team::size % IDX_RUN_THREADS == 0, "a team scores in whole run teams");
  constexpr u32 teams = Team::size / IDX_RUN_THREADS;
  static_assert(teams * IDX_RUN_LDS_BYTES <= IDX_LDS_BYTES, "the launch's LDS (gpu.rs score_lds_bytes) is too small");
  const auto run_team = team.template split<IDX_RUN_THREADS>();
  const u32 k = team.template index<IDX_RUN_THREADS>();
  const bool ok = k >= task.args[1] || idx_score_run(run_team, c, a, task.args[0] + k, smem + k * IDX_RUN_LDS_BYTES);
  return team.all(ok);
}

// One task of the indexer stage (an if chain, not a switch: a switch's jump table is a
// constant-bank load at the start of every task).
template <class Team>
MONO_DEV bool idx_decode(const Team& team, const mbx_task& task, mbx_ctx& c, const idx_args& a, u8* smem) {
  const u32 kind = mbx_own_kind(task.kind);
  if (kind == IDX_KIND_SCORE) return idx_score_task(team, task, c, a, smem);
  if (kind == IDX_KIND_QUERY) return idx_query_task(team, task, c, a, smem);
  if (kind == IDX_KIND_KEY) return idx_key_task(team, task, c, a, smem);
  mono_trap();  // a kind the host never makes (src/layout.rs TaskKind)
  return false;
}

