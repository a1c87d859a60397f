"""One vocabulary of degrees: every pin, CLI pin flag and sweep axis reaches a Plan field.

The expected names are the external contract written out here, not read from
``autoplan.degrees``: the flags and plan JSON keys of the README and the issue (``--mbs`` is
``micro_batch_size``, ``--zero`` is ``zero_stage``, ``--sp`` is ``sequence_parallel``) and the
sweep axes of examples/sweeps and docs/sweeps.md. What is checked against them is read from
the code's own schemas: pydantic's ``model_fields`` and the click commands typer builds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from autoplan import api
from autoplan import sweep as sweeps
from autoplan.cli import app
from autoplan.degrees import DEGREE
from autoplan.plan import Plan, Stage
from autoplan.search.conflicts import requirements
from autoplan.training import Bounds, Objective, Pins

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "models" / "tiny_gpt.py"
DGX16 = ROOT / "examples" / "clusters" / "dgx-a100-x16.yaml"

PLAN_KEY = {
    "tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "mbs": "micro_batch_size",
    "zero": "zero_stage", "recompute": "recompute", "recompute_num_layers": "recompute_num_layers",
    "sp": "sequence_parallel", "vpp": "vpp", "offload": "offload", "placement": "placement",
    "ep": "ep"}
"""Pin name -> plan JSON key (README: Plan JSON; solve --help)."""
PIN_FLAGS = {
    "--tp": "tp", "--pp": "pp", "--dp": "dp", "--cp": "cp", "--mbs": "mbs", "--zero": "zero",
    "--recompute": "recompute", "--recompute-num-layers": "recompute_num_layers", "--sp": "sp",
    "--vpp": "vpp", "--offload": "offload", "--placement": "placement", "--ep": "ep"}
"""The pin flags of solve and estimate -> the pin they set."""
SWEEP_AXES = ("tp", "pp", "dp", "mbs", "zero", "recompute", "sp", "vpp", "offload")
"""The pin axes of sweep files, in their order (docs/sweeps.md)."""


def test_every_pins_field_maps_to_its_plan_field():
    assert set(Pins.model_fields) == set(PLAN_KEY)
    for name in Pins.model_fields:
        assert DEGREE[name].plan == PLAN_KEY[name]
        assert PLAN_KEY[name] in Plan.model_fields


def test_pins_take_the_values_their_plan_fields_take():
    """A pin is constrained as its Plan field is (same bounds, same type or None)."""
    for name, pin in Pins.model_fields.items():
        field = Plan.model_fields[PLAN_KEY[name]]
        assert pin.default is None
        assert pin.metadata == field.metadata, name
        assert pin.annotation in (field.annotation | None, field.annotation), name


def test_every_bounds_key_is_an_integer_plan_field():
    """The options file's ``bounds:`` keys are pin names of integer Plan fields."""
    for name in Bounds.model_fields:
        assert DEGREE[name].plan == PLAN_KEY[name]
        assert Plan.model_fields[PLAN_KEY[name]].annotation is int, name


def _options(command: str) -> dict:
    group = typer.main.get_command(app)
    return {opt: param for param in group.commands[command].params for opt in param.opts}


@pytest.mark.parametrize("command", ["solve", "estimate"])
def test_every_cli_pin_flag_maps_to_its_plan_field(command):
    options = _options(command)
    for flag, pin in PIN_FLAGS.items():
        param = options[flag]
        assert param.name == pin, flag  # the command's parameter is named as the pin
        assert DEGREE[param.name].plan == PLAN_KEY[pin] and PLAN_KEY[pin] in Plan.model_fields
    assert options["--sp"].secondary_opts == ["--no-sp"]
    assert {p.name for p in options.values()} >= set(Pins.model_fields)


def test_every_sweep_axis_maps_to_its_plan_field():
    for schema in (sweeps.PointInputs, sweeps.Axes):
        pins = tuple(name for name in schema.model_fields if name in PLAN_KEY)
        assert pins == SWEEP_AXES
        for name in pins:
            assert DEGREE[name].plan == PLAN_KEY[name] and PLAN_KEY[name] in Plan.model_fields
    assert sweeps.PIN_NAMES == SWEEP_AXES


def test_example_sweep_files_still_read():
    for path in sorted((ROOT / "examples" / "sweeps").glob("*.yaml")):
        spec = sweeps.load_sweep_spec(path)
        assert spec.over.model_dump(exclude_none=True), path


def test_sweep_table_columns_are_the_plan_json_keys():
    """sweep.csv's plan columns, as the file format has them (plan_<Plan JSON key>)."""
    plan = Plan(tp=2, pp=1, dp=4, zero_stage=1, micro_batch_size=2, global_batch_size=16,
                num_microbatches=2, sequence_parallel=True, world_size=8,
                stages=(Stage(first_layer=0, num_layers=4),))
    doc = {"points": [{"inputs": {"mbs": 2}, "plan": plan.model_dump(mode="json"),
                       "estimate": {}, "metrics": {}, "solver": {"status": "OPTIMAL"},
                       "fronts": {f: True for f in sweeps.FRONTS}}]}
    row = sweeps.flat_rows(doc)[0]
    columns = [k for k in row if k.startswith("plan_")]
    assert columns == ["plan_tp", "plan_pp", "plan_dp", "plan_cp", "plan_ep", "plan_zero_stage",
                       "plan_micro_batch_size", "plan_recompute", "plan_sequence_parallel",
                       "plan_vpp", "plan_offload"]
    assert (row["plan_micro_batch_size"], row["plan_zero_stage"],
            row["plan_sequence_parallel"], row["plan_recompute"]) == (2, 1, True, "none")


def test_every_cli_pin_reaches_the_plan_json():
    """estimate with every pin flag: each value lands under its plan JSON key."""
    flags = ["--tp", "2", "--pp", "2", "--dp", "4", "--cp", "1", "--mbs", "2", "--zero", "1",
             "--recompute", "full", "--recompute-num-layers", "1", "--sp", "--vpp", "1",
             "--offload", "none", "--placement", "tp-cp-pp-dp", "--ep", "1"]
    out = CliRunner().invoke(app, ["estimate", str(TINY), str(DGX16), "--seq-len", "128",
                                   "--global-batch", "16", "--json", *flags])
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)["plan"]
    assert {k: plan[k] for k in ("tp", "pp", "dp", "cp", "micro_batch_size", "zero_stage",
                                 "recompute", "recompute_num_layers", "sequence_parallel",
                                 "vpp", "offload", "placement")} == {
        "tp": 2, "pp": 2, "dp": 4, "cp": 1, "micro_batch_size": 2, "zero_stage": 1,
        "recompute": "full", "recompute_num_layers": 1, "sequence_parallel": True, "vpp": 1,
        "offload": "none", "placement": "tp-cp-pp-dp"}
    assert "ep" not in plan  # ep = 1 is left out of the JSON
    assert plan["num_microbatches"] == 2  # 16 sequences / (dp 4 x mbs 2)


def test_sweep_point_pins_reach_the_plan():
    """A fully pinned sweep point solves to exactly its pins."""
    doc = sweeps.sweep(api.load_model(TINY), api.load_cluster(DGX16), over={"mbs": [2]},
                       base={"seq_len": 128, "global_batch": 32, "runtime": "megatron",
                             "tp": 2, "pp": 1, "dp": 8, "zero": 1, "recompute": "selective",
                             "sp": True, "vpp": 1, "offload": "none"}, workers=1)
    plan = doc["points"][0]["plan"]
    assert (plan["tp"], plan["pp"], plan["dp"], plan["micro_batch_size"], plan["zero_stage"],
            plan["recompute"], plan["sequence_parallel"], plan["vpp"], plan["offload"]) == (
        2, 1, 8, 2, 1, "selective", True, 1, "none")


def test_conflict_messages_name_real_flags():
    """The requirements a conflict quotes are written as the flags solve takes."""
    pins = Pins(mbs=2, zero=1, recompute="full", recompute_num_layers=2, sp=False,
                placement="tp-cp-pp-dp")
    labels = [r.label for r in requirements(pins, None, None, Objective(), 2**30)][:-1]
    assert labels == ["--mbs 2", "--zero 1", "--recompute full", "--recompute-num-layers 2",
                      "--no-sp", "--placement tp-cp-pp-dp"]
    options = _options("solve")
    for label in labels:
        flag = label.split()[0]
        assert flag in options or flag in options["--sp"].secondary_opts, flag
