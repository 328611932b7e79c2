"""The package as users get it: build the wheel, install it into a venv of its own, run arcsim there from
another folder, and require the same answers as the editable install of this checkout.

    python tests/install_check.py --venv .venv-wheel

The venv is made once and holds the wheel alone: its dependencies are those this interpreter's environment
installed (from requirements-ci.txt and the project's own metadata), shared by one path line, not installed a second
time (a minute and a half of CPU beside the suite); `pip check` then holds the wheel's declared requirements against
them. Later runs reinstall only the wheel. Every command runs in an empty temporary folder with a cache of its own, and
must leave that folder and the installed package as they were. Prints one line per check and a closing
``install: N passed, M failed``; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [  # what a new user runs first; each as --json - and compared with the editable install's answer
    ["topo", "list"],
    ["topo", "show", "8x8-ib100"],
    ["device", "list"],
    ["device", "show", "h100"],
    ["device", "predict", "--model", "resnet50", "--gpu", "a100", "--batch", "64"],
    ["trace", "info"],
    ["run"],
    ["run", "--params", "1B", "-c", "dense,topk,arctopk", "--policy", "none"],
]
VOLATILE = {"timings_s"}  # wall-clock of this machine, not part of the answer


def sh(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"install check: {' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def build_wheel(out: Path) -> Path:
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, ROOT)
    (wheel,) = out.glob("arcsim-*.whl")
    return wheel


def install(venv: Path, wheel: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"install check: creating {venv}, its dependencies this environment's", flush=True)
        sh(sys.executable, "-m", "venv", "--without-pip", venv)  # no pip or setuptools of its own to shadow them
    site = Path(sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    shared = site / "arcsim-check-dependencies.pth"
    if not shared.exists():  # a plain path line: the dependencies' .pth hooks (this checkout's editable arcsim
        shared.write_text(sysconfig.get_paths()["purelib"] + "\n")  # among them) stay unread
    # pip and the rest through that line: this environment's, installing into the venv's own prefix
    sh(python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel)
    sh(python, "-m", "pip", "check")
    return venv / "bin" / "arcsim"


def package_dir(python: Path, cwd: Path) -> Path:
    return Path(sh(python, "-c", "import arcsim, pathlib; print(pathlib.Path(arcsim.__file__).parent)", cwd=cwd)
                .strip())


def tree_digest(directory: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if "__pycache__" not in p.parts):
        h.update(str(path.relative_to(directory)).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def data_dirs(package: Path) -> dict[str, str]:
    """Where an install reads its shipped data, each as the placeholder it is compared under: ``arcsim/data``, or
    for an editable install the top-level source folders beside the package (topologies/, traces/)."""
    dirs = {str(package / "data"): "<arcsim-data>"}
    for folder in ("topologies", "traces"):
        if not (package / "data" / folder).is_dir():
            dirs[str(package.parent / folder)] = f"<arcsim-data>/{folder}"
    return dirs


# Every command of COMMANDS in one process of the install's own Python (through arcsim.cli.main.main, as its console
# script runs a command once it has restarted), each in an empty folder with a cache of its own: one torch import per
# install, not one per command (16 processes were ~30 s of CPU beside the suite). Prints each command's exit code,
# standard output, cache and what it left in its folder, as JSON.
ANSWERS = """
import contextlib, io, json, os, sys, tempfile
from arcsim.processes import wait_passively
wait_passively()
from arcsim.cli.main import main
answers = []
for args in json.loads(sys.argv[1]):
    with tempfile.TemporaryDirectory() as cwd, tempfile.TemporaryDirectory() as cache:
        os.environ["ARCSIM_CACHE_DIR"] = cache
        os.chdir(cwd)
        sys.argv, out, err, code = ["arcsim", "-q", *args, "--json", "-"], io.StringIO(), io.StringIO(), 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code
        answers.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "cache": cache,
                        "left": sorted(os.listdir(cwd))})
        os.chdir(os.sep)
print(json.dumps(answers))
"""


def answers(python: Path, data: dict[str, str]) -> list[object]:
    """Each command's JSON with machine-specific parts replaced: where the package's data and the cache are."""
    env = {**os.environ, "COLUMNS": "100"}
    env.pop("ARCSIM_TRACE_DIR", None)
    env.pop("ARCSIM_TOPOLOGY_PATH", None)
    with tempfile.TemporaryDirectory() as cwd:
        ran = json.loads(sh(python, "-c", ANSWERS, json.dumps(COMMANDS), cwd=Path(cwd), env=env))
    found = []
    for args, got in zip(COMMANDS, ran, strict=True):
        label = f"arcsim {' '.join(args)}"
        if got["code"] not in (0, None):
            raise SystemExit(f"install check: {label} exited {got['code']}:\n{got['stderr'][-3000:]}")
        if got["left"]:
            raise SystemExit(f"install check: {label} wrote into the working directory: {got['left']}")
        text = got["stdout"]
        for where, placeholder in sorted(data.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(where, placeholder)
        obj = json.loads(text.replace(got["cache"], "<cache>"))
        found.append({k: v for k, v in obj.items() if k not in VOLATILE} if isinstance(obj, dict) else obj)
    return found


def users_recorded_job(venv: Path) -> str | None:
    """A user's own GPT, trained and recorded by their own 2-rank torchrun script with the wheel's hook in a folder
    of theirs, merged and priced by the wheel's arcsim on 4x8-eth25-a100 with the device model (no --gpu cpu):
    None if it is, else what went wrong."""
    sys.path.insert(0, str(ROOT / "tests"))
    from _users_job import write_users_job

    from arcsim.processes import free_port  # the editable install's, which runs this check

    python, arcsim = venv / "bin" / "python", venv / "bin" / "arcsim"
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as cache:
        where = Path(folder)
        env = {**os.environ, "ARCSIM_CACHE_DIR": cache}
        write_users_job(where)
        sh(python, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "train.py", cwd=where, env=env)
        sh(arcsim, "-q", "trace", "merge", "rank0.pt", "rank1.pt", "--model", "my_gpt.py:build", "-o", "rec.npz",
           cwd=where, env=env)
        got = json.loads(sh(arcsim, "-q", "run", "--trace", "rec.npz", "--topology", "4x8-eth25-a100", "-c",
                            "dense,topk", "--json", "-", cwd=where, env=env))
    basis = got["compute_basis"]
    if (basis["batch"], basis["precision"]) != (4, "bf16"):
        return f"priced at batch {basis['batch']}, {basis['precision']} (the job ran batch 4 in bf16)"
    if not got["assumptions"][0].startswith("compute: modelled on NVIDIA A100"):
        return f"compute not from the device model: {got['assumptions'][0][:100]}"
    return None


def shipped_examples(arcsim: Path, package: Path) -> str | None:
    """`arcsim examples` from an empty folder names a folder inside the installed package that holds the README's
    examples, byte for byte the checkout's: None if it does, else what is wrong."""
    with tempfile.TemporaryDirectory() as cwd:
        where = Path(sh(arcsim, "examples", cwd=Path(cwd)).strip())
    if package not in where.parents:
        return f"they are at {where}, not inside the installed package {package}"
    source = ROOT / "examples"
    wanted = sorted(p.relative_to(source) for p in source.rglob("*") if p.suffix in (".py", ".yaml", ".log"))
    wrong = [str(p) for p in wanted
             if not (where / p).is_file() or (where / p).read_bytes() != (source / p).read_bytes()]
    return f"missing or different: {', '.join(wrong)}" if wrong or not wanted else None


def first_difference(a: object, b: object, where: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = first_difference(a.get(key), b.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where or 'top'}: {str(a)[:120]} != {str(b)[:120]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", type=Path, required=True, help="the venv to install the wheel into (kept)")
    args = ap.parse_args()
    venv = args.venv.resolve()
    with tempfile.TemporaryDirectory() as out:
        wheel = build_wheel(Path(out))
        installed = install(venv, wheel)
    with tempfile.TemporaryDirectory() as cwd:
        wheel_pkg = package_dir(venv / "bin" / "python", Path(cwd))
        editable_pkg = package_dir(Path(sys.executable), Path(cwd))
    if venv not in wheel_pkg.parents:
        raise SystemExit(f"install check: the wheel's venv imports arcsim from {wheel_pkg}, not from its own install")
    before = tree_digest(wheel_pkg)
    passed = failed = 0
    with ThreadPoolExecutor(2) as pool:  # the two installs side by side
        editable = pool.submit(answers, Path(sys.executable), data_dirs(editable_pkg))
        from_wheel = pool.submit(answers, venv / "bin" / "python", data_dirs(wheel_pkg))
    for command, mine, theirs in zip(COMMANDS, editable.result(), from_wheel.result(), strict=True):
        label = "arcsim " + " ".join(command)
        difference = first_difference(mine, theirs)
        if difference is None:
            passed += 1
            print(f"install: {label}: same answer from the wheel", flush=True)
        else:
            failed += 1
            print(f"install: {label}: the wheel answers differently at {difference}", flush=True)
    for label, success, problem in (
            ("a user's recorded torchrun job from the wheel", "merged and priced on 4x8-eth25-a100",
             users_recorded_job(venv)),
            ("arcsim examples", "the README's examples, inside the installed package",
             shipped_examples(installed, wheel_pkg))):
        passed, failed = passed + (problem is None), failed + (problem is not None)
        print(f"install: {label}: {success if problem is None else problem}", flush=True)
    if tree_digest(wheel_pkg) != before:
        failed += 1
        print("install: the installed package was written to while running", flush=True)
    else:
        passed += 1
    print(f"install: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
