"""The building blocks of the config schema (zero/config/schema.py): the engine features a
value may need, the kinds of keys, `Key` and `Block`, the constructors the schema's tables are
written with, and the sanity bounds of numbers.

Support status has two levels:

* per key: ``supported=False`` marks a DeepSpeed key zero does not implement
  (and has no plan to yet). Such a key is accepted only at its DeepSpeed
  default (which describes what zero does anyway); any other value is
  rejected as "not supported yet". Unsupported DeepSpeed *sections*
  (``sparse_attention``, ``amp``, ...) are accepted only while
  inert (see ``SECTION``).
* per value: ``feature`` / ``value_features`` name an engine feature that is
  declared but not built yet (ZeRO stage 3, offload, NVMe). A value that needs
  a feature is rejected unless the caller enabled it, see ``BUILT_FEATURES``.
"""

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

# --------------------------------------------------------------------------- features

FEATURE_STAGE3 = "stage3"  # ZeRO stage 3 (parameter partitioning), persistence, 16-bit save
FEATURE_OFFLOAD = "offload"  # offload optimizer state and the optimizer step to CPU memory
FEATURE_OFFLOAD_PARAM = "offload_param"  # stage-3 parameters in CPU memory
FEATURE_OFFLOAD_PARAM_NVME = "offload_param_nvme"  # stage-3 parameters on NVMe
FEATURE_NVME = "nvme"  # optimizer state on NVMe, and the aio block that tunes it

ALL_FEATURES = frozenset({FEATURE_STAGE3, FEATURE_OFFLOAD,
                          FEATURE_OFFLOAD_PARAM, FEATURE_OFFLOAD_PARAM_NVME,
                          FEATURE_NVME})

# The features the engine implements today. When one lands, add it here (one
# line) and regenerate docs/CONFIG.md with `python -m zero.config.docs`.
BUILT_FEATURES: frozenset = frozenset({FEATURE_STAGE3, FEATURE_OFFLOAD, FEATURE_NVME,
                                       FEATURE_OFFLOAD_PARAM, FEATURE_OFFLOAD_PARAM_NVME})

# --------------------------------------------------------------------------- key kinds

BOOL = "bool"
INT = "int"  # also accepts integral floats such as 5e8
FLOAT = "float"  # also accepts ints
STR = "str"
CHOICE = "choice"  # a string from `choices`
BETAS = "betas"  # [beta1, beta2]
BLOCK = "block"  # a nested object described by `block`
PARAMS = "params"  # a nested object whose schema depends on the sibling "type"
SECTION = "section"  # an unsupported DeepSpeed block; accepted only while inert
OBJECT = "object"  # a free-form object (only used by unsupported keys)
STRINGS = "strings"  # a list of strings, each one of `choices`

REQUIRED = object()  # default of keys that must be given


@dataclass(frozen=True)
class Key:
    """One config key.

    Attributes:
        name: the JSON key.
        kind: one of the kinds above.
        default: value used when the key is absent (REQUIRED: must be given).
        doc: one-line description (ends up in docs/CONFIG.md).
        choices: allowed strings for CHOICE keys (canonical spelling).
        minimum / maximum: inclusive bounds for numbers (see the *_exclusive flags).
        nullable: JSON null is a legal value.
        ignore_case: CHOICE values are matched case-insensitively and canonicalised.
        auto: what the string "auto" means for this key; None rejects "auto".
            An accepted "auto" always resolves to `default`.
        supported: False for DeepSpeed keys zero does not implement: only the
            default value is accepted.
        feature: engine feature needed for any non-default value.
        value_features: (value, feature) pairs: these values need that feature.
        unsupported_choices: known DeepSpeed values zero does not implement
            (reported as "not supported yet" instead of "unknown").
        block: sub-schema of a BLOCK key.
        variants: sub-schemas of a PARAMS key, by the sibling "type" value.
        default_doc: how docs show the default when it is computed.
    """

    name: str
    kind: str
    default: Any = None
    doc: str = ""
    choices: Tuple[str, ...] = ()
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    minimum_exclusive: bool = False
    maximum_exclusive: bool = False
    nullable: bool = False
    ignore_case: bool = False
    auto: Optional[str] = None
    supported: bool = True
    feature: Optional[str] = None
    value_features: Tuple[Tuple[Any, str], ...] = ()
    unsupported_choices: Tuple[str, ...] = ()
    block: Optional["Block"] = None
    variants: Optional[Mapping[str, "Block"]] = None
    default_doc: Optional[str] = None

    @property
    def required(self):
        return self.default is REQUIRED


@dataclass(frozen=True)
class Block:
    """A JSON object: its dotted path (for messages and docs) and its keys."""

    path: str
    doc: str
    keys: Tuple[Key, ...]

    def get(self, name):
        for key in self.keys:
            if key.name == name:
                return key
        return None

    @property
    def names(self):
        return [key.name for key in self.keys]


# --------------------------------------------------------------------------- key constructors


def boolean(name, default, doc, **kw):
    return Key(name, BOOL, default, doc, **kw)


def integer(name, default, doc, **kw):
    return Key(name, INT, default, doc, **kw)


def number(name, default, doc, **kw):
    return Key(name, FLOAT, default, doc, **kw)


def choice(name, default, choices, doc, **kw):
    return Key(name, CHOICE, default, doc, choices=tuple(choices), **kw)


def unsupported(kind, name, default, doc, **kw):
    """A DeepSpeed key zero does not implement: only its DeepSpeed default is accepted."""
    return Key(name, kind, default, doc, supported=False, **kw)


def section(name, doc):
    """A DeepSpeed top-level block zero does not implement."""
    return Key(name, SECTION, None, doc, supported=False, nullable=True)


def nested(name, block, doc, optional=False):
    """A nested block. Absent or null means: all defaults ({}), or None when `optional`."""
    return Key(name, BLOCK, None if optional else {}, doc, block=block, nullable=True)


# What an accepted "auto" means for most keys. (The HF Trainer fills "auto" in from the
# model and its own arguments before DeepSpeed sees the config; DeepSpeed's own config
# classes drop "auto" and use the default. zero does the latter.)
AUTO_DEFAULT = "the default"
# Upper bounds (issue #14). DeepSpeed bounds almost nothing from above (its pydantic models say ge=0
# and stop), so these are sanity bounds: every value above one is a typo or cannot work, and every
# value a real DeepSpeed config uses stays below it. tests/test_config.py walks the schema and
# requires every supported number to have one, or to be in its commented UNBOUNDED allow-list.
MAX_ELEMENTS = 1 << 40  # tensor elements (~1.1e12: 4 TiB of fp32 on one rank); DeepSpeed's own
#                         sample config writes sub_group_size 1e12, its defaults are 1e9 at most
MAX_SAMPLES = (1 << 31) - 1  # samples per batch
MAX_STEPS = 10 ** 12  # optimizer steps: 31 years at one step per millisecond
MAX_INT64 = (1 << 63) - 1  # keys whose huge values mean "never"/"no cap" (sys.maxsize on 64-bit):
#                            real configs write steps_per_print 1e10, 1e12, 999999999999 for never
MAX_BUFFERS = 1024  # host buffers / collectives in flight (defaults 2 to 5)
MAX_LOSS_SCALE = 2.0 ** 127  # the largest power of two in fp32, as initial_scale_power <= 127
MAX_AIO_BLOCK = (1 << 31) - 4096  # DeepSpeed's aio handle takes block_size as a C int: the largest
#                                   multiple of 4096 (the O_DIRECT alignment) that fits one
