"""The node itself: 8 AMD GPUs of arch gfx950, seen through the image's ROCm torch."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.mi355x

EXPECTED_GPUS = 8
EXPECTED_ARCH = "gfx950"


def test_node_shows_eight_gfx950_gpus_through_rocm_torch() -> None:
    torch = pytest.importorskip("torch", reason="the image's ROCm torch is required")
    assert torch.version.hip, f"torch {torch.__version__} is not a ROCm build (torch.version.hip)"
    assert torch.cuda.is_available(), "ROCm torch sees no GPU (check --device=/dev/kfd,/dev/dri)"
    count = torch.cuda.device_count()
    archs = [torch.cuda.get_device_properties(i).gcnArchName for i in range(count)]
    assert count == EXPECTED_GPUS, f"{count} GPUs visible, the recipe needs {EXPECTED_GPUS}"
    wrong = [a for a in archs if not a.startswith(EXPECTED_ARCH)]
    assert not wrong, f"GPU archs {archs}: expected all {EXPECTED_ARCH} (MI355X/MI350X)"
