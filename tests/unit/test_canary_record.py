"""``canary.json``: the merge of the ranks' results, strict reading, the shipped schema, the
atomic write, and the positive control's plan, fingerprint and record. No ranks; the control's
kernel on a CUDA GPU only, its hipify in the rehearsal tier."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from miles_amd.canary import harness
from miles_amd.canary.harness import Setup, merge, run, write_canary
from miles_amd.canary.plan import ARMS, CPU, build_plan, control_plan, recipe_shape
from miles_amd.recipe.settings import Recipe
from miles_amd.records.canary import CanaryRecord, ControlRecord, Mismatch
from miles_amd.records.model import parse
from miles_amd.run_dir import RunDir

SCHEMA = json.loads(Path(harness.__file__).with_name("canary.schema.json").read_text())
PLAN = build_plan(recipe_shape(Recipe()), "reducer", 0.5, target=CPU, tokens=(28, 127))
# A wrong element of N=127 where ROCm/aiter#5694's stale read puts one: group rank 2, in rank 3's
# segment (pack 3·11430 + 1152 + 70: block 9's lane 70, the upper wave), off by one input step.
STALE_INDEX = 8 * (3 * 11430 + 1152 + 70) + 3
STALE = {"repeat": 0, "call": 5, "index": STALE_INDEX, "expected": 4.0, "seen": 0.0}
OTHER = {"repeat": 1, "call": 0, "index": 9, "expected": 12.0, "seen": -3.0}


def _arms(calls: int, bad: int, blocks: int) -> dict[str, Any]:
    """Four arms of ``calls`` each in ``blocks`` blocks; ``bad`` calls wrong in the first arm."""
    hit = {"block_hits": 1 if bad else 0, "bad": bad}
    made = {"calls": calls, "seconds": 0.002 * calls, "wall": 0.003 * calls, "blocks": blocks}
    return {
        arm: made | (hit if arm == "back_to_back" else {"block_hits": 0, "bad": 0}) for arm in ARMS
    }


def rank_result(rank: int, bad: list[int], first: dict[str, Any] | None) -> dict[str, Any]:
    """One rank's result as ``canary.worker`` writes it: size 28 clean, size 127 with ``bad``
    calls wrong per repeat (group-wide flags) and ``first`` kept on this rank."""
    kept = [] if first is None else [{"arm": "back_to_back", "returned": None, **first}]
    clean = {"tokens": 28, "wrong_elements": 0, "mismatches_per_repeat": [0, 0], "kept": []}
    size = {"tokens": 127, "wrong_elements": 5 if first else 0, "mismatches_per_repeat": bad}
    entries = [
        clean | {"arms": _arms(2, 0, 1)},
        size | {"kept": kept, "arms": _arms(4, sum(bad), 2)},
    ]
    return {"rank": rank, "group": rank // 4, "entries": entries}


def faulty_record(
    first: dict[str, Any] | None = STALE, control: ControlRecord | None = None
) -> CanaryRecord:
    bad = [0, 0] if first is None else [1, 1]
    ranks = [
        rank_result(0, bad, None),  # the group's leader holds the union of the flags
        rank_result(1, bad, OTHER if first not in (STALE, None) else None),
        rank_result(2, bad, first),
        rank_result(3, bad, None),
    ]
    setup = Setup(4, "cpu", "reducer", reducer="/r.py:f", repeats=2, control=control)
    return merge(PLAN, setup, ranks, 100.0, 107.5)


def test_merge_counts_calls_once_per_group_keeps_every_mismatch_and_reads_its_fingerprint() -> None:
    record = faulty_record()
    clean, bad = record.results
    assert (clean.tokens, clean.mismatches, clean.first_mismatch) == (28, 0, None)
    assert clean.rate_upper_99 is not None and clean.block_rate_upper_99 is not None
    assert clean.block_rate_upper_99 > clean.rate_upper_99  # 8 blocks bound less than 8 calls
    assert (bad.tokens, bad.calls, bad.mismatches, bad.wrong_elements) == (127, 16, 2, 5)
    assert (bad.blocks, bad.blocks_with_mismatch, bad.block_rate_upper_99) == (8, 1, None)
    first = bad.first_mismatch
    assert first is not None and first.matches and (first.rank, first.call, first.seen) == (2, 5, 0)
    assert bad.fingerprint == "stale-read" and record.matches_stale_read
    assert {a.arm: a.mismatches for a in bad.arms}["back_to_back"] == 2
    assert (record.repeats, record.repeats_with_mismatch, record.mismatches) == (2, 2, 2)
    assert record.first_bad() is bad and not record.clean
    assert record.power.exposed_calls == 8 and record.power.probability >= 0.99
    other = faulty_record(OTHER)
    assert other.results[1].fingerprint == "other" and not other.matches_stale_read
    assert [m.matches for m in other.results[1].mismatches_kept] == [False, False]


def test_the_written_record_reads_back_equal_matches_the_schema_and_refuses_bad_json(
    tmp_path: Path,
) -> None:
    control = ControlRecord("control-broken", 40, 12, True, "stale-read")
    record = faulty_record(control=control)
    path = write_canary(tmp_path / "run", record)
    assert path == RunDir(tmp_path / "run").canary_json
    text = path.read_text(encoding="utf-8")
    assert CanaryRecord.from_json(text) == record and record.control == control
    assert CanaryRecord.from_json(faulty_record().to_json()).control is None
    jsonschema.validate(json.loads(text), SCHEMA)
    assert [p.name for p in path.parent.iterdir()] == ["canary.json"]  # no temp file left
    for bad, named in (("NaN", "non-finite"), ('1, "end_time": 2', "duplicate")):
        with pytest.raises(ValueError, match=named):
            CanaryRecord.from_json(text.replace('"end_time": 107.5', f'"end_time": {bad}'))
    with pytest.raises(ValueError, match="JSON object"):
        CanaryRecord.from_json("[]")


def _put(path: str, value: Any) -> Any:
    """An edit setting the dotted ``path`` (list indices as numbers) of a record's dict."""

    def edit(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            d = d[int(key)] if isinstance(d, list) else d[key]
        d.pop(last) if value is _DROP else d.__setitem__(last, value)

    return edit


def _zero_calls(d: dict[str, Any]) -> None:
    for result in d["results"]:
        result.update(calls=0, mismatches=0, wrong_elements=0, blocks=0, blocks_with_mismatch=0)
        result.update(mismatches_kept=[], fingerprint=None)
        for arm in result["arms"]:
            arm.update(calls=0, mismatches=0, blocks=0, blocks_with_mismatch=0)
    d["repeats_with_mismatch"] = 0


def _clean_with_wrong_elements(d: dict[str, Any]) -> None:
    bad = d["results"][1]
    bad.update(mismatches=0, wrong_elements=7, blocks_with_mismatch=0, mismatches_kept=[])
    bad.update(fingerprint=None)
    for arm in bad["arms"]:
        arm.update(mismatches=0, blocks_with_mismatch=0)
    d["repeats_with_mismatch"] = 0


def _no_suspect_size(d: dict[str, Any]) -> None:
    for result in d["results"]:
        result.update(exposed=False, wave_class="waves-agree")


def _power(exposed_calls: int, probability: float) -> Any:
    return lambda d: d["power"].update(exposed_calls=exposed_calls, probability=probability)


_DROP = object()
CONTROL = {"implementation": "control-broken", "calls": 5, "caught": True, "fingerprint": None}
# (edit, the reason named, whether the shipped JSON Schema refuses it too: the rules between
# fields are beyond JSON Schema; issue 36: contradictory or powerless evidence)
REFUSED = [
    (_put("schema_version", 1), '"schema_version" must be one of 2', True),
    (_put("implementation", "nccl"), '"implementation" must be one of', True),
    (_put("results.1.calls", "14"), '"results[1].calls" must be an integer', True),
    (_put("results.0.mismatches", _DROP), '"results[0].mismatches" must be present', True),
    (_put("power.detect_rate", 1.0), '"power.detect_rate" must be < 1', True),
    (_put("control", {"calls": 3}), '"control.implementation" must be present', True),
    (_zero_calls, "no calls were made", False),
    (_no_suspect_size, "no size of the suspect class", False),
    (_clean_with_wrong_elements, "7 wrong elements recorded with 0 mismatched calls", False),
    (_put("results.1.mismatches", 17), "17 mismatches exceed its 16 calls", False),
    (_put("results.1.mismatches_kept", []), "0 mismatches kept with 2", False),
    (_put("results.1.fingerprint", "other"), '"results[1].fingerprint" other disagrees', False),
    (_put("results.1.blocks_with_mismatch", 9), "blocks with a mismatch", False),
    (_put("results.1.arms.1.calls", 5), "arms do not add up", False),
    (_put("repeats_with_mismatch", 0), '"repeats_with_mismatch" 0 disagrees', False),
    (_put("repeats_with_mismatch", 3), "exceeds", False),
    (_power(0, 0.0), "buys no power", False),
    (_power(99, 1.0), "exceeds the 16 calls", False),
    (_put("power.probability", 0.999999), "is not what 8 exposed calls buy", False),
    (_put("control", CONTROL | {"mismatched_calls": 6}), 'mismatched_calls" 6 exceeds', False),
    (_put("control", CONTROL | {"mismatched_calls": 0}), '"control.caught" True disagrees', False),
]


@pytest.mark.parametrize(("edit", "message", "by_schema"), REFUSED)
def test_a_wrong_or_contradictory_record_is_refused_with_its_reason(edit, message, by_schema):
    data = json.loads(faulty_record().to_json())
    edit(data)
    with pytest.raises(ValueError, match=re.escape(message)):
        CanaryRecord.from_dict(data)
    if by_schema:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(data, SCHEMA)


def test_the_control_plan_keeps_suspect_sizes_and_its_result_places_the_first_element() -> None:
    plan = build_plan(recipe_shape(Recipe()), "aiter", 1e-6)
    got = control_plan(plan, calls=7)
    suspect = [e.tokens for e in plan.entries if e.affected or e.exposed]
    assert [e.tokens for e in got.entries] == suspect
    assert len(suspect) < len(plan.entries)  # decode sizes and uniform controls left out
    assert all(e.arms == ((ARMS[0], 7),) for e in got.entries)
    assert {e.implementation for e in got.entries} == {"control-broken"}
    # STALE at N=127, bf16, TP 4: rank 2 read rank 3's segment, block 9's lane 70, one step off.
    caught = harness.control_result(faulty_record(), 2880, 4, 2)
    assert (caught.caught, caught.calls, caught.mismatched_calls) == (True, 24, 2)
    assert caught.fingerprint == (
        "N=127 call 5: rank 2 read rank 3's segment (a peer), block 9 lane 70; "
        "expected 4, seen 0: 4 rank input step(s), 1 of the sum's"
    )
    assert parse(ControlRecord, dataclasses.asdict(caught)) == caught
    clean = harness.control_result(faulty_record(None), 2880, 4, 2)
    assert (clean.caught, clean.mismatched_calls, clean.fingerprint) == (False, 0, None)
    # N = 128: pack 2 * 11520 + 128 * 81 + 5 is rank 2's, block 81 mod 80 = 1, lane 5
    first = Mismatch(
        0, 3, "back_to_back", 4, 8 * (2 * 11520 + 128 * 81 + 5) + 3, -106.0, -94.0, None, False
    )
    assert harness.control_fingerprint(first, 128, 2880, 4, 2) == (
        "N=128 call 3: rank 0 read rank 2's segment (a peer), block 1 lane 5; "
        "expected -106, seen -94: -12 rank input step(s), -3 of the sum's"
    )
    other = dataclasses.replace(first, index=None, expected=None, seen=None, returned="f32 [1]")
    assert harness.control_fingerprint(other, 128, 2880, 4, 2) == "N=128 call 3: returned f32 [1]"


def test_the_harness_imports_no_torch() -> None:
    code = "import sys, miles_amd.canary.harness as h, miles_amd.canary.worker as w; "
    code += "print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(
    not _cuda(),
    reason="the control's CUDA path runs on a GPU machine only (docs/node.md, 'What a GPU run "
    "showed'); CPU CI keeps the gloo harness",
)
def test_both_builds_on_cuda_broken_caught_correct_clean() -> None:
    import torch

    share = torch.cuda.device_count() < 4
    plan = control_plan(build_plan(recipe_shape(Recipe()), "aiter", 1e-6), calls=50)
    plan = dataclasses.replace(plan, entries=plan.entries[:3])
    for build in ("control-broken", "control"):
        setup = Setup(4, "cuda", build, collective="gloo" if share else None)
        result = harness.control_result(run(plan, setup, timeout_s=600), 2880, 4, 2)
        assert result.caught == (build == "control-broken"), result
