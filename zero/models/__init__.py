"""Small reference models used by the examples, tests and benchmarks."""
from .tiny_gpt import GPTConfig, TinyGPT

__all__ = ["GPTConfig", "TinyGPT"]
