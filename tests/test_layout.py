"""The repository's entry points agree with each other: CI runs what the README tells users to run."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_make_test_with_services_required() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    assert "ACCUM_REQUIRE_SERVICES=1" in ci


def test_constraints_pin_torch_and_package_keeps_a_range() -> None:
    pins = (ROOT / "constraints.txt").read_text()
    assert "torch==" in pins and "torchvision==" in pins
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"torch>=' in pyproject and "torch==" not in pyproject


def test_readme_gives_the_commands_ci_and_the_makefile_run() -> None:
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for command in ("make demo", "make test"):
        assert command in readme
        assert f"\n{command.split()[1]}:" in makefile
