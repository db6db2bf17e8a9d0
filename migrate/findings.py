"""Findings: what the engine tells the user about a file, with stable codes.

A finding either notes a rewrite that was made (``fixed=True``: nothing to do, but
numerics or behaviour may differ from Apex in a documented way) or asks for a human
(``fixed=False``: the construct was left as it was because no safe rewrite exists).
Every code has one entry in ``CODES``; the README's table of diagnostics is checked
against it by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One diagnostic at a 1-based line and column of the *input* source."""

    code: str
    line: int
    column: int
    message: str
    fixed: bool

    def format(self, path: str) -> str:
        return f"{path}:{self.line}:{self.column}: {self.code} {self.message}"


@dataclass(frozen=True)
class Code:
    """The documentation of one finding code."""

    name: str
    summary: str
    what_to_do: str
    fixed: bool


CODES: dict[str, Code] = {
    "AMP001": Code(
        "opt-level-numerics",
        "O2/O3 were migrated to torch.autocast + GradScaler, the nearest native recipe.",
        "Nothing, usually. Autocast keeps fp32 weights and runs per-op casts, where O2 kept "
        "fp16 weights with fp32 master copies and O3 ran everything in fp16: memory, speed and "
        "the last digits of the loss differ. Use `ampmigrate verify` to compare the two runs.",
        True,
    ),
    "AMP002": Code(
        "static-loss-scale",
        "A static loss_scale was migrated to a GradScaler held at that scale.",
        "Nothing, usually. Apex applied inf/NaN gradients under a static scale; GradScaler "
        "skips such a step instead (the scale is reset to the static value after each update). "
        "A run-time value is held the same way when it is a number, 1.0 included (Apex did not "
        'scale at all), and scales dynamically when it is "dynamic" (or None, at O1/O2).',
        True,
    ),
    "AMP003": Code(
        "loss-scale-bounds",
        "min_loss_scale / max_loss_scale have no GradScaler equivalent and were dropped.",
        "GradScaler grows without a cap and backs off without a floor. If you relied on the "
        "bounds, clamp after `scaler.update()` with `scaler.update(new_scale=...)`.",
        True,
    ),
    "AMP004": Code(
        "one-scaler-for-all-losses",
        "num_losses / loss_id were dropped: one GradScaler now serves every loss.",
        "Nothing, usually: one scaler for all losses is the documented torch pattern. Apex "
        "kept an independent scale per loss.",
        True,
    ),
    "AMP005": Code(
        "initialize-argument-not-migrated",
        "An amp.initialize argument has no safe native form here (cast_model_outputs, a "
        "loss_scale that is no number, a run-time loss_scale whose held value cannot reach "
        "every scaler.update, an unknown keyword).",
        "Read the message: decide the scaler's settings by hand and remove the argument.",
        False,
    ),
    "AMP006": Code(
        "loss-scale-parameter-at-default",
        "amp.initialize took its loss_scale from a parameter of its function that every call in the "
        "project leaves at its default: the GradScaler was made for that default.",
        "Nothing, for the project as it is. The parameter is no longer read: a call that passes "
        "another loss_scale needs the scaler made by hand (`init_scale=`, and "
        "`scaler.update(new_scale=...)` for a static scale).",
        True,
    ),
    "AMP010": Code(
        "initialize-shape-not-supported",
        "This amp.initialize call is not a plain assignment the tool can replace "
        "(returned, nested in an expression, or targets that do not match its arguments).",
        "Remove the call by hand (Apex returned the very objects it was given) and create "
        '`scaler = torch.amp.GradScaler("cuda")` where the training loop can reach it.',
        False,
    ),
    "AMP011": Code(
        "inference-only-initialize",
        "amp.initialize without optimizers (inference): Apex cast every op globally, "
        "there is no training step to anchor autocast to.",
        'Wrap the inference code in `with torch.autocast("cuda", dtype=torch.float16):` '
        "if you want fp16 inference; the call itself was removed.",
        True,
    ),
    "AMP012": Code(
        "global-casting-gone",
        "Apex O1 patched every op of the process, evaluation included; torch.autocast only "
        "covers the regions it wraps.",
        "If evaluation or inference code relied on running in fp16, wrap it in " "`torch.autocast` too.",
        True,
    ),
    "AMP013": Code(
        "float-function-body-in-float32",
        "A function decorated with amp.float_function now runs with autocast off: its whole body "
        "computes in float32.",
        "Nothing, usually: that is what the decorator asks for, and a custom kernel behind it sees the "
        "float32 inputs it saw under Apex. Under Apex O1 the float16-list ops the body called itself "
        "(matmul, conv, linear) still ran in float16; the body is now slower and more precise there.",
        True,
    ),
    "AMP020": Code(
        "forward-pass-not-found",
        "The forward pass feeding this amp.scale_loss could not be found, so no torch.autocast can be added and "
        "the amp setup stays as it was (a GradScaler over a float32 forward pass would not train like Apex).",
        "Compute the loss in the function that calls scale_loss (or pass it from the caller in the same file), "
        "then run ampmigrate again; or migrate by hand, wrapping the model call and the loss computation in "
        '`with torch.autocast("cuda", dtype=torch.float16):`.',
        False,
    ),
    "AMP021": Code(
        "scale-loss-shape-not-supported",
        "This amp.scale_loss use is not a `with amp.scale_loss(...) as scaled:` block the "
        "tool can rewrite (no `as` target, several context managers, __enter__ by hand).",
        "Rewrite it as `scaler.scale(loss).backward()` by hand.",
        False,
    ),
    "AMP022": Code(
        "scaler-not-reachable",
        "The GradScaler that replaces amp.initialize is not reachable here: this code is "
        "not in the function, class or call chain that creates it (or that amp.initialize "
        "could not be migrated, see its own finding).",
        "Pass the scaler to this function (or store it on an object this code can reach) "
        "and use `scaler.scale(loss)`, `scaler.step(optimizer)`, `scaler.update()`.",
        False,
    ),
    "AMP023": Code(
        "no-initialize-in-file",
        "amp is used here but amp.initialize is not called in this file, so there is no " "scaler to use.",
        "Migrate the file that calls amp.initialize first, then pass its GradScaler here.",
        False,
    ),
    "AMP024": Code(
        "clip-before-conditional-step",
        "Gradients are clipped after every backward pass but the optimizer steps only on some "
        "(gradient accumulation): GradScaler can unscale once per step, so the clip was not "
        "migrated.",
        "Move the clip under the step's condition, after `scaler.unscale_(optimizer)`: clip "
        "the accumulated gradients once, just before `scaler.step(optimizer)`.",
        False,
    ),
    "AMP025": Code(
        "amp-setup-left-as-it-was",
        "This Apex amp setup was left exactly as it was: part of it (in this file or in a module "
        "linked to it by imports) cannot be migrated, and migrating the rest alone would crash "
        "or train differently.",
        "Fix what the message names (its own finding says how), or migrate that part by hand, "
        "then run ampmigrate again on the whole project.",
        False,
    ),
    "AMP026": Code(
        "amp-from-unseen-binding",
        "An amp function is called on a name that no Apex import binds in this module (the amp "
        "module passed as a parameter, stored on an object, or brought in by a star import or "
        "a notebook's %run).",
        "Run ampmigrate on the whole project so the binding is found, or pass the GradScaler "
        "here instead of the amp module.",
        False,
    ),
    "AMP027": Code(
        "clip-on-scaled-gradients",
        "Gradients are clipped after every micro-batch while the optimizer steps only on some "
        "(gradient accumulation): the clip now acts on the still-scaled gradients with its "
        "threshold times `scaler.get_scale()` (and the norm it returns divided by it), which "
        "clips as Apex did on the unscaled ones (up to clip_grad_norm_'s eps of 1e-6, now compared with the scaled norm).",
        "Nothing. If you prefer to clip once per step, move the clip under the step's condition "
        "after `scaler.unscale_(optimizer)` (that changes training: Apex clipped every micro-batch).",
        True,
    ),
    "AMP028": Code(
        "gradients-read-twice-per-step",
        "Gradients are read (clipped, measured) at two places under different conditions before the same "
        "optimizer step, and no one place after the scaled backward runs before both: GradScaler can unscale "
        "only once per step, so the setup was left as it was.",
        "Call `scaler.unscale_(optimizer)` once right after the scaled backward (where Apex unscaled), read the "
        "gradients after it, then run ampmigrate again.",
        False,
    ),
    "AMP029": Code(
        "clip-of-float16-model-gradients",
        "Under Apex O2 the optimizer stepped float32 master copies, unscaled when scale_loss exited; a clip of "
        "the model's own parameters acted on its still-scaled float16 gradients, which nothing stepped. "
        "Natively the clip would act on the gradients that are stepped, so the setup was left as it was.",
        "Decide which update you want: drop the clip (Apex's update), or clip "
        "`amp.master_params(optimizer)` (what Apex documents, and what the migration clips after "
        "`scaler.unscale_(optimizer)`), then run ampmigrate again.",
        False,
    ),
    "AMP030": Code(
        "amp-module-used-as-value",
        "The apex amp module is stored, passed or compared as a value.",
        "Pass the GradScaler instead (or nothing: torch.amp is always available), then " "remove the apex import.",
        False,
    ),
    "AMP031": Code(
        "private-amp-state",
        "Private Apex state (amp._amp_state: its loss scalers, opt_properties, handle, ...) is used in a way "
        "the tool cannot rewrite exactly (another loss's scaler, a scale set away from amp.initialize, the "
        "LossScaler object itself, no GradScaler reachable); the message gives the code to write.",
        "Write the code the message gives (`scaler.get_scale()` for the loss scale, `init_scale=` on the "
        "GradScaler for a scale set after amp.initialize), then run ampmigrate again.",
        False,
    ),
    "AMP033": Code(
        "private-amp-state-migrated",
        "Private Apex state was migrated: a loss-scale read became `scaler.get_scale()`, a scale set right "
        "after amp.initialize the GradScaler's `init_scale`, a switch that only relaxed Apex's own checks "
        "(allow_incoming_model_not_fp32, hard_override, verbosity) was deleted.",
        "Nothing, usually. GradScaler changes its scale at `scaler.update()`, Apex at the end of each "
        "scale_loss block; without Apex's float32 check a model made float16 by hand fails in `scaler.unscale_`.",
        True,
    ),
    "AMP034": Code(
        "apex-version-fallback-removed",
        "The Apex branch of a torch version test (`if torch >= 1.6: <native> else: <Apex>`) was removed: it "
        "never runs on the torch the migrated code needs; the native branch took the test's place.",
        "Nothing: on torch 2.3 and newer the project ran its native branch already.",
        True,
    ),
    "AMP035": Code(
        "none-only-amp-folded",
        "A name or parameter (`amp`) only ever holds None once the Apex branch of a torch version test goes "
        "(AMP034): every call in the project gives it None or such a name. The code its function has for it "
        "(`if amp is not None: ...`, the Apex `else:` of `if scaler is not None:`) went.",
        "Nothing: that code ran only with an amp module, which nothing gives it on torch 2.3 and newer. The "
        "parameter stays, so callers that pass it keep working.",
        True,
    ),
    "AMP032": Code(
        "amp-api-not-migrated",
        "An apex.amp function without an automatic rewrite here (the old amp.init API, a cast function "
        "used as a value or in a shape the tool does not rewrite, ...).",
        "Write the replacement code the message gives; custom autograd Functions take "
        '`@torch.amp.custom_fwd(device_type="cuda", cast_inputs=...)`.',
        False,
    ),
    "AMP040": Code(
        "other-apex-module",
        "An Apex module other than amp (fp16_utils, parallel, optimizers, normalization, multi_tensor_apply, "
        "amp_C, contrib) is still used here; the tool could not rewrite this use.",
        "Write the replacement code the message gives (for example "
        "`torch.nn.parallel.DistributedDataParallel(module, broadcast_buffers=False, find_unused_parameters=True)`, "
        "`torch._foreach_mul_(xs, scale)`), or keep that piece of Apex installed.",
        False,
    ),
    "AMP041": Code(
        "apex-module-replaced",
        "An Apex DDP, fused optimizer, norm layer, SyncBatchNorm helper or multi-tensor kernel was replaced by "
        "its torch equivalent (or a plain-torch helper written into the module).",
        "Nothing, usually: the arithmetic is the same. Rounding can differ in the last digits (fused kernels, "
        "the order of a norm's sums), under autocast torch's LayerNorm returns float32 where Apex's "
        "FusedLayerNorm returned float16, and the message says what else changed.",
        True,
    ),
    "AMP042": Code(
        "apex-argument-without-equivalent",
        "This Apex optimizer, layer or DDP is called with an argument torch has no equivalent for "
        "(bias_correction=False, wd_after_momentum=True, adagrad_w_mode=True, channel_last=True, "
        "master_weights, gradient_average chosen at run time, an old or misspelt keyword); the call was left "
        "as it was.",
        "Write the replacement code the message gives for that argument, or keep that piece of Apex installed.",
        False,
    ),
    "AMP043": Code(
        "apex-presence-check",
        "`import apex` is only a check that Apex is installed: nothing in this module uses the name.",
        "Delete the import (with the `except ImportError` branch that guards it) once the project no longer "
        "needs Apex; keep it (with `# ampmigrate: skip`) while some code still does, for example a flag set "
        "beside it that picks an Apex layer elsewhere.",
        False,
    ),
    "AMP050": Code(
        "skipped-by-comment",
        "`# ampmigrate: skip` left this construct (or the whole file) as it was.",
        "Nothing: remove the comment to let the tool migrate it.",
        True,
    ),
}


def make_finding(code: str, line: int, column: int, message: str | None = None) -> Finding:
    """A finding whose ``fixed`` flag comes from the code's registry entry."""
    entry = CODES[code]
    return Finding(code, line, column, message or entry.summary, entry.fixed)
