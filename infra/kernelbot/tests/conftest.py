"""The suite tests the installed package (``pip install "infra/kernelbot[test]"``), never the
source tree beside it: what kernelbot gets is what passes."""

from pathlib import Path

import kernelbot_dispatch

SOURCE_TREE = Path(__file__).resolve().parents[1] / "src"
if SOURCE_TREE in Path(kernelbot_dispatch.__file__).resolve().parents:
    raise RuntimeError(
        f"kernelbot_dispatch was imported from {SOURCE_TREE}, not from an installed package"
    )
