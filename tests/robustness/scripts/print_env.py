"""Prints the destinations tpuwatch allows viewers to write to (a user script)."""

import os

print("ALLOWED=" + os.environ.get("TPUWATCH_ALLOWED_DESTINATIONS", "<unset>"), flush=True)
