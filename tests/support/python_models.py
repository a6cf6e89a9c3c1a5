"""Python test models from ``tests/serving_pod/backends/data`` installed into a test repository.

``install_python_model(repo, "py_scale", "scale", parameters={"FACTOR": "3"}, isolated=True)``
copies the model folder under a new name, renames it in ``config.pbtxt`` and appends config
parameters (``isolated`` adds ``FERRY_ISOLATED``, so the model runs in its own process).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "serving_pod" / "backends" / "data"


def install_python_model(
    repository: Path,
    source: str,
    name: str,
    *,
    parameters: dict[str, str] | None = None,
    isolated: bool = False,
) -> Path:
    target = repository / name
    shutil.copytree(DATA / source, target, ignore=shutil.ignore_patterns("__pycache__"))
    config = target / "config.pbtxt"
    text = re.sub(r'^name: ".*"$', f'name: "{name}"', config.read_text(), count=1, flags=re.M)
    settings = dict(parameters or {})
    if isolated:
        settings["FERRY_ISOLATED"] = "true"
    for key, value in settings.items():
        text += f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
    config.write_text(text)
    return target
