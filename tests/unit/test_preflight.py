"""miles_amd.run.preflight and ``miles-amd preflight`` on real files, tools and subprocesses.

Hardware-only facts are exercised through what the probes really read: executables named
``amd-smi``/``rocm-smi`` put first on ``PATH``, package directories and ``.dist-info``
metadata put on ``PYTHONPATH`` of a fresh interpreter, and real git checkouts in tmp dirs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from datetime import datetime
from importlib.util import find_spec
from pathlib import Path

import pytest

import miles_amd
from miles_amd.run import preflight
from miles_amd.run.preflight import (
    PROBES,
    Fact,
    PreflightConfig,
    preflight_ok,
    run_preflight,
    shown,
    table,
    verdict_line,
    write_env_json,
)
from miles_amd.run.probes import (
    aiter_fact,
    git_commit,
    judge_gpus,
    parse_amd_smi_static,
    parse_rocm_smi_product,
    probe_aiter_variant,
    probe_checkpoint,
    probe_dataset,
    probe_disk,
    probe_gpus,
    probe_megatron_lm,
    probe_miles,
    probe_rocm,
    sglang_lora_endpoint_fact,
)
from tests.cli_runs import CliRun, flat, run_cli
from tests.unit.test_inputs import DAPO_RECORD, write_checkpoint

SRC = Path(miles_amd.__file__).resolve().parents[1]
NO_TORCH = find_spec("torch") is None
needs_no_torch = pytest.mark.skipif(not NO_TORCH, reason="a real torch answers the GPU probe first")

LORA_ROUTE_SOURCE = """
@app.api_route("/register_lora_adapter", methods=["POST"])
async def register_lora_adapter(obj: RegisterLoRAAdapterReqInput, request: Request):
    return await _global_state.tokenizer_manager.register_lora_adapter(obj, request)
"""
OTHER_ROUTES_SOURCE = """
@app.api_route("/load_lora_adapter", methods=["POST"])
async def load_lora_adapter(obj: LoadLoRAAdapterReqInput, request: Request):
    return await _global_state.tokenizer_manager.load_lora_adapter(obj, request)
"""


# ---- helpers ---------------------------------------------------------------------------------


def config_for(tmp_path: Path, **overrides: object) -> PreflightConfig:
    values: dict[str, object] = {
        "model_dir": tmp_path / "models",
        "data_dir": tmp_path / "datasets",
        "miles_dir": tmp_path / "miles",
        "megatron_dir": tmp_path / "Megatron-LM",
        "run_dir": tmp_path / "runs" / "preflight",
        "rocm_root": tmp_path / "rocm",
    }
    values.update(overrides)
    return PreflightConfig(**values)  # type: ignore[arg-type]


def make_tool(bin_dir: Path, name: str, body: str) -> Path:
    """An executable ``name`` in ``bin_dir`` running ``body`` with this interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!{sys.executable}\nimport json, sys\nargs = sys.argv[1:]\n{body}")
    tool.chmod(0o755)
    return tool


def fake_amd_smi(bin_dir: Path, *, count: int, arch: str, rocm: str = "7.2.0") -> None:
    make_tool(
        bin_dir,
        "amd-smi",
        f"""
if args[:1] == ["version"]:
    print("AMDSMI Tool: 26.2.0 | AMDSMI Library version: 26.2.0 | ROCm version: {rocm} | "
          "amdgpu version: 6.16.6")
elif args[:2] == ["static", "--asic"]:
    gpus = [{{"gpu": i, "asic": {{"market_name": "AMD Instinct MI355X",
             "target_graphics_version": "{arch}"}}}} for i in range({count})]
    print(json.dumps({{"gpu_data": gpus}}))
else:
    sys.exit(2)
""",
    )


def git_checkout(root: Path) -> str:
    """Make ``root`` a git checkout with one commit; return the commit."""
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init")
    return git("rev-parse", "HEAD")


def write_dist_info(site: Path, name: str, version: str, top_level: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{top_level}\n")
    (info / "RECORD").write_text(f"{top_level}/__init__.py,,\n{info.name}/METADATA,,\n")


def probes_in_subprocess(pythonpath: Path, tmp_path: Path, *probes: str) -> dict[str, dict]:
    """Run ``probes`` in one fresh interpreter whose sys.path starts with ``pythonpath``, then
    the tree under test (never another checkout's install); each probe's fact by name."""
    code = (
        "import json, sys\n"
        "from dataclasses import asdict\n"
        "from pathlib import Path\n"
        "from miles_amd.run import probes\n"
        "here = Path(sys.argv[1])\n"
        "config = probes.PreflightConfig(here, here, here, here, here)\n"
        "print(json.dumps({p: asdict(getattr(probes, p)(config)) for p in sys.argv[2:]}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(pythonpath), str(SRC)))}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), *probes],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


def fake_sglang(site: Path, http_server_source: str | None) -> Path:
    package = site / "sglang"
    (package / "srt" / "entrypoints").mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.5.4"\n')
    if http_server_source is not None:
        (package / "srt" / "entrypoints" / "http_server.py").write_text(http_server_source)
    return package


# ---- running the probes ----------------------------------------------------------------------


def test_facts_in_probe_order_and_a_crashing_probe_is_a_wrong_fact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [p.__name__.removeprefix("probe_") for p in PROBES]  # every probe's run: the CLI's
    after = names.index("dataset") + 1  # miles' parse, then what its model build shows
    assert names[after : after + 4] == [
        "miles_argv",
        "lora_experts",
        "router_dtype",
        "attention_window",
    ]

    def probe_broken(config: PreflightConfig) -> Fact:
        raise OSError("device busy")

    monkeypatch.setattr(preflight, "PROBES", (probe_broken, probe_aiter_variant))
    facts = run_preflight(config_for(tmp_path, aiter_variant="stock"))
    assert facts[0] == Fact("broken", "wrong", "", "the probe raised OSError: device busy")
    assert facts[1].status == "ok"
    assert not preflight_ok(facts)


# ---- GPUs and ROCm -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("archs", "source", "status", "value", "says"),
    [
        (["gfx950"] * 8, "torch", "ok", "8x gfx950 (torch)", ""),
        (["gfx950"] * 4, "amd-smi", "wrong", "4x gfx950 (amd-smi)", "needs 8 GPUs, 4 visible"),
        (["gfx942"] * 8, "amd-smi", "wrong", "8x gfx942 (amd-smi)", "validated on gfx950"),
        ([], "rocm-smi", "missing", "0 (rocm-smi)", "lists no GPU"),
    ],
)
def test_judge_gpus(archs: list[str], source: str, status: str, value: str, says: str) -> None:
    fact = judge_gpus(archs, source, 8, "gfx950")
    assert (fact.status, fact.value) == (status, value)
    assert says in fact.message


def test_gpu_tool_outputs_are_read_by_shape() -> None:
    record = {"gpu": 0, "asic": {"target_graphics_version": "gfx950:sramecc+:xnack-"}}
    assert parse_amd_smi_static(json.dumps([record, record])) == ["gfx950", "gfx950"]
    assert parse_amd_smi_static(json.dumps({"gpu_data": [record]})) == ["gfx950"]
    assert parse_amd_smi_static(json.dumps({"gpu_data": []})) == []
    assert parse_amd_smi_static("AMDSMI error: no GPU") is None
    cards = {f"card{i}": {"Card Series": "MI355X", "GFX Version": "gfx950"} for i in range(2)}
    text = json.dumps({**cards, "system": {"Driver version": "6.16.6"}})
    assert parse_rocm_smi_product(text) == ["gfx950", "gfx950"]
    assert parse_rocm_smi_product("[]") is None


@needs_no_torch
def test_gpus_and_rocm_from_real_tools_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", str(bin_dir))
    bin_dir.mkdir()
    assert probe_gpus(config_for(tmp_path)).status == "missing"  # no tool on PATH
    assert probe_rocm(config_for(tmp_path)).status == "missing"
    fake_amd_smi(bin_dir, count=8, arch="gfx950:sramecc+:xnack-", rocm="7.2.1")
    assert probe_gpus(config_for(tmp_path)) == Fact("gpus", "ok", "8x gfx950 (amd-smi)")
    assert probe_gpus(config_for(tmp_path, expected_arch="gfx942")).status == "wrong"
    assert probe_rocm(config_for(tmp_path)) == Fact("rocm", "ok", "7.2.1 (amd-smi version)")
    info = tmp_path / "rocm" / ".info"  # the version file comes first
    info.mkdir(parents=True)
    (info / "version").write_text("7.2.0-43\n")
    assert probe_rocm(config_for(tmp_path)) == Fact("rocm", "ok", f"7.2.0-43 ({info / 'version'})")
    (info / "version").write_text("6.4.1-120\n")
    old = probe_rocm(config_for(tmp_path))
    assert old.status == "wrong" and "ROCm 7.2" in old.message
    make_tool(bin_dir, "amd-smi", "sys.exit(1)\n")  # amd-smi fails: rocm-smi answers
    cards = {f"card{i}": {"GFX Version": "gfx950"} for i in range(6)}
    make_tool(bin_dir, "rocm-smi", f"print(json.dumps({cards!r}))\n")
    fact = probe_gpus(config_for(tmp_path))
    assert (fact.status, fact.value) == ("wrong", "6x gfx950 (rocm-smi)")


# ---- SGLang, aiter and the checkouts -------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "status", "says"),
    [
        (OTHER_ROUTES_SOURCE + LORA_ROUTE_SOURCE, "ok", "http_server.py"),
        (OTHER_ROUTES_SOURCE, "wrong", "fails at the first LoRA weight update with HTTP 404"),
        (None, "wrong", "cannot confirm"),
    ],
)
def test_sglang_lora_endpoint(tmp_path: Path, source: str | None, status: str, says: str) -> None:
    fact = sglang_lora_endpoint_fact(fake_sglang(tmp_path, source))
    assert fact.status == status and says in fact.value + fact.message
    assert sglang_lora_endpoint_fact(None).status == "missing"


def test_packages_in_a_checkout_are_found_with_version_and_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    site = repo / "python"
    fake_sglang(site, LORA_ROUTE_SOURCE)
    write_dist_info(site, "sglang", "0.5.4", "sglang")
    (site / "aiter" / "jit").mkdir(parents=True)
    (site / "aiter" / "__init__.py").write_text("")
    write_dist_info(site, "amd-aiter", "0.1.5", "aiter")
    commit = git_checkout(repo)
    facts = probes_in_subprocess(
        site, tmp_path, "probe_sglang", "probe_sglang_lora_endpoint", "probe_aiter"
    )
    assert facts["probe_sglang"] == asdict(Fact("sglang", "ok", f"sglang 0.5.4 @ {commit[:12]}"))
    endpoint = facts["probe_sglang_lora_endpoint"]
    assert endpoint["status"] == "ok"
    assert str(site / "sglang" / "srt" / "entrypoints" / "http_server.py") in endpoint["value"]
    assert facts["probe_aiter"] == asdict(Fact("aiter", "ok", f"amd-aiter 0.1.5 @ {commit[:12]}"))
    venv = repo / "venv" / "lib" / "python3.11" / "site-packages"
    venv.mkdir(parents=True)
    assert git_commit(venv) is None  # an installed package's dir: no commit of the checkout


def test_aiter_fact_and_variant_rules(tmp_path: Path) -> None:
    assert aiter_fact(None, []).status == "missing"
    pypi = aiter_fact(tmp_path, ["aiter"])
    assert pypi.status == "wrong" and "pip uninstall aiter" in pypi.message
    assert aiter_fact(tmp_path, ["amd-aiter", "aiter"]).status == "wrong"  # clobbered by PyPI
    assert aiter_fact(tmp_path, []).status == "wrong"  # no metadata, not AMD's layout
    (tmp_path / "jit").mkdir()
    assert aiter_fact(tmp_path, []).status == "ok"  # AMD source install without metadata
    assert probe_aiter_variant(config_for(tmp_path, aiter_variant="patched")).value == "patched"
    assert probe_aiter_variant(config_for(tmp_path)).value == "unrecorded"
    assert probe_aiter_variant(config_for(tmp_path, aiter_variant="nightly")).status == "wrong"


def test_megatron_lm_and_miles_checkouts(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    assert probe_megatron_lm(config).status == probe_miles(config).status == "missing"
    megatron, miles = tmp_path / "Megatron-LM", tmp_path / "miles"
    megatron.mkdir()
    miles.mkdir()
    assert probe_megatron_lm(config).status == "wrong"
    wrong = probe_miles(config)
    assert wrong.status == "wrong" and "no train.py" in wrong.message
    core = megatron / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "package_info.py").write_text("MAJOR = 0\nMINOR = 15\nPATCH = 0\nPRE_RELEASE = 'rc2'\n")
    commit = git_checkout(megatron)
    fact = probe_megatron_lm(config)
    assert fact == Fact("megatron_lm", "ok", f"megatron.core 0.15.0rc2 @ {commit[:12]}")
    (miles / "train.py").write_text("print('train')\n")
    assert probe_miles(config) == Fact("miles", "ok", str(miles))  # not a git checkout
    commit = git_checkout(miles)
    assert probe_miles(config) == Fact("miles", "ok", f"{miles} @ {commit[:12]}")


# ---- inputs and disk -------------------------------------------------------------------------


def test_checkpoint_dataset_and_disk_probes(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    missing = probe_checkpoint(config)
    assert missing.status == "missing" and "hf download" in missing.message
    ckpt = write_checkpoint(config.model_dir)
    assert probe_checkpoint(config) == Fact("checkpoint", "ok", str(ckpt))
    (ckpt / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "mxfp4"}})
    )
    wrong = probe_checkpoint(config)
    assert wrong.status == "wrong" and "MXFP4" in wrong.message

    assert probe_dataset(config).status == "missing"
    config.dataset_file.parent.mkdir(parents=True)
    config.dataset_file.write_text(json.dumps({"prompt": "x"}) + "\n")
    assert probe_dataset(config).status == "wrong"
    config.dataset_file.write_text(json.dumps(DAPO_RECORD) + "\n")
    assert probe_dataset(config) == Fact("dataset", "ok", str(config.dataset_file))

    deep = tmp_path / "not" / "yet" / "there" / "run"
    ok = probe_disk(config_for(tmp_path, run_dir=deep, min_free_gib=0.001))
    assert ok.status == "ok" and ok.value.endswith(f"GiB free at {tmp_path}")
    short = probe_disk(config_for(tmp_path, run_dir=deep, min_free_gib=1e9))
    assert short.status == "wrong" and "needs 1e+09 GiB" in short.message


# ---- recording and the view ------------------------------------------------------------------

OK_FACTS = [Fact("gpus", "ok", "8x gfx950 (torch)"), Fact("aiter_variant", "ok", "patched")]


def test_write_env_json(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "x"
    facts = [*OK_FACTS, Fact("torch", "missing", "", "install it")]
    path = write_env_json(facts, run_dir, {"config": {"model_dir": "/m"}})
    assert path == run_dir / "env.json"
    data = json.loads(path.read_text())
    assert data["facts"] == [asdict(f) for f in facts]
    assert (data["ok"], data["aiter_variant"]) == (False, "patched")
    assert data["config"] == {"model_dir": "/m"}
    assert datetime.fromisoformat(data["written_at"]).tzinfo is not None
    assert sorted(p.name for p in run_dir.iterdir()) == ["env.json"]  # no temp file left
    assert path.stat().st_mode & 0o777 == 0o644  # readable by every reader
    unrecorded = [Fact("aiter_variant", "ok", "unrecorded", "pass --aiter-variant")]
    data = json.loads(write_env_json(unrecorded, tmp_path / "u", {}).read_text())
    assert (data["aiter_variant"], data["ok"]) == (None, True)
    assert preflight_ok(OK_FACTS) and not preflight_ok([])
    with pytest.raises(ValueError, match="ok"):
        write_env_json(OK_FACTS, tmp_path / "run", {"ok": True})
    assert not (tmp_path / "run").exists()


def test_the_view_of_unknown_values_needs_and_a_pass() -> None:
    facts = [
        Fact("gpus", "ok", "8x gfx950 (torch)"),
        Fact("aiter", "missing", "", "install amd-aiter"),
        Fact("aiter_variant", "ok", "rccl"),
        Fact("aiter_commit", "ok", "unknown: no module aiter"),
        Fact("sglang", "ok", "0.5.16"),
        Fact("sglang_allreduce", "ok", "sglang: own custom all-reduce"),
        Fact("lora_experts", "ok", "unknown: setup: no miles checkout"),
    ]
    rows = {r.fact.name: r for r in shown(facts)}
    assert rows["aiter_commit"].status == "not checked" and rows["aiter_commit"].needs == ("aiter",)
    assert rows["sglang_allreduce"].status == "ok"  # rccl's route does not need aiter
    assert rows["lora_experts"].status == "unknown"  # an unknown value is never ok
    assert verdict_line(list(rows.values())) == "preflight: FAIL - aiter missing; 2 not checked"
    assert "unknown      unknown: setup" in table(list(rows.values()))
    passing = [Fact("gpus", "ok", "8x gfx950"), Fact("disk", "ok", "90 GiB free")]
    assert verdict_line(shown(passing)) == "preflight: PASS - all 2 facts ok"
    text = table(shown([*OK_FACTS, Fact("torch", "missing", "", "install it")]), verbose=True)
    lines = text.splitlines()
    assert lines[0].split() == ["fact", "status", "value", "message"]
    assert lines[3].split() == ["torch", "missing", "-", "install", "it"]
    assert lines[1].index("ok") == lines[3].index("missing")  # columns line up


# ---- the command -----------------------------------------------------------------------------


def preflight_cli(*args: str, cwd: Path) -> CliRun:
    return run_cli("preflight", *args, cwd=cwd)


NODE_HERE = bool(shutil.which("amd-smi") or shutil.which("rocm-smi")) or Path("/dev/kfd").exists()


@pytest.mark.skipif(NODE_HERE, reason="asserts the answer of a machine that is not a node")
def test_a_machine_that_is_not_a_node_says_so_first_and_records_every_fact(
    tmp_path: Path,
) -> None:
    write_checkpoint(tmp_path / "models")
    dataset = tmp_path / "datasets" / "dapo-math-17k" / "dapo-math-17k.jsonl"
    dataset.parent.mkdir(parents=True)
    dataset.write_text(json.dumps(DAPO_RECORD) + "\n")
    run_dir = tmp_path / "run"
    done = preflight_cli(
        "--model-dir", str(tmp_path / "models"),
        "--data-dir", str(tmp_path / "datasets"),
        "--miles-dir", str(tmp_path / "miles"),
        "--megatron-dir", str(tmp_path / "Megatron-LM"),
        "--run-dir", str(run_dir),
        "--aiter-variant", "patched",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("preflight: FAIL - this is not an AMD GPU node"), lines[0]
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    rows: dict[str, str] = {}  # a row and its wrapped continuations, as one line
    fact = ""
    for line in lines[2:]:
        if line.startswith("env.json written to"):
            break
        if line.startswith(" "):
            rows[fact] += " " + line.strip()
        else:
            fact = line.split()[0]
            rows[fact] = line
    assert rows["gpus"].split()[:2] == ["gpus", "missing"]
    for name, needs in (  # facts whose probe needs a failed one are not judged on their own
        ("attention_window", "needs miles, megatron_bridge"),  # the checkpoint is ok
        ("aiter_commit", "needs aiter"),
        ("miles_argv", "needs miles"),
    ):
        assert f"not checked  {needs}" in rows[name], rows[name]
    assert "--aiter-variant patched" not in rows["sglang_allreduce"]  # aiter does not import
    for row in rows.values():
        _, status, value = re.split(r"\s{2,}", row, maxsplit=2)
        assert not (status == "ok" and value.startswith("unknown")), row
    assert flat(done.stdout).endswith(
        f"env.json written to {run_dir / 'env.json'} (the run dir's record of this preflight)"
    )
    assert done.stderr.startswith("miles-amd: preflight failed: gpus (missing), rocm (missing)")
    assert "checkpoint" not in done.stderr and "dataset" not in done.stderr
    data = json.loads((run_dir / "env.json").read_text())
    assert (data["ok"], data["aiter_variant"]) == (False, "patched")
    assert data["config"]["model_dir"] == str(tmp_path / "models")
    assert data["config"]["expected_gpus"] == 8
    recorded = {f["name"]: f for f in data["facts"]}  # every fact as probed, in PROBES order
    assert list(recorded) == [p.__name__.removeprefix("probe_") for p in PROBES]
    assert all(f["message"] for f in recorded.values() if f["status"] != "ok")
    assert (
        recorded["gpus"]["status"] == "missing"
        and "no AMD GPU visible" in recorded["gpus"]["message"]
    )
    assert recorded["checkpoint"]["status"] == recorded["dataset"]["status"] == "ok"

    verbose = preflight_cli("--run-dir", str(run_dir), "--verbose", cwd=tmp_path)
    gpus_row = next(line for line in verbose.stdout.splitlines() if line.startswith("gpus "))
    assert gpus_row.endswith(recorded["gpus"]["message"])  # the message in full

    as_json = preflight_cli("--run-dir", str(run_dir), "--format", "json", cwd=tmp_path)
    document = json.loads(as_json.stdout)
    assert document["verdict"].startswith("preflight: FAIL - this is not an AMD GPU node")
    assert document["env_json"] == str(run_dir / "env.json")
    assert {f["name"]: f for f in document["facts"]}["attention_window"]["shown"] == "not checked"
    assert "env.json written to" in as_json.stderr


def test_command_default_run_dir_is_trains_and_the_old_gpus_spelling(tmp_path: Path) -> None:
    """With no --run-dir, env.json lands in the dir `train` writes its evidence to."""
    done = preflight_cli("--num-gpus", "4", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    train = run_cli("train", "--dry-run", "--json", cwd=tmp_path)
    assert train.returncode == 0, train.stderr
    run_dir = Path(json.loads(train.stdout)["run_dir"])
    assert run_dir.is_absolute() and run_dir.is_relative_to(tmp_path)
    data = json.loads((run_dir / "env.json").read_text())
    assert (data["config"]["expected_gpus"], data["config"]["run_dir"]) == (4, str(run_dir))
    assert data["aiter_variant"] is None
    done = preflight_cli("--gpus", "2", "--run-dir", "rel", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    data = json.loads((tmp_path / "rel" / "env.json").read_text())
    assert (data["config"]["expected_gpus"], data["config"]["model_dir"]) == (2, "/root/models")


@pytest.mark.parametrize(
    "bad",
    [["--aiter-variant", "nightly"], ["--num-gpus", "0"], ["--gpus", "0"], ["--num-gpus", "x"]],
)
def test_command_rejects_bad_options_without_writing(tmp_path: Path, bad: list[str]) -> None:
    done = preflight_cli(*bad, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"miles-amd: error: Invalid value for '{bad[0]}'")
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()
