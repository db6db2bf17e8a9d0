"""[tool.ampmigrate] loading, command-line precedence, excludes and .gitignore."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from migrate.cli import main
from migrate.config import DEFAULT_EXCLUDE, ConfigError, build_config, find_pyproject

AUTOCAST = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = 1\n"


def cli(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> object:
    monkeypatch.chdir(root)
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_pyproject_is_found_by_walking_up_and_stops_at_the_repository(
    tmp_path: Path,
) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ampmigrate]\ndtype = 'bfloat16'\n")
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src/pkg").mkdir(parents=True)
    assert find_pyproject([repo / "src/pkg"]) is None  # the one above the repository is not ours
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # no [tool.ampmigrate]: skipped
    (repo / "src/pyproject.toml").write_text("[tool.ampmigrate]\ndevice = 'cpu'\n")
    assert find_pyproject([repo / "src/pkg", repo / "src"]) == repo / "src/pyproject.toml"


def test_settings_from_pyproject_and_command_line_wins(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[tool.ampmigrate]\n"
        "device = 'cpu'\ndtype = 'bfloat16'\nscaler-name = 'grad_scaler'\n"
        "select = ['torch_cuda_amp']\nextend-exclude = ['legacy/']\n"
    )
    from_file = build_config([tmp_path])
    assert (
        from_file.options.device,
        from_file.options.dtype,
        from_file.options.scaler_name,
    ) == (
        "cpu",
        "bfloat16",
        "grad_scaler",
    )
    assert from_file.options.select == frozenset({"torch_cuda_amp"})
    assert from_file.exclude == DEFAULT_EXCLUDE and from_file.extend_exclude == ("legacy/",)
    assert from_file.project_root == tmp_path
    overridden = build_config([tmp_path], device="cuda", dtype="float16", scaler_name="s", select=frozenset())
    assert (
        overridden.options.device,
        overridden.options.dtype,
        overridden.options.scaler_name,
    ) == (
        "cuda",
        "float16",
        "s",
    )
    assert overridden.options.select == frozenset()


@pytest.mark.parametrize(
    "table, message",
    [
        ("dtype = 'float64'", "dtype must be one of"),
        ("scaler-name = '1x'", "identifier"),
        ("exclude = 'build/'", "list of strings"),
        ("jobs = 3", "unknown key"),
        ("respect-gitignore = 'yes'", "true or false"),
    ],
)
def test_invalid_settings_are_rejected(tmp_path: Path, table: str, message: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f"[tool.ampmigrate]\n{table}\n")
    with pytest.raises(ConfigError, match=message):
        build_config([tmp_path])


def test_bad_pyproject_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ampmigrate]\ndtype = 'float64'\n")
    (tmp_path / "a.py").write_text(AUTOCAST)
    result = cli(tmp_path, monkeypatch, "a.py")
    assert result.exit_code == 2  # type: ignore[attr-defined]
    assert "dtype must be one of" in result.stderr  # type: ignore[attr-defined]


def test_excludes_apply_to_folders_and_to_files_named_explicitly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ampmigrate]\nextend-exclude = ['legacy/', 'gen_*.py']\n")
    for name in ("src/a.py", "legacy/old.py", "src/gen_model.py", "build/b.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(AUTOCAST)
    walked = cli(tmp_path, monkeypatch, "--check", ".")
    assert "would migrate src/a.py" in walked.stderr  # type: ignore[attr-defined]
    assert "1 file scanned" in walked.stderr  # type: ignore[attr-defined]
    # pre-commit passes files by name: the project's excludes still hold, and
    # nothing left to do is a clean no-op.
    named = cli(tmp_path, monkeypatch, "--check", "legacy/old.py", "src/gen_model.py")
    assert named.exit_code == 0  # type: ignore[attr-defined]
    assert "0 files scanned" in named.stderr  # type: ignore[attr-defined]
    # ... and says why each named file was passed over
    for name in ("legacy/old.py", "src/gen_model.py"):
        assert f"{name}: not migrated: the exclude patterns" in named.stderr  # type: ignore[attr-defined]
    # --exclude replaces the default patterns (build/ is one); extend-exclude still adds.
    replaced = cli(tmp_path, monkeypatch, "--check", "--exclude", "src/", ".")
    assert "would migrate build/b.py" in replaced.stderr  # type: ignore[attr-defined]
    assert "1 file scanned" in replaced.stderr  # type: ignore[attr-defined]


def test_gitignore_is_respected_unless_disabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".gitignore").write_text("generated/\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/.gitignore").write_text("scratch_*.py\n")
    for name in ("pkg/train.py", "pkg/scratch_1.py", "generated/out.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(AUTOCAST)
    respected = cli(tmp_path / "pkg", monkeypatch, "--check", "..")
    assert "1 file scanned" in respected.stderr  # type: ignore[attr-defined]
    ignored = cli(tmp_path, monkeypatch, "--check", "--no-respect-gitignore", ".")
    assert "3 files scanned" in ignored.stderr  # type: ignore[attr-defined]


def test_the_cache_is_off_unless_asked_and_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMPMIGRATE_CACHE_DIR", str(tmp_path / "results"))
    assert build_config([tmp_path]).cache_dir is None  # the library default: no cache
    assert build_config([tmp_path], cache=True).cache_dir == tmp_path / "results"
    assert "--no-cache" in cli(tmp_path, monkeypatch, "--help").stdout  # type: ignore[attr-defined]
