"""How a FLOPs profile is printed: DeepSpeed's number formats and report layout.

The functions here only turn numbers into text; measuring is done by
:class:`zero.profiling.FlopsProfiler`. Every ``*_lines`` function returns a list of lines
(without newlines) so the report can go to stdout or to a file unchanged.
"""
from __future__ import annotations

from collections import defaultdict

DEFAULT_PRECISION = 2

_MAGNITUDES = {"T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "": 1.0, "m": 1e-3, "u": 1e-6}

HEADER = "-------------------------- DeepSpeed Flops Profiler --------------------------"
AGGREGATED_HEADER = "----------------------------- Aggregated Profile per GPU -----------------------------"
DETAILED_HEADER = "------------------------------ Detailed Profile per GPU ------------------------------"
FOOTER = "------------------------------------------------------------------------------"

NOTATIONS = """Notations:
data parallel size (dp_size), model parallel size(mp_size),
number of parameters (params), number of multiply-accumulate operations(MACs),
number of floating-point operations (flops), floating-point operations per second (FLOPS),
fwd latency (forward propagation latency), bwd latency (backward propagation latency),
step (weights update latency), iter latency (sum of fwd, bwd and step latency)
flops are counted by torch.utils.flop_counter: only operators with a FLOP formula
(matmul, convolution, attention, ...) are counted; elementwise operators, norms,
activations and softmax are not (DeepSpeed's profiler counts those too)
"""

DETAILED_NOTES = """Each module profile is listed after its name in the following order:
params, percentage of total params, MACs, percentage of total MACs, fwd latency, percentage of total fwd latency, fwd FLOPS

Note: 1. A module can have torch.nn.module or torch.nn.functional to compute logits (e.g. CrossEntropyLoss). They are not counted as submodules, thus not to be printed out. However they make up the difference between a parent's MACs (or latency) and the sum of its submodules'.
2. Number of floating-point operations is a theoretical estimation, thus FLOPS computed using that could be larger than the maximum system throughput.
3. The fwd latency listed in the top module's profile is directly captured at the module forward function in PyTorch, thus it can be less than the fwd latency shown above when that one is measured by the engine.
"""

_LINE = "{:<70}  {:<8}"


def number_to_string(num, units=None, precision=DEFAULT_PRECISION):
    """``num`` scaled to ``units`` (T, G, M, K, "", m, u; chosen from ``num`` when None)."""
    if units is None:
        units = _auto_units(num)
    magnitude = _MAGNITUDES.get(units, 1.0)
    return f"{round(num / magnitude, precision):g} {units}"


def _auto_units(num):
    if num == 0:
        return ""
    for units, magnitude in _MAGNITUDES.items():
        if num >= magnitude:
            return units
    return "u"


def macs_to_string(macs, units=None, precision=DEFAULT_PRECISION):
    return f"{number_to_string(macs, units=units, precision=precision)}MACs"


def flops_to_string(flops, units=None, precision=DEFAULT_PRECISION):
    return f"{number_to_string(flops, units=units, precision=precision)}FLOPS"


def params_to_string(params, units=None, precision=DEFAULT_PRECISION):
    """Parameter counts use B (billions) where other numbers use G."""
    units = units.replace("B", "G") if units else units
    return number_to_string(params, units=units, precision=precision).replace("G", "B").strip()


def duration_to_string(duration, units=None, precision=DEFAULT_PRECISION):
    return f"{number_to_string(duration, units=units, precision=precision)}s"


def _percent(part, total):
    return round(100 * part / total, DEFAULT_PRECISION) if total else 0


def _rate(flops, seconds):
    return flops / seconds if seconds else 0


def summary_lines(*, params, flops, macs, fwd_latency, world_size=1, batch_size=None,
                  bwd_latency=None, step_latency=None, recompute_fwd_factor=0.0):
    """The "Profile Summary" block: sizes, totals, latencies and throughput per GPU."""
    mp_size = 1
    lines = [_LINE.format("world size: ", world_size),
             _LINE.format("data parallel size: ", world_size // mp_size),
             _LINE.format("model parallel size: ", mp_size)]
    if batch_size is not None:
        lines.append(_LINE.format("batch size per GPU: ", batch_size))
    lines += [
        _LINE.format("params per GPU: ", params_to_string(params)),
        _LINE.format("params of model = params per GPU * mp_size: ", params_to_string(params * mp_size)),
        _LINE.format("fwd MACs per GPU: ", macs_to_string(macs)),
        _LINE.format("fwd flops per GPU: ", number_to_string(flops)),
        _LINE.format("fwd flops of model = fwd flops per GPU * mp_size: ", number_to_string(flops * mp_size)),
        _LINE.format("fwd latency: ", duration_to_string(fwd_latency)),
        _LINE.format("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ",
                     flops_to_string(_rate(flops, fwd_latency))),
    ]
    bwd_factor = 2 + recompute_fwd_factor
    if bwd_latency is not None:
        lines += [
            _LINE.format("bwd latency: ", duration_to_string(bwd_latency)),
            _LINE.format(f"bwd FLOPS per GPU = {bwd_factor:g} * fwd flops per GPU / bwd latency: ",
                         flops_to_string(_rate(bwd_factor * flops, bwd_latency))),
            _LINE.format(f"fwd+bwd FLOPS per GPU = {bwd_factor + 1:g} * fwd flops per GPU "
                         "/ (fwd+bwd latency): ",
                         flops_to_string(_rate((bwd_factor + 1) * flops, fwd_latency + bwd_latency))),
        ]
    iter_latency = fwd_latency + (bwd_latency or 0.0) + (step_latency or 0.0)
    if step_latency is not None:
        lines += [
            _LINE.format("step latency: ", duration_to_string(step_latency)),
            _LINE.format("iter latency: ", duration_to_string(iter_latency)),
            _LINE.format(f"FLOPS per GPU = {bwd_factor + 1:g} * fwd flops per GPU / iter latency: ",
                         flops_to_string(_rate((bwd_factor + 1) * flops, iter_latency))),
        ]
    if batch_size is not None:
        samples = _rate(batch_size * world_size, iter_latency)
        lines.append(_LINE.format("samples/second: ", round(samples, DEFAULT_PRECISION)))
    return lines


def aggregated_lines(profiles, module_depth=-1, top_modules=1):
    """The top ``top_modules`` module classes by params, MACs and fwd latency at each depth.

    ``profiles`` maps qualified module names to ModuleProfile. Modules of one class at one
    depth are summed, as DeepSpeed does. Depths 0 to ``module_depth`` are listed (all for -1).
    """
    by_depth = defaultdict(lambda: defaultdict(lambda: [0, 0, 0.0]))  # class -> [params, macs, s]
    for profile in profiles.values():
        totals = by_depth[profile.depth][profile.class_name]
        totals[0] += profile.params
        totals[1] += profile.macs
        totals[2] += profile.duration_s
    deepest = max(by_depth) if by_depth else 0
    last = deepest if module_depth == -1 else min(module_depth, deepest)
    lines = [f"Top {top_modules} modules in terms of params, MACs or fwd latency at different model depths:"]
    for depth in range(last + 1):
        classes = by_depth[depth]
        lines.append(f"depth {depth}:")
        for label, index, to_string in (("params     ", 0, params_to_string),
                                        ("MACs       ", 1, macs_to_string),
                                        ("fwd latency", 2, duration_to_string)):
            top = sorted(classes.items(), key=lambda item: item[1][index], reverse=True)[:top_modules]
            lines.append(f"    {label} - {dict((name, to_string(v[index])) for name, v in top)}")
    return lines


def module_summary(profile, total):
    """One module's numbers, comma separated, as DeepSpeed appends them to the module's repr."""
    items = [
        f"{params_to_string(profile.params)} = {_percent(profile.params, total.params):g}% Params",
        f"{macs_to_string(profile.macs)} = {_percent(profile.macs, total.macs):g}% MACs",
        f"{duration_to_string(profile.duration_s)} = "
        f"{_percent(profile.duration_s, total.duration_s):g}% latency",
        flops_to_string(round(_rate(profile.flops, profile.duration_s), DEFAULT_PRECISION)),
    ]
    if profile.extra_repr:
        items.append(profile.extra_repr)
    return ", ".join(items)


def detailed_lines(profiles, module_depth=-1):
    """The module tree in ``print(model)`` form, each module carrying its profile.

    Modules deeper than ``module_depth`` (-1: no limit) are left out; a module at the limit
    is printed on one line.
    """
    children = defaultdict(list)
    for name in profiles:
        if name:
            children[name.rpartition(".")[0]].append(name)
    total = profiles[""]
    lines = []

    def render(name, prefix, indent):
        profile = profiles[name]
        head = f"{indent}{prefix}{profile.class_name}("
        shown = children[name] if module_depth == -1 or profile.depth < module_depth else []
        if not shown:
            lines.append(f"{head}{module_summary(profile, total)})")
            return
        lines.append(head)
        lines.append(f"{indent}  {module_summary(profile, total)}")
        for child in shown:
            render(child, f"({child.rpartition('.')[2]}): ", indent + "  ")
        lines.append(f"{indent})")

    render("", "", "")
    return lines
