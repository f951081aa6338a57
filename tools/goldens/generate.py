#!/usr/bin/env python3
"""Golden fixtures for the CPU reference step: transformers' GlmMoeDsaForCausalLM on the tiny preset.

    python3 tools/goldens/generate.py --out DIR

What it does (and checks, failing loudly when an assumption does not hold):
1. Reads tools/goldens/tiny_config.json (= model::ModelConfig::preset("tiny").to_json(); the Rust
   golden test checks that the two agree).
2. Makes the synthetic weights of tools/goldens/synthetic.py (the same bits as the Rust
   `model::weights::Synthetic`) under the published checkpoint names, writes them as
   model.safetensors in a scratch folder, and loads that folder with
   GlmMoeDsaForCausalLM.from_pretrained: no missing, unexpected or misshapen tensor is allowed, and
   every loaded parameter must equal what was written. So the names are the ones transformers reads.
3. Runs on the CPU in fp32 (the weights are bf16 values, so the model is the same as in bf16),
   eager attention and eager experts: a prefill of PROMPT tokens, DECODE greedy decode steps of one
   row, and one MTP-style verify step of VERIFY rows (the last greedy token plus drafts) at
   consecutive positions, all through one KV cache. Why fp32: transformers' own bf16 run of this
   model is up to 1.4e-2 (relative) away from its fp64 run after layer 0 and up to 0.38 after
   layer 5, where bf16 noise has flipped indexer top-k choices at near-ties; its fp32 run is within
   2e-6 of fp64 at every layer. Only fp32 goldens can check the math to better than bf16 noise.
4. Saves, per forward: every decoder layer's output, each full indexer layer's scores (the tensor
   its top-k was taken from; -inf where a key is beyond the row's position) and returned top-k,
   and the logits.

Output (one flat folder, 3 files): config.json, goldens.safetensors, manifest.json (versions,
tokens, positions, the facts checked above, and a SHA-256 per weight tensor so the Rust side can
prove it rebuilt the same model). Nothing is downloaded.
"""

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # no __pycache__ beside the sources
os.environ["HF_HUB_OFFLINE"] = "1"  # everything is local; never reach for the hub

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from synthetic import synthetic_values  # noqa: E402

SEED = 7
PROMPT = 40
DECODE = 24
VERIFY = 4
MAX_FIXTURE_BYTES = 10 * 1024 * 1024
DTYPE = torch.float32
MAX_FILES = 8

EXPERT_FUSED = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<part>gate_up_proj|down_proj)$")


class AssumptionError(RuntimeError):
    pass


def check(condition, message):
    if not condition:
        raise AssumptionError(message)


def published_tensors(model):
    """(name, shape) of every tensor a published checkpoint holds for this model: the model's
    state dict with transformers' fused expert tensors split back into one tensor per expert."""
    out = []
    for key, tensor in model.state_dict().items():
        match = EXPERT_FUSED.match(key)
        if match is None:
            check(tensor.dim() in (1, 2), f"unexpected {tensor.dim()}-D parameter {key}")
            out.append((key, list(tensor.shape)))
            continue
        experts, rows, cols = tensor.shape
        prefix = match["prefix"]
        for e in range(experts):
            if match["part"] == "gate_up_proj":
                check(rows % 2 == 0, f"{key}: odd gate_up rows {rows}")
                out.append((f"{prefix}.{e}.gate_proj.weight", [rows // 2, cols]))
                out.append((f"{prefix}.{e}.up_proj.weight", [rows // 2, cols]))
            else:
                out.append((f"{prefix}.{e}.down_proj.weight", [rows, cols]))
    return out


def loaded_value(state, name):
    """The loaded model's value for a published tensor name (undoing the expert fusion)."""
    match = re.match(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", name)
    if match is None:
        return state[name]
    prefix, e, part = match[1], int(match[2]), match[3]
    if f"{prefix}.{e}.{part}.weight" in state:
        return state[name]
    if part == "down_proj":
        return state[f"{prefix}.down_proj"][e]
    gate_up = state[f"{prefix}.gate_up_proj"][e]
    half = gate_up.shape[0] // 2
    return gate_up[:half] if part == "gate_proj" else gate_up[half:]


def bf16_bytes(values):
    """Little-endian bf16 bytes of f32 values that are exact in bf16 (checked)."""
    bits = values.astype(np.float32).view(np.uint32)
    check(np.all(bits & 0xFFFF == 0), "a synthetic value is not exact in bf16")
    return (bits >> 16).astype("<u2").tobytes()


def write_checkpoint(model_cls, config, folder, seed):
    """Writes the synthetic weights under the published names; returns {name: manifest entry}."""
    with torch.device("meta"):
        skeleton = model_cls(config)
    tensors, manifest = {}, {}
    for name, shape in published_tensors(skeleton):
        values = synthetic_values(seed, name, shape)
        if name.endswith("e_score_correction_bias"):
            raw, dtype = values.astype("<f4").tobytes(), "F32"
            tensors[name] = torch.from_numpy(values.copy())
        else:
            raw, dtype = bf16_bytes(values), "BF16"
            tensors[name] = torch.from_numpy(values.copy()).to(torch.bfloat16)
        manifest[name] = {"shape": shape, "dtype": dtype, "sha256": hashlib.sha256(raw).hexdigest()}
    from safetensors.torch import save_file as save_torch

    save_torch(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    return tensors, manifest


def load_model(model_cls, folder, written):
    model, info = model_cls.from_pretrained(
        str(folder),
        dtype=DTYPE,
        attn_implementation="eager",
        experts_implementation="eager",
        output_loading_info=True,
        local_files_only=True,
    )
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        check(not info.get(key), f"from_pretrained reported {key}: {info.get(key)}")
    state = model.state_dict()
    for name, tensor in written.items():
        loaded = loaded_value(state, name)
        check(
            torch.equal(loaded.float(), tensor.float()),
            f"loaded {name} differs from what was written",
        )
    return model.eval()


def model_facts(model, cfg):
    """What this transformers version does where implementations differ; checked or recorded."""
    m = model.model
    layers = m.layers
    expected_types = cfg["indexer_types"]
    check(list(model.config.indexer_types) == expected_types,
          f"indexer_types {model.config.indexer_types} != {expected_types}")
    for i, layer in enumerate(layers):
        full = expected_types[i] == "full"
        check((layer.self_attn.indexer is not None) == full,
              f"layer {i}: indexer present = {layer.self_attn.indexer is not None}, expected {full}")
        dense = i < cfg["first_k_dense_replace"]
        check(hasattr(layer.mlp, "gate") != dense, f"layer {i}: MLP kind is not the expected one")
        check(abs(layer.input_layernorm.variance_epsilon - cfg["rms_norm_eps"]) < 1e-12,
              f"layer {i}: input_layernorm eps {layer.input_layernorm.variance_epsilon}")
    attn = layers[0].self_attn
    indexer = layers[0].self_attn.indexer
    qk_head_dim = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    check(abs(attn.scaling - qk_head_dim**-0.5) < 1e-12, f"attention scaling {attn.scaling}")
    check(abs(m.norm.variance_epsilon - cfg["rms_norm_eps"]) < 1e-12, "final norm eps")
    check(m.rotary_emb.inv_freq.numel() == cfg["qk_rope_head_dim"] // 2, "rope table width")
    return {
        "q_a_layernorm_eps": attn.q_a_layernorm.variance_epsilon,
        "kv_a_layernorm_eps": attn.kv_a_layernorm.variance_epsilon,
        "index_k_norm_eps": indexer.k_norm.eps,
        "index_weights_proj_dtype": str(indexer.weights_proj.weight.dtype),
        "attention_scaling": attn.scaling,
        "attn_implementation": model.config._attn_implementation,
        "experts_implementation": model.config._experts_implementation,
        "device": "cpu",
        "dtype": str(DTYPE).removeprefix("torch."),
    }


class Recorder:
    """Forward hooks: each decoder layer's output, and the tensor each indexer takes top-k of."""

    def __init__(self, model):
        self.layer_outputs = {}
        self.index_scores = {}
        self.topk = {}
        self._active = None
        self._original_topk = torch.Tensor.topk
        recorder = self

        def topk(tensor, *args, **kwargs):
            if recorder._active is not None:
                check(recorder._active not in recorder.index_scores,
                      f"indexer of layer {recorder._active} took top-k twice")
                recorder.index_scores[recorder._active] = tensor.detach().float().clone()
            return recorder._original_topk(tensor, *args, **kwargs)

        torch.Tensor.topk = topk
        for i, layer in enumerate(model.model.layers):
            layer.register_forward_hook(self._layer_hook(i))
            if layer.self_attn.indexer is not None:
                layer.self_attn.indexer.register_forward_pre_hook(self._enter(i))
                layer.self_attn.indexer.register_forward_hook(self._leave(i))

    def restore(self):
        torch.Tensor.topk = self._original_topk

    def reset(self):
        self.layer_outputs, self.index_scores, self.topk = {}, {}, {}

    def _layer_hook(self, i):
        def hook(_module, _inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output
            self.layer_outputs[i] = hidden.detach().float().clone()

        return hook

    def _enter(self, i):
        def hook(_module, _inputs):
            self._active = i

        return hook

    def _leave(self, i):
        def hook(_module, _inputs, output):
            self._active = None
            self.topk[i] = output.detach().clone()

        return hook


def run_forward(model, recorder, tokens, past, positions, cfg, tensors, step):
    recorder.reset()
    ids = torch.tensor([tokens], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=past, use_cache=True)
    full_layers = [i for i, t in enumerate(cfg["indexer_types"]) if t == "full"]
    check(sorted(recorder.layer_outputs) == list(range(cfg["num_hidden_layers"])),
          f"step {step}: captured layers {sorted(recorder.layer_outputs)}")
    check(sorted(recorder.index_scores) == full_layers,
          f"step {step}: captured indexer scores for layers {sorted(recorder.index_scores)}, "
          f"expected {full_layers}")
    prefix = f"step{step}"
    tensors[f"{prefix}.tokens"] = np.array(tokens, dtype=np.int64)
    tensors[f"{prefix}.positions"] = np.array(positions, dtype=np.int64)
    for i, hidden in recorder.layer_outputs.items():
        tensors[f"{prefix}.layer{i}.hidden"] = hidden[0].numpy().astype(np.float32)
    for i in full_layers:
        scores = recorder.index_scores[i][0]  # [T, keys]
        keys = scores.shape[-1]
        check(keys == positions[-1] + 1, f"step {step} layer {i}: {keys} keys, expected {positions[-1] + 1}")
        valid = torch.arange(keys)[None, :] <= torch.tensor(positions)[:, None]
        scores = torch.where(valid, scores, torch.tensor(float("-inf")))
        topk = recorder.topk[i][0].long()
        # The returned top-k must be the top-k of the captured scores (up to ties): every valid
        # returned key scores at least as high as every valid key left out.
        for r in range(len(tokens)):
            chosen = {int(t) for t in topk[r] if valid[r, t]}
            if not chosen:
                continue
            floor = min(float(scores[r, t]) for t in chosen)
            left_out = [float(scores[r, t]) for t in range(keys) if valid[r, t] and t not in chosen]
            check(all(v <= floor for v in left_out),
                  f"step {step} layer {i} row {r}: returned top-k is not the top-k of the captured scores")
        tensors[f"{prefix}.layer{i}.index_scores"] = scores.numpy().astype(np.float32)
        tensors[f"{prefix}.layer{i}.topk"] = topk.numpy().astype(np.int64)
    logits = out.logits[0].float()
    tensors[f"{prefix}.logits"] = logits.numpy().astype(np.float32)
    return out.past_key_values, logits


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="folder for the fixtures (created)")
    parser.add_argument("--seed", type=int, default=SEED, help="synthetic weight and token seed")
    parser.add_argument("--keep-checkpoint", type=Path,
                        help="also keep the written checkpoint (model.safetensors + config.json) here")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }
    print("generate.py:", ", ".join(f"{k} {v}" for k, v in versions.items()))
    check(int(transformers.__version__.split(".")[0]) >= 5, "needs transformers 5.x")
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    cfg_text = (HERE / "tiny_config.json").read_text()
    cfg = json.loads(cfg_text)
    config = GlmMoeDsaConfig(**cfg)

    scratch = Path(tempfile.mkdtemp(prefix="glm_goldens_"))
    try:
        written, weight_manifest = write_checkpoint(GlmMoeDsaForCausalLM, config, scratch, args.seed)
        print(f"wrote {len(written)} tensors to {scratch}; loading with from_pretrained")
        model = load_model(GlmMoeDsaForCausalLM, scratch, written)
        if args.keep_checkpoint:
            args.keep_checkpoint.mkdir(parents=True, exist_ok=True)
            for f in ("model.safetensors", "config.json"):
                shutil.copy(scratch / f, args.keep_checkpoint / f)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    facts = model_facts(model, cfg)
    print("facts:", facts)

    rng = np.random.default_rng(args.seed)
    prompt = [int(t) for t in rng.integers(0, cfg["vocab_size"], PROMPT)]
    drafts = [int(t) for t in rng.integers(0, cfg["vocab_size"], VERIFY - 1)]

    recorder = Recorder(model)
    tensors, steps = {}, []
    try:
        past, logits = run_forward(model, recorder, prompt, None, list(range(PROMPT)), cfg, tensors, 0)
        steps.append({"kind": "prefill", "tokens": prompt, "positions": list(range(PROMPT))})
        position = PROMPT
        for step in range(1, DECODE + 1):
            token = int(logits[-1].argmax())
            past, logits = run_forward(model, recorder, [token], past, [position], cfg, tensors, step)
            steps.append({"kind": "decode", "tokens": [token], "positions": [position]})
            position += 1
        rows = [int(logits[-1].argmax())] + drafts
        positions = list(range(position, position + VERIFY))
        run_forward(model, recorder, rows, past, positions, cfg, tensors, DECODE + 1)
        steps.append({"kind": "verify", "tokens": rows, "positions": positions})
    finally:
        recorder.restore()

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(cfg_text)
    save_file(tensors, str(args.out / "goldens.safetensors"), metadata={"format": "goldens"})
    manifest = {
        "command": "python3 tools/goldens/generate.py --out DIR" + (f" --seed {args.seed}" if args.seed != SEED else ""),
        "versions": versions,
        "seed": args.seed,
        "facts": facts,
        "steps": steps,
        "weights": weight_manifest,
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))

    files = sorted(args.out.iterdir())
    total = sum(f.stat().st_size for f in files)
    for f in files:
        print(f"  {f.name}: {f.stat().st_size} bytes")
    check(len(files) <= MAX_FILES, f"{len(files)} files in {args.out}, at most {MAX_FILES}")
    check(total < MAX_FIXTURE_BYTES, f"fixtures take {total} bytes, over {MAX_FIXTURE_BYTES}")
    print(f"ok: {len(steps)} forwards, greedy tokens {[s['tokens'][0] for s in steps[1:-1]]}, "
          f"{total} bytes in {args.out}")


if __name__ == "__main__":
    try:
        main()
    except AssumptionError as e:
        print(f"generate.py: ASSUMPTION FAILED: {e}", file=sys.stderr)
        sys.exit(1)
