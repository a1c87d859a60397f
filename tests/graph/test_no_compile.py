"""A trace without torch._dynamo gives the layer graph torch's own path gives: the same models
traced in a fresh process (where ``no_compile`` keeps torch._dynamo unloaded) and in one that
imported torch._dynamo first (where ``no_compile`` changes nothing, so torch runs as shipped)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ["tiny_gpt.py", "llama2_7b.py"]
"""Models of plain torch (autoplan.zoo): GPT (LayerNorm, GELU, tied head) and Llama (RMSNorm,
SwiGLU, rotary embeddings). Model files that import transformers or torchvision load
torch._dynamo themselves, and then ``no_compile`` changes nothing."""

TRACE = """
import gc, pickle, sys, types
{first}
from pathlib import Path
from autoplan.graph.loader import load_model_source
from autoplan.graph.trace import trace_model
graphs = [trace_model(load_model_source(Path(p)), seq_len=64) for p in {paths!r}]
own = sum(type(f) is types.FunctionType and getattr(f, "__dynamo_disable", None) is f
          for f in gc.get_objects())
sys.stdout.buffer.write(pickle.dumps((graphs, "torch._dynamo" in sys.modules, own)))
"""


def _traced(first: str) -> tuple:
    import pickle

    paths = [str(ROOT / "examples" / "models" / name) for name in MODELS]
    done = subprocess.run([sys.executable, "-c", TRACE.format(first=first, paths=paths)],
                          capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()
    return pickle.loads(done.stdout)


def test_the_graph_is_torchs_own_without_importing_dynamo():
    graphs, dynamo_loaded, left_marked = _traced("import torch")
    reference, reference_loaded, _ = _traced("import torch, torch._dynamo")
    assert reference_loaded and not dynamo_loaded
    assert left_marked == 0, "a mark kept the plain function after the trace"
    assert graphs == reference
