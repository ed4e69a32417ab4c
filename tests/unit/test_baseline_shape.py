"""A baseline's stored shape is spelled once: each shipped file survives to_json/from_json.

``miles_amd.rules.model.Baseline.to_json`` is what ``baseline record`` writes and
``from_json`` what the loader reads; for every shipped baseline the loaded object writes
back the file's content (semantically: same keys, same values) and reads back equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miles_amd.baseline.model import RECIPE_DIR, baselines_root, load_baseline
from miles_amd.rules.model import Baseline, Rule

SHIPPED_FILES = sorted((baselines_root() / RECIPE_DIR).glob("*/*/*.json"))


def test_every_shipped_baseline_is_found() -> None:
    assert {p.stem for p in SHIPPED_FILES} >= {"stock", "patched"}


@pytest.mark.parametrize("path", SHIPPED_FILES, ids=lambda p: p.stem)
def test_a_shipped_baseline_writes_back_its_file_and_reads_back_equal(path: Path) -> None:
    loaded = load_baseline(path)
    written = loaded.to_json()
    assert written == json.loads(path.read_text(encoding="utf-8"))
    assert list(written) == list(json.loads(path.read_text(encoding="utf-8")))
    assert Baseline.from_json(written, loaded.path) == loaded
    assert Baseline.from_json(json.loads(json.dumps(written)), loaded.path) == loaded


def test_a_rule_keeps_its_kinds_fields_in_file_order_between_the_common_ones() -> None:
    entry = {
        "id": "x",
        "kind": "sd_at_least",
        "metric": "rollout/raw_reward",
        "required": True,
        "z": 3,
        "floor": 0.05,
        "rationale": "r",
        "derivation": "d",
    }
    rule = Rule.from_json(entry)
    assert rule.params == {"z": 3, "floor": 0.05}
    assert list(rule.to_json().items()) == list(entry.items())
    no_metric = {k: v for k, v in entry.items() if k != "metric"}
    assert Rule.from_json(no_metric).to_json() == no_metric
