"""CP-SAT without pandas: the solve path imports OR-Tools' cp_model without importing pandas
(``search.solve`` imports it from ``search.cpsat`` before anything imports it with pandas; a
module that imported cp_model directly when the CLI or API is imported would undo that), and
cp_model's pandas helpers still work once pandas is imported (the stand-in forwards)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
import autoplan.cli, autoplan.api, autoplan.search.solve  # what a CLI solve imports
from autoplan.search.cpsat import cp_model
print("pandas" in sys.modules)

model = cp_model.CpModel()  # max x + 2y with x + y <= 4, x, y in [0, 3]
x, y = model.new_int_var(0, 3, "x"), model.new_int_var(0, 3, "y")
model.add(x + y <= 4)
model.maximize(x + 2 * y)
solver = cp_model.CpSolver()
print(solver.solve(model) == cp_model.OPTIMAL, solver.value(x), solver.value(y))

import pandas as pd
index = pd.Index(["a", "b", "c"])
upper = pd.Series([1, 2, 3], index=index)
series = model.new_int_var_series("v", index, lower_bounds=0, upper_bounds=upper)
print(type(series) is pd.Series, [series[k].proto.domain[1] for k in index])
"""


def test_cp_model_without_pandas_and_its_pandas_helpers_after():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    imported, solved, series = done.stdout.splitlines()
    assert imported == "False"
    # by hand: y takes its bound 3 (worth 2 each), x the 1 left of x + y <= 4: 1 + 2*3 = 7
    assert solved == "True 1 3"
    # the per-row upper bounds come from the Series (an isinstance test through the stand-in)
    assert series == "True [1, 2, 3]"
