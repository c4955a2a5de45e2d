"""The installed project: one name, ``triscope``, and the files its defaults need inside it.

A wheel is built from this tree and installed into a fresh virtualenv (its dependencies come from
the suite's own environment through a ``.pth`` file); then, from a directory outside the
repository, only ``triscope`` is importable, and the example policy, the SLO file, the demo trace,
the eBPF C source and the migrations are found as package data.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PARTS = ("agent", "store", "analysis", "dashboard", "remediation", "migrations")

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(out), str(REPO)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    [whl] = out.glob("triscope-*.whl")
    return whl


def test_the_wheel_holds_one_top_level_name_and_the_package_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"triscope"}, tops
    for needed in ("triscope/defaults/policy.example.yaml", "triscope/defaults/slo.example.yaml",
                   "triscope/defaults/traces/h200-phases.jsonl.gz", "triscope/agent/ebpf/probes.bpf.c",
                   "triscope/migrations/script.py.mako", "triscope/dashboard/assets/style.css",
                   "triscope/agent/sampler.py", "triscope/store/api.py", "triscope/remediation/engine.py"):
        assert needed in names, needed
    assert not any(n.startswith("triscope/defaults/traces/") and n.endswith(".py") for n in names)


def test_installed_outside_the_repo_only_triscope_imports_and_defaults_are_found(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies from the suite's environment (a path in a .pth: that directory's own .pth
    # files, the editable install's finder among them, are not run); the project from the wheel only
    deps = sysconfig.get_paths()["purelib"]
    (site / "deps.pth").write_text(deps + "\n")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib.util\n"
        "from triscope import defaults\n"
        "from triscope.remediation.engine import DEFAULT_POLICY\n"
        "from triscope.remediation.policy import load_policy\n"
        "from triscope.analysis.slo import default_slo_file, load_slo_file\n"
        "from triscope.agent.ebpf.loader import SOURCE\n"
        "import triscope.store.db as db\n"
        "print('policy', DEFAULT_POLICY, len(load_policy(DEFAULT_POLICY).rules))\n"
        "print('slo', default_slo_file(), len(load_slo_file(default_slo_file())))\n"
        "print('traces', sorted(p.name for p in defaults.TRACES.iterdir()))\n"
        "print('ebpf', SOURCE.exists())\n"
        "print('migrations', db.alembic_config('sqlite:///x.db').get_main_option('script_location'))\n"
        f"print('others', [m for m in {PARTS!r} if importlib.util.find_spec(m) is not None])\n")
    r = subprocess.run([str(py), str(probe)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert str(REPO) not in out, out   # nothing read through the repository
    assert re.search(r"^policy .*site-packages/triscope/defaults/policy\.example\.yaml \d+$", out, re.M), out
    assert re.search(r"^slo .*site-packages/triscope/defaults/slo\.example\.yaml \d+$", out, re.M), out
    assert ("traces ['h200-inference-1.jsonl.gz', 'h200-inference-2.jsonl.gz', 'h200-inference-3.jsonl.gz', "
            "'h200-inference-4.jsonl.gz', 'h200-inference-5.jsonl.gz', 'h200-inference-6.jsonl.gz', "
            "'h200-phases.jsonl.gz']") in out, out
    assert "ebpf True" in out
    assert re.search(r"^migrations .*site-packages/triscope/migrations$", out, re.M), out
    assert "others []" in out, out


def test_no_code_imports_the_parts_by_their_folder_names() -> None:
    """Everything imports ``triscope.<part>``: with the repository on sys.path the folders are also
    plain packages, and importing one under both names would load it twice."""
    parts = "|".join(PARTS)
    # in code, and in code handed to a child interpreter as a string
    pat = re.compile(rf"(?:^\s*|[\"']|\\n)(from (?:{parts})(?:\.\w+)* import |import (?:{parts})(?:\.\w+)*(?=\s|$|\\n|[\"']))",
                     re.M)
    offenders = []
    for folder in (*PARTS, "triscope", "tests", "bench", "examples"):
        for p in (REPO / folder).rglob("*.py"):
            if p.is_symlink() or "triscope/" in str(p.relative_to(REPO)) and folder != "triscope":
                continue
            if folder == "triscope" and p.relative_to(REPO / "triscope").parts[0] in PARTS:
                continue   # the symlinks: the same files as the part folders
            for m in pat.finditer(p.read_text()):
                offenders.append(f"{p.relative_to(REPO)}: {m.group(0).strip()}")
    assert not offenders, offenders
