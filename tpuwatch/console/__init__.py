"""Plain-text output for the terminal, without Textual: headless progress lines, ``report``,
``ls`` and ``doctor``."""
