"""The Textual dashboard. Import :mod:`tpuwatch.ui.app` for :func:`run_dashboard`; this package
init imports nothing so that ``tpuwatch --help`` stays fast."""
