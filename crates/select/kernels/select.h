// The select stage's task functions: the exact top-k of a score row, on one CTA or on up to 64
// slices (one CTA each) that all-gather their digit histograms through tagged pairs. The contract
// is src/reference.rs (a -inf score is masked: never selected); src/layout.rs holds the formulas
// mirrored here (same names). tests/host_emulation.rs runs these headers on CPU threads.
//
// Multi-slice (and the one CTA over a row too long for LDS): per round, a slice counts the 6-bit
// digits of its keys that match the prefix found so far (a wave counts 64 keys at once with 7
// ballots, no atomics), publishes the 64 counts as 32 tagged pairs of 16-bit counts, waits for
// every slice of its row, sums them, and picks the digit holding the rank-th key. It stops at 12
// or 24 bits when the keys sharing the prefix fit in the candidate room, else at 32. Then it
// places its keys above the prefix (in position order, after those of the slices before it); at
// 32 bits its ties take their places directly; otherwise it stages its keys sharing the prefix as
// (key, position) pairs, and the row's first slice finds the rest of T with wide digits (two
// 10-bit passes from 12 bits, one 8-bit pass from 24) and places them; at most a wave of them,
// one wave ranks against each other directly.
//
// One CTA over a row that fits in LDS: the keys are loaded once, and wide digits counted with
// shared-memory atomics find T: 8 bits over every key (counted while loading, into 16 copies of
// each bin), then 12 + 12 bits over the keys sharing the prefix; the top 4 bits of each 12-bit
// digit give the keys sharing T's 12- and 24-bit prefixes, which decide P. One pass in position
// order places the whole list. These loops run over a whole row on one SM: what they cost is
// instructions per key, so each keeps a key's work to a compare and at most one atomic.
//
// The headers, in order, each including the one before it: select_shape.h (defines, keys, state,
// scans), select_rounds.h (6-bit rounds and polls), select_place.h (compaction, wide digits,
// placement, tail), select_tasks.h (descent, loads, one CTA, slices), select_regs.h (the one CTA
// over a short row held in registers, which says how it works), select_decode.h (the task
// functions, their descriptor and the decoder).
#pragma once
#include "select_shape.h"
#include "select_rounds.h"
#include "select_place.h"
#include "select_tasks.h"
#include "select_regs.h"
#include "select_decode.h"
