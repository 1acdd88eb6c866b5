"""The examples' own options (``jobs.example.example_parser``, shared by ``make run`` and ``make
run-kafka``): ``--files`` takes a whole number of at least 1, defaults to the example's 12, and a
bad value is one line naming it, with argparse's exit code 2."""
from __future__ import annotations

import pytest

from jobs.example import EXAMPLE_FILES, example_parser


def test_files_defaults_to_the_examples_twelve_and_takes_a_smaller_count():
    parser = example_parser("the example", "out/example")
    assert parser.parse_args([]).files == EXAMPLE_FILES == 12
    assert parser.parse_args(["--files", "4"]).files == 4


@pytest.mark.parametrize("value", ["0", "-3", "four", "2.5"])
def test_a_bad_file_count_is_one_line_naming_it_with_exit_code_2(value, capsys):
    parser = example_parser("the example", "out/example")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--files", value])
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors == [f"{parser.prog}: error: argument --files: {value!r} is not a whole number "
                      "of at least 1"]
