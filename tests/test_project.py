"""Project mode: multi-file fixtures and the project index.

Each folder ``fixtures/project/<case>/`` holds an input tree ``in/`` and, where the tool
changes something, the expected tree ``out/`` (a file missing from ``out/`` must stay
as it was), plus ``findings.txt``: one ``path:line:col: CODE`` line per finding, paths
relative to the tree. The whole tree is migrated in one run, as ``ampmigrate in/ --write``
would; then a second run must change nothing. ``pytest --update-fixtures`` rewrites
``out/`` and ``findings.txt`` from the tool's output.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from migrate.config import Config
from migrate.project import ModuleSummary, ProjectPlan, amp_groups, build_index, module_facts, says_amp, summarize
from migrate.runner import Status, run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "project"
CASES = sorted(path for path in FIXTURES.iterdir() if (path / "in").is_dir())


def _tree(root: Path) -> dict[str, str]:
    return {
        path.relative_to(root).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def _migrate_tree(root: Path) -> list:
    return run([root], Config(write=True, jobs=1))


def _findings(results: list, root: Path) -> str:
    lines = []
    for result in results:
        relative = Path(result.path).resolve().relative_to(root.resolve()).as_posix()
        for diagnostic in result.diagnostics:
            lines.append(f"{relative}:{diagnostic.line}:{diagnostic.column}: {diagnostic.code}")
        if result.status is Status.FAILED:
            lines.append(f"{relative}: failed: {result.error}")
    return "".join(f"{line}\n" for line in lines)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_project_fixture(case: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    root = tmp_path / "tree"
    shutil.copytree(case / "in", root)
    results = _migrate_tree(root)
    found = _findings(results, root)
    original, migrated = _tree(case / "in"), _tree(root)
    changed = {path: text for path, text in migrated.items() if original.get(path) != text}

    if request.config.getoption("--update-fixtures"):
        shutil.rmtree(case / "out", ignore_errors=True)
        for path, text in changed.items():
            target = case / "out" / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        (case / "findings.txt").write_text(found, encoding="utf-8")

    expected = _tree(case / "out") if (case / "out").is_dir() else {}
    assert changed == expected
    assert found == (case / "findings.txt").read_text(encoding="utf-8")
    for path, text in migrated.items():
        if path.endswith(".py"):
            compile(text, path, "exec")

    again = _migrate_tree(root)
    assert _tree(root) == migrated, "a second run must change nothing"
    assert all(result.status is not Status.CHANGED for result in again)


def test_every_case_has_findings_file() -> None:
    for case in CASES:
        assert (case / "findings.txt").is_file(), case


def _index(tmp_path: Path, files: dict[str, str]):
    sources = {}
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        sources[str(path)] = text
    return build_index(sources)


def test_modules_linked_by_imports_form_one_group(tmp_path: Path) -> None:
    index = _index(
        tmp_path,
        {
            "main.py": "from apex import amp\nfrom trainer import train\n",
            "trainer.py": "from apex import amp\ndef train(): amp.scale_loss\n",
            "other.py": "from apex import amp\n",
        },
    )
    groups = sorted(len(group.paths) for group in amp_groups(index))
    assert groups == [1, 2]


PACKAGE = {
    "pkg/__init__.py": "from .trainer import Trainer\nfrom .optim import AdamW\nfrom .utils import *\n",
    "pkg/trainer.py": "from apex import amp\nclass Trainer:\n    def step(self, loss, opt): amp.scale_loss(loss, opt)\n",
    "pkg/optim.py": "import torch\nclass AdamW(torch.optim.Optimizer): pass\n",
    "pkg/utils.py": (
        "VERSION = '1.0'\n"
        "def set_seed(seed): pass\n"
        "def fit(model):\n    from .trainer import Trainer\n    return Trainer()\n"
        "def build(model):\n    return fit(model)\n"
        "class Runner:\n    def run(self): return build(None)\n"
    ),
}


@pytest.mark.parametrize(
    ("script", "joins"),
    [
        ("from pkg import AdamW, VERSION, set_seed\n", False),  # re-exports and definitions without amp
        ("import pkg\npkg.optim.AdamW\n", False),  # a submodule read on the package
        ("from pkg import Trainer\n", True),
        ("from pkg import build\n", True),  # build -> fit -> trainer.Trainer
        ("from pkg import Runner\n", True),  # a class whose method calls build
        ("import pkg\npkg.Trainer\n", True),
        ("import pkg\nrun(pkg)\n", True),  # the package passed on as a value: anything may be read
        ("from pkg.utils import *\nfit(None)\n", True),
    ],
)
def test_a_module_without_amp_leads_on_only_where_the_names_asked_of_it_come_from(
    tmp_path: Path, script: str, joins: bool
) -> None:
    index = _index(tmp_path, {**PACKAGE, "main.py": "from apex import amp\n" + script})
    assert index.reached_amp_modules(str(tmp_path / "main.py")) == (
        [str(tmp_path / "pkg" / "trainer.py")] if joins else []
    )


def test_star_import_of_a_module_that_imports_amp_binds_amp(tmp_path: Path) -> None:
    index = _index(
        tmp_path,
        {
            "common.py": "try:\n    from apex import amp\nexcept ImportError:\n    pass\n",
            "train.py": "from common import *\n",
        },
    )
    facts = module_facts(index)
    assert facts[str(tmp_path / "train.py")].amp_from == (("amp", 1),)
    assert facts[str(tmp_path / "common.py")].exported == frozenset({"*"})


def test_relative_import_inside_a_package_resolves_to_the_nearest_module(tmp_path: Path) -> None:
    index = _index(
        tmp_path,
        {
            "pkg/__init__.py": "from .loop import fit\n",
            "pkg/loop.py": "from apex import amp\ndef fit(): pass\n",
            "other/loop.py": "from apex import amp\n",
        },
    )
    summary = index.modules[str(tmp_path / "pkg" / "__init__.py")]
    assert [target for _, target in index.imported(summary)] == [str(tmp_path / "pkg" / "loop.py")]


def test_amp_function_called_on_a_parameter_or_an_unbound_name_is_noticed(tmp_path: Path) -> None:
    index = _index(
        tmp_path,
        {
            "tracker.py": "def track(amp):\n    return amp.state_dict()\n",
            "nb.py": "model, opt = amp.initialize(model, opt)\n",
            "unrelated.py": "def save(model):\n    return model.state_dict()\n",
        },
    )
    modules = index.modules
    assert [use.api for use in modules[str(tmp_path / "tracker.py")].parameter_uses] == ["state_dict"]
    assert [use.api for use in modules[str(tmp_path / "nb.py")].unbound_uses] == ["initialize"]
    assert not modules[str(tmp_path / "unrelated.py")].uses_amp


def test_a_context_layer_over_the_limit_is_left_out_without_summarizing_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one given module imports eight helper modules that were not given; with room for five,
    # that layer is left out whole, and the search stops at the sixth summary it finds
    helpers = [f"helper{number}" for number in range(8)]
    (tmp_path / "train.py").write_text("from apex import amp\n" + "".join(f"import {name}\n" for name in helpers))
    for name in helpers:
        (tmp_path / f"{name}.py").write_text("def work():\n    pass\n")
    given = summarize(str(tmp_path / "train.py"), (tmp_path / "train.py").read_text())
    assert given is not None
    read: list[str] = []

    def context(path: str) -> ModuleSummary | None:
        if not os.path.isfile(path):
            return None
        read.append(path)
        return summarize(path, Path(path).read_text())

    monkeypatch.setattr(ProjectPlan, "CONTEXT_FILES", 6)
    plan = ProjectPlan([given], context=context)
    assert list(plan.index.modules) == [given.path]
    assert len(read) == 6

    monkeypatch.setattr(ProjectPlan, "CONTEXT_FILES", 9)
    read.clear()
    plan = ProjectPlan([given], context=context)
    assert len(plan.index.modules) == 9 and len(read) == 8


def test_summarizing_a_module_does_not_run_the_cycle_collector_over_its_tree() -> None:
    # an ast tree holds no cycles: the collector's passes while it is built are pure cost
    import gc

    source = "".join(f"def helper_{n}(x):\n    return [x * i for i in range({n})]\n\n\n" for n in range(300))
    starts: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            starts.append(info["generation"])

    was_enabled = gc.isenabled()
    gc.enable()
    gc.callbacks.append(note)
    try:
        summary = summarize("helpers.py", source)
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(note)
        if not was_enabled:
            gc.disable()
    assert summary is not None and len(summary.functions) == 300
    assert len(starts) <= 1, starts


@pytest.mark.parametrize("name", ["amp", "apex_amp", "self.amp", "args.amp", "amp_handle", "_amp", "amp2", "apexAmp"])
def test_a_name_that_says_amp(name: str) -> None:
    assert says_amp(name)


@pytest.mark.parametrize(
    "name", ["train_sampler", "self.training_dataloader.data_sampler", "example", "clamp", "timestamp", "ampere"]
)
def test_amp_inside_another_word_is_not_amp(name: str) -> None:
    """DeepSpeed's `data_sampler.state_dict()` froze its engine's amp setup as an unseen amp module."""
    assert not says_amp(name)


def test_a_carrier_setup_is_left_alone_when_a_script_that_stores_amp_there_was_not_given(tmp_path: Path) -> None:
    """``args.amp`` carries the amp module from two scripts into one trainer: migrating the trainer with
    only one of them would hand the other's Apex module a GradScaler's calls, so all stay as they were."""
    case = FIXTURES / "amp_stored_on_args_by_two_scripts" / "in"
    root = tmp_path / "tree"
    shutil.copytree(case, root)
    (root / "setup.py").write_text("")  # the project's root
    results = run([root / "classify.py", root / "trainer.py"], Config(write=True, jobs=1))
    assert _tree(root) == {**_tree(case), "setup.py": ""}
    frozen = [d.message for r in results for d in r.diagnostics if d.code == "AMP025"]
    assert frozen and all("regress.py" in message and "was not given" in message for message in frozen)
    # given whole, the same tree migrates (fixtures/project/amp_stored_on_args_by_two_scripts)
    results = run([root], Config(write=True, jobs=1))
    assert {Path(r.path).name for r in results if r.status is Status.CHANGED} == {
        "classify.py",
        "regress.py",
        "trainer.py",
    }


def test_a_setup_is_left_alone_when_a_module_not_given_scales_its_losses(tmp_path: Path) -> None:
    """``ampmigrate trainer.py``: a subclass in metatrainer.py (not given, nothing given imports it)
    scales its loss with amp on the base class's setup; migrating trainer.py alone would leave it
    calling Apex amp without an amp.initialize (modelled on howardhsu/BERT-for-RRC-ABSA dombert)."""
    root = tmp_path / "tree"
    root.mkdir()
    (root / "setup.py").write_text("")  # the project's root
    (root / "trainer.py").write_text(
        "import torch\n"
        "from apex import amp\n\n\n"
        "class Trainer:\n"
        "    def _forward(self, model, x):\n"
        "        loss = model(x).sum()\n"
        "        with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n"
        "            scaled_loss.backward()\n\n"
        "    def train(self, model, loader):\n"
        "        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        '        model, self.optimizer = amp.initialize(model, self.optimizer, opt_level="O1")\n'
        "        for x in loader:\n"
        "            self._forward(model, x)\n"
        "            self.optimizer.step()\n"
    )
    subclass = (
        "from apex import amp\n\n"
        "from trainer import Trainer\n\n\n"
        "class MetaTrainer(Trainer):\n"
        "    def _forward(self, model, x):\n"
        "        loss = model(x).mean()\n"
        "        with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
    )
    (root / "metatrainer.py").write_text(subclass)
    before = _tree(root)
    results = run([root / "trainer.py"], Config(write=True, jobs=1))
    assert _tree(root) == before
    frozen = [d.message for r in results for d in r.diagnostics if d.code == "AMP025"]
    assert frozen and all("metatrainer.py (not given) imports" in message for message in frozen)
    # without the subclass's amp, the base class alone migrates
    (root / "metatrainer.py").write_text(subclass.replace("amp.scale_loss(loss, self.optimizer)", "open(x)"))
    results = run([root / "trainer.py"], Config(write=True, jobs=1))
    assert [r.status for r in results] == [Status.CHANGED]


def test_importing_only_amp_free_helpers_does_not_link_two_setups(tmp_path: Path) -> None:
    index = _index(
        tmp_path,
        {
            "classify.py": "from apex import amp\ndef build(m): return m\ndef main(): amp.initialize(1)\n",
            "squad.py": "from apex import amp\nfrom classify import build\ndef main(): amp.initialize(build(1))\n",
            "tagger.py": "from apex import amp\nfrom classify import main\n",
        },
    )
    groups = sorted(sorted(Path(p).name for p in group.paths) for group in amp_groups(index))
    assert groups == [["classify.py", "tagger.py"], ["squad.py"]]


def test_cast_function_names_match_the_rule() -> None:
    """The project summary marks the same casting decorators the amp_cast_functions rule rewrites."""
    from migrate.project import _CAST_FUNCTION_APIS
    from migrate.rules.amp_cast_functions import APIS

    assert _CAST_FUNCTION_APIS == APIS


def test_an_import_resolves_past_a_farther_package_of_the_same_name(tmp_path: Path) -> None:
    """``from lib.engine import f`` in ``tests/lib/engine/test_x.py`` is the library's module: the
    test package ``tests/lib/engine/`` farther up is not on sys.path for it (pytorch/ignite); a
    sibling ``utils.py`` that uses no amp is what ``import utils`` gets (microsoft/Cream)."""
    files = {
        "lib/__init__.py": "",
        "lib/engine/__init__.py": "from apex import amp\n",
        "tests/lib/engine/__init__.py": "",
        "tests/lib/engine/test_x.py": "from lib.engine import f\n",
        "swin/utils.py": "from apex import amp\n",
        "deit/utils.py": "",
        "deit/engine.py": "import utils\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    indexed = ["lib/engine/__init__.py", "tests/lib/engine/test_x.py", "swin/utils.py", "deit/engine.py"]
    index = build_index({str(tmp_path / name): files[name] for name in indexed})
    test = str(tmp_path / "tests/lib/engine/test_x.py")
    assert index.resolve(test, "lib.engine") == str(tmp_path / "lib/engine/__init__.py")
    assert index.resolve(str(tmp_path / "deit/engine.py"), "utils") is None


def test_runner_hook_setup_left_as_it_was_names_the_code_to_write_in_each_module(tmp_path: Path) -> None:
    """An mmcv-style setup (the optimizer handed to build_runner, the loss scaled in a registered
    hook, amp's state in a runner subclass and a checkpoint function) that the runner cannot carry
    (a static loss scale) stays whole, and each module's finding says what to write there."""
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / "runner_hook_with_a_static_loss_scale_stays" / "in", root)
    messages = {
        Path(result.path).resolve().relative_to(root.resolve()).as_posix(): diagnostic.message
        for result in _migrate_tree(root)
        for diagnostic in result.diagnostics
    }
    creator = messages["detkit/apis.py"]
    assert 'it is migrated only where the call is `amp.initialize(model, optimizer, opt_level="O1")`' in creator
    assert "`runner.scaler = scaler` right after line 15" in creator
    assert "enabled=bool(hook_cfg.get('type') == 'AccumulateFp16Hook' and hook_cfg.get('fp16', False))" in creator
    assert '`model.forward = torch.autocast("cuda", dtype=torch.float16)(model.forward)`' in creator
    hook = messages["detkit/runner/fp16_hook.py"]
    assert "`runner.scaler.scale(loss).backward()` for the `with` block at line 21" in hook
    assert "`runner.scaler.unscale_(runner.optimizer)` right before the clip at line 28" in hook
    assert "`runner.scaler.step(runner.optimizer)` then `runner.scaler.update()`" in hook
    assert (
        "`self.scaler.load_state_dict(grad_scaler_state(checkpoint['amp_state']))`"
        in messages["detkit/runner/amp_runner.py"]
    )
    checkpoint = messages["detkit/runner/ckpt.py"]
    assert "`scaler.state_dict()` at line 11, with a parameter `scaler=None` added to `save_with_amp`" in checkpoint
    assert "amp_runner.py:14)" in checkpoint


def test_runner_hook_setup_the_rules_cannot_finish_goes_back_whole(tmp_path: Path) -> None:
    """The runner would carry the GradScaler, but the hook's scale_loss has a shape the rules do
    not rewrite: every module of the setup is left as it was, and the creator's finding names it."""
    case = FIXTURES / "runner_hook_the_rules_cannot_rewrite_stays" / "in"
    root = tmp_path / "tree"
    shutil.copytree(case, root)
    messages = {
        Path(result.path).resolve().relative_to(root.resolve()).as_posix(): diagnostic.message
        for result in _migrate_tree(root)
        for diagnostic in result.diagnostics
    }
    assert _tree(root) == _tree(case)
    assert "carrying it on the runner left Apex amp in " in messages["detkit/apis.py"]
    assert "fp16_hook.py (a call there that the rules do not rewrite" in messages["detkit/apis.py"]


def test_runner_hook_setup_run_on_part_of_the_tree_stays(tmp_path: Path) -> None:
    """Given the set-up module and the hook but not the runner subclass nor the checkpoint
    function (which also use Apex amp): nothing is migrated, and the finding says which to add."""
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / "runner_hook_and_checkpoint_through_a_registry" / "in", root)
    before = _tree(root)
    results = run(
        [root / "detkit" / "apis.py", root / "detkit" / "runner" / "fp16_hook.py"], Config(write=True, jobs=1)
    )
    assert _tree(root) == before
    creator = next(d.message for r in results if r.path.endswith("apis.py") for d in r.diagnostics)
    assert "imports Apex too, and is not among them (include it in the run" in creator


@pytest.mark.parametrize(
    ("imports", "blocks"),
    [
        # VDIGPKU/CBNetV2's EVA backbones: only Apex's fused LayerNorm, which cannot run amp
        ("try:\n    from apex.normalization import FusedLayerNorm\nexcept ImportError:\n    pass\n", False),
        ("from apex.optimizers import FusedAdam\nfrom apex.parallel import DistributedDataParallel\n", False),
        # these can reach amp: `import apex.normalization` binds `apex` (apex.amp.scale_loss)
        ("import apex.normalization\n", True),
        ("from apex import amp\n", True),
        ("from apex import normalization\n", True),
        ("    from apex.amp import scale_loss\n", True),
    ],
)
def test_a_module_outside_a_runner_setup_keeps_it_only_where_it_can_reach_amp(
    tmp_path: Path, imports: str, blocks: bool
) -> None:
    """A module of the program that imports Apex but is not among the setup's modules keeps a
    runner setup on Apex only where that import can reach amp; one run then migrates the rest, so
    `--write` reaches a fixed point (a second `--check` finds nothing)."""
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / "runner_hook_and_checkpoint_through_a_registry" / "in", root)
    (root / "detkit" / "blocks.py").write_text(imports + "\n\ndef width(x):\n    return x * 2\n")
    creator = _runner_messages(root).get("detkit/apis.py", "")
    assert ("blocks.py imports Apex too" in creator) is blocks


def _runner_messages(root: Path) -> dict[str, str]:
    return {
        Path(result.path).resolve().relative_to(root.resolve()).as_posix(): diagnostic.message
        for result in _migrate_tree(root)
        for diagnostic in result.diagnostics
        if diagnostic.code == "AMP025"
    }


@pytest.mark.parametrize(
    ("case", "blocker"),
    [
        ("runner_hook_also_in_a_registry_stays", "sslib/hooks/__init__.py:6 may hand them to it"),
        ("runner_hook_module_read_by_name_stays", "sslib/apis.py:43 reads a module that holds"),
    ],
)
def test_runner_hook_another_runner_could_get_names_how(tmp_path: Path, case: str, blocker: str) -> None:
    """open-mmlab/OpenSelfSup: another runner in the program is harmless only while no runner but
    the setup's can get the hook class; where one could, the finding names the code that could."""
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / case / "in", root)
    before = _tree(root)
    creator = _runner_messages(root)["sslib/apis.py"]
    assert _tree(root) == before
    assert "sslib/apis.py may build another runner" in creator
    assert blocker in creator


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        # a config that names the hook class: a registry or a lookup could build it from there
        (("configs/fp16.py", 'optimizer_config = dict(type="StepHook", use_fp16=True)\n'), "configs/fp16.py:1"),
        # a subclass runs the hook's method on whatever runner it is given
        (
            ("sslib/hooks/slow.py", "from .step_hook import StepHook\n\n\nclass SlowStepHook(StepHook):\n    pass\n"),
            "sslib/hooks/slow.py:4",
        ),
        # the class kept as a value: any code could make one from it
        (("sslib/hooks/keep.py", "from .step_hook import StepHook\n\nKEPT = [StepHook]\n"), "sslib/hooks/keep.py:3"),
        # a module imported by a config's string could be the hooks package
        (
            (
                "sslib/plugins.py",
                "import importlib\n\n\ndef load(cfg):\n    return importlib.import_module(cfg.module)\n",
            ),
            "sslib/plugins.py:5",
        ),
    ],
)
def test_runner_hook_named_anywhere_else_keeps_the_setup(tmp_path: Path, edit: tuple[str, str], where: str) -> None:
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / "runner_hook_made_only_for_the_set_up_runner" / "in", root)
    name, text = edit
    (root / name).parent.mkdir(exist_ok=True)
    (root / name).write_text(text)
    before = _tree(root)
    creator = _runner_messages(root)["sslib/apis.py"]
    assert _tree(root) == before
    assert f"{where} may hand them to it" in creator


def test_another_runner_in_a_branch_of_the_if_that_picks_the_runner_stays(tmp_path: Path) -> None:
    """The branches of the if/else that builds the runner count as one construction only where
    each call binds the runner: a spare runner built beside it could run the registered hook."""
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / "runner_class_picked_in_an_if_else" / "in", root)
    train = root / "vidlib" / "apis" / "train.py"
    text = train.read_text()
    built = "        runner = Runner(model, optimizer=optimizer, work_dir=cfg.work_dir)\n"
    assert built in text
    train.write_text(text.replace(built, built.replace("runner =", "spare =") + built))
    before = _tree(root)
    creator = _runner_messages(root)["vidlib/apis/train.py"]
    assert _tree(root) == before
    assert "vidlib/apis/train.py may build another runner" in creator


def test_runner_built_in_two_ifs_says_so(tmp_path: Path) -> None:
    """SwinTransformer/Video-Swin-Transformer picks the runner class in an if/else after the
    initialize (migrated: fixtures/project/runner_class_picked_in_an_if_else); built in two ifs
    instead, the runner may be none or another when the hooks run: the finding says so."""
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / "runner_built_in_two_ifs_stays" / "in", root)
    creator = _runner_messages(root)["vidlib/apis/train.py"]
    assert "the runner is built at line 26 in a block of the function that may not build it on every path" in creator
    assert "`runner.scaler = scaler` right after line 26 (and after each other statement that builds" in creator
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(' in creator


def test_set_up_module_spelling_apex_amp_given_alone_stays(tmp_path: Path) -> None:
    """`import apex` with `apex.amp.initialize(...)`, the optimizer handed to build_runner, given by
    itself (the hook that scales the loss not given): left as it was, not migrated into float32."""
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / "hook_module_imported_beside_the_setup" / "in", root)
    before = _tree(root)
    results = run([root / "detection" / "mmdet_custom" / "apis" / "train.py"], Config(write=True, jobs=1))
    assert _tree(root) == before
    assert [d.code for r in results for d in r.diagnostics] == ["AMP025"]


def test_runner_hook_setup_beside_a_copy_of_the_model_stays(tmp_path: Path) -> None:
    """The migration wraps the model's forward in autocast on the model object; a module of the
    program that deep-copies the model (an EMA copy) would run the original's forward: left as it was."""
    root = tmp_path / "tree"
    shutil.copytree(FIXTURES / "runner_hook_and_checkpoint_through_a_registry" / "in", root)
    (root / "detkit" / "ema.py").write_text("import copy\n\n\ndef ema_copy(model):\n    return copy.deepcopy(model)\n")
    before = _tree(root)
    results = _migrate_tree(root)
    assert _tree(root) == before
    creator = next(d.message for r in results if r.path.endswith("apis.py") for d in r.diagnostics)
    assert "ema.py copies or pickles the model" in creator


def test_an_initialize_handed_to_a_given_trainer_names_it(tmp_path: Path) -> None:
    """microsoft/scene_graph_benchmark: tools/train_net.py's amp.initialize hands the model and
    optimizer to do_train in a module that is given and trains them with a GradScaler of its own.
    The setup stays (AMP025), and the message names that module instead of calling the training
    code out of sight."""
    case = FIXTURES / "initialize_handed_to_a_loop_with_its_own_scaler" / "in"
    root = tmp_path / "tree"
    shutil.copytree(case, root)
    results = run([root], Config(write=True, jobs=1))
    assert _tree(root) == _tree(case)
    frozen = [d.message for r in results for d in r.diagnostics if d.code == "AMP025"]
    assert len(frozen) == 1
    assert "engine/loop.py" in frozen[0] and "out of sight" not in frozen[0]
