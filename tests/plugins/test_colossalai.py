"""Colossal-AI plugin keyword arguments, checked against HybridParallelPlugin's signature.

colossalai pins an old torch and, installed without its dependencies next to ours, does not
import (its booster package imports peft and transformers); the signature is then read from the
installed source with ast, which is the same information inspect would give.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
from pathlib import Path

import pytest

from autoplan.errors import ExportError
from autoplan.plugins.colossalai import colossalai_plugin_kwargs, render
from tests.plugins.plans import changed, load_plan

COLOSSAL_PLANS = ["llama8b_3d_vpp_sp", "gpt13b_uneven_stages", "gpt13b_ethernet_10g"]


def plugin_parameters() -> set[str]:
    """Keyword parameters of ``HybridParallelPlugin.__init__`` in the installed colossalai."""
    if importlib.util.find_spec("colossalai") is None:
        pytest.skip("colossalai is not installed (pip install -e '.[export-test]')")
    try:
        from colossalai.booster.plugin import HybridParallelPlugin
        return set(inspect.signature(HybridParallelPlugin.__init__).parameters) - {"self"}
    except ImportError:
        pass
    spec = importlib.util.find_spec("colossalai")
    source = Path(spec.origin).parent / "booster" / "plugin" / "hybrid_parallel_plugin.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "HybridParallelPlugin":
            init = next(f for f in node.body if isinstance(f, ast.FunctionDef)
                        and f.name == "__init__")
            return {arg.arg for arg in init.args.args + init.args.kwonlyargs} - {"self"}
    pytest.fail("HybridParallelPlugin not found in the installed colossalai")


@pytest.mark.parametrize("name", COLOSSAL_PLANS)
def test_kwargs_are_plugin_parameters(name):
    kwargs = json.loads(render(load_plan(name))["colossalai_plugin.json"])
    assert set(kwargs) <= plugin_parameters(), set(kwargs) - plugin_parameters()


def test_tp_with_sequence_parallel_uses_split_gather():
    kwargs = colossalai_plugin_kwargs(load_plan("gpt13b_uneven_stages"))
    assert kwargs["sequence_parallelism_mode"] == "split_gather"
    assert kwargs["num_layers_per_stage"] == [7, 8, 8, 7]
    assert kwargs["precision"] == "fp16"


def test_interleaved_pipeline():
    kwargs = colossalai_plugin_kwargs(load_plan("llama8b_3d_vpp_sp"))
    assert (kwargs["pp_style"], kwargs["num_model_chunks"], kwargs["num_microbatches"]) == (
        "interleaved", 2, 32)


def test_zero3_is_refused_as_a_gemini_plan():
    with pytest.raises(ExportError, match="GeminiPlugin"):
        colossalai_plugin_kwargs(load_plan("llama8b_zero3_offload_1gpu"))


def test_pipeline_with_zero2_is_refused():
    result = changed(load_plan("gpt13b_ethernet_10g"), plan={"zero_stage": 2})
    with pytest.raises(ExportError, match="ZeRO stage 0 or 1"):
        colossalai_plugin_kwargs(result)
