// The epoch node: the graph replays it once per step, before the launches it tags (mailbox.h).
// Launch with one CTA; its threads share the clearing of the scratch on wrap.
#include "prelude.h"
#include "mailbox.h"

MONO_KERNEL void mailbox_epoch(u32* epoch_word, u64* scratch, u32 n_boxes, u32 launches_per_step) {
  mbx_advance_epoch(epoch_word, scratch, n_boxes, launches_per_step);
}
