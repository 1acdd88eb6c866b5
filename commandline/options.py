"""Command-line options declared once, as the fields of a frozen settings dataclass.

A field made by ``option`` carries everything its flag needs in its metadata: the help text, the
group it is listed under, and how argparse reads it (type, choices, metavar, action).
``add_options`` turns a settings class's fields into argparse arguments, group by group, and
``settings_from`` builds the frozen settings from what argparse parsed, so a command's run
context is that object (validated by its ``__post_init__``), not a mutated ``Namespace``.
``OneLineParser`` reports a bad command line as one ``error:`` line, not a usage block.

The generator's parameters (``generators.params``) are declared the same way; so are the
options the Spark jobs share (``jobs.settings``).
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Iterable, Mapping, Optional

from .exits import ExitCode


def option(default: Any = None, help: str = "", group: str = "", *, kind: str = "",
           choices: tuple = (), type: Optional[Callable[[str], Any]] = None,
           metavar: Optional[str] = None, action: Optional[str] = None, required: bool = False,
           **extra: Any) -> Any:
    """A dataclass field that is also a command-line option ``--<name-with-dashes>``.

    :param default: the value when the option is not given.
    :param help: the option's ``--help`` text (argparse's ``%(default)s`` works in it).
    :param group: the title of the ``--help`` section that lists it.
    :param kind: what the value is beyond its Python type (``duration``, ``probability``, ...),
        for the validation of the class that declares it; a ``duration`` shows ``DURATION``.
    :param choices: the values allowed, checked by argparse.
    :param type: converts the text argparse reads (default: the default's ``int`` or
        ``float`` type, else the text itself); its ``argparse.ArgumentTypeError`` is the
        one-line error.
    :param metavar: the value's name in ``--help``.
    :param action: an argparse action instead (``store_true``, ``append``).
    :param required: the option must be given.
    :param extra: more metadata for the declaring class (e.g. numeric bounds).
    """
    metadata = {"help": help, "group": group, "kind": kind, "choices": tuple(choices),
                "type": type, "metavar": metavar, "action": action, "required": required,
                **extra}
    return dataclasses.field(default=default, metadata=metadata)


def option_fields(cls: type, group: Optional[str] = None) -> list[dataclasses.Field]:
    """The fields of ``cls`` declared with ``option``, optionally one group's, in order.

    :param cls: the settings dataclass.
    :param group: the group whose fields to return; ``None``: every group's.
    """
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata
            and (group is None or f.metadata["group"] == group)]


def flag(f: dataclasses.Field) -> str:
    """The command-line flag of an option field: ``max_delay`` -> ``--max-delay``.

    :param f: the option field.
    """
    return "--" + f.name.replace("_", "-")


def add_options(parser: argparse.ArgumentParser, cls: type, titles: Mapping[str, str],
                skip: Iterable[str] = (), defaults: Optional[Mapping[str, Any]] = None) -> None:
    """Add every option field of ``cls`` to ``parser``, one argument group per group.

    :param parser: the command's parser.
    :param cls: a dataclass whose fields were declared with ``option``.
    :param titles: group -> section title, in the order the sections are listed; fields of
        groups not named here are left out.
    :param skip: names of fields not offered by this command.
    :param defaults: per-command defaults that replace the fields' own (shown by ``--help``).
    """
    skipped, defaults = set(skip), dict(defaults or {})
    for group, title in titles.items():
        fields = [f for f in option_fields(cls, group) if f.name not in skipped]
        if not fields:
            continue
        section = parser.add_argument_group(title)
        for f in fields:
            meta = f.metadata
            default = defaults.get(f.name, f.default)
            arguments: dict = {"dest": f.name, "default": default, "help": meta["help"]}
            action = meta.get("action")
            if action:
                arguments["action"] = action
            elif isinstance(default, bool):
                arguments["action"] = argparse.BooleanOptionalAction
            if action not in ("store_true", "store_false") and not isinstance(default, bool):
                kind = meta.get("type") or (type(default) if type(default) in (int, float)
                                            else None)
                if kind is not None:
                    arguments["type"] = kind
                if meta.get("choices"):
                    arguments["choices"] = meta["choices"]
                metavar = meta.get("metavar") or ("DURATION" if meta.get("kind") == "duration"
                                                  else None)
                if metavar is None and kind in (int, float):
                    metavar = "N" if kind is int else "X"
                if metavar is not None:
                    arguments["metavar"] = metavar
            if meta.get("required"):
                arguments["required"] = True
            section.add_argument(meta.get("flag") or flag(f), **arguments)


def settings_from(cls: type, namespace: argparse.Namespace, **values: Any) -> Any:
    """``cls`` built from the option fields argparse parsed, plus ``values``.

    :param cls: the settings dataclass.
    :param namespace: what ``parse_args`` returned for a parser built by ``add_options``.
    :param values: further fields (e.g. those a command does not offer as options).
    """
    given = {f.name: getattr(namespace, f.name) for f in option_fields(cls)
             if hasattr(namespace, f.name)}
    return cls(**{**given, **values})


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``<prog>: error: <message>``, exit 2.

    argparse prints the usage block before the error; with a few dozen options that block
    buries the one line that says what is wrong. ``--help`` still shows everything.
    """

    def error(self, message: str):
        """Exit with the usage exit code and ``message`` as one ``error:`` line.

        :param message: argparse's description of the problem.
        """
        self.exit(int(ExitCode.USAGE), f"{self.prog}: error: {' '.join(message.split())} "
                                       f"(see {self.prog} --help)\n")
