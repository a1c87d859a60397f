"""Fixture plans for the exporter tests: hand-written, consistent plan JSON documents."""

from __future__ import annotations

from pathlib import Path

from autoplan.plan import Result

DATA = Path(__file__).parent / "data"
PLAN_NAMES = sorted(path.stem for path in DATA.glob("*.json"))


def load_plan(name: str) -> Result:
    """A fixture plan by file stem, validated by the Result contract."""
    return Result.model_validate_json((DATA / f"{name}.json").read_text())


def changed(result: Result, *, plan: dict | None = None, **sections: object) -> Result:
    """A copy of ``result`` with plan fields or whole sections replaced, validated again (so a
    test cannot build a plan the contract forbids)."""
    doc = result.model_dump(mode="json")
    doc["plan"].update(plan or {})
    doc.update(sections)
    return Result.model_validate(doc)


def stages_for(blocks: list[int]) -> list[dict]:
    """Plan stages for a chain embedding, blocks..., norm, head, loss with ``blocks[i]``
    transformer blocks in stage i (embedding on the first, norm/head/loss on the last)."""
    out, first = [], 0
    for index, count in enumerate(blocks):
        size = count + (index == 0) + 3 * (index == len(blocks) - 1)
        out.append({"first_layer": first, "num_layers": size})
        first += size
    return out
