"""Notebooks: all code cells as one program, magics and JSON layout kept, cell positions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from migrate import notebook as nb
from migrate.cli import main


def code(source: str | list[str], **extra: Any) -> dict[str, Any]:
    return {
        "cell_type": "code",
        "execution_count": 1,
        "metadata": {},
        "outputs": [],
        "source": source,
        **extra,
    }


def markdown(source: str) -> dict[str, Any]:
    return {"cell_type": "markdown", "metadata": {}, "source": source}


def notebook_json(cells: list[dict[str, Any]], indent: int | None = 1) -> str:
    document = {
        "cells": cells,
        "metadata": {
            "kernelspec": {
                "display_name": "Python 3",
                "language": "python",
                "name": "python3",
            }
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    # nbformat's own layout: indent 1, no ASCII escaping, final newline.
    return json.dumps(document, indent=indent, ensure_ascii=False) + "\n"


OUTPUT = {"output_type": "stream", "name": "stdout", "text": ["déjà vu\n"]}
CELLS = [
    markdown("# Training with *amp*"),
    code(["%matplotlib inline\n", "import torch\n", "!nvidia-smi"]),
    code("files = !ls\nmodel = torch.nn.Linear(2, 2)", outputs=[OUTPUT]),
    code("%%time\nwith torch.cuda.amp.autocast():\n    y = 1"),
    code(
        [
            "with torch.cuda.amp.autocast():\n",
            "    out = model(torch.ones(2))\n",
            "torch.ones?",
        ]
    ),
]


def run_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_program_joins_code_cells_and_hides_magics() -> None:
    notebook = nb.load(notebook_json(CELLS).encode())
    program = nb.to_program(notebook)
    assert program is not None
    # The import in cell 2 and the use in cell 5 are one module; the %%time cell is left out.
    compile(program.text, "<notebook>", "exec")
    assert "import torch" in program.text and "out = model(" in program.text
    assert "%%time" not in program.text and "%matplotlib" not in program.text
    assert program.magics == (
        "%matplotlib inline",
        "!nvidia-smi",
        "files = !ls",
        "torch.ones?",
    )
    assert program.locate(2) == (2, 2)  # `import torch`: cell 2, line 2
    assert program.locate(program.text.splitlines().index("    out = model(torch.ones(2))") + 1) == (5, 2)


def test_operators_continuing_a_statement_are_not_magics() -> None:
    source = 'x = (1\n     % 2)\ny = 3 \\\n    % 2\ntext = """\n!not a shell line\n"""\n%time x'
    notebook = nb.load(notebook_json([code(source)]).encode())
    program = nb.to_program(notebook)
    assert program is not None
    assert program.magics == ("%time x",)
    compile(program.text, "<notebook>", "exec")


def test_unchanged_program_round_trips_to_no_changed_cells() -> None:
    notebook = nb.load(notebook_json(CELLS).encode())
    program = nb.to_program(notebook)
    assert program is not None
    assert nb.from_program(notebook, program, program.text) == {}


def test_lost_cell_marker_refuses_to_split() -> None:
    notebook = nb.load(notebook_json(CELLS).encode())
    program = nb.to_program(notebook)
    assert program is not None
    broken = program.text.replace("__ampmigrate_cell__(4)\n", "")
    with pytest.raises(nb.NotebookError, match="split back"):
        nb.from_program(notebook, program, broken)


def test_write_migrates_only_the_changed_cell_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = notebook_json(CELLS)
    (tmp_path / "train.ipynb").write_text(original, encoding="utf-8")
    result = run_cli(tmp_path, monkeypatch, "--write", "train.ipynb")
    assert result.exit_code == 0, result.output
    written = (tmp_path / "train.ipynb").read_text(encoding="utf-8")
    expected_cells = json.loads(original)["cells"]
    expected_cells[4]["source"] = [
        'with torch.autocast("cuda", dtype=torch.float16):\n',
        "    out = model(torch.ones(2))\n",
        "torch.ones?",
    ]
    assert json.loads(written)["cells"] == expected_cells  # magics, outputs, %%time cell untouched
    # Nothing but the one source line differs in the file itself.
    changed = [line for line in written.splitlines() if line not in original.splitlines()]
    assert changed == ['    "with torch.autocast(\\"cuda\\", dtype=torch.float16):\\n",']
    again = run_cli(tmp_path, monkeypatch, "--check", "train.ipynb")
    assert again.exit_code == 0, again.output


def test_diff_and_findings_point_at_cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = [
        code("import torch\nfrom apex import amp"),
        markdown("text"),
        code("x = 1\namp.half_function"),
        code("with torch.cuda.amp.autocast():\n    pass"),
    ]
    (tmp_path / "nb.ipynb").write_text(notebook_json(cells), encoding="utf-8")
    result = run_cli(tmp_path, monkeypatch, "nb.ipynb")
    assert "--- a/nb.ipynb:cell 4\n+++ b/nb.ipynb:cell 4\n" in result.stdout
    assert "nb.ipynb:cell 3:2:1: AMP032 " in result.stdout


def test_syntax_error_names_the_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = [code("from apex import amp"), code("x = 1\nif x\n    pass")]
    (tmp_path / "nb.ipynb").write_text(notebook_json(cells), encoding="utf-8")
    result = run_cli(tmp_path, monkeypatch, "--check", "nb.ipynb")
    assert result.exit_code == 2
    assert "error: nb.ipynb: cannot parse: cell 2, line 2" in result.stderr


def test_unusual_json_layout_is_not_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = [code("import torch\nwith torch.cuda.amp.autocast():\n    pass")]
    odd = notebook_json(cells, indent=3)  # a layout not tried: written by hand, say
    (tmp_path / "nb.ipynb").write_bytes(odd.encode())
    result = run_cli(tmp_path, monkeypatch, "--write", "nb.ipynb")
    assert result.exit_code == 2
    assert "JSON layout" in result.stderr
    assert (tmp_path / "nb.ipynb").read_bytes() == odd.encode()


def test_crlf_and_bom_notebook_keeps_its_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = [code(["import torch\n", "with torch.cuda.amp.autocast():\n", "    pass"])]
    original = notebook_json(cells).replace("\n", "\r\n")
    (tmp_path / "nb.ipynb").write_bytes(b"\xef\xbb\xbf" + original.encode())
    result = run_cli(tmp_path, monkeypatch, "--write", "nb.ipynb")
    assert result.exit_code == 0, result.output
    expected = original.replace("torch.cuda.amp.autocast()", 'torch.autocast(\\"cuda\\", dtype=torch.float16)')
    assert (tmp_path / "nb.ipynb").read_bytes() == b"\xef\xbb\xbf" + expected.encode()


def test_non_python_kernel_and_invalid_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r_notebook = json.loads(notebook_json([code("apex <- 1")]))
    r_notebook["metadata"] = {"kernelspec": {"language": "R", "name": "ir"}}
    (tmp_path / "r.ipynb").write_text(json.dumps(r_notebook, indent=1) + "\n")
    (tmp_path / "torn.ipynb").write_text('{"cells": [{"source": "from apex import amp"')
    result = run_cli(tmp_path, monkeypatch, "--check", ".")
    assert result.exit_code == 2
    assert "error: torn.ipynb: not a readable notebook" in result.stderr
    assert "r.ipynb" not in result.output


def test_shell_escape_continued_with_backslashes_is_one_magic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """IPython joins `!cmd \\` with the lines it continues onto (indented shell arguments, as in
    training notebooks that launch a script): they are part of the magic, not a Python indent."""
    launch = "!python -m torch.distributed.launch train.py \\\n  --fp16 \\\n    --epochs 1\n"
    cells = [
        code(launch + "import torch\n"),
        code("if True:\n    !echo a \\\n  b\n    with torch.cuda.amp.autocast():\n        y = 1"),
    ]
    notebook = nb.load(notebook_json(cells).encode())
    program = nb.to_program(notebook)
    assert program is not None
    compile(program.text, "<notebook>", "exec")
    assert program.text.count("\n") == sum(nb.cell_source(cell).count("\n") + 1 for cell in cells)
    (tmp_path / "train.ipynb").write_text(notebook_json(cells), encoding="utf-8")
    result = run_cli(tmp_path, monkeypatch, "--write", "train.ipynb")
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "train.ipynb").read_text(encoding="utf-8"))["cells"]
    assert "".join(written[0]["source"]).startswith(launch)
    assert (
        "".join(written[1]["source"])
        == 'if True:\n    !echo a \\\n  b\n    with torch.autocast("cuda", dtype=torch.float16):\n        y = 1'
    )


def test_cell_whose_first_statement_goes_starts_at_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = [
        code("import torch\nfrom apex import amp\n\nmodel = torch.nn.Linear(2, 2)"),
        code("from apex import amp\n\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"),
        code("\nmodel, opt = amp.initialize(model, opt, opt_level='O1')"),
        code(
            "for step in range(3):\n"
            "    loss = model(torch.ones(1, 2)).sum()\n"
            "    with amp.scale_loss(loss, opt) as scaled:\n"
            "        scaled.backward()\n"
            "    opt.step()"
        ),
    ]
    (tmp_path / "train.ipynb").write_text(notebook_json(cells), encoding="utf-8")
    result = run_cli(tmp_path, monkeypatch, "--write", "train.ipynb")
    assert result.exit_code == 0, result.output
    sources = ["".join(cell["source"]) for cell in json.loads((tmp_path / "train.ipynb").read_text())["cells"]]
    assert sources[0] == "import torch\n\nmodel = torch.nn.Linear(2, 2)"  # a blank line between statements stays
    assert sources[1] == "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"  # not "\nopt = ..."
    assert sources[2] == '\nscaler = torch.amp.GradScaler("cuda")'  # it started with a blank line before too


def test_automagic_shell_lines_are_magics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ls /content/checkpoints/` in a cell of its own (facebookresearch/vissl's Colab tutorials)
    is IPython's `%ls` called without its `%`: it is kept as it was, and the notebook migrates,
    where the whole notebook failed to parse. Lines that are Python keep being Python."""
    cells = [
        code("import torch\nfrom apex import amp\nmodel = torch.nn.Linear(2, 2)"),
        code("ls /content/checkpoints/"),
        code("pip install -q timm\nls = [1]\ncat, dog = 1, 2\nls -l"),
        code("with torch.cuda.amp.autocast():\n    y = model(torch.ones(2))"),
    ]
    notebook = nb.load(notebook_json(cells).encode())
    program = nb.to_program(notebook)
    assert program is not None
    compile(program.text, "<notebook>", "exec")
    assert program.magics == ("ls /content/checkpoints/", "pip install -q timm")
    (tmp_path / "tutorial.ipynb").write_text(notebook_json(cells), encoding="utf-8")
    result = run_cli(tmp_path, monkeypatch, "--write", "tutorial.ipynb")
    assert result.exit_code == 0, result.output
    written = ["".join(cell["source"]) for cell in json.loads((tmp_path / "tutorial.ipynb").read_text())["cells"]]
    assert written[1:3] == [cells[1]["source"], cells[2]["source"]]
    assert written[3] == 'with torch.autocast("cuda", dtype=torch.float16):\n    y = model(torch.ones(2))'


def test_future_import_opening_a_later_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`from __future__ import print_function` opening the training cell of a Colab notebook
    (ThilinaRajapakse/pytorch-transformers-classification's colab_quickstart.ipynb) is legal where
    IPython compiles each cell alone: it is kept as it was, and the notebook migrates, where the
    joined program failed to parse and the whole notebook failed."""
    cells = [
        code("!pip install -q transformers"),
        code(
            "from __future__ import absolute_import, print_function\n"
            "import torch\n"
            "from apex import amp\n"
            "model = torch.nn.Linear(2, 2)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model, opt = amp.initialize(model, opt, opt_level='O1')"
        ),
        code(
            "for step in range(3):\n"
            "    loss = model(torch.ones(1, 2)).sum()\n"
            "    with amp.scale_loss(loss, opt) as scaled:\n"
            "        scaled.backward()\n"
            "    opt.step()"
        ),
    ]
    program = nb.to_program(nb.load(notebook_json(cells).encode()))
    assert program is not None
    compile(program.text, "<notebook>", "exec")
    (tmp_path / "colab.ipynb").write_text(notebook_json(cells), encoding="utf-8")
    result = run_cli(tmp_path, monkeypatch, "--write", "colab.ipynb")
    assert result.exit_code == 0, result.output
    written = ["".join(cell["source"]) for cell in json.loads((tmp_path / "colab.ipynb").read_text())["cells"]]
    assert written[1].startswith("from __future__ import absolute_import, print_function\nimport torch\n")
    assert "amp.initialize" not in written[1] and "GradScaler" in written[1]
    assert "scaler.scale(loss).backward()" in written[2]
