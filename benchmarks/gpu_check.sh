#!/usr/bin/env bash
# The GPU checks, as one script of a few minutes, for a machine with an NVIDIA GPU:
#   1. CUDA is visible (driver, and a torch build with CUDA);
#   2. the CUDA + bfloat16 path: a short RLOO fit on a tiny model (finite rewards, KL
#      and losses, the model on the GPU), the ratio at the first epoch is 1 (RLOO's
#      rollout log-probs against a training-mode minibatch pass, and PPO's logged
#      policy/ratio_mean and clip fraction after one epoch);
#   3. the GPU-marked tests (pytest -m gpu), if there are any;
#   4. the throughput benchmark on the GPU (tiny model, then GPT-2 small's shape at
#      the seeds' settings), with TRL as the peer when trl is installed;
#   5. with the vllm package installed, the vLLM tests (pytest -m vllm) on CUDA and
#      native against vLLM generation side by side.
# It exits non-zero at the first failure and says which check failed. First run on an
# H200 (torch 2.11+cu130) on 2026-12-04: checks 1-2 passed; read its output, not just its status.
#
#   benchmarks/gpu_check.sh              # from anywhere; uses .venv/bin/python when present
#   PYTHON=python3 benchmarks/gpu_check.sh
#   QUICK=1 benchmarks/gpu_check.sh      # skip the GPT-2-sized benchmark
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1  # nothing is downloaded

check() { echo; echo "=== $* ($(date +%H:%M:%S))"; }
fail() { echo "FAILED: $*" >&2; exit 1; }

check "1. CUDA visible"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    || fail "nvidia-smi cannot talk to the driver"
else
  echo "(no nvidia-smi on PATH; asking torch)"
fi
"$PY" - <<'EOF' || fail "torch cannot use CUDA (see above)"
import sys
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, built for CUDA "
      f"{torch.version.cuda}")
if torch.version.cuda is None:
    sys.exit("this torch is a CPU-only build; install a CUDA build of torch")
if not torch.cuda.is_available():
    sys.exit("torch.cuda.is_available() is False")
print(f"{torch.cuda.device_count()} device(s); device 0: {torch.cuda.get_device_name(0)}, "
      f"bf16 supported: {torch.cuda.is_bf16_supported()}")
EOF

"$PY" -c "import vaderSentiment" 2>/dev/null \
  || fail "the benchmarks' lexicon reward needs vaderSentiment: pip install -e '.[worlds]'"

check "2. CUDA + bfloat16: short RLOO and PPO fits on a tiny model, ratio at the first epoch"
timeout 600 "$PY" - <<'EOF' || fail "the CUDA/bf16 fit check (see above)"
import math
import sys
import tempfile

import torch

import prefopt
from prefopt import PPOPolicy, RLOOPolicy
from prefopt.backend import (EncodedPrompts, encode_prompts, make_generator,
                             response_logprobs, sample, truncate_after_eos)

sys.path.insert(0, "benchmarks")
import throughput as tp  # noqa: E402  (its tiny model and reward)

prefopt.set_config(device="cuda", dtype="bfloat16", show_progress_bar=False)
world = tp.load_world(500)
path = tempfile.mkdtemp(prefix="prefopt-gpu-check-")
model_info = tp.build_model_dir("world", world, path, max_new_tokens=16)
prompts = list(world.prompts)
print(f"tiny model: {tp._model_words(model_info)}")

# A random model rarely ends with EOS: score the text alone (no missing-EOS reward).
rloo = RLOOPolicy(model=path, k=4, batch_size=32, n_steps=3, max_new_tokens=16,
                  learning_rate=1e-3, missing_eos_reward=None,
                  random_state=0).fit(prompts, tp.lexicon_reward)
device = next(rloo.model_.parameters()).device
print(f"RLOO model on {device}; history:")
for row in rloo.history_:
    print("  " + ", ".join(f"{k}={v:.4g}" for k, v in row.items() if isinstance(v, float)))
assert device.type == "cuda", f"the policy is on {device}, not CUDA"
for row in rloo.history_:
    for key, value in row.items():
        assert not isinstance(value, float) or math.isfinite(value), f"{key}={value}"

# Rollout log-probs (no grad, the whole batch) against a training-mode pass on half of it
# (grad on, a minibatch, as the update runs): the ratio at the first epoch should be 1.
model, tok = rloo.model_, rloo.tokenizer_
enc = encode_prompts(tok, prompts[:32])
enc = EncodedPrompts(enc.input_ids.to(device), enc.attention_mask.to(device))
with torch.no_grad():
    raw = sample(model, enc, max_new_tokens=16, temperature=rloo.temperature_,
                 generator=make_generator(0), suppress_ids=(tok.pad_token_id,))
    ids, mask, _ = truncate_after_eos(raw, tok.eos_token_id, tok.pad_token_id)
    old = response_logprobs(model, enc, ids, mask, temperature=rloo.temperature_,
                            suppress_ids=(tok.pad_token_id,))
half = slice(0, 16)
new, _ = response_logprobs(model, enc[half], ids[half], mask[half],
                           temperature=rloo.temperature_, suppress_ids=(tok.pad_token_id,),
                           with_entropy=True)
ratio = (new.detach() - old[half]).exp()[mask[half].bool()]
dev = (ratio - 1).abs()
print(f"RLOO first-epoch ratio over {ratio.numel()} tokens: mean {ratio.mean():.6f}, "
      f"max |ratio - 1| {dev.max():.3g}")
assert torch.isfinite(ratio).all()
assert dev.mean() < 1e-2 and dev.max() < 0.1, "rollout and training log-probs disagree"

ppo = PPOPolicy(model=path, batch_size=32, n_steps=1, n_epochs=1, n_minibatches=1,
                max_new_tokens=16, learning_rate=1e-3, missing_eos_reward=None,
                random_state=0).fit(prompts, tp.lexicon_reward)
row = ppo.history_[0]
print(f"PPO after one epoch: policy/ratio_mean {row.get('policy/ratio_mean')}, "
      f"policy/clipfrac {row.get('policy/clipfrac')}, policy/approxkl "
      f"{row.get('policy/approxkl')}")
assert all(math.isfinite(v) for v in row.values() if isinstance(v, float))
if "policy/ratio_mean" in row:
    assert abs(row["policy/ratio_mean"] - 1) < 1e-2, "PPO's first-epoch ratio is not 1"
if "policy/clipfrac" in row:
    assert row["policy/clipfrac"] < 1e-2, "PPO clips at the first epoch"
print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MB; OK")
EOF

check "3. GPU-marked tests"
set +e
timeout 900 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests
status=$?
set -e
case "$status" in
  0) ;;
  5) echo "(no test is marked gpu yet)" ;;
  *) fail "pytest -m gpu exited $status" ;;
esac

check "4. throughput on the GPU"
PEER=()
if "$PY" -c "import trl" 2>/dev/null; then PEER=(--peer trl); else echo "(trl not installed: no peer)"; fi
timeout 600 "$PY" benchmarks/throughput.py --device cuda --dtype bfloat16 --size tiny \
  ${PEER[@]+"${PEER[@]}"} || fail "the tiny throughput benchmark"
echo
timeout 600 "$PY" benchmarks/throughput.py --device cuda --dtype bfloat16 --size tiny \
  --algorithms rloo --compile ${PEER[@]+"${PEER[@]}"} || fail "the compiled tiny benchmark"
if [ -z "${QUICK:-}" ]; then
  echo
  timeout 900 "$PY" benchmarks/throughput.py --device cuda --dtype bfloat16 --size gpt2 \
    ${PEER[@]+"${PEER[@]}"} || fail "the GPT-2-sized throughput benchmark"
fi

check "5. vLLM on CUDA: the engine's tests, then native against vLLM generation"
if "$PY" -c "import vllm" 2>/dev/null; then
  # The engine in this process (weights pushed in memory), next to the policy on the GPU.
  VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 900 "$PY" -m pytest -q -p no:cacheprovider \
    -m vllm tests/test_vllm_engine.py || fail "the vLLM tests on CUDA"
  VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 900 "$PY" benchmarks/throughput.py --device cuda \
    --dtype bfloat16 --size summarize --algorithms rloo --engine both \
    || fail "native against vLLM generation on CUDA"
else
  echo "(vllm not installed: pip install -e '.[vllm]' runs this check)"
fi
echo
echo "All GPU checks passed ($(date +%H:%M:%S))."
