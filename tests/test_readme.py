"""The README's set-up commands are exactly what CI runs."""
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        return fh.read()


def test_readme_commands_are_the_ci_commands():
    commands = re.findall(r"```bash\n(.*?)\n```", read("README.md"), flags=re.S)
    assert len(commands) == 2
    ci_lines = [line for line in read(".ci/run").splitlines() if line.startswith("python3 -m venv")]
    assert ci_lines == commands
