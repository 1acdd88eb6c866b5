"""What every command of the project shares, with no Spark in it: exit codes and one-line
errors (``exits``), checks of the directories a command reads and writes (``paths``), and
SIGINT/SIGTERM as requests to stop (``signals``).

The Spark jobs (``jobs``) and the generator CLI (``generators.cli``) both use it, so a user sees
the same ``error:`` lines and exit codes from every command. It imports nothing else of the
project.
"""
