"""environment.yml (conda) and pyproject.toml list the same dependencies."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pins(reqs):
    return {_name(r): r.replace(" ", "") for r in reqs}


def test_environment_yml_agrees_with_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _pins(project["dependencies"] + project["optional-dependencies"]["test"])
    lines = (ROOT / "environment.yml").read_text().splitlines()
    pip_section = [ln.strip()[2:] for ln in lines if ln.startswith("      - ")]
    conda = _pins(pip_section)
    torch_pin = re.search(r'TORCH_PIN \?= (\S+)', (ROOT / "Makefile").read_text()).group(1)
    assert conda.pop("torch") == torch_pin, "environment.yml pins another torch than the Makefile"
    assert conda == wanted
