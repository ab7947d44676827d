"""DDTree speculative decoding for SGLang 0.5.23 (overlay package).

Importing this package imports neither torch nor sglang.
"""

__version__ = "0.1.0"
