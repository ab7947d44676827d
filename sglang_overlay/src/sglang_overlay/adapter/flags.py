"""The three DDTree flags, added to SGLang's own argument parser.

Hooks (registered with SGLang's ``HookRegistry``, applied by ``load_plugins()``):

* AFTER ``ServerArgs.add_cli_args``: add the flags to the parser SGLang builds, so they parse
  strictly with every other flag (an unknown flag still exits 2; a bad value exits 2 with
  argparse's message naming the flag).
* AROUND ``ServerArgs.from_cli_args``: ``ServerArgs`` is a closed record (msgspec Struct), so the
  flag values ride on it as bookkeeping (``_ddtree_cli``), which SGLang pickles to its child
  processes with the record. When the algorithm is DDTREE, the settings are resolved right away
  (flags > environment > defaults), so a bad environment value fails the dry parse too.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from . import settings as s

CLI_BOOKKEEPING_ATTR = "_ddtree_cli"


def _positive_int_arg(raw: str) -> int:
    try:
        return s.parse_positive_int(raw, "value")
    except s.DDTreeConfigError:
        # argparse prefixes "argument --speculative-ddtree-...: ".
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {raw!r}") from None


def _budget_arg(raw: str) -> Any:
    try:
        return s.parse_budget(raw, "value")
    except s.DDTreeConfigError as err:
        raise argparse.ArgumentTypeError(
            f"must be an integer in 1..{s.MAX_BUDGET} or a schedule BATCH_SIZE:BUDGET,... ({err}), got {raw!r}"
        ) from None


def add_ddtree_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add the DDTree flags to ``parser`` (idempotent)."""
    if any(s.FLAG_BUDGET in action.option_strings for action in parser._actions):
        return
    group = parser.add_argument_group(
        "DDTree speculative decoding (ddtree-sglang-overlay; with --speculative-algorithm DDTREE)"
    )
    group.add_argument(
        s.FLAG_BUDGET,
        dest=s.DEST_BUDGET,
        type=_budget_arg,
        default=None,
        metavar="N|BS:N,...",
        help=(
            f"Tree node budget besides the root (1..{s.MAX_BUDGET}), or a schedule by batch size such as "
            "'1:127,4:63,16:15,48:7' (a step of bs requests takes the first entry with BS >= bs, the "
            "last above them all, and verifies N + 1 tokens per request). Default: the DFlash block "
            f"- 1 (15 for block size 16). Env: {s.ENV_BUDGET}."
        ),
    )
    group.add_argument(
        s.FLAG_TOP_K,
        dest=s.DEST_TOP_K,
        type=_positive_int_arg,
        default=None,
        metavar="K",
        help=(
            f"Candidates per draft position the tree may branch over (1..{s.MAX_TOP_K}). "
            f"Default: {s.DEFAULT_TOP_K} up to budget 64, then about budget / 8 (at most 32). Env: {s.ENV_TOP_K}."
        ),
    )
    group.add_argument(
        s.FLAG_ALLOW_HYBRID,
        dest=s.DEST_ALLOW_HYBRID,
        action="store_true",
        default=None,
        help=(
            "Run DDTREE on a hybrid (Mamba / linear-attention) target anyway; unsupported and "
            f"untested. Default: refuse. Env: {s.ENV_ALLOW_HYBRID}=1."
        ),
    )


def cli_flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The DDTree flag values of a parsed namespace (None where a flag was not given)."""
    return {dest: getattr(args, dest, None) for dest in (s.DEST_BUDGET, s.DEST_TOP_K, s.DEST_ALLOW_HYBRID)}


def is_ddtree_name(name: Any) -> bool:
    return isinstance(name, str) and name.strip().upper() == s.ALGORITHM_NAME


# ---- HookRegistry hooks -------------------------------------------------------------------


def after_add_cli_args(result, parser, *args, **kwargs):
    """AFTER hook of the staticmethod ``ServerArgs.add_cli_args(parser)``."""
    add_ddtree_cli_args(parser)
    return result


def around_from_cli_args(original, cls, args, *rest, **kwargs):
    """AROUND hook of the classmethod ``ServerArgs.from_cli_args(cls, args)``."""
    record = original(cls, args, *rest, **kwargs)
    flags = cli_flag_values(args)
    # Bookkeeping (leading underscore, not a field): allowed on the record and pickled with it.
    setattr(record, CLI_BOOKKEEPING_ATTR, flags)
    if is_ddtree_name(getattr(record, "speculative_algorithm", None)):
        s.resolve_settings(flags, os.environ)  # raises DDTreeConfigError naming flag/variable
    return record
