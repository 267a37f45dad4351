"""Where a viewer's messages come from: a run directory's recording, a group of workers, an
agent's TCP port, or a replay. Every source satisfies :class:`tpuwatch.sources.source.Source`;
the dashboard and headless mode consume them alike. No Textual here."""
