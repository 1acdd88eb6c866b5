"""Checks of the directories a command reads and writes, made before any work starts.

Each raises a ``Failure`` whose message names the option, the path, what is wrong with it and
what to do instead, so that a mistyped path costs a second, not a Spark start and a traceback.
Remote paths (``scheme://...``) are left to the storage system and not checked.
"""
from __future__ import annotations

import os
from pathlib import Path

from .exits import ExitCode, Failure


def is_remote(path: str) -> bool:
    """True for a URI such as ``hdfs://...`` or ``s3a://...``, which only Spark can check."""
    return "://" in str(path)


def check_writable_dir(path: str, option: str, code: ExitCode) -> None:
    """Refuse ``path`` unless it is a directory this user can write, or can be created as one.

    :param path: the directory (created later by whoever writes it).
    :param option: the command-line option that named it, quoted in the message.
    :param code: the exit code of the failure (e.g. ``ExitCode.OUTPUT``).
    :raises Failure: ``path`` is a file, lies under a file, or cannot be written.
    """
    if is_remote(path):
        return
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise Failure(code, f"{option} {path} is a file, not a directory; give a directory "
                            "(it is created if missing)")
    existing = target.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise Failure(code, f"{option} {path} cannot be created: {existing} is a file; give a "
                            "directory path outside it")
    if not os.access(existing, os.W_OK | os.X_OK):
        problem = ("is not writable" if existing == target.absolute()
                   else f"cannot be created: {existing} is not writable")
        raise Failure(code, f"{option} {path} {problem} by this user; choose a writable "
                            "directory or change its permissions")


def check_readable_dir(path: str, option: str, code: ExitCode) -> None:
    """Refuse ``path`` unless it is a directory this user can list and read.

    :param path: the directory.
    :param option: the command-line option that named it, quoted in the message.
    :param code: the exit code of the failure (e.g. ``ExitCode.INPUT``).
    :raises Failure: ``path`` is missing, not a directory, or not readable.
    """
    if is_remote(path):
        return
    target = Path(path)
    if not target.is_dir():
        raise Failure(code, f"{option} {path} is not a directory; give the directory that "
                            "holds the input files")
    if not os.access(target, os.R_OK | os.X_OK):
        raise Failure(code, f"{option} {path} cannot be read by this user (permission denied); "
                            "change its permissions or run as a user who can read it")
