"""Switch the runtime to another backend for a test: set its environment, forget every
cached driver, kernel table and constant buffer, and restore all of it afterwards; and the
sm_90a code objects a module's tests load through the fake backend."""

import contextlib
import os


def forget_runtime_state() -> None:
    from zyfa_runtime import api, plan, staging, workspace
    from zyfa_runtime import driver as drivers
    drivers._reset()
    workspace._pools.clear()    # captured calls' counters: pools of the previous drivers' memory
    workspace._full_pools.clear()
    api._tables.clear()
    plan._ones.clear()
    plan._plans.clear()
    plan._layouts.clear()
    staging._rings.clear()      # slots of the previous drivers (a fresh fake has other memory)
    staging._retired.clear()


@contextlib.contextmanager
def using_backend(name: str, **env: str):
    """``with using_backend("emulator", ZYFA_EMULATOR_HAZARDS="1") as driver: ...``"""
    from zyfa_runtime import driver as drivers
    changes = {"ZYFA_BACKEND": name, **env}
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    forget_runtime_state()
    try:
        yield drivers.get_driver()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        forget_runtime_state()


def build_sm90a(tmp_path_factory, only: str, skip: str = ""):
    """A prebuilt directory of the sm_90a variants ``only`` names less those ``skip`` names
    (build.py --only, --skip), built once a run (tests/conftest.py's ``sm90a_prebuilt``).
    Seeded with the repository's prebuilt/ manifest and those variants' files where they exist:
    build.py reuses a file only where its entry's source hash is the current source's and the
    file's sha256 its entry's, and builds the rest (the others stay unbuilt: their files are
    not copied)."""
    import shutil
    from pathlib import Path

    import build
    from zyfa_runtime.catalogue import all_variants, iter_select
    out = tmp_path_factory.mktemp("prebuilt")
    repo = Path(build.__file__).resolve().parent / "prebuilt"
    if (repo / "manifest.json").is_file():
        shutil.copyfile(repo / "manifest.json", out / "manifest.json")
        for v in iter_select(all_variants(), "sm_90a", only, skip):
            if (repo / v.filename).is_file():
                shutil.copyfile(repo / v.filename, out / v.filename)
    assert build.main(["--arch", "sm_90a", "--only", only, *(["--skip", skip] if skip else []),
                       "--out", str(out), "--jobs", "2"]) == 0
    return out
