"""``miles-amd canary`` in this process: the plan form, and bad input as one line, exit 2,
nothing written. No rank starts here (``test_canary_harness.py`` runs them); the node path
without a GPU: ``test_train_canary.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli_runs import one_error_line, run_cli
from tests.support.fake_aiter import fake_aiter, header_text

GLOO = """import torch.distributed as dist


def gloo(tensor, group):
    dist.all_reduce(tensor, group=group)
    return tensor
"""


def test_plan_json_lists_the_entries_labelled_with_the_variants_implementation() -> None:
    done = run_cli("canary", "--plan", "--json")
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)["entries"]
    kept = {"tokens", "bytes", "kernel", "uniform_trip_count", "calls", "implementation"}
    assert kept | {"wave_class", "exposed", "arms"} <= set(entries[0])
    assert [e["tokens"] for e in entries][:8] == [1, 2, 4, 8, 12, 16, 24, 32]
    assert {e["implementation"] for e in entries} == {"aiter"}
    by_tokens = {e["tokens"]: e for e in entries}
    assert by_tokens[24]["kernel"] == "1stage" and by_tokens[32]["kernel"] == "2stage"
    assert not by_tokens[32]["uniform_trip_count"] and by_tokens[64]["uniform_trip_count"]
    assert (by_tokens[32]["wave_class"], by_tokens[127]["wave_class"]) == (
        "early-no-read",
        "exposed",
    )
    assert by_tokens[127]["calls"] == sum(by_tokens[127]["arms"].values())
    control = json.loads(run_cli("canary", "--plan", "--json", "--variant", "rccl").stdout)[
        "entries"
    ]
    assert {e["implementation"] for e in control} == {"sglang"}


def test_plan_text_states_the_power_and_the_time() -> None:
    done = run_cli("canary", "--plan")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # wrapped at 100 columns
    assert "caught with probability 0.9900 (>= 0.99) by 351960 exposed calls" in text
    assert "estimated time: 63 s" in text and "sgl-project/sglang#6619" in text
    assert "harness: whole blocks measured with the current worker on one H200" in text
    assert max(len(line) for line in done.stdout.splitlines()) <= 100


@pytest.fixture
def reducer(tmp_path: Path) -> str:
    path = tmp_path / "reducers.py"
    path.write_text(GLOO, encoding="utf-8")
    return f"{path}:gloo"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reducer", "{dir}/absent.py:gloo"], "cannot read"),
        (["--reducer", "{reducer}x"], "defines no top-level function gloox"),
        (["--reducer", "just-a-file.py"], "expected FILE:FUNCTION"),
        (["--reducer", "{reducer}", "--world-size", "3"], "--world-size 3: the plan runs TP-4"),
        (["--reducer", "{reducer}", "--world-size", "12"], "--world-size 12"),
        (
            ["--reducer", "{reducer}", "--detect-rate", "0"],
            "--detect-rate 0: must be in [1e-12, 1)",
        ),
        (["--reducer", "{reducer}", "--detect-rate", "1.5"], "must be in [1e-12, 1)"),
        (["--reducer", "{reducer}", "--detect-rate", "1e-310"], "--detect-rate 1e-310: must be"),
        (["--reducer", "{reducer}", "--detect-rate", "nan"], "--detect-rate nan: must be"),
        (["--reducer", "{dir}/fifo:gloo"], "is not a regular file"),
        (["--reducer", "/dev/zero:gloo"], "/dev/zero is not a regular file"),
        (["--reducer", "{reducer}", "--run-dir", "{dir}/a-file"], "is a file"),
        (["--reducer", "{reducer}", "--run-dir", "{dir}/a-file/run"], "is not writable"),
        (["--reducer", "{reducer}", "--tokens", "1,2,29,115"], "suspect class"),
        (["--reducer", "{reducer}", "--tokens", "29,x"], "comma-separated"),
        (["--reducer", "{reducer}", "--implementation", "rccl"], "exclude each other"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, reducer: str, args: list[str], message: str
) -> None:
    (tmp_path / "a-file").write_text("not a dir", encoding="utf-8")
    os.mkfifo(tmp_path / "fifo")  # nothing writes it: reading it would hang
    before = sorted(p.name for p in tmp_path.rglob("*"))
    done = run_cli(
        "canary",
        *[a.format(dir=tmp_path, reducer=reducer) for a in args],
        "--run-dir" if "--run-dir" not in args else "--json",
        *([str(tmp_path / "run")] if "--run-dir" not in args else []),
    )
    one_error_line(done, message)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_aiters_size_variable_at_zero_says_every_size_goes_to_rccl() -> None:
    done = run_cli("canary", "--plan", env={"AITER_CUSTOM_AR_MAX_SIZE": "0"})
    one_error_line(
        done,
        "AITER_CUSTOM_AR_MAX_SIZE=0 switches aiter's custom all-reduce off",
        "aiter sends every size to RCCL",
        "unset AITER_CUSTOM_AR_MAX_SIZE",
    )


def test_plan_names_its_dispatch_source_read_through_the_rule(tmp_path: Path) -> None:
    """The patched build on AITER_PATCHED_DIR (a checkout) is where the plan's constants come
    from, named with its fingerprint; stock ignores it and plans with the pinned commit, saying
    why; neither falls back silently."""
    entry, cuh = fake_aiter(tmp_path, fixed=True, layout="checkout")
    env = {"AITER_PATCHED_DIR": str(entry)}
    done = run_cli("canary", "--plan", "--json", "--variant", "patched", env=env)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["dispatch_source"].startswith(f"installed {cuh}, ")
    assert document["aiter_fix"].startswith(f"fixed: {cuh} sha256:")
    assert f"(aiter_fix {document['aiter_fix']})" in document["dispatch_source"]
    assert any(e["affected"] for e in document["entries"])  # the sizes the fix takes its tail at
    stock = json.loads(run_cli("canary", "--plan", "--json", "--variant", "stock", env=env).stdout)
    assert stock["dispatch_source"].endswith("(pinned: no aiter on the python path)")
    assert stock["aiter_fix"] == "unknown: no module aiter on this Python's path"
    text = " ".join(run_cli("canary", "--plan", "--variant", "patched", env=env).stdout.split())
    assert "dispatch_source: installed " in text and "aiter_fix: fixed: " in text  # unwrapped


def test_a_header_with_a_nonsense_constant_is_named_not_a_crash(tmp_path: Path) -> None:
    bad = header_text(fixed=False).replace("#define THREAD_NUM 512", "#define THREAD_NUM 0")
    entry, cuh = fake_aiter(tmp_path, fixed=False, layout="wheel", header=bad)
    done = run_cli("canary", "--plan", "--json", env={"PYTHONPATH": str(entry)})
    assert done.returncode == 0, done.stderr
    source = json.loads(done.stdout)["dispatch_source"]
    assert f"(pinned: {cuh} refused: #define THREAD_NUM is 0, outside 8..1024" in source
