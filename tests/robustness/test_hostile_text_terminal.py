"""In a real terminal: `tpuwatch checkpoint RUN --dir '/etc/x[/]y...'`
from another shell, its refusal quoting the path (Textual markup, an OSC 0 title sequence)
reaches the open dashboard as text: the dashboard lives, the pane's title is untouched."""

from __future__ import annotations

import subprocess

import pytest
from robust_agent import start_agent
from robust_terminal import Tmux, have_tmux, tpuwatch_argv

from tpuwatch_testing import child_env

pytestmark = pytest.mark.tf


@pytest.mark.skipif(not have_tmux(), reason="needs tmux (apt-get install tmux)")
def test_a_hostile_checkpoint_path_reaches_the_dashboard_as_text(tmp_path):
    stop = tmp_path / "stop"
    agent = start_agent(tmp_path, "--steps", "1000000", "--step-sleep", "0.03", "--stop-file", str(stop))
    tmux = Tmux(tmp_path, width=200, height=48)
    try:
        agent.wait_listening()
        agent.wait_step(1)
        tmux.start("dash", tpuwatch_argv("attach", str(agent.run_dir)))
        tmux.wait_for("dash", "RUNNING", timeout=60)
        title = tmux._tmux("display-message", "-p", "-t", "dash", "#{pane_title}").strip()
        hostile = "/etc/x[/]y[lr=0.1]\x1b]0;pwned\x07"
        cli = subprocess.run(tpuwatch_argv("checkpoint", str(agent.run_dir), "--dir", hostile, "--timeout", "60"),
                             capture_output=True, text=True, timeout=120, env=child_env())
        assert cli.returncode != 0 and "Traceback" not in cli.stderr, (cli.stdout, cli.stderr)
        assert "\x1b" not in cli.stdout + cli.stderr
        assert "/etc/x[/]y[lr=0.1]\\x1b]0;pwned\\x07" in cli.stdout, cli.stdout
        screen = tmux.wait_for("dash", "/etc/x[/]y[lr=0.1]\\x1b]0;pwned", timeout=30)
        assert "checkpoint failed" in screen
        assert tmux._tmux("display-message", "-p", "-t", "dash", "#{pane_title}").strip() == title
        stop.touch()
        tmux.wait_for("dash", "FINISHED", timeout=120)  # the dashboard lived through it
        tmux.keys("dash", "q")
        assert tmux.dead_status("dash", timeout=30) == 0
        assert agent.wait(timeout=180) == 0, agent.output()
    finally:
        tmux.close()
        agent.kill()
