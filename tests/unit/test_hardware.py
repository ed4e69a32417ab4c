"""``--hardware auto``: product names from the ROCm tools' output, clear errors otherwise."""

from __future__ import annotations

import pytest

from miles_amd.recipe.settings import Hardware, HardwareDetectionError, detect_hardware, run_tool

AMD_SMI_TEXT = "GPU: 0\n    ASIC:\n        MARKET_NAME: AMD Instinct MI355X\n" * 8
ROCM_SMI_TEXT = "GPU[0]\t\t: Card Series: \t\tAMD Instinct MI350X\n"


@pytest.mark.parametrize(
    ("tool", "text", "found"),
    [("amd-smi", AMD_SMI_TEXT, Hardware.MI355X), ("rocm-smi", ROCM_SMI_TEXT, Hardware.MI350X)],
)
def test_detects_the_product_from_either_tool(tool: str, text: str, found: Hardware) -> None:
    assert detect_hardware(lambda argv: text if argv[0] == tool else None) is found


def test_a_mixed_node_and_no_gpu_are_clear_errors() -> None:
    with pytest.raises(HardwareDetectionError, match="mixes MI350X, MI355X"):
        detect_hardware(lambda argv: "AMD Instinct MI355X\nAMD Instinct MI350X")
    # The real tools: on this CPU machine neither is installed, on a node they answer.
    if run_tool(("amd-smi", "static", "--asic")) or run_tool(("rocm-smi",)):
        pytest.skip("ROCm tools present: the rest is about a machine without them")
    with pytest.raises(HardwareDetectionError, match="pass --hardware MI355X"):
        detect_hardware()
