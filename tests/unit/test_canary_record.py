"""``canary.json`` (``records.canary``, ``canary.record``): the merge of the ranks' results,
strict reading, the shipped schema, and the atomic write into a run dir. Pure: no torch, no
ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from miles_amd.canary.harness import Setup, merge
from miles_amd.canary.plan import CPU, build_plan, recipe_shape
from miles_amd.canary.record import schema_path, write_canary
from miles_amd.recipe.settings import Recipe
from miles_amd.records.canary import CanaryRecord
from miles_amd.run_dir import RunDir

PLAN = build_plan(recipe_shape(Recipe()), "reducer", 0.5, target=CPU, tokens=(28, 29))


def rank_result(rank: int, bad: list[int], first: dict[str, Any] | None) -> dict[str, Any]:
    """One rank's result as ``canary.worker`` writes it: size 28 clean, size 29 as given."""
    clean = {
        "calls": 4,
        "seconds": 0.004,
        "wrong_elements": 0,
        "mismatches_per_repeat": [0, 0],
        "first": None,
    }
    return {
        "rank": rank,
        "group": rank // 4,
        "entries": [
            {**clean, "tokens": 28},
            {
                "tokens": 29,
                "calls": 14,
                "seconds": 0.028 * (rank + 1),
                "wrong_elements": 5 if first else 0,
                "mismatches_per_repeat": bad,
                "first": first,
            },
        ],
    }


def faulty_record() -> CanaryRecord:
    first_late = {"repeat": 1, "call": 0, "index": 9, "expected": 12.0, "seen": -3.0}
    first_early = {"repeat": 0, "call": 5, "index": 2, "expected": 4.0, "seen": 0.0}
    ranks = [
        rank_result(0, [1, 1], None),  # the group's leader holds the union of the flags
        rank_result(1, [1, 1], first_late),
        rank_result(2, [1, 1], first_early),
        rank_result(3, [1, 1], None),
    ]
    setup = Setup(
        world_size=4, device="cpu", implementation="reducer", reducer="/r.py:f", repeats=2
    )
    return merge(PLAN, setup, ranks, 100.0, 107.5)


def test_merge_counts_calls_once_per_group_and_keeps_the_earliest_mismatch() -> None:
    record = faulty_record()
    clean, bad = record.results
    assert (clean.tokens, clean.mismatches, clean.first_mismatch) == (28, 0, None)
    assert clean.rate_upper_99 is not None and clean.rate_upper_99 > 0
    assert (bad.tokens, bad.calls, bad.mismatches, bad.wrong_elements) == (29, 14, 2, 10)
    assert bad.first_mismatch is not None
    assert (bad.first_mismatch.rank, bad.first_mismatch.call, bad.first_mismatch.seen) == (
        2,
        5,
        0.0,
    )
    assert bad.latency_us == pytest.approx(1e6 * 0.028 * 2.5 / 14)
    assert (record.repeats, record.repeats_with_mismatch, record.mismatches) == (2, 2, 2)
    assert record.first_bad() is bad and not record.clean
    assert record.power.affected_calls == 7 and record.power.probability >= 0.99


def test_the_written_record_reads_back_equal_and_matches_the_shipped_schema(tmp_path: Path) -> None:
    record = faulty_record()
    path = write_canary(tmp_path / "run", record)
    assert path == RunDir(tmp_path / "run").canary_json
    text = path.read_text(encoding="utf-8")
    assert CanaryRecord.from_json(text) == record
    jsonschema.validate(json.loads(text), json.loads(schema_path().read_text(encoding="utf-8")))
    assert [p.name for p in path.parent.iterdir()] == ["canary.json"]  # no temp file left


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(schema_version=2), '"schema_version" must be 1'),
        (lambda d: d.update(implementation="nccl"), '"implementation" must be one of'),
        (lambda d: d.update(variant="fixed"), '"variant" must be one of'),
        (lambda d: d["results"][1].update(calls="14"), '"results[1].calls" must be an integer'),
        (
            lambda d: d["results"][1]["first_mismatch"].update(index=-1),
            "results[1].first_mismatch.index",
        ),
        (lambda d: d["results"][0].pop("mismatches"), '"results[0].mismatches" is missing'),
        (lambda d: d["plan"][0].update(role="warmup"), '"plan[0].role" must be one of'),
        (lambda d: d["power"].update(detect_rate=1.0), '"power.detect_rate" must be in'),
        (lambda d: d.update(start_time=True), '"start_time" must be a finite number'),
    ],
)
def test_a_wrong_field_is_refused_by_name(edit: Any, message: str) -> None:
    data = faulty_record().to_dict()
    edit(data)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        CanaryRecord.from_dict(data)
    schema = json.loads(schema_path().read_text(encoding="utf-8"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_more_repeats_with_a_mismatch_than_repeats_is_refused() -> None:
    """A cross-field rule JSON Schema cannot state: the reader holds it."""
    data = faulty_record().to_dict()
    data["repeats_with_mismatch"] = 3
    with pytest.raises(ValueError, match="exceeds"):
        CanaryRecord.from_dict(data)


def test_non_finite_numbers_and_duplicate_keys_are_refused() -> None:
    text = faulty_record().to_json()
    with pytest.raises(ValueError, match="non-finite"):
        CanaryRecord.from_json(text.replace('"end_time": 107.5', '"end_time": NaN'))
    with pytest.raises(ValueError, match="duplicate"):
        CanaryRecord.from_json(text.replace('"end_time": 107.5', '"end_time": 1, "end_time": 2'))
    with pytest.raises(ValueError, match="JSON object"):
        CanaryRecord.from_json("[]")
