"""Whether a speed change kept every answer: ``autoplan solve --json`` of the example cases and
the two whole-process jobs, from this checkout and from another one, compared with
``wall_time_s`` left out (the only field a faster search may change).

    .venv/bin/python benchmarks/same_plans.py --against OTHER/.venv/bin/autoplan [--only NAME]

Each case runs with ``--time-limit 600`` (a loaded machine must not cut a search short) and
one trace cache shared by both checkouts' runs. Prints one line per case and exits 1 when
any document differs (its first differing line is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from whole_process import JOBS, MODELS, ROOT, dgx_a100

AUTOPLAN = str(Path(sys.executable).parent / "autoplan")
CLUSTERS = ROOT / "examples" / "clusters"
CASES = [  # (name, model, cluster, extra arguments)
    ("tiny_gpt", "tiny_gpt", "dgx-a100-x1", "--seq-len 256 --global-batch 32"),
    ("tiny_gpt_groups", "tiny_gpt", "a100-v100-x128-mixed", "--seq-len 64 --global-batch 256"),
    ("tiny_gpt_lab", "tiny_gpt", "lab-a100-v100-mixed", "--seq-len 512 --global-batch 256"),
    ("gpt_13b", "gpt_13b", "dgx-a100-x16", "--seq-len 2048 --global-batch 512"),
    ("gpt_13b_pcie", "gpt_13b", "pcie-x2-10gbe", "--seq-len 2048 --global-batch 64"),
    ("gpt3_175b", "gpt3_175b", "dgx-a100-x128", "--seq-len 2048 --global-batch 1536"),
    ("gpt3_175b_deepspeed", "gpt3_175b", "dgx-a100-x128",
     "--seq-len 2048 --global-batch 1536 --runtime deepspeed"),
    ("llama2_70b", "llama2_70b", "dgx-a100-x16", "--seq-len 4096 --global-batch 512"),
    ("llama2_70b_fsdp", "llama2_70b", "dgx-a100-x16",
     "--seq-len 4096 --global-batch 512 --runtime fsdp"),
    ("llama2_70b_zero3", "llama2_70b", "dgx-a100-x16", "--seq-len 4096 --global-batch 512 --zero 3"),
    ("llama2_7b", "llama2_7b", "dgx-a100-x1", "--seq-len 4096 --global-batch 64"),
    ("llama2_7b_measured", "llama2_7b", "dgx-h100-x4-measured", "--seq-len 4096 --global-batch 256"),
    ("gptj_6b", "gptj_6b", "dgx-h100-x4", "--seq-len 2048 --global-batch 256"),
    ("bloom_176b", "bloom_176b", "dgx-a100-x280", "--seq-len 2048 --global-batch 2048"),
    ("llama3_405b", "llama3_405b", "dgx-a100-x280", "--seq-len 8192 --global-batch 1024"),
    ("mixtral_8x7b", "mixtral_8x7b", "dgx-h100-x4", "--seq-len 4096 --global-batch 256"),
    ("hf_mixtral_tiny", "hf_mixtral_tiny", "dgx-a100-x1", "--seq-len 256 --global-batch 32"),
    ("hf_llama2_7b_lora", "hf_llama2_7b_lora", "l40s-x1", "--seq-len 512 --global-batch 16"),
    ("hf_llama_65b_qlora", "hf_llama_65b_lora", "l40s-x1",
     "--seq-len 512 --global-batch 16 --optimizer adamw8bit --frozen-dtype nf4"),
    ("resnet50", "resnet50", "rtx4090-x8-pcie", "--seq-len 1 --global-batch 256"),
    ("vit_base", "vit_base", "rtx4090-x1", "--seq-len 197 --global-batch 64"),
    ("t5_small", "t5_small", "a100-x1", "--seq-len 512 --global-batch 64"),
]


def commands(scratch: Path) -> dict[str, list[str]]:
    """Each case's ``solve`` arguments (the jobs' clusters written into ``scratch``)."""
    found = {name: ["solve", str(MODELS / f"{model}.py"), str(CLUSTERS / f"{cluster}.yaml"),
                    *extra.split()] for name, model, cluster, extra in CASES}
    for _label, model, nodes, seq_len, batch, _ in JOBS:
        cluster = scratch / f"dgx-a100-x{nodes}.yaml"
        cluster.write_text(yaml.safe_dump(dgx_a100(nodes)))
        found[Path(model).stem] = ["solve", str(MODELS / model), str(cluster), "--seq-len",
                                   str(seq_len), "--global-batch", str(batch)]
    return found


def answer(script: str, args: list[str], cache: Path) -> str:
    """The ``--json`` document without ``wall_time_s`` (or the error, exit code first)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    done = subprocess.run([script, *args, "--time-limit", "600", "--json"], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode:
        return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    return json.dumps(_without_wall_time(json.loads(done.stdout)), indent=1)


def _without_wall_time(document):
    if isinstance(document, dict):
        return {k: _without_wall_time(v) for k, v in document.items() if k != "wall_time_s"}
    if isinstance(document, list):
        return [_without_wall_time(v) for v in document]
    return document


def first_difference(ours: str, theirs: str) -> str:
    for mine, other in zip(ours.splitlines(), theirs.splitlines()):
        if mine != other:
            return f"this: {mine.strip()} | other: {other.strip()}"
    return "one document is longer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="another checkout's autoplan script")
    parser.add_argument("--only", action="append", help="case names to run (default: all)")
    args = parser.parse_args()
    differ = 0
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for name, argv in commands(scratch).items():
            if args.only and name not in args.only:
                continue
            ours, theirs = (answer(s, argv, scratch / "cache") for s in (AUTOPLAN, args.against))
            same = ours == theirs
            differ += not same
            print(f"{name:<22} {'same' if same else 'DIFFERENT: ' + first_difference(ours, theirs)}",
                  flush=True)
    print("all the same" if not differ else f"{differ} differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
