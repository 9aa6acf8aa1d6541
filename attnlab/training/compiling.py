"""When ``torch.compile`` pays off: the rule behind ``--compile auto`` (the default).

Compiling costs a fixed time up front (tracing, and on a CPU building C++ kernels with the
system compiler) and then makes each step a little faster (fused LayerNorm/GELU/residual
kernels, fewer allocations). It pays off when the time it saves over the rest of the run is
larger than what it costs:

    remaining_steps × step_seconds × (1 − 1/speedup)  >  MARGIN × compile_seconds

The constants are measured (``benchmarks/gpt_speed.py --compile``, table in ``benchmarks/README.md``);
the step time is measured at the start of the run itself, so the rule adapts to the machine.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import torch

# Steady-state speed-up of a compiled training step over eager, and the one-off cost of
# compiling (forward + backward graphs), per device type. CPU, measured on 2 cores (GPT 4/4/128
# and 6/6/384, fp32, six same-run comparisons): 0.88-1.20x, median 1.07x; 30 s to compile the
# first time, 2-13 s once inductor's cache holds the kernels. So on a CPU compiling is chosen
# only for runs of a quarter of an hour or more. CUDA: the usual figures for small transformers
# (no GPU was lent to measure ours).
EXPECTED_SPEEDUP = {"cpu": 1.07, "cuda": 1.3}
COMPILE_SECONDS = {"cpu": 30.0, "cuda": 60.0}
# Compile only when it saves at least this many times its cost: the estimates are rough, and a
# near tie is not worth a minute of waiting before the first fast step.
MARGIN = 2.0
# Eager steps timed (after the first, which warms caches up) before deciding.
PROBE_STEPS = 5


@dataclass(frozen=True)
class CompileChoice:
    on: bool
    reason: str


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on a CPU ($CXX, else c++/g++/clang++), or None."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def can_compile(device: torch.device) -> str | None:
    """Why torch.compile cannot run here, or None when it can."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    if device.type == "cpu" and cpp_compiler() is None:
        return "no C++ compiler found (set CXX or install g++)"
    if device.type not in EXPECTED_SPEEDUP:
        return f"compile is not tuned for {device.type}"
    return None


def pays_off(
    remaining_steps: int, step_seconds: float, device: torch.device, dtype: torch.dtype | None = torch.float32
) -> CompileChoice:
    """Whether compiling now would shorten a run with ``remaining_steps`` steps of
    ``step_seconds`` each (measured eager, in ``dtype``), with the arithmetic as the reason."""
    blocked = can_compile(device)
    if blocked:
        return CompileChoice(False, blocked)
    if device.type == "cpu" and dtype == torch.bfloat16:
        # measured: compiled bf16-autocast steps ran at 0.70-1.03x of eager (median 0.94x, four comparisons)
        return CompileChoice(False, "off: under bf16 autocast a compiled CPU step is slower than eager")
    kind = device.type
    speedup, cost = EXPECTED_SPEEDUP[kind], COMPILE_SECONDS[kind]
    saved = remaining_steps * step_seconds * (1 - 1 / speedup)
    on = saved > MARGIN * cost
    verdict = "on" if on else "off"
    return CompileChoice(
        on,
        f"{verdict}: {remaining_steps} steps left × {step_seconds * 1e3:.0f} ms would save about "
        f"{saved:.0f} s at {speedup}× against about {cost:.0f} s to compile "
        f"({'more' if on else 'less'} than {MARGIN:g}× that)",
    )


def on_from_start(device: torch.device, static_shapes: bool) -> CompileChoice | None:
    """``--compile auto`` before the first step: on CUDA, compiling pays back within minutes, so it
    is on from the start (the model and its loss, one graph) for a task whose batches keep their
    shape; None elsewhere: the timing rule (:func:`pays_off`) decides after a few steps."""
    if device.type != "cuda":
        return None
    if not static_shapes:
        return CompileChoice(False, "off: this task's batches change shape from step to step")
    blocked = can_compile(device)
    if blocked:
        return CompileChoice(False, f"off: {blocked}")
    return CompileChoice(True, "on: the default on CUDA (the model and its loss, one graph)")
