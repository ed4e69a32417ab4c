"""ROCm/aiter#5694's fix read from source (``miles_amd.aiter_fix``): both commits' deciding
lines, a fake aiter in both install layouts found (never imported), the preflight's fact, and
the gate's ``allreduce.fix`` check over the three processes' records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from miles_amd import aiter_fix, variants
from miles_amd.canary.harness import Setup, merge, write_canary
from miles_amd.canary.plan import CPU, build_plan, recipe_shape
from miles_amd.evidence.load import load_run
from miles_amd.judge.allreduce import fix_check
from miles_amd.recipe.settings import Recipe
from miles_amd.run.preflight import Fact, write_env_json
from miles_amd.run.probes_allreduce import read_aiter_fix
from tests.cli_runs import run_cli
from tests.support.fake_aiter import fake_aiter, header_text
from tests.unit.test_canary_record import rank_result

LAYOUTS = ("checkout", "wheel")


def test_the_deciding_lines_of_both_commits() -> None:
    assert aiter_fix.classify(header_text(fixed=False))[0] == aiter_fix.NOT_FIXED
    assert aiter_fix.classify(header_text(fixed=True))[0] == aiter_fix.FIXED
    # the fixed kernel without its has_tail instantiation in the dispatch is neither
    partial = header_text(fixed=True).replace("KL(ngpus, name, true);", "KL(ngpus, name);")
    verdict, why = aiter_fix.classify(partial)
    assert verdict == aiter_fix.UNKNOWN and "lacks the has_tail dispatch" in why
    none = aiter_fix.classify("#define THREAD_NUM 512\n")
    assert none == (aiter_fix.UNKNOWN, "no cross_device_reduce_2stage kernel in the header")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fixed", [True, False])
def test_each_layout_is_found_without_importing_aiter(tmp_path: Path, layout, fixed) -> None:
    entry, header = fake_aiter(tmp_path, fixed=fixed, layout=layout)
    reading = read_aiter_fix(str(entry), sys.executable)
    want = aiter_fix.FIXED if fixed else aiter_fix.NOT_FIXED
    assert str(reading["value"]).startswith(f"{want}: {header} sha256:"), reading
    assert reading["package_dir"] == str(entry / "aiter")
    value = str(reading["value"])
    assert aiter_fix.source_of(value) == value.split(" (")[0][len(want) + 2 :]


def test_no_header_or_aiter_meta_dirs_header(tmp_path: Path, monkeypatch) -> None:
    """No header is unknown with why (no aiter: test_canary_cli's stock plan); ``AITER_META_DIR``
    overrides where aiter's JIT finds ``csrc`` (aiter/jit/core.py): the header there is read."""
    entry, header = fake_aiter(tmp_path / "wheel", fixed=False, layout="wheel")
    header.unlink()
    value = str(read_aiter_fix(str(entry), sys.executable)["value"])
    assert value.startswith("unknown: no csrc/include/custom_all_reduce.cuh in aiter_meta/")
    entry, _ = fake_aiter(tmp_path / "stock", fixed=False, layout="wheel")
    _, meta_header = fake_aiter(tmp_path / "meta", fixed=True, layout="checkout")
    monkeypatch.setenv("AITER_META_DIR", str(tmp_path / "meta"))
    value = str(read_aiter_fix(str(entry), sys.executable)["value"])
    assert value.startswith(f"fixed: {meta_header} sha256:"), value


def preflight(tmp_path: Path, variant: str, env: dict[str, str]) -> dict[str, str]:
    run_dir = tmp_path / f"run-{variant}"
    run_cli(
        "preflight", "--run-dir", str(run_dir), "--aiter-variant", variant,
        "--miles-dir", str(tmp_path / "miles"), "--megatron-dir", str(tmp_path / "mlm"),
        env=env, cwd=tmp_path,
    )  # fmt: skip
    facts = json.loads((run_dir / "env.json").read_text())["facts"]
    return next(f for f in facts if f["name"] == "aiter_fix")


def test_preflight_records_the_fix_of_the_aiter_the_rule_chooses(tmp_path: Path) -> None:
    """AITER_PATCHED_DIR is patched's only (the rule itself: the dry-run snapshots)."""
    fixed_dir, fixed_header = fake_aiter(tmp_path / "fixed", fixed=True, layout="checkout")
    stock_dir, _ = fake_aiter(tmp_path / "stock", fixed=False, layout="wheel")
    env = {variants.PATCHED_DIR_VAR: str(fixed_dir), "PYTHONPATH": str(stock_dir)}
    patched = preflight(tmp_path, "patched", env)
    assert patched["status"] == "ok" and patched["value"].startswith(f"fixed: {fixed_header}")
    labelled = preflight(tmp_path, "patched", {"PYTHONPATH": str(stock_dir)})
    assert labelled["status"] == "wrong" and labelled["value"].startswith("not fixed: ")
    assert "does not hold ROCm/aiter#5694's fix" in labelled["message"]


def evidence_of(
    run: Path, *, variant: str, preflight: str | None, canary: str | None, job: list[str]
):
    """A run dir with env.json, canary.json and job.log holding these fingerprints."""
    run.mkdir(parents=True, exist_ok=True)
    facts = [Fact("aiter_variant", "ok", variant)]
    if preflight is not None:
        facts.append(Fact("aiter_fix", "ok", preflight))
    write_env_json(facts, run, {})
    if canary is not None:
        plan = build_plan(recipe_shape(Recipe()), "aiter", 0.5, target=CPU, tokens=(28, 127))
        setup = Setup(4, "cpu", "aiter", variant=variant, repeats=2, aiter_fix=canary)
        ranks = [rank_result(r, [0, 0], None) for r in range(4)]
        write_canary(run, merge(plan, setup, ranks, 1.0, 2.0))
    lines = [aiter_fix.MARKER + json.dumps({"value": value}) for value in job]
    (run / "job.log").write_text("\n".join(["starting", *lines, "step 0: {'x': 1.0}"]) + "\n")
    return load_run(run)


FIXED = "fixed: /opt/x/csrc/include/custom_all_reduce.cuh sha256:0123456789ab (whole tiles)"
OTHER = "fixed: /opt/y/csrc/include/custom_all_reduce.cuh sha256:ba9876543210 (whole tiles)"
STOCK = "not fixed: /usr/lib/aiter_meta/csrc/include/custom_all_reduce.cuh sha256:aaaaaaaaaaaa (x)"


@pytest.mark.parametrize(
    ("variant", "records", "status", "named"),
    [
        ("patched", (FIXED, FIXED, FIXED), "pass", "preflight, canary, job read /opt/x/csrc"),
        ("patched", (FIXED, FIXED, STOCK), "fail", "job: patched run on not fixed: /usr/lib"),
        ("stock", (FIXED, FIXED, FIXED), "fail", "preflight: stock run on fixed: /opt/x"),
        ("patched", (FIXED, OTHER, FIXED), "fail", "different aiter sources: preflight /opt/x"),
    ],
)
def test_the_gate_passes_only_a_variant_its_three_processes_source_agrees_with(
    tmp_path, variant, records, status, named
) -> None:
    pre, can, job = records
    evidence = evidence_of(tmp_path, variant=variant, preflight=pre, canary=can, job=[job])
    check = fix_check(evidence, variant, require_env=status == "pass")
    assert check.status == status and named in check.detail, check.detail


def test_unknown_missing_or_repeated_is_no_evidence_on_the_hardware_path(tmp_path: Path) -> None:
    unknown = "unknown: no module aiter on this Python's path"
    evidence = evidence_of(
        tmp_path / "a", variant="patched", preflight=unknown, canary=None, job=[]
    )
    off_node = fix_check(evidence, "patched", require_env=False)
    assert off_node.status == "not_measured"
    on_node = fix_check(evidence, "patched", require_env=True)
    assert on_node.status == "fail" and "unknown is no evidence for patched" in on_node.detail
    assert "not recorded by canary, job" in on_node.detail
    twice = evidence_of(
        tmp_path / "b", variant="patched", preflight=None, canary=None, job=[FIXED, FIXED]
    )
    repeated = fix_check(twice, "patched", require_env=False)
    assert repeated.status == "fail" and "2 MILES_AMD_AITER_FIX lines" in repeated.detail
