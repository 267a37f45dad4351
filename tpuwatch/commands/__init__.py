"""One module per ``tpuwatch`` command. Each has ``add_parser(commands)``, which adds its
sub-parser (its options and help), and ``main(ns) -> int``, its flow; :mod:`tpuwatch.cli`
assembles the parser and dispatches. What several commands share has a module of its own:
:mod:`.lines` (one-line messages), :mod:`.streams` (stdout/stderr guards, the output copier),
:mod:`.interrupts` (Ctrl-C escalation), :mod:`.outlets` (--notify/--metrics/--tensorboard),
:mod:`.dashboard` (opening the dashboard on a run).

Nothing heavy is imported at module level: ``tpuwatch --help`` imports every command module
and must stay fast and free of TensorFlow and Textual.
"""
