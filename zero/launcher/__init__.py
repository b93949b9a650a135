"""The ``zero`` launcher: ``zero [flags] script.py [args]``, used like ``deepspeed``.

Modules: runner (CLI), launch (per-node launcher), supervisor (process
supervision), hostfile (resources), env (environment rule), multinode
(ssh/pdsh/slurm/openmpi/mpich command lines). See docs/LAUNCHER.md.
"""
