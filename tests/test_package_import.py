"""What `import zero` loads: nothing heavy until it is used. The launcher and a rank's start-up
never need torch (seconds of a short job); the API, submodules and the compiled core load on
first use. Each case runs in a fresh interpreter, where nothing has been imported yet."""
import subprocess
import sys

from distributed_harness import subprocess_env


def run_python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_the_launcher_imports_without_torch_or_the_engine():
    loaded = run_python("import sys, zero.launcher.runner\n"
                        "print(sorted(m for m in ('torch', 'zero.engine', 'zero._C') "
                        "if m in sys.modules))")
    assert loaded == "[]"


def test_the_api_loads_on_first_use():
    out = run_python("import sys, zero\n"
                     "print('torch' in sys.modules, zero.initialize.__module__, "
                     "zero.GatheredParameters.__module__, 'torch' in sys.modules)")
    assert out == "False zero.api zero.stage3 True"


def test_the_compiled_core_imports_first_with_torch_loaded_before_it():
    out = run_python("import sys\nfrom zero import _C\n"
                     "print('torch' in sys.modules, hasattr(_C, 'EngineCore'))")
    assert out == "True True"


def test_a_submodule_named_as_an_attribute_loads_and_a_misspelling_is_an_error():
    out = run_python("import zero\nprint(zero.checkpoint.__name__)\n"
                     "try:\n    zero.initialise\nexcept AttributeError as e:\n    print(e)")
    assert out.splitlines() == ["zero.checkpoint",
                                "module 'zero' has no attribute 'initialise'"]


def test_the_exit_grace_is_registered_by_the_package_import_alone():
    out = run_python("import sys, zero\nprint('zero.clean_exit' in sys.modules)")
    assert out == "True"
