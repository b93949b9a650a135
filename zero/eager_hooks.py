"""Module hooks that torch.compile runs as they are, between the compiled pieces.

Stage 3's hooks (zero/stage3.py, zero/stage3_root_parts.py) report each unit's forward to the
C++ schedule. Traced by dynamo (a model compiled with its hooks on: engine.compile, the HF
Trainer's --torch_compile), each unit's hook would be compiled again for its unit number until
dynamo's recompile limit warned and gave up; DeepSpeed's hooks are torch.compiler.disable'd
for the same reason. That call imports torch._dynamo, 2.4 s of CPU that a job which never
compiles should not pay: a hook is wrapped only where dynamo is loaded already
(torch.compile loads it, and so does transformers); the hooks already on are wrapped when
it is (Stage3Hooks.make_hooks_eager, from engine.compile and from every engine forward: the
model compiled in place after initialize, engine.module.compile(), gets them wrapped too).
Not covered: a compiled wrapper made after initialize (torch.compile(engine.module), called
instead of the engine) whose hooks went on before dynamo was loaded; it runs, with the
hooks traced as before.
"""
import sys

import torch


def dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


def eager(hook):
    """`hook`, which torch.compile does not trace (this imports dynamo: call it where
    dynamo_loaded())."""
    return torch.compiler.disable(hook)
