//! The model's head as fused-launch tasks (stage `Head`): the embedding lookup (token ids from a
//! device buffer to bf16 rows), a row RMSNorm (the final norm, and the post-attention norm of the
//! dense MLP), the argmax over one vocabulary shard's logits as (logit, token) pairs, and the pick
//! of each row's token over the shards' pairs, so a cross-rank argmax is an exchange of pairs and
//! the same pick. The matrices between them (lm_head's shard, the dense MLP's gate/up and down)
//! are the linear stage's tasks; the executor's parts (`executor::fused::head`) chain both.
//!
//! - [`layout`]: kinds, task descriptors, the pair, shared memory.
//! - [`reference`](mod@reference): the CPU references (the reference step's head, moe's mlp).
//! - [`check`]: the contracts device results are held to.
//! - [`gpu`]: the argument twins, the fused generator's stage, the standalone launch
//!   (`head_tasks`, `kernels/head.hip`); the same source runs on CPU threads in
//!   `tests/host_emulation.rs`.
//!
//! The dense MLP lives here rather than in `moe`: its device side is two linear tasks and this
//! stage's norm, nothing of the router or the experts' dispatch, and the chain is the tail's.

pub mod check;
pub mod gpu;
pub mod layout;
pub mod reference;
