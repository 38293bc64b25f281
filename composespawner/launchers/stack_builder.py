"""The builder child: builds one stack's environment from the files on its stdin.

``python -I -m composespawner.launchers.stack_builder STACKS`` reads the stack's
source (:func:`~composespawner.launchers.stack_sources.source_body`) on stdin,
builds its environment under ``STACKS`` (:class:`~.environments.StackEnvironments`)
and says its progress and last word as JSON lines on stdout. Its parent decides as
whom and where it runs (:mod:`.stack_builds`): the build runs the request's code,
so never as root and never in the hub's or the agent's own process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from composespawner.launchers.environments import StackBuildError, StackEnvironments
from composespawner.launchers.stack_sources import (
    KEEP_SOURCES,
    materialise,
    prune_sources,
    source_of_body,
    stack_of,
)

SOURCES = ".sources"  # the builder's copies of the stacks' files, in the stacks folder


def build_here(
    stacks: Path, body: dict[str, object], say: Callable[[dict[str, object]], None]
) -> None:
    """Build the stack ``body`` names under ``stacks``, saying its progress."""
    source = source_of_body(body)  # checked by the side that started this builder
    folder = materialise(source, stacks / SOURCES)
    prune_sources(stacks / SOURCES, time.time() - KEEP_SOURCES, folder)  # one build at a time
    stack = stack_of(source, folder)
    assert stack.common is not None
    builder = StackEnvironments(stacks, stack.common)
    asyncio.run(
        builder.ensure(
            stack, lambda message, percent: say({"progress": message, "percent": percent})
        )
    )


def main() -> int:
    # What failed, with pip's last lines, to the parent's log (its stderr is ours); the
    # progress and the last word go on stdout, and the parent says what was built.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    def say(body: dict[str, object]) -> None:
        sys.stdout.write(json.dumps(body) + "\n")
        sys.stdout.flush()

    try:
        build_here(Path(sys.argv[1]), json.loads(sys.stdin.read()), say)
    except StackBuildError as e:
        say({"ok": False, "error": str(e)})
        return 1
    say({"ok": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
