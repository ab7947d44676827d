"""The form checks run the same everywhere: the lint stage (controller venv) and pre-commit use one version each."""

import re

import yaml
from conftest import REPO_ROOT

HOOKS = {"https://github.com/astral-sh/ruff-pre-commit": "ruff", "https://github.com/adrienverge/yamllint": "yamllint"}


def controller_pins():
    text = (REPO_ROOT / "requirements" / "controller.txt").read_text()
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, re.M))


def test_pre_commit_runs_the_versions_the_lint_stage_runs():
    config = yaml.safe_load((REPO_ROOT / ".pre-commit-config.yaml").read_text())
    pins = controller_pins()
    hooked = {HOOKS[repo["repo"]]: repo["rev"].lstrip("v") for repo in config["repos"] if repo["repo"] in HOOKS}
    assert hooked == {tool: pins[tool] for tool in ("ruff", "yamllint")}


def test_the_lint_stage_runs_ruff_and_yamllint():
    script = (REPO_ROOT / "scripts" / "test").read_text()
    lint = script[script.index("lint() {") :].split("\n}\n")[0]
    for command in ("ruff check .", "ruff format --check .", "yamllint --strict ."):
        assert command in lint, command


def test_the_overlay_is_excluded_until_its_owner_formats_it():
    ruff = (REPO_ROOT / "ruff.toml").read_text()
    assert "formatted by the overlay's owner" in ruff
    assert '"sglang_overlay"' in ruff and '"tests/gpu_sglang"' in ruff
