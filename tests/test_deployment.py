"""The deployment examples name real commands and real settings (docs/deployment.md).

The systemd units' commands are manage.py commands that exist and a gunicorn that serves
the app's WSGI module; the web unit's gunicorn command really serves a page and a static
file; every setting the environment example and the guide name is one settings.py reads,
and the example's values load.
"""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib.util import find_spec
from pathlib import Path

import pytest
from django.core.management import get_commands

from tests.conftest import NO_AGENTS_FILE

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
ENV_EXAMPLE = ROOT / "deploy" / "replays.env.example"
GUIDE = ROOT / "docs" / "deployment.md"
# Where the units expect the checkout and its virtual environment.
APP = "/srv/replays/app"
VENV_BIN = Path(sys.executable).parent
# Read by manage.py and the WSGI module, not by settings.py.
READ_OUTSIDE_SETTINGS = {"DJANGO_SETTINGS_MODULE"}


def unit(name: str) -> dict[str, list[str]]:
    """A unit file's keys and their values (a key may repeat: ExecStartPre, Environment)."""
    keys: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def here(argv: list[str]) -> list[str]:
    """A unit's command with its virtual environment's programs taken from ours."""
    program = argv[0]
    if program.startswith(f"{APP}/.venv/bin/"):
        program = str(VENV_BIN / Path(program).name)
    return [program, *argv[1:]]


def commands(keys: dict[str, list[str]]) -> list[list[str]]:
    return [
        shlex.split(value)
        for key in ("ExecStartPre", "ExecStart", "ExecReload")
        for value in keys.get(key, [])
    ]


def settings_read() -> set[str]:
    """The environment variables replaysite/settings.py reads (through its env_* helpers)."""
    source = (ROOT / "replaysite" / "settings.py").read_text()
    return set(re.findall(r'env_\w+\(\s*"([A-Z][A-Z0-9_]*)"', source))


@pytest.mark.parametrize("name", ["replays-web.service", "replays-worker.service"])
def test_every_unit_command_is_a_real_program_and_manage_py_command(name: str) -> None:
    keys = unit(name)
    assert keys["WorkingDirectory"] == [APP]
    assert keys["EnvironmentFile"] == ["/etc/replays/replays.env"]
    assert "/etc/replays/replays.env" in ENV_EXAMPLE.read_text().splitlines()[0]
    known = get_commands()
    found = commands(keys)
    assert found
    for argv in found:
        program = Path(here(argv)[0].replace("$MAINPID", ""))
        assert program.is_file(), f"{name}: {argv[0]} is not a program here"
        if program.name.startswith("python"):
            assert argv[1] == "manage.py" and (ROOT / "manage.py").is_file()
            assert argv[2] in known, f"{name}: manage.py {argv[2]} is not a command"
        if program.name == "gunicorn":
            module, _, attribute = argv[1].partition(":")
            assert find_spec(module) is not None, f"{module} does not exist"
            assert f"{attribute} = " in Path(find_spec(module).origin).read_text()


def test_the_worker_unit_runs_one_cluster_named_for_its_machine() -> None:
    keys = unit("replays-worker.service")
    assert commands(keys) == [[f"{APP}/.venv/bin/python", "manage.py", "qcluster"]]
    environment = dict(value.partition("=")[::2] for value in keys["Environment"])
    assert environment["REPLAYS_HOST_NAME"] == "%H"  # systemd's host name specifier
    assert keys["KillMode"] == ["process"]  # coordinators outlive a stop and finish


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_web_units_gunicorn_serves_the_login_page_and_static_files(
    process_env: dict[str, str], tmp_path: Path
) -> None:
    [argv] = [here(shlex.split(value)) for value in unit("replays-web.service")["ExecStart"]]
    port = free_port()
    argv[argv.index("--bind") + 1] = f"127.0.0.1:{port}"
    argv[argv.index("--workers") + 1] = "1"
    server = subprocess.Popen(
        argv,
        cwd=ROOT,
        # gunicorn keeps its control socket under HOME: a throwaway one here.
        env={**process_env, "DJANGO_SETTINGS_MODULE": "replaysite.settings", "HOME": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        # A file, not a pipe: nobody reads gunicorn's log while it serves.
        stderr=tempfile.TemporaryFile(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/accounts/login/", timeout=5
                ) as page:
                    assert page.status == 200
                    assert "<h1>Log in</h1>" in page.read().decode()
                    break
            except OSError as exc:
                if server.poll() is not None or time.monotonic() > deadline:
                    server.terminate()
                    server.wait(timeout=30)
                    server.stderr.seek(0)
                    log = server.stderr.read().decode()[-2000:]
                    pytest.fail(f"gunicorn did not serve ({exc}): {log}")
                time.sleep(0.3)
        static = f"http://127.0.0.1:{port}/static/replays/screenshot.png"
        with urllib.request.urlopen(static, timeout=5) as image:
            assert image.status == 200
            assert image.read(8) == b"\x89PNG\r\n\x1a\n"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_every_setting_the_example_and_the_guide_name_is_read_by_settings() -> None:
    read = settings_read()
    in_example = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", ENV_EXAMPLE.read_text(), re.M))
    guide = GUIDE.read_text()
    # The settings table's names, `NAME=value` anywhere, and every REPLAYS_ name.
    in_guide = (
        set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", guide, re.M))
        | set(re.findall(r"\b([A-Z][A-Z0-9_]+)=", guide))
        | set(re.findall(r"\b(REPLAYS_[A-Z0-9_]+)", guide))
    )
    assert in_example and in_guide
    assert in_example - read == set()
    assert in_guide - read - READ_OUTSIDE_SETTINGS == set()
    # The guide's settings table covers every setting the example sets.
    assert in_example <= in_guide


def test_the_environment_example_loads_and_passes_djangos_deployment_checks(
    tmp_path: Path,
) -> None:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    env = {
        "PATH": "/usr/bin:/bin",
        **values,
        # This machine's folders and files instead of the deployment's.
        "REPLAYS_VAR_DIR": str(tmp_path / "var"),
        "REPLAYS_RUN_ROOT": str(tmp_path / "var" / "runs"),
        "REPLAYS_AGENTS_FILE": str(NO_AGENTS_FILE),
        "DJANGO_SETTINGS_MODULE": "replaysite.settings",
    }
    checked = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--deploy", "--fail-level", "ERROR"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stderr
    # The proxy settings the example turns on are the ones Django's checks ask for.
    for warning in ("security.W012", "security.W016"):
        assert warning not in checked.stderr + checked.stdout
