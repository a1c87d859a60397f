"""Whole-process wall time of `autoplan` commands, as a user waits for them: interpreter start,
imports, trace (or the trace cache), search and printing.

    .venv/bin/python benchmarks/whole_process.py [--repeats 3] [--time-limit 600]
        [--against OTHER/.venv/bin/autoplan --against-label 'before: main']

Cold: an empty trace cache ($XDG_CACHE_HOME pointed at a fresh folder), so model.py is traced;
warm: the same command again, the trace read from the cache. The floors are printed first:
the interpreter importing what a warm solve needs (autoplan's API and the CP-SAT solver,
without pandas: search/cpsat.py), and what a cold one adds, torch (torch._dynamo, which torch
would import at a trace's first meta kernel, is left out: graph/no_compile.py; its import is
printed for comparison), and what the trace's first meta kernels import besides: sympy and
torch.fx.experimental.symbolic_shapes (torch._prims_common's type promotion and shape guards
import them in the call; graph/model.py's warm-up trace pays for them before the sandbox
forks). Each figure is the median of --repeats runs, with the CPU time
(user + sys, children included), which moves less with the machine's load than the wall time;
the load average is printed with them, and each job's ceilings from issue 15 (whole-process,
on this 2-core machine). The runs see compiled bytecode as an installed package has it:
PYTHONDONTWRITEBYTECODE (set in some shells) is dropped for them, and this checkout's packages
are compiled first (``compileall``, untimed), as pip does on install. ``--against`` times another checkout's console script
(e.g. main's) on the same jobs, its runs interleaved with this checkout's so that both see the
same load, and how many times this checkout's CPU time the other's is. For comparison,
Calculon (Isaev et al., SC'23) reports 77 s for its search of the 530B job on 5,128 A100; it
is not re-measured here (it is not on PyPI).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"
AUTOPLAN = [str(Path(sys.executable).parent / "autoplan")]  # the console script users run


def dgx_a100(nodes: int) -> dict:
    """DGX A100 nodes as examples/clusters/dgx-a100-x280.yaml has them."""
    return {"name": f"dgx-a100-x{nodes}", "gpu": "a100-sxm4-80gb", "nodes": nodes,
            "gpus_per_node": 8, "intra_node": {"link": "nvswitch", "bandwidth": "300GB/s"},
            "inter_node": {"link": "infiniband", "nics_per_node": 8, "bandwidth": "200Gbps",
                           "latency": "5us", "interface": "ib0"}}


SOURCES = ("autoplan", "costmodels", "plugins", "examples")
"""This checkout's Python, compiled before the runs."""

FLOORS = [  # (label, python statement)
    ("import autoplan.api + CP-SAT", "import autoplan.api, autoplan.search.solve"),
    ("import torch", "import torch"),
    ("import torch + torch._dynamo", "import torch, torch._dynamo"),
    ("import torch + trace's lazy ones", "import torch, sympy, torch.fx.experimental.symbolic_shapes"),
]

JOBS = [  # (label, model file, nodes, seq len, global batch, ceilings)
    ("MT-NLG 530B on 5,128 A100", "mtnlg_530b.py", 641, 2048, 1920, "at most 4 s cold, 1.5 s warm"),
    ("GPT 1T on 3,072 A100", "gpt_1t.py", 384, 2048, 3072, "at most 10 s cold"),
]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], cache: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children): on a shared machine the
    CPU time moves less with the load than the wall time does."""
    env = {**_with_bytecode(), "XDG_CACHE_HOME": str(cache)}
    start, cpu = time.perf_counter(), _children_cpu_s()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start, _children_cpu_s() - cpu
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr}")
    return elapsed


def _with_bytecode() -> dict[str, str]:
    """This environment, with Python free to read and write its bytecode caches."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def median(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """(wall, CPU) seconds, each the median over the runs."""
    wall, cpu = (statistics.median(r[i] for r in runs) for i in (0, 1))
    return wall, cpu


def shown(times: tuple[float, float]) -> str:
    return f"{times[0]:6.2f} s ({times[1]:5.2f} s CPU)"


def cold_and_warm(commands: dict[str, list[str]], repeats: int, scratch: Path
                  ) -> dict[str, tuple[tuple[float, float], tuple[float, float]]]:
    """Each command's (cold, warm) medians, the commands' runs interleaved."""
    cold: dict[str, list] = {name: [] for name in commands}
    warm: dict[str, list] = {name: [] for name in commands}
    for i in range(repeats):
        for name, argv in commands.items():
            cache = scratch / f"cache-{name}-{Path(argv[2]).stem}-{i}"
            cold[name].append(timed(argv, cache))
            warm[name].append(timed(argv, cache))
    return {name: (median(cold[name]), median(warm[name])) for name in commands}


def ratio(found: dict, which: int) -> float:
    """How many times the CPU time of --against this checkout's is (cold 0, warm 1)."""
    return found["against"][which][1] / found["this"][which][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout's autoplan script")
    parser.add_argument("--against-label", help="what to call it (e.g. 'before: main e15f028')")
    parser.add_argument("--time-limit", type=float, help="solve --time-limit (on a loaded "
                        "machine the default 60 s can cut a search short, and its CPU time)")
    args = parser.parse_args()
    scripts = {"this": AUTOPLAN} | ({"against": [str(args.against)]} if args.against else {})
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        timed([sys.executable, "-m", "compileall", "-q", *(str(ROOT / d) for d in SOURCES)],
              scratch / "bytecode")  # untimed
        help_runs = [timed([*AUTOPLAN, "--help"], scratch / "help") for _ in range(args.repeats)]
        print(f"{'autoplan --help':<32} {shown(median(help_runs))}")
        for label, statement in FLOORS:
            runs = [timed([sys.executable, "-c", statement], scratch / "floor")
                    for _ in range(args.repeats)]
            print(f"{label:<32} {shown(median(runs))}")
        for label, model, nodes, seq_len, batch, ceilings in JOBS:
            cluster = scratch / f"dgx-a100-x{nodes}.yaml"
            cluster.write_text(yaml.safe_dump(dgx_a100(nodes)))
            tail = ["solve", str(MODELS / model), str(cluster), "--seq-len", str(seq_len),
                    "--global-batch", str(batch),
                    *(["--time-limit", str(args.time_limit)] if args.time_limit else [])]
            found = cold_and_warm({name: [*script, *tail] for name, script in scripts.items()},
                                  args.repeats, scratch)
            for name, (cold, warm) in found.items():
                which = "" if name == "this" else f" ({args.against_label or args.against})"
                print(f"{label + which:<32} cold {shown(cold)}   warm {shown(warm)}   (Calculon: "
                      f"{'77 s, not re-measured' if '530B' in label else 'n/a'}; {ceilings}; "
                      f"load {os.getloadavg()[0]:.1f})")
            if args.against:
                print(f"{'  against / this, CPU':<32} cold {ratio(found, 0):5.2f}x"
                      f"{'':18}warm {ratio(found, 1):5.2f}x")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
