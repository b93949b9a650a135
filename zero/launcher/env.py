"""The environment-forwarding rule (see docs/LAUNCHER.md, "Environment").

One rule for every launch mode:

* A process started *on the launcher's own machine* (single node, or each
  node's launcher under ``--no_ssh``) gets the launcher's full environment.
* A process started *on another machine* (ssh, pdsh, openmpi, mpich) gets
  that machine's own environment plus the launcher's variables whose name is
  in ``EXPORT_NAMES`` or starts with one of ``EXPORT_PREFIXES`` (except
  ``NEVER_EXPORTED``). slurm is the exception: ``srun --export=ALL`` forwards
  the launcher's full environment, as SLURM users expect.
* In both cases the variables of the env file (``.zero_env`` or
  ``.deepspeed_env``) are applied on top, so a value in the env file reaches
  every rank the same way, single node or multi node.
* Finally the launcher sets the rank variables (``RANK``, ``LOCAL_RANK``, ...).

Env file lookup, first hit wins: ``$ZERO_ENV_FILE`` (must exist if set), then
``./.zero_env``, ``./.deepspeed_env``, ``~/.zero_env``, ``~/.deepspeed_env``.
"""

import os
import re

EXPORT_PREFIXES = (
    "NCCL_", "PYTHON", "CUDA_", "TORCH_", "OMP_", "MKL_", "KMP_", "MASTER_", "ZERO_",
    "GLOO_", "UCX_", "FI_", "MV2_", "MLFLOW", "HF_", "TRANSFORMERS_", "WANDB_",
)
EXPORT_NAMES = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "CONDA_PREFIX", "VIRTUAL_ENV")
NEVER_EXPORTED = ("CUDA_VISIBLE_DEVICES",)   # per node: set by each node's launcher
ENV_FILE_NAMES = (".zero_env", ".deepspeed_env")
ENV_FILE_VARIABLE = "ZERO_ENV_FILE"

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvFileError(ValueError):
    """An env file line that cannot be parsed."""


def is_exported(name):
    """Whether ``name`` is forwarded from the launcher to remote nodes."""
    if name in NEVER_EXPORTED:
        return False
    return name in EXPORT_NAMES or name.startswith(EXPORT_PREFIXES)


def find_env_file(environ=None, cwd=None, home=None):
    """Path of the env file to use, or ``None`` (lookup order in the module doc)."""
    environ = os.environ if environ is None else environ
    explicit = environ.get(ENV_FILE_VARIABLE)
    if explicit:
        if not os.path.isfile(explicit):
            raise EnvFileError(f"{ENV_FILE_VARIABLE}={explicit} does not exist; "
                               f"point it at an env file or unset it")
        return explicit
    for folder in (cwd or os.getcwd(), home or os.path.expanduser("~")):
        for name in ENV_FILE_NAMES:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                return path
    return None


def read_env_file(path):
    with open(path, "r") as f:
        return parse_env_lines(f.readlines(), source=path)


def parse_env_lines(lines, source="<env file>"):
    """Parse ``NAME=value`` lines: ``#`` comments, blank lines, ``export NAME=...``,
    single or double quotes, ``=`` inside values. Values are taken literally
    (no ``$VAR`` expansion). A bad line raises ``EnvFileError`` naming file:line."""
    result = {}
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        name, eq, value = line.partition("=")
        name = name.strip()
        if not eq or not _NAME.match(name):
            raise EnvFileError(f"{source}:{lineno}: cannot parse {raw.strip()!r}; "
                               f"expected NAME=value (optionally 'export NAME=value')")
        try:
            result[name] = _parse_value(value.strip())
        except ValueError as e:
            raise EnvFileError(f"{source}:{lineno}: {e} in {raw.strip()!r}") from None
    return result


def _parse_value(text):
    if text[:1] in ("'", '"'):
        quote = text[0]
        end = text.find(quote, 1)
        if end < 0:
            raise ValueError(f"unterminated {quote} quote")
        rest = text[end + 1:].strip()
        if rest and not rest.startswith("#"):
            raise ValueError(f"unexpected text after the closing quote: {rest!r}")
        return text[1:end]
    # Unquoted: a ' #' starts a trailing comment.
    return re.split(r"\s+#", text, maxsplit=1)[0].strip()


def load_env_file(environ=None):
    """``(path, {name: value})`` of the env file, ``(None, {})`` if there is none."""
    path = find_env_file(environ)
    return (path, read_env_file(path)) if path else (None, {})


def local_env(environ, env_file_vars):
    """Environment for processes on the launcher's machine."""
    env = dict(environ)
    env.update(env_file_vars)
    return env


def remote_exports(environ, env_file_vars):
    """Variables to send to other machines: allow-listed ones plus the env file."""
    exports = {k: v for k, v in sorted(environ.items()) if is_exported(k)}
    exports.update(env_file_vars)
    return exports


# Set to "1" for the ranks when the launcher's own console is a terminal: a rank's output is a
# pipe to the launcher, so progress bars (offload/progress.py) ask this instead of isatty().
CONSOLE_IS_TTY = "ZERO_CONSOLE_IS_TTY"
