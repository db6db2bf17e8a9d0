"""Inputs cast to float16 by hand on their way to a model (``migrate.half_inputs``)."""

from __future__ import annotations

import ast
import textwrap

from migrate import half_inputs


def _feeds(source: str, *names: str) -> list[tuple[int, str, str, int]]:
    source = textwrap.dedent(source)
    found = half_inputs.feeds(ast.parse(source), source, frozenset(names))
    return [(feed.line, feed.cast, feed.model, feed.call_line) for feed in found]


def test_inline_casts_in_a_call_on_the_model_or_its_method() -> None:
    source = """
    def evaluate(model, batch):
        a = model(batch["img"].half())
        b = model.evaluate(batch["img"].to(torch.float16), mask=batch["mask"].to(dtype=torch.half))
        c = self.model.module(batch["img"].type(torch.cuda.HalfTensor))
    """
    assert _feeds(source, "model") == [
        (3, 'batch["img"].half()', "model", 3),
        (4, 'batch["img"].to(torch.float16)', "model", 4),
        (4, 'batch["mask"].to(dtype=torch.half)', "model", 4),
        (5, 'batch["img"].type(torch.cuda.HalfTensor)', "self.model.module", 5),
    ]


def test_a_cast_stored_then_handed_to_the_model_lines_later() -> None:
    source = """
    def evaluate(model, loader, fp16):
        for batch in loader:
            if fp16:
                batch["img"] = batch["img"].half()
            text = batch["text"].cuda()
            out = forward_step(model, batch)
    """
    assert _feeds(source, "model") == [(5, 'batch["img"].half()', "model", 7)]


def test_casts_that_do_not_reach_the_model() -> None:
    source = """
    def run(model, loader, scores):
        model.half()
        model = model.to(torch.float16)
        model.load_state_dict({k: v.half() for k, v in state.items()})
        scores[0] = out.half()
        x = torch.zeros(3, dtype=torch.float16)
        y = x.to(torch.float32)
        model(x)
        print(loss.half())
    """
    assert _feeds(source, "model") == []


def test_feeders_name_the_model_parameter() -> None:
    source = textwrap.dedent("""
    def evaluate(net, loader, *, head):
        for images in loader:
            net(images.half())
            head(images.half())

    def train(model, optimizer):
        pass
    """)
    found = half_inputs.feeders(ast.parse(source), source)
    assert {name: [(f.line, f.model, f.index) for f in feeds] for name, feeds in found.items()} == {
        "evaluate": [(4, "net", 0), (5, "head", None)]
    }


def test_a_value_cast_back_to_float32_on_its_way_does_not_reach_the_model() -> None:
    source = """
    def train(model, extractor, img):
        prior = extractor(img.half()).float()
        other = extractor(img.half()).to(torch.float32)
        model(img, prior, other, extractor(img.half()).numpy())
        model(img.half().float())
    """
    assert _feeds(source, "model") == []


def test_halvings_are_casts_of_the_model_itself() -> None:
    source = textwrap.dedent("""
    def test(self, batch, fp16):
        if fp16:
            self.model.half()
            net = self.net.module.to(torch.float16)
        self.extractor.half()
        return self.model(batch.half())
    """)
    found = half_inputs.halvings(ast.parse(source), source, frozenset({"model", "net"}))
    assert [(f.line, f.cast, f.model, f.function) for f in found] == [
        (4, "self.model.half()", "self.model", "test"),
        (5, "self.net.module.to(torch.float16)", "self.net.module", "test"),
    ]


def test_parameter_owners_are_the_models_an_optimizer_is_made_for() -> None:
    source = """
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    groups = [p for n, p in self.model.module.named_parameters()]
    total = sum(p.numel() for p in self.parameters())
    """
    assert half_inputs.parameter_owners(ast.parse(textwrap.dedent(source))) == {"net", "model"}


def test_halvings_under_a_test_the_setup_needs_false_do_not_count() -> None:
    source = textwrap.dedent("""
    def main(args, model):
        if args.do_train:
            model = setup(model)
        if args.do_predict:
            if not args.do_train and args.fp16:
                model.half()
            if not args.local:
                model.half()
    """)
    found = half_inputs.halvings(ast.parse(source), source, frozenset({"model"}), frozenset({"args.do_train"}))
    assert [f.line for f in found] == [9]
