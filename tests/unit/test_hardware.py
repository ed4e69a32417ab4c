"""``--hardware auto``: product names from the ROCm tools' output, clear errors otherwise."""

from __future__ import annotations

import pytest

from miles_amd.recipe.hardware import HardwareDetectionError, detect_hardware, run_tool
from miles_amd.recipe.settings import Hardware

AMD_SMI_TEXT = "GPU: 0\n    ASIC:\n        MARKET_NAME: AMD Instinct MI355X\n" * 8


def test_detects_the_product_from_amd_smi_output() -> None:
    assert detect_hardware(lambda argv: AMD_SMI_TEXT if argv[0] == "amd-smi" else None) is (
        Hardware.MI355X
    )


def test_falls_back_to_rocm_smi() -> None:
    text = "GPU[0]\t\t: Card Series: \t\tAMD Instinct MI350X\n"
    assert detect_hardware(lambda argv: text if argv[0] == "rocm-smi" else None) is (
        Hardware.MI350X
    )


def test_mixed_node_is_an_error() -> None:
    with pytest.raises(HardwareDetectionError, match="mixes MI350X, MI355X"):
        detect_hardware(lambda argv: "AMD Instinct MI355X\nAMD Instinct MI350X")


def test_no_gpu_here_is_a_clear_error() -> None:
    # The real tools: on this CPU machine neither is installed, on a node they answer.
    if run_tool(("amd-smi", "static", "--asic")) or run_tool(("rocm-smi",)):
        pytest.skip("ROCm tools present: this test is about a machine without them")
    with pytest.raises(HardwareDetectionError, match="pass --hardware MI355X"):
        detect_hardware()
